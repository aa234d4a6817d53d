# SPDX-License-Identifier: Apache-2.0
"""`clc report FILE... --format summary|json|chrome [-o OUT] [--force]`"""

import os
import sys

from clc.capture.reader import CaptureError, scan_captures
from clc.errors import EXIT_USAGE, ClcError
from clc.capture.reports import FORMATS, OutputError, open_output, unlink_quietly, write_report

__all__ = ["ReportCommand"]


class ReportCommand:
    name = "report"
    help = "turn capture files into a per-kernel summary, JSON, or a Chrome/Perfetto timeline"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("captures", nargs="+", metavar="FILE", help="capture file(s) (.clc)")
        parser.add_argument("--format", choices=FORMATS, default="summary")
        parser.add_argument("-o", "--output",
                            help="write here instead of standard output (a new file; never "
                                 "through a symbolic link)")
        parser.add_argument("--force", action="store_true",
                            help="overwrite OUTPUT if it exists (a regular file)")

    def run(self, args):
        out, created = None, False
        if args.output:
            _refuse_an_input(args.output, args.captures)
            try:
                out, created = open_output(args.output, args.force)
            except OutputError as e:
                raise ClcError(str(e), EXIT_USAGE if e.usage else 1) from None
        try:
            try:
                captures = scan_captures(args.captures)
            except CaptureError as e:
                raise ClcError(str(e), EXIT_USAGE) from None
            try:
                notes = write_report(captures, args.format, out or sys.stdout)
                (out or sys.stdout).flush()
                if out is not None:
                    out.close()
            except CaptureError as e:  # a capture changed or vanished since it was scanned
                raise ClcError(str(e)) from None
            except BrokenPipeError:
                # The reader of stdout (`| head`) has gone: no more to say, and nothing left
                # for the interpreter to flush there at exit.
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 1
            except OSError as e:
                raise ClcError(f"cannot write {args.output or 'the report'}: "
                               f"{e.strerror or e}") from None
        except BaseException:
            if out is not None:
                _close_quietly(out)
                if created:
                    unlink_quietly(args.output)
            raise
        for note in notes:
            print(f"clc: {note}", file=sys.stderr)
        return 0


def _refuse_an_input(output, inputs):
    """--force must not empty a capture that is about to be read."""
    try:
        st = os.lstat(output)
    except OSError:
        return
    for path in inputs:
        try:
            if os.path.samestat(st, os.stat(path)):
                raise ClcError(f"{output} is one of the captures to read; name another "
                               f"output", EXIT_USAGE)
        except OSError:
            continue


def _close_quietly(f):
    try:
        f.close()
    except OSError:
        pass

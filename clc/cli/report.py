# SPDX-License-Identifier: Apache-2.0
"""`clc report FILE... --format summary|json|chrome [-o OUT] [--force]`"""

import os
import sys

from clc.capture.reader import CaptureError, scan_captures
from clc.errors import EXIT_USAGE, ClcError
from clc.capture.reports import FORMATS, WRITE_BUFFER, write_report
from clc.outputs import open_output, remove_output

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
                                 "through a symbolic link another user controls)")
        parser.add_argument("--force", action="store_true",
                            help="overwrite OUTPUT if it exists (a regular file)")

    def run(self, args):
        out = None
        if args.output:
            _refuse_an_input(args.output, args.captures)
            out = open_output(args.output, args.force, mode=0o644, text=True,
                              buffering=WRITE_BUFFER)
        try:
            try:
                captures = scan_captures(_distinct(args.captures))
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
                raise               # the reader of stdout has gone: clc.cli.main ends quietly
            except OSError as e:
                raise ClcError(f"cannot write {args.output or 'the report'}: "
                               f"{e.strerror or e}") from None
        except BaseException:
            if out is not None:
                if not out.closed:
                    remove_output(args.output, out)
                _close_quietly(out)
            raise
        for note in notes:
            print(f"clc: {note}", file=sys.stderr)
        return 0


def _distinct(paths):
    """paths without those naming a file already named (the same device and inode, however
    spelled), each said once: a capture given twice would count its launches twice. A path
    that cannot be looked at is kept, for the reader to say why."""
    seen = {}
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            out.append(path)
            continue
        key = (st.st_dev, st.st_ino)
        if key in seen:
            print(f"clc: {path} is the same file as {seen[key]}: read once", file=sys.stderr)
            continue
        seen[key] = path
        out.append(path)
    return out


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

# SPDX-License-Identifier: Apache-2.0
"""`clc report FILE... --format summary|json|chrome [-o OUT] [--force]`"""

import os

from clc.capture import CaptureError, read_captures
from clc.errors import EXIT_USAGE, ClcError
from clc.reports import FORMATS, write_report

__all__ = ["ReportCommand"]


class ReportCommand:
    name = "report"
    help = "turn capture files into a per-kernel summary, JSON, or a Chrome/Perfetto timeline"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("captures", nargs="+", metavar="FILE", help="capture file(s) (.clc)")
        parser.add_argument("--format", choices=FORMATS, default="summary")
        parser.add_argument("-o", "--output", help="write here instead of standard output")
        parser.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")

    def run(self, args):
        if args.output and os.path.exists(args.output) and not args.force:
            raise ClcError(f"{args.output} exists (use --force to overwrite it)", EXIT_USAGE)
        try:
            captures = read_captures(args.captures)
        except CaptureError as e:
            raise ClcError(str(e), EXIT_USAGE) from None
        write_report(captures, args.format, args.output)
        return 0

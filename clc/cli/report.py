# SPDX-License-Identifier: Apache-2.0
"""`clc report FILE... [--format summary|csv|json|chrome] [--per-launch] [--kernel GLOB]...
[--kernel-regex RE] [--from S] [--to S] [--sort COLUMN] [--width N] [--no-children]
[-o OUT|-] [--force]`"""

import argparse
import os
import sys

from clc.capture.distribution import DEFAULT_PERCENTILES, parse_percentiles
from clc.capture.reader import CaptureError, scan_captures
from clc.runtime.run_captures import begun, capture_files
from clc.errors import EXIT_USAGE, ClcError
from clc.capture.reports import (FORMATS, KERNEL_WIDTH, SORTS, WRITE_BUFFER, View,
                                 write_comparison, write_report)
from clc.outputs import open_output, remove_output
from clc.words import count

__all__ = ["ReportCommand"]


class ReportCommand:
    name = "report"
    help = ("turn capture files into a per-kernel summary, CSV, JSON, or a Chrome/Perfetto "
            "timeline")

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("captures", nargs="+", metavar="FILE", help="capture file(s) (.clc)")
        parser.add_argument("--format", choices=FORMATS, default="summary")
        parser.add_argument("--kernel", metavar="GLOB", action="append", default=[],
                            help="only kernels whose name matches (as a policy's `kernel`: the "
                                 "base, demangled or mangled name; repeatable: any)")
        parser.add_argument("--kernel-regex", metavar="RE",
                            help="only kernels whose name a regular expression finds (as a "
                                 "policy's `kernel_regex`)")
        parser.add_argument("--per-launch", action="store_true",
                            help="with --format csv: one row per recorded launch (as nsys's "
                                 "trace reports), not per kernel")
        parser.add_argument("--from", dest="t_from", type=_seconds, metavar="S",
                            help="list only launches at or after S seconds from the start of "
                                 "the earliest capture (the Chrome trace's 0)")
        parser.add_argument("--to", dest="t_to", type=_seconds, metavar="S",
                            help="list only launches before S seconds from that start")
        parser.add_argument("--percentiles", type=_percentiles, metavar="P,P...",
                            default=DEFAULT_PERCENTILES,
                            help="the GPU-time percentiles of each kernel (summary, csv, json; "
                                 "each in (0, 100], by nearest rank; default 50,99), beside its "
                                 "min, max and standard deviation")
        parser.add_argument("--sort", choices=SORTS, default="launches",
                            help="the kernels' order (summary, csv): largest first, name A-Z")
        parser.add_argument("--width", type=_width, default=KERNEL_WIDTH, metavar="N",
                            help=f"the summary's kernel names at most N characters, their "
                                 f"middle left out (default {KERNEL_WIDTH}; 0: whole)")
        parser.add_argument("--no-children", action="store_true",
                            help="read the files named only, not the captures of child "
                                 "processes and re-executed programs that clc-run wrote beside "
                                 "them (STEM.child-PID.clc, FILE.N)")
        parser.add_argument("--baseline", metavar="FILE", action="append", default=[],
                            help="compare with these captures (repeatable): per kernel, "
                                 "launches and GPU time of both runs and their change "
                                 "(summary, csv, json)")
        parser.add_argument("-o", "--output",
                            help="write here instead of standard output (a new file; never "
                                 "through a symbolic link another user controls); - is "
                                 "standard output")
        parser.add_argument("--force", action="store_true",
                            help="overwrite OUTPUT if it exists (a regular file)")

    def run(self, args):
        out = None
        if args.output == "-":
            args.output = None
        _check_selection(args)
        if args.kernel_regex is not None:
            from clc.policy.regex import regex_problem
            problem = regex_problem(args.kernel_regex)
            if problem:
                raise ClcError(f"--kernel-regex {args.kernel_regex!r}: {problem}", EXIT_USAGE)
        view = View(tuple(args.kernel), args.kernel_regex, args.sort, args.width, args.t_from,
                    args.t_to, args.percentiles)
        if args.baseline and args.format == "chrome":
            raise ClcError("--baseline compares runs in a summary, csv or json, not a Chrome "
                           "trace", EXIT_USAGE)
        if args.output:
            _refuse_an_input(args.output, args.captures + args.baseline)
            out = open_output(args.output, args.force, mode=0o644, text=True,
                              buffering=WRITE_BUFFER)
        try:
            try:
                named = _distinct(args.captures)
                baseline = _distinct(args.baseline)
                if not args.no_children:
                    named = _with_children(named)
                    baseline = _with_children(baseline)
                captures = scan_captures(named)
                baseline = scan_captures(baseline) if args.baseline else None
            except CaptureError as e:
                raise ClcError(str(e), EXIT_USAGE) from None
            try:
                if baseline is not None:
                    _warn_partial(captures, baseline)
                    write_comparison(captures, baseline, args.format, out or sys.stdout, view)
                    notes = []
                else:
                    notes = write_report(captures, args.format, out or sys.stdout, view,
                                         args.per_launch)
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
        if args.output:
            print(f"clc: {args.format} report of {count(len(captures), 'capture')} written to "
                  f"{args.output}",
                  file=sys.stderr)
        return 0


def _warn_partial(captures, baseline):
    """Say once, before the comparison, which captures of either side lack records (as the
    summary's PARTIAL) or the shim's counts (its `*`): a change between the runs can then come
    from what is missing."""
    sides = []
    for side, caps in (("baseline", baseline), ("current", captures)):
        partial = [c.path for c in caps if c.partial or c.stats_partial]
        if partial:
            sides.append(f"{side} {', '.join(partial)}")
    if sides:
        print(f"clc: warning: --baseline compares partial captures ({'; '.join(sides)}): "
              f"records or counts of their runs are missing from the files (clc report of "
              f"each says which), so a change may come from what is missing, not from the "
              f"runs", file=sys.stderr)


def _check_selection(args):
    """Refuse options that do not apply to the report asked for, rather than ignore them."""
    if args.per_launch and (args.format != "csv" or args.baseline):
        raise ClcError("--per-launch lists launches in a csv report (--format csv), without "
                       "--baseline", EXIT_USAGE)
    comparing = args.baseline and args.format != "chrome"
    listing = args.per_launch or args.format in ("json", "chrome") and not comparing
    if args.sort != "launches" and listing:
        what = "--per-launch" if args.per_launch else f"--format {args.format}"
        raise ClcError(f"--sort orders the kernels of a summary or a per-kernel csv, not "
                       f"{what}", EXIT_USAGE)
    if (args.t_from is not None or args.t_to is not None) and not listing:
        raise ClcError("--from and --to cut the launches listed (--format json, chrome, or csv "
                       "--per-launch), not per-kernel counts or a comparison", EXIT_USAGE)
    if args.percentiles != DEFAULT_PERCENTILES and (args.baseline or args.per_launch or
                                                    args.format == "chrome"):
        raise ClcError("--percentiles shapes the per-kernel summary, csv and json, not a "
                       "comparison, --per-launch or a Chrome trace", EXIT_USAGE)
    if args.t_from is not None and args.t_to is not None and args.t_to <= args.t_from:
        raise ClcError(f"--to {args.t_to:g} is not after --from {args.t_from:g}", EXIT_USAGE)


def _percentiles(text):
    try:
        return parse_percentiles(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None


def _seconds(text):
    try:
        s = float(text)
    except ValueError:
        s = -1.0
    if not (0 <= s < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected seconds from the start of the "
                                         f"capture (a number, 0 or more)")
    return s


def _width(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n != 0 and n < 10:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 (whole names) or at least 10")
    return n


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


def _with_children(paths):
    """paths, each followed by the captures that clc-run wrote beside it for the same run: its
    child processes' and re-executed programs' (files of its owner, begun at or after it, not
    named already), said once on standard error. A path with no file whose run left child
    captures (a shell script's: only its children launched) stands for them."""
    seen = set()
    for path in paths:
        try:
            st = os.stat(path)
            seen.add((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass
    out = []
    for path in paths:
        try:
            owner, start = os.stat(path).st_uid, None
        except FileNotFoundError:
            owner, start = os.geteuid(), 0
        except (OSError, ValueError):
            out.append(path)
            continue
        if start is None:
            out.append(path)
            start = begun(path, owner)
            if start < 0:
                continue
        added = []
        for child in capture_files(path, since_ns=start, owner=owner):
            st = child.stat()
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                added.append(str(child))
        if not added:
            if start == 0:
                out.append(path)  # neither it nor children: the reader says so
            continue
        what = "with" if start else "no such file: read in its place"
        print(f"clc: {path}: {what} {count(len(added), 'capture')} clc-run wrote beside it for "
              f"the same run (child processes, re-executed programs; --no-children reads the "
              f"files named alone)", file=sys.stderr)
        out += added
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

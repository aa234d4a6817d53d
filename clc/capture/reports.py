# SPDX-License-Identifier: Apache-2.0
"""Reports computed from captures: a text summary, a CSV, JSON, and a Chrome/Perfetto trace,
and two runs side by side (--baseline).

The rooms: the rows (clc.capture.rows: a kernel's row, which a View shows and in which
order), the columns of the per-kernel reports (clc.capture.columns, one table), how values
read (clc.capture.cells), and one module per format with one render function
(clc.capture.reporters: summary, kernels_csv, json_doc, chrome, comparison; the per-launch
CSV is clc.capture.per_launch). This module writes a format by its name, to a file or
standard output, and keeps the names that were imported from it.

The summary needs only what scan_capture keeps; the JSON and the trace list launches, which
they read from the captures and write out one at a time (clc.capture.reader.launch_stream),
so that no report holds a capture's launches in memory. The formats are described in
docs/capture.md.
"""

import os
import sys

from clc.capture.cells import csv_text, ending
from clc.capture.reader import LAUNCH_WINDOW
from clc.capture.reporters.chrome import to_chrome, write_chrome
from clc.capture.reporters.comparison import COMPARE_COLUMNS, compare_rows, write_comparison
from clc.capture.reporters.json_doc import JSON_VERSION, to_json, write_json
from clc.capture.reporters.kernels_csv import header as csv_columns
from clc.capture.reporters.kernels_csv import to_csv
from clc.capture.reporters.summary import summary
from clc.capture.rows import KERNEL_WIDTH, SORTS, View
from clc.words import count

__all__ = ["FORMATS", "SORTS", "View", "csv_columns", "summary", "to_csv", "to_json", "to_chrome",
           "write_json", "write_chrome", "write_report", "write_comparison", "compare_rows",
           "WRITE_BUFFER", "KERNEL_WIDTH", "JSON_VERSION", "COMPARE_COLUMNS", "ending",
           "csv_text"]

FORMATS = ("summary", "json", "chrome", "csv")

WRITE_BUFFER = 1 << 20


def write_report(captures, fmt, out=None, view=None, per_launch=False):
    """Write the `fmt` report (one of FORMATS) of `captures` to `out`: a text file, a new
    file's path (see clc.outputs.open_output), or None for stdout; per_launch: the CSV lists
    launches, not kernels. Returns notes for the user (GPU times that matched no launch
    record)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown report format {fmt!r} (one of {', '.join(FORMATS)})")
    if out is None:
        return _write(captures, fmt, sys.stdout, view, per_launch)
    if isinstance(out, (str, os.PathLike)):
        from clc.outputs import open_output
        with open_output(out, mode=0o644, text=True, buffering=WRITE_BUFFER) as f:
            return _write(captures, fmt, f, view, per_launch)
    return _write(captures, fmt, out, view, per_launch)


def _write(captures, fmt, out, view=None, per_launch=False):
    if fmt == "summary":
        out.write(summary(captures, view))
        return []
    if fmt == "csv" and per_launch:
        from clc.capture.per_launch import write_per_launch_csv
        unmatched = write_per_launch_csv(captures, out, view or View(), csv_text)
    elif fmt == "csv":
        to_csv(captures, out, view)
        return []
    else:
        unmatched = (write_json(captures, out, view) if fmt == "json" else
                     write_chrome(captures, out, view))
    if not unmatched:
        return []
    return [f"{count(unmatched, 'GPU time')} matched no launch record: "
            f"the launch's record was lost, or lay more than {LAUNCH_WINDOW} launch records "
            f"away in the file"]

# SPDX-License-Identifier: Apache-2.0
"""`clc report --format csv`: one row per kernel shown, its columns those of
clc.capture.columns that the CSV shows (the per-launch CSV is clc.capture.per_launch's)."""

import csv

from clc.capture import distribution
from clc.capture.columns import Frame, csv_columns
from clc.capture.rows import View, view_rows

__all__ = ["header", "to_csv"]


def header(percentiles=distribution.DEFAULT_PERCENTILES):
    """The per-kernel CSV's header: a column per percentile, between min and max."""
    return tuple(c.name for c in csv_columns(percentiles))


def to_csv(captures, out, view=None):
    """One row per kernel shown (view), whole names, as `nsys stats --format csv` gives its
    tables: a header row, numbers without units (the column names say them), empty cells
    where a kernel was not timed."""
    view = view or View()
    rows, every = view_rows(captures, view)
    frame = Frame(total_ns=sum(r.gpu_ns for r in every))
    columns = csv_columns(view.percentiles)
    w = csv.writer(out, lineterminator="\n")
    w.writerow(c.name for c in columns)
    for r in rows:
        w.writerow([c.csv(c.value(r, frame)) for c in columns])

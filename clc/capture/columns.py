# SPDX-License-Identifier: Apache-2.0
"""The per-kernel reports' columns, in one table: the summary's table, the per-kernel CSV and
the JSON's kernel rows all take theirs from kernel_columns, so that a column is added (or
changed) in one place.

A column has a name (the CSV's header cell), a value made from a row (clc.capture.rows) and
the figures of the whole report (Frame), and for each format that shows it the way its cell
is written: the summary's header and text, the CSV's cell, the JSON's key. The summary and
the CSV show their columns in the table's order, but for the kernel's name, which ends the
summary's lines; the JSON's kernel objects keep the key order of its schema version 1 (rank).
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from clc.capture import distribution
from clc.capture.cells import csv_text, truncate, us

__all__ = ["Column", "Frame", "kernel_columns", "summary_columns", "csv_columns",
           "json_columns"]


class Frame(NamedTuple):
    """What a cell needs besides its row: all kernels' GPU time (for the share, the kernels
    not shown included) and the summary's name width."""
    total_ns: int = 0
    width: int = 0


@dataclass(frozen=True)
class Column:
    name: str
    value: Callable  # (row, frame) -> the column's value, None where the row has none
    header: Optional[str] = None  # the summary's; None: not in the summary
    text: Optional[Callable] = None  # (value, row, frame) -> the summary's cell
    csv: Optional[Callable] = None  # value -> the CSV's cell; None: not in the CSV
    json: Optional[str] = None  # the JSON's key; None: not in the JSON
    rank: int = 0  # place among the JSON's keys


def _mark(v, row, frame):
    """A count the capture does not hold whole for the row is marked (see summary)."""
    return f"{v}{'*' if row.partial else ''}"


def _plain(v):
    return v


def _fixed(digits, scale=1):
    """A figure with `digits` decimals (after dividing by `scale`): '-' in the summary, an
    empty cell in the CSV, where there is none."""
    def summary(v, row, frame):
        return "-" if v is None else f"{v / scale:.{digits[0]}f}"

    def cell(v):
        return "" if v is None else f"{v / scale:.{digits[1]}f}"
    return summary, cell


def _time(v, row, frame):
    # The Total row adds up counts, not distributions: its spread cells stay empty.
    return "" if row.total else us(v)


def _csv_us(v):
    return us(v, "")


def _counter(name, header, rank, text=_mark):
    return Column(name, lambda r, f: getattr(r, name), header=header, text=text, csv=_plain,
                  json=name, rank=rank)


def _spread(percentiles):
    """Min, the percentiles, Max and Std dev of the GPU times (us); the JSON has the
    percentiles as one object."""
    cols = [Column("gpu_min_us", lambda r, f: r.quantile(0), header="Min (us)", text=_time,
                   csv=_csv_us, json="gpu_ns_min", rank=12)]
    for p in percentiles:
        cols.append(Column(f"gpu_{distribution.key(p)}_us",
                           lambda r, f, q=p / 100: r.quantile(q),
                           header=f"{distribution.label(p)} (us)", text=_time, csv=_csv_us))
    cols += [Column("gpu_max_us", lambda r, f: r.quantile(1), header="Max (us)", text=_time,
                    csv=_csv_us, json="gpu_ns_max", rank=13),
             Column("gpu_std_us", lambda r, f: r.std_dev(), header="Std dev (us)", text=_time,
                    csv=_csv_us, json="gpu_ns_std", rank=14),
             Column("gpu_percentiles", lambda r, f: {f"{p:g}": r.quantile(p / 100)
                                                     for p in percentiles},
                    json="gpu_ns_percentiles", rank=15)]
    return cols


def kernel_columns(percentiles=distribution.DEFAULT_PERCENTILES):
    """The per-kernel columns, with one for each of the GPU times' percentiles."""
    total_text, total_cell = _fixed((3, 6), 1e6)
    share_text, share_cell = _fixed((1, 3))
    return (
        Column("kernel", lambda r, f: r.name,
               header="Kernel", text=lambda v, r, f: v if r.total else truncate(v, f.width),
               csv=csv_text, json="name", rank=0),
        Column("mangled", lambda r, f: r.mangled, csv=csv_text, json="mangled", rank=1),
        Column("devices", lambda r, f: sorted(r.devices), json="devices", rank=2),
        _counter("launches", "Launches", 3),
        _counter("graph_nodes", "Graph nodes", 7),
        _counter("denied", "Denied", 4),
        _counter("failed", "Failed", 8),
        _counter("recorded", "Recorded", 5, text=lambda v, r, f: f"{v}"),
        Column("timed", lambda r, f: r.timed, csv=_plain, json="timed", rank=6),
        Column("confined_sms", lambda r, f: sorted(r.confined_sms), json="confined_sms",
               rank=9),
        Column("gpu_total_ms", lambda r, f: r.gpu_ns if r.timed else None,
               header="GPU total (ms)", text=total_text, csv=total_cell),
        Column("gpu_ns_total", lambda r, f: r.gpu_ns, json="gpu_ns_total", rank=10),
        Column("share_pct", lambda r, f: r.share_pct(f.total_ns),
               header="Share (%)", text=share_text,
               csv=share_cell),
        Column("gpu_mean_us", lambda r, f: r.mean_ns(), header="GPU mean (us)",
               text=lambda v, r, f: us(v), csv=_csv_us, json="gpu_ns_mean", rank=11),
        *_spread(percentiles),
        Column("rules", lambda r, f: sorted(r.rules), json="rules", rank=16),
        Column("partial", lambda r, f: r.partial, csv=int, json="partial", rank=17),
        Column("capture_partial", lambda r, f: r.capture_partial, csv=int),
    )


def summary_columns(percentiles):
    """The summary's columns: the table's, the kernel's name last."""
    cols = [c for c in kernel_columns(percentiles) if c.header is not None]
    return [c for c in cols if c.name != "kernel"] + [c for c in cols if c.name == "kernel"]


def csv_columns(percentiles):
    return [c for c in kernel_columns(percentiles) if c.csv is not None]


def json_columns(percentiles):
    return sorted((c for c in kernel_columns(percentiles) if c.json is not None),
                  key=lambda c: c.rank)

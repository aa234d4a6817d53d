# SPDX-License-Identifier: Apache-2.0
"""`clc report --baseline`: two runs side by side, per kernel (as Nsight Compute's baselines
put them), as a summary, CSV or JSON. Its columns are one table (COMPARE_TABLE), from which
the summary and the CSV take theirs."""

import csv
import json
from dataclasses import dataclass

from clc.capture.cells import aligned, csv_text, truncate, wrap
from clc.capture.reporters.json_doc import JSON_VERSION
from clc.capture.rows import SORTS, KernelRow, View, kernel_rows
from clc.words import count

__all__ = ["COMPARE_COLUMNS", "COMPARE_TABLE", "compare_rows", "write_comparison"]


@dataclass
class _Pair:
    name: str
    mangled: str
    base: KernelRow = None
    new: KernelRow = None


def _side(row):
    if row is None:
        return {"launches": 0, "denied": 0, "timed": 0, "gpu_total_ms": None,
                "gpu_mean_us": None, "gpu_median_us": None}
    return {"launches": row.launches, "denied": row.denied, "timed": row.timed,
            "gpu_total_ms": row.gpu_ns / 1e6 if row.timed else None,
            "gpu_mean_us": row.gpu_ns / row.timed / 1e3 if row.timed else None,
            "gpu_median_us": row.quantile(0.5) / 1e3 if row.times else None}


def _change(old, new):
    """new against old in percent; None where either is missing or old is 0."""
    if old is None or new is None or old == 0:
        return None
    return 100.0 * (new - old) / old


def compare_rows(captures, baseline, view=None):
    """[{kernel, mangled, baseline: side, current: side, launches_change, gpu_total_change_pct,
    gpu_mean_change_pct}] per kernel of either run (merged by mangled name), the view's kernels
    in its order (sorted by the current run; kernels only in the baseline last)."""
    view = view or View()
    # by mangled name; a kernel whose name was lost is its capture's own (never paired)
    new_rows = {("new", r.key) if isinstance(r.key, tuple) else r.key: r
                for r in kernel_rows(captures, times=True)}
    base_rows = {("base", r.key) if isinstance(r.key, tuple) else r.key: r
                 for r in kernel_rows(baseline, times=True)}
    pairs = {}
    for key, r in base_rows.items():
        pairs[key] = _Pair(r.name, r.mangled, base=r)
    for key, r in new_rows.items():
        pairs.setdefault(key, _Pair(r.name, r.mangled)).new = r
    shown = [p for p in pairs.values() if view.shows(p.new or p.base)]
    order = SORTS[view.sort]
    shown.sort(key=lambda p: (p.new is None, order(p.new or p.base)))
    out = []
    for p in shown:
        b, n = _side(p.base), _side(p.new)
        out.append({"kernel": p.name, "mangled": p.mangled, "baseline": b, "current": n,
                    "launches_change": n["launches"] - b["launches"],
                    "gpu_total_change_pct": _change(b["gpu_total_ms"], n["gpu_total_ms"]),
                    "gpu_mean_change_pct": _change(b["gpu_mean_us"], n["gpu_mean_us"])})
    return out


def _pct(v):
    return "-" if v is None else f"{v:+.1f}"


def _num(v, fmt):
    return "-" if v is None else format(v, fmt)


def _side_value(side, key):
    return lambda r: r[side][key]


# (CSV name, summary header or None, value of a compare_rows row, the summary's text of it);
# the kernel's name, first in the CSV, ends the summary's lines.
COMPARE_TABLE = (
    ("kernel", "Kernel", lambda r: r["kernel"], None),
    ("mangled", None, lambda r: r["mangled"], None),
    ("launches_base", "Launches (base)", _side_value("baseline", "launches"), str),
    ("launches", "Launches", _side_value("current", "launches"), str),
    ("launches_change", "Change", lambda r: r["launches_change"], lambda v: f"{v:+d}"),
    ("gpu_total_ms_base", "GPU total (ms, base)", _side_value("baseline", "gpu_total_ms"),
     lambda v: _num(v, ".3f")),
    ("gpu_total_ms", "GPU total (ms)", _side_value("current", "gpu_total_ms"),
     lambda v: _num(v, ".3f")),
    ("gpu_total_change_pct", "Change (%)", lambda r: r["gpu_total_change_pct"], _pct),
    ("gpu_mean_us_base", "GPU mean (us, base)", _side_value("baseline", "gpu_mean_us"),
     lambda v: _num(v, ".3f")),
    ("gpu_mean_us", "GPU mean (us)", _side_value("current", "gpu_mean_us"),
     lambda v: _num(v, ".3f")),
    ("gpu_mean_change_pct", "Change (%)", lambda r: r["gpu_mean_change_pct"], _pct),
)
COMPARE_COLUMNS = tuple(name for name, *_ in COMPARE_TABLE)


def _comparison_summary(captures, baseline, rows, width):
    """The per-kernel table of two runs (compare_rows); names at most width characters."""
    cols = [c for c in COMPARE_TABLE if c[1] is not None and c[0] != "kernel"]
    headers = [header for _, header, _, _ in cols] + ["Kernel"]
    table = [[text(value(r)) for _, _, value, text in cols] + [truncate(r["kernel"], width)]
             for r in rows]
    out = [f"baseline: {', '.join(c.path for c in baseline)}",
           f"current:  {', '.join(c.path for c in captures)}", ""]
    if not table:
        return "\n".join(out + ["no kernels"]) + "\n"
    line, rule = aligned(headers, table)
    out += [line(headers), rule, *(line(t) for t in table)]
    only_base = sum(1 for r in rows if not r["current"]["launches"] and r["baseline"]["launches"])
    if only_base:
        out += ["", wrap(f"{count(only_base, 'kernel')} of the baseline "
                         "did not run in the current captures (listed last).")]
    return "\n".join(out) + "\n"


def _csv_cell(name, v):
    if name in ("kernel", "mangled"):
        return csv_text(v)
    return "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)


def write_comparison(captures, baseline, fmt, out, view=None):
    """The comparison of captures against baseline, as fmt (summary, csv or json), to out."""
    view = view or View()
    rows = compare_rows(captures, baseline, view)
    if fmt == "summary":
        out.write(_comparison_summary(captures, baseline, rows, view.width))
    elif fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(COMPARE_COLUMNS)
        for r in rows:
            w.writerow([_csv_cell(name, value(r)) for name, _, value, _ in COMPARE_TABLE])
    elif fmt == "json":
        json.dump({"version": JSON_VERSION, "baseline": [c.path for c in baseline],
                   "captures": [c.path for c in captures], "kernels": rows}, out, indent=1)
        out.write("\n")
    else:
        raise ValueError(f"a comparison is written as summary, csv or json, not {fmt}")

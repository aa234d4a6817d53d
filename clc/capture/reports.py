# SPDX-License-Identifier: Apache-2.0
"""Reports computed from captures: a text summary, JSON, and a Chrome/Perfetto trace.

Per-kernel figures merge kernel ids by mangled name, so one kernel loaded in two contexts or
launched by two processes is one row. The summary needs only what scan_capture keeps; the
JSON and the trace list launches, which they read from the captures and write out one at a
time (clc.capture.reader.launch_stream), so that no report holds a capture's launches in memory.
The formats are described in docs/capture.md.
"""

import csv
import fnmatch
import json
import math
import os
import signal
import sys
import textwrap
from array import array
from dataclasses import dataclass, field

from clc import abi
from clc.capture import distribution
from clc.capture.per_launch import Picker, run_start
from clc.capture.reader import LAUNCH_WINDOW, error_name, gpu_times, launch_stream
from clc.words import count

__all__ = ["FORMATS", "SORTS", "View", "csv_columns", "summary", "to_csv", "to_json", "to_chrome",
           "write_json", "write_chrome", "write_report", "write_comparison", "compare_rows",
           "WRITE_BUFFER"]

FORMATS = ("summary", "json", "chrome", "csv")

JSON_VERSION = 1
KERNEL_WIDTH = 100  # summary column; the json carries the full name
NOTE_WIDTH = 96
LAUNCH_DUR_US = 1.0  # nominal width of a CPU-side launch in the trace, so it can be clicked
# Real tids stay below pid_max (at most 2**22); trace viewers read tids as 32-bit numbers.
GPU_TID_BASE = 0x40000000
WRITE_BUFFER = 1 << 20


@dataclass(kw_only=True)
class _Row(abi.Counters):
    """A kernel's row: its counters (abi.Counters) summed over the captures, and the rest."""

    name: str
    mangled: str
    devices: set = field(default_factory=set)
    confined_sms: set = field(default_factory=set)  # green contexts' SM counts it ran on
    rules: set = field(default_factory=set)
    partial: bool = False
    capture_partial: bool = False  # a capture it comes from lost records (Capture.partial)
    key: object = None  # what rows merge by: the mangled name, or (capture, kernel id)
    # each timed launch's gpu_ns, sorted once all are read (_kernel_rows)
    times: array = field(default_factory=lambda: array("q"))
    sources: dict = field(default_factory=dict)  # timing source's name -> its timed launches

    def quantile(self, q):
        """The q-quantile (0..1) of its launches' GPU times, by nearest rank; None untimed."""
        s = self.times
        return s[max(0, math.ceil(q * len(s)) - 1)] if s else None

    def spread(self, percentiles):
        """GPU times' min, each percentile's, max (ns) and standard deviation; None untimed."""
        ps = [self.quantile(p / 100) for p in percentiles]
        return [self.quantile(0), *ps, self.quantile(1), distribution.std_dev(self.times)]


# --sort's columns: the key a row sorts by (larger first, but the name)
SORTS = {
    "launches": lambda r: (-r.launches, -r.graph_nodes, r.name),
    "graph-nodes": lambda r: (-r.graph_nodes, r.name),
    "denied": lambda r: (-r.denied, r.name),
    "failed": lambda r: (-r.failed, r.name),
    "recorded": lambda r: (-r.recorded, r.name),
    "gpu-total": lambda r: (-r.gpu_ns, r.name),
    "mean": lambda r: (-(r.gpu_ns / r.timed if r.timed else -1), r.name),
    "min": lambda r: (-(r.quantile(0) if r.times else -1), r.name),
    "median": lambda r: (-(r.quantile(0.5) if r.times else -1), r.name),
    "max": lambda r: (-(r.quantile(1) if r.times else -1), r.name),
    "p99": lambda r: (-(r.quantile(0.99) if r.times else -1), r.name),
    "name": lambda r: (r.name, r.mangled),
}


@dataclass(frozen=True)
class View:
    """Which kernels a summary or CSV shows, in which order, with names how wide: kernels are
    globs and kernel_regex a regular expression, tried as a policy's `kernel` and
    `kernel_regex` are (on the base name, the demangled and the mangled name); width 0 shows
    whole names. t_from and t_to (seconds since the earliest capture's start, or None) cut
    the launches the listing reports give (clc.capture.per_launch.Picker)."""
    kernels: tuple = ()
    kernel_regex: str = None
    sort: str = "launches"
    width: int = KERNEL_WIDTH
    t_from: float = None
    t_to: float = None
    percentiles: tuple = distribution.DEFAULT_PERCENTILES

    def shows(self, row):
        if not self.kernels and self.kernel_regex is None:
            return True
        from clc.policy.names import KernelInfo
        forms = KernelInfo(row.mangled, row.name, 0).name_forms or (row.name,)
        if self.kernels and not any(fnmatch.fnmatchcase(n, g) for g in self.kernels
                                    for n in forms):
            return False
        if self.kernel_regex is not None:
            from clc.policy.regex import _regex
            if not any(_regex(self.kernel_regex).search(n) for n in forms):
                return False
        return True

    @property
    def filtered(self):
        return bool(self.kernels) or self.kernel_regex is not None


def _kernel_rows(captures, times=False):
    """One _Row per kernel (merged by mangled name), most launched first; with times, each
    row's GPU times of its timed launches (the captures' TIMING records, read again)."""
    rows = {}
    for ci, cap in enumerate(captures):
        keys = {}
        for kid, k in cap.kernels.items():
            # Stand-ins for ids whose KERNEL record was lost have no name to merge by.
            key = k.mangled if k.mangled else (ci, kid)
            keys[kid] = key
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row(name=k.name, mangled=k.mangled, key=key)
            if k.device >= 0:
                row.devices.add(k.device)
        for kid, st in cap.stats.items():
            row = rows[keys[kid]]
            for counter in abi.KERNEL_COUNTERS:
                setattr(row, counter, getattr(row, counter) + getattr(st, counter))
            if st.confined_sms:
                row.confined_sms.add(st.confined_sms)
            row.partial |= st.partial
            row.capture_partial |= cap.partial
        for kid, rules in cap.kernel_rules.items():
            if kid in keys:
                rows[keys[kid]].rules.update(cap.rule_name(r) for r in rules)
        if times and cap.timing_records:
            for kid, gpu_ns, source in gpu_times(cap):
                if kid in keys:
                    row = rows[keys[kid]]
                    row.times.append(gpu_ns)
                    row.sources[source] = row.sources.get(source, 0) + 1
    for row in rows.values():
        if row.times:
            row.times = array("q", sorted(row.times))
    return sorted(rows.values(), key=SORTS["launches"])


def _view_rows(captures, view):
    """(rows shown, in the view's order; all rows)."""
    rows = _kernel_rows(captures, times=True)
    shown = sorted((r for r in rows if view.shows(r)), key=SORTS[view.sort])
    return shown, rows


def _rule_rows(captures):
    """[(rule name, denied, partial)] merged by name, most denied first."""
    rows = {}
    for cap in captures:
        for rule, denied in cap.rule_stats.items():
            name = cap.rule_name(rule)
            n, partial = rows.get(name, (0, False))
            rows[name] = (n + denied, partial or cap.rule_stats_partial)
    return sorted(((name, n, p) for name, (n, p) in rows.items()), key=lambda r: (-r[1], r[0]))


# ---- summary ----------------------------------------------------------------------------------

_TIMING_SOURCE_WORDS = {"cupti": "CUPTI kernel records (the kernels' own start and end)",
                        "events": "CUDA events recorded around each launch"}

def _size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return count(n, "byte")


def ending(cap):
    """How the process left, as its last END record says: "ended by SIGSEGV", "left with
    _exit(3)" (or exit_group), or None (exit(), main's return, or no END record)."""
    if cap.end_how == abi.END_SIGNAL:
        try:
            name = signal.Signals(cap.exit_status).name
        except ValueError:
            name = f"signal {cap.exit_status}"
        return f"ended by {name}"
    if cap.end_how == abi.END_QUICK:
        return f"left with _exit({cap.exit_status})"
    return None


def _capture_lines(cap):
    parts = [f"pid {cap.pid}", f"command: {_shown(cap.command) or '?'}",
             "complete" if cap.complete else "INCOMPLETE"]
    if cap.partial:
        parts.append("PARTIAL")
    if ending(cap):
        parts.append(ending(cap))
    notes = []
    if cap.dropped:
        parts.append(f"{count(cap.dropped, 'record')} dropped (buffers full)")
    if cap.write_lost_bytes:
        why = f" ({error_name(cap.write_errno)})" if cap.write_errno else ""
        parts.append(f"{_size(cap.write_lost_bytes)} lost to write errors{why}")
    if cap.capped_bytes:
        parts.append(f"{_size(cap.capped_bytes)} not written (size cap reached: "
                     "clc-run --capture-limit)")
    if cap.trailing_bytes:
        parts.append(f"last {_size(cap.trailing_bytes)} not whole records")
    if cap.truncated:
        parts.append("records it must keep dropped at the size cap (--capture-limit too small)")
    if cap.table_full:
        parts.append("decision table full")
    if cap.undecided_launches:
        parts.append(f"{count(cap.undecided_launches, 'launch', 'launches')} decided by "
                     f"on_error without a kernel "
                     f"(the driver could not be placed, or a signal handler launched a kernel "
                     f"not decided yet)")
    if not cap.complete:
        notes.append("no END record after its last records: the program was killed (SIGKILL), "
                     "or its capture could not be written (full disk?); its counts are the last "
                     "it wrote (every second); see what clc printed while it ran")
    if cap.partial:
        notes.append("partial: records of the run are missing from the file (said above); its "
                     "counts are whole, but the JSON and the timeline lack the missing launches, "
                     "and the GPU times' Min, Median, Max and P99 the missing timings")
    return [f"{cap.path}: " + ", ".join(parts)] + [_wrap(n, "  ") for n in notes]


def _wrap(text, indent=""):
    return textwrap.fill(text, NOTE_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  ")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f)}


def _shown(text):
    """text for a terminal: control characters (a capture's command, kernel names and
    messages are the program's to choose) as \\xNN escapes, so that none moves the cursor
    or changes the terminal."""
    return text.translate(_CONTROL)


# What a spreadsheet may take as the start of a formula (OWASP's CSV injection list: equals,
# plus, minus, at, tab, carriage return).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_text(text):
    """A capture's text (a kernel's name) for a CSV cell: one that a spreadsheet would run as
    a formula gets a leading quote, as spreadsheet-safe CSV writers do, and control characters
    are \\xNN escapes (as in the summary), so that neither a formula nor a terminal sequence
    reaches whoever opens the file. Kernel names of real programs start with neither."""
    if text.startswith(_FORMULA_STARTS):
        text = "'" + text
    return text.translate(_CONTROL)


def _truncate(name, width):
    """name cut to width characters, its middle left out: template instances that differ
    only at their end stay apart. width 0: whole."""
    name = _shown(name)
    if not width or len(name) <= width:
        return name
    head = (width - 3) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head):]


def _us(ns, none="-"):
    return none if ns is None else f"{ns / 1e3:.3f}"


def _row_cells(launches, graph_nodes, denied, failed, recorded, timed, gpu_ns, partial, name,
               total_ns, row=None, percentiles=()):
    mark = "*" if partial else ""
    if timed:
        gpu = [f"{gpu_ns / 1e6:.3f}", f"{100 * gpu_ns / total_ns:.1f}" if total_ns else "-",
               f"{gpu_ns / timed / 1e3:.3f}"]
    else:
        gpu = ["-", "-", "-"]
    dist = [_us(v) for v in row.spread(percentiles)] if row is not None else \
        [""] * (len(percentiles) + 3)
    return [f"{launches}{mark}", f"{graph_nodes}{mark}", f"{denied}{mark}", f"{failed}{mark}",
            f"{recorded}", *gpu, *dist, name]


def _table(headers, rows):
    """A function that formats a row (numbers right-aligned, the last column, a name, left
    as it is) and the rule line under the headers, for `rows` under `headers`."""
    widths = [max(len(h), *(len(t[i]) for t in rows)) for i, h in enumerate(headers)]

    def line(cells):
        nums = [c.rjust(w) for c, w in zip(cells[:-1], widths)]
        return "  ".join(nums + [cells[-1]]).rstrip()

    return line, line(["-" * w for w in widths])


def _hold_line(cap):
    waits = [h for h in cap.holds if not h.shared]
    shared = [h for h in cap.holds if h.shared]
    parts = []
    if waits:
        total = sum(h.held_ns for h in waits)
        longest = max(h.held_ns for h in waits)
        parts.append(f"{count(len(waits), 'hold')}, {total / 1e6:.1f} ms in all, longest "
                     f"{longest / 1e6:.2f} ms")
    if shared:
        total = sum(h.held_ns for h in shared)
        parts.append(f"on its held share in {count(len(shared), 'busy period')}, "
                     f"{total / 1e6:.1f} ms in all")
    text = f"pid {cap.pid}: " + ", ".join(parts)
    lags = sorted(h.lag_ns for h in cap.holds if h.lag_ns)
    if lags:
        text += f", held {lags[len(lags) // 2] / 1e3:.0f} us (median) after the GPU went busy"
    by_floor = sum(h.by_floor for h in waits)
    if by_floor:
        text += f", {by_floor} let go by the floor"
    no_board = sum(h.no_board for h in waits)
    if no_board:
        text += f", {no_board} because the board could not be read"
    return text


# (count, its noun or None, the words after)
_WRAP_WORDS = (("blocks", "block", " run"), ("threads", "thread", ""),
               ("skipped", "block", " skipped"), ("max_resident", None, " most resident"),
               ("share_sms", "SM", ""))


def _wrap_line(w):
    """A wrapped kernel's counts in words."""
    parts = [(count(getattr(w, key), noun) if noun else str(getattr(w, key))) + after
             for key, noun, after in _WRAP_WORDS if key != "share_sms" or w.share_sms]
    return f"{_shown(w.kernel)} ({_shown(w.wrapper)}): " + ", ".join(parts)


def summary(captures, view=None):
    """A text report in the manner of `nsys stats`: the captures, a per-kernel table, the
    launches each rule denied, the messages.

    The table's columns, per kernel (merged over contexts and processes by mangled name):

    - Launches: direct launches the program made (cuLaunchKernel, cuLaunchKernelEx,
      cuLaunchCooperativeKernel), denied and failed ones included.
    - Graph nodes: kernel nodes added to or changed in CUDA graphs (cuGraphAddKernelNode and
      the setters). They are not launches: a graph's replays do not pass through clc.
    - Denied: launches and graph-node calls the policy refused.
    - Failed: launches and graph-node calls the driver itself refused (denies not counted).
      Launches - Denied - Failed is what reached the GPU.
    - Recorded: LAUNCH records written to the capture, for launches and graph-node calls;
      besides those the policy asks to record, the first abi.DENIED_RECORDED denied launches
      of each kernel are recorded for audit. At most Launches + Graph nodes.
    - GPU total (ms), Share (%), GPU mean (us): over the launches timed; the share of all
      kernels' GPU time. Min, the view's percentiles (Median, P99 by default), Max (us): of
      the timed launches' GPU times (their TIMING records), by nearest rank; Std dev (us):
      their sample standard deviation.

    view (a View) picks the kernels shown, their order and the names' width; the Total row
    adds up the kernels shown.

    A `*` marks counts derived from the records because the capture holds none of the
    shim's for the kernel: launches it did not record are missing from them.
    """
    captures = list(captures)
    if not captures:
        return "no captures\n"
    out = [ln for cap in captures for ln in _capture_lines(cap)]
    out.append("")

    view = view or View()
    rows, every = _view_rows(captures, view)
    total_ns = sum(r.gpu_ns for r in every)
    ps = view.percentiles
    headers = ["Launches", "Graph nodes", "Denied", "Failed", "Recorded", "GPU total (ms)",
               "Share (%)", "GPU mean (us)", "Min (us)",
               *(f"{distribution.label(p)} (us)" for p in ps), "Max (us)", "Std dev (us)",
               "Kernel"]
    table = [_row_cells(r.launches, r.graph_nodes, r.denied, r.failed, r.recorded, r.timed,
                        r.gpu_ns, r.partial, _truncate(r.name, view.width), total_ns, r, ps)
             for r in rows]
    partial = any(r.partial for r in rows)
    shown = count(len(rows), "kernel")
    if view.filtered:
        shown += f" of {len(every)}"
    table.append(_row_cells(
        sum(r.launches for r in rows), sum(r.graph_nodes for r in rows),
        sum(r.denied for r in rows), sum(r.failed for r in rows), sum(r.recorded for r in rows),
        sum(r.timed for r in rows), sum(r.gpu_ns for r in rows), partial, f"Total ({shown})",
        total_ns, percentiles=ps))
    line, rule = _table(headers, table)
    out.append(line(headers))
    out.append(rule)
    out.extend(line(t) for t in table[:-1])
    out.append(rule)
    out.append(line(table[-1]))

    # Said only where a row could look inconsistent without it.
    notes = []
    if any(r.graph_nodes for r in rows):
        notes.append("Graph nodes: kernel nodes made or changed in CUDA graphs, not launches. "
                     "Denied, Failed and Recorded count graph nodes as well as launches.")
    if any(r.denied for r in rows):
        notes.append(f"Recorded: LAUNCH records written. The first {abi.DENIED_RECORDED} "
                     "denied launches of each kernel are recorded for audit, even when the "
                     "policy records nothing.")
    sources = {}  # of the kernels shown only, as the table's totals
    for r in rows:
        for source, n in r.sources.items():
            sources[source] = sources.get(source, 0) + n
    if sources:
        notes.append("GPU times: " + ", ".join(
            f"{_TIMING_SOURCE_WORDS.get(s, f'source {s}')} ({count(n, 'launch', 'launches')})"
            for s, n in sources.items()) + ".")
    if partial:
        notes.append("* partial: the capture holds no counts of the kernel (see above); its "
                     "counts come from its records alone, so launches that were not recorded "
                     "are missing.")
    if notes:
        out.append("")
        out.extend(_wrap(n) for n in notes)

    confined = [r for r in rows if r.confined_sms]
    if confined:
        out.append("")
        out.append(f"Confined by a green context (sm_share): {count(len(confined), 'kernel')}")
        for r in confined:
            sms = " or ".join(str(n) for n in sorted(r.confined_sms))
            out.append(f"  {sms} SMs  {_truncate(r.name, view.width)}")

    rule_rows = _rule_rows(captures)
    if rule_rows:
        cells = [[f"{n}{'*' if p else ''}", name] for name, n, p in rule_rows]
        line, rule = _table(["Denied", "Rule"], cells)
        out.append("")
        out.append("Denied by rule:")
        out.append("  " + line(["Denied", "Rule"]))
        out.append("  " + rule)
        out.extend("  " + line(c) for c in cells)
        if any(p for _, _, p in rule_rows):
            out.append(_wrap("* counted from the recorded denied launches only: the capture "
                             "has no per-rule counts", "  "))

    held = [cap for cap in captures if cap.holds]
    if held:
        out.append("")
        out.append("Held (best-effort, while latency-critical work was busy on its GPU):")
        for cap in held:
            out.append("  " + _hold_line(cap))

    wrapped = [w for cap in captures for w in cap.wrap_stats]
    if wrapped:
        out.append("")
        out.append("Wrapped kernels (their wrappers' counts on the GPU):")
        out.extend("  " + _wrap_line(w) for w in wrapped)

    on_error = sum(c.on_error_launches for c in captures)
    if on_error:
        out.append("")
        out.append(_wrap(f"Fell to on_error: {count(on_error, 'launch', 'launches')} "
                         "that clc could not decide got the policy's on_error (the messages "
                         "say why)."))

    counts = {}
    for cap in captures:
        for m in cap.messages:
            key = (m.level_name, m.text)
            counts[key] = counts.get(key, 0) + 1
    if counts:
        out.append("")
        out.append("Messages:")
        for (level, text), n in counts.items():
            # A traceback was shown when it happened and stays in the JSON report.
            first, _, rest = text.partition("\n")
            more = " (traceback: clc report --format json)" if rest else ""
            out.append(f"  {level}: {_shown(first)}{more}" + (f" (x{n})" if n > 1 else ""))
    return "\n".join(out) + "\n"


# ---- two runs side by side -------------------------------------------------------------------

@dataclass
class _Pair:
    name: str
    mangled: str
    base: _Row = None
    new: _Row = None


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
                for r in _kernel_rows(captures, times=True)}
    base_rows = {("base", r.key) if isinstance(r.key, tuple) else r.key: r
                 for r in _kernel_rows(baseline, times=True)}
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


def _comparison_summary(captures, baseline, rows, width):
    """The per-kernel table of two runs (compare_rows), as Nsight Compute's baselines put them
    side by side; names at most width characters."""
    headers = ["Launches (base)", "Launches", "Change", "GPU total (ms, base)", "GPU total (ms)",
               "Change (%)", "GPU mean (us, base)", "GPU mean (us)", "Change (%)", "Kernel"]
    table = []
    for r in rows:
        b, n = r["baseline"], r["current"]
        table.append([str(b["launches"]), str(n["launches"]), f"{r['launches_change']:+d}",
                      _num(b["gpu_total_ms"], ".3f"), _num(n["gpu_total_ms"], ".3f"),
                      _pct(r["gpu_total_change_pct"]), _num(b["gpu_mean_us"], ".3f"),
                      _num(n["gpu_mean_us"], ".3f"), _pct(r["gpu_mean_change_pct"]),
                      _truncate(r["kernel"], width)])
    out = [f"baseline: {', '.join(c.path for c in baseline)}",
           f"current:  {', '.join(c.path for c in captures)}", ""]
    if not table:
        return "\n".join(out + ["no kernels"]) + "\n"
    line, rule = _table(headers, table)
    out += [line(headers), rule, *(line(t) for t in table)]
    only_base = sum(1 for r in rows if not r["current"]["launches"] and r["baseline"]["launches"])
    if only_base:
        out += ["", _wrap(f"{count(only_base, 'kernel')} of the baseline "
                          "did not run in the current captures (listed last).")]
    return "\n".join(out) + "\n"


COMPARE_COLUMNS = ("kernel", "mangled", "launches_base", "launches", "launches_change",
                   "gpu_total_ms_base", "gpu_total_ms", "gpu_total_change_pct",
                   "gpu_mean_us_base", "gpu_mean_us", "gpu_mean_change_pct")


def write_comparison(captures, baseline, fmt, out, view=None):
    """The comparison of captures against baseline, as fmt (summary, csv or json), to out."""
    view = view or View()
    rows = compare_rows(captures, baseline, view)
    if fmt == "summary":
        out.write(_comparison_summary(captures, baseline, rows, view.width))
    elif fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(COMPARE_COLUMNS)

        def cell(v):
            return "" if v is None else (f"{v:.6g}" if isinstance(v, float) else v)
        for r in rows:
            b, n = r["baseline"], r["current"]
            w.writerow([_csv_text(r["kernel"]), _csv_text(r["mangled"]), *(cell(v) for v in (
                b["launches"], n["launches"], r["launches_change"],
                b["gpu_total_ms"], n["gpu_total_ms"], r["gpu_total_change_pct"],
                b["gpu_mean_us"], n["gpu_mean_us"], r["gpu_mean_change_pct"]))])
    elif fmt == "json":
        json.dump({"version": JSON_VERSION, "baseline": [c.path for c in baseline],
                   "captures": [c.path for c in captures], "kernels": rows}, out, indent=1)
        out.write("\n")
    else:
        raise ValueError(f"a comparison is written as summary, csv or json, not {fmt}")


# ---- csv --------------------------------------------------------------------------------------

def csv_columns(percentiles=distribution.DEFAULT_PERCENTILES):
    """The per-kernel CSV's header: a column per percentile, between min and max."""
    return ("kernel", "mangled", "launches", "graph_nodes", "denied", "failed", "recorded",
            "timed", "gpu_total_ms", "share_pct", "gpu_mean_us", "gpu_min_us",
            *(f"gpu_{distribution.key(p)}_us" for p in percentiles), "gpu_max_us",
            "gpu_std_us", "partial", "capture_partial")


def to_csv(captures, out, view=None):
    """One row per kernel shown (view), whole names, as `nsys stats --format csv` gives its
    tables: a header row, numbers without units (the column names say them), empty cells
    where a kernel was not timed."""
    view = view or View()
    rows, every = _view_rows(captures, view)
    total_ns = sum(r.gpu_ns for r in every)
    w = csv.writer(out, lineterminator="\n")
    w.writerow(csv_columns(view.percentiles))
    for r in rows:
        w.writerow([
            _csv_text(r.name), _csv_text(r.mangled), r.launches, r.graph_nodes, r.denied,
            r.failed, r.recorded,
            r.timed, f"{r.gpu_ns / 1e6:.6f}" if r.timed else "",
            f"{100 * r.gpu_ns / total_ns:.3f}" if r.timed and total_ns else "",
            _us(r.gpu_ns / r.timed if r.timed else None, ""),
            *(_us(v, "") for v in r.spread(view.percentiles)), int(r.partial),
            int(r.capture_partial)])


# ---- json -------------------------------------------------------------------------------------

def _json_captures(captures):
    return [{
        "path": c.path, "pid": c.pid, "ppid": c.ppid, "command": c.command,
        "complete": c.complete, "dropped": c.dropped,
        "write_lost_bytes": c.write_lost_bytes, "capped_bytes": c.capped_bytes,
        "write_errno": c.write_errno,
        "write_error": error_name(c.write_errno) if c.write_errno else None,
        "trailing_bytes": c.trailing_bytes, "launch_records": c.launch_records,
        "timing_records": c.timing_records, "timing_sources": c.timing_sources,
        "on_error_launches": c.on_error_launches,
        "stats_partial": c.stats_partial, "partial": c.partial, "ending": ending(c),
        "table_full": c.table_full,
        "truncated": c.truncated, "undecided_launches": c.undecided_launches,
        "run": c.run,
        "devices": [{"device": d, "uuid": u} for d, u in sorted(c.devices.items())],
        "holds": [{"t_ns": h.t_ns, "held_ns": h.held_ns, "lag_ns": h.lag_ns,
                   "device": h.device, "no_board": h.no_board, "by_floor": h.by_floor,
                   "shared": h.shared}
                  for h in c.holds],
    } for c in captures]


def _json_kernels(captures, view):
    def spread(r):
        low, *ps, high, std = r.spread(view.percentiles)
        return {"gpu_ns_min": low, "gpu_ns_max": high, "gpu_ns_std": std,
                "gpu_ns_percentiles": dict(zip((f"{p:g}" for p in view.percentiles), ps))}

    return [{
        "name": r.name,
        "mangled": r.mangled,
        "devices": sorted(r.devices),
        "launches": r.launches,
        "denied": r.denied,
        "recorded": r.recorded,
        "timed": r.timed,
        "graph_nodes": r.graph_nodes,
        "failed": r.failed,
        "confined_sms": sorted(r.confined_sms),
        "gpu_ns_total": r.gpu_ns,
        "gpu_ns_mean": r.gpu_ns / r.timed if r.timed else None,
        **spread(r),
        "rules": sorted(r.rules),
        "partial": r.partial,
    } for r in _kernel_rows(captures, times=True) if view.shows(r)]


def _json_rules(captures):
    return [{"rule": name, "denied": n, "partial": p} for name, n, p in _rule_rows(captures)]


def _json_launches(cap, stream):
    pid = cap.pid
    for ln in stream:
        k = cap.kernel(ln.kernel_id)
        yield {
            "pid": pid,
            "seq": ln.seq,
            "kernel": k.name,
            "mangled": k.mangled,
            "t_ns": ln.t_ns,
            "grid": list(ln.grid),
            "block": list(ln.block),
            "shared_mem": ln.shared_mem,
            "stream": ln.stream,
            "tid": ln.tid,
            "entry": ln.entry_name,
            "ptsz": ln.ptsz,
            "action": ln.action_name,
            "rule": cap.rule_name(ln.rule),
            "result": ln.result,
            "gpu_ns": ln.gpu_ns,
        }


def _json_modules(captures, pick):
    return [{
        "pid": cap.pid,
        "t_ns": m.t_ns,
        "api": m.api_name,
        "image": m.image_name,
        "handle": m.handle,
        "image_ptr": m.image_ptr,
        "image_size": m.image_size,
        "preserved": bool(m.preserved),
        "result": m.result,
        "path": m.path,
    } for cap in captures for m in cap.modules if pick.in_window(m.t_ns)]


def _json_wrapped(captures):
    return [{"pid": cap.pid, "kernel": w.kernel, "wrapper": w.wrapper, "blocks": w.blocks,
             "threads": w.threads, "skipped": w.skipped, "max_resident": w.max_resident,
             "share_sms": w.share_sms}
            for cap in captures for w in cap.wrap_stats]


def _json_messages(captures, pick):
    return [{"pid": cap.pid, "level": m.level_name, "text": m.text}
            for cap in captures for m in cap.messages if pick.in_window(m.t_ns)]


def _head(captures, view):
    head = {"version": JSON_VERSION, "captures": _json_captures(captures),
            "kernels": _json_kernels(captures, view), "denied_by_rule": _json_rules(captures)}
    if view.filtered or view.t_from is not None or view.t_to is not None:
        # a reader of the file must know its launches are not all of the run's
        head["selection"] = {"kernels": list(view.kernels), "kernel_regex": view.kernel_regex,
                             "from_s": view.t_from, "to_s": view.t_to}
    return head


def _unmatched(streams):
    return sum(s.unmatched_timings for s in streams)


def to_json(captures, view=None):
    """Everything in the captures as plain data (schema version JSON_VERSION), launches
    included: in memory, for small captures; write_json streams the same document."""
    captures = list(captures)
    view = view or View()
    pick = Picker(captures, view)
    streams = [launch_stream(cap) for cap in captures]
    doc = _head(captures, view)
    doc["launches"] = [d for cap, s in zip(captures, streams)
                       for d in _json_launches(cap, pick.launches(cap, s))]
    doc["unmatched_timings"] = _unmatched(streams)
    doc["modules"] = _json_modules(captures, pick)
    doc["wrapped"] = _json_wrapped(captures)
    doc["messages"] = _json_messages(captures, pick)
    return doc


def write_json(captures, out, view=None):
    """Write to_json's document to the text file `out`, one launch at a time (one launch a
    line); returns the number of GPU times matched to no launch record."""
    captures = list(captures)
    view = view or View()
    pick = Picker(captures, view)

    def item(key, value, last=False):
        text = json.dumps(value, indent=2).replace("\n", "\n  ")
        out.write(f"  {json.dumps(key)}: {text}{'' if last else ','}\n")

    out.write("{\n")
    for key, value in _head(captures, view).items():
        item(key, value)
    out.write('  "launches": [')
    sep = "\n    "
    streams = []
    progress = _Progress(sum(c.launch_records for c in captures), "clc report: JSON", out)
    try:
        for cap in captures:
            stream = launch_stream(cap)
            streams.append(stream)
            for d in _json_launches(cap, pick.launches(cap, stream)):
                out.write(sep)
                out.write(json.dumps(d))
                sep = ",\n    "
                progress.step()
    finally:
        progress.close()
    out.write("\n  ],\n" if sep != "\n    " else "],\n")
    unmatched = _unmatched(streams)
    item("unmatched_timings", unmatched)
    item("modules", _json_modules(captures, pick))
    item("wrapped", _json_wrapped(captures))
    item("messages", _json_messages(captures, pick), last=True)
    out.write("}\n")
    return unmatched


# ---- progress ---------------------------------------------------------------------------------

PROGRESS_DELAY_S = 1.0  # an export shorter than this shows none
_PROGRESS_STEP = 4096   # launches between updates


class _Progress:
    """A progress bar on standard error, by tqdm, for an export of `total` launch records:
    only where standard error is a terminal (and tqdm is installed), shown once the export
    has taken PROGRESS_DELAY_S; otherwise nothing."""

    def __init__(self, total, what, out=None):
        self.bar = None
        self.pending = 0
        out_is_tty = out is not None and hasattr(out, "isatty") and out.isatty()
        if total and sys.stderr.isatty() and not out_is_tty:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, desc=what, unit=" launches", unit_scale=True,
                            delay=PROGRESS_DELAY_S, file=sys.stderr, leave=False)

    def step(self):
        if self.bar is not None:
            self.pending += 1
            if self.pending == _PROGRESS_STEP:
                self.bar.update(self.pending)
                self.pending = 0

    def close(self):
        if self.bar is not None:
            self.bar.update(self.pending)
            self.bar.close()


# ---- chrome trace -----------------------------------------------------------------------------

def _meta(name, pid, tid, value):
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": value}


def _chrome_events(captures, streams, view=None):
    base = run_start(captures)
    pick = Picker(captures, view or View())

    def us(t_ns):
        return (t_ns - base) / 1e3

    for cap in captures:
        pid = cap.pid
        yield _meta("process_name", pid, 0, {"name": f"{cap.command or '?'} (pid {pid})"})
        if cap.partial:
            yield _meta("process_labels", pid, 0, {"labels": "partial capture: launches missing"})
        gpu_tids = {}
        cpu_tids = set()
        stream = launch_stream(cap)
        streams.append(stream)
        for ln in pick.launches(cap, stream):
            name = cap.kernel(ln.kernel_id).name
            cpu_tids.add(ln.tid)
            args = {
                "seq": ln.seq,
                "grid": list(ln.grid),
                "block": list(ln.block),
                "shared_mem": ln.shared_mem,
                "stream": f"{ln.stream:#x}",
                "entry": ln.entry_name + ("_ptsz" if ln.ptsz else ""),
                "action": ln.action_name,
                "rule": cap.rule_name(ln.rule),
                "result": ln.result,
            }
            if ln.gpu_ns is not None:
                args["gpu_ns"] = ln.gpu_ns
            yield {"ph": "X", "name": name,
                   "cat": "denied" if ln.action == abi.ACTION_DENY else "launch",
                   "pid": pid, "tid": ln.tid, "ts": us(ln.t_ns), "dur": LAUNCH_DUR_US,
                   "args": args}
            if ln.gpu_ns is None:
                continue
            tid = gpu_tids.get(ln.stream)
            if tid is None:
                tid = gpu_tids[ln.stream] = GPU_TID_BASE + len(gpu_tids)
            yield {"ph": "X", "name": name, "cat": "gpu", "pid": pid, "tid": tid,
                   "ts": us(ln.t_ns), "dur": ln.gpu_ns / 1e3,
                   "args": {"seq": ln.seq, "gpu_ns": ln.gpu_ns,
                            "note": "GPU start approximated by the launch's CPU time; "
                                    "the duration is measured"}}
        for tid in sorted(cpu_tids):
            yield _meta("thread_name", pid, tid,
                        {"name": "main thread" if tid == pid else f"thread {tid}"})
        for s, tid in gpu_tids.items():
            yield _meta("thread_name", pid, tid, {"name": f"GPU stream {s:#x}"})
            # Below the CPU threads, which sort by tid.
            yield _meta("thread_sort_index", pid, tid, {"sort_index": tid})
        for m in (m for m in cap.modules if pick.in_window(m.t_ns)):
            yield {"ph": "i", "s": "p", "name": m.api_name, "cat": "module",
                   "pid": pid, "tid": pid, "ts": us(m.t_ns),
                   "args": {"image": m.image_name, "handle": f"{m.handle:#x}",
                            "image_size": m.image_size, "path": m.path,
                            "result": m.result}}
        for m in (m for m in cap.messages if pick.in_window(m.t_ns)):
            yield {"ph": "i", "s": "p", "name": f"clc {m.level_name}",
                   "cat": "message", "pid": pid, "tid": pid, "ts": us(m.t_ns),
                   "args": {"text": m.text}}


def to_chrome(captures, view=None):
    """A Chrome trace event file (chrome://tracing, Perfetto) of launches, GPU time, loads, in
    memory; write_chrome streams the same."""
    captures = list(captures)
    return {"traceEvents": list(_chrome_events(captures, [], view)), "displayTimeUnit": "ns"}


def write_chrome(captures, out, view=None):
    """Write to_chrome's trace to the text file `out`, one event at a time; returns the number
    of GPU times matched to no launch record."""
    captures = list(captures)
    streams = []
    out.write('{"traceEvents":[')
    sep = ""
    progress = _Progress(sum(c.launch_records for c in captures), "clc report: trace", out)
    try:
        for event in _chrome_events(captures, streams, view):
            out.write(sep)
            out.write(json.dumps(event, separators=(",", ":")))
            sep = ","
            if event.get("cat") in ("launch", "denied"):
                progress.step()
    finally:
        progress.close()
    out.write('],"displayTimeUnit":"ns"}\n')
    return _unmatched(streams)


# ---- output -----------------------------------------------------------------------------------

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
        unmatched = write_per_launch_csv(captures, out, view or View(), _csv_text)
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

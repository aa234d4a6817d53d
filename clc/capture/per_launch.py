# SPDX-License-Identifier: Apache-2.0
"""Launches picked out of captures, and `clc report --format csv --per-launch`.

The launch-listing reports (JSON, the Chrome trace, the per-launch CSV) can be cut down to
some kernels (a View's globs and regular expression) and to a time window, so that a capture
of millions of launches gives a file of the part one wants. Launches are read one at a time
from the file (clc.capture.reader.launch_stream): memory does not grow with them.
"""

import csv

from clc.capture.reader import launch_stream

__all__ = ["PER_LAUNCH_COLUMNS", "Picker", "run_start", "write_per_launch_csv"]

PER_LAUNCH_COLUMNS = ("pid", "seq", "t_ns", "kernel", "mangled", "grid", "block", "shared_mem",
                      "stream", "tid", "entry", "action", "rule", "result", "gpu_ns")


def run_start(captures):
    """The time the window's seconds count from: the earliest capture's start (CLOCK_MONOTONIC
    ns), which is also the Chrome trace's 0, so that a window read off the timeline cuts the
    same launches."""
    return min((c.start_monotonic_ns for c in captures), default=0)


class Picker:
    """Which launches, loads and messages of `captures` a report lists: those of the kernels
    `view` shows (every kernel when it names none) within its window (View.t_from, View.t_to:
    seconds since run_start, the end excluded)."""

    def __init__(self, captures, view):
        self.view = view
        base = run_start(captures)
        self.lo = None if view.t_from is None else base + round(view.t_from * 1e9)
        self.hi = None if view.t_to is None else base + round(view.t_to * 1e9)

    def in_window(self, t_ns):
        return (self.lo is None or t_ns >= self.lo) and (self.hi is None or t_ns < self.hi)

    def launches(self, cap, stream=None):
        """cap's launches that are picked, in seq order; `stream` (a launch_stream of cap,
        for its unmatched_timings afterwards) or a new one."""
        stream = launch_stream(cap) if stream is None else stream
        if not self.view.filtered and self.lo is None and self.hi is None:
            yield from stream
            return
        shown = {}  # kernel_id -> whether the view shows it: names are matched once a kernel
        for ln in stream:
            ok = shown.get(ln.kernel_id)
            if ok is None:
                ok = shown[ln.kernel_id] = self.view.shows(cap.kernel(ln.kernel_id))
            if ok and self.in_window(ln.t_ns):
                yield ln


def write_per_launch_csv(captures, out, view, csv_text):
    """One CSV row per LAUNCH record picked (Picker), as `nsys stats`' trace reports list
    their calls: the columns of PER_LAUNCH_COLUMNS, names whole (csv_text makes them safe for
    a spreadsheet), gpu_ns empty where the launch was not timed. Returns the number of GPU
    times matched to no launch record."""
    captures = list(captures)
    pick = Picker(captures, view)
    w = csv.writer(out, lineterminator="\n")
    w.writerow(PER_LAUNCH_COLUMNS)
    unmatched = 0
    for cap in captures:
        stream = launch_stream(cap)
        names = {}
        for ln in pick.launches(cap, stream):
            name = names.get(ln.kernel_id)
            if name is None:
                k = cap.kernel(ln.kernel_id)
                name = names[ln.kernel_id] = (csv_text(k.name), csv_text(k.mangled))
            w.writerow((cap.pid, ln.seq, ln.t_ns, *name, "x".join(map(str, ln.grid)),
                        "x".join(map(str, ln.block)), ln.shared_mem, f"{ln.stream:#x}",
                        ln.tid, ln.entry_name + ("_ptsz" if ln.ptsz else ""),
                        ln.action_name, csv_text(cap.rule_name(ln.rule)), ln.result,
                        "" if ln.gpu_ns is None else ln.gpu_ns))
        unmatched += stream.unmatched_timings
    return unmatched

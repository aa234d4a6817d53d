# SPDX-License-Identifier: Apache-2.0
"""The rows of the per-kernel reports: a kernel's row (its counters, abi.KERNEL_COUNTERS,
summed over the captures; the distribution of its launches' GPU times; its share and partial
marks), the Total row under them, which kernels a View shows and in which order, and the
denied-by-rule rows.

Rows merge kernel ids by mangled name, so one kernel loaded in two contexts or launched by
two processes is one row. The formats take their columns from clc.capture.columns.
"""

import fnmatch
import math
from array import array
from dataclasses import dataclass, field
from typing import ClassVar

from clc import abi
from clc.capture import distribution
from clc.capture.reader import gpu_times

__all__ = ["KERNEL_WIDTH", "KernelRow", "TotalRow", "SORTS", "View", "kernel_rows", "view_rows",
           "rule_rows"]

KERNEL_WIDTH = 100  # summary column; the json carries the full name


@dataclass(kw_only=True)
class KernelRow(abi.Counters):
    """A kernel's row: its counters (abi.Counters) summed over the captures, and the rest."""

    total: ClassVar[bool] = False
    name: str
    mangled: str
    devices: set = field(default_factory=set)
    confined_sms: set = field(default_factory=set)  # green contexts' SM counts it ran on
    rules: set = field(default_factory=set)
    partial: bool = False
    capture_partial: bool = False  # a capture it comes from lost records (Capture.partial)
    key: object = None  # what rows merge by: the mangled name, or (capture, kernel id)
    # each timed launch's gpu_ns, sorted once all are read (kernel_rows)
    times: array = field(default_factory=lambda: array("q"))
    sources: dict = field(default_factory=dict)  # timing source's name -> its timed launches

    def quantile(self, q):
        """The q-quantile (0..1) of its launches' GPU times, by nearest rank; None untimed."""
        s = self.times
        return s[max(0, math.ceil(q * len(s)) - 1)] if s else None

    def spread(self, percentiles):
        """GPU times' min, each percentile's, max (ns) and standard deviation; None untimed."""
        ps = [self.quantile(p / 100) for p in percentiles]
        return [self.quantile(0), *ps, self.quantile(1), self.std_dev()]

    def std_dev(self):
        return distribution.std_dev(self.times)

    def mean_ns(self):
        return self.gpu_ns / self.timed if self.timed else None

    def share_pct(self, total_ns):
        """Its part of total_ns (all kernels' GPU time) in percent; None untimed or no total."""
        return 100 * self.gpu_ns / total_ns if self.timed and total_ns else None


@dataclass(kw_only=True)
class TotalRow(KernelRow):
    """The summary's Total row: the counters of the rows shown added up; it has no
    distribution of its own."""

    total: ClassVar[bool] = True
    mangled: str = ""

    @classmethod
    def of(cls, rows, name):
        total = cls(name=name, partial=any(r.partial for r in rows))
        for counter in abi.KERNEL_COUNTERS:
            setattr(total, counter, sum(getattr(r, counter) for r in rows))
        return total


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


def kernel_rows(captures, times=False):
    """One KernelRow per kernel (merged by mangled name), most launched first; with times, each
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
                row = rows[key] = KernelRow(name=k.name, mangled=k.mangled, key=key)
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


def view_rows(captures, view):
    """(rows shown, in the view's order; all rows)."""
    rows = kernel_rows(captures, times=True)
    shown = sorted((r for r in rows if view.shows(r)), key=SORTS[view.sort])
    return shown, rows


def rule_rows(captures):
    """[(rule name, denied, partial)] merged by name, most denied first."""
    rows = {}
    for cap in captures:
        for rule, denied in cap.rule_stats.items():
            name = cap.rule_name(rule)
            n, partial = rows.get(name, (0, False))
            rows[name] = (n + denied, partial or cap.rule_stats_partial)
    return sorted(((name, n, p) for name, (n, p) in rows.items()), key=lambda r: (-r[1], r[0]))

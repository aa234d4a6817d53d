# SPDX-License-Identifier: Apache-2.0
"""What an @clc.on_exit function receives: each kernel's counts over the run, and the time each
hook took (docs/hooks.md). Standard library only: it runs in the traced program's Python."""

from __future__ import annotations

import collections.abc
import dataclasses
from dataclasses import dataclass

from clc import abi

__all__ = ["KernelStats", "HookStats", "ExitStats"]


# ---- the end of the program ---------------------------------------------------------------------

# One kernel's counts over the whole run (all contexts and devices): its name, then its counters
# (abi.KERNEL_COUNTERS: launches, denied, failed, recorded, timed, graph_nodes, gpu_ns), each an
# int from 0.
KernelStats = dataclasses.make_dataclass(
    "KernelStats", [("name", str), *((name, int, 0) for name in abi.KERNEL_COUNTERS)])
KernelStats.__module__ = __name__
KernelStats.__doc__ = "One kernel's counts over the whole run (all contexts and devices)."

_KERNEL_COUNTS = abi.KERNEL_COUNTERS  # KernelStats's fields but the name


@dataclass
class HookStats:
    """The time one hook function took, over all its calls."""

    name: str
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0


class ExitStats:
    """What an @clc.on_exit function receives.

    stats["vecAdd(float const*, float const*, float*, int)"] is that kernel's KernelStats
    (by demangled name); iterating gives every KernelStats; `in` and len() work by name;
    stats.hooks maps each hook's name to its HookStats.
    """

    def __init__(self, kernels=(), hooks=()):
        self.kernels: dict[str, KernelStats] = {k.name: k for k in kernels}
        self.hooks: dict[str, HookStats] = {h.name: h for h in hooks}

    @classmethod
    def from_rows(cls, kernel_rows=(), hook_rows=()) -> ExitStats:
        """Kernel rows are (name, launches, denied, failed, recorded, timed, graph_nodes,
        gpu_ns) tuples or mappings with those keys; rows of one name (several contexts) are
        added up. Hook rows are Hook objects (clc.runtime.hooks), (name, calls, total_ns, max_ns)
        or mappings."""
        from clc.runtime.hooks import Hook  # imports this module: asked for when called

        stats = cls()
        for row in kernel_rows:
            if isinstance(row, collections.abc.Mapping):
                name, counts = row["name"], [row.get(key, 0) for key in _KERNEL_COUNTS]
            else:
                name, *counts = row
                if len(counts) != len(_KERNEL_COUNTS):
                    raise ValueError(f"a kernel row has {len(counts) + 1} fields, expected "
                                     f"name and {', '.join(_KERNEL_COUNTS)}")
            kernel = stats.kernels.setdefault(name, KernelStats(name))
            for key, value in zip(_KERNEL_COUNTS, counts):
                setattr(kernel, key, getattr(kernel, key) + int(value))
        for row in hook_rows:
            if isinstance(row, Hook):
                name, calls, total_ns, max_ns = row.name, row.calls, row.total_ns, row.max_ns
            elif isinstance(row, collections.abc.Mapping):
                name, calls, total_ns, max_ns = (row["name"], row.get("calls", 0),
                                                 row.get("total_ns", 0), row.get("max_ns", 0))
            else:
                name, calls, total_ns, max_ns = row
            hook = stats.hooks.setdefault(name, HookStats(name))
            hook.calls += int(calls)
            hook.total_ns += int(total_ns)
            hook.max_ns = max(hook.max_ns, int(max_ns))
        return stats

    @property
    def total(self) -> KernelStats:
        """All kernels added up."""
        total = KernelStats("(all kernels)")
        for kernel in self.kernels.values():
            for key in _KERNEL_COUNTS:
                setattr(total, key, getattr(total, key) + getattr(kernel, key))
        return total

    def __getitem__(self, name: str) -> KernelStats:
        return self.kernels[name]

    def get(self, name: str, default=None):
        return self.kernels.get(name, default)

    def __contains__(self, name) -> bool:
        return name in self.kernels

    def __len__(self) -> int:
        return len(self.kernels)

    def __iter__(self):
        return iter(list(self.kernels.values()))

    def names(self) -> list[str]:
        return list(self.kernels)

    def items(self):
        return self.kernels.items()

    def __repr__(self) -> str:
        return f"ExitStats({len(self.kernels)} kernels, {len(self.hooks)} hooks)"

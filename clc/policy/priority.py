# SPDX-License-Identifier: Apache-2.0
"""The policy's `priority:` section: classes of whole processes (latency-critical,
best-effort), the board they meet on, and which class a process is of (docs/priority.md)."""

from __future__ import annotations

from dataclasses import dataclass

from clc import abi

from clc.policy.keys import BEST_EFFORT, CLASS_MATCH_KEYS, LATENCY_CRITICAL, PRIORITY_CLASSES
from clc.policy.names import KernelInfo
from clc.policy.rule import Rule
from clc.words import count

__all__ = ["LATENCY_CRITICAL", "BEST_EFFORT", "PRIORITY_CLASSES", "DEFAULT_BOARD",
           "PriorityClass", "Priority"]

DEFAULT_BOARD = abi.PRIORITY_BOARD_DEFAULT.decode()
_CLASS_MATCH_FIELDS = tuple(CLASS_MATCH_KEYS)


@dataclass(frozen=True)
class PriorityClass:
    """A class of processes under `priority:`: the first class whose match holds for a process
    is its class. floor and run_ahead are a best-effort class's."""

    name: str
    kind: str  # LATENCY_CRITICAL or BEST_EFFORT
    # the share of time a best-effort process is never held
    floor: float = abi.PRIORITY_FLOOR_DEFAULT
    # launches it may queue per context while latency-critical work runs
    run_ahead: int = abi.PRIORITY_RUN_AHEAD_DEFAULT
    line: int = 0
    # 0: a held launch waits; else it runs on this share of the SMs, the device's last ones
    held_share: float = 0.0
    # 0: none; else the share of the SMs its launches leave free while a latency-critical
    # process lives on the GPU (they run on the rest, the device's last SMs)
    reserve: float = 0.0
    # 0: none; else a latency-critical class's target: the p99 of its busy periods at most this
    # many times their p99 while best-effort work is held
    slo: float = 0.0
    process: tuple[str, ...] | None = None
    tenant: tuple[str, ...] | None = None
    user: tuple[str, ...] | None = None
    group: tuple[str, ...] | None = None
    cgroup: tuple[str, ...] | None = None

    def check(self, info: KernelInfo) -> tuple[bool, list[str]]:
        """Whether the class's match holds for the process of `info`, and why."""
        rule = Rule(self.name, **{key: getattr(self, key) for key in _CLASS_MATCH_FIELDS})
        return rule.check_static(info)

    def describe(self) -> str:
        if self.kind == LATENCY_CRITICAL:
            slo = (f": p99 at most {self.slo:g}x its p99 while best-effort work is held"
                   if self.slo else "")
            return f"'{self.name}' ({self.kind}{slo})"
        reserve = (f"; {self.reserve:g} of the SMs left free while latency-critical work lives "
                   "on its GPU" if self.reserve else "")
        if self.held_share:
            return (f"'{self.name}' ({self.kind}: held to {self.held_share:g} of the SMs, the "
                    f"device's last ones, while latency-critical work is busy on its GPU{reserve}"
                    f"; at most {count(self.run_ahead, 'launch', 'launches')} queued ahead)")
        return (f"'{self.name}' ({self.kind}: held while latency-critical work is busy on its "
                f"GPU, never for more than {1 - self.floor:.0%} of any 100 ms{reserve}; at most "
                f"{count(self.run_ahead, 'launch', 'launches')} queued ahead)")


@dataclass(frozen=True)
class Priority:
    """The policy's `priority:` section: its classes, the board they meet on, and how long a
    latency-critical process that launches nothing and does not synchronize is still busy."""

    classes: tuple[PriorityClass, ...] = ()
    board: str = DEFAULT_BOARD
    idle_after_ms: float = float(abi.PRIORITY_IDLE_MS_DEFAULT)
    mps: str = "off"

    def class_of(self, info: KernelInfo) -> PriorityClass | None:
        return next((c for c in self.classes if c.check(info)[0]), None)

    def explain(self, info: KernelInfo) -> list[str]:
        """What `clc explain` says of the process's class: each class tried, in order."""
        lines = ["priority classes:"]
        found = None
        for number, c in enumerate(self.classes, 1):
            if found is not None:
                lines.append(f"  {number}. {c.name}: not reached")
                continue
            matched, reasons = c.check(info)
            reason = "; ".join(reasons) or "no match conditions: matches every process"
            lines.append(f"  {number}. {c.name}: {'match' if matched else 'no match'}: {reason}")
            if matched:
                found = c
        lines.append("=> class " + found.describe() if found else
                     "=> no class: its launches are neither held nor hold others")
        return lines

# SPDX-License-Identifier: Apache-2.0
"""Decisions, the Python side of clc_decision: what a launch gets (Outcome), a wrap rule's
wrapper (WrapRequest), and a kernel's Decision, whose launch-shape clauses the shim evaluates in
C on every launch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from clc import abi
from clc.cuda_errors import CUDA_ERRORS
from clc.policy.keys import U64_MAX

__all__ = ["ANY_RANGE", "Outcome", "WrapRequest", "Clause", "Decision"]

ANY_RANGE = (0, U64_MAX)
_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]


@dataclass(frozen=True)
class Outcome:
    """clc_outcome: what a launch gets."""

    action: int  # abi.ACTION_*
    flags: int  # abi.FLAG_*
    error: int  # CUresult returned for a deny, 0 otherwise
    rule: int  # index into Policy.rules, or abi.RULE_DEFAULT / abi.RULE_ON_ERROR
    # ACTION_REPLACE: what to wrap with, as the engine is to build it, and the address of the
    # clc_replacement it made (0 until it has).
    wrap: WrapRequest | None = None
    replacement: int = 0


@dataclass(frozen=True)
class WrapRequest:
    """A `wrap` rule's (or a hook's clc.wrap) wrapper: a built-in name or an absolute .cu path,
    its params as sorted (name, value) pairs, and what a kernel that cannot be wrapped gets."""

    wrapper: str
    params: tuple = ()
    on_unwrappable: str = "allow"
    mechanism: str = "splice"  # sm_share: "green" (an SM partition) or "splice"
    # A .cu policy's text, read once when the policy was loaded: the program's wraps build from
    # it, never from the file again (which may have changed since).
    source: str | None = None

    @property
    def label(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        text = f"{os.path.basename(self.wrapper)}({args})" if args else \
            os.path.basename(self.wrapper)
        if self.program_wide:
            return text + " by green context, the whole process as its primary context"
        return text + " by green context" if self.mechanism == "green" else text

    @property
    def confines(self) -> bool:
        return self.mechanism == "green"

    @property
    def program_wide(self) -> bool:
        """sm_share with scope: program: the process's primary contexts are the partition's."""
        return self.confines and dict(self.params).get("scope") == "program"

    def outcome(self, flags: int, rule: int) -> Outcome:
        """The clc_outcome of a kernel this wraps: confined in the shim (a green context, no
        build), or replaced by the kernel the engine builds."""
        if not self.confines:
            return Outcome(abi.ACTION_REPLACE, flags, 0, rule, self)
        params = dict(self.params)
        if "share" in params:
            kind, value = abi.CAP_SHARE, round(params["share"] * 1_000_000)
        else:
            kind, value = abi.CAP_SMS, int(params["sms"])
        return Outcome(abi.ACTION_CONFINE, flags, 0, rule, self,
                       abi.confine_word(kind, value, last=params.get("place") == "last",
                                        deny=self.on_unwrappable == "deny"))


@dataclass(frozen=True)
class Clause:
    """clc_clause: the outcome of a rule that matches only launches inside these ranges."""

    grid_blocks: tuple[int, int]
    block_threads: tuple[int, int]
    shared_mem: tuple[int, int]
    outcome: Outcome


@dataclass(frozen=True)
class Decision:
    """clc_decision: the first clause containing the launch decides, else the fallback.

    pending_hook is the index of a hook rule that Policy.decide reached and could not answer
    itself: the clauses gathered before it stand, the fallback is the policy's on_error
    outcome (what the launches get should the hook never answer), and Policy.resume goes on
    from there with the hook's answer. None for a finished decision, the only kind the shim
    may be given.
    """

    clauses: list[Clause]
    fallback: Outcome
    pending_hook: int | None = None

    def outcome_for(self, grid_blocks: int, block_threads: int, shared_mem: int) -> Outcome:
        for clause in self.clauses:
            if (clause.grid_blocks[0] <= grid_blocks <= clause.grid_blocks[1]
                    and clause.block_threads[0] <= block_threads <= clause.block_threads[1]
                    and clause.shared_mem[0] <= shared_mem <= clause.shared_mem[1]):
                return clause.outcome
        return self.fallback


def _bounds(conditions: tuple[tuple[str, int], ...]) -> tuple[int, int]:
    lo, hi = ANY_RANGE
    for op, value in conditions:
        if op == "gt":
            lo = max(lo, value + 1)
        elif op == "ge":
            lo = max(lo, value)
        elif op == "lt":
            hi = min(hi, value - 1)
        elif op == "le":
            hi = min(hi, value)
        else:
            lo, hi = max(lo, value), min(hi, value)
    return lo, hi


def _holds(op: str, value: int, bound: int) -> bool:
    return {"gt": value > bound, "ge": value >= bound, "lt": value < bound,
            "le": value <= bound, "eq": value == bound}[op]

# SPDX-License-Identifier: Apache-2.0
"""The explanation of a decision: how each rule fared for one launch, and the verdict, as
`clc policy explain` prints them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from clc import abi
from clc.cuda_errors import error_name
from clc.policy.decision import Outcome
from clc.policy.names import Identity, KernelInfo, _quoted
from clc.words import count

__all__ = ["Step", "Explanation"]


@dataclass(frozen=True)
class Step:
    """How one rule fared in an explanation."""

    name: str
    matched: bool
    reason: str
    reached: bool = True


@dataclass(frozen=True)
class Explanation:
    """Why a launch gets its outcome; format() is what `clc explain` prints.

    Hooks are asked before the outcome applies: first the command-line hook files
    (cli_hooks, their labels), then the hook rules that match the launch (hooks_asked, as
    (hook label, rule name)), in order. Any of them may decide; outcome, deciding_rule and
    message are what the launch gets when every one of them returns None.
    """

    info: KernelInfo
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    steps: list[Step]
    outcome: Outcome
    deciding_rule: str  # a rule name, or "default"
    message: str  # the deciding rule's message, "" when it has none
    cli_hooks: list[str] = dataclasses.field(default_factory=list)
    hooks_asked: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def verdict(self) -> str:
        text = "=> "
        if self.cli_hooks:
            text += (f"decided by the hooks in {', '.join(self.cli_hooks)} (asked first); "
                     "if they return None: ")
        for label, rule in self.hooks_asked:
            text += f"decided by hook {label} (rule '{rule}'); if it returns None: "
        return text + self._outcome_text()

    def _outcome_text(self) -> str:
        outcome = self.outcome
        text = abi.ACTION_NAMES[outcome.action]
        if outcome.action == abi.ACTION_DENY:
            text += f" ({error_name(outcome.error)})"
        if outcome.action in (abi.ACTION_REPLACE, abi.ACTION_CONFINE) and outcome.wrap is not None:
            text = (f"wrap with {outcome.wrap.label} (a kernel that cannot be "
                    f"{'confined' if outcome.wrap.confines else 'wrapped'}: "
                    f"{outcome.wrap.on_unwrappable})")
        text += " by default" if outcome.rule == abi.RULE_DEFAULT else \
            f" by rule '{self.deciding_rule}'"
        if outcome.flags & abi.FLAG_TIME:
            text += " (recorded and timed)"
        elif outcome.flags & abi.FLAG_RECORD:
            text += " (recorded)"
        if self.message:
            text += f": {self.message}"
        return text

    def format(self) -> str:
        info = self.info
        lines = [f"kernel: {info.display_name}"]
        if info.demangled and info.demangled != info.display_name:
            lines.append(f"  demangled: {info.demangled}")
        if info.mangled != info.display_name:
            lines.append(f"  mangled:   {info.mangled}")
        processes = _quoted(info.process_names) if info.process_names else "(none)"
        lines.append(f"device {info.device}, process {processes}, tenant '{info.tenant}'")
        if info.identity != Identity():
            lines.append(info.identity.format())
        grid_blocks = math.prod(self.grid)
        block_threads = math.prod(self.block)
        lines.append(f"launch: grid {self.grid} = {count(grid_blocks, 'block')}, block "
                     f"{self.block} = {count(block_threads, 'thread')}")
        lines.append(f"  dynamic shared memory: {count(self.shared_mem, 'byte')}")
        if self.cli_hooks:
            lines.append("hooks:")
            for number, label in enumerate(self.cli_hooks):
                lines.append(f"  hook file {label}: asked {'next' if number else 'first'} "
                             "(its @clc.on_launch hooks, in order)")
        lines.append("rules:" if self.steps else "rules: none")
        for number, step in enumerate(self.steps, 1):
            status = "match" if step.matched else "no match" if step.reached else "not reached"
            lines.append(f"  {number}. {step.name}: {status}: {step.reason}")
        lines.append(self.verdict())
        return "\n".join(lines)

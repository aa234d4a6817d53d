# SPDX-License-Identifier: Apache-2.0
"""What a policy is and decides: Policy, its rules walked for a kernel (decide, resume), the
explanation of a decision, and its JSON form, which the traced program receives.
Standard library only.

Its parts have modules of their own, re-exported here: the errors (errors.py), decisions
(decision.py), rules and hooks (rule.py), explanations (explain.py), priority classes
(priority.py), the JSON form's readers (json_form.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clc import abi
from clc.policy.decision import (_NOT_PERMITTED, ANY_RANGE, Clause, Decision, Outcome,
                                 WrapRequest)
from clc.policy.errors import HookFileError, PolicyError, PolicyWarning
from clc.policy.explain import Explanation, Step
from clc.policy.json_form import priority_from_dict, rule_from_dict
from clc.policy.keys import SUPPORTED_VERSION
from clc.policy.names import KernelInfo
from clc.policy.priority import (BEST_EFFORT, DEFAULT_BOARD, LATENCY_CRITICAL, PRIORITY_CLASSES,
                                 Priority, PriorityClass)
from clc.policy.rule import HookRef, Rule, _file_identity

__all__ = [
    "ANY_RANGE", "PolicyError", "HookFileError", "PolicyWarning", "Outcome", "WrapRequest",
    "Clause", "Decision", "HookRef", "Rule", "Step", "Explanation", "LATENCY_CRITICAL",
    "BEST_EFFORT", "PRIORITY_CLASSES", "DEFAULT_BOARD", "PriorityClass", "Priority", "Policy",
]


def _verdict_outcome(verdict: str, rule: int) -> Outcome:
    if verdict == "deny":
        return Outcome(abi.ACTION_DENY, 0, _NOT_PERMITTED, rule)
    return Outcome(abi.ACTION_ALLOW, 0, 0, rule)


@dataclass
class Policy:
    """A checked policy, and the hook files given with it on the command line."""

    path: str
    version: int
    default: str  # "allow" or "deny"
    on_error: str  # "allow" or "deny"
    rules: list[Rule]
    # `clc-run --hooks FILE`, in order: HookRef(path, None, FILE as given). The engine asks
    # them before the rules; decide() does not visit them.
    hooks: list[HookRef] = dataclasses.field(default_factory=list)
    # What loading the file found questionable; not part of what the policy decides, so not
    # compared and not sent to the program.
    warnings: list[PolicyWarning] = dataclasses.field(default_factory=list, compare=False,
                                                      repr=False)
    priority: Priority | None = None  # the `priority:` section
    # Whether the file sets on_error (unset, it is allow): clc-run --strict fails closed where
    # a process of the run has no settings unless the policy itself says allow. Not sent to the
    # program.
    on_error_given: bool = dataclasses.field(default=False, compare=False, repr=False)

    @property
    def rule_names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def with_cli_hooks(self, paths: Iterable[str | os.PathLike]) -> Policy:
        """A copy with the hook files `paths` (relative to the current directory) appended to
        hooks; a file that cannot be used raises HookFileError (`FILE: hook file not found`).

        A file is one file however it is spelled (a symbolic or hard link, `./`): one given
        again, or already among hooks, is left out, so that its hooks are asked once; one that
        a hook rule names is given that rule's path, so that it is imported once, as one
        module, whose hooks and on_exit functions the engine then knows as the same.
        """
        known = {}  # (st_dev, st_ino) -> the path the policy already uses for that file
        for ref in [rule.hook for rule in self.rules if rule.hook is not None] + self.hooks:
            identity = _file_identity(ref.path)
            if identity is not None:
                known.setdefault(identity, ref.path)
        given = {_file_identity(ref.path) for ref in self.hooks} - {None}
        added = []
        for path in paths:
            written = os.fsdecode(path)
            resolved = os.path.realpath(written)
            if not written.endswith(".py"):
                raise HookFileError(written, "hook file must be a Python file ending in .py")
            if not os.path.exists(resolved):
                raise HookFileError(written, "hook file not found")
            if not os.path.isfile(resolved):
                raise HookFileError(written, "hook file is not a file")
            identity = _file_identity(resolved)
            if identity in given:
                continue
            if identity is not None:
                given.add(identity)
                resolved = known.setdefault(identity, resolved)
            added.append(HookRef(resolved, None, written))
        return dataclasses.replace(self, rules=list(self.rules), hooks=self.hooks + added)

    def hook_decider_index(self, k: int) -> int:
        """The Outcome.rule of the k-th command-line hook (0-based).

        The engine expands each hook file of `hooks` into its @clc.on_launch hooks, file after
        file, each file's hooks in order, and numbers what it gets k = 0, 1, ...; an outcome
        that such a hook decides carries len(rules) + k, after every rule index, so rule
        indices never move. A hook rule's answer carries the rule's own index.
        """
        return len(self.rules) + k

    def decider_names(self, expanded: Sequence[Sequence[str]] | None = None) -> list[str]:
        """Names for Outcome.rule values >= 0: index i < len(rules) is rule i's name, index
        hook_decider_index(k) the k-th command-line hook's ("hook FILE:FUNCTION").

        expanded[j] lists the functions the engine found in hooks[j], in its order (see
        hook_decider_index). Without it each command-line hook file counts as one decider,
        named "hook FILE".
        """
        names = self.rule_names
        if expanded is not None and len(expanded) != len(self.hooks):
            raise ValueError(f"expanded names {len(expanded)} hook files, the policy has "
                             f"{len(self.hooks)}")
        for j, ref in enumerate(self.hooks):
            if expanded is None:
                names.append(f"hook {ref.label}")
            else:
                names += [f"hook {HookRef(ref.path, function, ref.text).label}"
                          for function in expanded[j]]
        return names

    def default_outcome(self) -> Outcome:
        return _verdict_outcome(self.default, abi.RULE_DEFAULT)

    def on_error_outcome(self) -> Outcome:
        """What a launch clc could not decide gets: on_error's verdict, always recorded (the
        capture says which launches fell to it)."""
        outcome = _verdict_outcome(self.on_error, abi.RULE_ON_ERROR)
        return dataclasses.replace(outcome, flags=outcome.flags | abi.FLAG_RECORD)

    def decide(self, info: KernelInfo, start: int = 0) -> Decision:
        """The rules' decision for a kernel, walking the rules from index start.

        The walk stops at the first hook rule whose static conditions hold: the Decision then
        has pending_hook set (see Decision), and Policy.resume continues it with the hook's
        answer. Command-line hooks (self.hooks) are not visited: the engine asks them first.
        """
        clauses = []
        for index in range(start, len(self.rules)):
            rule = self.rules[index]
            if not rule.check_static(info)[0]:
                continue
            if rule.action == "hook":
                return Decision(clauses, self.on_error_outcome(), index)
            if not rule.has_shape:
                return Decision(clauses, rule.outcome(index))
            clauses.append(Clause(rule.shape_range("grid_blocks"),
                                  rule.shape_range("block_threads"),
                                  rule.shape_range("shared_mem"), rule.outcome(index)))
        return Decision(clauses, self.default_outcome())

    def resume(self, info: KernelInfo, decision: Decision, answer: Outcome | None) -> Decision:
        """Continue a decision stopped at its pending hook rule, given the hook's answer.

        None (the hook leaves the kernel to the rules after it) goes on with the walk after
        the rule. An Outcome (its rule should be the hook rule's index) decides the kernel
        when the rule has no launch-shape conditions; when it has some, the answer becomes a
        clause over the rule's ranges and the walk goes on for the launches outside them. The
        result may stop at a later hook rule in turn.
        """
        index = decision.pending_hook
        if index is None:
            raise ValueError("the decision is not waiting for a hook")
        rule = self.rules[index]
        clauses = list(decision.clauses)
        if answer is not None:
            if not rule.has_shape:
                return Decision(clauses, answer)
            clauses.append(Clause(rule.shape_range("grid_blocks"),
                                  rule.shape_range("block_threads"),
                                  rule.shape_range("shared_mem"), answer))
        rest = self.decide(info, index + 1)
        return Decision(clauses + rest.clauses, rest.fallback, rest.pending_hook)

    def explain(self, info: KernelInfo, grid: tuple[int, int, int] = (1, 1, 1),
                block: tuple[int, int, int] = (1, 1, 1), shared_mem: int = 0) -> Explanation:
        grid, block = tuple(grid), tuple(block)
        shape = (math.prod(grid), math.prod(block), shared_mem)
        # The verdict comes from the same Decision the shim gets, so explain cannot drift
        # from what a real launch sees; the walk below only says why. Hooks may decide
        # first; the outcome shown is what follows when every hook returns None.
        decision = self.decide(info)
        while decision.pending_hook is not None:
            decision = self.resume(info, decision, None)
        outcome = decision.outcome_for(*shape)
        steps = []
        asked = []
        decided = None
        for rule in self.rules:
            if decided is not None:
                steps.append(Step(rule.name, False, f"rule '{decided}' decided first", False))
                continue
            matched, reasons = rule.check_static(info)
            if matched and rule.has_shape:
                matched, shape_reasons = rule.check_shape(*shape)
                reasons = reasons + shape_reasons if matched else shape_reasons
            reason = "; ".join(reasons) or "no match conditions: matches every launch"
            if matched and rule.action == "hook":
                reason += (f"; asks {rule.hook.label} (its answer decides unless it returns "
                           "None)")
                asked.append((rule.hook.label, rule.name))
            elif matched:
                decided = rule.name
            steps.append(Step(rule.name, matched, reason))
        deciding = self.rules[outcome.rule] if outcome.rule >= 0 else None
        return Explanation(info, grid, block, shared_mem, steps, outcome,
                           deciding.name if deciding else "default",
                           deciding.message if deciding else "",
                           [ref.label for ref in self.hooks], asked)

    @property
    def program_wide(self) -> bool:
        """Whether a rule confines whole processes (sm_share with scope: program): the shim then
        asks, when a program retains a device's primary context, whether it is to be the
        partition's."""
        return any(rule.wrap is not None and rule.wrap.program_wide for rule in self.rules)

    def program_scope(self, info: KernelInfo) -> Outcome | None:
        """The outcome of the first scope: program rule whose conditions hold for the process
        and device of `info` (its kernel fields are not looked at), or None."""
        for index, rule in enumerate(self.rules):
            if rule.wrap is not None and rule.wrap.program_wide and rule.check_static(info)[0]:
                return rule.outcome(index)
        return None

    @property
    def confines(self) -> bool:
        """Whether a rule confines kernels by a green context (sm_share): the shim then makes
        the contexts the program creates (cuCtxCreate) green contexts of their own."""
        return any(rule.action == "wrap" and rule.wrap.confines for rule in self.rules)

    @property
    def splices(self) -> bool:
        """Whether a rule wraps kernels by the splice: the engine then builds them, and hears of
        the program's loads (a kernel confined by a green context needs neither)."""
        return any(rule.action == "wrap" and not rule.wrap.confines for rule in self.rules)

    def to_json(self) -> str:
        doc = {
            "version": self.version, "path": self.path, "default": self.default,
            "on_error": self.on_error,
            "rules": [dataclasses.asdict(rule) for rule in self.rules],
            "hooks": [dataclasses.asdict(ref) for ref in self.hooks],
        }
        if self.priority is not None:
            doc["priority"] = dataclasses.asdict(self.priority)
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        try:
            data = json.loads(text)
            if isinstance(data, dict) and "version" in data and \
                    data["version"] != SUPPORTED_VERSION:  # a layout this clc does not read
                raise PolicyError("<json>", 1, 1,
                                  f"unsupported policy version {data['version']!r}")
            policy = cls(data["path"], data["version"], data["default"], data["on_error"],
                         [rule_from_dict(rule) for rule in data["rules"]],
                         [HookRef(**ref) for ref in data["hooks"]],
                         priority=priority_from_dict(data.get("priority")))
        except json.JSONDecodeError as e:
            raise PolicyError("<json>", e.lineno, e.colno, f"invalid policy JSON: {e.msg}") \
                from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PolicyError("<json>", 1, 1, f"invalid policy JSON: {e!r}") from None
        if policy.version != SUPPORTED_VERSION:
            raise PolicyError("<json>", 1, 1, f"unsupported policy version {policy.version!r}")
        return policy

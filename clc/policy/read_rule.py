# SPDX-License-Identifier: Apache-2.0
"""Reading one rule: its name and action, the keys its action allows (RULE_KEYS' `only`), a
deny's error, a hook rule's hook; its match and a wrap rule's wrapper are read by the readers
it builds on (read_match, read_wrap).
"""

from __future__ import annotations

import difflib
import keyword
import os

from clc.cuda_errors import CUDA_ERRORS
from clc.policy.decision import _NOT_PERMITTED, WrapRequest
from clc.policy.keys import HOOK_FORM, RULE_ACTIONS, RULE_KEYS, allowed, only_on
from clc.policy.read_match import _MatchReader
from clc.policy.read_wrap import _WrapReader
from clc.policy.reader import _INVALID, _Reported, _suggestion
from clc.policy.rule import HookRef, Rule, _hook_file_problem

__all__ = []

_RULE_KEYS = tuple(RULE_KEYS)
_WRAP_KEYS = only_on(RULE_KEYS, "wrap")
_DENY_KEYS = only_on(RULE_KEYS, "deny")
# What a hook rule's hook answers itself, so the rule may not set it.
_HOOK_ANSWERS = tuple(key for key in allowed(RULE_KEYS, "deny")
                      if key not in allowed(RULE_KEYS, "hook"))


class _RuleReader(_WrapReader, _MatchReader):
    """Reads rules."""

    def rule_name(self, node) -> str:
        name = self.string(node, "name")
        if not name:
            raise self.error(node, "a rule name must not be empty")
        if name in ("default", "on_error"):
            raise self.error(node, f"the rule name '{name}' is reserved for the policy's "
                                   f"{name}")
        return name

    def named(self, node, pairs: dict, index: int, first_use: dict) -> str:
        """The name of rule `index`, as written or rule-N; first_use maps each name read so far
        to its rule's line."""
        name, name_node = f"rule-{index + 1}", node
        if "name" in pairs:
            name_node = pairs["name"][1]
            written = self.attempt(self.rule_name, name_node)
            name = name if written is _INVALID else written
            if written is not _INVALID and name in first_use:
                self.report(name_node, f"duplicate rule name '{name}' (first used at line "
                                       f"{first_use[name]})")
        elif name in first_use:
            self.report(node, f"duplicate rule name '{name}' (first used at line "
                              f"{first_use[name]})")
        first_use.setdefault(name, node.start_mark.line + 1)
        return name

    def action(self, node) -> str:
        action = self.string(node, "action")
        if action not in RULE_ACTIONS:
            raise self.error(node, f"unknown action '{action}' "
                                   f"({_suggestion(action, RULE_ACTIONS)})")
        return action

    def rule(self, node, index: int, first_use: dict) -> Rule:
        if node.id != "mapping":
            raise self.type_error(node, f"rule {index + 1}", "a mapping with at least 'action'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _RULE_KEYS, f"in rule {index + 1}", meant=meant)
        name = self.named(node, pairs, index, first_use)
        action = None
        if "action" in pairs:
            action = self.attempt(self.action, pairs["action"][1])
            action = None if action is _INVALID else action
        elif "action" not in meant:
            self.report(node, f"rule '{name}' has no 'action' (expected one of: "
                              + ", ".join(RULE_ACTIONS) + ")")
        hook = None
        if action == "hook":
            if "hook" not in pairs and "hook" not in meant:
                self.report(node, f"rule '{name}' has action: hook but no 'hook' (expected "
                                  f"hook: {HOOK_FORM})")
            for key, (key_node, _) in pairs.items():
                if key in _HOOK_ANSWERS:
                    self.report(key_node, f"'{key}' is not allowed on a hook rule: its hook "
                                          f"answers it (rule '{name}' has action: hook)")
            if "hook" in pairs:
                hook = self.attempt(self.hook, pairs["hook"][1])
        elif action is not None and "hook" in pairs:
            self.report(pairs["hook"][0], f"'hook' is only allowed on a hook rule (rule "
                                          f"'{name}' has action: {action})")
        if action in ("allow", "wrap"):
            for key in _DENY_KEYS:
                if key in pairs:
                    self.report(pairs[key][0], f"'{key}' is only allowed on a deny rule (rule "
                                               f"'{name}' has action: {action})")
        wrap = None
        if action == "wrap":
            wrap = self.attempt(self.wrap, node, pairs, name, meant)
        elif action is not None:
            for key, (key_node, _) in pairs.items():
                if key in _WRAP_KEYS:
                    self.report(key_node, f"'{key}' is only allowed on a wrap rule (rule "
                                          f"'{name}' has action: {action})")

        fields = self.attempt(self.match, pairs["match"][1]) if "match" in pairs else {}
        # Values are checked unless the key itself was refused above.
        denies = action in ("deny", None)
        message = self.attempt(self.string, pairs["message"][1], "message") \
            if denies and "message" in pairs else ""
        error = self.attempt(self.error_code, pairs["error"][1]) \
            if denies and "error" in pairs else _NOT_PERMITTED
        record = self.attempt(self.boolean, pairs["record"][1], "record") \
            if action != "hook" and "record" in pairs else False
        time = self.attempt(self.boolean, pairs["time"][1], "time") \
            if action != "hook" and "time" in pairs else False
        if isinstance(wrap, WrapRequest) and wrap.program_wide:
            self.program_match(pairs.get("match"), name)
        if len(self.errors) > before:
            raise _Reported
        if action == "deny" and time:
            self.warn(pairs["time"][0], f"time: true on deny rule '{name}': a denied launch "
                                        "never runs, so it has no GPU time; clc only records "
                                        "it, as record: true does")
        elif action == "deny" and record:
            self.warn(pairs["record"][0], f"record: true on deny rule '{name}': a denied launch "
                                          "never runs, so clc records only that it was refused "
                                          "(its shape and the error it returned)")
        return Rule(name=name, action=action, line=node.start_mark.line + 1,
                    message=message, error=error if action == "deny" else 0,
                    record=record, time=time, hook=hook, wrap=wrap, **fields)

    def error_code(self, node) -> int:
        kind, value = self.kind(node)
        if kind == "str":
            if value not in CUDA_ERRORS:
                close = difflib.get_close_matches(value.upper(), list(CUDA_ERRORS), n=1)
                hint = f"did you mean '{close[0]}'?" if close else \
                    "expected a CUresult name such as CUDA_ERROR_NOT_PERMITTED, or its number"
                raise self.error(node, f"unknown CUDA error '{value}' ({hint})")
            code = CUDA_ERRORS[value]
        elif kind == "int":
            code = self.unsigned(node, "error", RULE_KEYS["error"].value.limit)
        else:
            raise self.type_error(node, "error", "a CUresult name or number")
        if code == 0:
            raise self.error(node, "error must not be CUDA_SUCCESS: a denied launch has to fail")
        return code

    def hook(self, node) -> HookRef:
        """`hook: FILE.py:FUNCTION`, FILE relative to the policy's directory."""
        text = self.string(node, "hook")
        if ":" not in text:
            raise self.error(node, f"hook '{text}' must be {HOOK_FORM} (no ':' before a "
                                   "function name)")
        written, _, function = text.rpartition(":")
        if not written:
            raise self.error(node, f"hook '{text}' has no file before the ':' (expected "
                                   f"{HOOK_FORM})")
        if not function:
            raise self.error(node, f"hook '{text}' has no function after the ':' (expected "
                                   f"{HOOK_FORM})")
        if not function.isidentifier():
            raise self.error(node, f"hook function '{function}' is not a Python identifier "
                                   f"(expected {HOOK_FORM})")
        if keyword.iskeyword(function):
            raise self.error(node, f"hook function '{function}' is a Python keyword, not a "
                                   "function name")
        resolved = os.path.realpath(os.path.join(self.directory, written))
        problem = _hook_file_problem(written, resolved)
        if problem:
            raise self.error(node, problem)
        ref = HookRef(resolved, function, text, node.start_mark.line + 1,
                      node.start_mark.column + 1)
        self.hooks.append(ref)
        return ref

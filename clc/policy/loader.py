# SPDX-License-Identifier: Apache-2.0
"""Loading a policy from YAML: every mistake of a file reported at once, with its file, line and
column (PolicyError.errors), and the warnings of a policy that loads (Policy.warnings).
PyYAML is imported inside the two loading functions.

Here: the two loading functions, the top level of the document, and the list of rules with what
is checked across its rules (how many have launch-shape conditions; which are never reached).
The rest of the file is read by the readers _Loader builds on: one rule (read_rule), its match
(read_match), a wrap rule's wrapper (read_wrap), the priority section (read_priority), all on
the reader they share (reader). The keys each part accepts are clc.policy.keys'
tables; the YAML document is composed within bounds by clc.policy.document.
"""

from __future__ import annotations

import gc
import os

from clc import abi
from clc.policy.document import (MAX_ALIASED_NODES, MAX_DEPTH, MAX_POLICY_BYTES,
                                 PYYAML_DESCRIBES_CHARS, yaml_document)
from clc.policy.errors import PolicyError
from clc.policy.keys import SHAPE_KEYS, STATIC_KEYS, SUPPORTED_VERSION, TOP_KEYS
from clc.policy.model import Policy
from clc.policy.read_match import glob_problem
from clc.policy.read_priority import _PriorityReader
from clc.policy.read_rule import _RuleReader
from clc.policy.reader import _INVALID, MAX_NUMBER_CHARS
from clc.policy.rule import Rule

__all__ = ["load_policy", "parse_policy", "glob_problem", "MAX_POLICY_BYTES",
           "PYYAML_DESCRIBES_CHARS", "MAX_DEPTH", "MAX_ALIASED_NODES", "MAX_NUMBER_CHARS"]

_TOP_KEYS = tuple(TOP_KEYS)

# Globs that every launch's value matches, by key: every kernel has a mangled name, a tenant
# is a string (maybe empty), and a user or group always has its numeric id. A process may have
# no names, and a machine without cgroup v2 no cgroup path.
_EVERY_VALUE_KEYS = ("kernel", "tenant", "user", "group")


def _matches_everything(globs: tuple[str, ...]) -> bool:
    return any(pattern and set(pattern) == {"*"} for pattern in globs)


def _decides_first(earlier: Rule, later: Rule) -> bool:
    """Whether every launch that `later` matches is decided by `earlier`, a rule before it."""
    if earlier.action == "hook":  # its hook may return None and leave the launch to later
        return False
    for key in SHAPE_KEYS:
        lo, hi = earlier.shape_range(key)
        later_lo, later_hi = later.shape_range(key)
        if later_lo < lo or later_hi > hi:
            return False
    for key in STATIC_KEYS:
        wanted = getattr(earlier, key)
        if wanted is None or (key in _EVERY_VALUE_KEYS and _matches_everything(wanted)):
            continue
        given = getattr(later, key)
        if given is None:
            return False
        if key == "kernel_regex":
            if given != wanted:
                return False
        elif not set(given) <= set(wanted):
            return False
    return True


def _conditions(rule: Rule, earlier: bool) -> dict[str, frozenset]:
    """A rule's static conditions as {key: the values it accepts}; as an earlier rule, without
    the globs that every launch's value matches (_decides_first passes over those)."""
    out = {}
    for key in STATIC_KEYS:
        values = getattr(rule, key)
        if values is None:
            continue
        if key == "kernel_regex":
            values = (values,)
        elif earlier and key in _EVERY_VALUE_KEYS and _matches_everything(values):
            continue
        out[key] = frozenset(values)
    return out


class _Deciders:
    """The rules read so far, kept so that the first one that decides every launch of a new
    rule (_decides_first) is found without comparing the new rule with each of them: the
    policy's warnings then cost time about linear in its rules, not quadratic.

    An earlier rule can decide a later one only when each key it conditions on is one the
    later rule conditions on too, with values among the earlier rule's. So the earlier rules
    are grouped by their conditions, and the groups by the keys they condition on (at most
    2**8 sets of keys): the later rule looks up, under each set of its own keys, the group of
    exactly its values, and the groups that accept several values for some key through an
    index of those values. In a group, the first rule without shape conditions decides all
    that any later member could, so only it and the shape rules before it are kept: shape
    rules are few (abi.MAX_CLAUSES).
    """

    def __init__(self):
        self.rules: list[Rule] = []
        # keys -> {conditions: [index of the first rule without shape, [shape rules' indices]]}
        self.groups: dict[tuple, dict] = {}
        # keys -> {(key, value): [the conditions of groups accepting several values somewhere]}
        self.wide: dict[tuple, dict] = {}

    def first(self, later: Rule) -> Rule | None:
        """The first rule read so far that decides every launch `later` matches, or None."""
        wanted = _conditions(later, earlier=False)
        best = None
        for keys, groups in self.groups.items():
            if not all(key in wanted for key in keys):
                continue
            candidates = []
            exact = groups.get(tuple(wanted[key] for key in keys))
            if exact is not None:
                candidates.append(exact)
            index = self.wide.get(keys)
            if index:
                lists = [index.get((key, value), ()) for key in keys for value in wanted[key]]
                for conditions in min(lists, key=len) if lists else ():
                    if all(wanted[key] <= values for key, values in zip(keys, conditions)):
                        candidates.append(groups[conditions])
            for plain, shaped in candidates:
                # The group's first rule without shape conditions (if any) decides `later`:
                # its conditions hold wherever later's do. A shape rule before it may too.
                found = plain
                for i in shaped:
                    if best is not None and i > best:
                        break
                    if _decides_first(self.rules[i], later):
                        found = i
                        break
                if found is not None and (best is None or found < best):
                    best = found
        return None if best is None else self.rules[best]

    def add(self, rule: Rule) -> None:
        index = len(self.rules)
        self.rules.append(rule)
        if rule.action == "hook":  # its hook may return None and leave the launch to later
            return
        conditions = _conditions(rule, earlier=True)
        keys = tuple(conditions)
        values = tuple(conditions.values())
        groups = self.groups.setdefault(keys, {})
        group = groups.get(values)
        if group is None:
            group = groups[values] = [None, []]
            if any(len(accepted) > 1 for accepted in values):
                index_of = self.wide.setdefault(keys, {})
                for key, accepted in conditions.items():
                    for value in accepted:
                        index_of.setdefault((key, value), []).append(values)
        if group[0] is not None:
            return
        if rule.has_shape:
            group[1].append(index)
        else:
            group[0] = index


class _Loader(_RuleReader, _PriorityReader):
    """Reads a whole policy: the top level, and the list of rules with the checks across its
    rules; every other part by the readers it builds on."""

    def other_version(self, root) -> PolicyError | None:
        """The error for a policy written for another version, whose other keys are not
        checked: against this version's format they would only be noise."""
        for key_node, value_node in root.value:
            if key_node.id == "scalar" and key_node.value == "version":
                try:
                    kind, version = self.kind(value_node)
                except PolicyError:
                    return None
                if kind == "int" and version != SUPPORTED_VERSION:
                    return self.error(value_node, f"unsupported policy version {version} (this "
                                                  f"clc reads version {SUPPORTED_VERSION})")
                return None
        return None

    def version(self, node) -> int:
        kind, version = self.kind(node)
        if kind != "int":
            raise self.type_error(node, "version", f"the integer {SUPPORTED_VERSION}")
        return version

    def policy(self, root) -> Policy:
        if root.id != "mapping":
            raise self.error(root, "a policy must be a mapping that starts with 'version: 1', "
                                   f"got {self.describe(root)}")
        other = self.other_version(root)
        if other is not None:
            raise other
        meant = set()
        pairs = self.mapping(root, _TOP_KEYS, "at the top level", meant=meant)
        if "version" not in pairs and "version" not in meant:
            self.report(root, "missing 'version' (this clc reads policies with "
                              f"'version: {SUPPORTED_VERSION}')")
        elif "version" in pairs:
            self.attempt(self.version, pairs["version"][1])
        default = self.attempt(self.choice, pairs["default"][1], "default") \
            if "default" in pairs else "allow"
        on_error = self.attempt(self.choice, pairs["on_error"][1], "on_error") \
            if "on_error" in pairs else "allow"
        rules = self.attempt(self.rules, pairs["rules"][1]) if "rules" in pairs else []
        priority = self.attempt(self.priority, pairs["priority"][1]) \
            if "priority" in pairs else None
        if self.errors:
            error = PolicyError.collect(self.errors)
            error.hooks = tuple(self.hooks)
            raise error
        if on_error == "allow" and (default == "deny" or any(r.action == "deny" for r in rules)):
            self.warn_on_error(root, pairs.get("on_error"))
        return Policy(self.path, SUPPORTED_VERSION, default, on_error, rules,
                      warnings=sorted(self.warnings, key=lambda w: (w.line, w.column)),
                      priority=priority, on_error_given="on_error" in pairs)

    def rules(self, node) -> list[Rule]:
        if node.id != "sequence":
            raise self.type_error(node, "rules", "a list of rules")
        rules = []
        first_use = {}
        shape_rules = 0
        deciders = _Deciders()
        for index, rule_node in enumerate(node.value):
            rule = self.attempt(self.rule, rule_node, index, first_use)
            if rule is _INVALID:
                continue
            if rule.has_shape:
                shape_rules += 1
                if shape_rules > abi.MAX_CLAUSES:
                    self.report(rule_node, "too many rules with launch-shape conditions ("
                                           + ", ".join(SHAPE_KEYS) + "): at most "
                                           f"{abi.MAX_CLAUSES} are supported")
            # Warnings are given only for a policy without errors.
            earlier = None if self.errors else deciders.first(rule)
            if earlier is not None:
                self.warn(rule_node, f"rule '{rule.name}' is never reached: rule "
                                     f"'{earlier.name}' (line {earlier.line}) comes before "
                                     f"it and decides every launch that '{rule.name}' matches")
            deciders.add(rule)
            rules.append(rule)
        return rules

    def warn_on_error(self, root, on_error_pair) -> None:
        effect = ("should clc fail to decide a launch (its engine does not start, a hook "
                  "raises), the launch runs, whatever this policy would deny")
        if on_error_pair is None:
            self.warn(root, f"on_error is not set, so it is allow: {effect}; add "
                            "'on_error: deny' to refuse such launches")
        else:
            self.warn(on_error_pair[1], f"on_error: allow in a policy that denies: {effect}; "
                                        "'on_error: deny' refuses such launches")


def parse_policy(text: str, path: str = "<string>") -> Policy:
    """Check a policy given as YAML text; every problem raises PolicyError."""
    path = os.fsdecode(path)
    try:
        import yaml
    except ImportError:
        raise PolicyError(path, 1, 1, "reading a YAML policy needs PyYAML "
                                      "(pip install pyyaml)") from None
    # A large policy is hundreds of thousands of small objects, none in a cycle: the cyclic
    # collector would walk them again and again as they are made, for nearly half the time.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _parsed(yaml, text, path)
    finally:
        if collecting:
            gc.enable()


def _parsed(yaml, text: str, path: str) -> Policy:
    try:
        root = yaml_document(yaml, text, path)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = f"{e.context}, {e.problem}" if e.context and e.problem else e.problem or e.context
        raise PolicyError(path, mark.line + 1 if mark else 1, mark.column + 1 if mark else 1,
                          f"invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:
        code = e.character if isinstance(e.character, int) else ord(e.character)
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        raise PolicyError(path, line, column, "invalid YAML: unacceptable character "
                                              f"#x{code:04x}: {e.reason}") from None
    except yaml.YAMLError as e:
        raise PolicyError(path, 1, 1, f"invalid YAML: {e}") from None
    if root is None:
        raise PolicyError(path, 1, 1, "the policy is empty (it needs at least 'version: "
                                      f"{SUPPORTED_VERSION}')")
    return _Loader(path).policy(root)


def load_policy(path) -> Policy:
    """Read and check the policy file at path; every problem raises PolicyError."""
    name = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            # One byte more than the limit tells a file at the limit from a larger one; a
            # FIFO or a device is read as far as that too, and no further.
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as e:
        raise PolicyError(name, 0, 0, f"cannot read the policy: {e.strerror or e}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise PolicyError(name, 1, 1, f"the policy is larger than {MAX_POLICY_BYTES >> 20} MiB "
                                      "(a policy of 20,000 rules takes 2 MiB)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        column = len(data[line_start:e.start].decode("utf-8", "replace")) + 1
        raise PolicyError(name, data.count(b"\n", 0, e.start) + 1, column,
                          f"the policy is not UTF-8 text (byte 0x{data[e.start]:02x})") from None
    return parse_policy(text, name)

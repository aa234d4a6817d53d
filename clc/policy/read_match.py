# SPDX-License-Identifier: Apache-2.0
"""Reading a rule's match (and a priority class's): each condition read by its kind, as the
key tables (clc.policy.keys) give it: globs, user and group names or ids, a regex, devices,
launch-shape ranges.
"""

from __future__ import annotations

from clc.policy.decision import _bounds
from clc.policy.keys import MATCH_KEYS, PROGRAM_MATCH_KEYS, RANGE_OPS
from clc.policy.reader import _Reader, _Reported
from clc.policy.regex import regex_problem

__all__ = ["glob_problem"]

_MATCH_KEYS = tuple(MATCH_KEYS)
# difflib would suggest 'gt' for 'gte'; these spellings have one obvious meaning.
_RANGE_OP_ALIASES = {"gte": "ge", "lte": "le", "min": "ge", "max": "le", ">": "gt", ">=": "ge",
                     "<": "lt", "<=": "le", "==": "eq", "=": "eq"}


def glob_problem(pattern: str) -> str | None:
    # fnmatch silently reads an unclosed '[' as a literal; an admin almost surely meant a set.
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j >= len(pattern):
                return f"the '[' at offset {i} has no closing ']'"
            i = j
        i += 1
    return None


class _MatchReader(_Reader):
    """Reads match conditions."""

    def match(self, node) -> dict:
        if node.id != "mapping":
            raise self.type_error(node, "match", "a mapping")
        before = len(self.errors)
        fields = {key: self.attempt(self.condition, key, value_node)
                  for key, (_, value_node) in self.mapping(node, _MATCH_KEYS, "in match").items()}
        if len(self.errors) > before:
            raise _Reported
        return fields

    def program_match(self, match_pair, name: str) -> None:
        """A rule with scope: program confines whole processes: it may match only what a
        process is (its name, tenant, user, group, cgroup) and the device."""
        if match_pair is None or match_pair[1].id != "mapping":
            return
        for key_node, _ in match_pair[1].value:
            if key_node.id == "scalar" and key_node.value not in PROGRAM_MATCH_KEYS:
                self.report(key_node, f"'{key_node.value}' cannot be matched by rule '{name}': "
                                      "scope: program confines every kernel of a process, so its "
                                      "match may use only " + ", ".join(PROGRAM_MATCH_KEYS))

    def condition(self, key: str, node):
        """The value of the match condition `key`, read as its kind in MATCH_KEYS says."""
        return getattr(self, MATCH_KEYS[key].value.reader)(node, key)

    def globs(self, node, what: str) -> tuple[str, ...]:
        return self.settled([self.attempt(self.glob, item, what, item is node)
                             for item in self.items(node, what, "a glob")])

    def glob(self, node, what: str, alone: bool, expected: str = "a glob (a string)") -> str:
        if self.kind(node)[0] != "str":
            raise self.type_error(node, what if alone else f"each item of {what}", expected)
        pattern = node.value
        problem = glob_problem(pattern)
        if problem:
            raise self.error(node, f"invalid glob '{pattern}' in {what}: {problem}")
        if what == "cgroup" and pattern[:1] not in ("/", "*", "?", "["):
            raise self.error(node, f"cgroup glob '{pattern}' can never match: cgroup paths "
                                   "start with '/', as in /proc/self/cgroup")
        return pattern

    def ids(self, node, what: str) -> tuple[str, ...]:
        """`user` or `group`: names, globs or numeric ids, the ids kept in decimal."""
        return self.settled([self.attempt(self.id_glob, item, what, item is node)
                             for item in self.items(node, what, "a name or an id")])

    def id_glob(self, node, what: str, alone: bool) -> str:
        if self.kind(node)[0] == "int":
            return str(self.unsigned(node, f"{what} id", MATCH_KEYS[what].value.limit))
        return self.glob(node, what, alone, "a name or glob (a string) or a numeric id")

    def regex(self, node, what: str) -> str:
        pattern = self.string(node, what)
        problem = regex_problem(pattern)
        if problem:
            raise self.error(node, problem)
        return pattern

    def devices(self, node, what: str) -> tuple[int, ...]:
        limit = MATCH_KEYS[what].value.limit
        return self.settled([self.attempt(self.unsigned, item, what, limit)
                             for item in self.items(node, what, "a device ordinal")])

    def shape(self, node, what: str) -> tuple[tuple[str, int], ...]:
        limit = MATCH_KEYS[what].value.limit
        kind, _ = self.kind(node)
        if kind == "int":
            return (("eq", self.unsigned(node, what, limit)),)
        if kind != "mapping":
            raise self.type_error(node, what, "an integer or a mapping of gt/ge/lt/le/eq to "
                                              "integers")
        before = len(self.errors)
        pairs = self.mapping(node, tuple(RANGE_OPS), f"in {what}", "range operator",
                             _RANGE_OP_ALIASES)
        if not pairs and len(self.errors) == before:
            raise self.error(node, f"{what} needs at least one of: " + ", ".join(RANGE_OPS))
        bounds = self.settled([self.attempt(self.unsigned, value_node, f"{what} {op}", limit)
                               for op, (_, value_node) in pairs.items()])
        if len(self.errors) > before:
            raise _Reported
        conditions = tuple(zip(pairs, bounds))
        lo, hi = _bounds(conditions)
        if lo > hi:
            wanted = " and ".join(f"{RANGE_OPS[op]} {bound}" for op, bound in conditions)
            raise self.error(node, f"empty range for {what}: no value is {wanted}")
        return conditions

# SPDX-License-Identifier: Apache-2.0
"""Loading a policy from YAML: every mistake of a file reported at once, with its file, line and
column (PolicyError.errors), and the warnings of a policy that loads (Policy.warnings).
PyYAML is imported inside the two loading functions.
"""

from __future__ import annotations

import difflib
import gc
import keyword
import math
import os
import re

from clc import abi
from clc.cuda_errors import CUDA_ERRORS
from clc.policy.decision import _NOT_PERMITTED, WrapRequest, _bounds
from clc.policy.errors import PolicyError, PolicyWarning
from clc.policy.keys import (LATENCY_CRITICAL, PRIORITY_CLASSES, RANGE_OPS, SHAPE_KEYS,
                             SUPPORTED_VERSION, U64_MAX)
from clc.policy.model import Policy
from clc.policy.priority import DEFAULT_BOARD, Priority, PriorityClass
from clc.policy.rule import HookRef, Rule, _hook_file_problem
from clc.policy.regex import regex_problem

# What a policy file may make the loader do, whatever its bytes: each limit is far beyond what
# any policy needs, and each keeps a hostile or broken file from costing minutes or gigabytes
# (docs/policies.md, "Limits").
# Twice a policy of 20,000 rules written out in block style; such a file loads in seconds.
MAX_POLICY_BYTES = 4 << 20
# PyYAML's own parser takes seconds a MiB: it describes the syntax errors of files up to this
# size (a policy of some 2,500 rules), libyaml those of larger ones (_document).
PYYAML_DESCRIBES_CHARS = 256 << 10
# A policy nests 5 deep (the top mapping, rules, a rule, its match, a range); the loader walks
# the document without recursion, and PyYAML's parser keeps a stack per level.
MAX_DEPTH = 64
# The nodes that aliases stand for, counted as if written out: a policy that shares a match
# block among thousands of rules stays far below; nine levels of nine aliases ("billion
# laughs", a few hundred bytes) stand for 387 million.
MAX_ALIASED_NODES = 100_000
# The longest number, in characters: 2**64-1 has 20 digits and 0b with 64 binary digits is
# the longest form a bound can take. Python's conversion of decimal text is quadratic in its
# length and refuses more than 4300 digits.
MAX_NUMBER_CHARS = 100

_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1
# uid_t and gid_t are 32 bits, and (uid_t)-1 is no one's id.
_ID_MAX = 2**32 - 2

_ACTIONS = ("allow", "deny")  # the verdicts of default and on_error
_RULE_ACTIONS = ("allow", "deny", "hook", "wrap")
_TOP_KEYS = ("version", "default", "on_error", "rules", "priority")
_PRIORITY_KEYS = ("classes", "board", "idle_after_ms")
_CLASS_KEYS = ("name", "class", "match", "floor", "run_ahead", "held_share")
# What a process is: all a priority class may match (a class holds for a whole process).
_CLASS_MATCH_KEYS = ("process", "tenant", "user", "group", "cgroup")
_RUN_AHEAD_RANGE = (4, 256)
_RULE_KEYS = ("name", "match", "action", "hook", "message", "error", "record", "time",
              "wrapper", "params", "on_unwrappable", "mechanism")
_WRAP_KEYS = ("wrapper", "params", "on_unwrappable", "mechanism")
# What a hook rule's hook answers itself, so the rule may not set it.
_HOOK_ANSWERS = ("message", "error", "record", "time")
_HOOK_FORM = "FILE.py:FUNCTION"
_MATCH_KEYS = ("kernel", "kernel_regex", "grid_blocks", "block_threads", "shared_mem", "device",
               "process", "tenant", "user", "group", "cgroup")
_GLOB_KEYS = ("kernel", "process", "tenant", "cgroup")
_ID_KEYS = ("user", "group")
# What a process is, and its device: all a rule with scope: program may match.
_PROCESS_KEYS = ("device", "process", "tenant", "user", "group", "cgroup")
# difflib would suggest 'gt' for 'gte'; these spellings have one obvious meaning.
_RANGE_OP_ALIASES = {"gte": "ge", "lte": "le", "min": "ge", "max": "le", ">": "gt", ">=": "ge",
                     "<": "lt", "<=": "le", "==": "eq", "=": "eq"}

_YAML_TAG = "tag:yaml.org,2002:"
# YAML 1.2 booleans only: PyYAML follows YAML 1.1, where yes/no/on/off are booleans too, and
# `tenant: no` must stay the tenant named "no".
_BOOLEANS = {"true": True, "True": True, "TRUE": True,
             "false": False, "False": False, "FALSE": False}
_YAML11_BOOL_WORDS = {"yes", "no", "on", "off", "y", "n"}
_DECIMAL_RE = re.compile(r"[-+]?[0-9]+")
# YAML 1.2 floats that PyYAML (YAML 1.1) reads as strings, such as 1e20: numbers where a number
# is expected.
_YAML12_FLOAT_RE = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_PREFIXED_INT_RE = re.compile(r"[-+]?0(?:[xX][0-9a-fA-F]+|[bB][01]+)")

# ---- loading ---------------------------------------------------------------------------------

def _closest(word: str, choices, aliases=None) -> str | None:
    if aliases and word in aliases:
        return aliases[word]
    close = difflib.get_close_matches(word, choices, n=1)
    return close[0] if close else None


def _suggestion(word: str, choices, aliases=None) -> str:
    close = _closest(word, choices, aliases)
    if close:
        return f"did you mean '{close}'?"
    return "expected one of: " + ", ".join(choices)


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


def _yaml_float(text: str) -> float | None:
    """The value of a scalar PyYAML resolves as a float; None for YAML 1.1's base-60 form
    (1:30.5), a string in YAML 1.2."""
    plain = text.replace("_", "")
    special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf,
               ".nan": math.nan}.get(plain.lower())
    if special is not None:
        return special
    if ":" in plain:
        return None
    try:
        return float(plain)
    except ValueError:
        return None


# Limits of the built-in wrappers' numbers that wrapper_spec does not check, as (lowest as
# written, lowest, highest, why): beyond them the value cannot reach the GPU as written.
_WRAPPER_LIMITS = {
    ("sm_share", "share"): ("0.000001", 1e-6, 1, "the shim keeps a share in millionths of the "
                                                 "GPU"),
    ("sm_share", "sms"): ("1", 1, _UINT32_MAX, "the shim keeps it in 32 bits"),
    ("deadline", "ms"): ("0.000001", 1e-6, 18_446_744_073_709,
                         "the device code counts it in nanoseconds, in 64 bits"),
}

# Globs that every launch's value matches, by key: every kernel has a mangled name, a tenant
# is a string (maybe empty), and a user or group always has its numeric id. A process may have
# no names, and a machine without cgroup v2 no cgroup path.
_EVERY_VALUE_KEYS = ("kernel", "tenant", "user", "group")
_STATIC_KEYS = ("kernel", "kernel_regex", "device", "process", "tenant", "user", "group",
                "cgroup")


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
    for key in _STATIC_KEYS:
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
    for key in _STATIC_KEYS:
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


_INVALID = object()  # what _Loader.attempt gives for a part whose mistakes it has noted


class _Reported(Exception):
    """A part of the policy whose mistakes are already among the loader's errors."""


class _Loader:
    """Walks a composed YAML node tree, so that every error can name its node's position.

    Every part is checked even when an earlier one is wrong (attempt), so that a file's
    mistakes are reported together; warnings are kept for a policy that loads.
    """

    def __init__(self, path: str):
        self.path = path
        # Relative hook files are found next to the policy file.
        self.directory = os.path.dirname(os.path.abspath(path))
        self.errors: list[PolicyError] = []
        self.warnings: list[PolicyWarning] = []
        self.hooks: list[HookRef] = []  # the hook rules' references that were read

    def error(self, node, message: str) -> PolicyError:
        return PolicyError(self.path, node.start_mark.line + 1, node.start_mark.column + 1,
                           message)

    def report(self, node, message: str) -> None:
        self.errors.append(self.error(node, message))

    def warn(self, node, message: str) -> None:
        self.warnings.append(PolicyWarning(self.path, node.start_mark.line + 1,
                                           node.start_mark.column + 1, message))

    def attempt(self, parse, *args):
        """parse(*args), or _INVALID once its mistakes are among self.errors."""
        try:
            return parse(*args)
        except PolicyError as e:
            self.errors.append(e)
        except _Reported:
            pass
        return _INVALID

    @staticmethod
    def settled(values: list) -> tuple:
        """values as a tuple, or _Reported when one of them was wrong."""
        if any(value is _INVALID for value in values):
            raise _Reported
        return tuple(values)

    # -- scalars and their kinds

    def kind(self, node) -> tuple[str, object]:
        """(kind, value): kind is null, bool, int, float, str, list or mapping."""
        if not node.tag.startswith(_YAML_TAG):
            raise self.error(node, f"unsupported YAML tag '{node.tag}'")
        if node.id == "mapping":
            return "mapping", node
        if node.id == "sequence":
            return "list", node
        kind = node.tag[len(_YAML_TAG):]
        text = node.value
        if kind == "null":
            return "null", None
        if kind == "bool" and text in _BOOLEANS:
            return "bool", _BOOLEANS[text]
        if kind == "int":
            digits = text.replace("_", "")
            if len(digits) > MAX_NUMBER_CHARS:
                raise self.error(node, f"the number {digits[:20]}... is {len(digits)} characters "
                                       f"long: a number here has at most {MAX_NUMBER_CHARS} "
                                       f"(quote it to mean the text)")
            # Leading zeros read as decimal: YAML 1.1 octal would turn 010 into 8.
            if _DECIMAL_RE.fullmatch(digits):
                return "int", int(digits, 10)
            if _PREFIXED_INT_RE.fullmatch(digits):
                return "int", int(digits, 0)
        if kind == "float":
            value = _yaml_float(text)
            if value is not None:
                return "float", value
        return "str", text

    def describe(self, node) -> str:
        # Only the branch taken may format node.value: a collection's value is its nodes, which
        # aliases can make a graph of millions of paths.
        kind, value = self.kind(node)
        if kind in ("list", "mapping"):
            return f"a {kind}"
        if kind == "null":
            return "nothing (null)"
        if kind == "bool":
            return f"the boolean {node.value}"
        if kind == "int":
            return f"the integer {value}"
        if kind == "float":
            return f"the number {node.value}"
        return f"the string '{value}'"

    def type_error(self, node, what: str, expected: str) -> PolicyError:
        message = f"{what} must be {expected}, got {self.describe(node)}"
        kind, value = self.kind(node)
        if kind in ("bool", "int", "float") and "string" in expected:
            message += f" (quote it to mean the text: \"{node.value}\")"
        elif kind == "str" and node.style is None and value.lower() in _YAML11_BOOL_WORDS \
                and expected == "true or false":
            message += " (only true and false are booleans here)"
        return self.error(node, message)

    def string(self, node, what: str) -> str:
        kind, value = self.kind(node)
        if kind != "str":
            raise self.type_error(node, what, "a string")
        return value

    def boolean(self, node, what: str) -> bool:
        kind, value = self.kind(node)
        if kind != "bool":
            raise self.type_error(node, what, "true or false")
        return value

    def unsigned(self, node, what: str, limit: int) -> int:
        kind, value = self.kind(node)
        if kind != "int":
            raise self.type_error(node, what, "an integer")
        if value < 0:
            raise self.error(node, f"{what} must not be negative, got {value}")
        if value > limit:
            raise self.error(node, f"{what} must be at most {limit}, got {value}")
        return value

    def number(self, node, what: str) -> int | float:
        """An integer or a finite number. A plain 1e20 is one too: PyYAML follows YAML 1.1,
        where a float needs a dot, and would read it as a string."""
        kind, value = self.kind(node)
        if kind == "str" and node.style is None and _YAML12_FLOAT_RE.fullmatch(value):
            kind, value = "float", float(value)
        if kind not in ("int", "float"):
            raise self.type_error(node, what, "a number")
        if not math.isfinite(value):
            raise self.error(node, f"{what} must be a finite number, got {node.value}")
        return value

    def choice(self, node, what: str) -> str:
        kind, value = self.kind(node)
        if kind != "str" or value not in _ACTIONS:
            raise self.error(node, f"{what} must be 'allow' or 'deny', got {self.describe(node)}")
        return value

    # -- composite values

    def mapping(self, node, allowed: tuple[str, ...], where: str, noun: str = "key",
                aliases: dict | None = None, meant: set | None = None) -> dict:
        """{key: (key node, value node)}; unknown and repeated keys are reported and left out.

        meant gets the keys suggested for unknown ones: a key missing because it was
        misspelled is not reported a second time as missing.
        """
        pairs = {}
        for key_node, value_node in node.value:
            if key_node.id != "scalar":
                self.attempt(self.not_a_key, key_node, noun, where)
                continue
            key = key_node.value
            if key not in allowed:
                close = _closest(key, allowed, aliases)
                if meant is not None and close:
                    meant.add(close)
                self.report(key_node, f"unknown {noun} '{key}' {where} "
                                      f"({_suggestion(key, allowed, aliases)})")
            elif key in pairs:
                first = pairs[key][0].start_mark.line + 1
                self.report(key_node, f"duplicate {noun} '{key}' {where} (first at line {first})")
            else:
                pairs[key] = (key_node, value_node)
        return pairs

    def not_a_key(self, node, noun: str, where: str):
        raise self.error(node, f"expected a {noun} {where}, got {self.describe(node)}")

    def items(self, node, what: str, single: str) -> list:
        """The nodes of a value that may be one item or a non-empty list of them."""
        if node.id != "sequence":
            if node.id == "mapping":
                raise self.error(node, f"{what} must be {single} or a list of them, got a mapping")
            return [node]
        if not node.value:
            raise self.error(node, f"{what} must not be an empty list")
        return node.value

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
            return str(self.unsigned(node, f"{what} id", _ID_MAX))
        return self.glob(node, what, alone, "a name or glob (a string) or a numeric id")

    def regex(self, node, what: str) -> str:
        pattern = self.string(node, what)
        problem = regex_problem(pattern)
        if problem:
            raise self.error(node, problem)
        return pattern

    def devices(self, node) -> tuple[int, ...]:
        return self.settled([self.attempt(self.unsigned, item, "device", _INT32_MAX)
                             for item in self.items(node, "device", "a device ordinal")])

    def shape(self, node, what: str) -> tuple[tuple[str, int], ...]:
        kind, _ = self.kind(node)
        if kind == "int":
            return (("eq", self.unsigned(node, what, U64_MAX)),)
        if kind != "mapping":
            raise self.type_error(node, what, "an integer or a mapping of gt/ge/lt/le/eq to "
                                              "integers")
        before = len(self.errors)
        pairs = self.mapping(node, tuple(RANGE_OPS), f"in {what}", "range operator",
                             _RANGE_OP_ALIASES)
        if not pairs and len(self.errors) == before:
            raise self.error(node, f"{what} needs at least one of: " + ", ".join(RANGE_OPS))
        bounds = self.settled([self.attempt(self.unsigned, value_node, f"{what} {op}", U64_MAX)
                               for op, (_, value_node) in pairs.items()])
        if len(self.errors) > before:
            raise _Reported
        conditions = tuple(zip(pairs, bounds))
        lo, hi = _bounds(conditions)
        if lo > hi:
            wanted = " and ".join(f"{RANGE_OPS[op]} {bound}" for op, bound in conditions)
            raise self.error(node, f"empty range for {what}: no value is {wanted}")
        return conditions

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
            code = self.unsigned(node, "error", _INT32_MAX)
        else:
            raise self.type_error(node, "error", "a CUresult name or number")
        if code == 0:
            raise self.error(node, "error must not be CUDA_SUCCESS: a denied launch has to fail")
        return code

    # -- the document

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

    def priority(self, node) -> Priority:
        """`priority:`: classes of processes (latency-critical, best-effort), the board's
        directory, and idle_after_ms."""
        if node.id != "mapping":
            raise self.type_error(node, "priority", "a mapping with 'classes'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _PRIORITY_KEYS, "in priority", meant=meant)
        board, idle = DEFAULT_BOARD, 20.0
        if "board" in pairs:
            board = self.attempt(self.board, pairs["board"][1])
        if "idle_after_ms" in pairs:
            idle = self.attempt(self.number, pairs["idle_after_ms"][1], "idle_after_ms")
            if idle is not _INVALID and not 0 < idle <= 10000:
                self.report(pairs["idle_after_ms"][1], "idle_after_ms must be more than 0 and "
                                                       f"at most 10000, got {idle}")
        classes = []
        if "classes" in pairs:
            classes = self.attempt(self.classes, pairs["classes"][1])
        elif "classes" not in meant:
            self.report(node, "priority has no 'classes' (expected a list of classes, each "
                              "with a name, a class (latency-critical or best-effort) and a "
                              "match)")
        if len(self.errors) > before:
            raise _Reported
        return Priority(tuple(classes), board, float(idle))

    def board(self, node) -> str:
        path = self.string(node, "board")
        if not path.startswith("/"):
            raise self.error(node, f"board must be an absolute path (a directory every "
                                   f"process of the machine can reach), got '{path}'")
        if "\0" in path or len(path) > 200:
            raise self.error(node, "board must be a path of at most 200 characters")
        return path

    def classes(self, node) -> list[PriorityClass]:
        if node.id != "sequence":
            raise self.type_error(node, "classes", "a list of classes")
        if not node.value:
            raise self.error(node, "classes must not be an empty list")
        classes, first_use = [], {}
        for index, class_node in enumerate(node.value):
            c = self.attempt(self.priority_class, class_node, index, first_use)
            if c is _INVALID:
                continue
            every = next((e for e in classes if all(getattr(e, key) is None
                                                    for key in _CLASS_MATCH_KEYS)), None)
            if every is not None:
                self.warn(class_node, f"class '{c.name}' is never reached: class "
                                      f"'{every.name}' (line {every.line}) has no match, so "
                                      "every process is of that class")
            classes.append(c)
        return classes

    def priority_class(self, node, index: int, first_use: dict) -> PriorityClass:
        if node.id != "mapping":
            raise self.type_error(node, f"class {index + 1}",
                                  "a mapping with 'name', 'class' and 'match'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _CLASS_KEYS, f"in class {index + 1}", meant=meant)
        name = f"class-{index + 1}"
        if "name" in pairs:
            written = self.attempt(self.string, pairs["name"][1], "name")
            if written is not _INVALID:
                if not written:
                    self.report(pairs["name"][1], "a class name must not be empty")
                elif written in first_use:
                    self.report(pairs["name"][1], f"duplicate class name '{written}' (first "
                                                  f"used at line {first_use[written]})")
                name = written or name
        elif "name" not in meant:
            self.report(node, f"class {index + 1} has no 'name'")
        first_use.setdefault(name, node.start_mark.line + 1)
        kind = None
        if "class" in pairs:
            written = self.attempt(self.string, pairs["class"][1], "class")
            if written is not _INVALID and written not in PRIORITY_CLASSES:
                self.report(pairs["class"][1], f"unknown class '{written}' "
                                               f"({_suggestion(written, PRIORITY_CLASSES)})")
            elif written is not _INVALID:
                kind = written
        elif "class" not in meant:
            self.report(node, f"class '{name}' has no 'class' (expected latency-critical or "
                              "best-effort)")
        fields = {}
        if "match" in pairs:
            match = pairs["match"][1]
            if match.id != "mapping":
                self.errors.append(self.type_error(match, "match", "a mapping"))
            else:
                for key, (_, value) in self.mapping(
                        match, _CLASS_MATCH_KEYS, f"in the match of class '{name}' (a class "
                        "holds for whole processes: it may match only "
                        + ", ".join(_CLASS_MATCH_KEYS) + ")").items():
                    fields[key] = self.attempt(self.condition, key, value)
        floor, run_ahead, held_share = 0.1, 32, 0.0
        for key in ("floor", "run_ahead", "held_share"):
            if key in pairs and kind == LATENCY_CRITICAL:
                self.report(pairs[key][0], f"'{key}' is only allowed on a best-effort class "
                                           f"(class '{name}' is latency-critical)")
        if "floor" in pairs and kind != LATENCY_CRITICAL:
            floor = self.attempt(self.number, pairs["floor"][1], "floor")
            if floor is not _INVALID and not 0.001 <= floor <= 1:
                self.report(pairs["floor"][1], "floor must be at least 0.001 (a best-effort "
                                               "process held without a floor could starve) "
                                               f"and at most 1, got {floor}")
        if "run_ahead" in pairs and kind != LATENCY_CRITICAL:
            lo, hi = _RUN_AHEAD_RANGE
            run_ahead = self.attempt(self.unsigned, pairs["run_ahead"][1], "run_ahead", hi)
            if run_ahead is not _INVALID and run_ahead < lo:
                self.report(pairs["run_ahead"][1], f"run_ahead must be at least {lo}, got "
                                                   f"{run_ahead}")
        if "held_share" in pairs and kind != LATENCY_CRITICAL:
            held_share = self.attempt(self.number, pairs["held_share"][1], "held_share")
            if held_share is not _INVALID and not 0 <= held_share < 1:
                self.report(pairs["held_share"][1], "held_share must be at least 0 (0: held "
                                                    "launches wait) and less than 1, got "
                                                    f"{held_share}")
            elif held_share is not _INVALID and "floor" in pairs and held_share > 0:
                self.warn(pairs["floor"][0], f"floor on class '{name}' has no effect: with "
                                             "held_share its held launches run on a share of "
                                             "the SMs, they do not wait")
        if len(self.errors) > before or kind is None:
            raise _Reported
        return PriorityClass(name, kind, float(floor), int(run_ahead),
                             node.start_mark.line + 1, held_share=float(held_share), **fields)

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
                    self.report(rule_node, "too many rules with launch-shape conditions "
                                           "(grid_blocks, block_threads, shared_mem): at most "
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

    def rule_name(self, node) -> str:
        name = self.string(node, "name")
        if not name:
            raise self.error(node, "a rule name must not be empty")
        if name in ("default", "on_error"):
            raise self.error(node, f"the rule name '{name}' is reserved for the policy's "
                                   f"{name}")
        return name

    def action(self, node) -> str:
        action = self.string(node, "action")
        if action not in _RULE_ACTIONS:
            raise self.error(node, f"unknown action '{action}' "
                                   f"({_suggestion(action, _RULE_ACTIONS)})")
        return action

    def rule(self, node, index: int, first_use: dict) -> Rule:
        if node.id != "mapping":
            raise self.type_error(node, f"rule {index + 1}", "a mapping with at least 'action'")
        before = len(self.errors)
        meant = set()
        pairs = self.mapping(node, _RULE_KEYS, f"in rule {index + 1}", meant=meant)
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

        action = None
        if "action" in pairs:
            action = self.attempt(self.action, pairs["action"][1])
            action = None if action is _INVALID else action
        elif "action" not in meant:
            self.report(node, f"rule '{name}' has no 'action' (expected one of: "
                              + ", ".join(_RULE_ACTIONS) + ")")
        hook = None
        if action == "hook":
            if "hook" not in pairs and "hook" not in meant:
                self.report(node, f"rule '{name}' has action: hook but no 'hook' (expected "
                                  f"hook: {_HOOK_FORM})")
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
            for key in ("message", "error"):
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
            if key_node.id == "scalar" and key_node.value not in _PROCESS_KEYS:
                self.report(key_node, f"'{key_node.value}' cannot be matched by rule '{name}': "
                                      "scope: program confines every kernel of a process, so its "
                                      "match may use only " + ", ".join(_PROCESS_KEYS))

    def condition(self, key: str, node):
        if key in _GLOB_KEYS:
            return self.globs(node, key)
        if key in _ID_KEYS:
            return self.ids(node, key)
        if key == "kernel_regex":
            return self.regex(node, key)
        if key == "device":
            return self.devices(node)
        return self.shape(node, key)

    def wrap(self, node, pairs, name, meant) -> WrapRequest:
        """`wrapper:` (a built-in or a .cu path relative to the policy), `params:`, and
        `on_unwrappable:`, checked as the wrap pipeline will use them."""
        from clc.wrapping.spec import (  # standard library only
            BUILTIN_WRAPPERS, WORD_PARAMS, mechanism_for, wrapper_spec)
        if "wrapper" not in pairs:
            if "wrapper" in meant:
                raise _Reported
            raise self.error(node, f"rule '{name}' has action: wrap but no 'wrapper' (expected "
                                   "sm_share, block_count, deadline or a .cu file)")
        before = len(self.errors)
        wrapper_node = pairs["wrapper"][1]
        wrapper = self.attempt(self.string, wrapper_node, "wrapper")
        params, value_nodes = {}, {}
        if "params" in pairs:
            params_node = pairs["params"][1]
            if params_node.id != "mapping":
                raise self.type_error(params_node, "params", "a mapping")
            for key_node, value_node in params_node.value:
                if key_node.id != "scalar":
                    self.attempt(self.not_a_key, key_node, "parameter name", "in params")
                    continue
                key = key_node.value
                if key in value_nodes:
                    first = value_nodes[key].start_mark.line + 1
                    self.report(key_node, f"duplicate parameter '{key}' in params (first at "
                                          f"line {first})")
                    continue
                value_nodes[key] = value_node
                # sm_share's place and scope are words; every other parameter a number.
                parse = self.string if wrapper == "sm_share" and key in WORD_PARAMS \
                    else self.number
                value = self.attempt(parse, value_node, f"params.{key}")
                if value is not _INVALID:
                    params[key] = value
        on_unwrappable = self.attempt(self.choice, pairs["on_unwrappable"][1], "on_unwrappable") \
            if "on_unwrappable" in pairs else "allow"
        mechanism = self.attempt(self.string, pairs["mechanism"][1], "mechanism") \
            if "mechanism" in pairs else None
        if len(self.errors) > before:
            raise _Reported
        try:
            spec = wrapper_spec(wrapper, params, self.directory)
        except ValueError as e:
            text = str(e)
            at = wrapper_node
            if "params" in pairs and not text.startswith("unknown wrapper") \
                    and "cannot read" not in text:
                at = pairs["params"][1]
                for key, value_node in value_nodes.items():     # the value the message names
                    if f" {key} must" in text:
                        at = value_node
            raise self.error(at, text) from None
        for key, value in params.items():
            if isinstance(value, (int, float)):
                self.attempt(self.wrapper_limit, wrapper, wrapper not in BUILTIN_WRAPPERS, key,
                             value, value_nodes[key])
        resolved = None
        if mechanism is not _INVALID:
            try:
                resolved = mechanism_for(spec.name if wrapper in BUILTIN_WRAPPERS else
                                         "a .cu policy", mechanism, spec.params)
            except ValueError as e:  # only a mechanism that was given can be refused
                self.report(pairs["mechanism"][1], str(e))
        if len(self.errors) > before:
            raise _Reported
        return WrapRequest(spec.name, spec.params, on_unwrappable, resolved, spec.source)

    def wrapper_limit(self, wrapper: str, custom: bool, key: str, value, node) -> None:
        """A parameter within what the shim and the device code can hold."""
        if (wrapper, key) in _WRAPPER_LIMITS:
            lowest_text, lowest, highest, why = _WRAPPER_LIMITS[(wrapper, key)]
            if value < lowest:
                raise self.error(node, f"wrapper {wrapper}: {key} must be at least {lowest_text} "
                                       f"({why}), got {node.value}")
            if value > highest:
                raise self.error(node, f"wrapper {wrapper}: {key} must be at most {highest} "
                                       f"({why}), got {node.value}")
        elif custom and isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise self.error(node, f"wrapper {wrapper}: parameter {key} must be between "
                                   f"{_INT64_MIN} and {_INT64_MAX} (the device code gets it as "
                                   f"a C integer constant), got {value}")

    def hook(self, node) -> HookRef:
        """`hook: FILE.py:FUNCTION`, FILE relative to the policy's directory."""
        text = self.string(node, "hook")
        if ":" not in text:
            raise self.error(node, f"hook '{text}' must be {_HOOK_FORM} (no ':' before a "
                                   "function name)")
        written, _, function = text.rpartition(":")
        if not written:
            raise self.error(node, f"hook '{text}' has no file before the ':' (expected "
                                   f"{_HOOK_FORM})")
        if not function:
            raise self.error(node, f"hook '{text}' has no function after the ':' (expected "
                                   f"{_HOOK_FORM})")
        if not function.isidentifier():
            raise self.error(node, f"hook function '{function}' is not a Python identifier "
                                   f"(expected {_HOOK_FORM})")
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


def _at(path: str, mark, message: str) -> PolicyError:
    return PolicyError(path, mark.line + 1, mark.column + 1, message)


def _anchor(anchors: dict, event, node) -> None:
    if event.anchor in anchors:
        from yaml.composer import ComposerError
        raise ComposerError(f"found duplicate anchor {event.anchor!r}; first occurrence",
                            anchors[event.anchor].start_mark, "second occurrence",
                            event.start_mark)
    anchors[event.anchor] = node


def _compose(yaml, events, path: str):
    """The one document of a YAML event stream as the node graph yaml.compose makes of it, or
    None for an empty stream. Built without recursion, it refuses a document nested deeper
    than MAX_DEPTH and aliases that stand for more than MAX_ALIASED_NODES nodes (a YAML alias
    bomb), each at the event that passes the limit; PyYAML's own mistakes (an undefined or
    repeated anchor, a second document) raise its ComposerError, worded as yaml.compose's."""
    from yaml import events as ev
    from yaml.composer import ComposerError
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode
    resolve = yaml.resolver.Resolver().resolve
    next(events)                         # the stream's start
    if type(next(events)) is ev.StreamEndEvent:
        return None
    anchors = {}
    # The nodes each node stands for, written out, by identity: an alias counts what its
    # anchor's node holds without walking it again.
    sizes = {}
    aliased = 0
    # The collections being read, innermost last: [node, its anchor, a mapping's pending key
    # node or None, the nodes it stands for so far].
    stack = []
    open_anchors = set()
    ends = (ev.SequenceEndEvent, ev.MappingEndEvent)
    for event in events:
        kind = type(event)
        if kind is ev.ScalarEvent:
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(ScalarNode, event.value, event.implicit)
            # libyaml calls a plain scalar's style '', PyYAML None.
            node = ScalarNode(tag, event.value, event.start_mark, event.end_mark,
                              style=event.style or None)
            size = 1
            if event.anchor is not None:
                _anchor(anchors, event, node)
                sizes[id(node)] = 1
        elif kind in ends:
            node, anchor, _, size = stack.pop()
            node.end_mark = event.end_mark
            if anchor is not None:
                open_anchors.discard(anchor)
                sizes[id(node)] = size
        elif kind is ev.AliasEvent:
            anchor = event.anchor
            if anchor not in anchors:
                raise ComposerError(None, None, f"found undefined alias {anchor!r}",
                                    event.start_mark)
            if anchor in open_anchors:
                raise _at(path, event.start_mark, f"alias *{anchor} is inside the node it "
                                                  "names: the document would be infinite")
            node = anchors[anchor]
            size = sizes[id(node)]
            aliased += size
            if aliased > MAX_ALIASED_NODES:
                raise _at(path, event.start_mark,
                          f"too much aliasing: with alias *{anchor} ({size} nodes) the "
                          f"document's aliases stand for {aliased} nodes, more than the "
                          f"{MAX_ALIASED_NODES} a policy may expand to")
        elif kind is ev.DocumentEndEvent:
            break
        else:                           # a sequence or a mapping starts
            if len(stack) == MAX_DEPTH:
                raise _at(path, event.start_mark, f"the document nests deeper than "
                                                  f"{MAX_DEPTH} levels here (a policy needs 5)")
            collection = SequenceNode if kind is ev.SequenceStartEvent else MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolve(collection, None, event.implicit)
            node = collection(tag, [], event.start_mark, None, flow_style=event.flow_style)
            if event.anchor is not None:
                _anchor(anchors, event, node)
                open_anchors.add(event.anchor)
            stack.append([node, event.anchor, None, 1])
            continue
        if not stack:
            root = node
            continue
        top = stack[-1]
        top[3] += size
        if type(top[0]) is SequenceNode:
            top[0].value.append(node)
        elif top[2] is None:
            top[2] = node
        else:
            top[0].value.append((top[2], node))
            top[2] = None
    event = next(events)
    if type(event) is not ev.StreamEndEvent:
        raise ComposerError("expected a single document in the stream", root.start_mark,
                            "but found another document", event.start_mark)
    return root


def _document(yaml, text: str, path: str):
    """The policy's YAML document (see _compose).

    libyaml's parser, which PyYAML's wheels carry, reads a policy twenty times faster than
    PyYAML's own. A file it refuses is read again by PyYAML's parser, whose descriptions of
    mistakes are the documented ones, unless it is larger than PYYAML_DESCRIBES_CHARS: then
    libyaml's description stands. PyYAML's parser also reads a file with characters it does
    not accept (its error says which), and every file where libyaml is missing.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        try:
            return _compose(yaml, yaml.parse(text, Loader=fast), path)
        except yaml.YAMLError:
            if len(text) > PYYAML_DESCRIBES_CHARS:
                raise
    return _compose(yaml, yaml.parse(text, Loader=yaml.SafeLoader), path)


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
        root = _document(yaml, text, path)
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

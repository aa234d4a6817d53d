# SPDX-License-Identifier: Apache-2.0
"""Admin policies: the YAML format, its checks, and what a policy decides for each kernel.

A policy is loaded once, by the `clc` command, where every mistake is reported with the file,
line and column of the node at fault. The traced program receives the checked policy as JSON
(Policy.to_json), so this module needs only the standard library; PyYAML is imported inside
the two loading functions.

The engine calls Policy.decide once per kernel. Everything in the resulting Decision that
depends on the launch shape is a list of ranges, so the shim can decide every later launch of
that kernel in C without calling back into Python.

Python hooks decide in two places; the engine calls them:
- hook files given on the command line (`clc-run --hooks FILE`, Policy.hooks) are asked
  first, by the engine, before any rule: each file stands for its @clc.on_launch hooks, in
  order;
- a rule with `action: hook` and `hook: FILE.py:FUNCTION` asks that function for the kernels
  (and launch shapes) its `match` accepts. Policy.decide stops at the first such rule that
  matches (Decision.pending_hook); the engine calls the hook and goes on with Policy.resume.
Only the engine imports hook files; this module checks that they exist and names them.

The keys of a rule's `match` (every key given must hold; a list holds when any item does):
- kernel: globs (fnmatch, case-sensitive) tried on the kernel's base name, demangled name and
  mangled name.
- kernel_regex: a regex (Python's syntax) searched for in the same names. clc runs it in time
  linear in the name's length, so it may not use backreferences, lookarounds, conditional or
  atomic groups, possessive repeats or verbose mode; {m,n} repeats may write out to at most
  2000 states.
- grid_blocks, block_threads, shared_mem: the launch's blocks, threads per block and dynamic
  shared memory: an integer, or a mapping of gt/ge/lt/le/eq to integers (0 to 2**64-1).
- device: device ordinals (0 to 2**31-1).
- process: globs on the program's names (clc.engine.process_names).
- tenant: globs on the tenant name, $CLC_TENANT or `clc-run --tenant`. Whoever starts the
  program chooses it: a label for accounting, not an identity to trust.
- user: globs on the names and numeric ids of the process's real and effective user
  (`user: alice`, `user: 1000`, `user: "svc-*"`).
- group: globs on the names and numeric ids of the process's real, effective and supplementary
  groups: the rule holds when any of them matches.
- cgroup: globs on the process's cgroup v2 path as /proc/self/cgroup gives it (inside a
  cgroup namespace, relative to its root), such as "/system.slice/slurmstepd.scope/*"; `*`
  matches '/' too. On a machine without cgroup v2 it never matches.
user, group and cgroup come from the kernel (the process's credentials, the user and group
databases, /proc/self/cgroup), read once when the program starts (process_identity), never
from its environment.

Loading reports every mistake of a file at once (PolicyError.errors). A policy that loads may
still carry warnings (Policy.warnings): rules that earlier rules leave unreachable, deny rules
that ask to record or time, on_error: allow in a policy that denies.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import fnmatch
import grp
import json
import keyword
import math
import os
import pwd
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name

__all__ = [
    "ANY_RANGE", "PolicyError", "HookFileError", "PolicyWarning", "Identity", "identity_of",
    "process_identity", "identity_of_process", "regex_problem", "KernelInfo", "base_name",
    "Outcome", "Clause", "Decision", "HookRef", "Rule", "Step", "Explanation", "Policy",
    "load_policy", "parse_policy",
]

_U64_MAX = 2**64 - 1
ANY_RANGE = (0, _U64_MAX)
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1
# uid_t and gid_t are 32 bits, and (uid_t)-1 is no one's id.
_ID_MAX = 2**32 - 2

_ACTIONS = ("allow", "deny")  # the verdicts of default and on_error
_RULE_ACTIONS = ("allow", "deny", "hook", "wrap")
_TOP_KEYS = ("version", "default", "on_error", "rules")
_RULE_KEYS = ("name", "match", "action", "hook", "message", "error", "record", "time",
              "wrapper", "params", "on_unwrappable")
_WRAP_KEYS = ("wrapper", "params", "on_unwrappable")
# What a hook rule's hook answers itself, so the rule may not set it.
_HOOK_ANSWERS = ("message", "error", "record", "time")
_HOOK_FORM = "FILE.py:FUNCTION"
_MATCH_KEYS = ("kernel", "kernel_regex", "grid_blocks", "block_threads", "shared_mem", "device",
               "process", "tenant", "user", "group", "cgroup")
_GLOB_KEYS = ("kernel", "process", "tenant", "cgroup")
_ID_KEYS = ("user", "group")
_SHAPE_KEYS = ("grid_blocks", "block_threads", "shared_mem")
_RANGE_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}
# difflib would suggest 'gt' for 'gte'; these spellings have one obvious meaning.
_RANGE_OP_ALIASES = {"gte": "ge", "lte": "le", "min": "ge", "max": "le", ">": "gt", ">=": "ge",
                     "<": "lt", "<=": "le", "==": "eq", "=": "eq"}
_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]
_SUPPORTED_VERSION = 1

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


class PolicyError(Exception):
    """A policy that cannot be used: one line `path:line:column: message` (1-based) per mistake.

    errors lists every mistake found in the file, each a PolicyError, in the order of their
    positions; path, line, column and message are the first one's.
    """

    def __init__(self, path: str, line: int, column: int, message: str,
                 more: Sequence[PolicyError] = ()):
        self.path = path
        self.line = line
        self.column = column
        self.message = message
        self.errors = [self, *more]
        super().__init__("\n".join(f"{e.path}:{e.line}:{e.column}: {e.message}"
                                   for e in self.errors))

    @classmethod
    def collect(cls, errors: Sequence[PolicyError]) -> PolicyError:
        """One PolicyError that reports all of errors (at least one), sorted by position."""
        first, *more = sorted(errors, key=lambda e: (e.line, e.column))
        return cls(first.path, first.line, first.column, first.message, more)


class HookFileError(PolicyError):
    """A hook file given on the command line that cannot be used.

    str() is `FILE: message` with FILE as given: there is no position, so line and column
    are 0. It is a PolicyError, so whatever reports policy errors reports it too.
    """

    def __init__(self, path: str, message: str):
        Exception.__init__(self, f"{path}: {message}")
        self.path = path
        self.line = 0
        self.column = 0
        self.message = message
        self.errors = [self]


@dataclass(frozen=True)
class PolicyWarning:
    """Something in a policy that loads but is probably not what its author meant; str() is
    `path:line:column: warning: message`."""

    path: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}: warning: {self.message}"


# ---- kernels -------------------------------------------------------------------------------

_OPERATOR_RE = re.compile(r"\boperator\b")
_OPERATOR_AT_END_RE = re.compile(r"\boperator$")
# Longest first, so that `operator<<=` is not read as `operator<` followed by `<=`.
_OPERATOR_SYMBOLS = ("<=>", "<<=", ">>=", "->*", "()", "[]", "->", "<<", ">>", "<=", ">=", "<", ">")
_TRAILING_QUALIFIERS = (" const", " volatile", " &&", " &")


def _open_paren_of_last_group(text: str) -> int:
    """Index of the '(' matching the ')' that ends text, or -1."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _strip_parameters(name: str) -> str:
    core = name
    stripping = True
    # Lambdas' operator() carries cv and ref qualifiers after its parameter list.
    while stripping:
        stripping = False
        for qualifier in _TRAILING_QUALIFIERS:
            if core.endswith(qualifier):
                core = core[: -len(qualifier)].rstrip()
                stripping = True
    if not core.endswith(")"):
        return name
    start = _open_paren_of_last_group(core)
    before = core[:start].rstrip()
    # A group that starts the name, or the "()" of `operator()`, is not a parameter list.
    if start <= 0 or _OPERATOR_AT_END_RE.search(before):
        return name
    return before


def _strip_return_type(name: str) -> str:
    operators = {m.start(): m.end() for m in _OPERATOR_RE.finditer(name)}
    depth = 0
    split = -1
    i = 0
    while i < len(name):
        if i in operators:
            # Spaces after a top-level `operator` belong to its name (`operator new`).
            if depth == 0:
                break
            i = operators[i]
            for symbol in _OPERATOR_SYMBOLS:
                if name.startswith(symbol, i):
                    i += len(symbol)
                    break
            continue
        c = name[i]
        if c in "<([{":
            depth += 1
        elif c in ">)]}":
            depth = max(0, depth - 1)
        elif c == " " and depth == 0:
            split = i
        i += 1
    return name[split + 1:]


def base_name(demangled: str) -> str:
    """The demangled name without its parameter list and without a leading return type.

    `void ns::k<4, F<float> >(int, F<float>)` gives `ns::k<4, F<float> >`,
    `vecAdd(float const*, int)` gives `vecAdd`, and a C name is returned unchanged.
    """
    return _strip_return_type(_strip_parameters(demangled.strip()))


@dataclass(frozen=True)
class Identity:
    """Who runs the program, as the kernel knows it: what `user`, `group` and `cgroup` match.

    users and groups hold, for each id, its name (when the user or group database has one)
    and the id in decimal; cgroup is the cgroup v2 path, None where there is none. An empty
    Identity matches no user, group or cgroup condition.
    """

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    cgroup: str | None = None

    def format(self) -> str:
        return (f"user {_quoted(self.users) or '(unknown)'}; groups "
                f"{_quoted(self.groups) or '(unknown)'}; cgroup "
                + (f"'{self.cgroup}'" if self.cgroup is not None else "(none)"))


def _id_names(ids: Iterable[int], lookup) -> tuple[str, ...]:
    forms = []
    for number in dict.fromkeys(ids):
        try:
            forms.append(lookup(number))
        except (KeyError, OverflowError):  # an id with no entry in the database
            pass
        forms.append(str(number))
    return tuple(dict.fromkeys(forms))


def identity_of(uids: Iterable[int], gids: Iterable[int], cgroup: str | None = None) -> Identity:
    """The Identity of these user ids, group ids and cgroup path, with the names the user and
    group databases give them."""
    return Identity(_id_names(uids, lambda uid: pwd.getpwuid(uid).pw_name),
                    _id_names(gids, lambda gid: grp.getgrgid(gid).gr_name), cgroup)


_PROC_CGROUP = "/proc/self/cgroup"


def _cgroup_v2_path(text: str) -> str | None:
    """The path of the unified hierarchy's line, `0::PATH`, of /proc/PID/cgroup."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "" and path.startswith("/"):
            return path
    return None


def process_identity() -> Identity:
    """This process's Identity: its real and effective user ids, its real, effective and
    supplementary group ids, and its cgroup v2 path.

    All of it comes from the kernel (system calls and /proc/self/cgroup) and the user and group
    databases, none from environment variables, which the program's user sets at will.
    """
    try:
        with open(_PROC_CGROUP, encoding="utf-8", errors="replace") as f:
            cgroup = _cgroup_v2_path(f.read())
    except OSError:
        cgroup = None
    return identity_of((os.getuid(), os.geteuid()),
                       (os.getgid(), os.getegid(), *os.getgroups()), cgroup)


def identity_of_process(pid: int, uid: int | None = None, gid: int | None = None) -> Identity:
    """Process `pid`'s Identity, as process_identity() gives a process its own, read from
    /proc/PID (its status's real and effective ids and supplementary groups, its cgroup).
    `uid` and `gid`, when given, are what the kernel said of the process earlier (SO_PEERCRED):
    a /proc/PID whose effective ids differ is another process's (ValueError)."""
    ids = {}
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups"):
                ids[key] = [int(v) for v in value.split()]
    for key, want in (("Uid", uid), ("Gid", gid)):
        if want is not None and want not in ids.get(key, [])[1:2]:
            raise ValueError(f"process {pid} changed: its {key.lower()} is not {want}")
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            cgroup = _cgroup_v2_path(f.read())
    except OSError:
        cgroup = None
    return identity_of(ids.get("Uid", [])[:2], ids.get("Gid", [])[:2] + ids.get("Groups", []),
                       cgroup)


@dataclass(frozen=True)
class KernelInfo:
    """What the policy may look at when a kernel is first seen."""

    mangled: str
    demangled: str
    device: int
    process_names: tuple[str, ...] = ()
    tenant: str = ""
    identity: Identity = Identity()

    # Computed once per kernel: every rule's kernel match reads them.
    @functools.cached_property
    def base(self) -> str:
        return base_name(self.demangled) if self.demangled else ""

    @functools.cached_property
    def name_forms(self) -> tuple[str, ...]:
        """The names a kernel glob or regex is tried on, most readable first."""
        forms = []
        for form in (self.base, self.demangled, self.mangled):
            if form and form not in forms:
                forms.append(form)
        return tuple(forms)

    @property
    def display_name(self) -> str:
        return self.base or self.mangled


# ---- kernel_regex: matched in time linear in the name -------------------------------------
#
# Problem: Python's re backtracks, so a pattern such as '^(a+)+$' takes exponential time on a
# name of many a's, and the engine would hang the program at its first launch.
# Solution: the pattern is parsed here (Python's syntax, less what only backtracking can do:
# backreferences, lookarounds, conditional and atomic groups, possessive repeats) into a
# Thompson NFA that is run over the name one character at a time, every state at once. The
# answer is re.search's; the time is the name's length times the NFA's size, at most.

_MAX_REGEX_STATES = 2000
_RE_IGNORECASE, _RE_MULTILINE, _RE_DOTALL, _RE_ASCII = 1, 2, 4, 8
_RE_FLAG_BITS = {"i": _RE_IGNORECASE, "m": _RE_MULTILINE, "s": _RE_DOTALL, "a": _RE_ASCII,
                 "u": 0}
_RE_ESCAPES = {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}
_RE_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_OCTAL = "01234567"
_ASCII_SPACE = " \t\n\r\f\v"
_RE_LINEAR = ("clc runs kernel_regex in time linear in the name's length, without "
              "backreferences, lookarounds, conditional or atomic groups, possessive repeats "
              "or verbose mode")
# NFA state kinds
_CHAR, _SPLIT, _ASSERT, _MATCH = range(4)


class _RegexUnsupported(ValueError):
    """A pattern Python's re accepts that the linear matcher does not run."""


def _is_word(c: str | None, ascii_only: bool) -> bool:
    if c is None:
        return False
    if ascii_only:
        return c.isascii() and (c.isalnum() or c == "_")
    return c.isalnum() or c == "_"


def _case_variants(c: str, ascii_only: bool) -> tuple[str, ...]:
    if ascii_only:
        return (c.swapcase(),) if c.isascii() and c.isalpha() else ()
    return tuple(v for v in (c.lower(), c.upper(), c.casefold()) if len(v) == 1 and v != c)


class _CharSet:
    """One position of the pattern: a literal, '.', a class, or \\d \\w \\s and their negations."""

    __slots__ = ("ranges", "categories", "negate", "fold", "ascii")

    def __init__(self, ranges, categories, negate, flags):
        self.ranges = tuple(ranges)
        self.categories = tuple(categories)
        self.negate = negate
        self.fold = bool(flags & _RE_IGNORECASE)
        self.ascii = bool(flags & _RE_ASCII)

    def _has(self, c: str) -> bool:
        code = ord(c)
        for lo, hi in self.ranges:
            if lo <= code <= hi:
                return True
        for category in self.categories:
            if category.lower() == "d":
                hit = "0" <= c <= "9" if self.ascii else c.isdecimal()
            elif category.lower() == "s":
                hit = c in _ASCII_SPACE if self.ascii else c.isspace()
            else:
                hit = _is_word(c, self.ascii)
            if hit != category.isupper():
                return True
        return False

    def __call__(self, c: str) -> bool:
        hit = self._has(c) or (self.fold and any(self._has(v) for v in
                                                  _case_variants(c, self.ascii)))
        return hit != self.negate


def _assertion_holds(kind: str, text: str, i: int) -> bool:
    n = len(text)
    prev = text[i - 1] if i else None
    here = text[i] if i < n else None
    if kind in ("bol", "begin"):
        return i == 0
    if kind == "bol_m":
        return i == 0 or prev == "\n"
    if kind == "eol":
        return i == n or (i == n - 1 and here == "\n")
    if kind == "eol_m":
        return i == n or here == "\n"
    if kind == "end":
        return i == n
    ascii_only = kind.endswith("_a")
    boundary = n > 0 and _is_word(prev, ascii_only) != _is_word(here, ascii_only)
    return boundary if kind.startswith("boundary") else n > 0 and not boundary


class _RegexParser:
    """Python's regex syntax into a tree: ("char", _CharSet), ("assert", kind), ("cat", [...]),
    ("alt", [...]), ("repeat", node, min, max or None). The pattern has passed re.compile, so
    only what the linear matcher cannot run is reported here."""

    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0

    def unsupported(self, what: str, at: int):
        raise _RegexUnsupported(f"{what} at offset {at} ({_RE_LINEAR})")

    def peek(self, ahead: int = 0) -> str:
        at = self.i + ahead
        return self.p[at] if at < len(self.p) else ""

    def at(self, chars: str, ahead: int = 0) -> bool:
        c = self.peek(ahead)
        return c != "" and c in chars

    def parse(self):
        flags = 0
        while True:
            # Global flags, (?aimsu), stand only at the start; comments may come between them.
            match = re.match(r"\(\?([aiLmsux]+)\)|\(\?#[^)]*\)", self.p[self.i:])
            if not match:
                break
            for letter in match.group(1) or "":
                flags |= self.flag_bit(letter, self.i)
            self.i += match.end()
        node = self.alternation(flags)
        if self.i != len(self.p):
            self.unsupported("an unmatched ')'", self.i)
        return node

    def flag_bit(self, letter: str, at: int) -> int:
        if letter == "x":
            self.unsupported("verbose mode (?x)", at)
        if letter not in _RE_FLAG_BITS:
            self.unsupported(f"the flag '{letter}'", at)
        return _RE_FLAG_BITS[letter]

    def alternation(self, flags):
        branches = [self.sequence(flags)]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.sequence(flags))
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self, flags):
        items = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            atom = self.atom(flags)
            if atom is not None:
                items.append(self.repeated(atom))
        return ("cat", items)

    def counts(self):
        """The {m}, {m,}, {,n} or {m,n} at self.i as (min, max, end), or None (a literal '{')."""
        match = re.match(r"\{([0-9]*)(?:(,)([0-9]*))?\}", self.p[self.i:])
        if not match or match.group(0) == "{}":
            return None
        low, comma, high = match.groups()
        lo = int(low) if low else 0
        hi = (int(high) if high else None) if comma else lo
        return lo, hi, self.i + match.end()

    def repeated(self, atom):
        start = self.i
        c = self.peek()
        if c == "*":
            lo, hi, end = 0, None, self.i + 1
        elif c == "+":
            lo, hi, end = 1, None, self.i + 1
        elif c == "?":
            lo, hi, end = 0, 1, self.i + 1
        elif c == "{" and self.counts() is not None:
            lo, hi, end = self.counts()
        else:
            return atom
        self.i = end
        if atom[0] == "assert":
            self.unsupported("a repeat of an anchor", start)
        if self.peek() == "?":  # lazy: the same names match
            self.i += 1
        elif self.peek() == "+":
            self.unsupported("a possessive repeat", start)
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self.counts()):
            self.unsupported("a repeat of a repeat", self.i)
        return ("repeat", atom, lo, hi)

    def atom(self, flags):
        c = self.p[self.i]
        if c == "(":
            return self.group(flags)
        if c == "[":
            return self.char_class(flags)
        if c == "\\":
            return self.escape(flags)
        if c in "*+?" or (c == "{" and self.counts() is not None):
            self.unsupported("a repeat with nothing to repeat", self.i)
        self.i += 1
        if c == ".":
            return ("char", _CharSet((), (), True, 0) if flags & _RE_DOTALL else
                    _CharSet(((10, 10),), (), True, 0))
        if c == "^":
            return ("assert", "bol_m" if flags & _RE_MULTILINE else "bol")
        if c == "$":
            return ("assert", "eol_m" if flags & _RE_MULTILINE else "eol")
        return self.literal(ord(c), flags)

    @staticmethod
    def literal(code: int, flags):
        return ("char", _CharSet(((code, code),), (), False, flags))

    def group(self, flags):
        start = self.i
        self.i += 1
        if self.peek() == "?":
            kind = self.peek(1)
            if kind == ":":
                self.i += 2
            elif kind == "P" and self.peek(2) == "<":
                end = self.p.find(">", self.i)
                if end < 0:
                    self.unsupported("an unterminated group name", start)
                self.i = end + 1
            elif kind == "P" and self.peek(2) == "=":
                self.unsupported("a backreference", start)
            elif kind == "#":
                end = self.p.find(")", self.i)
                if end < 0:
                    self.unsupported("an unterminated comment", start)
                self.i = end + 1
                if self.at("*+?{"):  # Python repeats the item before the comment
                    self.unsupported("a repeat after a (?#...) comment", self.i)
                return None
            elif kind in "=!" or (kind == "<" and self.peek(2) in ("=", "!")):
                self.unsupported("a lookahead" if kind in "=!" else "a lookbehind", start)
            elif kind == "(":
                self.unsupported("a conditional group", start)
            elif kind == ">":
                self.unsupported("an atomic group", start)
            else:
                flags = self.scoped_flags(flags, start)
        node = self.alternation(flags)
        if self.peek() != ")":
            self.unsupported("a group without its ')'", start)
        self.i += 1
        return node

    def scoped_flags(self, flags, start):
        """(?flags-flags:...) with self.i at the '?'."""
        match = re.match(r"\?([aiLmsux]*)(?:-([imsx]*))?:", self.p[self.i:])
        if not match:
            self.unsupported("flags set after the start of the pattern", start)
        for letter in match.group(1):
            flags |= self.flag_bit(letter, start)
        for letter in match.group(2) or "":
            flags &= ~self.flag_bit(letter, start)
        self.i += match.end()
        return flags

    def code_escape(self, c: str, start: int, in_class: bool) -> int:
        """The code point of an escape \\c that stands for one character (self.i after c)."""
        if c in _RE_HEX_DIGITS:
            digits = self.p[self.i:self.i + _RE_HEX_DIGITS[c]]
            self.i += len(digits)
            return int(digits, 16)
        if c == "N":
            import unicodedata
            end = self.p.index("}", self.i)
            name = self.p[self.i + 1:end]
            self.i = end + 1
            return ord(unicodedata.lookup(name))
        if c in _RE_ESCAPES:
            return _RE_ESCAPES[c]
        if c == "b" and in_class:
            return 8
        if c in _OCTAL and (in_class or c == "0"):
            digits = c
            while len(digits) < 3 and self.at(_OCTAL):
                digits += self.p[self.i]
                self.i += 1
            return int(digits, 8)
        if c.isdigit():
            if c in _OCTAL and self.at(_OCTAL) and self.at(_OCTAL, 1):
                self.i += 2
                return int(c + self.p[self.i - 2:self.i], 8)
            self.unsupported("a backreference", start)
        if c.isascii() and c.isalpha():
            self.unsupported(f"the escape \\{c}", start)
        return ord(c)

    def escape(self, flags):
        start = self.i
        c = self.peek(1)
        self.i += 2
        if c in "AZbB":
            ascii_suffix = "_a" if flags & _RE_ASCII else "_u"
            return ("assert", {"A": "begin", "Z": "end", "b": "boundary" + ascii_suffix,
                               "B": "nonboundary" + ascii_suffix}[c])
        if c in "dDsSwW":
            return ("char", _CharSet((), (c,), False, flags))
        return self.literal(self.code_escape(c, start, False), flags)

    def class_item(self):
        """One member of a [...] set: a code point, or a category letter (str)."""
        start = self.i
        c = self.p[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        e = self.peek()
        self.i += 1
        if e in "dDsSwW":
            return e
        return self.code_escape(e, start, True)

    def char_class(self, flags):
        start = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges, categories = [], []
        first = True
        while True:
            if self.i >= len(self.p):
                self.unsupported("an unterminated set", start)
            if self.p[self.i] == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_item()
            if self.peek() == "-" and self.peek(1) not in ("", "]"):
                self.i += 1
                hi = self.class_item()
                if isinstance(lo, str) or isinstance(hi, str):
                    self.unsupported("a range with a category", start)
                ranges.append((lo, hi))
            elif isinstance(lo, str):
                categories.append(lo)
            else:
                ranges.append((lo, lo))
        return ("char", _CharSet(ranges, categories, negate, flags))


def _regex_size(node) -> int:
    tag = node[0]
    if tag in ("char", "assert"):
        return 1
    if tag == "cat":
        return sum(_regex_size(child) for child in node[1])
    if tag == "alt":
        return sum(_regex_size(child) for child in node[1]) + len(node[1]) - 1
    _, child, lo, hi = node
    size = _regex_size(child)
    if size == 0:
        return 0
    return size * (hi if hi is not None else max(lo, 1)) + (hi - lo if hi is not None else 1)


class _Regex:
    """A checked kernel_regex, ready to search names (see the section's comment)."""

    def __init__(self, pattern: str):
        tree = _RegexParser(pattern).parse()
        if _regex_size(tree) > _MAX_REGEX_STATES:
            raise _RegexUnsupported(f"more than {_MAX_REGEX_STATES} states once its {{m,n}} "
                                    "repeats are written out (clc runs kernel_regex in time "
                                    "linear in the name's length and the regex's size)")
        self.kinds: list[str] = []
        self.states: list[list] = [[_MATCH, None, None]]
        self.start = self.build(tree, 0)
        self._closures: dict = {}
        self._steps: dict = {}

    def new(self, kind, a, b) -> int:
        self.states.append([kind, a, b])
        return len(self.states) - 1

    def build(self, node, nxt: int) -> int:
        """The first state of node's fragment, whose way out leads to state nxt."""
        tag = node[0]
        if tag == "char":
            return self.new(_CHAR, node[1], nxt)
        if tag == "assert":
            if node[1] not in self.kinds:
                self.kinds.append(node[1])
            return self.new(_ASSERT, self.kinds.index(node[1]), nxt)
        if tag == "cat":
            for child in reversed(node[1]):
                nxt = self.build(child, nxt)
            return nxt
        if tag == "alt":
            starts = [self.build(child, nxt) for child in node[1]]
            first = starts.pop()
            for other in reversed(starts):
                first = self.new(_SPLIT, other, first)
            return first
        _, child, lo, hi = node
        if _regex_size(child) == 0:
            return nxt
        if hi is None:
            loop = self.new(_SPLIT, None, nxt)
            self.states[loop][1] = self.build(child, loop)
            tail = loop
        else:
            tail = nxt
            for _ in range(hi - lo):
                tail = self.new(_SPLIT, self.build(child, tail), nxt)
        for _ in range(lo):
            tail = self.build(child, tail)
        return tail

    def closure(self, reached: frozenset, context: tuple):
        """The character states reached from `reached` and the start without reading, or True
        when the pattern has matched."""
        key = (reached, context)
        hit = self._closures.get(key)
        if hit is not None:
            return hit
        seen = set()
        chars = []
        stack = [self.start, *reached]
        result = None
        while stack:
            index = stack.pop()
            if index in seen:
                continue
            seen.add(index)
            kind, a, b = self.states[index]
            if kind == _MATCH:
                result = True
                break
            if kind == _CHAR:
                chars.append(index)
            elif kind == _SPLIT:
                stack += (b, a)
            elif context[a]:
                stack.append(b)
        if result is None:
            result = frozenset(chars)
        if len(self._closures) > 4096:
            self._closures.clear()
        self._closures[key] = result
        return result

    def step(self, chars: frozenset, c: str) -> frozenset:
        key = (chars, c)
        hit = self._steps.get(key)
        if hit is None:
            states = self.states
            hit = frozenset(states[index][2] for index in chars if states[index][1](c))
            if len(self._steps) > 4096:
                self._steps.clear()
            self._steps[key] = hit
        return hit

    def search(self, text: str) -> bool:
        """Whether re.search would find the pattern in text."""
        reached = frozenset()
        kinds = self.kinds
        for i in range(len(text) + 1):
            context = tuple(_assertion_holds(kind, text, i) for kind in kinds)
            chars = self.closure(reached, context)
            if chars is True:
                return True
            if i == len(text):
                return False
            reached = self.step(chars, text[i])
        return False


def regex_problem(pattern: str) -> str | None:
    """Why clc cannot run `pattern` as a kernel_regex (`invalid regex ...`, `unsupported regex
    ...`, naming it), or None."""
    with warnings.catch_warnings():
        # re's FutureWarnings are about its own later versions; clc's matcher is _Regex.
        warnings.simplefilter("ignore")
        try:
            re.compile(pattern)
        except re.error as e:
            return f"invalid regex '{pattern}' in kernel_regex: {e}"
    try:
        _regex(pattern)
    except _RegexUnsupported as e:
        return f"unsupported regex '{pattern}' in kernel_regex: {e}"
    return None


_regex_cache: dict[str, _Regex] = {}


def _regex(pattern: str) -> _Regex:
    """The matcher of a kernel_regex, built once per pattern; _RegexUnsupported (a ValueError)
    for one that `clc policy check` would have refused."""
    hit = _regex_cache.get(pattern)
    if hit is None:
        hit = _regex_cache[pattern] = _Regex(pattern)
    return hit


# ---- decisions: the Python side of clc_decision ----------------------------------------------

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

    @property
    def label(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{os.path.basename(self.wrapper)}({args})" if args else \
            os.path.basename(self.wrapper)


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


def _quoted(items) -> str:
    return ", ".join(f"'{item}'" for item in items)


def _glob_hit(globs: tuple[str, ...], names: tuple[str, ...]) -> tuple[str, str] | None:
    for pattern in globs:
        for name in names:
            if fnmatch.fnmatchcase(name, pattern):
                return pattern, name
    return None


_NOTHING_TO_MATCH = {"user": "(no user known)", "group": "(no group known)",
                     "cgroup": "(no cgroup v2 path)"}


def _globs_miss(what: str, globs: tuple[str, ...], names: tuple[str, ...]) -> str:
    subject = f"{what} glob '{globs[0]}' does not" if len(globs) == 1 else \
        f"{what} globs {_quoted(globs)} do not"
    nothing = _NOTHING_TO_MATCH.get(what, f"(no {what} name)")
    return f"{subject} match {_quoted(names) if names else nothing}"


# ---- rules and policies ------------------------------------------------------------------------

@dataclass(frozen=True)
class HookRef:
    """A Python hook: a function in a file, or every @clc.on_launch hook of a file.

    path is absolute and resolved (symbolic links and '..' followed); text is the reference as
    the admin wrote it (`../hooks/guard.py:guard` in a rule, `myhooks.py` on the command
    line). function is None for a command-line hook file: the engine asks each of the file's
    @clc.on_launch hooks, in order. line and column: where a rule's `hook:` value is in its
    policy file (0 for a command-line hook file).
    """

    path: str
    function: str | None
    text: str
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)

    @property
    def label(self) -> str:
        """How explanations and reports name the hook: the text, with the function."""
        if self.function is None or self.text.endswith(":" + self.function):
            return self.text
        return f"{self.text}:{self.function}"


def _hook_file_problem(written: str, resolved: str) -> str | None:
    """Why the hook file `written` (found at `resolved`) cannot be used, or None."""
    if not written.endswith(".py"):
        return f"hook file '{written}' must be a Python file ending in .py"
    if not os.path.exists(resolved):
        return f"hook file '{written}' not found (looked for {resolved})"
    if not os.path.isfile(resolved):
        return f"hook file '{written}' is not a file ({resolved})"
    return None


@dataclass(frozen=True)
class Rule:
    """One checked rule. A match field left as None places no condition.

    The shape fields keep the operators as written, ((op, bound), ...) with op one of gt, ge,
    lt, le, eq, so that explanations can quote them; shape_range gives the inclusive range.
    """

    name: str
    kernel: tuple[str, ...] | None = None
    kernel_regex: str | None = None
    grid_blocks: tuple[tuple[str, int], ...] | None = None
    block_threads: tuple[tuple[str, int], ...] | None = None
    shared_mem: tuple[tuple[str, int], ...] | None = None
    device: tuple[int, ...] | None = None
    process: tuple[str, ...] | None = None
    tenant: tuple[str, ...] | None = None
    # Globs on Identity's users and groups (ids written as integers are kept in decimal) and
    # on its cgroup.
    user: tuple[str, ...] | None = None
    group: tuple[str, ...] | None = None
    cgroup: tuple[str, ...] | None = None
    action: str = "allow"
    message: str = ""
    error: int = 0  # CUresult of a deny; 0 for allow
    record: bool = False
    time: bool = False
    hook: HookRef | None = None  # set exactly when action is "hook"
    line: int = 0  # 1-based line of the rule in its policy file
    wrap: WrapRequest | None = None  # set exactly when action is "wrap"

    @property
    def has_shape(self) -> bool:
        return any(getattr(self, key) is not None for key in _SHAPE_KEYS)

    def shape_range(self, key: str) -> tuple[int, int]:
        conditions = getattr(self, key)
        return _bounds(conditions) if conditions is not None else ANY_RANGE

    @property
    def flags(self) -> int:
        if self.time:
            return abi.FLAG_RECORD | abi.FLAG_TIME
        return abi.FLAG_RECORD if self.record else 0

    def outcome(self, index: int) -> Outcome:
        if self.action == "hook":
            raise ValueError(f"rule '{self.name}' has no outcome of its own: its hook answers")
        if self.action == "deny":
            return Outcome(abi.ACTION_DENY, self.flags, self.error, index)
        if self.action == "wrap":
            return Outcome(abi.ACTION_REPLACE, self.flags, 0, index, self.wrap)
        return Outcome(abi.ACTION_ALLOW, self.flags, 0, index)

    def check_static(self, info: KernelInfo) -> tuple[bool, list[str]]:
        """Whether the conditions that do not depend on the launch shape hold, and why."""
        reasons = []
        names = info.name_forms
        if self.kernel is not None:
            hit = _glob_hit(self.kernel, names)
            if hit is None:
                return False, [_globs_miss("kernel", self.kernel, (info.display_name,))]
            reasons.append(f"kernel glob '{hit[0]}' matches '{hit[1]}'")
        if self.kernel_regex is not None:
            regex = _regex(self.kernel_regex)
            found = next((n for n in names if regex.search(n)), None)
            if found is None:
                return False, [f"kernel_regex '{self.kernel_regex}' does not match "
                               f"'{info.display_name}'"]
            reasons.append(f"kernel_regex '{self.kernel_regex}' matches '{found}'")
        if self.device is not None:
            wanted = str(self.device[0]) if len(self.device) == 1 else \
                "[" + ", ".join(map(str, self.device)) + "]"
            inside = info.device in self.device
            verb = ("==" if inside else "!=") if len(self.device) == 1 else \
                ("in" if inside else "not in")
            if not inside:
                return False, [f"device {info.device} {verb} {wanted}"]
            reasons.append(f"device {info.device} {verb} {wanted}")
        identity = info.identity
        for what, globs, candidates in (
                ("process", self.process, tuple(info.process_names)),
                ("tenant", self.tenant, (info.tenant,)),
                ("user", self.user, identity.users),
                ("group", self.group, identity.groups),
                ("cgroup", self.cgroup, () if identity.cgroup is None else (identity.cgroup,))):
            if globs is None:
                continue
            hit = _glob_hit(globs, candidates)
            if hit is None:
                return False, [_globs_miss(what, globs, candidates)]
            reasons.append(f"{what} glob '{hit[0]}' matches '{hit[1]}'")
        return True, reasons

    def check_shape(self, grid_blocks: int, block_threads: int,
                    shared_mem: int) -> tuple[bool, list[str]]:
        """Whether the launch-shape conditions hold, and why."""
        values = {"grid_blocks": grid_blocks, "block_threads": block_threads,
                  "shared_mem": shared_mem}
        reasons = []
        for key in _SHAPE_KEYS:
            for op, bound in getattr(self, key) or ():
                symbol = _RANGE_OPS[op]
                if not _holds(op, values[key], bound):
                    return False, [f"{key} {values[key]} is not {symbol} {bound}"]
                reasons.append(f"{key} {values[key]} {symbol} {bound}")
        return True, reasons


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
        if outcome.action == abi.ACTION_REPLACE and outcome.wrap is not None:
            text = (f"wrap with {outcome.wrap.label} (a kernel that cannot be wrapped: "
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
        lines.append(f"launch: grid {self.grid} = {grid_blocks} blocks, block {self.block} = "
                     f"{block_threads} threads")
        lines.append(f"  dynamic shared memory: {self.shared_mem} bytes")
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


def _verdict_outcome(verdict: str, rule: int) -> Outcome:
    if verdict == "deny":
        return Outcome(abi.ACTION_DENY, 0, _NOT_PERMITTED, rule)
    return Outcome(abi.ACTION_ALLOW, 0, 0, rule)


_TUPLE_FIELDS = ("kernel", "device", "process", "tenant", "user", "group", "cgroup")


def _rule_from_dict(fields: dict) -> Rule:
    fields = dict(fields)
    for key in _TUPLE_FIELDS:
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    for key in _SHAPE_KEYS:
        if fields.get(key) is not None:
            fields[key] = tuple((op, bound) for op, bound in fields[key])
    if fields.get("hook") is not None:
        fields["hook"] = HookRef(**fields["hook"])
    if fields.get("wrap") is not None:
        wrap = fields["wrap"]
        fields["wrap"] = WrapRequest(wrap["wrapper"], tuple(tuple(p) for p in wrap["params"]),
                                     wrap["on_unwrappable"])
    return Rule(**fields)


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

    @property
    def rule_names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def with_cli_hooks(self, paths: Iterable[str | os.PathLike]) -> Policy:
        """A copy with the hook files `paths` (relative to the current directory) appended to
        hooks; a file that cannot be used raises HookFileError (`FILE: hook file not found`).
        """
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

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version, "path": self.path, "default": self.default,
            "on_error": self.on_error,
            "rules": [dataclasses.asdict(rule) for rule in self.rules],
            "hooks": [dataclasses.asdict(ref) for ref in self.hooks],
        }, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        try:
            data = json.loads(text)
            # Captures written before hooks existed have no "hooks".
            policy = cls(data["path"], data["version"], data["default"], data["on_error"],
                         [_rule_from_dict(rule) for rule in data["rules"]],
                         [HookRef(**ref) for ref in data.get("hooks", [])])
        except json.JSONDecodeError as e:
            raise PolicyError("<json>", e.lineno, e.colno, f"invalid policy JSON: {e.msg}") \
                from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PolicyError("<json>", 1, 1, f"invalid policy JSON: {e!r}") from None
        if policy.version != _SUPPORTED_VERSION:
            raise PolicyError("<json>", 1, 1, f"unsupported policy version {policy.version!r}")
        return policy


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


def _glob_problem(pattern: str) -> str | None:
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
    for key in _SHAPE_KEYS:
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
        kind, value = self.kind(node)
        return {"null": "nothing (null)", "bool": f"the boolean {node.value}",
                "int": f"the integer {value}", "float": f"the number {node.value}",
                "str": f"the string '{value}'", "list": "a list",
                "mapping": "a mapping"}[kind]

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
        problem = _glob_problem(pattern)
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
            return (("eq", self.unsigned(node, what, _U64_MAX)),)
        if kind != "mapping":
            raise self.type_error(node, what, "an integer or a mapping of gt/ge/lt/le/eq to "
                                              "integers")
        before = len(self.errors)
        pairs = self.mapping(node, tuple(_RANGE_OPS), f"in {what}", "range operator",
                             _RANGE_OP_ALIASES)
        if not pairs and len(self.errors) == before:
            raise self.error(node, f"{what} needs at least one of: " + ", ".join(_RANGE_OPS))
        bounds = self.settled([self.attempt(self.unsigned, value_node, f"{what} {op}", _U64_MAX)
                               for op, (_, value_node) in pairs.items()])
        if len(self.errors) > before:
            raise _Reported
        conditions = tuple(zip(pairs, bounds))
        lo, hi = _bounds(conditions)
        if lo > hi:
            wanted = " and ".join(f"{_RANGE_OPS[op]} {bound}" for op, bound in conditions)
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
                if kind == "int" and version != _SUPPORTED_VERSION:
                    return self.error(value_node, f"unsupported policy version {version} (this "
                                                  f"clc reads version {_SUPPORTED_VERSION})")
                return None
        return None

    def version(self, node) -> int:
        kind, version = self.kind(node)
        if kind != "int":
            raise self.type_error(node, "version", f"the integer {_SUPPORTED_VERSION}")
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
                              f"'version: {_SUPPORTED_VERSION}')")
        elif "version" in pairs:
            self.attempt(self.version, pairs["version"][1])
        default = self.attempt(self.choice, pairs["default"][1], "default") \
            if "default" in pairs else "allow"
        on_error = self.attempt(self.choice, pairs["on_error"][1], "on_error") \
            if "on_error" in pairs else "allow"
        rules = self.attempt(self.rules, pairs["rules"][1]) if "rules" in pairs else []
        if self.errors:
            raise PolicyError.collect(self.errors)
        if on_error == "allow" and (default == "deny" or any(r.action == "deny" for r in rules)):
            self.warn_on_error(root, pairs.get("on_error"))
        return Policy(self.path, _SUPPORTED_VERSION, default, on_error, rules,
                      warnings=sorted(self.warnings, key=lambda w: (w.line, w.column)))

    def rules(self, node) -> list[Rule]:
        if node.id != "sequence":
            raise self.type_error(node, "rules", "a list of rules")
        rules = []
        first_use = {}
        shape_rules = 0
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
            for earlier in rules:
                if _decides_first(earlier, rule):
                    self.warn(rule_node, f"rule '{rule.name}' is never reached: rule "
                                         f"'{earlier.name}' (line {earlier.line}) comes before "
                                         f"it and decides every launch that '{rule.name}' "
                                         "matches")
                    break
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
        from clc.wrapbuild import BUILTIN_WRAPPERS, wrapper_spec   # stdlib-only, like this module
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
                value = self.attempt(self.number, value_node, f"params.{key}")
                if value is not _INVALID:
                    params[key] = value
        on_unwrappable = self.attempt(self.choice, pairs["on_unwrappable"][1], "on_unwrappable") \
            if "on_unwrappable" in pairs else "allow"
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
            self.attempt(self.wrapper_limit, wrapper, wrapper not in BUILTIN_WRAPPERS, key, value,
                         value_nodes[key])
        if len(self.errors) > before:
            raise _Reported
        return WrapRequest(spec.name, spec.params, on_unwrappable)

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
        return HookRef(resolved, function, text, node.start_mark.line + 1,
                       node.start_mark.column + 1)


def parse_policy(text: str, path: str = "<string>") -> Policy:
    """Check a policy given as YAML text; every problem raises PolicyError."""
    path = os.fsdecode(path)
    try:
        import yaml
    except ImportError:
        raise PolicyError(path, 1, 1, "reading a YAML policy needs PyYAML "
                                      "(pip install pyyaml)") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
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
    except RecursionError:
        raise PolicyError(path, 1, 1, "invalid YAML: nested too deeply") from None
    if root is None:
        raise PolicyError(path, 1, 1, "the policy is empty (it needs at least 'version: "
                                      f"{_SUPPORTED_VERSION}')")
    return _Loader(path).policy(root)


def load_policy(path) -> Policy:
    """Read and check the policy file at path; every problem raises PolicyError."""
    name = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PolicyError(name, 1, 1, f"cannot read the policy: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        column = len(data[line_start:e.start].decode("utf-8", "replace")) + 1
        raise PolicyError(name, data.count(b"\n", 0, e.start) + 1, column,
                          f"the policy is not UTF-8 text (byte 0x{data[e.start]:02x})") from None
    return parse_policy(text, name)

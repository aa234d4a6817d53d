# SPDX-License-Identifier: Apache-2.0
"""kernel_regex: Python's regex syntax, matched in time linear in the name's length.
"""

from __future__ import annotations

import re
import warnings


# ---- kernel_regex: matched in time linear in the name -------------------------------------
#
# Problem: Python's re backtracks, so a pattern such as '^(a+)+$' takes exponential time on a
# name of many a's, and the engine would hang the program at its first launch.
# Solution: the pattern is parsed here (Python's syntax, less what only backtracking can do:
# backreferences, lookarounds, conditional and atomic groups, possessive repeats) into a
# Thompson NFA that is run over the name one character at a time, every state at once. The
# answer is re.search's; the time is the name's length times the NFA's size, at most.

_MAX_REGEX_STATES = 2000
# A longer pattern is refused before it is parsed (re's parser takes seconds over a MiB): the
# 2000 states leave room for 2000 characters, sets or anchors, and sets may be long.
_MAX_REGEX_LENGTH = 10_000
# Groups nested deeper are refused before re.compile sees them: re's parser recurses per level
# and would fail with RecursionError; no kernel name needs more than a few levels.
_MAX_REGEX_NESTING = 100
_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)|\(\?#[^)]*\)")
_COUNTS = re.compile(r"\{([0-9]*)(?:(,)([0-9]*))?\}")
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
            match = _GLOBAL_FLAGS.match(self.p, self.i)
            if not match:
                break
            for letter in match.group(1) or "":
                flags |= self.flag_bit(letter, self.i)
            self.i = match.end()
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
        match = _COUNTS.match(self.p, self.i)
        if not match or match.group(0) == "{}":
            return None
        low, comma, high = match.groups()
        lo = int(low) if low else 0
        hi = (int(high) if high else None) if comma else lo
        return lo, hi, match.end()

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
    if len(pattern) > _MAX_REGEX_LENGTH:
        return (f"unsupported regex '{pattern[:40]}...' in kernel_regex: {len(pattern)} "
                f"characters long (at most {_MAX_REGEX_LENGTH})")
    depth = _nesting(pattern)
    if depth > _MAX_REGEX_NESTING:
        return (f"unsupported regex '{pattern}' in kernel_regex: groups nested {depth} deep "
                f"(at most {_MAX_REGEX_NESTING})")
    with warnings.catch_warnings():
        # re's FutureWarnings are about its own later versions; clc's matcher is _Regex.
        warnings.simplefilter("ignore")
        try:
            re.compile(pattern)
        except re.error as e:
            return f"invalid regex '{pattern}' in kernel_regex: {e}"
        except OverflowError as e:  # a repeat count past re's limit
            return f"invalid regex '{pattern}' in kernel_regex: {e}"
        except ValueError:  # a number of more digits than int() converts
            return (f"invalid regex '{pattern}' in kernel_regex: a number in it has too many "
                    "digits")
    try:
        _regex(pattern)
    except _RegexUnsupported as e:
        return f"unsupported regex '{pattern}' in kernel_regex: {e}"
    return None


def _nesting(pattern: str) -> int:
    """How deep the groups of pattern nest, as re reads it: escapes, sets and comments open
    none."""
    depth = deepest = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":  # a ']' first in a set is itself
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        elif pattern.startswith("(?#", i):
            end = pattern.find(")", i)
            i = n if end < 0 else end
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(depth - 1, 0)
        i += 1
    return deepest


_regex_cache: dict[str, _Regex] = {}


def _regex(pattern: str) -> _Regex:
    """The matcher of a kernel_regex, built once per pattern; _RegexUnsupported (a ValueError)
    for one that `clc policy check` would have refused."""
    hit = _regex_cache.get(pattern)
    if hit is None:
        hit = _regex_cache[pattern] = _Regex(pattern)
    return hit

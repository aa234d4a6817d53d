# SPDX-License-Identifier: Apache-2.0
"""The reader every part of the loader builds on: it walks a composed YAML node tree, so that
every error can name its node's position, and reads YAML's scalars as YAML 1.2 does (the
kinds of values a policy has), mappings of known keys, and single items or lists of them.
"""

from __future__ import annotations

import difflib
import math
import os
import re

from clc.policy.errors import PolicyError, PolicyWarning
from clc.policy.keys import VERDICTS
from clc.policy.rule import HookRef

__all__ = ["MAX_NUMBER_CHARS"]

# The longest number, in characters: 2**64-1 has 20 digits and 0b with 64 binary digits is
# the longest form a bound can take. Python's conversion of decimal text is quadratic in its
# length and refuses more than 4300 digits.
MAX_NUMBER_CHARS = 100

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


_INVALID = object()  # what _Reader.attempt gives for a part whose mistakes it has noted


class _Reported(Exception):
    """A part of the policy whose mistakes are already among the loader's errors."""


class _Reader:
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
        if kind != "str" or value not in VERDICTS:
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

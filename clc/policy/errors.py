# SPDX-License-Identifier: Apache-2.0
"""The errors and warnings a policy can give: every mistake of a file with its position."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clc.policy.rule import HookRef

__all__ = ["PolicyError", "HookFileError", "PolicyWarning"]


class PolicyError(Exception):
    """A policy that cannot be used: one line `path:line:column: message` (1-based) per mistake,
    `path: message` for one of the whole file (line 0: it cannot be read).

    errors lists every mistake found in the file, each a PolicyError, in the order of their
    positions; path, line, column and message are the first one's. hooks holds the references
    of the file's hook rules that were read without a mistake, so that a check can go on to
    import their files (clc policy check reports every error of a file at once).
    """

    hooks: tuple[HookRef, ...] = ()

    def __init__(self, path: str, line: int, column: int, message: str,
                 more: Sequence[PolicyError] = ()):
        self.path = path
        self.line = line
        self.column = column
        self.message = message
        self.errors = [self, *more]
        super().__init__("\n".join(f"{e.path}:{e.line}:{e.column}: {e.message}" if e.line
                                   else f"{e.path}: {e.message}" for e in self.errors))

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

# SPDX-License-Identifier: Apache-2.0
"""Counts in words, for every message and report clc writes: "1 context", "2 contexts"."""

__all__ = ["count"]


def count(n, word, plural=None):
    """n and word, in the plural unless n is 1 (plural: the plural where it is not word + s)."""
    return f"{n} {word if n == 1 else plural or word + 's'}"

# SPDX-License-Identifier: Apache-2.0
"""How a capture's values read in the reports: names made safe for a terminal or a
spreadsheet, cut to a width, numbers in their units, notes wrapped, aligned tables."""

import signal
import textwrap

from clc import abi
from clc.words import count

__all__ = ["NOTE_WIDTH", "size", "ending", "wrap", "shown", "csv_text", "truncate", "us",
           "aligned"]

NOTE_WIDTH = 96


def size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return count(n, "byte")


def ending(cap):
    """How the process left, as its last END record says: "ended by SIGSEGV", "left with
    _exit(3)" (or exit_group), or None (exit(), main's return, or no END record)."""
    if cap.end_how == abi.END_SIGNAL:
        try:
            name = signal.Signals(cap.exit_status).name
        except ValueError:
            name = f"signal {cap.exit_status}"
        return f"ended by {name}"
    if cap.end_how == abi.END_QUICK:
        return f"left with _exit({cap.exit_status})"
    return None


def wrap(text, indent=""):
    return textwrap.fill(text, NOTE_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  ")


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f)}


def shown(text):
    """text for a terminal: control characters (a capture's command, kernel names and
    messages are the program's to choose) as \\xNN escapes, so that none moves the cursor
    or changes the terminal."""
    return text.translate(_CONTROL)


# What a spreadsheet may take as the start of a formula (OWASP's CSV injection list: equals,
# plus, minus, at, tab, carriage return).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text):
    """A capture's text (a kernel's name) for a CSV cell: one that a spreadsheet would run as
    a formula gets a leading quote, as spreadsheet-safe CSV writers do, and control characters
    are \\xNN escapes (as in the summary), so that neither a formula nor a terminal sequence
    reaches whoever opens the file. Kernel names of real programs start with neither."""
    if text.startswith(_FORMULA_STARTS):
        text = "'" + text
    return text.translate(_CONTROL)


def truncate(name, width):
    """name cut to width characters, its middle left out: template instances that differ
    only at their end stay apart. width 0: whole."""
    name = shown(name)
    if not width or len(name) <= width:
        return name
    head = (width - 3) // 2
    return name[:head] + "..." + name[len(name) - (width - 3 - head):]


def us(ns, none="-"):
    return none if ns is None else f"{ns / 1e3:.3f}"


def aligned(headers, rows):
    """A function that formats a row (numbers right-aligned, the last column, a name, left
    as it is) and the rule line under the headers, for `rows` under `headers`."""
    widths = [max(len(h), *(len(t[i]) for t in rows)) for i, h in enumerate(headers)]

    def line(cells):
        nums = [c.rjust(w) for c, w in zip(cells[:-1], widths)]
        return "  ".join(nums + [cells[-1]]).rstrip()

    return line, line(["-" * w for w in widths])


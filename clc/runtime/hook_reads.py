# SPDX-License-Identifier: Apache-2.0
"""What a hook reads of its launch, against how often it is asked (docs/hooks.md).

A hook cached per kernel is asked at the kernel's first launch only: an answer drawn from that
launch's grid, block, shared memory or stream holds for every later launch whatever theirs. A
per_shape hook is asked once per shape: an answer drawn from the arguments or the stream holds
for every later launch of that shape. Both read as if they judged every launch, and do not.
This finds such reads in a hook's source, so that clc can say so before the program runs.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

__all__ = ["stale_reads", "stale_read_warning"]

_SHAPE = ("grid", "block", "shared_mem")  # what per_shape asks again for
_PER_LAUNCH = ("stream", "thread", "params")


def stale_reads(hook) -> list[str]:
    """The launch fields that hook's function reads that change between launches it is not
    asked about, in the order first read; [] for an every_launch hook or a source not found."""
    if hook.every_launch:
        return []
    fields = _PER_LAUNCH if hook.per_shape else _SHAPE + _PER_LAUNCH
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(hook.fn)))
    except (OSError, TypeError, SyntaxError):
        return []
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
        return []
    launch = fn.args.args[0].arg
    read = []
    for node in ast.walk(fn):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == launch and node.attr in fields and node.attr not in read):
            read.append(node.attr)
    return read


def stale_read_warning(hook) -> str | None:
    read = stale_reads(hook)
    if not read:
        return None
    names = ", ".join(f"launch.{f}" for f in read)
    if hook.per_shape:
        how, fix = "once per shape", "every_launch=True"
    else:
        how = "once per kernel"
        fix = "per_shape=True" if all(f in _SHAPE for f in read) else "every_launch=True"
    return (f"warning: hook {hook.name} reads {names} but is asked {how}: its first answer "
            f"holds for every later launch whatever their {', '.join(read)}; declare it with "
            f"{fix} to judge each one (docs/hooks.md)")

# SPDX-License-Identifier: Apache-2.0
"""A checked rule: its match conditions, what it decides, and why it matches a kernel or a
launch or not (the reasons explanations give); the Python hooks rules and the command line name.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field

from clc import abi
from clc.policy.decision import ANY_RANGE, Outcome, WrapRequest, _bounds, _holds
from clc.policy.keys import RANGE_OPS, SHAPE_KEYS
from clc.policy.names import KernelInfo, _quoted
from clc.policy.regex import _regex

__all__ = ["HookRef", "Rule"]


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


def _file_identity(path: str) -> tuple[int, int] | None:
    """The file at path as (device, inode), which every spelling of it shares; None when it
    cannot be looked at."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


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
        return any(getattr(self, key) is not None for key in SHAPE_KEYS)

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
            return self.wrap.outcome(self.flags, index)
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
        for key in SHAPE_KEYS:
            for op, bound in getattr(self, key) or ():
                symbol = RANGE_OPS[op]
                if not _holds(op, values[key], bound):
                    return False, [f"{key} {values[key]} is not {symbol} {bound}"]
                reasons.append(f"{key} {values[key]} {symbol} {bound}")
        return True, reasons

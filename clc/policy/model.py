# SPDX-License-Identifier: Apache-2.0
"""What a policy is and decides: its rules, the Decision for a kernel (launch-shape clauses the
shim evaluates in C), the explanation of a decision, and the errors a policy can give.
Standard library only: the traced program receives the checked policy as JSON.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name
from clc.policy.names import Identity, KernelInfo, _quoted
from clc.policy.regex import _regex

_U64_MAX = 2**64 - 1
ANY_RANGE = (0, _U64_MAX)
_SHAPE_KEYS = ("grid_blocks", "block_threads", "shared_mem")
_RANGE_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}
_NOT_PERMITTED = CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"]
_SUPPORTED_VERSION = 1


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
    mechanism: str = "splice"  # sm_share: "green" (an SM partition) or "splice"
    # A .cu policy's text, read once when the policy was loaded: the program's wraps build from
    # it, never from the file again (which may have changed since).
    source: str | None = None

    @property
    def label(self) -> str:
        args = ", ".join(f"{k}={v}" for k, v in self.params)
        text = f"{os.path.basename(self.wrapper)}({args})" if args else \
            os.path.basename(self.wrapper)
        if self.program_wide:
            return text + " by green context, the whole process as its primary context"
        return text + " by green context" if self.mechanism == "green" else text

    @property
    def confines(self) -> bool:
        return self.mechanism == "green"

    @property
    def program_wide(self) -> bool:
        """sm_share with scope: program: the process's primary contexts are the partition's."""
        return self.confines and dict(self.params).get("scope") == "program"

    def outcome(self, flags: int, rule: int) -> Outcome:
        """The clc_outcome of a kernel this wraps: confined in the shim (a green context, no
        build), or replaced by the kernel the engine builds."""
        if not self.confines:
            return Outcome(abi.ACTION_REPLACE, flags, 0, rule, self)
        params = dict(self.params)
        if "share" in params:
            kind, value = abi.CAP_SHARE, round(params["share"] * 1_000_000)
        else:
            kind, value = abi.CAP_SMS, int(params["sms"])
        return Outcome(abi.ACTION_CONFINE, flags, 0, rule, self,
                       abi.confine_word(kind, value, last=params.get("place") == "last",
                                        deny=self.on_unwrappable == "deny"))


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
        if outcome.action in (abi.ACTION_REPLACE, abi.ACTION_CONFINE) and outcome.wrap is not None:
            text = (f"wrap with {outcome.wrap.label} (a kernel that cannot be "
                    f"{'confined' if outcome.wrap.confines else 'wrapped'}: "
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


_RULE_FIELDS = frozenset(f.name for f in dataclasses.fields(Rule))


def _rule_from_dict(fields: dict) -> Rule:
    """A rule of to_json's: every field of Rule, none missing (no older layout is read)."""
    missing = _RULE_FIELDS - set(fields)
    if missing:
        raise KeyError(f"a rule without {', '.join(sorted(missing))}")
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
                                     wrap["on_unwrappable"], wrap["mechanism"], wrap["source"])
    return Rule(**fields)


LATENCY_CRITICAL = "latency-critical"
BEST_EFFORT = "best-effort"
PRIORITY_CLASSES = (LATENCY_CRITICAL, BEST_EFFORT)
DEFAULT_BOARD = "/dev/shm/clc-board"
_CLASS_MATCH_FIELDS = ("process", "tenant", "user", "group", "cgroup")


@dataclass(frozen=True)
class PriorityClass:
    """A class of processes under `priority:`: the first class whose match holds for a process
    is its class. floor and run_ahead are a best-effort class's."""

    name: str
    kind: str  # LATENCY_CRITICAL or BEST_EFFORT
    floor: float = 0.1  # the share of time a best-effort process is never held
    run_ahead: int = 32  # launches it may queue per context while latency-critical work runs
    line: int = 0
    # 0: a held launch waits; else it runs on this share of the SMs, the device's last ones
    held_share: float = 0.0
    process: tuple[str, ...] | None = None
    tenant: tuple[str, ...] | None = None
    user: tuple[str, ...] | None = None
    group: tuple[str, ...] | None = None
    cgroup: tuple[str, ...] | None = None

    def check(self, info: KernelInfo) -> tuple[bool, list[str]]:
        """Whether the class's match holds for the process of `info`, and why."""
        rule = Rule(self.name, **{key: getattr(self, key) for key in _CLASS_MATCH_FIELDS})
        return rule.check_static(info)

    def describe(self) -> str:
        if self.kind == LATENCY_CRITICAL:
            return f"'{self.name}' ({self.kind})"
        if self.held_share:
            return (f"'{self.name}' ({self.kind}: held to {self.held_share:g} of the SMs, the "
                    "device's last ones, while latency-critical work is busy on its GPU; at "
                    f"most {self.run_ahead} launches queued ahead)")
        return (f"'{self.name}' ({self.kind}: held while latency-critical work is busy on its "
                f"GPU, never for more than {1 - self.floor:.0%} of any 100 ms; at most "
                f"{self.run_ahead} launches queued ahead)")


@dataclass(frozen=True)
class Priority:
    """The policy's `priority:` section: its classes, the board they meet on, and how long a
    latency-critical process that launches nothing and does not synchronize is still busy."""

    classes: tuple[PriorityClass, ...] = ()
    board: str = DEFAULT_BOARD
    idle_after_ms: float = 20.0

    def class_of(self, info: KernelInfo) -> PriorityClass | None:
        return next((c for c in self.classes if c.check(info)[0]), None)

    def explain(self, info: KernelInfo) -> list[str]:
        """What `clc explain` says of the process's class: each class tried, in order."""
        lines = ["priority classes:"]
        found = None
        for number, c in enumerate(self.classes, 1):
            if found is not None:
                lines.append(f"  {number}. {c.name}: not reached")
                continue
            matched, reasons = c.check(info)
            reason = "; ".join(reasons) or "no match conditions: matches every process"
            lines.append(f"  {number}. {c.name}: {'match' if matched else 'no match'}: {reason}")
            if matched:
                found = c
        lines.append("=> class " + found.describe() if found else
                     "=> no class: its launches are neither held nor hold others")
        return lines


def _priority_from_dict(data: dict | None) -> Priority | None:
    if data is None:
        return None
    classes = []
    for c in data["classes"]:
        c = dict(c)
        for key in _CLASS_MATCH_FIELDS:
            if c.get(key) is not None:
                c[key] = tuple(c[key])
        classes.append(PriorityClass(**c))
    return Priority(tuple(classes), data["board"], data["idle_after_ms"])


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
    priority: Priority | None = None  # the `priority:` section
    # Whether the file sets on_error (unset, it is allow): clc-run --strict fails closed where
    # a process of the run has no settings unless the policy itself says allow. Not sent to the
    # program.
    on_error_given: bool = dataclasses.field(default=False, compare=False, repr=False)

    @property
    def rule_names(self) -> list[str]:
        return [rule.name for rule in self.rules]

    def with_cli_hooks(self, paths: Iterable[str | os.PathLike]) -> Policy:
        """A copy with the hook files `paths` (relative to the current directory) appended to
        hooks; a file that cannot be used raises HookFileError (`FILE: hook file not found`).

        A file is one file however it is spelled (a symbolic or hard link, `./`): one given
        again, or already among hooks, is left out, so that its hooks are asked once; one that
        a hook rule names is given that rule's path, so that it is imported once, as one
        module, whose hooks and on_exit functions the engine then knows as the same.
        """
        known = {}  # (st_dev, st_ino) -> the path the policy already uses for that file
        for ref in [rule.hook for rule in self.rules if rule.hook is not None] + self.hooks:
            identity = _file_identity(ref.path)
            if identity is not None:
                known.setdefault(identity, ref.path)
        given = {_file_identity(ref.path) for ref in self.hooks} - {None}
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
            identity = _file_identity(resolved)
            if identity in given:
                continue
            if identity is not None:
                given.add(identity)
                resolved = known.setdefault(identity, resolved)
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

    @property
    def program_wide(self) -> bool:
        """Whether a rule confines whole processes (sm_share with scope: program): the shim then
        asks, when a program retains a device's primary context, whether it is to be the
        partition's."""
        return any(rule.wrap is not None and rule.wrap.program_wide for rule in self.rules)

    def program_scope(self, info: KernelInfo) -> Outcome | None:
        """The outcome of the first scope: program rule whose conditions hold for the process
        and device of `info` (its kernel fields are not looked at), or None."""
        for index, rule in enumerate(self.rules):
            if rule.wrap is not None and rule.wrap.program_wide and rule.check_static(info)[0]:
                return rule.outcome(index)
        return None

    @property
    def confines(self) -> bool:
        """Whether a rule confines kernels by a green context (sm_share): the shim then makes
        the contexts the program creates (cuCtxCreate) green contexts of their own."""
        return any(rule.action == "wrap" and rule.wrap.confines for rule in self.rules)

    @property
    def splices(self) -> bool:
        """Whether a rule wraps kernels by the splice: the engine then builds them, and hears of
        the program's loads (a kernel confined by a green context needs neither)."""
        return any(rule.action == "wrap" and not rule.wrap.confines for rule in self.rules)

    def to_json(self) -> str:
        doc = {
            "version": self.version, "path": self.path, "default": self.default,
            "on_error": self.on_error,
            "rules": [dataclasses.asdict(rule) for rule in self.rules],
            "hooks": [dataclasses.asdict(ref) for ref in self.hooks],
        }
        if self.priority is not None:
            doc["priority"] = dataclasses.asdict(self.priority)
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Policy:
        try:
            data = json.loads(text)
            if isinstance(data, dict) and "version" in data and \
                    data["version"] != _SUPPORTED_VERSION:  # a layout this clc does not read
                raise PolicyError("<json>", 1, 1,
                                  f"unsupported policy version {data['version']!r}")
            policy = cls(data["path"], data["version"], data["default"], data["on_error"],
                         [_rule_from_dict(rule) for rule in data["rules"]],
                         [HookRef(**ref) for ref in data["hooks"]],
                         priority=_priority_from_dict(data.get("priority")))
        except json.JSONDecodeError as e:
            raise PolicyError("<json>", e.lineno, e.colno, f"invalid policy JSON: {e.msg}") \
                from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise PolicyError("<json>", 1, 1, f"invalid policy JSON: {e!r}") from None
        if policy.version != _SUPPORTED_VERSION:
            raise PolicyError("<json>", 1, 1, f"unsupported policy version {policy.version!r}")
        return policy

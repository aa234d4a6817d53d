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
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import json
import keyword
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name

__all__ = [
    "ANY_RANGE", "PolicyError", "HookFileError", "KernelInfo", "base_name", "Outcome", "Clause",
    "Decision", "HookRef", "Rule", "Step", "Explanation", "Policy", "load_policy",
    "parse_policy",
]

_U64_MAX = 2**64 - 1
ANY_RANGE = (0, _U64_MAX)
_INT32_MAX = 2**31 - 1

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
               "process", "tenant")
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
_PREFIXED_INT_RE = re.compile(r"[-+]?0(?:[xX][0-9a-fA-F]+|[bB][01]+)")


class PolicyError(Exception):
    """A policy that cannot be used; str() is `path:line:column: message` (1-based)."""

    def __init__(self, path: str, line: int, column: int, message: str):
        super().__init__(f"{path}:{line}:{column}: {message}")
        self.path = path
        self.line = line
        self.column = column
        self.message = message


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
class KernelInfo:
    """What the policy may look at when a kernel is first seen."""

    mangled: str
    demangled: str
    device: int
    process_names: tuple[str, ...] = ()
    tenant: str = ""

    @property
    def base(self) -> str:
        return base_name(self.demangled) if self.demangled else ""

    @property
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


def _globs_miss(what: str, globs: tuple[str, ...], names: tuple[str, ...]) -> str:
    subject = f"{what} glob '{globs[0]}' does not" if len(globs) == 1 else \
        f"{what} globs {_quoted(globs)} do not"
    return f"{subject} match {_quoted(names) if names else f'(no {what} name)'}"


# ---- rules and policies ------------------------------------------------------------------------

@dataclass(frozen=True)
class HookRef:
    """A Python hook: a function in a file, or every @clc.on_launch hook of a file.

    path is absolute and resolved (symbolic links and '..' followed); text is the reference as
    the admin wrote it (`../hooks/guard.py:guard` in a rule, `myhooks.py` on the command
    line). function is None for a command-line hook file: the engine asks each of the file's
    @clc.on_launch hooks, in order.
    """

    path: str
    function: str | None
    text: str

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
            found = next((n for n in names if re.search(self.kernel_regex, n)), None)
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
        for what, globs, candidates in (("process", self.process, tuple(info.process_names)),
                                        ("tenant", self.tenant, (info.tenant,))):
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


_TUPLE_FIELDS = ("kernel", "device", "process", "tenant")


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
        return _verdict_outcome(self.on_error, abi.RULE_ON_ERROR)

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

def _suggestion(word: str, choices, aliases=None) -> str:
    close = [aliases[word]] if aliases and word in aliases else \
        difflib.get_close_matches(word, choices, n=1)
    if close:
        return f"did you mean '{close[0]}'?"
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


class _Loader:
    """Walks a composed YAML node tree, so that every error can name its node's position."""

    def __init__(self, path: str):
        self.path = path
        # Relative hook files are found next to the policy file.
        self.directory = os.path.dirname(os.path.abspath(path))

    def error(self, node, message: str) -> PolicyError:
        return PolicyError(self.path, node.start_mark.line + 1, node.start_mark.column + 1,
                           message)

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
            return "float", text
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

    def choice(self, node, what: str) -> str:
        kind, value = self.kind(node)
        if kind != "str" or value not in _ACTIONS:
            raise self.error(node, f"{what} must be 'allow' or 'deny', got {self.describe(node)}")
        return value

    # -- composite values

    def mapping(self, node, allowed: tuple[str, ...], where: str, noun: str = "key",
                aliases: dict | None = None) -> dict:
        """{key: (key node, value node)}, refusing unknown and repeated keys."""
        pairs = {}
        for key_node, value_node in node.value:
            if key_node.id != "scalar":
                raise self.error(key_node,
                                 f"expected a {noun} {where}, got {self.describe(key_node)}")
            key = key_node.value
            if key not in allowed:
                raise self.error(key_node, f"unknown {noun} '{key}' {where} "
                                           f"({_suggestion(key, allowed, aliases)})")
            if key in pairs:
                first = pairs[key][0].start_mark.line + 1
                raise self.error(key_node, f"duplicate {noun} '{key}' {where} "
                                           f"(first at line {first})")
            pairs[key] = (key_node, value_node)
        return pairs

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
        patterns = []
        for item in self.items(node, what, "a glob"):
            if self.kind(item)[0] != "str":
                label = what if item is node else f"each item of {what}"
                raise self.type_error(item, label, "a glob (a string)")
            pattern = item.value
            problem = _glob_problem(pattern)
            if problem:
                raise self.error(item, f"invalid glob '{pattern}' in {what}: {problem}")
            patterns.append(pattern)
        return tuple(patterns)

    def regex(self, node, what: str) -> str:
        pattern = self.string(node, what)
        try:
            re.compile(pattern)
        except re.error as e:
            raise self.error(node, f"invalid regex '{pattern}' in {what}: {e}") from None
        return pattern

    def devices(self, node) -> tuple[int, ...]:
        return tuple(self.unsigned(item, "device", _INT32_MAX)
                     for item in self.items(node, "device", "a device ordinal"))

    def shape(self, node, what: str) -> tuple[tuple[str, int], ...]:
        kind, _ = self.kind(node)
        if kind == "int":
            return (("eq", self.unsigned(node, what, _U64_MAX)),)
        if kind != "mapping":
            raise self.type_error(node, what, "an integer or a mapping of gt/ge/lt/le/eq to "
                                              "integers")
        pairs = self.mapping(node, tuple(_RANGE_OPS), f"in {what}", "range operator",
                             _RANGE_OP_ALIASES)
        if not pairs:
            raise self.error(node, f"{what} needs at least one of: " + ", ".join(_RANGE_OPS))
        conditions = tuple((op, self.unsigned(value_node, f"{what} {op}", _U64_MAX))
                           for op, (_, value_node) in pairs.items())
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

    def policy(self, root) -> Policy:
        if root.id != "mapping":
            raise self.error(root, "a policy must be a mapping that starts with 'version: 1', "
                                   f"got {self.describe(root)}")
        pairs = self.mapping(root, _TOP_KEYS, "at the top level")
        if "version" not in pairs:
            raise self.error(root, "missing 'version' (this clc reads policies with "
                                   f"'version: {_SUPPORTED_VERSION}')")
        version_node = pairs["version"][1]
        kind, version = self.kind(version_node)
        if kind != "int":
            raise self.type_error(version_node, "version", f"the integer {_SUPPORTED_VERSION}")
        if version != _SUPPORTED_VERSION:
            raise self.error(version_node, f"unsupported policy version {version} (this clc "
                                           f"reads version {_SUPPORTED_VERSION})")
        default = self.choice(pairs["default"][1], "default") if "default" in pairs else "allow"
        on_error = self.choice(pairs["on_error"][1], "on_error") \
            if "on_error" in pairs else "allow"
        rules = []
        if "rules" in pairs:
            rules_node = pairs["rules"][1]
            if rules_node.id != "sequence":
                raise self.type_error(rules_node, "rules", "a list of rules")
            first_use = {}
            shape_rules = 0
            for index, rule_node in enumerate(rules_node.value):
                rule = self.rule(rule_node, index, first_use)
                if rule.has_shape:
                    shape_rules += 1
                    if shape_rules > abi.MAX_CLAUSES:
                        raise self.error(rule_node, "too many rules with launch-shape conditions "
                                                    "(grid_blocks, block_threads, shared_mem): "
                                                    f"at most {abi.MAX_CLAUSES} are supported")
                rules.append(rule)
        return Policy(self.path, version, default, on_error, rules)

    def rule(self, node, index: int, first_use: dict) -> Rule:
        if node.id != "mapping":
            raise self.type_error(node, f"rule {index + 1}", "a mapping with at least 'action'")
        pairs = self.mapping(node, _RULE_KEYS, f"in rule {index + 1}")
        if "name" in pairs:
            name_node = pairs["name"][1]
            name = self.string(name_node, "name")
            if not name:
                raise self.error(name_node, "a rule name must not be empty")
            if name == "default":
                raise self.error(name_node, "the rule name 'default' is reserved for the "
                                            "policy's default")
        else:
            name_node = node
            name = f"rule-{index + 1}"
        if name in first_use:
            raise self.error(name_node, f"duplicate rule name '{name}' (first used at line "
                                        f"{first_use[name]})")
        first_use[name] = node.start_mark.line + 1

        if "action" not in pairs:
            raise self.error(node, f"rule '{name}' has no 'action' (expected one of: "
                                   + ", ".join(_RULE_ACTIONS) + ")")
        action_node = pairs["action"][1]
        action = self.string(action_node, "action")
        if action not in _RULE_ACTIONS:
            raise self.error(action_node, f"unknown action '{action}' "
                                          f"({_suggestion(action, _RULE_ACTIONS)})")
        hook = None
        if action == "hook":
            if "hook" not in pairs:
                raise self.error(node, f"rule '{name}' has action: hook but no 'hook' (expected "
                                       f"hook: {_HOOK_FORM})")
            # In document order, so that the first offending key is the one reported.
            for key, (key_node, _) in pairs.items():
                if key in _HOOK_ANSWERS:
                    raise self.error(key_node, f"'{key}' is not allowed on a hook rule: its hook "
                                               f"answers it (rule '{name}' has action: hook)")
            hook = self.hook(pairs["hook"][1])
        elif "hook" in pairs:
            raise self.error(pairs["hook"][0], f"'hook' is only allowed on a hook rule (rule "
                                               f"'{name}' has action: {action})")
        if action in ("allow", "wrap"):
            for key in ("message", "error"):
                if key in pairs:
                    raise self.error(pairs[key][0], f"'{key}' is only allowed on a deny rule "
                                                    f"(rule '{name}' has action: {action})")
        wrap = None
        if action == "wrap":
            wrap = self.wrap(node, pairs, name)
        else:
            for key, (key_node, _) in pairs.items():
                if key in _WRAP_KEYS:
                    raise self.error(key_node, f"'{key}' is only allowed on a wrap rule (rule "
                                               f"'{name}' has action: {action})")

        fields = {}
        if "match" in pairs:
            match_node = pairs["match"][1]
            if match_node.id != "mapping":
                raise self.type_error(match_node, "match", "a mapping")
            for key, (_, value_node) in self.mapping(match_node, _MATCH_KEYS, "in match").items():
                if key in ("kernel", "process", "tenant"):
                    fields[key] = self.globs(value_node, key)
                elif key == "kernel_regex":
                    fields[key] = self.regex(value_node, key)
                elif key == "device":
                    fields[key] = self.devices(value_node)
                else:
                    fields[key] = self.shape(value_node, key)
        return Rule(
            name=name, action=action, line=node.start_mark.line + 1,
            message=self.string(pairs["message"][1], "message") if "message" in pairs else "",
            error=(self.error_code(pairs["error"][1]) if "error" in pairs else _NOT_PERMITTED)
            if action == "deny" else 0,
            record=self.boolean(pairs["record"][1], "record") if "record" in pairs else False,
            time=self.boolean(pairs["time"][1], "time") if "time" in pairs else False,
            hook=hook, wrap=wrap, **fields)

    def wrap(self, node, pairs, name) -> WrapRequest:
        """`wrapper:` (a built-in or a .cu path relative to the policy), `params:`, and
        `on_unwrappable:`, checked as the wrap pipeline will use them."""
        from clc.wrapbuild import wrapper_spec   # stdlib-only, like this module
        if "wrapper" not in pairs:
            raise self.error(node, f"rule '{name}' has action: wrap but no 'wrapper' (expected "
                                   "sm_share, block_count, deadline or a .cu file)")
        wrapper_node = pairs["wrapper"][1]
        wrapper = self.string(wrapper_node, "wrapper")
        params = {}
        if "params" in pairs:
            params_node = pairs["params"][1]
            if params_node.id != "mapping":
                raise self.type_error(params_node, "params", "a mapping")
            for key_node, value_node in params_node.value:
                kind, value = self.kind(value_node)
                if kind not in ("int", "float"):
                    raise self.type_error(value_node, f"params.{key_node.value}", "a number")
                params[key_node.value] = float(value) if kind == "float" else value
        on_unwrappable = self.choice(pairs["on_unwrappable"][1], "on_unwrappable") \
            if "on_unwrappable" in pairs else "allow"
        try:
            spec = wrapper_spec(wrapper, params, self.directory)
        except ValueError as e:
            text = str(e)
            at = wrapper_node
            if "params" in pairs and not text.startswith("unknown wrapper") \
                    and "cannot read" not in text:
                at = pairs["params"][1]
                for key_node, value_node in at.value:     # the value the message names
                    if f" {key_node.value} must" in text:
                        at = value_node
            raise self.error(at, text) from None
        return WrapRequest(spec.name, spec.params, on_unwrappable)

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
        return HookRef(resolved, function, text)


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

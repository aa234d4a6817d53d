# SPDX-License-Identifier: Apache-2.0
"""Every key a policy may have: where it may stand, what its value must be, and which rules
(by action) or priority classes may have it.

The tables below are the format's one statement of its keys. The loader takes from them the
keys it accepts (and suggests for a misspelled one), the kind of each match condition, and the
ranges it checks; the JSON schema (clc.policy.schema, shipped as
clc/schemas/policy-1.schema.json) is built from them. Each kind of value says how the schema
states it (`schema()`); the loader's readers say the rest: a glob's syntax, a regex's, a
wrapper's parameters, a hook file, which the schema cannot.
Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clc import abi

__all__ = [
    "SUPPORTED_VERSION", "U64_MAX", "INT32_MAX", "ID_MAX", "VERDICTS", "RULE_ACTIONS",
    "RANGE_OPS", "LATENCY_CRITICAL", "BEST_EFFORT", "PRIORITY_CLASSES", "HOOK_FORM",
    "KERNEL", "LAUNCH", "DEVICE", "PROCESS", "Key", "Version", "Words", "Text", "Flag",
    "Pattern", "ErrorCode", "Params", "Mechanism", "Globs", "Ids", "Devices", "Shape", "Number",
    "Mapping", "Rules", "Listing", "MATCH_KEYS", "CLASS_MATCH_KEYS", "PROGRAM_MATCH_KEYS",
    "SHAPE_KEYS", "STATIC_KEYS", "RULE_KEYS", "CLASS_KEYS", "PRIORITY_KEYS", "TOP_KEYS",
    "allowed", "only_on", "keys_of",
]

SUPPORTED_VERSION = 1
U64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
# uid_t and gid_t are 32 bits, and (uid_t)-1 is no one's id.
ID_MAX = 2**32 - 2

VERDICTS = ("allow", "deny")  # default, on_error, on_unwrappable
MPS_MODES = ("off", "join", "start")  # priority.mps
RULE_ACTIONS = ("allow", "deny", "hook", "wrap")
RANGE_OPS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "eq": "=="}
LATENCY_CRITICAL = "latency-critical"
BEST_EFFORT = "best-effort"
PRIORITY_CLASSES = (LATENCY_CRITICAL, BEST_EFFORT)
HOOK_FORM = "FILE.py:FUNCTION"

# What a match condition looks at: the kernel, the launch's shape (decided per launch, in C),
# the device, or the process (its names, tenant, user, group, cgroup). A priority class holds
# for a whole process, so it may match only what the process is; a rule with scope: program
# confines every kernel of a process on a device, so it may match the device too.
KERNEL, LAUNCH, DEVICE, PROCESS = "kernel", "launch", "device", "process"


@dataclass(frozen=True)
class Key:
    """A key of one of the policy's mappings.

    value: its kind (below). required: a policy must give it (the loader says so in its own
    words; a priority class without a match, which the schema refuses, the loader reads as
    matching every process). only: the actions of the rules, or the classes of the priority
    classes, that may have it (empty: all). on: what a match condition looks at (KERNEL,
    LAUNCH, DEVICE or PROCESS).
    """

    value: object
    required: bool = False
    only: tuple[str, ...] = ()
    on: str = ""


# ---- kinds of values, each with its JSON schema ----------------------------------------------

@dataclass(frozen=True)
class Version:
    """The format's version: this one only."""

    number: int

    def schema(self) -> dict:
        return {"const": self.number}


@dataclass(frozen=True)
class Words:
    """One of a few words."""

    words: tuple[str, ...]

    def schema(self) -> dict:
        return {"enum": list(self.words)}


@dataclass(frozen=True)
class Text:
    """A string, of at least min_length characters."""

    min_length: int = 0

    def schema(self) -> dict:
        return {"type": "string", "minLength": self.min_length} if self.min_length else \
            {"type": "string"}


@dataclass(frozen=True)
class Flag:
    """true or false."""

    def schema(self) -> dict:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Pattern:
    """A string of a given form (a hook reference, an absolute path)."""

    pattern: str

    def schema(self) -> dict:
        return {"type": "string", "pattern": self.pattern}


@dataclass(frozen=True)
class ErrorCode:
    """A CUresult by name or number (at most `limit`)."""

    limit: int

    def schema(self) -> dict:
        return {"type": ["string", "integer"]}


@dataclass(frozen=True)
class Params:
    """A wrapper's parameters: which ones, and their ranges, are the wrapper's
    (clc.wrapping.spec)."""

    def schema(self) -> dict:
        return {"type": "object", "additionalProperties": {"type": ["number", "string"]}}


@dataclass(frozen=True)
class Mechanism:
    """How sm_share confines: the words are clc.wrapping.spec's, imported only when asked, as
    the policy package imports clc.wrapping only for a wrap."""

    def schema(self) -> dict:
        from clc.wrapping.spec import MECHANISMS
        return {"enum": list(MECHANISMS)}


def _one_or_more(item: dict) -> dict:
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


@dataclass(frozen=True)
class Globs:
    """Globs, one or a non-empty list (read by the loader's `globs`)."""

    reader = "globs"

    def schema(self) -> dict:
        return _one_or_more({"type": "string", "minLength": 1})


@dataclass(frozen=True)
class Ids:
    """Names, globs or numeric ids (at most `limit`) of users or groups."""

    limit: int
    reader = "ids"

    def schema(self) -> dict:
        return _one_or_more({"type": ["string", "integer"]})


@dataclass(frozen=True)
class Regex:
    """A regex the loader accepts only where it runs in linear time (clc.policy.regex)."""

    reader = "regex"

    def schema(self) -> dict:
        return {"type": "string", "minLength": 1}


@dataclass(frozen=True)
class Devices:
    """Device ordinals, one or a non-empty list, each at most `limit`."""

    limit: int
    reader = "devices"

    def schema(self) -> dict:
        return _one_or_more({"type": "integer", "minimum": 0})


@dataclass(frozen=True)
class Shape:
    """A launch-shape condition: an integer (eq), or a mapping of RANGE_OPS to integers, each
    at most `limit`."""

    limit: int
    reader = "shape"

    def schema(self) -> dict:
        bound = {"type": "integer", "minimum": 0}
        return {"anyOf": [bound, {"type": "object",
                                  "properties": {op: bound for op in RANGE_OPS},
                                  "additionalProperties": False, "minProperties": 1}]}


@dataclass(frozen=True)
class Number:
    """A number from lo to hi; lo_open or hi_open leave that end out."""

    lo: int | float
    hi: int | float
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def holds(self, value) -> bool:
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def words(self) -> tuple[str, str]:
        """Its two ends as errors say them: ("at least 0.001", "at most 1")."""
        return (f"{'more than' if self.lo_open else 'at least'} {self.lo}",
                f"{'less than' if self.hi_open else 'at most'} {self.hi}")

    def schema(self) -> dict:
        return {"type": "integer" if self.integer else "number",
                "exclusiveMinimum" if self.lo_open else "minimum": self.lo,
                "exclusiveMaximum" if self.hi_open else "maximum": self.hi}


@dataclass(frozen=True)
class Mapping:
    """A mapping of the keys of a table and no others."""

    keys: dict[str, Key] = field(hash=False)
    min_keys: int = 0

    def schema(self) -> dict:
        return _object(self.keys, tuple(self.keys), min_keys=self.min_keys)


@dataclass(frozen=True)
class Listing:
    """A list of values of one kind."""

    item: object

    def schema(self) -> dict:
        return {"type": "array", "items": self.item.schema()}


@dataclass(frozen=True)
class Rules:
    """The list of rules: what a rule may hold depends on its action, so the schema has one form
    of rule per action, each with the keys that action allows."""

    keys: dict[str, Key] = field(hash=False)

    def schema(self) -> dict:
        forms = []
        for action in RULE_ACTIONS:
            # The keys of every rule first, those of this action's rules last.
            names = sorted(allowed(self.keys, action),
                           key=lambda name: -len(self.keys[name].only or RULE_ACTIONS))
            forms.append(_object(self.keys, names, {"action": {"const": action}}))
        return {"type": "array", "items": {"anyOf": forms}}


def _object(table: dict[str, Key], names, given: dict | None = None, min_keys: int = 0) -> dict:
    """The schema of a mapping of the keys `names` of `table` and no others; `given` holds the
    schemas of keys that differ from their kind's."""
    out = {"type": "object", "additionalProperties": False}
    required = [name for name in names if table[name].required]
    if required:
        out["required"] = required
    if min_keys:
        out["minProperties"] = min_keys
    given = given or {}
    out["properties"] = {name: given[name] if name in given else table[name].value.schema()
                         for name in names}
    return out


# ---- the tables --------------------------------------------------------------------------------

_GLOBS = Globs()
_IDS = Ids(ID_MAX)
_SHAPE = Shape(U64_MAX)

# A rule's match: every condition given must hold (docs/policies.md, "Match conditions").
MATCH_KEYS = {
    "kernel": Key(_GLOBS, on=KERNEL),
    "kernel_regex": Key(Regex(), on=KERNEL),
    "grid_blocks": Key(_SHAPE, on=LAUNCH),
    "block_threads": Key(_SHAPE, on=LAUNCH),
    "shared_mem": Key(_SHAPE, on=LAUNCH),
    "device": Key(Devices(INT32_MAX), on=DEVICE),
    "process": Key(_GLOBS, on=PROCESS),
    "tenant": Key(_GLOBS, on=PROCESS),
    "user": Key(_IDS, on=PROCESS),
    "group": Key(_IDS, on=PROCESS),
    "cgroup": Key(_GLOBS, on=PROCESS),
}
SHAPE_KEYS = tuple(name for name, key in MATCH_KEYS.items() if key.on == LAUNCH)
# The conditions decided once per kernel, from what the shim tells of its first sight.
STATIC_KEYS = tuple(name for name, key in MATCH_KEYS.items() if key.on != LAUNCH)
# What a priority class may match: what a process is.
CLASS_MATCH_KEYS = {name: key for name, key in MATCH_KEYS.items() if key.on == PROCESS}
# What a rule with scope: program may match: what a process is, and the device.
PROGRAM_MATCH_KEYS = tuple(name for name, key in MATCH_KEYS.items()
                           if key.on in (PROCESS, DEVICE))

_VERDICT = Words(VERDICTS)

# A rule (docs/policies.md, "Rules"): `only` names the actions of the rules that may have
# the key.
RULE_KEYS = {
    "name": Key(Text(min_length=1)),
    "match": Key(Mapping(MATCH_KEYS)),
    "action": Key(Words(RULE_ACTIONS), required=True),
    "hook": Key(Pattern(r"^.+\.py:[A-Za-z_][A-Za-z0-9_]*$"), required=True, only=("hook",)),
    "message": Key(Text(), only=("deny",)),
    "error": Key(ErrorCode(INT32_MAX), only=("deny",)),
    "record": Key(Flag(), only=("allow", "deny", "wrap")),
    "time": Key(Flag(), only=("allow", "deny", "wrap")),
    "wrapper": Key(Text(min_length=1), required=True, only=("wrap",)),
    "params": Key(Params(), only=("wrap",)),
    "on_unwrappable": Key(_VERDICT, only=("wrap",)),
    "mechanism": Key(Mechanism(), only=("wrap",)),
}

# A priority class (docs/priority.md): `only` names the classes that may have the key.
CLASS_KEYS = {
    "name": Key(Text(min_length=1), required=True),
    "class": Key(Words(PRIORITY_CLASSES), required=True),
    "match": Key(Mapping(CLASS_MATCH_KEYS, min_keys=1), required=True),
    # Without a floor a held process could starve.
    "floor": Key(Number(abi.PRIORITY_FLOOR_MIN, abi.PRIORITY_FLOOR_MAX), only=(BEST_EFFORT,)),
    "run_ahead": Key(Number(abi.PRIORITY_RUN_AHEAD_MIN, abi.PRIORITY_RUN_AHEAD_MAX, integer=True),
                     only=(BEST_EFFORT,)),
    # 0: a held launch waits; else it runs on this share of the SMs.
    "held_share": Key(Number(0, 1, hi_open=True), only=(BEST_EFFORT,)),
    # 0: none; else the share of the SMs left free for latency-critical work while it lives on
    # the GPU: the class's launches run on the rest, the device's last SMs.
    "reserve": Key(Number(0, 1, hi_open=True), only=(BEST_EFFORT,)),
    # the p99 of the class's busy periods at most this many times their p99 while best-effort
    # work is held: best-effort launches beside it get less than their class's bounds while
    # it is not kept
    "slo": Key(Number(1, abi.PRIORITY_SLO_MAX, lo_open=True), only=(LATENCY_CRITICAL,)),
}

PRIORITY_KEYS = {
    "classes": Key(Listing(Mapping(CLASS_KEYS)), required=True),
    "board": Key(Pattern("^/")),
    "idle_after_ms": Key(Number(0, abi.PRIORITY_IDLE_MS_MAX, lo_open=True)),
    # off: as the machine is; join: this user's MPS control daemon where one answers; start:
    # joined, or started for this user when none answers (clc/runtime/mps.py)
    "mps": Key(Words(MPS_MODES)),
}

TOP_KEYS = {
    "version": Key(Version(SUPPORTED_VERSION), required=True),
    "default": Key(_VERDICT),
    "on_error": Key(_VERDICT),
    "rules": Key(Rules(RULE_KEYS)),
    "priority": Key(Mapping(PRIORITY_KEYS)),
}


def allowed(table: dict[str, Key], which: str) -> tuple[str, ...]:
    """The keys of `table` that a rule of action `which` (a class of class `which`) may have."""
    return tuple(name for name, key in table.items() if not key.only or which in key.only)


def only_on(table: dict[str, Key], which: str) -> tuple[str, ...]:
    """The keys of `table` that only a rule of action `which` (a class of class `which`) may
    have, in table order."""
    return tuple(name for name, key in table.items() if key.only == (which,))


def keys_of(table: dict[str, Key], kind: type | tuple[type, ...]) -> tuple[str, ...]:
    """The keys of `table` whose values are of `kind` (or of one of the kinds given)."""
    return tuple(name for name, key in table.items() if isinstance(key.value, kind))

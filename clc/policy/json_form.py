# SPDX-License-Identifier: Apache-2.0
"""The checked policy's JSON form, as the traced program receives it (Policy.to_json and
Policy.from_json): every field of every rule, read back into the same objects."""

from __future__ import annotations

import dataclasses

from clc.policy.decision import WrapRequest
from clc.policy.keys import MATCH_KEYS, SHAPE_KEYS, Devices, Globs, Ids, keys_of
from clc.policy.priority import _CLASS_MATCH_FIELDS, Priority, PriorityClass
from clc.policy.rule import HookRef, Rule

__all__ = ["rule_from_dict", "priority_from_dict"]

# The conditions held as tuples: JSON gives them back as lists.
_TUPLE_FIELDS = keys_of(MATCH_KEYS, (Globs, Ids, Devices))
_RULE_FIELDS = frozenset(f.name for f in dataclasses.fields(Rule))


def rule_from_dict(fields: dict) -> Rule:
    """A rule of to_json's: every field of Rule, none missing (no older layout is read)."""
    missing = _RULE_FIELDS - set(fields)
    if missing:
        raise KeyError(f"a rule without {', '.join(sorted(missing))}")
    fields = dict(fields)
    for key in _TUPLE_FIELDS:
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    for key in SHAPE_KEYS:
        if fields.get(key) is not None:
            fields[key] = tuple((op, bound) for op, bound in fields[key])
    if fields.get("hook") is not None:
        fields["hook"] = HookRef(**fields["hook"])
    if fields.get("wrap") is not None:
        wrap = fields["wrap"]
        fields["wrap"] = WrapRequest(wrap["wrapper"], tuple(tuple(p) for p in wrap["params"]),
                                     wrap["on_unwrappable"], wrap["mechanism"], wrap["source"])
    return Rule(**fields)


def priority_from_dict(data: dict | None) -> Priority | None:
    if data is None:
        return None
    classes = []
    for c in data["classes"]:
        c = dict(c)
        for key in _CLASS_MATCH_FIELDS:
            if c.get(key) is not None:
                c[key] = tuple(c[key])
        classes.append(PriorityClass(**c))
    return Priority(tuple(classes), data["board"], data["idle_after_ms"], data.get("mps", "off"))

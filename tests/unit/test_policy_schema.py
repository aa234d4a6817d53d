# SPDX-License-Identifier: Apache-2.0
"""The policy format stated once: the JSON schema that clc ships is the one the loader's key
tables (clc.policy.keys) build, and the loader and the schema agree on every key of those
tables: where it may stand, and that a value of the wrong kind is refused."""

import json

import jsonschema
import pytest
import yaml
from harness import ROOT

from clc.policy import PolicyError, parse_policy
from clc.policy.keys import (CLASS_KEYS, CLASS_MATCH_KEYS, MATCH_KEYS, PRIORITY_KEYS,
                             RULE_ACTIONS, RULE_KEYS, TOP_KEYS)
from clc.policy.schema import SCHEMA_NAME, policy_schema, schema_text

GUARD = "def guard(launch):\n    return None\n"
# A value of no key's kind.
WRONG = [[[]]]
# A rule of each action with what that action requires.
RULE_OF = {"allow": {"action": "allow"}, "deny": {"action": "deny"},
           "hook": {"action": "hook", "hook": "guard.py:guard"},
           "wrap": {"action": "wrap", "wrapper": "sm_share", "params": {"share": 0.5}}}
# A value each rule key accepts on the rules that may have it.
RULE_VALUES = {"name": "n", "match": {"kernel": "k"}, "hook": "guard.py:guard",
               "message": "m", "error": "CUDA_ERROR_INVALID_VALUE", "record": True,
               "time": True, "wrapper": "sm_share", "params": {"share": 0.5},
               "on_unwrappable": "deny", "mechanism": "green"}


def render(mapping: dict, indent: int = 0) -> list[str]:
    """A mapping as block-style YAML lines: mappings nested in block style, lists of mappings
    as block sequences, every other value as JSON (which YAML reads as flow style)."""
    lines = []
    for key, value in mapping.items():
        pad = " " * indent
        if isinstance(value, dict):
            lines += [f"{pad}{key}:"] + render(value, indent + 2)
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{pad}{key}:")
            for item in value:
                item_lines = render(item, indent + 4)
                item_lines[0] = f"{pad}  - {item_lines[0].lstrip()}"
                lines += item_lines
        else:
            lines.append(f"{pad}{key}: {json.dumps(value)}")
    return lines


def places():
    """(table, key, a valid policy, the mapping of it where the key stands) for every key of
    every table."""
    for key in TOP_KEYS:
        doc = {"version": 1}
        yield "top level", key, doc, doc
    for key, spec in RULE_KEYS.items():
        rule = dict(RULE_OF[next(a for a in RULE_ACTIONS if not spec.only or a in spec.only)])
        yield "rule", key, {"version": 1, "rules": [rule]}, rule
    for key in MATCH_KEYS:
        match = {"kernel": "k"}
        yield "match", key, {"version": 1, "rules": [{"action": "allow", "match": match}]}, match
    for table, keys in (("priority", PRIORITY_KEYS), ("class", CLASS_KEYS),
                        ("class match", CLASS_MATCH_KEYS)):
        for key in keys:
            match = {"user": "x"}
            one = {"name": "a", "class": "best-effort", "match": match}
            priority = {"classes": [one]}
            where = {"priority": priority, "class": one, "class match": match}[table]
            yield table, key, {"version": 1, "priority": priority}, where


def errors(text: str, directory) -> list[PolicyError]:
    path = directory / "p.yaml"
    path.write_text(text)
    try:
        parse_policy(text, str(path))
    except PolicyError as e:
        return e.errors
    return []


def schema_errors(text: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(policy_schema())
    return [e.message for e in validator.iter_errors(yaml.safe_load(text))]


def test_the_shipped_schema_is_the_one_the_key_tables_build():
    # GIVEN the schema the package ships
    shipped = (ROOT / "clc" / "schemas" / SCHEMA_NAME).read_text()
    # THEN it is, byte for byte, what the key tables build, and a valid JSON Schema
    assert shipped == schema_text(), "the key tables changed: run `make schemas`"
    jsonschema.Draft202012Validator.check_schema(json.loads(shipped))


PLACES = list(places())


@pytest.mark.parametrize("table,key,doc,where", PLACES,
                         ids=[f"{table}:{key}" for table, key, _, _ in PLACES])
def test_a_wrong_value_of_each_key_is_refused_by_the_loader_and_the_schema(table, key, doc,
                                                                           where, tmp_path):
    # GIVEN a policy that both take (its hook file beside it)
    (tmp_path / "guard.py").write_text(GUARD)
    text = "\n".join(render(doc)) + "\n"
    assert errors(text, tmp_path) == [] and schema_errors(text) == []
    # WHEN the key is given a value of no key's kind, on its own line
    where.pop(key, None)
    where[key] = WRONG
    text = "\n".join(render(doc)) + "\n"
    line = next(n for n, t in enumerate(text.splitlines(), 1) if t.endswith(f"{key}: [[[]]]"))
    # THEN the loader says so at that line, and the schema refuses the policy
    found = errors(text, tmp_path)
    assert line in [e.line for e in found], (text, [str(e) for e in found])
    assert schema_errors(text), text


@pytest.mark.parametrize("key", [key for key in RULE_KEYS if key != "action"])
def test_each_rule_key_is_allowed_on_the_same_actions_by_the_loader_and_the_schema(key,
                                                                                   tmp_path):
    # GIVEN a rule of each action, and a valid value of the key
    (tmp_path / "guard.py").write_text(GUARD)
    for action in RULE_ACTIONS:
        rule = {**RULE_OF[action], key: RULE_VALUES[key]}
        text = "\n".join(render({"version": 1, "rules": [rule]})) + "\n"
        # WHEN each is given the key
        loader_takes = errors(text, tmp_path) == []
        schema_takes = schema_errors(text) == []
        # THEN the loader takes it exactly where its table says, and so does the schema
        allowed = not RULE_KEYS[key].only or action in RULE_KEYS[key].only
        assert (loader_takes, schema_takes) == (allowed, allowed), (action, text)

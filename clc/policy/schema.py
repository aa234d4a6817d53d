# SPDX-License-Identifier: Apache-2.0
"""The policy format as a JSON Schema, built from the loader's key tables (clc.policy.keys).

The package ships it as clc/schemas/policy-1.schema.json, for editors that check YAML as it
is typed. That file is this module's output, written by `make schemas` (`python -m
clc.policy.schema` prints it); tests/unit/test_policy_schema.py fails when the two differ.
"""

from __future__ import annotations

import json

from clc.policy.keys import SUPPORTED_VERSION, TOP_KEYS, Mapping

__all__ = ["SCHEMA_NAME", "policy_schema", "schema_text"]

SCHEMA_NAME = f"policy-{SUPPORTED_VERSION}.schema.json"

_ABOUT = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://clc.invalid/schemas/{SCHEMA_NAME}",
    "title": f"clc policy, version {SUPPORTED_VERSION}",
    "description": (
        "The structure of a policy file (docs/policies.md): keys, their types and ranges. `clc "
        "policy check` checks more than a schema can (a glob's syntax, a regular expression, a "
        "wrapper's parameters, a hook file, rules that can never match); an editor with this "
        f"schema catches the rest as you type. Within version {SUPPORTED_VERSION} keys may be "
        "added, never removed or changed in meaning."),
}


def policy_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a policy document of this version."""
    return {**_ABOUT, **Mapping(TOP_KEYS).schema()}


def schema_text() -> str:
    """The schema as the package ships it."""
    return json.dumps(policy_schema(), indent=1) + "\n"


if __name__ == "__main__":
    print(schema_text(), end="")

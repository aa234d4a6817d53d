# SPDX-License-Identifier: Apache-2.0
"""The JSON outputs and the policy format against their schemas (clc/schemas), with the
jsonschema library: real outputs validate, and an output that disagrees with its schema (a
field added, removed or of another type) does not."""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from harness import DENY_DEBUG, ROOT, TIME_ALL, clc_command, env_for

from clc.policy.model import PolicyError
from clc.policy.loader import load_policy

SCHEMAS = ROOT / "clc" / "schemas"


def validator(name):
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def valid(name, doc):
    errors = sorted(validator(name).iter_errors(doc), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def invalid(name, doc):
    assert not validator(name).is_valid(doc)


def clc(*args):
    p = subprocess.run([sys.executable, "-m", "clc", *map(str, args)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def runs(native, tmp_path_factory):
    d = tmp_path_factory.mktemp("schemas")
    out = {}
    for name, policy, prog in (("timed", TIME_ALL, "prog_cudart"),
                               ("denied", DENY_DEBUG, "prog_linked")):
        (d / f"{name}.yaml").write_text(policy)
        out[name] = d / f"{name}.clc"
        p = subprocess.run(clc_command() + ["--policy", str(d / f"{name}.yaml"), "--tenant", "t",
                                            "--label", "job=1", "-o", str(out[name]),
                                            "--no-report", "--", str(native[prog])],
                           env=env_for(native), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    return out


def test_the_report_json_of_real_captures(runs):
    doc = clc("report", runs["timed"], runs["denied"], "--format", "json")
    valid("report-1", doc)
    assert doc["launches"] and doc["modules"] and doc["messages"]
    assert doc["captures"][0]["run"] == {"tenant": "t", "uid": doc["captures"][0]["run"]["uid"],
                                         "labels": {"job": "1"}}
    # an output that disagrees with the schema is caught
    for change in (lambda d: d["kernels"][0].update(extra=1),
                   lambda d: d["kernels"][0].pop("launches"),
                   lambda d: d["launches"][0].update(grid="8,1,1"),
                   lambda d: d.update(version=2)):
        bad = copy.deepcopy(doc)
        change(bad)
        invalid("report-1", bad)


def test_a_comparison_json(runs):
    doc = clc("report", runs["denied"], "--baseline", runs["timed"], "--format", "json")
    valid("compare-1", doc)
    bad = copy.deepcopy(doc)
    bad["kernels"][0]["current"]["launches"] = "5"
    invalid("compare-1", bad)


def test_cache_json(tmp_path):
    from clc.wrapping.cache import DiskCache
    DiskCache(str(tmp_path)).put("ab" * 32, b"cubin", {"kernel": "k", "arch": "sm_90"})
    ls = clc("cache", "ls", "--json", "--dir", tmp_path)
    valid("cache-ls-1", ls)
    assert len(ls["entries"]) == 1
    stats = clc("cache", "stats", "--json", "--dir", tmp_path)
    valid("cache-stats-1", stats)
    invalid("cache-stats-1", {**stats, "entries": -1.5})


def policy_documents():
    """Every policy the project ships or shows whole: policies/*.yaml, and the YAML blocks of
    docs/*.md that begin with `version: 1`."""
    out = [(p.name, p.read_text()) for p in sorted((ROOT / "policies").glob("*.yaml"))]
    for md in sorted((ROOT / "docs").glob("*.md")):
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", md.read_text(), re.S)):
            if block.startswith("version: 1"):
                out.append((f"{md.name}#{i}", block))
    return out


@pytest.mark.parametrize("name,text", policy_documents(), ids=lambda v: v if "." in str(v)
                         and "\n" not in str(v) else "")
def test_every_shipped_and_documented_policy_fits_the_schema(name, text, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    try:
        load_policy(path)
    except PolicyError as e:  # a fragment that needs a file beside it (a hook, a .cu)
        if "no such file" not in str(e) and "not found" not in str(e) and \
                "does not exist" not in str(e):
            raise
    valid("policy-1", yaml.safe_load(text))


@pytest.mark.parametrize("text", [
    "version: 1\nrules:\n  - action: deny\n    colour: red\n",
    "version: 1\nrules:\n  - action: block\n",
    "version: 1\ndefault: maybe\n",
    "version: 1\nrules:\n  - action: allow\n    message: no\n",
    "version: 1\nrules:\n  - action: wrap\n",
    "version: 1\nrules:\n  - action: allow\n    match: {grid_blocks: {above: 3}}\n",
    "version: 1\npriority:\n  classes:\n    - {name: a, class: urgent, match: {user: x}}\n",
    "version: 1\npriority:\n  classes:\n    - {name: a, class: best-effort, match: {user: x},"
    " run_ahead: 1000}\n",
    "version: 2\n",
])
def test_policies_the_loader_refuses_the_schema_refuses(text, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError):
        load_policy(path)
    invalid("policy-1", yaml.safe_load(text))


def test_the_schemas_are_installed_with_the_package():
    import clc
    assert (Path(clc.__file__).parent / "schemas" / "policy-1.schema.json").is_file()

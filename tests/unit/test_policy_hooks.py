# SPDX-License-Identifier: Apache-2.0
"""The policy format: Python hooks named by rules, and CUDA error names."""

import json
import math
import os
import pathlib
import re

import pytest

from clc import abi
from clc.cuda_errors import CUDA_ERRORS, error_name
from clc.policy import (
    ANY_RANGE, Clause, Decision, HookFileError, HookRef, Outcome, Policy,
    PolicyError, Rule, load_policy, parse_policy,
)

from harness import CUDA_INCLUDE
from policy_cases import ALLOW, EXAMPLE_HOOK, GUARD, POLICIES, SHAPES, U64_MAX, kernel, policy


# ---- Python hooks ------------------------------------------------------------------------------

HOOKED = """\
    version: 1
    default: deny
    rules:
      - name: small-grids-ok
        match: {grid_blocks: {le: 100}}
        action: allow
      - name: no-debug
        match: {kernel: "*debug*"}
        action: deny
      - name: big-blocks
        match: {block_threads: {gt: 512}}
        action: deny
        error: CUDA_ERROR_INVALID_VALUE
      - name: user-guard
        match: {kernel: "*vecAdd*"}
        action: hook
        hook: guard.py:guard
      - name: record-rest
        action: allow
        record: true
    """

ON_ERROR_ALLOW = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, abi.RULE_ON_ERROR)
RECORD_REST = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 4)


def test_hook_rule_is_loaded(hook_dir):
    # GIVEN a hook rule whose file exists next to the policy
    loaded = policy(HOOKED)
    # THEN it keeps its match, and the hook is resolved with the text kept as written
    assert loaded.rules[3] == Rule(
        name="user-guard", kernel=("*vecAdd*",), action="hook",
        hook=HookRef(os.path.join(hook_dir, "guard.py"), "guard", "guard.py:guard"), line=14)
    assert loaded.rules[3].hook.label == "guard.py:guard"
    assert (loaded.rules[3].error, loaded.rules[3].flags) == (0, 0)
    assert all(rule.hook is None for i, rule in enumerate(loaded.rules) if i != 3)
    assert loaded.hooks == []
    # AND the rule has no outcome of its own
    with pytest.raises(ValueError, match="its hook answers"):
        loaded.rules[3].outcome(3)


@pytest.mark.parametrize("hook, expected", [
    ("hooks/absent.py:guard",
     "p.yaml:4:11: hook file 'hooks/absent.py' not found (looked for {dir}/hooks/absent.py)"),
    ('"absent.py:guard"',
     "p.yaml:4:11: hook file 'absent.py' not found (looked for {dir}/absent.py)"),
    ("pkg.py:guard", "p.yaml:4:11: hook file 'pkg.py' is not a file ({dir}/pkg.py)"),
])
def test_hook_file_errors(hook_dir, hook, expected):
    # GIVEN a hook rule whose file is missing, or is a directory
    os.mkdir("pkg.py")
    # WHEN the policy is parsed
    with pytest.raises(PolicyError) as caught:
        parse_policy(f"version: 1\nrules:\n  - action: hook\n    hook: {hook}\n", "p.yaml")
    # THEN the error points at the hook and names the path it looked at
    assert str(caught.value) == expected.format(dir=hook_dir)


def test_hook_file_is_found_next_to_the_policy(tmp_path, monkeypatch):
    # GIVEN a policy in site/policies naming ../hooks/guard.py, read from another directory
    # that has a hooks/guard.py of its own
    site = tmp_path / "site"
    (site / "policies").mkdir(parents=True)
    (site / "hooks").mkdir()
    (site / "hooks" / "guard.py").write_text(GUARD)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "hooks").mkdir(parents=True)
    (elsewhere / "hooks" / "guard.py").write_text(GUARD)
    monkeypatch.chdir(elsewhere)
    path = site / "policies" / "p.yaml"
    path.write_text("version: 1\nrules:\n  - action: hook\n    hook: ../hooks/guard.py:guard\n")
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN the hook is the one next to the policy, as an absolute path without '..'
    assert loaded.rules[0].hook == HookRef(os.path.realpath(site / "hooks" / "guard.py"),
                                           "guard", "../hooks/guard.py:guard")
    # AND an absolute path is taken as it is
    absolute = os.path.realpath(elsewhere / "hooks" / "guard.py")
    path.write_text(f"version: 1\nrules:\n  - action: hook\n    hook: {absolute}:check\n")
    assert load_policy(path).rules[0].hook == HookRef(absolute, "check", f"{absolute}:check")
    # AND a policy given as text, with no file, finds its hooks in the current directory
    loaded = parse_policy("version: 1\nrules:\n  - action: hook\n    hook: hooks/guard.py:g\n")
    assert loaded.rules[0].hook.path == absolute


def test_hook_file_missing_next_to_the_policy(tmp_path, monkeypatch):
    # GIVEN a policy in a subdirectory whose hook exists only in the current directory
    (tmp_path / "guard.py").write_text(GUARD)
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "sub" / "p.yaml"
    path.write_text("version: 1\nrules:\n  - name: g\n    action: hook\n    hook: guard.py:g\n")
    # WHEN it is loaded
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    # THEN the hook is looked for next to the policy, not in the current directory
    where = os.path.realpath(tmp_path / "sub")
    assert str(caught.value) == (f"{path}:5:11: hook file 'guard.py' not found (looked for "
                                 f"{where}/guard.py)")


def test_decide_stops_at_a_matching_hook_rule(hook_dir):
    # GIVEN shape rules before a hook rule for vecAdd, and a hook file on the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py"])
    # WHEN vecAdd is decided
    decision = loaded.decide(kernel())
    # THEN the shape clauses before the hook rule stand, the hook rule is pending, and the
    # fallback is on_error until the hook answers
    small = Clause((0, 100), ANY_RANGE, ANY_RANGE, Outcome(abi.ACTION_ALLOW, 0, 0, 0))
    big = Clause(ANY_RANGE, (513, U64_MAX), ANY_RANGE,
                 Outcome(abi.ACTION_DENY, 0, CUDA_ERRORS["CUDA_ERROR_INVALID_VALUE"], 2))
    assert decision == Decision([small, big], ON_ERROR_ALLOW, 3)
    # AND kernels the hook rule does not match are decided without it
    assert loaded.decide(kernel("matmul(float*)", "_Z6matmulPf")) == \
        Decision([small, big], RECORD_REST)
    assert loaded.decide(kernel("debug_dump(float*)", "_Z10debug_dumpPf")) == \
        Decision([small], Outcome(abi.ACTION_DENY, 0, 800, 1))
    # AND a rule that decides before the hook rule keeps it from being asked
    assert policy("""\
        version: 1
        rules:
          - action: deny
          - action: hook
            hook: guard.py:guard
        """).decide(kernel()) == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))


def test_resume_after_the_hook(hook_dir):
    # GIVEN vecAdd's decision waiting for its hook
    loaded = policy(HOOKED)
    pending = loaded.decide(kernel())
    # WHEN the hook returns None
    # THEN the rules after the hook rule decide, after the same clauses
    assert loaded.resume(kernel(), pending, None) == Decision(pending.clauses, RECORD_REST)
    # WHEN the hook answers
    denied = Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 999, 3)
    # THEN its answer is the fallback
    assert loaded.resume(kernel(), pending, denied) == Decision(pending.clauses, denied)
    # AND a finished decision cannot be resumed
    with pytest.raises(ValueError):
        loaded.resume(kernel(), Decision([], ALLOW), None)


def test_shaped_hook_rule_answers_as_a_clause(hook_dir):
    # GIVEN a hook rule on launches with dynamic shared memory, a second hook rule, then a
    # shape rule
    loaded = policy("""\
        version: 1
        rules:
          - name: shaped-guard
            match: {kernel: "vec*", shared_mem: {gt: 0}}
            action: hook
            hook: guard.py:guard
          - name: second-guard
            action: hook
            hook: guard.py:other
          - name: big
            match: {grid_blocks: {gt: 10}}
            action: deny
        """)
    # WHEN vecAdd is decided, the first hook denies and the second returns None
    first = loaded.decide(kernel())
    assert first == Decision([], ON_ERROR_ALLOW, 0)
    denied = Outcome(abi.ACTION_DENY, 0, 800, 0)
    second = loaded.resume(kernel(), first, denied)
    final = loaded.resume(kernel(), second, None)
    # THEN the first answer holds only inside the rule's ranges, the walk goes on to the
    # second hook for the rest, and after it to the shape rule and the default
    shared = Clause(ANY_RANGE, ANY_RANGE, (1, U64_MAX), denied)
    assert second == Decision([shared], ON_ERROR_ALLOW, 1)
    assert final == Decision(
        [shared, Clause((11, U64_MAX), ANY_RANGE, ANY_RANGE,
                        Outcome(abi.ACTION_DENY, 0, 800, 2))], ALLOW)
    assert final.outcome_for(1, 1, 4) == denied
    assert final.outcome_for(1, 1, 0) == ALLOW
    # AND a walk can start after any rule
    assert loaded.decide(kernel(), start=1) == Decision([], ON_ERROR_ALLOW, 1)
    assert loaded.decide(kernel(), start=2) == Decision(final.clauses[1:], ALLOW)


def test_explain_hooks_and_hook_rules(hook_dir):
    # GIVEN a hook file on the command line and a policy with a hook rule
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py"])
    # WHEN a vecAdd launch that the hook rule matches is explained
    explanation = loaded.explain(kernel(), grid=(200, 1, 1))
    # THEN the hook file comes first, the hook rule says it asks its hook, and the verdict
    # says what follows when the hooks return None
    assert explanation.format().splitlines() == [
        "kernel: vecAdd",
        "  demangled: vecAdd(float const*, float const*, float*, int)",
        "  mangled:   _Z6vecAddPKfS0_Pfi",
        "device 0, process 'a.out', tenant ''",
        "launch: grid (200, 1, 1) = 200 blocks, block (1, 1, 1) = 1 thread",
        "  dynamic shared memory: 0 bytes",
        "hooks:",
        "  hook file myhooks.py: asked first (its @clc.on_launch hooks, in order)",
        "rules:",
        "  1. small-grids-ok: no match: grid_blocks 200 is not <= 100",
        "  2. no-debug: no match: kernel glob '*debug*' does not match 'vecAdd'",
        "  3. big-blocks: no match: block_threads 1 is not > 512",
        "  4. user-guard: match: kernel glob '*vecAdd*' matches 'vecAdd'; asks guard.py:guard "
        "(its answer decides unless it returns None)",
        "  5. record-rest: match: no match conditions: matches every launch",
        "=> decided by the hooks in myhooks.py (asked first); if they return None: decided by "
        "hook guard.py:guard (rule 'user-guard'); if it returns None: allow by rule "
        "'record-rest' (recorded)",
    ]
    assert explanation.cli_hooks == ["myhooks.py"]
    assert explanation.hooks_asked == [("guard.py:guard", "user-guard")]
    assert (explanation.deciding_rule, explanation.outcome) == ("record-rest", RECORD_REST)


def test_explain_hook_rule_not_asked(hook_dir):
    # GIVEN the hook policy without command-line hooks
    loaded = policy(HOOKED)
    # WHEN launches the hook rule does not reach are explained
    small = loaded.explain(kernel(), grid=(5, 1, 1))
    matmul = loaded.explain(kernel("matmul(float*)", "_Z6matmulPf"), grid=(200, 1, 1))
    # THEN no hook is mentioned in the verdict
    assert small.format().splitlines()[-3:] == [
        "  4. user-guard: not reached: rule 'small-grids-ok' decided first",
        "  5. record-rest: not reached: rule 'small-grids-ok' decided first",
        "=> allow by rule 'small-grids-ok'"]
    assert "hooks:" not in small.format()
    assert matmul.steps[3].reason == "kernel glob '*vecAdd*' does not match 'matmul'"
    assert matmul.verdict() == "=> allow by rule 'record-rest' (recorded)"
    # AND with several hook files, each is listed in order
    both = loaded.with_cli_hooks(["myhooks.py", "more.py"]).explain(kernel(), grid=(5, 1, 1))
    assert both.format().splitlines()[6:9] == [
        "hooks:",
        "  hook file myhooks.py: asked first (its @clc.on_launch hooks, in order)",
        "  hook file more.py: asked next (its @clc.on_launch hooks, in order)"]
    assert both.verdict() == ("=> decided by the hooks in myhooks.py, more.py (asked first); "
                              "if they return None: allow by rule 'small-grids-ok'")


def test_explain_agrees_with_decide_when_hooks_return_none(hook_dir):
    # GIVEN the hook policy, some kernels and some launch shapes
    loaded = policy(HOOKED)
    for info in (kernel(), kernel("matmul(float*)", "_Z6matmulPf"),
                 kernel("debug_dump(float*)", "_Z10debug_dumpPf")):
        decision = loaded.decide(info)
        while decision.pending_hook is not None:
            decision = loaded.resume(info, decision, None)
        for grid, block in (((1, 1, 1), (1, 1, 1)), ((200, 1, 1), (1024, 1, 1)),
                            ((200, 1, 1), (8, 8, 1))):
            # WHEN each launch is explained
            explanation = loaded.explain(info, grid, block)
            # THEN its outcome is what the rules give when every hook returns None
            shape = (math.prod(grid), math.prod(block), 0)
            assert explanation.outcome == decision.outcome_for(*shape)
            deciding = [s.name for s in explanation.steps
                        if s.matched and "; asks " not in s.reason]
            assert deciding == ([] if explanation.deciding_rule == "default"
                                else [explanation.deciding_rule])


def test_cli_hooks_are_appended(hook_dir):
    # GIVEN a policy and hook files named relative to the current directory
    os.mkdir("sub")
    pathlib.Path("sub/extra.py").write_text(GUARD)
    loaded = policy(HOOKED)
    # WHEN they are added, in two goes
    once = loaded.with_cli_hooks(["myhooks.py"])
    twice = once.with_cli_hooks([pathlib.Path("sub/extra.py"), "./more.py"])
    # THEN each copy holds them in order, resolved, with the text as given
    assert once.hooks == [HookRef(os.path.join(hook_dir, "myhooks.py"), None, "myhooks.py")]
    assert twice.hooks == once.hooks + [
        HookRef(os.path.join(hook_dir, "sub", "extra.py"), None, "sub/extra.py"),
        HookRef(os.path.join(hook_dir, "more.py"), None, "./more.py")]
    assert twice.rules == loaded.rules
    # AND the policy they were added to is unchanged
    assert loaded.hooks == [] and once.hooks[0].label == "myhooks.py"


@pytest.mark.parametrize("path, expected", [
    ("nope.py", "nope.py: hook file not found"),
    ("sub/nope.py", "sub/nope.py: hook file not found"),
    ("guard.txt", "guard.txt: hook file must be a Python file ending in .py"),
    ("pkg.py", "pkg.py: hook file is not a file"),
])
def test_cli_hook_errors(hook_dir, path, expected):
    # GIVEN a hook file that is missing, not Python, or a directory
    pathlib.Path("guard.txt").write_text(GUARD)
    os.mkdir("pkg.py")
    # WHEN it is added
    with pytest.raises(HookFileError) as caught:
        policy(HOOKED).with_cli_hooks(["myhooks.py", path])
    # THEN the error names the file as given, and is a PolicyError without a position
    assert str(caught.value) == expected
    assert isinstance(caught.value, PolicyError)
    assert (caught.value.path, caught.value.line, caught.value.column) == (path, 0, 0)


def test_decider_names(hook_dir):
    # GIVEN the hook policy with two hook files on the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py", "more.py"])
    rules = ["small-grids-ok", "no-debug", "big-blocks", "user-guard", "record-rest"]
    # THEN rule indices are unchanged and the hook files follow them
    assert loaded.decider_names() == rules + ["hook myhooks.py", "hook more.py"]
    # AND once the engine has expanded the files, each hook has an index of its own
    names = loaded.decider_names([["first", "second"], ["third"]])
    assert names == rules + ["hook myhooks.py:first", "hook myhooks.py:second",
                             "hook more.py:third"]
    assert [loaded.hook_decider_index(k) for k in range(3)] == [5, 6, 7]
    assert names[loaded.hook_decider_index(1)] == "hook myhooks.py:second"
    assert policy(HOOKED).decider_names() == rules
    with pytest.raises(ValueError):
        loaded.decider_names([["first"]])


def test_json_round_trip_with_hooks(hook_dir):
    # GIVEN a policy with a hook rule and hook files from the command line
    loaded = policy(HOOKED).with_cli_hooks(["myhooks.py", "more.py"])
    # WHEN it goes to JSON and back
    text = loaded.to_json()
    again = Policy.from_json(text)
    # THEN it is the same policy, hooks included, and decides the same
    assert again == loaded
    assert again.to_json() == text
    assert again.decide(kernel()) == loaded.decide(kernel())
    data = json.loads(text)
    assert data["hooks"] == [
        {"path": os.path.join(hook_dir, "myhooks.py"), "function": None, "text": "myhooks.py",
         "line": 0, "column": 0},
        {"path": os.path.join(hook_dir, "more.py"), "function": None, "text": "more.py",
         "line": 0, "column": 0}]
    assert data["rules"][3]["hook"] == {"path": os.path.join(hook_dir, "guard.py"),
                                        "function": "guard", "text": "guard.py:guard",
                                        "line": 17, "column": 11}
    assert data["rules"][3]["action"] == "hook"
    assert data["rules"][0]["hook"] is None


def test_from_json_reads_what_clc_run_adds(hook_dir):
    # GIVEN the JSON of a policy, with names clc-run may add for the hooks
    plain = policy(SHAPES)
    data = json.loads(plain.to_json())
    data["hook_deciders"] = ["h.py:first"]
    # WHEN it is read
    again = Policy.from_json(json.dumps(data))
    # THEN it is the same policy
    assert again.hooks == [] and all(rule.hook is None for rule in again.rules)
    assert again == plain


@pytest.mark.parametrize("drop", ["hooks", "rule hook", "rule wrap"])
def test_from_json_refuses_json_without_a_field(drop):
    # GIVEN the JSON of a policy, one of its fields taken away (a layout no clc writes)
    data = json.loads(policy(SHAPES).to_json())
    if drop == "hooks":
        del data["hooks"]
    else:
        del data["rules"][0][drop.split()[1]]
    # WHEN it is read
    with pytest.raises(PolicyError) as caught:
        Policy.from_json(json.dumps(data))
    # THEN a PolicyError names what is missing
    assert "invalid policy JSON" in str(caught.value)
    assert drop.split()[-1] in str(caught.value)


@pytest.mark.parametrize("hooks", ['[{"path": "/h.py"}]', '[{"path": "/h.py", "function": '
                                   'null, "text": "h.py", "extra": 1}]', '7'])
def test_from_json_rejects_bad_hooks(hooks):
    # GIVEN policy JSON whose hooks are not hook references
    text = ('{"version": 1, "path": "p", "default": "allow", "on_error": "allow", "rules": [], '
            f'"hooks": {hooks}}}')
    # WHEN it is read
    with pytest.raises(PolicyError) as caught:
        Policy.from_json(text)
    # THEN a PolicyError says so
    assert str(caught.value).startswith("<json>:1:1: invalid policy JSON: TypeError(")


def test_hook_example_policy_with_a_stand_in_hook(tmp_path):
    # GIVEN the shipped hook example in a copy of the repository's layout, with a stand-in for
    # the example hook
    (tmp_path / "policies").mkdir()
    (tmp_path / "examples" / "hooks").mkdir(parents=True)
    (tmp_path / "examples" / "hooks" / "arg_guard.py").write_text(GUARD)
    path = tmp_path / "policies" / "hook-example.yaml"
    path.write_text((POLICIES / "hook-example.yaml").read_text())
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN vecAdd kernels go to the hook and the rest are allowed and recorded
    assert loaded.rule_names == ["guard-vecadd", "record-the-rest"]
    assert loaded.rules[0].hook == HookRef(
        os.path.realpath(tmp_path / "examples" / "hooks" / "arg_guard.py"), "guard",
        "../examples/hooks/arg_guard.py:guard")
    record = Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 1)
    pending = loaded.decide(kernel())
    assert pending == Decision([], ON_ERROR_ALLOW, 0)
    assert loaded.resume(kernel(), pending, None) == Decision([], record)
    assert loaded.decide(kernel("matmul(float*)", "_Z6matmulPf")) == Decision([], record)
    assert (loaded.default, loaded.on_error) == ("allow", "allow")
    assert Policy.from_json(loaded.to_json()) == loaded


@pytest.mark.skipif(not EXAMPLE_HOOK.exists(), reason="examples/hooks/arg_guard.py is absent")
def test_hook_example_policy():
    # GIVEN the shipped hook example and the shipped example hook
    loaded = load_policy(POLICIES / "hook-example.yaml")
    # THEN its hook rule names the example hook
    assert loaded.rules[0].hook == HookRef(os.path.realpath(EXAMPLE_HOOK), "guard",
                                           "../examples/hooks/arg_guard.py:guard")
    assert loaded.decide(kernel()).pending_hook == 0


# ---- CUDA errors ------------------------------------------------------------------------------

def test_cuda_error_names():
    # GIVEN the CUresult table
    # WHEN codes are named
    # THEN known ones get their enum name and others a readable stand-in
    assert CUDA_ERRORS["CUDA_ERROR_NOT_PERMITTED"] == 800
    assert error_name(0) == "CUDA_SUCCESS"
    assert error_name(800) == "CUDA_ERROR_NOT_PERMITTED"
    assert error_name(12345) == "CUresult 12345"
    assert len(set(CUDA_ERRORS.values())) == len(CUDA_ERRORS)


def test_cuda_errors_match_the_toolkit_header():
    # GIVEN the CUresult enum of cuda.h (the test extra's nvidia-cuda-runtime brings it)
    header = pathlib.Path(CUDA_INCLUDE) / "cuda.h"
    enum = re.search(r"typedef enum cudaError_enum \{(.*?)\} CUresult;", header.read_text(),
                     re.S).group(1)
    enum = re.sub(r"/\*.*?\*/", "", enum, flags=re.S)
    # WHEN its names and values are read
    in_header = {name: int(value)
                 for name, value in re.findall(r"(CUDA_[A-Z0-9_]+)\s*=\s*(\d+)", enum)}
    # THEN the table holds every one of them with the same value
    assert {name: CUDA_ERRORS.get(name) for name in in_header} == in_header

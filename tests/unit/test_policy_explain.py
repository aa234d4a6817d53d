# SPDX-License-Identifier: Apache-2.0
"""The policy format: explanations, the JSON the program receives, the shipped policies."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from clc import abi
from clc.policy import (
    Decision, KernelInfo, Outcome, Policy,
    PolicyError, load_policy,
)

from policy_cases import (
    ALLOW, CONTEXT, EXAMPLE_HOOK, POLICIES, REPO, SHAPES, TEMPLATE_DEMANGLED, TEMPLATE_MANGLED,
    kernel, policy, shipped_policies
)


# ---- explain -----------------------------------------------------------------------------------

def test_explain_deny_by_rule():
    # GIVEN the shipped deny example and a debug kernel
    loaded = load_policy(POLICIES / "deny-example.yaml")
    info = kernel("debug_dump(float*)", "_Z10debug_dumpPf")
    # WHEN its launch is explained
    explanation = loaded.explain(info)
    # THEN the first rule decides and the second is not reached
    assert explanation.deciding_rule == "no-debug-kernels"
    assert explanation.outcome == Outcome(abi.ACTION_DENY, 0, 800, 0)
    assert [(s.name, s.matched, s.reached, s.reason) for s in explanation.steps] == [
        ("no-debug-kernels", True, True, "kernel glob '*debug*' matches 'debug_dump'"),
        ("no-huge-grids", False, False, "rule 'no-debug-kernels' decided first"),
    ]
    assert explanation.format().splitlines()[-1] == (
        "=> deny (CUDA_ERROR_NOT_PERMITTED) by rule 'no-debug-kernels': "
        "debug kernels are not allowed on this server")


def test_explain_shape_rule():
    # GIVEN the shipped deny example and vecAdd
    loaded = load_policy(POLICIES / "deny-example.yaml")
    # WHEN a huge and a small launch are explained
    huge = loaded.explain(kernel(), grid=(2000, 1000, 1), block=(256, 1, 1))
    small = loaded.explain(kernel(), grid=(20, 1, 1))
    # THEN the launch shape decides between the rule and the default
    assert [s.reason for s in huge.steps] == [
        "kernel glob '*debug*' does not match 'vecAdd'", "grid_blocks 2000000 > 1000000"]
    assert huge.deciding_rule == "no-huge-grids"
    assert small.steps[1].reason == "grid_blocks 20 is not > 1000000"
    assert small.deciding_rule == "default"
    assert small.outcome == ALLOW
    assert small.format() == textwrap.dedent("""\
        kernel: vecAdd
          demangled: vecAdd(float const*, float const*, float*, int)
          mangled:   _Z6vecAddPKfS0_Pfi
        device 0, process 'a.out', tenant ''
        launch: grid (20, 1, 1) = 20 blocks, block (1, 1, 1) = 1 thread
          dynamic shared memory: 0 bytes
        rules:
          1. no-debug-kernels: no match: kernel glob '*debug*' does not match 'vecAdd'
          2. no-huge-grids: no match: grid_blocks 20 is not > 1000000
        => allow by default""")


def test_explain_reasons_for_every_condition():
    # GIVEN rules on every kind of condition
    loaded = policy("""\
        version: 1
        rules:
          - name: regex
            match: {kernel_regex: "gemm|conv"}
            action: deny
          - name: devices
            match: {device: [1, 2]}
            action: deny
          - name: one-device
            match: {device: 0, process: ["py*", "ipy*"]}
            action: deny
          - name: tenant
            match: {tenant: "b"}
            action: deny
          - name: all
            match:
              kernel: ["*x*", "vec*"]
              device: 0
              tenant: ""
              block_threads: {ge: 64, lt: 1024}
            action: allow
            time: true
        """)
    # WHEN a vecAdd launch is explained
    explanation = loaded.explain(kernel(), block=(32, 4, 1), shared_mem=16)
    # THEN each rule says why it failed or matched
    assert [s.reason for s in explanation.steps] == [
        "kernel_regex 'gemm|conv' does not match 'vecAdd'",
        "device 0 not in [1, 2]",
        "process globs 'py*', 'ipy*' do not match 'a.out'",
        "tenant glob 'b' does not match ''",
        "kernel glob 'vec*' matches 'vecAdd'; device 0 == 0; tenant glob '' matches ''; "
        "block_threads 128 >= 64; block_threads 128 < 1024",
    ]
    assert explanation.format().splitlines()[-1] == "=> allow by rule 'all' (recorded and timed)"


def test_explain_rule_without_conditions():
    # GIVEN the shipped audit and time-all policies
    for name, verdict in (("audit", "=> allow by rule 'record-everything' (recorded)"),
                          ("time-all", "=> allow by rule 'time-everything' (recorded and timed)")):
        loaded = load_policy(POLICIES / f"{name}.yaml")
        # WHEN any launch is explained
        explanation = loaded.explain(kernel())
        # THEN its only rule decides
        assert explanation.format().splitlines()[-1] == verdict
    assert explanation.steps[0].reason == "no match conditions: matches every launch"


def test_explain_agrees_with_decide():
    # GIVEN the shape policy, some kernels and some launch shapes
    loaded = policy(SHAPES)
    for info in (kernel(), kernel("sgemm(float*)", "_Z5sgemmPf")):
        decision = loaded.decide(info)
        for grid, block, shared in (((1, 1, 1), (1, 1, 1), 0), ((200, 1, 1), (1024, 1, 1), 0),
                                    ((5, 5, 5), (8, 8, 8), 49152), ((10, 10, 1), (32, 1, 1), 1)):
            # WHEN each launch is explained
            explanation = loaded.explain(info, grid, block, shared)
            # THEN it reports the outcome the C side computes, and the step that decided it
            blocks, threads = grid[0] * grid[1] * grid[2], block[0] * block[1] * block[2]
            assert explanation.outcome == decision.outcome_for(blocks, threads, shared)
            matched = [s.name for s in explanation.steps if s.matched]
            assert matched == ([] if explanation.deciding_rule == "default"
                               else [explanation.deciding_rule])


# ---- JSON -------------------------------------------------------------------------------------

def test_json_round_trip():
    # GIVEN policies using every field
    for loaded in (policy(SHAPES), policy(CONTEXT), policy("version: 1\ndefault: deny\n"),
                   *(load_policy(path) for path in shipped_policies())):
        # WHEN one goes to JSON and back
        text = loaded.to_json()
        again = Policy.from_json(text)
        # THEN it is the same policy and decides the same
        assert again == loaded
        assert again.to_json() == text
        assert json.loads(text)["version"] == 1
        for info in (kernel(), kernel("sgemm(float*)", "_Z5sgemmPf", device=1, tenant="b")):
            assert again.decide(info) == loaded.decide(info)


@pytest.mark.parametrize("text, expected", [
    ("{", "<json>:1:2: invalid policy JSON: Expecting property name enclosed in double quotes"),
    ('{"version": 1}', "<json>:1:1: invalid policy JSON: KeyError('path')"),
    ('{"version": 2, "path": "p", "default": "allow", "on_error": "allow", "rules": []}',
     "<json>:1:1: unsupported policy version 2"),
])
def test_from_json_rejects_bad_input(text, expected):
    # GIVEN text that is not a compiled policy
    # WHEN it is read
    with pytest.raises(PolicyError) as caught:
        Policy.from_json(text)
    # THEN a PolicyError says so
    assert str(caught.value) == expected


def test_module_needs_only_the_standard_library():
    # GIVEN a Python where PyYAML cannot be imported, and a compiled policy
    text = load_policy(POLICIES / "deny-example.yaml").to_json()
    code = textwrap.dedent("""\
        import sys
        sys.modules["yaml"] = None
        from clc.policy import Policy, PolicyError, parse_policy
        print(Policy.from_json(sys.stdin.read()).rule_names)
        try:
            parse_policy("version: 1")
        except PolicyError as error:
            print(error)
        """)
    # WHEN the module is imported there and reads the JSON
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True,
                            text=True, env=env, cwd=REPO, check=True)
    # THEN JSON works and YAML fails with a PolicyError
    assert result.stdout.splitlines() == [
        "['no-debug-kernels', 'no-huge-grids']",
        "<string>:1:1: reading a YAML policy needs PyYAML (pip install pyyaml)",
    ]


# ---- shipped policies ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda path: path.name)
def test_every_shipped_policy_loads_without_warnings(path):
    # GIVEN a policy shipped in policies/ (the hook example needs the example hook)
    if path.name == "hook-example.yaml" and not EXAMPLE_HOOK.exists():
        pytest.skip("examples/hooks/arg_guard.py is absent")
    # WHEN it is loaded
    loaded = load_policy(path)
    # THEN it has rules and nothing `clc policy check --strict` would refuse
    assert loaded.rules
    assert [str(w) for w in loaded.warnings] == []


def test_strict_example_policy():
    # GIVEN the shipped fail-closed template
    from clc.policy import Identity
    loaded = load_policy(POLICIES / "strict-example.yaml")
    assert (loaded.default, loaded.on_error) == ("deny", "deny")
    assert loaded.on_error_outcome() == Outcome(abi.ACTION_DENY, abi.FLAG_RECORD, 800,
                                                abi.RULE_ON_ERROR)
    bob = Identity(("bob", "1001"), ("bob", "1001"), "/user.slice/user-1001.slice")
    user = Identity(("carol", "1002"), ("carol", "1002", "gpu-users", "3000"), "/user.slice")
    admin = Identity(("dave", "1003"), ("dave", "1003", "wheel", "10"), "/user.slice")
    job = Identity(("erin", "1004"), ("erin", "1004"),
                   "/system.slice/slurmstepd.scope/job_17/step_0/user/task_0")
    service = Identity(("infer", "990"), ("infer", "990"), "/system.slice/infer.service")

    def decide(identity, name="vecAdd(float*)", mangled="_Z6vecAddPf"):
        return loaded.decide(KernelInfo(mangled, name, 0, ("a.out",), "", identity))

    # WHEN kernels of each kind of process are decided
    # THEN someone listed nowhere is refused, even when the tenant claims otherwise
    assert decide(bob).fallback == Outcome(abi.ACTION_DENY, 0, 800, abi.RULE_DEFAULT)
    assert loaded.decide(KernelInfo("_Z1kv", "k()", 0, (), "admins", bob)).fallback.rule == \
        abi.RULE_DEFAULT
    # AND administrators run anything, recorded
    assert decide(admin).fallback == Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD, 0, 0)
    # AND batch jobs run library kernels only
    assert decide(job, "void cutlass::Kernel<F>(F)", "_ZN7cutlass6KernelI1FEEvT_").fallback \
        == Outcome(abi.ACTION_ALLOW, 0, 0, 1)
    assert decide(job).fallback.rule == abi.RULE_DEFAULT
    # AND gpu-users run their kernels, but not huge grids
    decision = decide(user)
    assert decision.outcome_for(1_000_000, 256, 0) == Outcome(abi.ACTION_ALLOW, 0, 0, 3)
    assert decision.outcome_for(1_000_001, 256, 0) == Outcome(abi.ACTION_DENY, 0, 800, 2)
    # AND the service account runs only its inference kernels
    assert decide(service, "infer_resnet50", "infer_resnet50").fallback.rule == 4
    assert decide(service).fallback.rule == abi.RULE_DEFAULT


def test_audit_policy():
    # GIVEN the shipped audit policy
    loaded = load_policy(POLICIES / "audit.yaml")
    # WHEN kernels are decided
    # THEN every launch is allowed and recorded, whatever its shape
    for info in (kernel(), kernel("debug_dump(float*)", "_Z10debug_dumpPf", device=3)):
        assert loaded.decide(info) == Decision([], Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD,
                                                           0, 0))
    assert loaded.default == "allow"


def test_deny_example_policy():
    # GIVEN the shipped deny example
    loaded = load_policy(POLICIES / "deny-example.yaml")
    assert loaded.rule_names == ["no-debug-kernels", "no-huge-grids"]
    # WHEN a debug kernel is decided
    # THEN it is denied whatever its shape
    debug = loaded.decide(kernel("void debug_dump<float>(float*)", "_Z10debug_dumpIfEvPT_"))
    assert debug == Decision([], Outcome(abi.ACTION_DENY, 0, 800, 0))
    # WHEN an ordinary kernel is decided
    decision = loaded.decide(kernel())
    # THEN only launches of more than 1000000 blocks are denied
    assert decision.outcome_for(1_000_000, 1024, 0) == ALLOW
    assert decision.outcome_for(1_000_001, 1, 0) == Outcome(abi.ACTION_DENY, 0, 800, 1)


def test_time_all_policy():
    # GIVEN the shipped time-all policy
    loaded = load_policy(POLICIES / "time-all.yaml")
    # WHEN kernels are decided
    # THEN every launch is allowed, recorded and timed
    for info in (kernel(), KernelInfo(TEMPLATE_MANGLED, TEMPLATE_DEMANGLED, 1, (), "x")):
        assert loaded.decide(info) == Decision(
            [], Outcome(abi.ACTION_ALLOW, abi.FLAG_RECORD | abi.FLAG_TIME, 0, 0))

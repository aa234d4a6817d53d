# SPDX-License-Identifier: Apache-2.0
"""Python hooks among a policy's rules, in real processes over the fake driver, and the examples
of examples/hooks."""

import collections
import os
import re
import subprocess

import pytest

from clc import abi
from harness import DENY_DEBUG, ROOT, clc_command, env_for, kernel_launches, nonzero
from hook_runs import (ALLOW_ALL, COUNT, DEBUG, EXAMPLES, KERNELS, STRUCT, VECADD, args, by_mangled,
                       kernel_of, launches, logged, ok, rcs, write_hooks)


# ---- (f) hooks and the policy's rules together -------------------------------------------------

def test_cli_hook_none_lets_a_deny_rule_decide(run_params, tmp_path):
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*debug*")
        def shrug(launch):
            log(launch.name)
            return None
    """)
    run = run_params(DENY_DEBUG, [hooks])
    ok(run)
    assert rcs(run, DEBUG) == [800] * 3
    assert run.stderr.count("debug kernels are not allowed here") == 1, run.stderr
    assert [kernel_of(f[0]) for f in logged(tmp_path / "hooks.log")] == [DEBUG]


def test_cli_hook_deny_wins_over_an_allow_rule(run_params, tmp_path):
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*vecAdd*")
        def no_vecadd(launch):
            return clc.deny("vecAdd is off")
    """)
    policy = """\
version: 1
default: deny
rules:
  - name: allow-and-record-all
    match: {kernel: "*"}
    action: allow
    record: true
"""
    run = run_params(policy, [hooks])
    ok(run)
    assert rcs(run, VECADD) == [800] * (2 * COUNT)
    assert rcs(run, STRUCT) == [0] * 2 and rcs(run, DEBUG) == [0] * 3
    assert run.stderr.count("vecAdd is off") == 1, run.stderr
    assert run.fake_counts() == {VECADD: 0, STRUCT: 2, DEBUG: 3}


def test_first_cli_hook_with_an_answer_decides(run_params, tmp_path):
    # Two hook files, in order: the first has no opinion on vecAdd, the second denies it; the
    # first allows debug kernels, so the second is not asked about them.
    first = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*")
        def first(launch):
            log("first", launch.name)
            return clc.allow() if "debug" in launch.name else None
    """, name="first.py")
    second = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*")
        def second(launch):
            log("second", launch.name)
            return clc.deny("second says no") if "vecAdd" in launch.name else None
    """, name="second.py")
    run = run_params(DENY_DEBUG, [first, second])
    ok(run)
    assert rcs(run, VECADD) == [800] * (2 * COUNT)
    assert rcs(run, DEBUG) == [0] * 3  # the first hook's allow beats the deny rule
    assert rcs(run, STRUCT) == [0] * 2
    asked = collections.defaultdict(list)
    for who, name in logged(tmp_path / "hooks.log"):
        asked[kernel_of(name)].append(who)
    assert asked == {VECADD: ["first", "second"], STRUCT: ["first", "second"], DEBUG: ["first"]}


def test_policy_hook_rule_is_asked_only_for_what_it_matches(run_params, tmp_path):
    # GIVEN a policy whose hook rule matches vecAdd, a deny rule for debug kernels after it,
    # and a command-line hook with no opinion
    rule_hooks = write_hooks(tmp_path, """\
        def check_vecadd(launch):
            log("rule", launch.name)
            return clc.deny("the vecAdd hook rule says no")
    """, name="rule_hooks.py")
    cli_hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*")
        def watch(launch):
            log("cli", launch.name)
            return None
    """, name="cli_hooks.py")
    policy = f"""\
version: 1
default: allow
rules:
  - name: vecadd-hook
    match: {{kernel: "*vecAdd*"}}
    action: hook
    hook: {rule_hooks}:check_vecadd
  - name: no-debug
    match: {{kernel: "*debug*"}}
    action: deny
    message: "debug kernels are not allowed here"
"""
    run = run_params(policy, [cli_hooks])
    ok(run)
    # THEN the rule's hook decides vecAdd, the deny rule debug, the default structArg
    assert rcs(run, VECADD) == [800] * (2 * COUNT)
    assert rcs(run, DEBUG) == [800] * 3
    assert rcs(run, STRUCT) == [0] * 2
    assert run.stderr.count("the vecAdd hook rule says no") == 1, run.stderr
    # AND the rule's hook was asked about vecAdd only, the command-line hook about all, first
    entries = [(who, kernel_of(name)) for who, name in logged(tmp_path / "hooks.log")]
    assert {k for who, k in entries if who == "rule"} == {VECADD}
    assert {k for who, k in entries if who == "cli"} == set(KERNELS)
    assert entries.index(("cli", VECADD)) < entries.index(("rule", VECADD))


def test_policy_hook_rule_returning_none_falls_through_to_later_rules(run_params, tmp_path):
    rule_hooks = write_hooks(tmp_path, """\
        def shrug(launch):
            log("rule", launch.name)
            return None
    """, name="rule_hooks.py")
    policy = f"""\
version: 1
default: allow
rules:
  - name: ask-python-first
    match: {{kernel: "*"}}
    action: hook
    hook: {rule_hooks}:shrug
  - name: no-debug
    match: {{kernel: "*debug*"}}
    action: deny
    message: "debug kernels are not allowed here"
"""
    run = run_params(policy)
    ok(run)
    assert rcs(run, DEBUG) == [800] * 3
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, STRUCT) == [0] * 2
    assert {kernel_of(f[1]) for f in logged(tmp_path / "hooks.log")} == set(KERNELS)


# ---- (g) the examples of examples/hooks --------------------------------------------------------

def test_example_arg_guard_denies_only_large_n(run_params):
    run = run_params(ALLOW_ALL, [EXAMPLES / "arg_guard.py"], count=10,
                     env={"CLC_MAX_N": "550"})
    ok(run)
    ns = [int(a["n"]) for k, a in args(run) if k == VECADD]
    assert ns == list(range(100, 1001, 100)) * 2
    # THEN exactly the launches with n > 550 are refused, through either form
    assert rcs(run, VECADD) == [800 if n > 550 else 0 for n in ns]
    assert rcs(run, STRUCT) == [0] * 2 and rcs(run, DEBUG) == [0] * 3
    assert run.fake_counts() == {VECADD: 10, STRUCT: 2, DEBUG: 3}
    # AND the message names the argument and the limit
    assert re.search(r"n=(6|7|8|9|10)00 is over the limit of 550", run.stderr), run.stderr
    assert not re.search(r"n=[1-5]00 is over", run.stderr)


def test_example_arg_guard_default_limit(run_params):
    run = run_params(ALLOW_ALL, [EXAMPLES / "arg_guard.py"], count=10)
    ok(run)
    assert all(rc == 0 for _, _, rc in launches(run))


def test_example_hook_policy_with_arg_guard(run_params):
    # policies/hook-example.yaml names examples/hooks/arg_guard.py:guard in a hook rule.
    run = run_params(None, count=10, env={"CLC_MAX_N": "250"},
                     options=["--policy", str(ROOT / "policies" / "hook-example.yaml")])
    ok(run)
    ns = [int(a["n"]) for k, a in args(run) if k == VECADD]
    assert rcs(run, VECADD) == [800 if n > 250 else 0 for n in ns]
    assert rcs(run, STRUCT) == [0] * 2 and rcs(run, DEBUG) == [0] * 3


@pytest.mark.parametrize("tenant", [None, "team-a"])
def test_example_tenant_budget_prog_params(run_params, tenant):
    env = {"CLC_BUDGET": "15"}
    if tenant:
        env["CLC_TENANT"] = tenant
    run = run_params(ALLOW_ALL, [EXAMPLES / "tenant_budget.py"], count=10,
                     env=env)
    ok(run)
    # THEN the first 15 launches run and every later one is refused
    got = [rc for _, _, rc in launches(run)]
    assert len(got) == 25  # 2 x 10 vecAdd, 2 structArg, 3 debug_kernel
    assert got == [0] * 15 + [800] * 10
    assert sum(run.fake_counts().values()) == 15
    name = tenant or "default"
    # (the deny message is said once per kernel: all three went over the budget)
    said = re.findall(rf"^clc: launches of (\w+).* tenant '{name}' has used its budget of 15 ",
                      run.stderr, re.M)
    assert sorted(said) == ["debug_kernel", "structArg", "vecAdd"], run.stderr
    # AND the exit hook sums it up, one line per tenant
    assert re.findall(r"^clc-budget: .*$", run.stderr, re.M) == [
        f"clc-budget: tenant={name} launches=25 allowed=15 denied=10 budget=15"]


def test_example_tenant_budget_threads(clc_run, native):
    # 4 threads x 50 launches at once, a budget of 120: exactly 120 run.
    run = clc_run(ALLOW_ALL, [native["prog_threads"], "4", "50"],
                  options=["--hooks", str(EXAMPLES / "tenant_budget.py"), "--tenant", "batch"],
                  env={"CLC_BUDGET": "120"})
    ok(run)
    assert "threads: ok=120 failed=80 codes=0:120,800:80" in run.stdout
    assert sum(run.fake_counts().values()) == 120
    assert re.findall(r"^clc-budget: .*$", run.stderr, re.M) == [
        "clc-budget: tenant=batch launches=200 allowed=120 denied=80 budget=120"]


def test_example_sampler_prog_params(run_params):
    run = run_params(ALLOW_ALL, [EXAMPLES / "sampler.py"], count=10,
                     env={"CLC_SAMPLE_EVERY": "3"})
    ok(run)
    assert all(rc == 0 for _, _, rc in launches(run))
    cap = run.capture()
    # THEN every 3rd launch of each kernel is recorded: vecAdd 20 -> 6, structArg 2 -> 0,
    # debug_kernel 3 -> 1
    assert nonzero(by_mangled(cap, "recorded")) == {VECADD: 6, DEBUG: 1}
    assert kernel_launches(cap) == {VECADD: 20, STRUCT: 2, DEBUG: 3}
    records = sorted(cap.launches, key=lambda launch: launch.seq)
    grids = collections.defaultdict(list)
    for launch in records:
        grids[cap.kernels[launch.kernel_id].mangled].append(launch.grid[0])
    # vecAdd's launches 3, 6, ..., 18 have grids 3, 6, 9, then 2, 5, 8 (the extra round)
    assert dict(grids) == {VECADD: [3, 6, 9, 2, 5, 8], DEBUG: [3]}
    assert all(launch.action == abi.ACTION_ALLOW for launch in records)


def test_example_sampler_threads(clc_run, native):
    run = clc_run(ALLOW_ALL, [native["prog_threads"], "4", "50"],
                  options=["--hooks", str(EXAMPLES / "sampler.py")],
                  env={"CLC_SAMPLE_EVERY": "7"})
    ok(run)
    assert "threads: ok=200 failed=0" in run.stdout
    cap = run.capture()
    # 100 launches of each of the two kernels, from 4 threads: 14 recorded each
    assert kernel_launches(cap) == {VECADD: 100, DEBUG: 100}
    assert nonzero(by_mangled(cap, "recorded")) == {VECADD: 14, DEBUG: 14}
    assert len(cap.launches) == 28


def test_exit_does_not_wait_for_a_thread_blocked_on_stdin(native, tmp_path):
    # GIVEN a C program whose other thread is blocked reading stdin (a pipe nobody writes to)
    # when main returns, under a hook file (clc's interpreter runs in the program)
    hooks = write_hooks(tmp_path, "@clc.on_launch\ndef nothing(launch):\n    return None\n")
    cmd = clc_command() + ["--hooks", str(hooks), "-o", str(tmp_path / "c.clc"), "--",
                           str(native["prog_stdin_thread"])]
    reader, writer = os.pipe()
    try:
        proc = subprocess.run(cmd, env=env_for(native), stdin=reader, capture_output=True,
                              text=True, timeout=60)
    finally:
        os.close(reader)
        os.close(writer)
    # THEN it exits, with its own status and output
    assert proc.returncode == 0, proc.stderr
    assert "main returns" in proc.stdout

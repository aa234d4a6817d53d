# SPDX-License-Identifier: Apache-2.0
"""The policy is fixed when the program starts: nothing the program does to its environment
changes its own decisions or its children's, and no policy is too large to pass on."""

import json
import re
import sys

import pytest

from harness import DENY_DEBUG_ONLY as DENY_DEBUG, exec_results

ALLOW_ALL = json.dumps({"version": 1, "default": "allow", "on_error": "allow", "rules": []})


def summary(run):
    m = re.search(r"^summary (.*)$", run.stdout, re.M)
    assert m, run.stdout + run.stderr
    return {k: int(v) for k, v in (kv.split("=") for kv in m[1].split())}


def test_a_forged_environment_does_not_lift_the_policy(native, clc_run):
    # GIVEN a program that rewrites clc's variables before it starts the CUDA program (its own
    # policy as CLC_POLICY, its stdin as the settings' descriptor)
    forged = (f"CLC_POLICY='{ALLOW_ALL}' CLC_ON_ERROR=allow CLC_SETTINGS_FD=0 "
              f"exec {native['prog_reload']} module 4 debug-first")
    # WHEN it runs under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, ["sh", "-c", forged])
    # THEN the debug kernel is still refused, and the capture holds the real policy
    assert run.proc.returncode == 0, run.stdout + run.stderr
    s = summary(run)
    assert (s["debug_ran"], s["debug_refused"], s["ok_ran"]) == (0, 2, 2), run.stdout
    cap = run.capture()
    assert [r["name"] for r in cap.policy["rules"]] == ["no-debug"]


def test_the_program_does_not_see_clcs_variables(native, clc_run):
    # WHEN a program (and a child it runs) prints its environment under clc
    run = clc_run(DENY_DEBUG, ["sh", "-c", "env; echo ---; env"], options=["--no-report"])
    assert run.proc.returncode == 0, run.stderr
    # THEN no CLC_ setting is in it, only the preload and what a process of the run without its
    # settings falls back to (on_error, and the status socket to say so)
    assert "LD_PRELOAD=" in run.stdout
    seen = [line for line in run.stdout.splitlines() if line.startswith("CLC_")]
    assert len(seen) == 2 and all(re.fullmatch(r"CLC_FALLBACK=allow /\S+/status", line)
                                  for line in seen), run.stdout


def test_children_started_through_system_keep_the_policy(native, clc_run):
    # GIVEN a Python program that starts the CUDA program with os.system (glibc's system()
    # spawns /bin/sh with the program's environment, which no longer names the settings)
    code = f"import os, sys; sys.exit(os.waitstatus_to_exitcode(os.system(" \
           f"'{native['prog_reload']} module 4 debug-first')))"
    run = clc_run(DENY_DEBUG, [sys.executable, "-c", code])
    # THEN the grandchild is decided by the same policy
    assert run.proc.returncode == 0, run.stdout + run.stderr
    s = summary(run)
    assert (s["debug_ran"], s["debug_refused"], s["ok_ran"]) == (0, 2, 2), run.stdout + run.stderr


def test_a_policy_larger_than_the_environment_can_hold(native, clc_run):
    # GIVEN a policy of 3,000 rules, each with a long message (about 600 KB of JSON: more than
    # execve takes for one environment string)
    rules = "".join(f"  - name: rule-{i}\n    match: {{kernel: \"never_{i}_*\"}}\n"
                    f"    action: deny\n    message: \"{'x' * 150}\"\n" for i in range(3000))
    policy = DENY_DEBUG + rules
    # WHEN a program runs under it
    run = clc_run(policy, [native["prog_reload"], "module", "4", "debug-first"])
    # THEN it starts, and the rules apply
    assert run.proc.returncode == 0, run.stderr[-2000:]
    s = summary(run)
    assert (s["debug_ran"], s["debug_refused"], s["ok_ran"]) == (0, 2, 2)


@pytest.mark.parametrize("how", ["syscall", "syscall_nopreload"])
def test_a_raw_execve_through_syscall_keeps_the_policy(native, clc_run, how):
    # GIVEN a forked child that closes every descriptor (the settings' memfd with them), then
    # runs a CUDA program with libc's syscall(SYS_execve, ...), with or without LD_PRELOAD
    run = clc_run(DENY_DEBUG, [native["prog_life"], "rawexec", how, "10"], options=["--strict"])
    # THEN the new image runs under the same policy: its ten denied launches were refused
    assert exec_results(run) == [800] * 10, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.fake_counts()["_Z12debug_kernelPi"] == 0
    # AND its capture says so, and --strict fails the run for the denials
    assert sum(s.denied for c in run.captures() for s in c.stats.values()) == 10
    assert run.proc.returncode == 3 and "10 launches or graph-node calls denied" in run.stderr

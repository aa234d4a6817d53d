# SPDX-License-Identifier: Apache-2.0
"""clc-run answers first sights for policies without Python hooks (clc/runtime/decider.py,
shim/deciding/decider.c): only clc-run is asked, answers stay with their questions, and a program
that cannot reach it is decided by its own engine."""

import json
import os
import subprocess

from harness import DENY_DEBUG_ONLY, Run, env_for

from clc.runtime.decider import Decider
from clc.policy import parse_policy
from clc.runtime.shim import SETTINGS_VAR, preload_environment, settings_fd


def debug_results(run):
    return [r for (kernel, _), rs in run.results().items() if "debug" in kernel for r in rs]


def run_with_decider(native, tmp_path, decider_policy, decider_pid):
    """prog_cudart with clc's settings made by hand: the sealed policy denies debug kernels,
    and the decider (in this test's process) answers with `decider_policy`, announced under
    the pid `decider_pid`."""
    decider = Decider(parse_policy(decider_policy))
    decider.start()
    try:
        sealed = parse_policy(DENY_DEBUG_ONLY)
        env, settings = preload_environment(env_for(native), policy_json=sealed.to_json(),
                                            on_error="allow", output=tmp_path / "cap.clc",
                                            force=True)
        settings.update(decider.settings())
        settings["CLC_DECIDER_PID"] = str(decider_pid)
        fd = settings_fd(settings)
        env[SETTINGS_VAR] = str(fd)
        try:
            proc = subprocess.run([str(native["prog_cudart"])], env=env, pass_fds=(fd,),
                                  capture_output=True, text=True, timeout=60)
        finally:
            os.close(fd)
        return Run(proc, tmp_path / "cap.clc")
    finally:
        decider.close()


ALLOW_ALL = "version: 1\ndefault: allow\n"


def test_the_decider_is_asked_when_it_is_clc_run(native, tmp_path):
    # GIVEN a decider whose policy allows everything, named in the settings by its own pid
    run = run_with_decider(native, tmp_path, ALLOW_ALL, os.getpid())
    # THEN its answers decide: the debug kernel runs
    assert run.proc.returncode == 0, run.stderr
    assert debug_results(run) and all(r == 0 for r in debug_results(run)), run.stdout
    assert "cannot ask clc-run" not in run.stderr


def test_a_socket_answered_by_another_process_is_not_asked(native, tmp_path):
    # GIVEN the same socket, while the settings name another process as clc-run
    run = run_with_decider(native, tmp_path, ALLOW_ALL, 1)
    # THEN the program's own engine decides with the sealed policy: the debug kernel is denied
    assert run.proc.returncode == 0, run.stderr
    assert debug_results(run) and all(r == 800 for r in debug_results(run)), run.stdout
    assert "cannot ask clc-run about kernel launches (Operation not permitted)" in run.stderr


def test_answers_stay_with_their_questions_when_stderr_is_closed(native, clc_run):
    # GIVEN a program whose fd 2 is closed (the decider's connection could land there, and the
    # program and the shim write to fd 2), under a policy that denies some kernels
    policy = DENY_DEBUG_ONLY.replace('"*debug*"', '"*scale*"')
    run = clc_run(policy, ["sh", "-c", f"exec {native['prog_cudart']} 2>&-"])
    assert run.proc.returncode == 0, run.stdout
    # THEN each kernel gets its own decision
    results = run.results()
    assert results, run.stdout
    for (kernel, entry), rs in results.items():
        if entry.startswith("cuGraph"):
            continue
        assert all(r == (800 if "scale" in kernel else 0) for r in rs), (kernel, entry, rs)
    assert run.fake_counts().get("_Z5scalePff", 0) == 0
    # AND clc-run decided them all (the program's own engine was never needed)
    said = [m.text for m in run.capture().messages]
    assert not any("clc-run" in text for text in said), said
    # nothing but questions reached it
    assert "clc-run could not decide" not in run.stderr, run.stderr


def test_a_descendant_that_outlives_clc_run_is_still_decided(native, clc_run):
    # GIVEN a program that leaves a child behind, which launches after clc-run has ended
    run = clc_run(DENY_DEBUG_ONLY, ["sh", "-c", f"(sleep 1; {native['prog_cudart']}) &"],
                  options=["--no-report"])
    assert run.proc.returncode == 0
    # THEN (its output arrives when it ends) the child's debug kernel was still denied
    assert debug_results(run) and all(r == 800 for r in debug_results(run)), run.stdout
    assert "cannot ask clc-run" in run.stderr and "own engine decides them" in run.stderr


def test_settings_name_clc_run_and_its_user(tmp_path):
    decider = Decider(parse_policy(ALLOW_ALL))
    try:
        s = decider.settings()
        assert s["CLC_DECIDER_PID"] == str(os.getpid())
        assert s["CLC_DECIDER_UID"] == str(os.geteuid())
        assert oct(os.stat(os.path.dirname(s["CLC_DECIDER"])).st_mode & 0o777) == "0o700"
        assert json.loads(json.dumps(s)) == s
    finally:
        decider.close()


def test_a_long_tmpdir_does_not_stop_clc_run(native, clc_run, tmp_path):
    # GIVEN a $TMPDIR too long for a Unix socket's path
    long = tmp_path / ("d" * 60) / ("e" * 60)
    long.mkdir(parents=True)
    run = clc_run(DENY_DEBUG_ONLY, [native["prog_cudart"]], env={"TMPDIR": str(long)})
    # THEN the program runs under the policy all the same
    assert run.proc.returncode == 0, run.stderr
    assert debug_results(run) and all(r == 800 for r in debug_results(run)), run.stdout
    assert "Traceback" not in run.stderr

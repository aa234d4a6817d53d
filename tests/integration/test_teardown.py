# SPDX-License-Identifier: Apache-2.0
"""Timed launches whose context is torn down before their GPU time was read back.

The shim reads a timed launch's events later than the launch (at the thread's next timed
launch, or at exit). A program that releases its primary context right after its last launch
destroys those events on a real GPU, so the shim must read them back before the release
reaches the driver. The fake driver shows this only with FAKE_CUDA_LAZY_EVENTS=1: events then
complete only when waited for, and die with their context (CUDA_ERROR_CONTEXT_IS_DESTROYED).
"""

import re

from harness import TIME_ALL, Run, executed, nonzero

LAZY = {"FAKE_CUDA_LAZY_EVENTS": "1"}
LAUNCHES = 10
FAKE_NS_PER_LAUNCH = 5000  # tests/fixtures/native/fake_cuda.c: the fake GPU clock's step per launch
LOST = "GPU time was lost"


def test_lazy_fake_makes_events_wait_and_die_with_their_context(native, run_native):
    # GIVEN the lazy fake driver alone, without clc (the condition the other tests rely on)
    proc = run_native([native["prog_cudart"]], env=LAZY)
    # THEN a program that waits for its event still measures its one launch...
    assert proc.returncode == 0, proc.stderr
    assert "event elapsed_ms=0.005000 -> 0" in proc.stdout
    # ...and prog_teardown's launches and release all succeed
    proc = run_native([native["prog_teardown"]], env=LAZY)
    assert proc.returncode == 0, proc.stderr
    assert "release -> 0" in proc.stdout


def test_release_right_after_launches_loses_no_timing(native, clc_run):
    # GIVEN a driver whose events complete only when waited for and die with their context
    # AND a policy that times every launch
    # WHEN a program launches 10 times and at once releases its primary context (the last
    # reference: the context and its events are destroyed), never synchronizing
    run = clc_run(TIME_ALL, [native["prog_teardown"], str(LAUNCHES)], env=LAZY)
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    assert cap.complete
    # THEN every launch has its GPU time: one launch between its two events, 5000 ns of the
    # fake clock, read back before the release destroyed the events
    assert len(cap.launches) == LAUNCHES
    gpu_ns = [launch.gpu_ns for launch in cap.launches]
    assert gpu_ns == [FAKE_NS_PER_LAUNCH] * LAUNCHES, (gpu_ns, run.stderr)
    for stats in cap.stats.values():
        assert stats.timed == stats.launches
        assert stats.gpu_ns == FAKE_NS_PER_LAUNCH * stats.launches
    assert sum(s.timed for s in cap.stats.values()) == LAUNCHES
    # AND clc says nothing was lost, neither on stderr nor in the capture
    assert LOST not in run.stderr, run.stderr
    assert not [m.text for m in cap.messages if LOST in m.text]


def test_context_retained_again_gets_fresh_events(native, clc_run):
    # GIVEN the lazy fake and time-all
    # WHEN a program releases its primary context and retains it again (the same handle
    # comes back, its old events dead), three times over
    run = clc_run(TIME_ALL, [native["prog_teardown"], str(LAUNCHES), "3"], env=LAZY)
    assert run.proc.returncode == 0, run.stderr
    # THEN the launches of every round are timed: no event of a dead context is reused
    gpu_ns = [launch.gpu_ns for launch in run.capture().launches]
    assert gpu_ns == [FAKE_NS_PER_LAUNCH] * (3 * LAUNCHES), (gpu_ns, run.stderr)
    assert LOST not in run.stderr


def test_program_output_is_unchanged(native, clc_run, run_native):
    # GIVEN the lazy fake and the time-all policy
    # WHEN prog_teardown runs under clc-run and on its own
    run = clc_run(TIME_ALL, [native["prog_teardown"], str(LAUNCHES)], env=LAZY)
    alone = run_native([native["prog_teardown"], str(LAUNCHES)], env=LAZY)
    # THEN it prints exactly what it prints without clc: every launch and the release succeed
    assert run.proc.returncode == alone.returncode == 0, run.stderr
    assert run.stdout == alone.stdout
    launches = re.findall(r"^launch \S+ via cuLaunchKernel -> (-?\d+)$", run.stdout, re.M)
    assert launches == ["0"] * LAUNCHES
    assert re.findall(r"^release -> (-?\d+)$", run.stdout, re.M) == ["0"]
    # AND the driver ran every launch once, as the capture counts them
    assert nonzero(run.fake_counts()) == {"_Z6vecAddPKfS0_Pfi": LAUNCHES}
    assert executed(run.capture()) == nonzero(run.fake_counts())
    assert Run(alone, None).fake_counts() == run.fake_counts()


def test_a_context_released_for_good_has_its_kernels_decided_anew(native, clc_run):
    # GIVEN a program that releases its primary context for good and retains it again, three
    # times, launching vecAdd in each life of the context (the driver may hand a dead
    # context's handles to new kernels)
    run = clc_run("version: 1\ndefault: allow\n", [native["prog_teardown"], "2", "3"])
    assert run.proc.returncode == 0, run.stderr
    # THEN each life's vecAdd was a first sight of its own: the release forgot the decisions
    cap = run.capture()
    firsts = [k for k in cap.kernels.values() if k.mangled.startswith("_Z6vecAdd")]
    assert len(firsts) == 3, (cap.kernels, run.stderr)

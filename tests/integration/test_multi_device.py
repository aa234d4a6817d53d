# SPDX-License-Identifier: Apache-2.0
"""cuLaunchCooperativeKernelMultiDevice over the fake driver: one call launches in several
contexts (one per device on a GPU), of which at most one is current. Each launch is decided,
counted and timed in its own stream's context; a refused launch refuses the whole call."""

from harness import DENY_DEBUG_ONLY, TIME_ALL, fake_counts, nonzero

MULTI = "cuLaunchCooperativeKernelMultiDevice"


def by_name(capture):
    """kernel name -> (launches, denied, timed), summed over the kernel's contexts."""
    out = {}
    for kid, st in capture.stats.items():
        name = capture.kernels[kid].mangled
        launches, denied, timed = out.get(name, (0, 0, 0))
        out[name] = (launches + st.launches, denied + st.denied, timed + st.timed)
    return out


def test_a_refused_kernel_refuses_the_whole_call(native, clc_run, run_native):
    # GIVEN a program launching ok_kernel, then debug_kernel, in two contexts by one call each
    alone = run_native([native["prog_multi"]])
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert f"multi-launch debug_kernel via {MULTI} -> 0" in alone.stdout
    # WHEN it runs under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG_ONLY, [native["prog_multi"]])
    # THEN the debug call is refused and ran in neither context; ok_kernel ran in both
    assert run.proc.returncode == 0, run.stdout + run.stderr
    assert run.results() == {("ok_kernel", MULTI): [0], ("debug_kernel", MULTI): [800]}
    assert nonzero(run.fake_counts()) == {"ok_kernel": 2}
    counts = by_name(run.capture())
    assert counts["ok_kernel"][:2] == (2, 0)
    assert counts["debug_kernel"][:2] == (2, 2)


def test_each_launch_is_timed_in_its_own_context(native, clc_run, run_native):
    # GIVEN the same program; an event can be recorded only on a stream of its own context,
    # and the call's first launch is in a context that is not current
    alone = run_native([native["prog_multi"]])
    # WHEN it runs under time-all
    run = clc_run(TIME_ALL, [native["prog_multi"]])
    # THEN it runs as natively, and every launch of both contexts was timed
    assert run.proc.returncode == 0, run.stdout + run.stderr
    assert run.results() == {("ok_kernel", MULTI): [0], ("debug_kernel", MULTI): [0]}
    assert run.fake_counts() == fake_counts(alone.stdout)
    cap = run.capture()
    assert by_name(cap) == {"ok_kernel": (2, 0, 2), "debug_kernel": (2, 0, 2)}
    assert not [m.text for m in cap.messages if "GPU time was lost" in m.text]


# SPDX-License-Identifier: Apache-2.0
"""A decision belongs to its kernel: unloads, handle reuse and a full decision table.

The fake driver gives the next load an unloaded kernel's handle, as the real one does (proven on
the GPU by tests/gpu/test_trust_gpu.py); these tests check that clc decides the new kernel as
itself, and keeps deciding when its table fills.
"""

import re

import pytest

from policy_cases import deny_debug

DENY_DEBUG = deny_debug(on_error="allow")


def summary(run):
    m = re.search(r"^summary (.*)$", run.stdout, re.M)
    assert m, run.stdout + run.stderr
    return {k: int(v) for k, v in (kv.split("=") for kv in m[1].split())}


def launches(run):
    return [(m[1], int(m[2])) for m in re.finditer(r"^launch \d+ (\w+) handle=\S+ rc=(-?\d+)",
                                                   run.stdout, re.M)]


@pytest.mark.parametrize("mode", ["module", "library"])
@pytest.mark.parametrize("order", [[], ["debug-first"]])
def test_a_reused_handle_is_decided_as_its_new_kernel(native, clc_run, mode, order):
    # GIVEN a program that loads, launches and unloads ok_kernel and debug_kernel in turn, each
    # load getting the previous kernel's handle
    # WHEN it runs under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, [native["prog_reload"], mode, "20", *order])
    assert run.proc.returncode == 0, run.stdout + run.stderr
    s = summary(run)
    # THEN the handle was indeed reused, and every kernel got its own decision: ok_kernel's
    # launches ran, debug_kernel's were refused, whichever came first under that handle
    assert s["reused"] == 19
    assert (s["ok_ran"], s["ok_refused"], s["debug_ran"], s["debug_refused"]) == (10, 0, 0, 10)
    assert all(rc == (800 if name == "debug_kernel" else 0) for name, rc in launches(run))
    # AND the capture names each decided kernel anew: 20 kernel records, 10 of each name, the
    # denied ones counted under debug_kernel
    cap = run.capture()
    names = [k.mangled for k in cap.kernels.values()]
    assert sorted(names) == ["debug_kernel"] * 10 + ["ok_kernel"] * 10
    denied = {cap.kernels[kid].mangled: 0 for kid in cap.kernels}
    for kid, st in cap.stats.items():
        denied[cap.kernels[kid].mangled] += st.denied
    assert denied == {"ok_kernel": 0, "debug_kernel": 10}


def test_forgotten_kernels_never_fill_the_table(native, clc_run):
    # GIVEN 60,000 load/launch/unload cycles, each load a new handle (no reuse), more than the
    # decision table holds (65,536 slots, filled to 3/4)
    run = clc_run(DENY_DEBUG, [native["prog_reload"], "module", "60000"],
                  env={"FAKE_CUDA_NO_REUSE": "1"}, options=["--no-report"], timeout=600)
    assert run.proc.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    s = summary(run)
    # THEN the deny rule applied to the last cycles as to the first: no launch got on_error
    assert s["reused"] == 0
    assert (s["ok_ran"], s["ok_refused"], s["debug_ran"], s["debug_refused"]) == \
        (30000, 0, 0, 30000)
    assert "decision table" not in run.stderr, run.stderr


def test_live_kernels_past_the_table_are_decided_at_each_launch(native, clc_run):
    # GIVEN 50,000 modules that stay loaded: more live kernels than the table holds
    run = clc_run(DENY_DEBUG, [native["prog_reload"], "keep", "50000"],
                  env={"FAKE_CUDA_NO_REUSE": "1"}, options=["--no-report"], timeout=600)
    assert run.proc.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    s = summary(run)
    # THEN every launch was still decided by the policy, the ones past the table too
    assert (s["ok_ran"], s["ok_refused"], s["debug_ran"], s["debug_refused"]) == \
        (25000, 0, 0, 25000)
    # AND clc said once that it stopped caching
    assert run.stderr.count("the decision table is full") == 1, run.stderr[-3000:]


@pytest.mark.parametrize("mode", ["module", "library"])
def test_gpu_times_of_unloaded_kernels_are_all_counted(native, clc_run, mode):
    # GIVEN a program that times every launch and unloads each kernel right after launching it,
    # on a driver whose work completes only when waited for (as a busy GPU's)
    run = clc_run("version: 1\ndefault: allow\nrules:\n  - name: t\n    match: {kernel: '*'}\n"
                  "    action: allow\n    time: true\n", [native["prog_reload"], mode, "20"],
                  env={"FAKE_CUDA_LAZY_EVENTS": "1"})
    assert run.proc.returncode == 0, run.stdout + run.stderr
    # THEN each kernel's timed launches are all its launches, in the counts and in the records
    cap = run.capture()
    by_name = {}
    for st in cap.stats.values():
        k = cap.kernel(st.kernel_id)
        launched, timed = by_name.get(k.mangled, (0, 0))
        by_name[k.mangled] = (launched + st.launches, timed + st.timed)
    assert set(by_name) == {"ok_kernel", "debug_kernel"}, by_name
    assert all(launched == timed == 10 for launched, timed in by_name.values()), by_name
    assert cap.timing_records == 20

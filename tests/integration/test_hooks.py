# SPDX-License-Identifier: Apache-2.0
"""Python hooks (`clc-run --hooks FILE`, policy rules with `action: hook`) in real processes,
over the fake driver: every answer a hook can give, the arguments it reads (kernelParams and
extra), and how often it is asked. The hooks' failures are test_hook_failures.py's; hooks among
the policy's rules and the examples of examples/hooks, test_hooks_and_rules.py's (their shared
helpers: tests/helpers/hook_runs.py)."""

import collections
import re

import pytest

from harness import DENY_DEBUG, executed, fake_counts, kernel_launches, nonzero
from hook_runs import (ALLOW_ALL, COUNT, DEBUG, KERNELS, LAUNCH_RE, STRUCT, VECADD, args,
                       by_mangled, kernel_of, launches, logged, ok, parse_args, rcs, write_hooks)


# ---- the program itself ------------------------------------------------------------------------

def test_prog_params_runs_without_clc(native, run_native):
    # The baseline: the fake driver reads the parameter lists of prog_params' image and lays
    # them out as nvcc does, and accepts both ways of passing arguments.
    proc = run_native([native["prog_params"], "4"])
    assert proc.returncode == 0, proc.stderr
    layout = re.findall(r"^param (\S+) index=(\d+) offset=(\d+) size=(\d+)$", proc.stdout, re.M)
    assert layout == [
        (VECADD, "0", "0", "8"), (VECADD, "1", "8", "8"), (VECADD, "2", "16", "8"),
        (VECADD, "3", "24", "4"),
        (STRUCT, "0", "0", "16"), (STRUCT, "1", "16", "4"),
        (DEBUG, "0", "0", "8"),
    ]
    # An index past the end is CUDA_ERROR_INVALID_VALUE.
    assert re.findall(r"^check cuKernelGetParamInfo (\S+) index=(\d+) -> (\d+)$", proc.stdout,
                      re.M) == [(VECADD, "4", "1"), (STRUCT, "2", "1"), (DEBUG, "1", "1")]
    got = [(m[1], m[2], int(m[3])) for m in LAUNCH_RE.finditer(proc.stdout)]
    assert got == ([(VECADD, "cuLaunchKernel", 0)] * 4 + [(VECADD, "cuLaunchKernelEx", 0)] * 4
                   + [(STRUCT, "cuLaunchKernel", 0), (STRUCT, "cuLaunchKernelEx", 0)]
                   + [(DEBUG, "cuLaunchKernel", 0)] * 3)
    assert fake_counts(proc.stdout) == {VECADD: 8, STRUCT: 2, DEBUG: 3}
    forms = [(k, a["form"], a["handle"]) for k, a in parse_args(proc.stdout)]
    assert forms == ([(VECADD, "params", "kernel")] * 4 + [(VECADD, "extra", "kernel")] * 4
                     + [(STRUCT, "params", "function"), (STRUCT, "extra", "function")]
                     + [(DEBUG, "params", "kernel")] * 3)


# ---- (a) each answer a hook can give -----------------------------------------------------------

def test_hook_allow_overrides_a_deny_default(run_params, tmp_path):
    # GIVEN a policy that denies everything and a hook that allows vecAdd
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*vecAdd*")
        def let_vecadd_run(launch):
            log(launch.name)
            return clc.allow()
    """)
    run = run_params("version: 1\ndefault: deny\n", [hooks])
    ok(run)
    # THEN vecAdd runs, every launch, and the rest are refused by the default
    assert rcs(run, VECADD) == [0] * (2 * COUNT)
    assert rcs(run, STRUCT) == [800] * 2 and rcs(run, DEBUG) == [800] * 3
    assert run.fake_counts() == {VECADD: 2 * COUNT, STRUCT: 0, DEBUG: 0}
    # AND the hook was asked about vecAdd only
    assert {kernel_of(f[0]) for f in logged(tmp_path / "hooks.log")} == {VECADD}


def test_hook_allow_record_records_only_that_kernel(run_params, tmp_path):
    # GIVEN a policy that records nothing and a hook that records structArg's launches
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*structArg*")
        def record_structarg(launch):
            return clc.allow(record=True)
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    assert all(rc == 0 for _, _, rc in launches(run))
    cap = run.capture()
    # THEN the capture holds records of structArg's two launches and of nothing else
    recorded = [cap.kernels[launch.kernel_id].mangled for launch in cap.launches]
    assert recorded == [STRUCT, STRUCT]
    assert nonzero(by_mangled(cap, "recorded")) == {STRUCT: 2}
    # AND every launch is still counted
    assert kernel_launches(cap) == {VECADD: 2 * COUNT, STRUCT: 2, DEBUG: 3}
    assert executed(cap) == nonzero(run.fake_counts())


@pytest.mark.parametrize("mode", ["", "every_launch=True"])
def test_hook_deny_with_message(run_params, tmp_path, mode):
    # GIVEN a hook that denies debug kernels with a message (asked once per kernel, or at
    # every launch)
    hooks = write_hooks(tmp_path, f"""\
        @clc.on_launch(kernel="*debug*"{", " + mode if mode else ""})
        def no_debug(launch):
            return clc.deny("hooks say no to debug kernels")
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    # THEN the program sees CUDA_ERROR_NOT_PERMITTED for each debug launch, the driver never
    # sees them, and the others run
    assert rcs(run, DEBUG) == [800] * 3
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, STRUCT) == [0] * 2
    assert run.fake_counts() == {VECADD: 2 * COUNT, STRUCT: 2, DEBUG: 0}
    # AND the message is said once on stderr
    assert run.stderr.count("hooks say no to debug kernels") == 1, run.stderr
    cap = run.capture()
    assert nonzero(by_mangled(cap, "denied")) == {DEBUG: 3}


def test_hook_deny_with_error_and_kernel_regex(run_params, tmp_path):
    # A deny may name the CUresult the program gets; kernel_regex selects like kernel does.
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel_regex=r".*structArg.*")
        def no_structs(launch):
            return clc.deny("no struct arguments today", error=801)
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    assert rcs(run, STRUCT) == [801, 801]  # CUDA_ERROR_NOT_SUPPORTED
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, DEBUG) == [0] * 3
    assert run.fake_counts()[STRUCT] == 0
    assert run.stderr.count("no struct arguments today") == 1, run.stderr


def test_hook_returning_none_leaves_the_decision_to_the_policy(run_params, tmp_path):
    # GIVEN a hook with no opinion on any kernel, and a policy that denies debug kernels
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*")
        def no_opinion(launch):
            log(launch.name)
            return None
    """)
    run = run_params(DENY_DEBUG, [hooks])
    ok(run)
    # THEN the policy decides: debug denied with its rule's message, the rest recorded
    assert rcs(run, DEBUG) == [800] * 3
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, STRUCT) == [0] * 2
    assert run.stderr.count("debug kernels are not allowed here") == 1, run.stderr
    cap = run.capture()
    # (each denied launch recorded too: a kernel's first denies always are)
    assert nonzero(by_mangled(cap, "recorded")) == {VECADD: 2 * COUNT, STRUCT: 2, DEBUG: 3}
    # AND the hook was asked about every kernel first
    assert {kernel_of(f[0]) for f in logged(tmp_path / "hooks.log")} == set(KERNELS)


# ---- (b) reading the arguments -----------------------------------------------------------------

READ_ARGS = """\
    @clc.on_launch(kernel="*vecAdd*", every_launch=True)
    def read_vecadd(launch):
        p = launch.params
        log("vecAdd", launch.grid.blocks, launch.block.threads, hex(p[0].as_ptr()),
            hex(p[1].as_ptr()), hex(p[2].as_ptr()), p[3].as_int(), p[3].as_uint())


    @clc.on_launch(kernel="*structArg*", every_launch=True)
    def read_structarg(launch):
        a, b, c = launch.params[0].as_struct("<ifd")  # struct Point {int a; float b; double c;}
        log("structArg", launch.grid.blocks, launch.block.threads, a, repr(b), repr(c),
            repr(launch.params[1].as_float()))


    @clc.on_launch(kernel="*debug_kernel*", every_launch=True)
    def read_debug(launch):
        p = launch.params[0]
        log("debug_kernel", launch.grid.blocks, launch.block.threads, hex(p.as_ptr()),
            p.as_uint())
"""


def test_hooks_read_ints_floats_pointers_and_structs_both_ways(run_params, tmp_path):
    # GIVEN hooks that write down every argument of every launch (and return None)
    hooks = write_hooks(tmp_path, READ_ARGS)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    assert all(rc == 0 for _, _, rc in launches(run))
    # WHEN the program passed them through kernelParams and through extra
    passed = args(run)
    assert {(k, a["form"]) for k, a in passed} == {
        (VECADD, "params"), (VECADD, "extra"), (STRUCT, "params"), (STRUCT, "extra"),
        (DEBUG, "params")}
    # THEN the hooks read exactly what was passed, launch by launch, in order
    expected = []
    for kernel, a in passed:
        shape = [a["grid"], a["block"]]
        if kernel == VECADD:
            expected.append(["vecAdd", *shape, a["a"], a["b"], a["c"], a["n"], a["n"]])
        elif kernel == STRUCT:
            expected.append(["structArg", *shape, a["p.a"], repr(float(a["p.b"])),
                             repr(float(a["p.c"])), repr(float(a["f"]))])
        else:
            expected.append(["debug_kernel", *shape, a["p"], str(int(a["p"], 16))])
    got = logged(tmp_path / "hooks.log")
    for kernel in ("vecAdd", "structArg", "debug_kernel"):
        assert [g for g in got if g[0] == kernel] == [e for e in expected if e[0] == kernel]
    assert len(got) == len(expected) == 2 * COUNT + 2 + 3


def test_arguments_the_driver_would_refuse_are_reported_to_the_hook(clc_run, native, run_native,
                                                                   tmp_path):
    # GIVEN a hook asked at every debug_kernel launch that writes down what reading p gives
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*debug_kernel*", every_launch=True)
        def read_p(launch):
            try:
                log(launch.grid.x, hex(launch.params[0].as_ptr()))
            except clc.HookError as e:
                log(launch.grid.x, str(e))
    """)
    # WHEN prog_params also launches it with a NULL kernelParams entry, an extra with an
    # unknown key and an extra buffer too short for p
    run = clc_run(ALLOW_ALL, [native["prog_params"], "1", "bad"], options=["--hooks", str(hooks)],
                  env={"CLC_TEST_OUT": str(tmp_path / "hooks.log")})
    ok(run)
    # THEN the three good launches read p, and each bad one gives the hook the reason
    got = logged(tmp_path / "hooks.log")
    assert got[:3] == [["1", "0x730000000000"], ["2", "0x730000000100"], ["3", "0x730000000200"]]
    assert got[3:] == [
        ["9", "param 0: the launch's kernelParams holds a NULL pointer"],
        ["9", "param 0: the launch's extra is malformed (an unknown key, no CU_LAUNCH_PARAM_END "
              "within 64 pairs, or no CU_LAUNCH_PARAM_BUFFER_POINTER)"],
        ["9", "param 0 (offset 0, 8 bytes) lies beyond the 4-byte argument buffer that `extra` "
              "gives"],
    ]
    # AND the driver answered those launches as it does without clc
    alone = run_native([native["prog_params"], "1", "bad"])
    rcs = [(m[1], m[2], int(m[3])) for m in LAUNCH_RE.finditer(alone.stdout)]
    assert launches(run) == rcs and rcs[-2:] == [(DEBUG, "cuLaunchKernelEx", 1)] * 2


def test_argument_reading_survives_a_deny(run_params, tmp_path):
    # A hook that decides on an argument: vecAdd launches with n above 700, in both forms.
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*vecAdd*", every_launch=True)
        def big_n(launch):
            n = launch.params[3].as_int()
            return clc.deny(f"n={n} is too big") if n > 700 else clc.allow()
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    ns = [int(a["n"]) for k, a in args(run) if k == VECADD]
    assert rcs(run, VECADD) == [800 if n > 700 else 0 for n in ns]
    assert run.fake_counts()[VECADD] == sum(n <= 700 for n in ns) == 14


# ---- (c) how often a hook is asked -------------------------------------------------------------

SHAPES = {  # kernel -> grid x of each launch, in order (prog_params with COUNT)
    VECADD: list(range(1, COUNT + 1)) * 2,
    STRUCT: [1, 2],
    DEBUG: [1, 2, 3],
}


@pytest.mark.parametrize("mode", ["", "per_shape=True", "every_launch=True"])
def test_hook_caching_modes(run_params, tmp_path, mode):
    # GIVEN a hook that writes down each time it is asked
    hooks = write_hooks(tmp_path, f"""\
        @clc.on_launch(kernel="*"{", " + mode if mode else ""})
        def count_calls(launch):
            log(launch.name, launch.grid.blocks, launch.block.threads)
            return clc.allow()

        @clc.on_exit
        def summary(stats):
            h = stats.hooks["hooks.py:count_calls"]
            log("exit", h.calls, int(h.total_ns > 0), int(h.max_ns > 0))
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    assert all(rc == 0 for _, _, rc in launches(run))
    got = logged(tmp_path / "hooks.log")
    # AND the exit statistics count every call of the hook, with its time
    assert got[-1] == ["exit", str(len(got) - 1), "1", "1"]
    calls = collections.Counter((kernel_of(f[0]), int(f[1])) for f in got[:-1])
    per_kernel = collections.Counter()
    for (kernel, _), n in calls.items():
        per_kernel[kernel] += n
    if not mode:
        # THEN by default once per kernel, however many launches (vecAdd: 24)
        assert dict(per_kernel) == {VECADD: 1, STRUCT: 1, DEBUG: 1}
        assert calls[(VECADD, 1)] == 1  # asked at the first launch
    elif mode.startswith("per_shape"):
        # per_shape: once per distinct (grid, block, shared memory)
        assert dict(calls) == {(k, g): 1 for k, grids in SHAPES.items() for g in set(grids)}
    else:
        # every_launch: at every launch
        assert dict(calls) == {(k, g): grids.count(g) for k, grids in SHAPES.items()
                               for g in set(grids)}
        assert dict(per_kernel) == {VECADD: 2 * COUNT, STRUCT: 2, DEBUG: 3}

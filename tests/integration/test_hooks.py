# SPDX-License-Identifier: Apache-2.0
"""Python hooks (`clc-run --hooks FILE`, policy rules with `action: hook`) in real processes,
over the fake driver: every answer a hook can give, the arguments it reads (kernelParams and
extra), how often it is asked, its failures, its place among the policy's rules, and the
examples of examples/hooks.

Most tests run prog_params (tests/fixtures/native/prog_params.c), which prints an `arg` line before
every launch saying what it passed; the hooks write what they read into a file named by
$CLC_TEST_OUT, and the tests compare the two.
"""

import collections
import os
import re
import subprocess
import sys
import textwrap

import pytest

from clc import abi
from harness import (DENY_DEBUG, ROOT, clc_command, env_for, executed, kernel_launches,
                     nonzero)

VECADD = "_Z6vecAddPKfS0_Pfi"
STRUCT = "_Z9structArg5Pointf"
DEBUG = "_Z12debug_kernelPi"
KERNELS = (VECADD, STRUCT, DEBUG)
EXAMPLES = ROOT / "examples" / "hooks"

ALLOW_ALL = """\
version: 1
default: allow
on_error: allow
"""

COUNT = 12  # prog_params' vecAdd launches per form: 2*COUNT in all, COUNT distinct grids
LAUNCH_RE = re.compile(r"^launch (\S+) via (\S+) -> (-?\d+)$", re.M)


# ---- helpers -----------------------------------------------------------------------------------

def kernel_of(name):
    """The mangled name of prog_params' kernel that a hook's launch.name (mangled or
    demangled) stands for."""
    for mangled, word in ((VECADD, "vecAdd"), (STRUCT, "structArg"), (DEBUG, "debug_kernel")):
        if word in name:
            return mangled
    raise AssertionError(f"a hook saw a kernel prog_params does not launch: {name!r}")


def write_hooks(tmp_path, body, name="hooks.py"):
    """A hook file: the helpers every test hook uses, then body."""
    path = tmp_path / name
    path.write_text(textwrap.dedent("""\
        import os

        import clc


        def log(*fields):
            # One line per call into $CLC_TEST_OUT, tab-separated (launch.name is the
            # demangled name, with spaces), appended at once.
            with open(os.environ["CLC_TEST_OUT"], "a") as f:
                f.write("\\t".join(str(x) for x in fields) + "\\n")

    """) + textwrap.dedent(body))
    return path


def logged(path):
    """The lines the hooks wrote, split into fields."""
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def launches(run):
    """(kernel, entry, rc) of every launch prog_params printed, in order."""
    return [(m[1], m[2], int(m[3])) for m in LAUNCH_RE.finditer(run.stdout)]


def args(run):
    """(kernel, {field: value}) of every `arg` line prog_params printed, in order."""
    return parse_args(run.stdout)


def parse_args(stdout):
    out = []
    for m in re.finditer(r"^arg (\S+) (.*)$", stdout, re.M):
        out.append((m[1], dict(kv.split("=", 1) for kv in m[2].split())))
    return out


def rcs(run, kernel):
    return [rc for k, _, rc in launches(run) if k == kernel]


def by_mangled(cap, attr):
    out = collections.Counter()
    for kid, stats in cap.stats.items():
        out[cap.kernels[kid].mangled] += getattr(stats, attr)
    return dict(out)


@pytest.fixture
def run_params(clc_run, native, tmp_path):
    """prog_params COUNT under clc-run with the policy text and hook files given; the hooks'
    log is tmp_path/hooks.log ($CLC_TEST_OUT)."""

    def run(policy, hooks=(), env=None, count=COUNT, options=()):
        opts = [o for h in hooks for o in ("--hooks", str(h))] + list(options)
        return clc_run(policy, [native["prog_params"], str(count)], options=opts,
                       env={"CLC_TEST_OUT": str(tmp_path / "hooks.log"), **(env or {})})

    return run


def ok(run):
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}\n{run.stderr}"
    assert "fake:" in run.stdout, run.stderr


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
    fake = {m[1]: int(m[2]) for m in re.finditer(r"^fake: (\S+) launches=(\d+)", proc.stdout,
                                                 re.M)}
    assert fake == {VECADD: 8, STRUCT: 2, DEBUG: 3}
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


# ---- (d) a hook that raises --------------------------------------------------------------------

@pytest.mark.parametrize("on_error, expect", [("allow", 0), ("deny", 800)])
@pytest.mark.parametrize("mode", ["", "every_launch=True"])
def test_hook_exception_gives_on_error(run_params, tmp_path, on_error, expect, mode):
    # GIVEN a hook that raises for debug kernels
    hooks = write_hooks(tmp_path, f"""\
        @clc.on_launch(kernel="*debug*"{", " + mode if mode else ""})
        def explode_on_debug(launch):
            raise ValueError("boom from a hook")
    """)
    policy = f"version: 1\ndefault: allow\non_error: {on_error}\n"
    run = run_params(policy, [hooks])
    # THEN the program runs to the end
    ok(run)
    # AND the debug launches get the policy's on_error, the others run
    assert rcs(run, DEBUG) == [expect] * 3
    assert rcs(run, VECADD) == [0] * (2 * COUNT) and rcs(run, STRUCT) == [0] * 2
    assert run.fake_counts()[DEBUG] == (3 if expect == 0 else 0)
    # AND the failure is reported once, with the hook's name and the traceback (clc-run's
    # summary at exit lists it again among the capture's messages, without the traceback)
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
    assert re.findall(r"^ValueError: boom from a hook$", run.stderr, re.M) == \
        ["ValueError: boom from a hook"], run.stderr
    assert re.search(r"^clc: .*explode_on_debug.*boom from a hook", run.stderr, re.M), run.stderr
    assert f'File "{hooks}", line' in run.stderr  # the traceback's frame in the hook file


# (mode, policy default, on_error, what debug_kernel's launches return). An every_launch hook
# followed by an allowing default is called through the engine's folded dispatcher; before a
# deny default, through its generic one, and there on_error: allow is what tells the two
# outcomes apart.
ENDING_HOOKS = {
    "cached": ("", "allow", "deny", 800),
    "per_shape": ("per_shape=True", "allow", "deny", 800),
    "every_launch": ("every_launch=True", "allow", "deny", 800),
    "every_launch_generic": ("every_launch=True", "deny", "allow", 0),
}


@pytest.mark.parametrize("how", sorted(ENDING_HOOKS))
def test_hook_that_calls_sys_exit_is_a_hook_failure(run_params, tmp_path, how):
    mode, default, on_error, expect = ENDING_HOOKS[how]
    # GIVEN a hook that calls sys.exit(3) when asked about debug_kernel
    hooks = write_hooks(tmp_path, f"""\
        import sys

        @clc.on_launch(kernel="*debug*"{", " + mode if mode else ""})
        def quit_on_debug(launch):
            sys.exit(3)
    """)
    run = run_params(f"version: 1\ndefault: {default}\non_error: {on_error}\n", [hooks])
    # THEN the program runs to its end and exits with its own status, not the hook's
    ok(run)
    # AND debug_kernel's launches get the policy's on_error
    assert rcs(run, DEBUG) == [expect] * 3
    assert run.fake_counts().get(DEBUG, 0) == (3 if expect == 0 else 0)
    # AND the failure is reported once, naming the hook and saying that it called sys.exit
    assert re.search(r"^clc: hook hooks\.py:quit_on_debug called sys\.exit\(3\) at a launch of "
                     rf"debug_kernel\(int\*\); its launches get on_error={on_error} \(a hook "
                     r"cannot end the program: it goes on\)$", run.stderr, re.M), run.stderr
    assert run.stderr.count("Traceback (most recent call last)") == 1, run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_hook_that_raises_keyboard_interrupt_is_a_hook_failure(run_params, tmp_path):
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*debug*", every_launch=True)
        def interrupt(launch):
            raise KeyboardInterrupt
    """)
    run = run_params("version: 1\ndefault: allow\non_error: deny\n", [hooks])
    ok(run)
    assert rcs(run, DEBUG) == [800] * 3
    assert re.search(r"^clc: hook hooks\.py:interrupt raised KeyboardInterrupt at a launch of "
                     r"debug_kernel\(int\*\); its launches get on_error=deny", run.stderr,
                     re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


EXITING = """\
    import sys

    @clc.on_exit
    def leave(stats):
        sys.exit(3)

    @clc.on_exit
    def after(stats):
        log("after", stats.total.launches)
"""


def test_exit_hook_that_calls_sys_exit_leaves_the_exit_status_alone(run_params, tmp_path):
    # GIVEN an on_exit hook that calls sys.exit(3), and another after it
    hooks = write_hooks(tmp_path, EXITING)
    run = run_params(ALLOW_ALL, [hooks])
    # THEN the program's exit status is its own
    ok(run)
    # AND the next on_exit hook still runs, with every launch counted
    assert logged(tmp_path / "hooks.log") == [["after", str(2 * COUNT + 5)]]
    # AND the failure is reported, naming the hook
    assert re.search(r"^clc: on_exit hook hooks\.py:leave called sys\.exit\(3\) \(ignored: the "
                     r"program's exit status stays its own\)$", run.stderr, re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_exit_hook_that_calls_sys_exit_in_a_python_program(clc_run, tmp_path):
    from build import PYHOST
    # GIVEN a Python program (clc's engine joins its interpreter) and the same exit hooks
    hooks = write_hooks(tmp_path, EXITING)
    run = clc_run(ALLOW_ALL, [sys.executable, PYHOST], options=["--hooks", str(hooks)],
                  env={"CLC_TEST_OUT": str(tmp_path / "hooks.log")})
    # THEN its exit status is its own too, and the next exit hook runs
    ok(run)
    assert [f[0] for f in logged(tmp_path / "hooks.log")] == ["after"]
    assert re.search(r"^clc: on_exit hook hooks\.py:leave called sys\.exit\(3\)", run.stderr,
                     re.M), run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


def test_what_hooks_print_reaches_a_pipe(run_params, tmp_path):
    # GIVEN a C program (clc starts its own Python in it) whose stdout is a pipe, and hooks
    # that print
    hooks = write_hooks(tmp_path, """\
        @clc.on_launch(kernel="*vecAdd*")
        def note(launch):
            print("hook saw", launch.base)

        @clc.on_exit
        def summary(stats):
            print(f"on_exit: {stats.total.launches} launches")
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    lines = run.stdout.splitlines()
    # THEN what they printed is in the program's stdout, the exit hook's line after everything
    # the program printed
    assert "hook saw vecAdd" in lines
    assert lines[-1] == f"on_exit: {2 * COUNT + 5} launches", run.stdout[-2000:]
    assert lines.index("hook saw vecAdd") > max(i for i, line in enumerate(lines)
                                                if line.startswith("fake:"))


def test_every_launch_hook_that_is_slow_or_answers_wrongly_is_reported(run_params, tmp_path):
    # GIVEN an every_launch hook on debug_kernel that takes 5 ms at its first launch and
    # answers something that is not a decision at its second
    hooks = write_hooks(tmp_path, """\
        import time
        calls = []

        @clc.on_launch(kernel="*debug*", every_launch=True)
        def moody(launch):
            calls.append(1)
            if len(calls) == 1:
                time.sleep(0.005)
            if len(calls) == 2:
                return "allow"
            return None
    """)
    run = run_params("version: 1\ndefault: allow\non_error: deny\n", [hooks])
    ok(run)
    # THEN the slow call is reported with its time, the wrong answer with what it was, and
    # that launch gets on_error; the others run
    assert re.search(r"^clc: .*hook hooks.py:moody took [5-9]\.\d ms at a launch of "
                     r"debug_kernel", run.stderr, re.M), run.stderr
    assert re.search(r"hook hooks.py:moody returned 'allow'; expected", run.stderr), run.stderr
    assert rcs(run, DEBUG) == [0, 800, 0]


def test_a_kept_launch_keeps_its_fields_and_refuses_argument_reads(run_params, tmp_path):
    # GIVEN an every_launch hook that keeps every Launch of vecAdd (against the docs' advice)
    # and one that keeps only the Param of n
    hooks = write_hooks(tmp_path, """\
        kept, params = [], []

        @clc.on_launch(kernel="*vecAdd*", every_launch=True)
        def keep(launch):
            kept.append(launch)
            params.append(launch.params[3])
            log("n", launch.params[3].as_int())

        @clc.on_exit
        def later(stats):
            for launch in kept:
                try:
                    launch.params[3].as_int()
                    read = "read"
                except clc.HookError as e:
                    read = "refused" if "valid only during the hook call" in str(e) else str(e)
                log("kept", launch.grid.x, read)
            log("param", sum(1 for p in params if _refuses(p)))

        def _refuses(param):
            try:
                param.as_int()
                return False
            except clc.HookError:
                return True
    """)
    run = run_params(ALLOW_ALL, [hooks])
    ok(run)
    got = logged(tmp_path / "hooks.log")
    # THEN each launch's hook read its own n, and each kept Launch still gives its own grid
    # but refuses to read arguments after its hook returned; so do the kept Params
    assert [int(g[1]) for g in got if g[0] == "n"] == [100 * (i + 1) for i in range(COUNT)] * 2
    assert [g[1:] for g in got if g[0] == "kept"] == \
        [[str(i + 1), "refused"] for i in range(COUNT)] * 2
    assert [g[1] for g in got if g[0] == "param"] == [str(2 * COUNT)]


# ---- (e) a hook file that does not import ------------------------------------------------------

BROKEN = {
    # kind -> (file text, the line at fault)
    "raises": ("import clc\n\n\n\nraise RuntimeError('this hook file is broken')\n", 5),
    "syntax": ("import clc\n\n\ndef oops(launch:\n    return None\n", 4),
    "import": ("import clc\nimport clc_no_such_module_anywhere\n", 2),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
@pytest.mark.parametrize("via", ["--hooks", "rule"])
def test_hook_file_that_does_not_import_stops_clc_run(clc_run, tmp_path, native, kind, via):
    text, line = BROKEN[kind]
    hooks = tmp_path / "broken_hooks.py"
    hooks.write_text(text)
    marker = tmp_path / "program-started"
    if via == "--hooks":
        policy, options = ALLOW_ALL, ["--hooks", str(hooks)]
    else:
        policy = ALLOW_ALL + f"""\
rules:
  - name: ask-python
    match: {{kernel: "*"}}
    action: hook
    hook: {hooks}:oops
"""
        options = []
    run = clc_run(policy, ["/bin/sh", "-c", f'touch "{marker}"; exec "$0" 2',
                           native["prog_params"]], options=options)
    # THEN clc-run stops with status 2 before the program starts
    assert run.proc.returncode == 2, (run.proc.returncode, run.stderr)
    assert not marker.exists()
    assert "fake:" not in run.stdout
    # AND says which file and which line
    assert str(hooks) in run.stderr or hooks.name in run.stderr, run.stderr
    assert re.search(rf"\bline {line}\b|:{line}\b", run.stderr), run.stderr


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

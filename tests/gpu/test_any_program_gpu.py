# SPDX-License-Identifier: Apache-2.0
"""Programs that build their GPU work in ways beyond plain launches, on the real driver, under
confining and wrapping rules: conditional graph nodes (every body kind, filled by the graph API,
by capture, nested, a child graph), contexts the program makes (cuCtxCreate), cooperative
grids (on one device, and on every device in one cuLaunchCooperativeKernelMultiDevice call),
and programs that end within a millisecond of their first launch (a SASS-only kernel, a
dynamic-parallelism kernel, an NVRTC cubin). Each keeps its own result under every policy.

examples/conditional_graphs.cu, coop_grid.cu, coop_multi.cu, short_lived.cu, short_nvrtc.cpp,
contexts.c.
"""

import os
import re
from pathlib import Path

import pytest

from gpu_runs import (EXAMPLES, assert_capture_ok, build_example, build_or_fail, program_policy,
                      write_policy)

pytestmark = pytest.mark.gpu

SMS = 16


def share_policy(path, glob="*", params=None, on_unwrappable="allow"):
    return write_policy(path, [("confine", glob, "wrap",
                                {"wrapper": "sm_share", "params": params or {"sms": SMS},
                                 "on_unwrappable": on_unwrappable})])


def wrap_policy(path, wrapper):
    params = {"ms": 1000} if wrapper == "deadline" else {"share": 0.5} \
        if wrapper == "sm_share" else {}
    return write_policy(path, [("every", "*", "wrap",
                                {"wrapper": wrapper, "params": params,
                                 "on_unwrappable": "allow", "record": True})])


def messages(report):
    return [m["text"] for m in report["messages"]]


# ---- conditional graphs -------------------------------------------------------------------

@pytest.fixture(scope="module")
def conditional_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "conditional_graphs")


def conds(stdout):
    return {m[1]: (int(m[2]), int(m[3]), int(m[4])) for m in re.finditer(
        r"^cond (\S+) instantiate=(-?\d+) count=(-?\d+) expected=(-?\d+)$", stdout, re.M)}


CASES = ("while-api", "while-capture", "if-else", "switch", "nested", "child", "plain-generic")


@pytest.mark.parametrize("scope", ["kernel", "program"])
def test_conditional_graphs_keep_their_results_confined(conditional_bin, run_native, run_clc,
                                                        tmp_path, tools, scope):
    # GIVEN a program of conditional graphs whose bodies are filled every way
    native = run_native([conditional_bin])
    assert native.returncode == 0, tools.describe(native)
    assert set(conds(native.stdout)) == set(CASES)
    # WHEN every kernel is confined to 16 SMs, per kernel or program-wide
    policy = (share_policy(tmp_path / "p.yaml") if scope == "kernel"
              else program_policy(tmp_path / "p.yaml", {"sms": SMS}, on_unwrappable="allow"))
    proc, report = run_clc(policy, [conditional_bin], tmp_path)
    # THEN every graph instantiates and counts as it does alone
    assert proc.returncode == 0, tools.describe(proc)
    got = conds(proc.stdout)
    assert got == conds(native.stdout), tools.describe(proc)
    assert all(inst == 0 and n == want for inst, n, want in got.values()), got
    assert_capture_ok(report, proc)
    text = messages(report)
    # AND the body kernels were left in the program's context, said once; the plain graph's
    # node ran confined (a cudart program keeps its context under scope: program too, and is
    # confined one launch at a time there)
    assert sum("in a conditional node's body is not confined" in m for m in text) == 1, text
    count = [k for k in report["kernels"] if k["name"].startswith("count(")]
    assert count and count[0]["confined_sms"] == [SMS], report["kernels"]
    if scope == "program":
        assert sum("is confined one launch at a time" in m for m in text) == 1, text


@pytest.mark.parametrize("on_unwrappable", ["deny"])
def test_conditional_bodies_refused_by_deny(conditional_bin, run_clc, tmp_path, tools,
                                            on_unwrappable):
    # GIVEN the body kernels confined with on_unwrappable: deny
    policy = share_policy(tmp_path / "p.yaml", glob="count*", on_unwrappable=on_unwrappable)
    proc, report = run_clc(policy, [conditional_bin], tmp_path)
    got = conds(proc.stdout)
    # THEN the kernel never runs outside its share: in bodies its nodes are refused (the
    # program sees the graph without them), in the plain graph it runs confined
    assert got["plain-generic"] == (0, 1, 1), tools.describe(proc)
    assert got["while-api"][1] == 0 and got["if-else"][1] == 0, got


# ---- contexts the program makes -----------------------------------------------------------

@pytest.fixture(scope="module")
def contexts_bin(nvcc, build_dir):
    exe = build_dir / "contexts"
    build_or_fail("contexts", [[nvcc, "-O2", "-o", exe, EXAMPLES / "contexts.c", "-lcuda"]])
    return exe


@pytest.mark.parametrize("scope", ["kernel", "program"])
def test_contexts_the_program_makes_are_confined(contexts_bin, driver_api_bin, run_clc,
                                                 tmp_path, tools, scope):
    # GIVEN a program whose kernels run in three contexts it makes (cuCtxCreate), modules
    # loaded in each
    _, ptx = driver_api_bin
    policy = (share_policy(tmp_path / "p.yaml", on_unwrappable="deny") if scope == "kernel"
              else program_policy(tmp_path / "p.yaml", {"sms": SMS}))
    proc, report = run_clc(policy, [contexts_bin, "run", ptx, 3], tmp_path)
    # THEN its results are right, and its kernel ran confined in every context (deny: a launch
    # that could not be confined would have failed the program)
    assert proc.returncode == 0, tools.describe(proc)
    assert proc.stdout.count(" ok") == 3, tools.describe(proc)
    sms = [k["confined_sms"] for k in report["kernels"]]
    assert sms and all(s and s[0] == SMS for s in sms), report["kernels"]
    assert not any("refused" in m or "could not" in m for m in messages(report))


# ---- cooperative grids --------------------------------------------------------------------

@pytest.fixture(scope="module")
def coop_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "coop_grid")


@pytest.mark.parametrize("how", ["launch", "ex"])
def test_cooperative_grids(coop_bin, run_clc, tmp_path, tools, how):
    # GIVEN a cooperative kernel confined to 16 SMs
    policy = share_policy(tmp_path / "p.yaml", glob="grid_sum*")
    # WHEN it is launched with 16 blocks
    small, rep_small = run_clc(policy, [coop_bin, "small", how], tmp_path)
    # THEN it ran confined, with the right sum
    assert small.returncode == 0, tools.describe(small)
    assert [k["confined_sms"] for k in rep_small["kernels"]] == [[SMS]], rep_small["kernels"]
    assert "coop small blocks=16 rc=0" in small.stdout, tools.describe(small)
    # WHEN it is launched with a grid the whole GPU holds at once
    whole, rep_whole = run_clc(policy, [coop_bin, "whole", how], tmp_path)
    # THEN it ran on the whole GPU (on_unwrappable: allow) with the right sum, and the numbers
    # were said once
    assert whole.returncode == 0, tools.describe(whole)
    text = messages(rep_whole)
    assert sum(re.search(rf"a cooperative grid of \d+ blocks cannot be resident on a partition "
                         rf"of {SMS} SMs", m) is not None for m in text) == 1, text


@pytest.fixture(scope="module")
def coop_multi_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "coop_multi")


MULTI_CALL = re.compile(r"^multi (\w+) devices=(\d+) rc=(-?\d+) sums=([-\d,]+)$", re.M)


def multi_calls(stdout):
    """{kernel: (devices, CUresult, [sum per device])} of coop_multi's output."""
    return {m[1]: (int(m[2]), int(m[3]), [int(x) for x in m[4].split(",")])
            for m in MULTI_CALL.finditer(stdout)}


def test_multi_device_cooperative_launches_are_decided(coop_multi_bin, run_native, run_clc,
                                                       tmp_path, tools):
    # GIVEN cooperative kernels launched on every device by one
    # cuLaunchCooperativeKernelMultiDevice call each, found through cuGetProcAddress
    argv = [coop_multi_bin, "ok_kernel", "debug_kernel"]
    native = run_native(argv)
    assert native.returncode == 0, tools.describe(native)
    if "multi unsupported" in native.stdout:
        pytest.skip(f"this driver or device: {native.stdout.strip()}")
    n = multi_calls(native.stdout)["ok_kernel"][0]
    ran = {"ok_kernel": (n, 0, [8] * n), "debug_kernel": (n, 0, [16] * n)}
    assert multi_calls(native.stdout) == ran, tools.describe(native)
    # WHEN they run under a policy that denies debug kernels
    deny, report = run_clc(tools.deny_policy(tmp_path / "deny.yaml", "debug_kernel"), argv,
                           tmp_path)
    # THEN the debug call is refused (CUDA_ERROR_NOT_PERMITTED) and ran on no device, and
    # ok_kernel ran on every device
    assert deny.returncode == 0, tools.describe(deny)
    assert multi_calls(deny.stdout) == {"ok_kernel": ran["ok_kernel"],
                                        "debug_kernel": (n, 800, [0] * n)}, tools.describe(deny)
    tools.assert_capture_ok(report, deny)
    tools.assert_counts(report, {"ok_kernel": n, "debug_kernel": n}, run=deny,
                        denied={"debug_kernel"})
    # WHEN they run under audit and under time-all
    for policy in ("audit.yaml", "time-all.yaml"):
        proc, report = run_clc(policy, argv, tmp_path)
        # THEN the results are native's, and each device's launch is counted and recorded
        assert proc.returncode == 0, tools.describe(proc)
        assert multi_calls(proc.stdout) == ran, tools.describe(proc)
        tools.assert_capture_ok(report, proc)
        tools.assert_counts(report, {"ok_kernel": n, "debug_kernel": n}, run=proc)
        assert len(tools.launch_rows(report, "ok_kernel")) == n, tools.report_summary(report)
    # AND under time-all every launch was timed
    tools.assert_all_timed(report, ["ok_kernel", "debug_kernel"], run=proc)


# ---- programs that end right after their first launch -----------------------------------

@pytest.fixture(scope="module")
def short_bins(nvcc, build_dir):
    exe = build_dir / "short_lived"
    build_or_fail("short_lived", [[nvcc, "-O2", "-gencode", "arch=compute_90,code=sm_90",
                                   "-rdc=true", "-o", exe, EXAMPLES / "short_lived.cu",
                                   "-lcudadevrt"]])
    nvrtc = build_dir / "short_nvrtc"
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    build_or_fail("short_nvrtc", [["g++", "-O2", "-o", nvrtc, EXAMPLES / "short_nvrtc.cpp",
                            f"-I{home / 'include'}", f"-L{home / 'lib64'}", "-lnvrtc",
                            "-lcuda"]])
    return {"lived": exe, "nvrtc": nvrtc}


SHORT = [("lived", "sync"), ("lived", "nosync"), ("lived", "thread"), ("lived", "_exit"),
         ("lived", "dp"), ("nvrtc", None)]


@pytest.mark.parametrize("wrapper", ["block_count", "deadline", "sm_share"])
@pytest.mark.parametrize("prog,mode", SHORT)
def test_short_programs_end_cleanly(short_bins, run_native, run_clc, tmp_path, tools, wrapper,
                                    prog, mode):
    argv = [short_bins[prog]] + ([mode] if mode else [])
    native = run_native(argv)
    assert native.returncode == 0, tools.describe(native)
    # WHEN every kernel is wrapped (nothing can be: SASS only) or confined, three runs
    policy = wrap_policy(tmp_path / "p.yaml", wrapper)
    for _ in range(3):
        proc, report = run_clc(policy, argv, tmp_path)
        # THEN the program ends as it does alone, with its own output, and its capture is
        # complete with its launch counted
        assert proc.returncode == 0, tools.describe(proc)
        assert proc.stdout == native.stdout, tools.describe(proc)
        assert_capture_ok(report, proc)
        assert sum(k["launches"] for k in report["kernels"]) >= 1, report["kernels"]

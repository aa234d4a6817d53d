# SPDX-License-Identifier: Apache-2.0
"""A policy over a program's whole life, on the real driver: launches from a library's
constructor and destructor and from exit handlers, from a signal handler that interrupts clc's
own work, an unload racing a load; and captures that keep every record however the process
leaves (_exit workers, a crash, SIGKILL). The programs are tests/fixtures/native's prog_life and
liblife, built against the driver (their kernels are PTX that the driver compiles)."""

import re
import shutil
import signal
import sys
from pathlib import Path

import pytest

from gpu_runs import REPO, build_or_fail, assert_capture_ok, describe, probe_driver
from policy_cases import deny_debug

NATIVE = REPO / "tests" / "fixtures" / "native"


@pytest.fixture(scope="module")
def life(nvcc, build_dir):
    """prog_life linked with liblife.so and the driver."""
    info, _ = probe_driver()
    cc = shutil.which("cc") or shutil.which("gcc")
    include = Path(nvcc).resolve().parent.parent / "include"
    if not cc or info is None or not info.libcuda:
        pytest.skip("no C compiler, or the driver library's path is unknown")
    lib = build_dir / "liblife.so"
    exe = build_dir / "prog_life"
    build_or_fail("liblife.so", [[cc, "-O2", "-shared", "-fPIC", f"-I{include}", "-I", NATIVE, "-o",
                           lib, NATIVE / "lib_life.c", info.libcuda, "-ldl"]])
    build_or_fail("prog_life", [[cc, "-O2", f"-I{include}", "-I", NATIVE, "-o", exe,
                          NATIVE / "prog_life.c", f"-L{build_dir}", "-llife", info.libcuda,
                          f"-Wl,-rpath,{build_dir}", "-lpthread", "-ldl"]])
    return exe


DENY_DEBUG = deny_debug(on_error="deny", record_rest=True)


@pytest.fixture
def deny_debug(tmp_path):
    """Denies debug kernels, records the rest; what clc cannot decide is refused."""
    path = tmp_path / "deny.yaml"
    path.write_text(DENY_DEBUG)
    return path, tmp_path


def results(stdout, via):
    return [int(m[1]) for m in re.finditer(rf"^launch \S+ via {via} -> (-?\d+)$", stdout, re.M)]


def kernels_named(report, part):
    return [k for k in report["kernels"] if part in k["mangled"]]


def test_a_library_constructors_launches_are_denied(life, run_clc, deny_debug):
    policy, tmp_path = deny_debug
    # GIVEN a library whose constructor (run before the preloaded shim's) launches a denied
    # kernel 100 times
    proc, report = run_clc(policy, [life, "plain", "1"], tmp_path, options=["--strict"],
                           env={"LIFE_CTOR": "launch", "LIFE_CTOR_N": "100"})
    # THEN every one of them was refused by clc
    assert results(proc.stdout, "ctor") == [800] * 100, describe(proc)
    # AND the capture is complete and counts them, and --strict fails the run
    assert_capture_ok(report, proc)
    assert sum(k["denied"] for k in kernels_named(report, "debug")) == 100
    assert proc.returncode == 3, describe(proc)


@pytest.mark.parametrize("via, env, argv", [
    ("atexit", {}, ["atexit", "100"]),
    ("dtor", {"LIFE_DTOR": "launch", "LIFE_DTOR_N": "100"}, ["plain", "1"]),
], ids=["exit-handler", "library-destructor"])
def test_launches_after_the_driver_shut_down_are_decided(life, run_clc, deny_debug, via, env,
                                                         argv):
    policy, tmp_path = deny_debug
    # GIVEN launches from an exit handler registered before the first CUDA call, or from a
    # library's destructor: they come after the driver's own exit work, when it can no longer
    # name a kernel
    proc, report = run_clc(policy, [life, *argv], tmp_path, env=env, options=["--strict"])
    # THEN clc decided each one as a launch it cannot decide (on_error: deny here): none ran
    assert results(proc.stdout, via) == [800] * 100, describe(proc)
    assert "could not name a launched kernel" in proc.stderr
    # AND the capture is complete, and --strict fails the run
    assert_capture_ok(report, proc)
    assert proc.returncode == 3, describe(proc)


@pytest.mark.parametrize("mode, status, ending", [
    ("quick", 0, "left with _exit(0)"),
    ("segv", 128 + signal.SIGSEGV, "ended by SIGSEGV"),
    ("abort", 128 + signal.SIGABRT, "ended by SIGABRT"),
])
def test_every_record_is_kept_however_the_process_leaves(life, run_clc, tmp_path, mode, status,
                                                        ending):
    proc, report = run_clc("audit.yaml", [life, mode, "2000"], tmp_path)
    assert proc.returncode == status, describe(proc)
    (cap,) = report["captures"]
    assert cap["complete"] and cap["ending"] == ending, cap
    (vecadd,) = kernels_named(report, "vecAdd")
    assert vecadd["launches"] == vecadd["recorded"] == 2000
    assert len(report["launches"]) == 2000


def test_sigkill_keeps_the_counts_of_the_last_second(life, run_clc, tmp_path):
    proc, report = run_clc("audit.yaml", [life, "kill", "2000"], tmp_path)
    assert proc.returncode == 128 + signal.SIGKILL, describe(proc)
    (cap,) = report["captures"]
    assert not cap["complete"]
    (vecadd,) = kernels_named(report, "vecAdd")
    assert vecadd["launches"] == 2000 and not vecadd["partial"]


def test_counts_survive_the_size_cap_and_sigkill(life, run_clc, deny_debug):
    policy, tmp_path = deny_debug
    # GIVEN a program that launches as fast as the GPU takes its launches for 3 s, each one
    # recorded or denied, under a capture limit of 1 MiB, and is killed by SIGKILL 1.5 s after
    # its last launch
    proc, report = run_clc(policy, [life, "flood", "3000", "1500"], tmp_path,
                           options=["--capture-limit", "1M"])
    assert proc.returncode == 128 + signal.SIGKILL, describe(proc)
    ran, refused = map(int, re.findall(r"^flood-end: ms=\d+ vecAdd=(\d+) refused=(\d+)$",
                                       proc.stdout, re.M)[-1])
    assert ran == refused > 100_000, describe(proc)
    # THEN the capture is partial (its launch records stopped at the limit), and its counts are
    # all the program's launches, not those recorded before the limit
    (cap,) = report["captures"]
    assert cap["partial"] and not cap["complete"] and cap["capped_bytes"], cap
    (vecadd,) = kernels_named(report, "vecAdd")
    (debug,) = kernels_named(report, "debug")
    assert (vecadd["launches"], debug["denied"]) == (ran, refused), (vecadd, debug)
    assert not vecadd["partial"] and not debug["partial"]
    assert report["denied_by_rule"] == [{"rule": "no-debug", "denied": refused, "partial": False}]


def test_a_signal_handler_interrupting_clc_is_decided(life, run_clc, deny_debug):
    policy, tmp_path = deny_debug
    # GIVEN a handler that launches a denied kernel, signalled every 20 us while the main thread
    # launches (and clc records each launch)
    proc, report = run_clc(policy, [life, "signals_launch", "200000"], tmp_path)
    m = re.search(r"^signals: launches=(\d+) refused=(\d+) ran=(\d+)$", proc.stdout, re.M)
    # THEN every launch from the handler was refused
    assert m and int(m[1]) > 0 and m[1] == m[2] and m[3] == "0", describe(proc)


def test_an_unload_racing_a_load_never_lends_a_decision(life, run_clc, deny_debug):
    policy, tmp_path = deny_debug
    proc, report = run_clc(policy, [life, "race", "1500"], tmp_path)
    assert "race: ok=1500 debug_ran=0 debug_refused=1500" in proc.stdout, describe(proc)


WORKERS = """\
import ctypes, multiprocessing

PTX = (b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
       b".visible .entry work_kernel(\\n)\\n{\\n\\tret;\\n}\\n")

def work(n):
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    assert cuda.cuModuleLoadData(ctypes.byref(mod), PTX) == 0
    cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"work_kernel")
    ok = sum(cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 0
             for _ in range(n))
    cuda.cuCtxSynchronize()
    return ok

if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    with multiprocessing.Pool(4) as pool:
        print("workers", sum(pool.map(work, [50] * 8)), flush=True)
"""


def test_workers_that_leave_with_exit_pass_strict(run_clc, tmp_path):
    # GIVEN Python multiprocessing workers that launch on the GPU, then leave with os._exit
    script = tmp_path / "workers.py"
    script.write_text(WORKERS)
    proc, report = run_clc("audit.yaml", [sys.executable, script], tmp_path,
                           options=["--strict"])
    # THEN their captures are complete, their launches counted, and --strict passes
    assert "workers 400" in proc.stdout, describe(proc)
    assert report["captures"] and all(c["complete"] for c in report["captures"])
    assert sum(k["launches"] for k in kernels_named(report, "work_kernel")) == 400
    assert proc.returncode == 0, describe(proc)

# SPDX-License-Identifier: Apache-2.0
"""Wrapped kernels on a real GPU: the kernel zoo under every built-in wrapper prints
what it prints unwrapped; sm_share holds a kernel to its cap of resident blocks; the wrapped
library is loaded once for many contexts; a device policy in the nvJitLink CLC demo interface
runs unchanged; the disk cache serves a second run; a long cuRAND program, whose kernels cannot be
wrapped, ends with its own status."""

import json
import math
import os
from pathlib import Path

import pytest

from gpu_runs import build_example, EXAMPLES, build_or_fail, describe, report_summary, wrap_stats
from kernel_zoo import ZOO

ZOO_PROGRAMS = sorted(p.stem for p in ZOO.glob("*.cu"))
WRAPPERS = {"sm_share": {"share": 0.25}, "block_count": {}, "deadline": {"ms": 10000}}
# Kernels the splice refuses, with the reason the run must give (on_unwrappable: allow lets
# them run unwrapped): see tests/integration/test_wrap_zoo.py for the whole table.
REFUSED = {
    ("clusters", "sm_share"): "cluster kernel", ("clusters", "block_count"): "cluster kernel",
    ("clusters", "deadline"): "cluster kernel",
    ("printf_kernel", "sm_share"): "uses the module variable",
    ("printf_kernel", "block_count"): "uses the module variable",
    ("printf_kernel", "deadline"): "uses the module variable",
    ("divergent_exit", "sm_share"): "may not loop",
    ("cooperative", "sm_share"): "cooperative kernel",
    ("cooperative", "block_count"): "cooperative kernel",
    ("cooperative", "deadline"): "cooperative kernel",
}


def _policy(path, wrapper, params, kernel="*", on_unwrappable="allow"):
    lines = ["version: 1", "default: allow", "rules:", "  - name: wrap-it",
             f"    match: {{kernel: {json.dumps(kernel)}}}", "    action: wrap",
             f"    wrapper: {wrapper}", f"    on_unwrappable: {on_unwrappable}"]
    if wrapper == "sm_share":  # the splice's tests (green contexts: test_green_gpu.py)
        lines.append("    mechanism: splice")
    if params:
        lines.append("    params: {" + ", ".join(f"{k}: {v}" for k, v in params.items()) + "}")
    Path(path).write_text("\n".join(lines) + "\n")
    return path


def _results(text):
    return [ln for ln in (text or "").splitlines() if ln.startswith(("result ", "checksum "))]


@pytest.fixture(scope="session")
def zoo_bins(nvcc, cuda_arch, build_dir):
    bins = {}
    for name in ZOO_PROGRAMS:
        exe = build_dir / f"zoo_{name}"
        build_or_fail(name, [[nvcc, "-O2", f"-arch={cuda_arch}", "-I", ZOO, "-o", exe,
                       ZOO / f"{name}.cu"]])
        bins[name] = exe
    return bins


@pytest.fixture(scope="session")
def contexts_bin(nvcc, build_dir):
    exe = build_dir / "contexts"
    build_or_fail("contexts", [[nvcc, "-O2", "-o", exe, EXAMPLES / "contexts.c", "-lcuda"]])
    return exe


@pytest.fixture
def cache_env(tmp_path):
    return {"CLC_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("program", ZOO_PROGRAMS)
def test_zoo_program_prints_the_same_wrapped(zoo_bins, run_native, run_clc, tmp_path, program,
                                             wrapper, cache_env):
    native = run_native([zoo_bins[program]])
    assert native.returncode == 0, describe(native)
    # WHEN the program runs with every kernel wrapped
    policy = _policy(tmp_path / "wrap.yaml", wrapper, WRAPPERS[wrapper])
    proc, report = run_clc(policy, [zoo_bins[program]], tmp_path, env=cache_env)
    # THEN it prints the same results and checksums, and exits the same way
    assert proc.returncode == 0, describe(proc) + "\n" + report_summary(report)
    assert _results(proc.stdout) == _results(native.stdout), describe(proc)
    stats = wrap_stats(report)
    refused = REFUSED.get((program, wrapper))
    if refused:
        # AND a kernel that cannot be wrapped ran unwrapped, and the run said why
        assert refused in proc.stderr, describe(proc)
    else:
        # AND the wrapped kernels really ran: their virtual blocks were counted
        assert stats and all(s["blocks"] > 0 for s in stats), report_summary(report)


def test_block_count_counts_every_block_and_thread(zoo_bins, run_clc, tmp_path, cache_env):
    # grid_stride launches 600 and 16385 blocks of 256 threads
    policy = _policy(tmp_path / "count.yaml", "block_count", {})
    proc, report = run_clc(policy, [zoo_bins["grid_stride"]], tmp_path, env=cache_env)
    assert proc.returncode == 0, describe(proc)
    (stats,) = wrap_stats(report)
    assert stats["blocks"] == 600 + 16385
    assert stats["threads"] == (600 + 16385) * 256
    assert stats["skipped"] == 0


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_graph_replays_run_the_wrapped_kernel_whole(zoo_bins, run_clc, tmp_path, cache_env,
                                                    wrapper):
    # graph_replay launches 16385 blocks once, captures two such launches into a CUDA graph,
    # replays it 5 times, replays a graph of two kernel nodes (the graph API) 3 times, and
    # launches once more: 18 launches' blocks
    policy = _policy(tmp_path / "g.yaml", wrapper, WRAPPERS[wrapper])
    proc, report = run_clc(policy, [zoo_bins["graph_replay"]], tmp_path, env=cache_env)
    assert proc.returncode == 0, describe(proc) + "\n" + report_summary(report)
    assert "result graph_accumulate ok" in proc.stdout, describe(proc)
    # THEN every replay of both graphs ran the wrapped kernel over all its virtual blocks (a
    # replay that found its slot used up by the previous one would run none, and the result
    # would be wrong)
    (stats,) = wrap_stats(report)
    assert stats["blocks"] == 18 * 16385, stats
    assert stats["skipped"] == 0, stats


@pytest.mark.parametrize("wrapper", ["block_count", "sm_share"])
def test_wrapped_kernel_is_set_up_again_after_a_device_reset(nvcc, cuda_arch, build_dir, run_clc,
                                                             tmp_path, cache_env, wrapper):
    # device_reset launches reset_scale twice, calls cudaDeviceReset(), and launches it twice
    # more in the new primary context (the same CUcontext handle)
    exe = build_example(nvcc, cuda_arch, build_dir, "device_reset")
    policy = _policy(tmp_path / "r.yaml", wrapper, WRAPPERS[wrapper])
    proc, report = run_clc(policy, [exe], tmp_path, env=cache_env)
    assert proc.returncode == 0, describe(proc) + "\n" + report_summary(report)
    assert "result reset_phase1 ok" in proc.stdout and "result reset_phase2 ok" in proc.stdout
    # THEN the launches after the reset ran the wrapped kernel set up in the new context: the
    # driver refused none, and clc made a slot ring per context from one library load
    assert "refused a wrapped kernel" not in proc.stderr, describe(proc)
    assert "could not be rewritten" not in proc.stderr, describe(proc)
    texts = [m["text"] if isinstance(m, dict) else str(m) for m in report.get("messages", [])]
    libs = [t for t in texts if t.startswith("wrap libraries: ")]
    assert libs and libs[0].startswith("wrap libraries: 1 cuLibraryLoadData call, 2 contexts"), \
        report_summary(report)


@pytest.mark.parametrize("wrapper", ["block_count", "sm_share"])
def test_attribute_set_after_the_first_launch_reaches_the_wrapped_kernel(
        zoo_bins, run_clc, tmp_path, cache_env, wrapper):
    # dyn_shared launches 1024 blocks with 4 KB of dynamic shared memory, then calls
    # cudaFuncSetAttribute(MaxDynamicSharedMemorySize, 96 KB) and launches 320 blocks with it
    policy = _policy(tmp_path / "w.yaml", wrapper, WRAPPERS[wrapper])
    proc, report = run_clc(policy, [zoo_bins["dyn_shared"]], tmp_path, env=cache_env)
    assert proc.returncode == 0, describe(proc)
    # THEN the 96 KB launch ran wrapped too (its blocks were counted by the wrapped kernel),
    # not the original after the driver refused the wrapped one
    (stats,) = wrap_stats(report)
    assert stats["blocks"] == 1024 + 320, stats
    assert "refused a wrapped kernel's launch" not in proc.stderr, describe(proc)


def test_sm_share_caps_resident_blocks(zoo_bins, run_clc, tmp_path, cache_env):
    import ctypes
    cuda = ctypes.CDLL("libcuda.so.1")
    sms = ctypes.c_int()
    cuda.cuDeviceGetAttribute(ctypes.byref(sms), 16, 0)
    # grid_stride: 256 threads: at most 8 blocks per SM (2048 threads) are resident; the
    # share is a quarter of the SMs
    share_sms = math.ceil(0.25 * sms.value)
    cap = share_sms * 8
    # WHEN it runs under sm_share 0.25, and 1:1 under block_count
    shared, rep_shared = run_clc(_policy(tmp_path / "s.yaml", "sm_share", {"share": 0.25}),
                                 [zoo_bins["grid_stride"]], tmp_path, env=cache_env)
    full, rep_full = run_clc(_policy(tmp_path / "c.yaml", "block_count", {}),
                             [zoo_bins["grid_stride"]], tmp_path, env=cache_env)
    assert shared.returncode == 0 and full.returncode == 0, describe(shared) + describe(full)
    (s,), (f,) = wrap_stats(rep_shared), wrap_stats(rep_full)
    # THEN at most the cap's blocks were ever resident at once (counted in the kernel), and
    # every virtual block still ran, as many as unwrapped
    assert s["share_sms"] == share_sms, s
    assert 0 < s["max_resident"] <= cap, (s, cap)
    assert s["blocks"] == f["blocks"] == 600 + 16385


def test_wrapped_library_loads_once_for_many_contexts(contexts_bin, driver_api_bin, run_clc,
                                                      tmp_path, cache_env):
    _, ptx = driver_api_bin
    policy = _policy(tmp_path / "w.yaml", "block_count", {}, kernel="fill")
    # WHEN 4 contexts each load the module and launch the wrapped kernel
    proc, report = run_clc(policy, [contexts_bin, "run", ptx, 4], tmp_path, env=cache_env)
    # THEN every context's result is right, and clc loaded one library for the 4 contexts
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.count(" ok") == 4, describe(proc)
    texts = [m["text"] for m in report.get("messages", [])]
    assert "wrap libraries: 1 cuLibraryLoadData call, 4 contexts, 1 unloaded at exit" in texts, \
        texts
    (stats,) = wrap_stats(report)
    assert stats["blocks"] == 4 * ((1 << 20) // 256)


def test_demo_interface_policy_runs_unchanged(zoo_bins, run_native, run_clc, tmp_path,
                                              cache_env):
    native = run_native([zoo_bins["grid_stride"]])
    policy = _policy(tmp_path / "p.yaml", str(EXAMPLES / "wrappers" / "max_steals.cu"),
                     {"MAX_STEALS": 2})
    proc, report = run_clc(policy, [zoo_bins["grid_stride"]], tmp_path, env=cache_env)
    assert proc.returncode == 0, describe(proc)
    assert _results(proc.stdout) == _results(native.stdout)
    (stats,) = wrap_stats(report)
    # Each block ran its own block and stole at most 2 more: fewer blocks than the grid
    # were resident in all, every virtual block still ran
    assert stats["blocks"] == 600 + 16385


def test_second_run_loads_from_the_disk_cache(zoo_bins, run_clc, tmp_path, cache_env):
    policy = _policy(tmp_path / "s.yaml", "sm_share", {"share": 0.5})
    first, rep1 = run_clc(policy, [zoo_bins["templates"]], tmp_path, env=cache_env)
    second, rep2 = run_clc(policy, [zoo_bins["templates"]], tmp_path, env=cache_env)
    assert first.returncode == 0 and second.returncode == 0
    builds1 = [m["text"] for m in rep1["messages"] if m["text"].startswith("wrap build: ")]
    builds2 = [m["text"] for m in rep2["messages"] if m["text"].startswith("wrap build: ")]
    assert builds1 and all(": built in " in t for t in builds1), builds1
    assert builds2 and all(": disk cache in " in t for t in builds2), builds2
    assert os.listdir(cache_env["CLC_CACHE_DIR"])


# ---- a long program whose kernels cannot be wrapped ---------------------------------------

@pytest.fixture(scope="session")
def curand_bin(nvcc, cuda_arch, build_dir):
    exe = build_dir / "curand_mtgp"
    build_or_fail("curand_mtgp", [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", exe,
                                   EXAMPLES / "curand_mtgp.cu", "-lcurand"]])
    return exe


@pytest.mark.parametrize("how,status", [("return", 3), ("exit", 4), ("thread-exit", 5)])
def test_a_long_curand_program_ends_with_its_own_status(curand_bin, run_native, run_clc, tmp_path,
                                                        cache_env, how, status):
    # GIVEN cuRAND's MTGP32 generator called 100,000 times (its kernels: machine code, no PTX)
    argv = [curand_bin, "100000", how]
    native = run_native(argv)
    assert native.returncode == status, describe(native)
    # WHEN every kernel is under block_count, and the unwrappable ones run as they are
    policy = _policy(tmp_path / "count.yaml", "block_count", {})
    proc, report = run_clc(policy, argv, tmp_path, env=cache_env)
    # THEN the program prints what it prints alone and leaves with its own status
    assert proc.returncode == status, describe(proc) + "\n" + report_summary(report)
    assert proc.stdout == native.stdout, describe(proc)
    assert "cannot be wrapped with block_count" in proc.stderr, describe(proc)
    # AND its capture is complete, with every launch counted
    caps = report.get("captures", [])
    assert caps and all(c.get("complete") for c in caps), report_summary(report)
    assert sum(k["launches"] for k in report["kernels"]) >= 100000, report_summary(report)

# SPDX-License-Identifier: Apache-2.0
"""sm_share by green context on the real driver: kernels that ship no PTX (cuBLAS, PyTorch,
Triton, CuPy) are confined without being touched, so their results are bit-identical to
native; the confinement is shown by kernels that stamp %smid, and the program's own stream
order by a copy on its stream that must find the confined kernel's work done.

examples/green_smid.cu runs its stamping kernel on the legacy stream, a priority stream,
cudaLaunchKernelEx, a graph captured on a stream that is then destroyed and replayed on
another, a kernel node made with the graph API (added, then set again on the executable graph),
around cudaDeviceReset and from four threads; built again with --default-stream
per-thread for the _ptsz entry points. examples/green_frameworks.py runs the frameworks.
"""

import re
import subprocess
import sys
import time

import pytest

from gpu_runs import build_example, EXAMPLES, build_or_fail, program_policy, write_policy
from policy_cases import serving_and_training

pytestmark = pytest.mark.gpu

SMS = 16
MODES = ("legacy", "stream", "ex", "graph", "graphapi", "reset", "threads")


def confine_policy(path, glob, params, extra=None):
    return write_policy(path, [("confine", glob, "wrap",
                                {"wrapper": "sm_share", "params": params,
                                 "on_unwrappable": "deny", **(extra or {})})])


def context_sms(stdout):
    """The SMs the driver provisions to the program's context (green_smid's first line)."""
    m = re.search(r"^context sms=(-?\d+)$", stdout, re.M)
    return int(m[1]) if m else None


def results(stdout):
    return [dict(kv.split("=") for kv in m[2].split()) | {"mode": m[1]}
            for m in re.finditer(r"^result (\S+) (.*)$", stdout, re.M)]


@pytest.fixture(scope="module")
def smid_bins(nvcc, cuda_arch, build_dir):
    plain, ptsz = build_dir / "green_smid", build_dir / "green_smid_ptsz"
    build_or_fail("green_smid", [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", plain,
                           EXAMPLES / "green_smid.cu"]])
    build_or_fail("green_smid_ptsz", [[nvcc, "-O2", f"-arch={cuda_arch}", "--default-stream",
                                "per-thread", "-o", ptsz, EXAMPLES / "green_smid.cu"]])
    return {"plain": plain, "ptsz": ptsz}


@pytest.mark.parametrize("build", ["plain", "ptsz"])
@pytest.mark.parametrize("mode", MODES)
def test_stamps_land_on_the_partition_in_stream_order(smid_bins, run_native, run_clc, tmp_path,
                                                      tools, build, mode):
    exe = smid_bins[build]
    # GIVEN the program alone: its 2048 blocks spread over (nearly) every SM
    native = run_native([exe, mode])
    assert native.returncode == 0, tools.describe(native)
    assert all(int(r["distinct"]) > 64 and r["unwritten"] == "0" for r in results(native.stdout))
    whole = context_sms(native.stdout)
    assert whole > 64, tools.describe(native)
    # WHEN its stamping kernel is confined to 16 SMs by a green context
    policy = confine_policy(tmp_path / "p.yaml", "stamp*", {"sms": SMS})
    proc, report = run_clc(policy, [exe, mode], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    rows = results(proc.stdout)
    assert len(rows) == len(results(native.stdout)), tools.describe(proc)
    # (the program's own context is the device's, whole: only the kernel is redirected)
    assert context_sms(proc.stdout) == whole, tools.describe(proc)
    for r in rows:
        # THEN every block of every round ran on at most 16 SMs
        assert 0 < int(r["distinct"]) <= SMS, (r, tools.describe(proc))
        # AND the program's copy on its own stream always found the kernel's work done
        assert r["unwritten"] == "0", (r, tools.describe(proc))
    # AND the capture says the kernel was confined, on how many SMs
    messages = " ".join(m["text"] for m in report["messages"])
    assert f"is {SMS} of its" in messages, messages


def test_tenants_placed_at_opposite_ends_do_not_overlap(smid_bins, run_clc, tmp_path, tools):
    # GIVEN two programs, one confined to the device's first 32 SMs, the other to its last 32
    sets = {}
    for place in ("first", "last"):
        policy = confine_policy(tmp_path / f"{place}.yaml", "stamp*",
                                {"sms": 32, "place": place})
        proc, _ = run_clc(policy, [smid_bins["plain"], "stream"], tmp_path / place)
        assert proc.returncode == 0, tools.describe(proc)
        sets[place] = set()
        for r in results(proc.stdout):
            sets[place] |= {int(s) for s in r["smids"].split(",")}
    # THEN each ran on at most 32 SMs, and no SM ran blocks of both
    assert 0 < len(sets["first"]) <= 32 and 0 < len(sets["last"]) <= 32, sets
    assert not sets["first"] & sets["last"], sets


def test_a_share_over_half_placed_last_leaves_the_first_sms_free(smid_bins, run_clc, tmp_path,
                                                                 tools):
    # GIVEN a program confined to three quarters of the device, at its end (what a best-effort
    # class's reserve of 0.25 gives its launches), and one confined to the device's first
    # group of 8 SMs (the same split in groups of the smallest size: its groups are disjoint)
    sets = {}
    for name, params in (("last", {"share": 0.75, "place": "last"}),
                         ("first", {"sms": 8, "place": "first"})):
        policy = confine_policy(tmp_path / f"{name}.yaml", "stamp*", params)
        proc, _ = run_clc(policy, [smid_bins["plain"], "stream"], tmp_path / name)
        assert proc.returncode == 0, tools.describe(proc)
        whole = context_sms(proc.stdout)
        sets[name] = set()
        for r in results(proc.stdout):
            sets[name] |= {int(s) for s in r["smids"].split(",")}
    # THEN the three quarters ran on about three quarters of the SMs, none of the first group's
    assert whole * 0.6 < len(sets["last"]) <= whole * 0.75 + 8, (len(sets["last"]), whole)
    assert 0 < len(sets["first"]) <= 8, sets
    assert not sets["first"] & sets["last"], sets



# A latency-critical service that lives on the GPU: a small launch and a blocking read of its
# result every 50 ms, until told to stop.
LIVING_SERVICE = """\
import os, sys, time, torch
x = torch.ones(1 << 20, device="cuda")
(x * 2).sum().item()
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    (x * 2).sum().item()
    time.sleep(0.05)
"""


def test_a_reserve_keeps_best_effort_kernels_off_a_quarter_of_the_sms(smid_bins, run_clc,
                                                                     clc_scripts, tmp_path,
                                                                     tools):
    pytest.importorskip("torch")
    policy = tmp_path / "reserve.yaml"
    policy.write_text(serving_and_training(tmp_path / "board", reserve=0.25))

    def best_effort_stamps(tag):
        proc, _ = run_clc(policy, [smid_bins["plain"], "stream"], tmp_path / tag,
                          options=["--tenant", "batch"])
        assert proc.returncode == 0, tools.describe(proc)
        rows = results(proc.stdout)
        assert rows and all(r["unwritten"] == "0" for r in rows), tools.describe(proc)
        return context_sms(proc.stdout), set().union(
            *({int(s) for s in r["smids"].split(",")} for r in rows))

    # GIVEN no latency-critical process: the best-effort stamps spread over (nearly) every SM
    whole, alone = best_effort_stamps("alone")
    assert len(alone) > whole * 0.9, (len(alone), whole)
    # WHEN a latency-critical service lives on the GPU
    stop = tmp_path / "stop"
    (tmp_path / "service.py").write_text(LIVING_SERVICE)
    service = subprocess.Popen(
        [str(a) for a in (clc_scripts.run, "--policy", policy, "--tenant", "serving", "-o",
                          tmp_path / "service.clc", "--force", "--no-report", "--",
                          sys.executable, tmp_path / "service.py", stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert service.stdout.readline().strip() == "ready", service.stderr.read()[-3000:]
        time.sleep(0.3)  # its slot made, its launches seen
        _, beside = best_effort_stamps("beside")
    finally:
        stop.touch()
        service.communicate(timeout=120)
    # THEN the best-effort kernels kept off at least a quarter of the SMs, and ran on the rest
    assert whole * 0.5 < len(beside) <= whole * 0.75, (len(beside), whole)


def frameworks(tools, what):
    return [sys.executable, tools.examples / "green_frameworks.py", what]


@pytest.mark.parametrize("what,module", [("torch", "torch"), ("cublas", "torch"),
                                         ("triton", "triton"), ("cupy", "cupy")])
def test_framework_kernels_are_bit_identical_when_confined(run_native, run_clc, tmp_path,
                                                           tools, what, module):
    pytest.importorskip(module)
    native = run_native(frameworks(tools, what))
    assert native.returncode == 0, tools.describe(native)
    # WHEN every kernel of the program is confined to half the GPU by a green context
    policy = confine_policy(tmp_path / "p.yaml", "*", {"share": 0.5})
    proc, report = run_clc(policy, frameworks(tools, what), tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    # THEN what it computed is bit for bit what it computes alone
    digests = [ln for ln in native.stdout.splitlines() if not ln.startswith("smids ")]
    assert digests and all(ln in proc.stdout for ln in digests), tools.describe(proc)
    # AND nothing was denied or failed: every kernel was confined (a kernel that could not be
    # would have been denied: on_unwrappable deny)
    assert report["kernels"] and all(k["denied"] == 0 and k["failed"] == 0
                                     for k in report["kernels"]), report["kernels"]
    messages = " ".join(m["text"] for m in report["messages"])
    assert "could not be confined" not in messages, messages
    assert "(a green context" in messages, messages
    if what == "cupy":
        # AND the stamping kernel's blocks ran on the half it was given (66 SMs rounded to
        # the device's step), where alone they spread over the whole GPU
        alone = int(re.search(r"^smids distinct=(\d+)", native.stdout, re.M)[1])
        confined = int(re.search(r"^smids distinct=(\d+)", proc.stdout, re.M)[1])
        sms = int(re.search(r"is (\d+) of its (\d+) SMs", messages)[1])
        assert confined <= sms < alone, (confined, sms, alone)


# ---- scope: program: the program's own context is the partition's ---------------------------

@pytest.mark.parametrize("build", ["plain", "ptsz"])
@pytest.mark.parametrize("mode", MODES)
def test_program_scope_keeps_every_launch_on_the_partition(smid_bins, run_clc, tmp_path, tools,
                                                           build, mode):
    # GIVEN the whole program confined to 16 SMs
    policy = program_policy(tmp_path / "p.yaml", {"sms": SMS})
    proc, report = run_clc(policy, [smid_bins[build], mode], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    rows = results(proc.stdout)
    assert rows, tools.describe(proc)
    # THEN cudart keeps its primary context, the whole device (libcudart takes it through a
    # private path of the driver's that clc does not replace: handing the runtime the
    # partition's context instead broke its per-thread streams, its threads' legacy-stream
    # order and cudaDeviceReset, measured on driver 580), so its launches are confined one at
    # a time, as is said once
    assert context_sms(proc.stdout) > SMS, tools.describe(proc)
    text = [m["text"] for m in report["messages"]]
    assert sum("is confined one launch at a time" in m for m in text) == 1, text
    for r in rows:
        # THEN every block of every round ran on at most 16 SMs (legacy and per-thread
        # streams, Ex, a graph replayed after its stream went, a graph-API node, around
        # cudaDeviceReset, four threads), and the program's own copy found the work done
        assert 0 < int(r["distinct"]) <= SMS, (r, tools.describe(proc))
        assert r["unwritten"] == "0", (r, tools.describe(proc))
    # AND the report says the kernel was confined on 16 SMs; nothing was refused
    assert [k["confined_sms"] for k in report["kernels"] if "stamp" in k["name"]] and \
        all(k["confined_sms"] == [SMS] for k in report["kernels"] if "stamp" in k["name"]), \
        report["kernels"]
    assert all(k["denied"] == 0 and k["failed"] == 0 for k in report["kernels"])


@pytest.fixture(scope="module")
def threads_bin(nvcc, cuda_arch, build_dir):
    return build_example(nvcc, cuda_arch, build_dir, "green_threads")


def threads_row(stdout):
    m = re.search(r"^threads=(\d+) rounds=(\d+) bad=(\d+) legacy_bad=(\d+) distinct_sms=(\d+)",
                  stdout, re.M)
    return {k: int(v) for k, v in zip(("threads", "rounds", "bad", "legacy_bad", "distinct"),
                                      m.groups())} if m else None


def test_program_scope_holds_for_many_threads_on_one_context(threads_bin, run_native, run_clc,
                                                             tmp_path, tools):
    # GIVEN 16 threads on the primary context at once: blocking, non-blocking and legacy
    # streams, events, cudaMalloc/cudaFree, the legacy stream's implicit order
    native = run_native([threads_bin, "16", "60"])
    assert native.returncode == 0, tools.describe(native)
    assert threads_row(native.stdout)["distinct"] > 64
    # WHEN the whole program is confined to 16 SMs
    policy = program_policy(tmp_path / "p.yaml", {"sms": SMS})
    proc, _ = run_clc(policy, [threads_bin, "16", "60"], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    row = threads_row(proc.stdout)
    # THEN every computation came out right, the legacy stream still waited for the blocking
    # streams, and every stamp ran on at most 16 SMs
    assert row and row["bad"] == 0 and row["legacy_bad"] == 0, tools.describe(proc)
    assert 0 < row["distinct"] <= SMS, row


@pytest.mark.parametrize("what,module", [("torch", "torch"), ("cublas", "torch"),
                                         ("triton", "triton"), ("cupy", "cupy")])
def test_program_scope_frameworks_are_bit_identical(run_native, run_clc, tmp_path, tools, what,
                                                    module):
    pytest.importorskip(module)
    native = run_native(frameworks(tools, what))
    assert native.returncode == 0, tools.describe(native)
    # WHEN the whole program is confined to half the GPU
    policy = program_policy(tmp_path / "p.yaml", {"share": 0.5})
    proc, report = run_clc(policy, frameworks(tools, what), tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    # THEN it computed bit for bit what it computes alone
    digests = [ln for ln in native.stdout.splitlines() if not ln.startswith("smids ")]
    assert digests and all(ln in proc.stdout for ln in digests), tools.describe(proc)
    # AND every kernel it launched ran in the partition's context
    messages = " ".join(m["text"] for m in report["messages"])
    sms = int(re.search(r"is (\d+) of its (\d+) SMs", messages)[1])
    launched = [k for k in report["kernels"] if k["launches"]]
    assert launched and all(k["confined_sms"] == [sms] for k in launched), report["kernels"]
    if what == "cupy":
        confined = int(re.search(r"^smids distinct=(\d+)", proc.stdout, re.M)[1])
        assert confined <= sms, (confined, sms)


def test_program_scope_covers_pytorchs_own_threads(run_native, run_clc, tmp_path, tools):
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    argv = [sys.executable, tools.examples / "green_torch_threads.py"]
    native = run_native(argv)
    assert native.returncode == 0, tools.describe(native)
    # WHEN a PyTorch program with a DataLoader (workers, pin-memory thread) and autograd's
    # device thread is confined, whole, to half the GPU
    policy = program_policy(tmp_path / "p.yaml", {"share": 0.5})
    proc, report = run_clc(policy, argv, tmp_path, timeout=600)
    assert proc.returncode == 0, tools.describe(proc)
    messages = " ".join(m["text"] for m in report["messages"])
    sms = int(re.search(r"is (\d+) of its (\d+) SMs", messages)[1])
    stamps = {m[1]: (int(m[2]), m[3]) for m in re.finditer(
        r"^stamp (\w+) distinct=(\d+) max=\d+ threads=(.*)$", proc.stdout, re.M)}
    # THEN the stamps of the main thread and of autograd's thread (another thread) both ran
    # on the partition's SMs only, and training computed what it computes alone
    assert set(stamps) == {"main", "backward"}, tools.describe(proc)
    assert all(0 < n <= sms for n, _ in stamps.values()), (stamps, sms)
    assert stamps["backward"][1] != stamps["main"][1], stamps
    loss = re.search(r"^loss=.*$", native.stdout, re.M)[0]
    assert loss in proc.stdout, tools.describe(proc)


def test_program_scope_confines_a_driver_api_program(driver_api_bin, run_clc, tmp_path, tools):
    # GIVEN a program linked against libcuda alone (PTX through cuModuleLoadData, launches with
    # cuLaunchKernel in the device's primary context), confined whole to half the GPU
    exe, ptx = driver_api_bin
    policy = program_policy(tmp_path / "p.yaml", {"share": 0.5})
    proc, report = run_clc(policy, [exe, ptx, 50], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    # THEN its results are right and both its kernels ran in the partition's context
    out = tools.parse(proc.stdout)
    assert out.results == {"saxpy": "ok", "fill": "ok"}, tools.describe(proc)
    messages = " ".join(m["text"] for m in report["messages"])
    sms = int(re.search(r"is (\d+) of its (\d+) SMs", messages)[1])
    assert {k["name"]: k["confined_sms"] for k in report["kernels"]} == \
        {"saxpy": [sms], "fill": [sms]}, report["kernels"]

# SPDX-License-Identifier: Apache-2.0
"""GPU times of timed launches (`time: true`) from CUPTI's kernel records, on the real GPU and
CUPTI: kernels of known length (examples/spin_timed.cu, spinning on the GPU's own clock) get
their lengths; CUPTI and CUDA events agree on long kernels; PyTorch's launches are all timed;
and a program that profiles itself with CUPTI (torch.profiler) sees what it sees without clc.
"""

import sys
import textwrap

import pytest
from gpu_runs import build_example

pytestmark = pytest.mark.gpu

SHORT_US, LONG_US, N = 20, 1000, 200


@pytest.fixture(scope="module")
def spin_bin(nvcc, cuda_arch, build_dir, tools):
    return build_example(nvcc, cuda_arch, build_dir, "spin_timed")


def rows_by_name(report):
    return {r["name"].split("(")[0]: r for r in report["kernels"]}


def sources(report):
    out = {}
    for c in report["captures"]:
        for s, n in c["timing_sources"].items():
            out[s] = out.get(s, 0) + n
    return out


def spin_run(run_clc, spin_bin, tmp_path, timing, tools):
    proc, report = run_clc("time-all.yaml", [spin_bin, SHORT_US, LONG_US, N], tmp_path,
                           options=["--timing", timing])
    assert proc.returncode == 0 and "ok" in proc.stdout, tools.describe(proc)
    tools.assert_all_timed(report, run=proc)
    return proc, report


def test_cupti_gives_each_kernel_its_own_length(run_clc, spin_bin, tmp_path, tools):
    # WHEN kernels of 20 us and 1 ms run under time-all, timed by CUPTI
    proc, report = spin_run(run_clc, spin_bin, tmp_path, "cupti", tools)
    # THEN every launch's time came from CUPTI
    assert sources(report) == {"cupti": N + N // 10}, tools.describe(proc)
    assert "did not come back" not in proc.stderr
    rows = rows_by_name(report)
    # AND each kernel's launches took its length, a little more (the spin's last loop and
    # the kernel's start and end), never less
    for name, us, n in (("spin_short", SHORT_US, N), ("spin_long", LONG_US, N // 10)):
        row = rows[name]
        assert row["launches"] == row["timed"] == n
        times = [x["gpu_ns"] for x in report["launches"] if x["kernel"].startswith(name)]
        assert len(times) == n
        assert min(times) >= us * 1000, (name, min(times))
        assert row["gpu_ns_mean"] <= us * 1000 * 1.05 + 3000, (name, row["gpu_ns_mean"])


def test_cupti_and_events_agree_on_long_kernels(run_clc, spin_bin, tmp_path, tools):
    # WHEN the same program is timed by CUPTI and by events
    _, cupti = spin_run(run_clc, spin_bin, tmp_path, "cupti", tools)
    _, events = spin_run(run_clc, spin_bin, tmp_path, "events", tools)
    assert sources(events) == {"events": N + N // 10}
    c, e = rows_by_name(cupti), rows_by_name(events)
    # THEN the 1 ms kernels' GPU totals are within 1 % of each other
    long_c, long_e = c["spin_long"]["gpu_ns_total"], e["spin_long"]["gpu_ns_total"]
    assert abs(long_c - long_e) <= 0.01 * long_e, (long_c, long_e)
    # AND on 20 us kernels, events (the stream's time between two events) read no less than
    # CUPTI (the kernel's own start and end)
    short_c, short_e = c["spin_short"]["gpu_ns_total"], e["spin_short"]["gpu_ns_total"]
    assert short_c <= short_e * 1.01, (short_c, short_e)
    print(f"\nspin_long total: cupti {long_c / 1e6:.3f} ms, events {long_e / 1e6:.3f} ms; "
          f"spin_short total: cupti {short_c / 1e6:.3f} ms, events {short_e / 1e6:.3f} ms")


@pytest.fixture(scope="module")
def torch_snippet(tools):
    pytest.importorskip("torch")
    return [sys.executable, tools.examples / "torch_snippet.py", "--iterations", 12]


def test_pytorch_launches_are_all_timed_by_cupti(run_clc, torch_snippet, tmp_path, tools):
    # WHEN PyTorch's workload runs under time-all, CUPTI chosen by default
    proc, report = run_clc("time-all.yaml", torch_snippet, tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    # THEN every launch has its GPU time, all from CUPTI
    tools.assert_all_timed(report, run=proc)
    assert set(sources(report)) == {"cupti"}, tools.describe(proc)
    assert "did not come back" not in proc.stderr


def test_a_program_profiling_itself_sees_what_it_sees_without_clc(run_clc, run_native,
                                                                  torch_snippet, tmp_path,
                                                                  tools):
    # GIVEN PyTorch's workload under torch.profiler, which takes CUPTI for itself
    profiled = [*torch_snippet, "--profile"]
    alone = run_native(profiled)
    assert alone.returncode == 0, tools.describe(alone)
    # WHEN it runs under time-all
    proc, report = run_clc("time-all.yaml", profiled, tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    # THEN the profiler counts the same kernels as without clc, and computes the same
    counts = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith(("count ", "done ")))
    expected = sorted(ln for ln in alone.stdout.splitlines()
                      if ln.startswith(("count ", "done ")))
    assert counts == expected, tools.describe(proc)
    # AND clc times every launch all the same, by events once the program holds CUPTI
    tools.assert_all_timed(report, run=proc)


def test_a_profiler_started_midway_takes_cupti_over(run_clc, run_native, tmp_path, tools):
    pytest.importorskip("torch")
    # GIVEN a program that launches (timed by clc through CUPTI), then starts torch.profiler
    script = tmp_path / "midway.py"
    script.write_text(textwrap.dedent("""\
        import torch
        from torch.profiler import ProfilerActivity, profile
        x = torch.ones(1 << 20, device="cuda")
        for _ in range(50):
            x = x * 1.0001
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(30):
                x = x + 1
            torch.cuda.synchronize()
        kernels = [e for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA]
        print("profiled", len(kernels))
        print("sum", float(x.sum()))
        """))
    alone = run_native([sys.executable, script])
    assert alone.returncode == 0, tools.describe(alone)
    # WHEN it runs under time-all, verbose
    proc, report = run_clc("time-all.yaml", [sys.executable, script], tmp_path, options=["-v"])
    assert proc.returncode == 0, tools.describe(proc)
    # THEN the profiler sees its 30 kernels as it does alone, and the result is the same
    assert alone.stdout in proc.stdout, tools.describe(proc)
    # AND clc said it gave CUPTI up, and timed the launches before from CUPTI, after by events
    assert "the program uses CUPTI itself" in proc.stderr, tools.describe(proc)
    got = sources(report)
    assert got.get("cupti", 0) >= 50 and got.get("events", 0) >= 30, got

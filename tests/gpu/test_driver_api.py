# SPDX-License-Identifier: Apache-2.0
"""examples/driver_api.c (PTX through cuModuleLoadData, cuLaunchKernel) under clc-run."""

import pytest

pytestmark = pytest.mark.gpu

ITERATIONS = 100
KERNELS = ("saxpy", "fill")


def expected_counts(iterations=ITERATIONS):
    return {"saxpy": iterations, "fill": 2 * iterations}


@pytest.fixture(scope="module")
def argv(driver_api_bin):
    exe, ptx = driver_api_bin
    return [exe, ptx, ITERATIONS]


@pytest.fixture(scope="module")
def native(argv, run_native, tools):
    proc = run_native(argv)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    assert out.counts == expected_counts(), tools.describe(proc)
    assert out.results == {k: "ok" for k in KERNELS}, tools.describe(proc)
    assert not out.errors, tools.describe(proc)
    return proc


def test_audit(native, argv, run_clc, tools, tmp_path):
    proc, report = run_clc("audit.yaml", argv, tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.comparable(proc.stdout) == tools.comparable(native.stdout), (
        f"stdout under clc differs\n--- native ---\n{native.stdout}\n"
        f"--- under clc ---\n{tools.describe(proc)}")
    tools.assert_capture_ok(report, proc)
    counts = tools.parse(proc.stdout).counts
    tools.assert_counts(report, counts, run=proc)
    for kernel, n in counts.items():
        recs = tools.launch_rows(report, kernel)
        assert len(recs) == n, (f"{kernel}: {len(recs)} launch records, {n} launches\n"
                                f"{tools.report_summary(report)}")
        # extern "C": the mangled name is the plain name, and the launch came straight
        # through cuLaunchKernel.
        assert {r.get("mangled") for r in recs} == {kernel}
        assert {r.get("entry") for r in recs} <= {"cuLaunchKernel", 0}, \
            {r.get("entry") for r in recs}
    # The module came from PTX text handed to cuModuleLoadData.
    assert report.get("modules"), f"no module records\n{tools.report_summary(report)}"


def test_deny_fill(native, argv, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-fill.yaml", "fill")
    proc, report = run_clc(policy, argv, tmp_path)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    assert ("fill", "CUDA_ERROR_NOT_PERMITTED") in out.errors, (
        "expected `cuda_error fill CUDA_ERROR_NOT_PERMITTED`\n" + tools.describe(proc))
    assert [e for e in out.errors if e[0] != "fill"] == [], tools.describe(proc)
    assert out.error_counts.get("fill") == 2 * ITERATIONS, tools.describe(proc)
    assert out.results == {"saxpy": "ok", "fill": "skipped"}, tools.describe(proc)
    assert out.counts == expected_counts(), tools.describe(proc)
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, out.counts, run=proc, denied={"fill"})


def test_time_all(native, argv, run_clc, tools, tmp_path):
    proc, report = run_clc("time-all.yaml", argv, tmp_path)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.comparable(proc.stdout) == tools.comparable(native.stdout), (
        f"results changed under time-all\n--- native ---\n{native.stdout}\n"
        f"--- under clc ---\n{tools.describe(proc)}")
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, out.counts, run=proc)
    tools.assert_all_timed(report, KERNELS, run=proc)
    # saxpy is too short for a 10 % comparison, but clc's events sit inside the program's:
    # its total cannot exceed the program's by more than event resolution (~0.5 us a launch).
    program_ms = out.event_ms["saxpy"]
    capture_ms = tools.kernel_total(report, "saxpy", "gpu_ns_total") / 1e6
    assert 0 < capture_ms <= program_ms * 1.10 + ITERATIONS * 0.002, (
        f"saxpy GPU time: capture {capture_ms:.4f} ms, program's events {program_ms:.4f} ms\n"
        f"{tools.report_summary(report)}")

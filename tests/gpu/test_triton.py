# SPDX-License-Identifier: Apache-2.0
"""examples/triton_snippet.py (Triton kernels, launched with cuLaunchKernelEx) under clc-run."""

import sys

import pytest

pytestmark = pytest.mark.gpu

ITERATIONS = 20
KERNELS = ("add_kernel", "mul_kernel")


def expected_counts(iterations=ITERATIONS):
    return {"add_kernel": iterations, "mul_kernel": 2 * iterations}


@pytest.fixture(scope="module")
def snippet(tools):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    return [sys.executable, tools.examples / "triton_snippet.py", "--iterations", ITERATIONS]


@pytest.fixture(scope="module")
def native(snippet, run_native, tools):
    # Also warms Triton's compile cache, so runs under clc do not each pay for compiling.
    proc = run_native(snippet)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    assert out.counts == expected_counts(), tools.describe(proc)
    assert out.results == {k: "ok" for k in KERNELS}, tools.describe(proc)
    return proc


def test_audit(native, snippet, run_clc, tools, tmp_path):
    proc, report = run_clc("audit.yaml", snippet, tmp_path)
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


def test_deny_add_kernel(native, snippet, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-add.yaml", "add_kernel")
    proc, report = run_clc(policy, snippet, tmp_path)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    add_errors = [msg for k, msg in out.errors if k == "add_kernel"]
    assert add_errors and all(tools.not_permitted.search(m) for m in add_errors), (
        "expected `cuda_error add_kernel ...` lines that say the launch was not permitted\n"
        + tools.describe(proc))
    assert [e for e in out.errors if e[0] != "add_kernel"] == [], tools.describe(proc)
    assert out.error_counts.get("add_kernel") == ITERATIONS, tools.describe(proc)
    assert out.results == {"add_kernel": "skipped", "mul_kernel": "ok"}, tools.describe(proc)
    assert out.counts == expected_counts(), tools.describe(proc)
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, out.counts, run=proc, denied={"add_kernel"})


def test_time_all(native, snippet, run_clc, tools, tmp_path):
    proc, report = run_clc("time-all.yaml", snippet, tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.comparable(proc.stdout) == tools.comparable(native.stdout), (
        f"results changed under time-all\n--- native ---\n{native.stdout}\n"
        f"--- under clc ---\n{tools.describe(proc)}")
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, tools.parse(proc.stdout).counts, run=proc)
    # Every launch in the process, torch's own (randn, the reference x + y) included.
    tools.assert_all_timed(report, run=proc)

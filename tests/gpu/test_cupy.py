# SPDX-License-Identifier: Apache-2.0
"""examples/cupy_snippet.py (CuPy RawKernel and ElementwiseKernel, NVRTC) under clc-run."""

import sys

import pytest

pytestmark = pytest.mark.gpu

ITERATIONS = 20
KERNELS = ("cupy_scale", "clc_cupy_add")


def expected_counts(iterations=ITERATIONS):
    return {"cupy_scale": iterations, "clc_cupy_add": 2 * iterations}


@pytest.fixture(scope="module")
def snippet(tools):
    pytest.importorskip("cupy")
    return [sys.executable, tools.examples / "cupy_snippet.py", "--iterations", ITERATIONS]


@pytest.fixture(scope="module")
def native(snippet, run_native, tools):
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
    # The snippet launches nothing else: the capture holds exactly these kernels.
    total = sum(r.get("launches") or 0 for r in report.get("kernels", []))
    assert total == sum(counts.values()), tools.report_summary(report)
    for kernel, n in counts.items():
        recs = tools.launch_rows(report, kernel)
        assert len(recs) == n, (f"{kernel}: {len(recs)} launch records, {n} launches\n"
                                f"{tools.report_summary(report)}")


def test_deny_cupy_scale(native, snippet, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-scale.yaml", "cupy_scale")
    proc, report = run_clc(policy, snippet, tmp_path)
    out = tools.parse(proc.stdout)
    assert proc.returncode == 0, tools.describe(proc)
    scale_errors = [msg for k, msg in out.errors if k == "cupy_scale"]
    assert scale_errors and all(tools.not_permitted.search(m) for m in scale_errors), (
        "expected `cuda_error cupy_scale ...` lines that say the launch was not permitted\n"
        + tools.describe(proc))
    assert [e for e in out.errors if e[0] != "cupy_scale"] == [], tools.describe(proc)
    assert out.error_counts.get("cupy_scale") == ITERATIONS, tools.describe(proc)
    assert out.results == {"cupy_scale": "skipped", "clc_cupy_add": "ok"}, tools.describe(proc)
    assert out.counts == expected_counts(), tools.describe(proc)
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, out.counts, run=proc, denied={"cupy_scale"})


def test_time_all(native, snippet, run_clc, tools, tmp_path):
    proc, report = run_clc("time-all.yaml", snippet, tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    assert tools.comparable(proc.stdout) == tools.comparable(native.stdout), (
        f"results changed under time-all\n--- native ---\n{native.stdout}\n"
        f"--- under clc ---\n{tools.describe(proc)}")
    tools.assert_capture_ok(report, proc)
    tools.assert_counts(report, tools.parse(proc.stdout).counts, run=proc)
    tools.assert_all_timed(report, run=proc)

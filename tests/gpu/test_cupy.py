# SPDX-License-Identifier: Apache-2.0
"""examples/cupy_snippet.py (CuPy RawKernel and ElementwiseKernel, NVRTC) under clc-run."""

import pytest

from library_suite import (assert_denied, assert_native, audit_run, python_snippet,
                           time_all_run)

pytestmark = pytest.mark.gpu

ITERATIONS = 20
# What the program launches in one run, kernel by kernel.
COUNTS = {"cupy_scale": ITERATIONS, "clc_cupy_add": 2 * ITERATIONS}


@pytest.fixture(scope="module")
def snippet():
    return python_snippet("cupy_snippet.py", ITERATIONS, "cupy")


@pytest.fixture(scope="module")
def native(snippet, run_native):
    return assert_native(run_native(snippet), COUNTS)


def test_audit(native, snippet, run_clc, tools, tmp_path):
    proc, report, _ = audit_run(run_clc, snippet, tmp_path, native)
    counts = tools.parse(proc.stdout).counts
    # The snippet launches nothing else: the capture holds exactly these kernels.
    total = sum(r.get("launches") or 0 for r in report.get("kernels", []))
    assert total == sum(counts.values()), tools.report_summary(report)


def test_deny_cupy_scale(native, snippet, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-scale.yaml", "cupy_scale")
    proc, report = run_clc(policy, snippet, tmp_path)
    assert_denied(proc, report, "cupy_scale", ITERATIONS,
                  {"cupy_scale": "skipped", "clc_cupy_add": "ok"}, COUNTS)


def test_time_all(native, snippet, run_clc, tmp_path):
    time_all_run(run_clc, snippet, tmp_path, native)

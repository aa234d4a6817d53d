# SPDX-License-Identifier: Apache-2.0
"""examples/driver_api.c (PTX through cuModuleLoadData, cuLaunchKernel) under clc-run."""

import pytest

from library_suite import assert_denied, assert_native, audit_run, time_all_run

pytestmark = pytest.mark.gpu

ITERATIONS = 100
# What the program launches in one run, kernel by kernel.
COUNTS = {"saxpy": ITERATIONS, "fill": 2 * ITERATIONS}


@pytest.fixture(scope="module")
def argv(driver_api_bin):
    exe, ptx = driver_api_bin
    return [exe, ptx, ITERATIONS]


@pytest.fixture(scope="module")
def native(argv, run_native):
    return assert_native(run_native(argv), COUNTS, errorless=True)


def test_audit(native, argv, run_clc, tools, tmp_path):
    _, report, records = audit_run(run_clc, argv, tmp_path, native)
    for kernel, recs in records.items():
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
    assert_denied(proc, report, "fill", 2 * ITERATIONS, {"saxpy": "ok", "fill": "skipped"},
                  COUNTS, error="CUDA_ERROR_NOT_PERMITTED")


def test_time_all(native, argv, run_clc, tools, tmp_path):
    _, report, out = time_all_run(run_clc, argv, tmp_path, native, COUNTS)
    # saxpy is too short for a 10 % comparison, but clc's events sit inside the program's:
    # its total cannot exceed the program's by more than event resolution (~0.5 us a launch).
    program_ms = out.event_ms["saxpy"]
    capture_ms = tools.kernel_total(report, "saxpy", "gpu_ns_total") / 1e6
    assert 0 < capture_ms <= program_ms * 1.10 + ITERATIONS * 0.002, (
        f"saxpy GPU time: capture {capture_ms:.4f} ms, program's events {program_ms:.4f} ms\n"
        f"{tools.report_summary(report)}")

# SPDX-License-Identifier: Apache-2.0
"""examples/triton_snippet.py (Triton kernels, launched with cuLaunchKernelEx) under clc-run."""

import pytest

from library_suite import (assert_denied, assert_native, audit_run, python_snippet,
                           time_all_run)

pytestmark = pytest.mark.gpu

ITERATIONS = 20
# What the program launches in one run, kernel by kernel.
COUNTS = {"add_kernel": ITERATIONS, "mul_kernel": 2 * ITERATIONS}


@pytest.fixture(scope="module")
def snippet():
    return python_snippet("triton_snippet.py", ITERATIONS, "torch", "triton")


@pytest.fixture(scope="module")
def native(snippet, run_native):
    # Also warms Triton's compile cache, so runs under clc do not each pay for compiling.
    return assert_native(run_native(snippet), COUNTS)


def test_audit(native, snippet, run_clc, tmp_path):
    audit_run(run_clc, snippet, tmp_path, native)


def test_deny_add_kernel(native, snippet, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-add.yaml", "add_kernel")
    proc, report = run_clc(policy, snippet, tmp_path)
    assert_denied(proc, report, "add_kernel", ITERATIONS,
                  {"add_kernel": "skipped", "mul_kernel": "ok"}, COUNTS)


def test_time_all(native, snippet, run_clc, tmp_path):
    # Every launch in the process is timed, torch's own (randn, the reference x + y) included.
    time_all_run(run_clc, snippet, tmp_path, native)

# SPDX-License-Identifier: Apache-2.0
"""The runs every library suite in tests/gpu makes of its program (test_cupy, test_triton,
test_torch, test_driver_api, test_runtime_api): once alone, then under audit.yaml, under a
policy that denies one kernel, and under time-all.yaml.

A suite keeps what is its own: the program, the launches it expects of each kernel, and the
assertions only that program can make. The checks all of them make of a run are here, so
that a suite's tests read as what differs between the libraries.
"""

import sys

import pytest

from gpu_runs import (EXAMPLES, NOT_PERMITTED, assert_all_timed, assert_capture_ok,
                      assert_counts, comparable, describe, launch_rows, parse_output,
                      report_summary)

AUDIT_DIFFERS = "stdout under clc differs"
TIME_ALL_DIFFERS = "results changed under time-all"


def python_snippet(script, iterations, *modules):
    """argv for examples/SCRIPT run by this interpreter; the test is skipped, not failed,
    where one of `modules` (the library the snippet drives) is not installed."""
    for module in modules:
        pytest.importorskip(module)
    return [sys.executable, EXAMPLES / script, "--iterations", iterations]


def assert_native(proc, counts, errorless=False):
    """The program alone exits 0 having made `counts` (kernel -> launches), every kernel's
    result ok (and, if `errorless`, no CUDA call failed): what the runs under clc are held to."""
    out = parse_output(proc.stdout)
    assert proc.returncode == 0, describe(proc)
    assert out.counts == counts, describe(proc)
    assert out.results == {k: "ok" for k in counts}, describe(proc)
    if errorless:
        assert not out.errors, describe(proc)
    return proc


def run_as_native(run_clc, policy, argv, tmp_path, native, differs):
    """argv under `policy`, which must not change what the program prints (timings aside):
    (proc, report) once it exited 0 with the native run's output and a whole capture.
    `differs` heads the failure message when the output is not the native one."""
    proc, report = run_clc(policy, argv, tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert comparable(proc.stdout) == comparable(native.stdout), (
        f"{differs}\n--- native ---\n{native.stdout}\n--- under clc ---\n{describe(proc)}")
    assert_capture_ok(report, proc)
    return proc, report


def assert_one_record_per_launch(report, counts):
    """Each kernel's launch records number its launches; returns kernel -> its records, for
    the suite's own checks on them."""
    records = {}
    for kernel, n in counts.items():
        recs = launch_rows(report, kernel)
        assert len(recs) == n, (f"{kernel}: {len(recs)} launch records, {n} launches\n"
                                f"{report_summary(report)}")
        records[kernel] = recs
    return records


def audit_run(run_clc, argv, tmp_path, native, differs=AUDIT_DIFFERS):
    """argv under audit.yaml: the native output, the program's counts in the capture and one
    launch record per launch. Returns (proc, report, kernel -> launch records)."""
    proc, report = run_as_native(run_clc, "audit.yaml", argv, tmp_path, native, differs)
    counts = parse_output(proc.stdout).counts
    assert_counts(report, counts, run=proc)
    return proc, report, assert_one_record_per_launch(report, counts)


def assert_denied(proc, report, kernel, refused, results, counts, error=None):
    """A run whose policy denies `kernel`: the program goes on and exits 0; it saw `refused`
    failed launches of that kernel only, each said as `error` (or, where the library words it
    its own way, as a "not permitted" of any spelling); it still made `counts` launches, with
    `results` per kernel; the capture counts the same launches and every one of `kernel`'s
    denied. Returns the program's parsed output."""
    out = parse_output(proc.stdout)
    assert proc.returncode == 0, describe(proc)
    if error is None:
        said = [msg for k, msg in out.errors if k == kernel]
        assert said and all(NOT_PERMITTED.search(m) for m in said), (
            f"expected `cuda_error {kernel} ...` lines that say the launch was not permitted\n"
            + describe(proc))
    else:
        assert (kernel, error) in out.errors, (
            f"expected `cuda_error {kernel} {error}`\n" + describe(proc))
    assert [e for e in out.errors if e[0] != kernel] == [], describe(proc)
    assert out.error_counts.get(kernel) == refused, describe(proc)
    assert out.results == results, describe(proc)
    assert out.counts == counts, describe(proc)
    assert_capture_ok(report, proc)
    assert_counts(report, out.counts, run=proc, denied={kernel})
    return out


def time_all_run(run_clc, argv, tmp_path, native, kernels=None):
    """argv under time-all.yaml: the native output, the program's counts in the capture and
    a GPU time on every launch (of `kernels`, or of every kernel in the process). Returns
    (proc, report, the program's parsed output)."""
    proc, report = run_as_native(run_clc, "time-all.yaml", argv, tmp_path, native,
                                 TIME_ALL_DIFFERS)
    out = parse_output(proc.stdout)
    assert_counts(report, out.counts, run=proc)
    assert_all_timed(report, kernels, run=proc)
    return proc, report, out

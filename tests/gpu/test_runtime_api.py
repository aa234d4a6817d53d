# SPDX-License-Identifier: Apache-2.0
"""examples/vecadd.cu (CUDA runtime API, <<<>>> launches) under clc-run."""

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from library_suite import assert_denied, assert_native, audit_run, time_all_run

pytestmark = pytest.mark.gpu

ITERATIONS = 300  # vecAdd ~0.6-0.8 ms a launch: ~200 ms of timed GPU work
# What the program launches in one run, kernel by kernel.
COUNTS = {"vecAdd": ITERATIONS, "scale_kernel": 2 * ITERATIONS, "debug_fill": (ITERATIONS + 1) // 2}


@pytest.fixture(scope="module")
def native(vecadd_bin, run_native):
    return assert_native(run_native([vecadd_bin, ITERATIONS]), COUNTS, errorless=True)


def test_audit(native, vecadd_bin, run_clc, tools, tmp_path):
    _, report, records = audit_run(run_clc, [vecadd_bin, ITERATIONS], tmp_path, native,
                                   differs="stdout under clc differs from the native run")
    # audit.yaml records every launch: one record per launch, all allowed.
    for kernel, recs in records.items():
        actions = {r.get("action") for r in recs}
        assert actions == {"allow"}, f"{kernel}: actions {actions}"
        assert tools.kernel_total(report, kernel, "recorded") == len(recs), \
            tools.report_summary(report)


def test_deny_scale_kernel(native, vecadd_bin, run_clc, tools, tmp_path):
    policy = tools.deny_policy(tmp_path / "deny-scale.yaml", "*scale_kernel*",
                               message="scale is refused in this test")
    proc, report = run_clc(policy, [vecadd_bin, ITERATIONS], tmp_path)
    assert_denied(proc, report, "scale_kernel", 2 * ITERATIONS,
                  {"vecAdd": "ok", "scale_kernel": "skipped", "debug_fill": "ok"},
                  COUNTS, error="cudaErrorNotPermitted")
    # Where the denied launches were recorded, they say so.
    recs = tools.launch_rows(report, "scale_kernel")
    assert all(r.get("action") == "deny" for r in recs), [r.get("action") for r in recs[:5]]


def test_time_all(native, vecadd_bin, run_clc, tools, tmp_path):
    proc, report, _ = time_all_run(run_clc, [vecadd_bin, ITERATIONS], tmp_path, native, COUNTS)

    # The program's own events around each vecAdd launch, in a run without clc, hold the
    # kernel: clc's totals agree with them to within the small per-launch gap. (Under clc the
    # program's events read longer where CUPTI traces the kernels: measured +12 % on an H200,
    # while the kernels' own times, CUPTI's, match the run without clc; docs/performance.md.)
    program_ms = tools.parse(native.stdout).event_ms["vecAdd"]
    capture_ms = tools.kernel_total(report, "vecAdd", "gpu_ns_total") / 1e6
    per_launch = sorted(r.get("gpu_ns") or 0 for r in tools.launch_rows(report, "vecAdd"))
    spread = (f"per-launch gpu_ns min {per_launch[0]}, median {per_launch[len(per_launch) // 2]}, "
              f"max {per_launch[-1]}" if per_launch else "no launch records")
    assert program_ms > 0, tools.describe(proc)
    assert abs(capture_ms - program_ms) <= 0.10 * program_ms, (
        f"vecAdd GPU time: capture {capture_ms:.3f} ms vs the program's events without clc "
        f"{program_ms:.3f} ms "
        f"({(capture_ms / program_ms - 1) * 100:+.1f} %); {spread}\n"
        f"{tools.report_summary(report)}")
    # gpu_ns_mean is the total over the timed launches.
    rows = tools.kernel_rows(report, "vecAdd")
    if len(rows) == 1 and rows[0].get("timed"):
        mean = rows[0]["gpu_ns_total"] / rows[0]["timed"]
        assert rows[0].get("gpu_ns_mean") == pytest.approx(mean, rel=0.01), rows[0]


def test_the_capture_and_the_metrics_name_the_gpu_as_nvidia_smi_does(vecadd_bin, run_clc,
                                                                        clc_scripts, tools,
                                                                        tmp_path):
    # GIVEN each GPU of the machine as nvidia-smi names it, and the last one made the
    # program's only device (CUDA_VISIBLE_DEVICES takes a UUID: device 0 is that GPU)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi not found: nothing to compare the UUID with")
    listed = subprocess.run([smi, "--query-gpu=uuid", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    uuid = listed.stdout.split()[-1]
    assert uuid.startswith("GPU-"), listed.stdout
    # WHEN the program runs under clc-run
    proc, report = run_clc("audit.yaml", [vecadd_bin, 3], tmp_path,
                           env={"CUDA_VISIBLE_DEVICES": uuid})
    assert proc.returncode == 0, tools.describe(proc)
    # THEN its capture names its device 0 by that UUID
    assert report["captures"][0]["devices"] == [{"device": 0, "uuid": uuid}], report["captures"]
    # AND clc metrics labels its series with it, as DCGM's exporter labels that GPU's
    metrics = subprocess.run([clc_scripts.clc, "metrics", tmp_path], capture_output=True,
                             text=True, timeout=60)
    assert metrics.returncode == 0, metrics.stderr
    labels = {s.labels.get("UUID") for fam in text_string_to_metric_families(metrics.stdout)
              for s in fam.samples if s.name == "clc_launches_total"}
    assert labels == {uuid}, metrics.stdout

# SPDX-License-Identifier: Apache-2.0
"""Several GPUs in one process (examples/multi_gpu.cu): a partition per device, one load of a
wrapped kernel's library serving every device's context, and threads that move between
devices, under sm_share, block_count, deny and time-all. Skipped with fewer than two GPUs (run
on a two-GPU machine: the device tool's nvidia-h100-x2 kind)."""

import re

import pytest

from gpu_runs import (build_example, assert_all_timed, assert_capture_ok, probe_driver,
                      wrap_stats, write_policy)

pytestmark = pytest.mark.gpu

SMS = 16


@pytest.fixture(scope="module")
def multi_bin(nvcc, cuda_arch, build_dir):
    info, reason = probe_driver()
    if info is None or info.devices < 2:
        pytest.skip(f"needs two GPUs: {reason or f'{info.devices} found'}")
    exe = build_example(nvcc, cuda_arch, build_dir, "multi_gpu")
    return exe, info.devices


def rounds(stdout):
    return [(int(m[1]), int(m[2]), int(m[3]), m[4]) for m in re.finditer(
        r"^device (\d+) distinct=(\d+) unwritten=(\d+) scale=(\w+)$", stdout, re.M)]


def test_a_partition_per_device(multi_bin, run_native, run_clc, tmp_path, tools):
    exe, devices = multi_bin
    native = run_native([exe, "each"])
    assert native.returncode == 0, tools.describe(native)
    assert all(d > 64 for _, d, _, _ in rounds(native.stdout))
    # WHEN the stamping kernel is confined to 16 SMs
    policy = write_policy(tmp_path / "p.yaml", [("confine", "stamp*", "wrap",
                                                 {"wrapper": "sm_share",
                                                  "params": {"sms": SMS},
                                                  "on_unwrappable": "deny"})])
    proc, report = run_clc(policy, [exe, "each"], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    got = rounds(proc.stdout)
    # THEN on every device it ran on at most 16 SMs, in stream order, and every device got a
    # partition of its own, said once each
    assert sorted(dev for dev, _, _, _ in got) == list(range(devices)), got
    assert all(0 < d <= SMS and u == 0 and s == "ok" for _, d, u, s in got), got
    text = [m["text"] for m in report["messages"]]
    for dev in range(devices):
        assert sum(f"sm_share: {SMS} SMs of device {dev} is {SMS} of its" in m
                   for m in text) == 1, text


def test_one_library_load_serves_every_device(multi_bin, run_clc, tmp_path, tools):
    exe, devices = multi_bin
    # GIVEN scale wrapped with block_count on every device
    policy = write_policy(tmp_path / "p.yaml", [("count", "scale*", "wrap",
                                                 {"wrapper": "block_count",
                                                  "on_unwrappable": "deny"})])
    proc, report = run_clc(policy, [exe, "each"], tmp_path)
    assert proc.returncode == 0, tools.describe(proc)
    assert all(s == "ok" for _, _, _, s in rounds(proc.stdout))
    # THEN the wrapped kernel was built and loaded once (cuLibraryLoadData is
    # context-independent) and used in every device's context, and it counted every block
    text = [m["text"] for m in report["messages"]]
    assert any(f"wrap libraries: 1 cuLibraryLoadData call, {devices} contexts" in m
               for m in text), text
    stats = [s for s in wrap_stats(report) if s["kernel"].startswith("scale")]
    assert sum(s["blocks"] for s in stats) == devices * 256, stats


@pytest.mark.parametrize("policy_name", ["share", "deny-debug", "time-all.yaml"])
def test_threads_moving_between_devices(multi_bin, run_clc, tmp_path, tools, policy_name):
    exe, devices = multi_bin
    if policy_name == "share":
        policy = write_policy(tmp_path / "p.yaml", [("confine", "stamp*", "wrap",
                                                     {"wrapper": "sm_share",
                                                      "params": {"sms": SMS}})])
    elif policy_name == "deny-debug":
        policy = write_policy(tmp_path / "p.yaml", [("no-debug", "*debug*", "deny", {})])
    else:
        policy = policy_name
    # WHEN four threads go round the devices 20 times each
    proc, report = run_clc(policy, [exe, "threads", "20"], tmp_path)
    # THEN every round's checks held on every device, and the capture is whole
    assert proc.returncode == 0, tools.describe(proc)
    got = rounds(proc.stdout)
    assert len(got) == 80 and all(u == 0 and s == "ok" for _, _, u, s in got), got
    if policy_name == "share":
        assert all(0 < d <= SMS for _, d, _, _ in got), got
    assert_capture_ok(report, proc)
    launches = sum(k["launches"] for k in report["kernels"])
    assert launches == 160, report["kernels"]
    if policy_name == "time-all.yaml":
        assert_all_timed(report, run=proc)

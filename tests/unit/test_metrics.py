# SPDX-License-Identifier: Apache-2.0
"""`clc metrics`: captures counted per job, user, tenant, GPU and kernel, read back with the
Prometheus client's own parser, and joined with DCGM exporter's series as a query would."""

import os
import pwd
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capture_writer import CaptureWriter

ME = pwd.getpwuid(os.getuid()).pw_name
# Two GPUs of a node, as the driver gives their UUIDs, and as nvidia-smi and DCGM write them.
GPU_A = bytes.fromhex("5a1b2c3d4e5f60718293a4b5c6d7e8f9")
GPU_B = bytes.fromhex("0123456789abcdef0123456789abcdef")
UUID_A = "GPU-5a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
UUID_B = "GPU-01234567-89ab-cdef-0123-456789abcdef"


def capture(path, job, tenant, kernels, holds=(), pid=100, device=0, uuid=GPU_A,
            capped_bytes=0):
    """kernels: [(mangled, launches, denied, gpu_ns, confined_sms)]; the process's device
    `device` is the GPU `uuid` (None: no DEVICE record)."""
    w = CaptureWriter(pid=pid)
    w.process("./train")
    w.run({"tenant": tenant, "uid": os.getuid(), "labels": {"job": job, "step": "0"}})
    if uuid is not None:
        w.device(device, uuid)
    for i, (mangled, launches, denied, gpu_ns, sms) in enumerate(kernels):
        w.kernel(i, mangled, device=device)
        w.kernel_stats(i, launches=launches, denied=denied, gpu_ns=gpu_ns,
                       timed=launches if gpu_ns else 0, confined_sms=sms)
    for held_ns in holds:
        w.hold(10**9, held_ns, device=device)
    w.end(capped_bytes=capped_bytes)
    return w.write(path)


def metrics(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "clc", "metrics", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, timeout=60)
    return p


def samples(text):
    """{(metric, frozenset(labels without Hostname)): value}, parsed by prometheus_client."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {k: v for k, v in s.labels.items() if k != "Hostname"}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def key(name, **labels):
    return (name, frozenset(labels.items()))


@pytest.fixture
def node(tmp_path):
    d = tmp_path / "captures"
    (d / "7").mkdir(parents=True)
    (d / "8").mkdir()
    capture(d / "7" / "0.0.clc", "7", "physics",
            [("_Z6vecAddPKfS0_Pfi", 10, 0, 2_000_000, 0), ("_Z12debug_kernelPi", 0, 2, 0, 0)])
    capture(d / "7" / "0.1.clc", "7", "physics", [("_Z6vecAddPKfS0_Pfi", 5, 0, 1_000_000, 0)],
            pid=101)
    capture(d / "8" / "0.0.clc", "8", "chem", [("_Z5scalePff", 4, 0, 0, 33)],
            holds=(3_000_000, 1_000_000), pid=102, device=1, uuid=GPU_B)
    return d


def test_a_partial_capture_is_counted_whole_and_said(tmp_path):
    # GIVEN two captures of a job, one whose launch records met its size cap
    capture(tmp_path / "a.clc", "5", "t", [("_Z5scalePff", 3_000_000, 0, 0, 0)],
            capped_bytes=10**9)
    capture(tmp_path / "b.clc", "5", "t", [("_Z5scalePff", 7, 0, 0, 0)], pid=101)
    p = metrics(tmp_path)
    assert p.returncode == 0, p.stderr
    got = samples(p.stdout)
    run = dict(hpc_job="5", user=ME, tenant="t")
    # THEN its counts are counted as they are, and the job's gauge and stderr say one was partial
    assert got[key("clc_launches_total", **run, UUID=UUID_A, kernel="scale(float*, float)")] == \
        3_000_007
    assert got[key("clc_captures_partial", **run)] == 1
    assert "1 capture partial" in p.stderr and "a.clc" in p.stderr


def test_counts_per_job_user_tenant_gpu_and_kernel(node):
    p = metrics(node, "--hostname", "gpu07")
    assert p.returncode == 0, p.stderr
    got = samples(p.stdout)
    vec = dict(hpc_job="7", user=ME, tenant="physics", UUID=UUID_A,
               kernel="vecAdd(float const*, float const*, float*, int)")
    assert got[key("clc_launches_total", **vec)] == 15
    assert got[key("clc_kernel_gpu_seconds_total", **vec)] == pytest.approx(0.003)
    assert got[key("clc_launches_denied_total", **{**vec, "kernel": "debug_kernel(int*)"})] == 2
    scale = dict(hpc_job="8", user=ME, tenant="chem", UUID=UUID_B, kernel="scale(float*, float)")
    assert got[key("clc_launches_confined_total", **scale)] == 4
    held = dict(hpc_job="8", user=ME, tenant="chem", UUID=UUID_B)
    assert got[key("clc_holds_total", **held)] == 2
    assert got[key("clc_held_seconds_total", **held)] == pytest.approx(0.004)
    assert got[key("clc_processes", hpc_job="7", user=ME, tenant="physics")] == 2
    assert 'Hostname="gpu07"' in p.stdout


def test_kernels_past_the_cap_are_counted_together_and_said(tmp_path):
    kernels = [(f"_Z2k{i}v", 100 - i, 0, 0, 0) for i in range(5)]
    capture(tmp_path / "a.clc", "9", "t", kernels)
    p = metrics(tmp_path, "--max-kernels", "3")
    got = samples(p.stdout)
    names = {dict(labels)["kernel"] for (name, labels) in got if name == "clc_launches_total"}
    assert names == {"k0()", "k1()", "(other)"}
    other = key("clc_launches_total", hpc_job="9", user=ME, tenant="t", UUID=UUID_A,
                kernel="(other)")
    assert got[other] == 98 + 97 + 96
    assert got[key("clc_kernels_folded", hpc_job="9", user=ME, tenant="t")] == 3
    assert "job 9 of" in p.stderr and "more than 3 distinct kernels: 3 with the fewest" in p.stderr


def test_the_textfile_is_replaced_whole_and_only_with_force(node, tmp_path):
    out = tmp_path / "clc.prom"
    p = metrics(node, "-o", out)
    assert p.returncode == 0 and "3 captures counted into" in p.stderr, p.stderr
    first = out.read_text()
    assert samples(first)
    p = metrics(node, "-o", out)
    assert p.returncode == 2 and "exists" in p.stderr and out.read_text() == first
    inode = out.stat().st_ino
    assert metrics(node, "-o", out, "--force").returncode == 0
    assert out.stat().st_ino != inode  # renamed into place, not rewritten
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []


def test_a_link_at_the_output_is_not_followed(node, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / "clc.prom").symlink_to(target)
    p = metrics(node, "-o", tmp_path / "clc.prom", "--force")
    assert p.returncode == 2 and "symbolic link" in p.stderr
    assert target.read_text() == "keep"


def test_files_that_are_not_captures_are_left_out_and_said(node):
    (node / "8" / "junk.clc").write_bytes(b"not a capture")
    p = metrics(node)
    assert p.returncode == 0
    assert "1 file left out, not readable as captures" in p.stderr and "junk.clc" in p.stderr
    assert samples(p.stdout)[key("clc_processes", hpc_job="8", user=ME, tenant="chem")] == 1


def test_a_missing_path_is_an_error(tmp_path):
    p = metrics(tmp_path / "nowhere")
    assert p.returncode == 2 and "no such file or folder" in p.stderr


def test_the_user_is_the_files_owner_and_the_job_its_directory(tmp_path):
    """A capture's writer may claim any uid, job or label length: the owner of the file and
    the plugin's directory (CAPTURES/<job id>/) say who and which job."""
    d = tmp_path / "captures" / "77"
    d.mkdir(parents=True)
    w = CaptureWriter(pid=9)
    w.process("./x")
    w.run({"tenant": "t" * 1000, "uid": 12345, "labels": {"job": "1111"}})
    w.kernel(0, "_Z1kv", device=999)
    w.device(999, GPU_A)
    w.kernel_stats(0, launches=3)
    w.end()
    w.write(d / "0.0.clc")
    got = samples(metrics(tmp_path / "captures").stdout)
    ((name, labels),) = [k for k in got if k[0] == "clc_launches_total"]
    labels = dict(labels)
    assert labels["user"] == ME and labels["hpc_job"] == "77" and labels["UUID"] == UUID_A
    assert len(labels["tenant"]) == 128 and labels["tenant"].endswith("...")


def test_gpus_past_what_a_node_holds_are_counted_together(tmp_path):
    # GIVEN a capture whose writer names 100 GPUs, one kernel on each
    w = CaptureWriter()
    w.run({"tenant": "t", "labels": {"job": "5"}})
    for device in range(100):
        w.device(device, bytes([device]) * 16)
        w.kernel(device, f"_Z2k{device}v", device=device)
        w.kernel_stats(device, launches=1)
    w.end()
    w.write(tmp_path / "many.clc")
    # WHEN the node's metrics are made
    got = samples(metrics(tmp_path, "--max-kernels", "1000").stdout)
    # THEN 64 GPUs are named and the others counted together as UUID="(other)"
    uuids = [dict(labels)["UUID"] for name, labels in got if name == "clc_launches_total"]
    assert len(uuids) == 100 and len(set(uuids)) == 65
    assert uuids.count("(other)") == 36


def test_a_capture_without_device_records_has_an_empty_uuid(tmp_path):
    # GIVEN a capture of a shim or driver that did not say its GPU's UUID
    capture(tmp_path / "old.clc", "3", "t", [("_Z1kv", 2, 0, 0, 0)], uuid=None)
    # THEN its series have UUID="", which Prometheus reads as no UUID
    got = samples(metrics(tmp_path).stdout)
    assert got[key("clc_launches_total", hpc_job="3", user=ME, tenant="t", UUID="",
                   kernel="k()")] == 2


# A DCGM exporter scrape of the same node (dcgm-exporter's default counters, with
# --hpc-job-mapping-dir naming each GPU's job), and a PromQL join by (Hostname, UUID):
# clc_launches_total * on (Hostname, UUID) group_left(modelName) DCGM_FI_DEV_GPU_UTIL
DCGM = f"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="2",UUID="{UUID_A}",device="nvidia2",\
modelName="NVIDIA H100 80GB HBM3",Hostname="gpu07",hpc_job="7"}} 87
DCGM_FI_DEV_GPU_UTIL{{gpu="5",UUID="{UUID_B}",device="nvidia5",\
modelName="NVIDIA H100 80GB HBM3",Hostname="gpu07",hpc_job="8"}} 12
"""


def test_series_join_with_dcgm_exporters_by_hostname_and_uuid(node, tmp_path):
    # GIVEN a node where job 7's processes ran on one GPU and job 8's on another, each GPU its
    # process's device 0 (as CUDA_VISIBLE_DEVICES makes it in every Slurm job)
    (node / "8" / "0.0.clc").unlink()
    capture(node / "8" / "0.0.clc", "8", "chem", [("_Z5scalePff", 4, 0, 0, 33)], pid=102,
            device=0, uuid=GPU_B)
    # WHEN the node's metrics are written for node_exporter and scraped
    out = tmp_path / "clc.prom"
    assert metrics(node, "--hostname", "gpu07", "-o", out).returncode == 0
    clc = [s for fam in text_string_to_metric_families(out.read_text()) for s in fam.samples]
    dcgm = [s for fam in text_string_to_metric_families(DCGM) for s in fam.samples]
    # THEN no clc label is one Prometheus sets itself (job, instance) or means otherwise in
    # DCGM's series (gpu, device)
    assert not {"job", "instance", "gpu", "device"} & {k for s in clc for k in s.labels}
    # and each series of a GPU finds exactly its GPU's DCGM series, whose job is its job
    joined = 0
    for s in clc:
        if "UUID" not in s.labels:
            continue
        match = [d for d in dcgm if (d.labels["Hostname"], d.labels["UUID"]) ==
                 (s.labels["Hostname"], s.labels["UUID"])]
        assert len(match) == 1, s
        assert match[0].labels["hpc_job"] == s.labels["hpc_job"], s
        joined += 1
    assert joined > 6
    util = {s.labels["kernel"]: next(d.value for d in dcgm if d.labels["UUID"] == s.labels["UUID"])
            for s in clc if s.name == "clc_launches_total"}
    assert util == {"vecAdd(float const*, float const*, float*, int)": 87,
                    "debug_kernel(int*)": 87, "scale(float*, float)": 12}


def test_links_and_other_files_are_not_opened(tmp_path, node):
    (node / "8" / "link.clc").symlink_to(node / "7" / "0.0.clc")
    p = metrics(node / "8" / "link.clc")
    assert p.returncode == 0 and "not readable as captures" in p.stderr
    assert "clc_processes{" not in p.stdout


def test_runs_past_the_cap_are_counted_together_and_said(tmp_path):
    for job in range(5):
        capture(tmp_path / f"{job}.clc", str(job), "t", [("_Z1kv", 10 + job, 0, 0, 0)],
                pid=200 + job)
    p = metrics(tmp_path, "--max-jobs", "3")
    got = samples(p.stdout)
    jobs = {dict(labels)["hpc_job"] for (name, labels) in got if name == "clc_processes"}
    assert jobs == {"4", "3", "(other)"}
    other = key("clc_launches_total", hpc_job="(other)", user="(other)", tenant="(other)",
                UUID=UUID_A, kernel="(other)")
    assert got[other] == 10 + 11 + 12
    assert got[key("clc_jobs_folded")] == 3
    assert "more than 3 distinct runs (job, user, tenant): 3 with the fewest" in p.stderr

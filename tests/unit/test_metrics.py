# SPDX-License-Identifier: Apache-2.0
"""`clc metrics`: captures counted per job, user, tenant, GPU and kernel, read back with the
Prometheus client's own parser."""

import os
import pwd
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from capture_writer import CaptureWriter

ME = pwd.getpwuid(os.getuid()).pw_name


def capture(path, job, tenant, kernels, holds=(), pid=100, device=0, capped_bytes=0):
    """kernels: [(mangled, launches, denied, gpu_ns, confined_sms)]"""
    w = CaptureWriter(pid=pid)
    w.process("./train")
    w.run({"tenant": tenant, "uid": os.getuid(), "labels": {"job": job, "step": "0"}})
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
            holds=(3_000_000, 1_000_000), pid=102, device=1)
    return d


def test_a_partial_capture_is_counted_whole_and_said(tmp_path):
    # GIVEN two captures of a job, one whose launch records met its size cap
    capture(tmp_path / "a.clc", "5", "t", [("_Z5scalePff", 3_000_000, 0, 0, 0)],
            capped_bytes=10**9)
    capture(tmp_path / "b.clc", "5", "t", [("_Z5scalePff", 7, 0, 0, 0)], pid=101)
    p = metrics(tmp_path)
    assert p.returncode == 0, p.stderr
    got = samples(p.stdout)
    run = dict(job="5", user=ME, tenant="t")
    # THEN its counts are counted as they are, and the job's gauge and stderr say one was partial
    assert got[key("clc_launches_total", **run, gpu="0", kernel="scale(float*, float)")] == \
        3_000_007
    assert got[key("clc_captures_partial", **run)] == 1
    assert "1 capture(s) partial" in p.stderr and "a.clc" in p.stderr


def test_counts_per_job_user_tenant_gpu_and_kernel(node):
    p = metrics(node, "--hostname", "gpu07")
    assert p.returncode == 0, p.stderr
    got = samples(p.stdout)
    vec = dict(job="7", user=ME, tenant="physics", gpu="0",
               kernel="vecAdd(float const*, float const*, float*, int)")
    assert got[key("clc_launches_total", **vec)] == 15
    assert got[key("clc_kernel_gpu_seconds_total", **vec)] == pytest.approx(0.003)
    assert got[key("clc_launches_denied_total", **{**vec, "kernel": "debug_kernel(int*)"})] == 2
    scale = dict(job="8", user=ME, tenant="chem", gpu="1", kernel="scale(float*, float)")
    assert got[key("clc_launches_confined_total", **scale)] == 4
    held = dict(job="8", user=ME, tenant="chem", gpu="1")
    assert got[key("clc_holds_total", **held)] == 2
    assert got[key("clc_held_seconds_total", **held)] == pytest.approx(0.004)
    assert got[key("clc_processes", job="7", user=ME, tenant="physics")] == 2
    assert 'Hostname="gpu07"' in p.stdout


def test_kernels_past_the_cap_are_counted_together_and_said(tmp_path):
    kernels = [(f"_Z2k{i}v", 100 - i, 0, 0, 0) for i in range(5)]
    capture(tmp_path / "a.clc", "9", "t", kernels)
    p = metrics(tmp_path, "--max-kernels", "3")
    got = samples(p.stdout)
    names = {dict(labels)["kernel"] for (name, labels) in got if name == "clc_launches_total"}
    assert names == {"k0()", "k1()", "(other)"}
    other = key("clc_launches_total", job="9", user=ME, tenant="t", gpu="0", kernel="(other)")
    assert got[other] == 98 + 97 + 96
    assert got[key("clc_kernels_folded", job="9", user=ME, tenant="t")] == 3
    assert "job 9 of" in p.stderr and "more than 3 distinct kernels: 3 with the fewest" in p.stderr


def test_the_textfile_is_replaced_whole_and_only_with_force(node, tmp_path):
    out = tmp_path / "clc.prom"
    p = metrics(node, "-o", out)
    assert p.returncode == 0 and "3 capture(s) counted into" in p.stderr, p.stderr
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
    assert "1 file(s) left out, not readable as captures" in p.stderr and "junk.clc" in p.stderr
    assert samples(p.stdout)[key("clc_processes", job="8", user=ME, tenant="chem")] == 1


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
    w.kernel_stats(0, launches=3)
    w.end()
    w.write(d / "0.0.clc")
    got = samples(metrics(tmp_path / "captures").stdout)
    ((name, labels),) = [k for k in got if k[0] == "clc_launches_total"]
    labels = dict(labels)
    assert labels["user"] == ME and labels["job"] == "77" and labels["gpu"] == "(other)"
    assert len(labels["tenant"]) == 128 and labels["tenant"].endswith("...")


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
    jobs = {dict(labels)["job"] for (name, labels) in got if name == "clc_processes"}
    assert jobs == {"4", "3", "(other)"}
    other = key("clc_launches_total", job="(other)", user="(other)", tenant="(other)", gpu="0",
                kernel="(other)")
    assert got[other] == 10 + 11 + 12
    assert got[key("clc_jobs_folded")] == 3
    assert "more than 3 distinct runs (job, user, tenant): 3 with the fewest" in p.stderr

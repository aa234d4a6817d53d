# SPDX-License-Identifier: Apache-2.0
"""A multi-process NCCL job (examples/ddp_train.py under torchrun, one process per GPU) under
clc-run: a deny rule, time-all, a per-kernel share and a program-wide share. Each rank is a
process of its own that inherits the shim from torchrun and writes a capture of its own.
Skipped with fewer than two GPUs (run on the device tool's nvidia-h100-x2 kind)."""

import math
import re
import sys

import pytest

from gpu_runs import (assert_all_timed, assert_capture_ok, probe_driver, program_policy,
                      write_policy)

pytestmark = pytest.mark.gpu

RANKS = 2
SMS = 16
STEPS = 20


@pytest.fixture(scope="module")
def ddp(tools):
    info, reason = probe_driver()
    if info is None or info.devices < RANKS:
        pytest.skip(f"needs {RANKS} GPUs: {reason or f'{info.devices} found'}")
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={RANKS}", tools.examples / "ddp_train.py", "--steps", STEPS]


def ranks(stdout):
    """rank -> {"loss", "checksum", "cumsum" (or None when refused), "done"}. (ddp_train.py
    writes each line in one write, so the ranks' lines never interleave.)"""
    out = {}
    for m in re.finditer(r"^rank (\d+) loss=(\S+) checksum=(\S+)$", stdout, re.M):
        out.setdefault(int(m[1]), {}).update(loss=float(m[2]), checksum=float(m[3]))
    for m in re.finditer(r"^rank (\d+) cumsum(?:=(\d+)| refused: (.*))$", stdout, re.M):
        out.setdefault(int(m[1]), {}).update(cumsum=int(m[2]) if m[2] else None, refused=m[3])
    for m in re.finditer(r"^rank (\d+) done$", stdout, re.M):
        out.setdefault(int(m[1]), {})["done"] = True
    return out


@pytest.fixture(scope="module")
def native(ddp, run_native, tools):
    proc = run_native(ddp)
    assert proc.returncode == 0, tools.describe(proc)
    got = ranks(proc.stdout)
    assert sorted(got) == list(range(RANKS)) and all(r.get("done") for r in got.values()), \
        tools.describe(proc)
    assert all(r["cumsum"] == 500500 for r in got.values()), got
    return got


def same_training(got, native):
    for rank, want in native.items():
        assert math.isclose(got[rank]["loss"], want["loss"], rel_tol=1e-5), (rank, got, native)
        assert math.isclose(got[rank]["checksum"], want["checksum"], rel_tol=1e-5), \
            (rank, got, native)


def nccl_rows(report):
    return [k for k in report["kernels"] if "nccl" in (k.get("name") or k.get("mangled"))]


@pytest.mark.parametrize("policy_name", ["deny-scan", "time-all.yaml", "share", "program"])
def test_nccl_job_under_clc(ddp, native, run_clc, tmp_path, tools, policy_name):
    if policy_name == "deny-scan":
        policy = tools.deny_policy(tmp_path / "p.yaml", ["*Scan*", "*scan*"])
    elif policy_name == "share":
        policy = write_policy(tmp_path / "p.yaml", [("share", "*", "wrap",
                                                     {"wrapper": "sm_share",
                                                      "params": {"sms": SMS}})])
    elif policy_name == "program":
        policy = program_policy(tmp_path / "p.yaml", {"sms": SMS}, on_unwrappable="allow")
    else:
        policy = policy_name
    proc, report = run_clc(policy, ddp, tmp_path)
    # THEN every rank trained to the native loss and weights, and ended cleanly
    assert proc.returncode == 0, tools.describe(proc)
    got = ranks(proc.stdout)
    assert sorted(got) == list(range(RANKS)) and all(r.get("done") for r in got.values()), \
        tools.describe(proc)
    same_training(got, native)
    # AND each rank's process wrote a whole capture, which saw its NCCL kernels
    assert_capture_ok(report, proc)
    assert len(report["captures"]) >= RANKS, report["captures"]
    rows = nccl_rows(report)
    assert rows and sum(k["launches"] for k in rows) >= RANKS * STEPS, report["kernels"]
    assert set().union(*(k["devices"] for k in rows)) == set(range(RANKS)), rows
    assert all(k["denied"] == 0 and k["failed"] == 0 for k in rows), rows
    if policy_name == "deny-scan":
        # AND the scan kernel was refused on every rank, and nothing else was
        assert all("cumsum" in r and r["cumsum"] is None and
                   tools.not_permitted.search(r["refused"]) for r in got.values()), \
            (got, tools.describe(proc))
        denied = [k for k in report["kernels"] if k["denied"]]
        assert denied and all(re.search("scan", k["name"], re.I) for k in denied), denied
        assert sum(k["denied"] for k in denied) >= RANKS, denied
    else:
        assert all(r.get("cumsum") == 500500 for r in got.values()), (got, tools.describe(proc))
        assert all(k["denied"] == 0 for k in report["kernels"]), report["kernels"]
    if policy_name == "time-all.yaml":
        assert_all_timed(report, run=proc)
    if policy_name in ("share", "program"):
        # AND the NCCL kernels ran confined to 16 SMs on both devices
        assert all(k["confined_sms"] == [SMS] for k in rows), rows

# SPDX-License-Identifier: Apache-2.0
"""A real Slurm cluster (tests/slurm/cluster.py: munged, slurmctld and a slurmd on localhost)
runs CUDA programs on the real GPU under the administrator's plugstack.conf line: every task
confined to a share of the GPU (sm_share, scope: program), a debug kernel refused, the tenant
taken from the job's account, captures where the line says. Needs root and Slurm installed
(tests/slurm/install-packages.sh; on a machine without a package registry, Ubuntu's .debs
unpacked by hand)."""

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from gpu_runs import REPO, build_or_fail

sys.path.insert(0, str(REPO / "tests" / "slurm"))
from cluster import Cluster, missing  # noqa: E402

from clc.capture.reader import read_captures  # noqa: E402

pytestmark = pytest.mark.gpu

PLUGIN = REPO / "clc" / "libclc_spank.so"
SMS = 16
POLICY = f"""\
version: 1
default: allow
on_error: deny
rules:
  - name: no-debug
    match: {{kernel: "*debug*"}}
    action: deny
  - name: whole-program
    action: wrap
    wrapper: sm_share
    params: {{sms: {SMS}, scope: program}}
    on_unwrappable: deny
"""


@pytest.fixture(scope="module")
def site(nvcc, cuda_arch):
    reason = missing()
    if reason is None and not PLUGIN.exists():
        reason = "the SPANK plugin is not built (spank.h was missing when clc was installed)"
    if reason:
        pytest.skip(reason)
    top = Path(tempfile.mkdtemp(prefix="clc-slurm-gpu-"))
    os.chmod(top, 0o755)
    for d in ("bin", "etc", "captures", "cluster"):
        (top / d).mkdir()
        os.chmod(top / d, 0o755)
    vecadd = top / "bin" / "vecadd"
    build_or_fail("vecadd", [[nvcc, "-O2", f"-arch={cuda_arch}", "-o", vecadd,
                       REPO / "examples" / "vecadd.cu"]])
    (top / "etc" / "policy.yaml").write_text(POLICY)
    line = (f"required {PLUGIN} policy={top / 'etc' / 'policy.yaml'} python={sys.executable} "
            f"captures={top / 'captures'} tenant=account")
    cluster = Cluster(top / "cluster", [line], nodes=1, cpus=4)
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    yield {"top": top, "cluster": cluster, "vecadd": vecadd}
    cluster.stop()
    shutil.rmtree(top, ignore_errors=True)


def results(text):
    """task -> {kernel: result} from vecadd's `result KERNEL ok|mismatch|skipped` lines."""
    out = {}
    for m in re.finditer(r"^(\d+): result (\S+) (\S+)$", text, re.M):
        out.setdefault(m[1], {})[m[2]] = m[3]
    return out


def test_a_cuda_step_runs_confined_under_the_administrators_policy(site, tools):
    cluster = site["cluster"]
    # WHEN a step of two tasks runs vecadd on the GPU
    p = cluster.srun("-n2", "--label", "--account=research", site["vecadd"], 20, timeout=300)
    assert p.returncode == 0, f"{p.stdout}\n{p.stderr}\n{cluster.logs()}"
    # THEN each task computed right, its debug kernel refused
    assert results(p.stdout) == {t: {"vecAdd": "ok", "scale_kernel": "ok",
                                     "debug_fill": "skipped"} for t in ("0", "1")}, p.stdout
    # AND each task wrote its capture in the job's directory: its kernels confined to the share,
    # the debug kernel's launches denied, the tenant the job's account
    (job,) = (site["top"] / "captures").iterdir()
    caps = read_captures(sorted(job.glob("0.*.clc")))
    assert len(caps) == 2, sorted(job.iterdir())
    for cap in caps:
        assert cap.complete and cap.run["tenant"] == "research", cap.run
        by_name = {cap.kernels[k].name.split("(")[0]: st for k, st in cap.stats.items()}
        assert by_name["vecAdd"].launches == 20 and by_name["vecAdd"].confined_sms == SMS
        assert by_name["scale_kernel"].confined_sms == SMS
        assert by_name["debug_fill"].denied == by_name["debug_fill"].launches == 10
        print(f"\n{cap.path}: tenant {cap.run['tenant']}, " + ", ".join(
            f"{n} launches {st.launches} denied {st.denied} confined_sms {st.confined_sms}"
            for n, st in sorted(by_name.items())))

# SPDX-License-Identifier: Apache-2.0
"""What the Slurm tests share: whether they can run here, and clc installed where the jobs of
every user can run it (install.py), once per session."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from cluster import missing  # noqa: E402
from install import install_clc  # noqa: E402


def require_slurm():
    """Skips the test where Slurm's packages or the plugin are missing (fails it on CI)."""
    reason = missing()
    built = [ROOT / "clc" / name for name in ("libclc_spank.so", "clc-slurm-exec")]
    if reason is None and not all(p.exists() for p in built):
        reason = ("the SPANK plugin is not built (libclc_spank.so, clc-slurm-exec): spank.h was "
                  "missing when clc was installed")
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Slurm tests cannot run on CI: {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def clc_for_jobs():
    """clc installed as docs/deploy.md says, in a venv of the system's Python under a directory
    of root's that every user can enter: what the cluster's plugstack.conf line names."""
    require_slurm()
    top = Path(tempfile.mkdtemp(prefix="clc-slurm-install-"))
    os.chmod(top, 0o755)
    try:
        yield install_clc(ROOT, top / "clc")
    finally:
        shutil.rmtree(top, ignore_errors=True)

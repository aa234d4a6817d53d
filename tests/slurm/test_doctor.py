# SPDX-License-Identifier: Apache-2.0
"""`clc doctor`'s Slurm line says ok, with the plugstack.conf line, only where the plugin takes
the installation and a job's user can run it: the tasks of a job run as its user, and a clc
they cannot run stops every one of them (exit 127)."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from install import Install  # noqa: E402


def slurm_line(python, user=None):
    """doctor's Slurm line, run by `python` (as `user` where given)."""
    argv = [str(python), "-I", "-m", "clc", "doctor"]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    m = re.search(r"^(\S+) +Slurm +(.*)$", p.stdout, re.M)
    assert m, p.stdout + p.stderr
    return m[1], m[2]


@pytest.fixture
def copy(clc_for_jobs):
    """A copy of the jobs' installation in a directory of its own (`holder`, root's, open to
    all), given back as an Install."""
    top = Path(tempfile.mkdtemp(prefix="clc-doctor-test-"))
    os.chmod(top, 0o755)
    holder = top / "holder"
    holder.mkdir(mode=0o755)
    shutil.copytree(clc_for_jobs.venv, holder / "venv", symlinks=True)
    package = holder / "venv" / clc_for_jobs.package.relative_to(clc_for_jobs.venv)
    yield holder, Install(holder / "venv", package)
    shutil.rmtree(top, ignore_errors=True)


def test_doctor_gives_the_line_where_every_user_can_run_clc(clc_for_jobs):
    mark, text = slurm_line(clc_for_jobs.python)
    assert mark == "ok", text
    assert text == (f"plugstack.conf: required {clc_for_jobs.plugin} "
                    f"policy=/etc/clc/policy.yaml python={clc_for_jobs.python} (docs/deploy.md)")


def test_doctor_says_when_jobs_cannot_enter_where_clc_lies(copy):
    """A Python under a directory closed to other users, as root's home."""
    holder, install = copy
    os.chmod(holder, 0o700)
    mark, text = slurm_line(install.python)
    assert mark == "-", text
    assert text.startswith(f"jobs cannot run this clc: {holder} (mode 0700) cannot be entered by "
                           "other users; under the plugin every task would stop."), text


def test_doctor_tries_clc_as_a_jobs_user(copy):
    """What only a run as another user finds: a dependency of clc's that no one else can read,
    with clc's own files open to all."""
    _, install = copy
    (yaml,) = install.package.parent.glob("yaml")
    os.chmod(yaml, 0o700)
    mark, text = slurm_line(install.python)
    assert mark == "-", text
    assert re.match(rf"jobs cannot run this clc: {re.escape(str(install.python))} -I -m clc "
                    r"fails as user nobody: ", text), text


def test_doctor_as_another_user_reads_the_modes(copy):
    """Run by a user other than root, doctor cannot act as a job's user: it reads what the
    files' modes let other users do."""
    _, install = copy
    os.chmod(install.launcher, 0o700)
    mark, text = slurm_line(install.python, user="nobody")
    assert mark == "-", text
    assert text.startswith(f"jobs cannot run this clc: {install.launcher} (mode 0700) cannot be "
                           "run by other users"), text


def test_doctor_says_what_the_plugin_would_refuse(copy):
    """clc's files in a directory another user owns: the plugin refuses the line."""
    holder, install = copy
    nobody = subprocess.run(["id", "-u", "nobody"], capture_output=True, text=True, check=True)
    os.chown(holder, int(nobody.stdout), -1)
    mark, text = slurm_line(install.python)
    assert mark == "-", text
    assert text.startswith(f"jobs cannot run this clc: {install.launcher}: expected a file owned "
                           f"by root and writable by nobody else, through such directories "
                           f"({holder} is not)"), text

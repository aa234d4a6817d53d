# SPDX-License-Identifier: Apache-2.0
"""clc-slurm-exec, the first program of a task the SPANK plugin puts under clc, started here
by hand with settings made as the plugin makes them (tests/slurm runs it under a real Slurm)."""

import fcntl
import os
import subprocess
import sys

import pytest
from harness import DENY_DEBUG_ONLY, ROOT, env_for

LAUNCHER = ROOT / "clc" / "clc-slurm-exec"
SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def settings(name="clc-slurm-task", seal=True, **values):
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.write(fd, b"".join(f"{k}={v}".encode() + b"\0" for k, v in values.items()))
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


@pytest.fixture
def task(native, tmp_path):
    if not LAUNCHER.exists():
        pytest.fail(f"{LAUNCHER} is not built: run the tests through `make test`")
    policy = tmp_path / "policy.yaml"
    policy.write_text(DENY_DEBUG_ONLY)

    def run(fd, argv, env=None):
        try:
            return subprocess.run([LAUNCHER, *argv[1:]], pass_fds=(fd,), capture_output=True,
                                  text=True, timeout=60, cwd=tmp_path,
                                  env={**env_for(native), "CLC_SLURM_FD": str(fd), **(env or {})})
        finally:
            os.close(fd)

    def good(**more):
        return {"python": sys.executable, "policy": policy, "tenant": "", "output":
                tmp_path / "task.clc", "strict": "0", "report": "0", "hooks": "",
                "argv0": native["prog_cudart"], **more}
    return run, good


def test_the_tasks_program_runs_under_clc(task, native):
    run, good = task
    p = run(settings(**good()), ["clc-slurm-exec"])
    assert p.returncode == 0, p.stderr
    assert "fake: _Z12debug_kernelPi launches=0" in p.stdout
    assert "fake: _Z6vecAddPKfS0_Pfi launches=5" in p.stdout


def test_the_jobs_environment_reaches_the_program_only(task, native):
    """LD_PRELOAD of the job: the loader says once, for the program, that it cannot load the
    library (clc-run's Python ran without it); the rest of the job's environment reaches the
    program as it was."""
    run, good = task
    p = run(settings(**good()), ["clc-slurm-exec"], env={"LD_PRELOAD": "/nonexistent/job.so"})
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("/nonexistent/job.so") == 1, p.stderr
    assert "fake: _Z12debug_kernelPi launches=0" in p.stdout


@pytest.mark.parametrize("make,why", [
    (lambda good: settings(seal=False, **good()), "unsealed"),
    (lambda good: settings(name="other", **good()), "another name"),
    (lambda good: os.open("/dev/null", os.O_RDONLY), "not a memfd"),
])
def test_settings_not_made_by_the_plugin_stop_the_task(task, make, why):
    run, good = task
    p = run(make(good), ["clc-slurm-exec"])
    assert p.returncode == 127 and "fake:" not in p.stdout, why
    assert "CLC_SLURM_FD names no settings of the clc SPANK plugin" in p.stderr, why


def test_without_settings_the_task_stops(task, native):
    p = subprocess.run([LAUNCHER], capture_output=True, text=True, env=env_for(native))
    assert p.returncode == 127
    assert "CLC_SLURM_FD is not set: start tasks through the clc SPANK plugin" in p.stderr


def test_the_program_gets_the_jobs_environment(task, native, tmp_path):
    run, good = task
    p = run(settings(**good(argv0="/bin/sh")),
            ["clc-slurm-exec", "-c", 'echo "FOO=$FOO LANG=${LANG-unset} FD=${CLC_SLURM_ENV_FD-}"'],
            env={"FOO": "bar baz", "LANG": "xx_XX.weird"})
    assert p.returncode == 0, p.stderr
    assert "FOO=bar baz LANG=xx_XX.weird FD=" in p.stdout

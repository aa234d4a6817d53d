# SPDX-License-Identifier: Apache-2.0
"""An MPS control daemon for a benchmark step: started with its own pipe and log directories,
stopped when the step ends, so that no benchmark leaves one running."""

import contextlib
import os
import shutil
import subprocess


class MpsUnavailable(RuntimeError):
    """The MPS control daemon did not start."""


def mps_control(env, command=None):
    """nvidia-cuda-mps-control -d (command None), or `command` on its standard input: (exit
    status, its output)."""
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        return 127, "nvidia-cuda-mps-control not found"
    proc = subprocess.run([exe] + ([] if command else ["-d"]), input=command, text=True,
                          capture_output=True, env={**os.environ, **env}, timeout=60)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


@contextlib.contextmanager
def mps_daemon(tmp, name, daemon_env=None):
    """An MPS control daemon for the block (its pipe and log under tmp/NAME-*; daemon_env
    added to its own environment: CUDA_VISIBLE_DEVICES for the GPUs it serves): yields the
    environment its clients need; MpsUnavailable when it does not start."""
    mps_env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp / f"{name}-pipe"),
               "CUDA_MPS_LOG_DIRECTORY": str(tmp / f"{name}-log")}
    for d in mps_env.values():
        os.makedirs(d, exist_ok=True)
    rc, text = mps_control({**mps_env, **(daemon_env or {})})
    if rc != 0:
        raise MpsUnavailable(f"the MPS daemon did not start (exit {rc}): {text}")
    try:
        yield mps_env
    finally:
        mps_control(mps_env, "quit\n")

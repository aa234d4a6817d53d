# SPDX-License-Identifier: Apache-2.0
"""`priority.mps` with a real MPS control daemon (docs/priority.md): clc-run starts this user's
daemon when none answers and the program runs as its client; a second program joins it; with
`join` and no daemon, the program runs without MPS and clc-run says so."""

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from gpu_runs import describe, run_program

pytestmark = pytest.mark.gpu

CONTROL = shutil.which("nvidia-cuda-mps-control")

# A CUDA program: its pid, then a context on device 0 and an allocation (an MPS client
# connects when its context is made).
PROGRAM = """\
import ctypes, os, sys
print("pid", os.getpid(), flush=True)
cuda = ctypes.CDLL("libcuda.so.1")
ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
for call, args in (("cuInit", (0,)), ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), 0)),
                   ("cuCtxSetCurrent", (ctx,)), ("cuMemAlloc_v2", (ctypes.byref(ptr), 1 << 20))):
    rc = getattr(cuda, call)(*args)
    if rc:
        sys.exit(f"{call} failed: {rc}")
print("context ok", flush=True)
"""


def policy(tmp_path, mode):
    path = tmp_path / f"mps-{mode}.yaml"
    path.write_text(f"version: 1\ndefault: allow\npriority:\n  board: {tmp_path}/board\n"
                    f"  mps: {mode}\n  classes:\n"
                    "    - {name: serving, class: latency-critical}\n")
    return path


def quit_daemon(pipe):
    if CONTROL and os.path.exists(os.path.join(pipe, "control")):
        subprocess.run([CONTROL], input="quit\n", text=True, capture_output=True, timeout=30,
                       env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe})
        for _ in range(100):
            if not os.path.exists(os.path.join(pipe, "control")):
                break
            time.sleep(0.1)


@pytest.fixture
def devices_env():
    """The program's GPU as CUDA_VISIBLE_DEVICES, and clc's pipe directory for it, with no
    daemon there before the test and none left after."""
    from clc.runtime.mps import clc_pipe_dir
    if CONTROL is None:
        pytest.skip("nvidia-cuda-mps-control is not on PATH")
    # the last GPU: on a machine of several, an index the MPS server numbers differently
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    gpus = sum(line.startswith("GPU ") for line in listed.splitlines())
    env = {"CUDA_VISIBLE_DEVICES": str(max(gpus, 1) - 1)}
    pipe = clc_pipe_dir(env)
    quit_daemon(pipe)
    yield env, pipe
    quit_daemon(pipe)


def run(clc_scripts, tmp_path, mode, env, name):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    proc = run_program([clc_scripts.run, "-v", "--policy", policy(tmp_path, mode), "-o",
                        tmp_path / f"{name}.clc", "--force", "--no-report", "--", sys.executable,
                        script], env=env, timeout=180)
    assert proc.returncode == 0 and "context ok" in proc.stdout, describe(proc)
    return proc, int(re.search(r"^pid (\d+)$", proc.stdout, re.M)[1])


def test_mps_start_starts_the_users_daemon_and_the_next_program_joins_it(clc_scripts, tmp_path,
                                                                          devices_env):
    env, pipe = devices_env
    log = os.path.join(os.path.dirname(pipe), "log", "control.log")
    # GIVEN no MPS daemon in clc's directory for this user and GPU
    # WHEN a latency-critical program runs under priority.mps: start
    first, pid = run(clc_scripts, tmp_path, "start", env, "first")
    # THEN clc-run started the daemon there, and the program was its client
    assert f"MPS: started a control daemon for this user at {pipe}" in first.stderr, \
        describe(first)
    if env["CUDA_VISIBLE_DEVICES"] != "0":
        assert f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} is 0 under that daemon" in \
            first.stderr, describe(first)
    assert os.path.exists(os.path.join(pipe, "control")), describe(first)
    text = open(log).read()
    assert re.search(rf"\b{pid}\b", text), f"pid {pid} not in {log}:\n{text[-3000:]}"
    st = os.lstat(os.path.dirname(pipe))
    assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0
    # AND a second program, under priority.mps: join, joins the same daemon
    second, pid2 = run(clc_scripts, tmp_path, "join", env, "second")
    assert f"MPS: joined the daemon at {pipe}" in second.stderr, describe(second)
    text = open(log).read()
    assert re.search(rf"\b{pid2}\b", text), f"pid {pid2} not in {log}:\n{text[-3000:]}"


def test_mps_join_without_a_daemon_runs_the_program_without_mps(clc_scripts, tmp_path,
                                                                 devices_env):
    env, pipe = devices_env
    if os.path.exists("/tmp/nvidia-mps/control"):
        pytest.skip("an MPS daemon runs at /tmp/nvidia-mps on this machine")
    proc, _ = run(clc_scripts, tmp_path, "join", env, "join")
    assert "warning: priority.mps: join: no MPS daemon answers at " in proc.stderr, describe(proc)
    assert "the program runs without MPS" in proc.stderr
    assert not os.path.exists(os.path.join(pipe, "control"))

# SPDX-License-Identifier: Apache-2.0
"""A program under a wrap rule whose kernels cannot be wrapped ends as it does without clc: with
its own status and output, after 100,000 launches, however it leaves (main returns, exit(), a
thread's exit() while the others still launch, the last thread's return after main ended by
pthread_exit), from one thread or several; and its capture is complete."""

import os
import re
import signal
import subprocess

import pytest

from clc import abi

from harness import Run, clc_command, env_for

LAUNCHES = 100_000
# How prog_exit leaves, and the status it leaves with.
STATUS = {"return": 3, "exit": 4, "thread-exit": 5, "thread-return": 0}

BLOCK_COUNT = """\
version: 1
default: allow
on_error: allow
rules:
  - name: count-blocks
    match: {kernel: "*"}
    action: wrap
    wrapper: block_count
    params: {}
    on_unwrappable: allow
"""


@pytest.fixture(scope="module")
def cubin(tmp_path_factory):
    """The fake programs' kernels as machine code alone (a cubin nvJitLink links for sm_90), as
    cuRAND ships its kernels: no PTX to rebuild a wrapped kernel from."""
    from clc.wrapping.build import link
    from pyhost import APP_PTX  # tests/fixtures/native, on sys.path through harness

    path = tmp_path_factory.mktemp("cubin") / "app.cubin"
    path.write_bytes(link([("app.ptx", APP_PTX)], 90, "the test kernels"))
    return path


def run_clc(native, tmp_path, argv, env=None, timeout=60):
    """clc-run of argv under BLOCK_COUNT, in a process group of its own that is killed, the
    program with it, when the run outlasts `timeout`."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(BLOCK_COUNT)
    output = tmp_path / "cap.clc"
    cmd = [*clc_command(), "--policy", str(policy), "-o", str(output), "--force", "--",
           *map(str, argv)]
    proc = subprocess.Popen(cmd, env=env_for(native, env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{argv[1:]} had not ended after {timeout} s:\n{stdout[-1000:]}"
                    f"{stderr[-2000:]}")
    return Run(subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr), output)


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("how", list(STATUS))
@pytest.mark.parametrize("unwrappable", ["no PTX", "cubins refused"])
def test_a_long_program_ends_with_its_own_status(native, cubin, tmp_path, unwrappable, how,
                                                 threads):
    # GIVEN a program making 100,000 launches whose kernels cannot be wrapped: their image has
    # no PTX (on_unwrappable: allow), or the driver refuses clc's wrapped kernels (on_error)
    if unwrappable == "no PTX":
        argv, env, said = [native["prog_exit"], how, threads, LAUNCHES, cubin], None, \
            "cannot be wrapped with block_count: no PTX"
    else:
        argv, env, said = [native["prog_exit"], how, threads, LAUNCHES], \
            {"FAKE_CUDA_REFUSE_CUBIN": "1"}, "with block_count failed"
    # WHEN it runs under the wrap rule and leaves by `how`
    run = run_clc(native, tmp_path, argv, env)
    # THEN it ends with its own status and output, its launches all made
    assert run.proc.returncode == STATUS[how], run.stderr[-3000:]
    m = re.search(r"^exit: threads=(\d+) launches=(\d+) ok=(\d+)$", run.stdout, re.M)
    assert m and int(m[1]) == threads and int(m[2]) == LAUNCHES, run.stdout[-1000:]
    assert said in run.stderr
    cap = run.capture()
    assert cap.complete and cap.end_how == abi.END_EXIT, run.stderr[-3000:]
    counted = sum(st.launches for st in cap.stats.values())
    if how == "thread-exit":  # the other threads launch on while it leaves
        assert counted >= int(m[3]) >= LAUNCHES // threads
    else:
        assert int(m[3]) == LAUNCHES
        assert counted == LAUNCHES
        assert sum(run.fake_counts().values()) == LAUNCHES

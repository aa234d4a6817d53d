# SPDX-License-Identifier: Apache-2.0
"""clc-run --strict tells the truth: it fails a run in which any process ran unseen, any launch
was refused (an on_unwrappable refusal included), a capture that a process opened or could not
open is missing or incomplete, or a decision table filled; it passes a run whose workers leave
cleanly with _exit. Its status is --error-exitcode's."""

import os
import re
import shutil
import stat
import sys
import tempfile

import pytest

from clc import abi
from clc.runtime.status import MAX_PER_SENDER

from harness import AUDIT, DENY_DEBUG_ONLY, ROOT, exec_results
from test_lifetime import DENY

VECADD = "_Z6vecAddPKfS0_Pfi"


def test_a_child_started_without_the_preload_is_seen(native, clc_run):
    # GIVEN a program that runs a CUDA program with LD_PRELOAD removed from its environment
    run = clc_run(DENY, ["sh", "-c", f"env -u LD_PRELOAD {native['prog_life']} dtor 6"],
                  options=["--strict"])
    # THEN the child runs under clc all the same: its six denied launches were refused
    assert run.stdout.count(" -> 800") == 6, run.stdout[-2000:] + run.stderr[-2000:]
    caps = run.captures()
    assert sum(s.denied for c in caps for s in c.stats.values()) == 6
    # AND --strict fails the run for them
    assert run.proc.returncode == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="making a setgid program needs root")
def test_a_process_the_loader_will_not_preload_into_fails_strict(native, clc_run, tmp_path):
    # GIVEN a setgid copy of a CUDA program: the loader ignores LD_PRELOAD for it
    prog = tmp_path / "setgid_prog"
    shutil.copy(native["prog_life"], prog)
    os.chown(prog, 0, 12345)
    os.chmod(prog, 0o755 | stat.S_ISGID)
    # WHEN a script runs it under clc
    run = clc_run(AUDIT, ["sh", "-c", f"{prog} plain 2"], options=["--strict"])
    # THEN it ran, unseen: clc-run names it, and --strict fails
    assert "launch" in run.stdout
    assert f"executed {prog} without clc's shim" in run.stderr, run.stderr
    assert run.proc.returncode == 3
    assert "1 process ran without clc's shim" in run.stderr


def test_an_on_unwrappable_refusal_is_a_denial(native, clc_run):
    # GIVEN a kernel confined by a green context on a device that cannot be partitioned, whose
    # rule refuses what it cannot confine
    policy = """\
version: 1
default: allow
rules:
  - name: half
    match: {kernel: "*vecAdd*"}
    action: wrap
    wrapper: sm_share
    params: {share: 0.5}
    on_unwrappable: deny
"""
    run = clc_run(policy, [native["prog_green"]], env={"FAKE_CUDA_NO_GREEN": "1"},
                  options=["--strict"])
    cap = run.capture()
    ids = {k for k, kernel in cap.kernels.items() if kernel.mangled == VECADD}
    launches = sum(cap.stats[k].launches + cap.stats[k].graph_nodes for k in ids)
    denied = sum(cap.stats[k].denied for k in ids)
    # THEN each refused launch and graph node is counted as denied by the rule, none as failed,
    # and recorded
    assert launches > 0 and denied == launches
    assert sum(cap.stats[k].failed for k in ids) == 0
    refused = [ln for ln in cap.launches if ln.kernel_id in ids]
    assert len(refused) == denied
    assert all(ln.action == abi.ACTION_DENY and ln.result == 800 for ln in refused)
    assert cap.rule_stats == {0: denied}
    # AND --strict fails the run
    assert run.proc.returncode == 3, run.stderr[-2000:]
    assert "denied" in run.stderr


def test_a_full_decision_table_fails_strict_and_keeps_its_counts(native, clc_run):
    # GIVEN a program that fills the decision table (50,000 live kernels), then launches a
    # denied kernel 100 times
    run = clc_run(DENY, [native["prog_life"], "fill", "50000"], options=["--strict"],
                  timeout=300)
    # THEN the launches past the table are still decided, and counted
    assert run.stdout.count("via fill -> 800") == 100
    cap = run.capture()
    assert cap.table_full and cap.rule_stats == {0: 100}
    loose = cap.stats[abi.KERNEL_UNCACHED]
    assert loose.denied == 100 and loose.launches == 50000 - 49152 + 100
    assert sum(s.launches for s in cap.stats.values()) == 50100
    # AND --strict fails the run
    assert run.proc.returncode == 3
    assert "the decision table filled in 1 process" in run.stderr


def test_a_capture_that_could_not_be_written_fails_strict(native, clc_run, tmp_path):
    # GIVEN a forked child whose capture cannot be written (a folder is in its place)
    out = tmp_path / "cap.clc"
    run = clc_run(AUDIT, [native["prog_life"], "badchild"], env={"LIFE_CAPTURE": str(out)},
                  options=["--strict"])
    # THEN the run's other capture is fine, but --strict fails: one capture is missing
    assert run.proc.returncode == 3, run.stderr[-2000:]
    assert "1 capture of the run missing or unwritable" in run.stderr


PYWORKERS = """\
import ctypes, multiprocessing, sys
sys.path.insert(0, {native!r})
import pyhost

def work(n):
    cuda = pyhost.load_driver()
    dev, ctx, mod, fn = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    cuda.cuInit(0)
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    cuda.cuCtxSetCurrent(ctx)
    cuda.cuModuleLoadData(ctypes.byref(mod), pyhost.APP_PTX)
    cuda.cuModuleGetFunction(ctypes.byref(fn), mod, pyhost.K_SCALE)
    return sum(cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None) == 0
               for _ in range(n))

if __name__ == "__main__":
    multiprocessing.set_start_method("fork")
    with multiprocessing.Pool(4) as pool:
        print("workers", sum(pool.map(work, [5] * 8)), flush=True)
"""


def test_workers_that_leave_with_exit_pass_strict(native, clc_run, tmp_path):
    # GIVEN a Python program whose multiprocessing workers launch, then leave with os._exit
    script = tmp_path / "workers.py"
    script.write_text(PYWORKERS.format(native=str(ROOT / "tests" / "fixtures" / "native")))
    run = clc_run(AUDIT, [sys.executable, script], options=["--strict"])
    # THEN every worker's capture is complete and counts its launches, and --strict passes
    assert "workers 40" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    caps = run.captures()
    assert len(caps) >= 2 and all(c.complete for c in caps), [c.path for c in caps]
    assert sum(s.launches for c in caps for s in c.stats.values()) == 40
    assert run.proc.returncode == 0, run.stderr[-2000:]


def test_error_exitcode_sets_the_status(native, clc_run):
    # GIVEN a run --strict fails (a denied launch)
    run = clc_run(DENY, [native["prog_life"], "atexit", "1"], options=["--error-exitcode", "9"])
    # THEN its status is the one asked for
    assert run.proc.returncode == 9
    assert "exit status 9" in run.stderr


FLOOD = """\
import glob, os, socket
(path,) = glob.glob(os.path.join(os.environ["TMPDIR"], "clc-run-*", "status"))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for i in range(20000):
    s.sendto(f"spawn {4000000 + i} /flood/{i}".encode(), path)
"""


def test_a_program_flooding_clc_runs_socket_is_said_and_fails_strict(native, clc_run, tmp_path):
    # GIVEN a program that finds clc-run's status socket and sends it 20,000 spawns
    tmp = tempfile.mkdtemp(prefix="clc-test-", dir="/tmp")
    try:
        run = clc_run(AUDIT, [sys.executable, "-c", FLOOD], options=["--strict"],
                      env={"TMPDIR": tmp})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # THEN clc-run kept what one process may keep, said what it dropped, and --strict fails
    assert run.proc.returncode == 3, run.stderr[-2000:]
    said = re.search(r"^clc: (\d+) status messages from 1 process not kept", run.stderr, re.M)
    assert said and int(said[1]) >= 20000 - MAX_PER_SENDER, run.stderr[-2000:]
    assert "account of its processes is incomplete" in run.stderr


NO_SETTINGS = "ran without clc-run's settings"


@pytest.mark.parametrize("how", ["asm", "system"])
def test_a_process_that_lost_its_settings_fails_closed_under_strict(native, clc_run, how):
    # GIVEN a forked child that closes every descriptor (the settings' memfd with them), then
    # runs a CUDA program past clc's exec hooks (the execve system call itself, or system()),
    # LD_PRELOAD kept; the policy does not set on_error
    run = clc_run(DENY_DEBUG_ONLY, [native["prog_life"], "rawexec", how, "10"],
                  options=["--strict"])
    # THEN its shim, without settings, denies every launch (on_error unset: deny under --strict)
    assert exec_results(run) == [800] * 10, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.fake_counts()["_Z12debug_kernelPi"] == 0
    assert "this process of a clc-run run has none of its settings" in run.stderr
    # AND clc-run names it, and --strict fails the run for it
    assert re.search(rf"process \d+ \(\S+\) {NO_SETTINGS} .* on_error=deny", run.stderr)
    assert run.proc.returncode == 3 and f"{NO_SETTINGS}" in run.stderr.split("--strict:")[-1]


def test_a_process_that_lost_its_settings_gets_the_policys_on_error(native, clc_run):
    # GIVEN the same child under a policy that lets through what clc cannot decide
    policy = DENY_DEBUG_ONLY.replace("default: allow\n", "default: allow\non_error: allow\n")
    run = clc_run(policy, [native["prog_life"], "rawexec", "asm", "10"],
                  options=["--error-exitcode", "77"])
    # THEN its launches run, as the policy says of what clc cannot decide
    assert exec_results(run) == [0] * 10, run.stdout[-2000:] + run.stderr[-2000:]
    # AND the run fails with the status asked for, naming the process
    assert re.search(rf"process \d+ \(\S+\) {NO_SETTINGS} .* on_error=allow", run.stderr)
    assert run.proc.returncode == 77, run.stderr[-2000:]


@pytest.mark.parametrize("how", ["asm_nopreload", "system_nopreload", "asm_nopreload_orphan"])
def test_a_process_that_loads_the_driver_without_the_shim_fails_strict(native, clc_run, how):
    # GIVEN a forked child that removes LD_PRELOAD from its environment and runs a CUDA program
    # past clc's exec hooks (the execve system call itself, or system()), in clc-run's tree of
    # processes or out of it (its parent gone)
    run = clc_run(DENY_DEBUG_ONLY, [native["prog_life"], "rawexec", how, "10"],
                  options=["--strict"])
    # THEN nothing of clc runs in it: its launches ran
    assert exec_results(run) == [0] * 10, run.stdout[-2000:] + run.stderr[-2000:]
    # BUT clc-run saw it load the driver, names it, and --strict fails the run for it
    assert re.search(r"process \d+ \(\S+/prog_life\) loaded the CUDA driver without clc's "
                     r"shim", run.stderr), run.stderr[-2000:]
    assert run.proc.returncode == 3 and "1 process ran without clc's shim" in run.stderr

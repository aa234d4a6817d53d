# SPDX-License-Identifier: Apache-2.0
"""The shim in real processes, over the fake driver: each way a program reaches the driver,
each decision, many threads, fork, C and Python hosts, the bridge's version check."""

import collections
import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from clc import abi
from clc.capture.reader import read_capture
from harness import (AUDIT, Run, DENY_DEBUG, TIME_ALL, clc_command, env_for, executed,
                     kernel_launches, nonzero)

DEBUG = "_Z12debug_kernelPi"
VECADD = "_Z6vecAddPKfS0_Pfi"


@pytest.mark.parametrize("prog", ["prog_cudart", "prog_triton", "prog_linked", "prog_threads"])
def test_programs_run_without_clc(native, run_native, prog):
    # The baseline first: the programs and the fake driver work on their own.
    proc = run_native([native[prog]] + (["2", "100"] if prog == "prog_threads" else []))
    assert proc.returncode == 0, proc.stderr
    assert "fake:" in proc.stdout
    assert " -> 800" not in proc.stdout


@pytest.mark.parametrize("prog", ["prog_cudart", "prog_triton", "prog_linked"])
def test_audit_counts_equal_the_drivers_counts(native, clc_run, prog):
    # GIVEN a program reaching the driver as cudart, Triton or a -lcuda program does
    # WHEN it runs under the audit policy
    run = clc_run(AUDIT, [native[prog]])
    # THEN it behaves as without clc, and every kernel it launched is in the capture by name,
    # with exactly as many launches as the driver itself saw
    assert run.proc.returncode == 0, run.stderr
    assert not [r for rs in run.results().values() for r in rs if r == 800]
    cap = run.capture()
    assert cap.complete
    assert executed(cap) == nonzero(run.fake_counts())
    # (launches the driver refused count as failed attempts; prog_linked's launch of a handle
    # whose module it had unloaded is no longer vecAdd's: the driver names no kernel there)
    attempts = run.attempts()
    printed = collections.Counter({key: len(v) for key, v in run.results().items()
                                   if not key[1].startswith("cuGraph")})
    if prog == "prog_linked":
        attempts[VECADD] -= 1
        attempts["<unnamed>"] = 1
        printed[(VECADD, "cuLaunchKernel")] -= 1
        printed[("<unnamed>", "cuLaunchKernel")] = 1
    assert kernel_launches(cap) == attempts
    # AND every direct launch was recorded, on the entry point the program used
    launches = [launch for launch in cap.launches
                if (launch.entry & ~abi.ENTRY_PTSZ) < abi.ENTRY_GRAPH_ADD_NODE]
    assert len(launches) == sum(attempts.values())
    seen = collections.Counter(
        (cap.kernels[launch.kernel_id].mangled,
         abi.ENTRY_NAMES[launch.entry & ~abi.ENTRY_PTSZ] + ("_ptsz" if launch.ptsz else ""))
        for launch in launches)
    assert seen == +printed


def test_cudart_path_hooks_ptsz_and_graph_nodes(native, clc_run):
    run = clc_run(AUDIT, [native["prog_cudart"]])
    cap = run.capture()
    entries = {abi.ENTRY_NAMES[launch.entry & ~abi.ENTRY_PTSZ] + ("_ptsz" if launch.ptsz else "")
               for launch in cap.launches}
    # Per-thread-default-stream variants were handed out by cuGetProcAddress with flags 2.
    assert {"cuLaunchKernel_ptsz", "cuLaunchKernelEx_ptsz",
            "cuLaunchCooperativeKernel_ptsz"} <= entries
    assert {"cuGraphAddKernelNode", "cuGraphKernelNodeSetParams",
            "cuGraphExecKernelNodeSetParams"} <= entries
    graph_nodes = sum(s.graph_nodes for s in cap.stats.values())
    printed = sum(len(v) for key, v in run.results().items() if key[1].startswith("cuGraph"))
    assert graph_nodes == printed > 0


@pytest.mark.parametrize("prog", ["prog_cudart", "prog_triton", "prog_linked"])
def test_deny_reaches_the_program_and_spares_the_rest(native, clc_run, run_native, prog):
    # WHEN a policy denies *debug* kernels
    run = clc_run(DENY_DEBUG, [native[prog]])
    assert run.proc.returncode == 0, run.stderr
    results = run.results()
    baseline = Run(run_native([native[prog]]), None).results()
    # THEN every launch of the debug kernel, by any entry point, graph nodes included, gets
    # CUDA_ERROR_NOT_PERMITTED, and the driver never saw it
    denied = [r for (k, _), rs in results.items() if "debug" in k for r in rs]
    assert denied and all(r == 800 for r in denied)
    # (the others get what they get without clc: prog_linked also makes launches that fail)
    assert {key: rs for key, rs in results.items() if "debug" not in key[0]} == \
        {key: rs for key, rs in baseline.items() if "debug" not in key[0]}
    assert all(v == 0 for k, v in run.fake_counts().items() if "debug" in k)
    assert all(v == 0 for k, v in run.fake_graph_counts().items() if "debug" in k)
    # AND the rule's message is said once, and the capture counts the refusals
    assert run.stderr.count("debug kernels are not allowed here") == 1
    cap = run.capture()
    for kid, stats in cap.stats.items():
        if "debug" in cap.kernels[kid].mangled:
            assert stats.denied == stats.launches + stats.graph_nodes > 0
        else:
            assert stats.denied == 0


def test_shape_rule_denies_only_large_grids(native, clc_run):
    policy = """\
version: 1
rules:
  - name: small-only
    match: {kernel: "*vecAdd*", grid_blocks: {gt: 1}}
    action: deny
"""
    run = clc_run(policy, [native["prog_cudart"]])
    cap = run.capture()
    for launch in cap.launches:
        blocks = launch.grid[0] * launch.grid[1] * launch.grid[2]
        name = cap.kernels[launch.kernel_id].mangled
        expect_deny = "vecAdd" in name and blocks > 1
        assert (launch.action == abi.ACTION_DENY) == expect_deny, launch


def test_time_all_times_every_launch(native, clc_run):
    run = clc_run(TIME_ALL, [native["prog_cudart"]])
    cap = run.capture()
    direct = [launch for launch in cap.launches
              if (launch.entry & ~abi.ENTRY_PTSZ) < abi.ENTRY_GRAPH_ADD_NODE]
    assert direct
    # The fake GPU clock advances 5000 ns per launch: one launch between the two events.
    assert all(launch.gpu_ns == 5000 for launch in direct), [launch.gpu_ns for launch in direct]
    for stats in cap.stats.values():
        assert stats.timed == stats.launches
        assert stats.gpu_ns == 5000 * stats.launches


def test_sixteen_threads_exact_counts(native, clc_run):
    # GIVEN 16 threads launching 10,000 times each, recording every launch
    before = time.monotonic_ns()
    run = clc_run(AUDIT, [native["prog_threads"], "16", "10000"])
    after = time.monotonic_ns()
    assert run.proc.returncode == 0, run.stderr
    assert "threads: ok=160000 failed=0" in run.stdout
    cap = run.capture()
    # THEN nothing is lost or counted twice
    assert cap.complete and cap.dropped == 0
    assert kernel_launches(cap) == nonzero(run.fake_counts())
    assert sum(kernel_launches(cap).values()) == 160000
    assert len(cap.launches) == 160000
    assert sorted(launch.seq for launch in cap.launches) == list(range(160000))
    assert len({launch.tid for launch in cap.launches}) == 16
    # AND launch times (read from the TSC once calibrated) are on CLOCK_MONOTONIC, in
    # order within each thread
    assert all(before <= launch.t_ns <= after for launch in cap.launches)
    last = {}
    for launch in cap.launches:
        assert launch.t_ns >= last.get(launch.tid, 0)
        last[launch.tid] = launch.t_ns


def test_module_loads_are_recorded(native, clc_run):
    run = clc_run(AUDIT, [native["prog_cudart"]])
    cap = run.capture()
    (lib,) = [m for m in cap.modules if m.api_name == "cuLibraryLoadData"]
    # cudart registers a fatbin wrapper and says the bytes stay valid
    assert lib.image_name == "fatbin-wrapper" and lib.preserved and lib.image_size > 16
    run = clc_run(AUDIT, [native["prog_linked"]])
    kinds = {(m.api_name, m.image_name) for m in run.capture().modules}
    assert ("cuModuleLoad", "file") in kinds
    assert any(api == "cuModuleLoadFatBinary" for api, _ in kinds)
    assert any(api == "cuModuleUnload" for api, _ in kinds)


@pytest.mark.parametrize("variant", ["plain", "threaded"])
def test_fork_child_gets_its_own_capture(native, clc_run, variant):
    # GIVEN a program that forks after launching (in one variant while a thread launches)
    run = clc_run(AUDIT, [native["prog_fork"], variant], timeout=60)
    # THEN neither side hangs or crashes, and each process's capture counts its own launches
    assert run.proc.returncode == 0, run.stderr + run.stdout
    caps = run.captures()
    parent = [c for c in caps if str(c.path) == str(run.output)]
    children = [c for c in caps if ".child-" in str(c.path)]
    assert len(parent) == 1 and children
    assert executed(parent[0]) == nonzero(run.fake_counts())
    # AND the child's capture counts every launch the child tried; none ran, since the driver
    # runs nothing in a process forked after it started (CUDA_ERROR_NOT_INITIALIZED), and the
    # kernel the child launched first, which the driver cannot name there (it is "<unnamed>"
    # in the capture), is said
    child_tried = collections.Counter(
        m[1] for m in re.finditer(r"^child: launch (\S+) via \S+ -> 3$", run.stdout, re.M))
    assert sum(child_tried.values()) == 3, run.stdout
    child_counted = collections.Counter()
    for child in children:
        assert not executed(child)
        child_counted.update(kernel_launches(child))
    assert sum(child_counted.values()) == sum(child_tried.values()), child_counted
    assert "or a process forked after the driver started" in run.stderr, run.stderr


DENY_SCALE = """\
version: 1
default: allow
rules:
  - name: no-scale
    match: {kernel: "*scale*"}
    action: deny
"""


def test_a_forked_child_runs_nothing_whatever_the_policy(native, clc_run):
    # GIVEN a program whose forked child launches a kernel its parent never launched
    # WHEN it runs under a policy that denies that kernel, with on_error: allow
    run = clc_run(DENY_SCALE, [native["prog_fork"], "plain"], timeout=60)
    assert run.proc.returncode == 0, run.stderr + run.stdout
    # THEN none of the child's launches runs: the driver cannot name the kernel there, so clc
    # leaves the launch to on_error, and the driver refuses it (it runs nothing in a process
    # forked after it started)
    child = re.findall(r"^child: launch (\S+) via \S+ -> (-?\d+)$", run.stdout, re.M)
    assert len(child) == 3 and all(result == "3" for _, result in child), run.stdout
    assert not run.fake_counts().get("_Z5scalePff"), run.stdout


def test_python_host_joins_the_running_interpreter(native, clc_run):
    # GIVEN a Python program of clc's own Python version (the bridge joins its interpreter)
    from build import PYHOST

    run = clc_run(DENY_DEBUG, [sys.executable, PYHOST])
    assert run.proc.returncode == 0, run.stderr
    assert "engine error" not in run.stderr
    results = run.results()
    assert [r for (k, _), rs in results.items() if "debug" in k for r in rs] == [800]
    assert executed(run.capture()) == nonzero(run.fake_counts())
    assert kernel_launches(run.capture()) == run.attempts()


def _other_python():
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3"))
    candidates += [f"/usr/bin/python3.{m}" for m in range(8, 15)]
    for path in candidates:
        if not os.path.exists(path):
            continue
        out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip() != mine and out.stdout.strip() >= "3.8":
            return path, out.stdout.strip()
    return None, None


def test_a_python_program_of_another_version_is_decided_by_the_rules(native, clc_run):
    python, version = _other_python()
    if python is None:
        pytest.skip("no Python of another minor version on this machine")
    from build import PYHOST

    # GIVEN a Python program of another minor version than clc's, under a policy of rules
    run = clc_run(DENY_DEBUG, [python, PYHOST], timeout=60)
    # THEN clc-run decides its kernels: the debug kernel is refused, the others run
    assert run.proc.returncode == 0, run.stderr
    results = run.results()
    assert results, run.stdout
    for (kernel, _), rs in results.items():
        assert all(r == (800 if "debug" in kernel else 0) for r in rs), (kernel, rs)
    assert f"runs Python {version}" not in run.stderr and "get on_error" not in run.stderr
    assert executed(run.capture()) == nonzero(run.fake_counts())


def test_first_sight_does_not_wait_for_the_programs_gil(native, clc_run):
    from build import HERE

    # GIVEN a Python program whose main thread holds the GIL while a native thread launches a
    # kernel never launched before
    run = clc_run(DENY_DEBUG, [sys.executable, HERE / "pyhost_gil.py"], timeout=60)
    # THEN the launch is decided (by clc-run, outside the program) and runs during the hold
    assert run.proc.returncode == 0, run.stderr + run.stdout
    assert "held-launch returned=1 result=0" in run.stdout, run.stdout + run.stderr
    assert kernel_launches(run.capture()) == {"_Z5scalePff": 1}


def test_wrap_rules_in_a_python_of_another_version_fall_to_on_unwrappable(native, clc_run):
    python, version = _other_python()
    if python is None:
        pytest.skip("no Python of another minor version on this machine")
    from build import PYHOST

    # GIVEN a Python program of another minor version (clc's engine cannot run in it, so no
    # wrapped kernel can be built there), under a policy that wraps vecAdd and denies debug
    policy = DENY_DEBUG.replace("rules:\n", """rules:
  - name: wrap-vecadd
    match: {kernel: "vecAdd"}
    action: wrap
    wrapper: block_count
    on_unwrappable: deny
""")
    run = clc_run(policy, [python, PYHOST], timeout=60)
    assert run.proc.returncode == 0, run.stderr
    # THEN the rules still hold: vecAdd gets its on_unwrappable (deny), debug its deny
    for (kernel, _), rs in run.results().items():
        expected = 800 if "debug" in kernel or "vecAdd" in kernel else 0
        assert all(r == expected for r in rs), (kernel, rs)
    assert len(re.findall(r"^clc: wrapped kernels cannot be built in this process: the kernels of "
                          r"wrap rules get their on_unwrappable$", run.stderr, re.M)) == 1, \
        run.stderr


HOOK_FILE = """\
import clc

@clc.on_launch(kernel="*")
def no_opinion(launch):
    return None
"""


@pytest.mark.parametrize("on_error,expected", [("allow", 0), ("deny", 800)])
def test_hooks_in_a_python_program_of_another_version_are_refused_clearly(
        native, clc_run, tmp_path, on_error, expected):
    python, version = _other_python()
    if python is None:
        pytest.skip("no Python of another minor version on this machine")
    from build import PYHOST

    # GIVEN a Python program of another minor version than the bridge was built for, and a
    # policy with Python hooks (they run in the program's interpreter)
    hooks = tmp_path / "hooks.py"
    hooks.write_text(HOOK_FILE)
    policy = DENY_DEBUG.replace("default: allow", f"default: allow\non_error: {on_error}")
    run = clc_run(policy, [python, PYHOST], options=["--hooks", str(hooks)], timeout=60)
    # THEN a one-line refusal names both versions, once, and every launch gets on_error
    assert run.proc.returncode == 0, run.stderr
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    line = f"this program runs Python {version} but clc's bridge was built for Python {mine}"
    assert run.stderr.count(f"clc: {line}") == 1, run.stderr
    results = [r for rs in run.results().values() for r in rs]
    assert results and all(r == expected for r in results)


def test_script_that_execs_the_program(native, clc_run):
    run = clc_run(AUDIT, ["sh", "-c", f"exec {native['prog_triton']}"])
    assert run.proc.returncode == 0, run.stderr
    assert executed(run.capture()) == nonzero(run.fake_counts())


def test_child_processes_write_their_own_captures(native, clc_run):
    run = clc_run(AUDIT, ["sh", "-c", f"{native['prog_triton']} && {native['prog_cudart']}"])
    assert run.proc.returncode == 0, run.stderr
    caps = run.captures()
    assert len(caps) == 2 and all(".child-" in str(c.path) for c in caps)
    names = set()
    for cap in caps:
        names |= set(kernel_launches(cap))
    assert {"add_kernel", "_Z6vecAddPKfS0_Pfi"} <= names


def test_what_was_flushed_survives_a_crash(native, tmp_path):
    # GIVEN a program killed while it launches, long after the first periodic flush
    out = tmp_path / "crash.clc"
    proc = subprocess.Popen(clc_command() + ["-o", str(out), "--force", "--",
                                             str(native["prog_threads"]), "2", "100000000"],
                            env=env_for(native), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 30
    while time.time() < deadline and (not out.exists() or out.stat().st_size < 64 * 1024):
        time.sleep(0.05)
    pid = int.from_bytes(out.read_bytes()[16:20], "little")
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    # THEN clc-run passes the signal on as 128+9, and the capture reads, marked incomplete
    assert proc.returncode == 128 + 9
    cap = read_capture(out)
    assert not cap.complete
    assert len(cap.launches) > 1000
    assert "INCOMPLETE" in err


def test_decision_cache_costs_one_engine_call_per_kernel(native, clc_run, tmp_path):
    # The engine announces each denied kernel once; 160,000 launches of it must not repeat it.
    policy = DENY_DEBUG
    run = clc_run(policy, [native["prog_threads"], "16", "10000"])
    assert run.stderr.count("are denied by rule") == 1
    assert "threads: ok=80000 failed=80000 codes=0:80000,800:80000" in run.stdout


def test_time_all_over_many_threads_gives_every_launch_its_time(native, clc_run):
    # GIVEN 16 threads timing every launch on a GPU that finishes them late (each thread's
    # timings are read back 1024 launches on, and the threads' records interleave in the file)
    run = clc_run(TIME_ALL, [native["prog_threads"], "16", "10000"],
                  env={"FAKE_CUDA_LAZY_EVENTS": "1"})
    assert run.proc.returncode == 0, run.stderr[-2000:]
    # THEN streaming the launches (as the JSON and the trace do) finds every launch's GPU time
    from clc.capture.reader import launch_stream, scan_capture
    cap = scan_capture(run.output)
    stream = launch_stream(cap)
    timed = sum(1 for ln in stream if ln.gpu_ns is not None)
    assert timed == 160000 and stream.unmatched_timings == 0

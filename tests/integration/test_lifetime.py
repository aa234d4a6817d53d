# SPDX-License-Identifier: Apache-2.0
"""A policy holds over a program's whole life: its libraries' constructors, its exit handlers and
destructors, its signal handlers, a race of unload and load, a change of user, a driver loaded by
a path of its own; and the capture keeps every record however the process leaves (_exit,
exit_group, a fatal signal), or its counts of the last second when SIGKILL ends it."""

import os
import re
import signal
import subprocess

import pytest

from clc import abi

from harness import AUDIT, CUDA_INCLUDE
from policy_cases import deny_debug

DEBUG = "_Z12debug_kernelPi"
VECADD = "_Z6vecAddPKfS0_Pfi"

# Denies debug kernels, records the rest; what clc cannot decide is refused.
DENY = deny_debug(on_error="deny", record_rest=True)
# prog_life's signal handler calls the driver: the fake's own locked sections are closed to
# signals (a real driver's are not async-signal-safe either; what the handler may interrupt is
# the program and clc, which these tests are about).
SIGNAL_SAFE = {"FAKE_CUDA_SIGNAL_SAFE": "1"}


def results(run, via):
    """The CUresults of the launches printed with `via <where>`."""
    return [int(m[1]) for m in re.finditer(rf"^launch \S+ via {via} -> (-?\d+)$", run.stdout,
                                           re.M)]


def stats_of(cap, name):
    (kid,) = [k for k, kernel in cap.kernels.items() if kernel.mangled == name]
    return cap.stats[kid]


@pytest.mark.parametrize("via, env, argv", [
    ("ctor", {"LIFE_CTOR": "launch", "LIFE_CTOR_N": "100"}, ["plain", "1"]),
    ("atexit", {}, ["atexit", "100"]),
    ("dtor", {}, ["dtor", "100"]),
    ("dtor", {"LIFE_DTOR": "launch", "LIFE_DTOR_N": "100"}, ["plain", "1"]),
], ids=["library-constructor", "exit-handler", "program-destructor", "library-destructor"])
def test_launches_at_the_edges_of_life_are_denied_and_recorded(native, clc_run, via, env, argv):
    # GIVEN a program that launches a denied kernel 100 times from a library's constructor
    # (before the preloaded shim's own constructor), an exit handler registered before its
    # first CUDA call, its own destructor, or a library's destructor (after the shim's)
    run = clc_run(DENY, [native["prog_life"], *argv], env=env, options=["--strict"])
    # THEN every one of them is refused, and the driver never ran the kernel
    assert results(run, via) == [800] * 100, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.fake_counts().get(DEBUG, 0) + run.fake_counts().get("debug_kernel", 0) == 0
    # AND the capture is complete and counts them as denied by the rule
    cap = run.capture()
    assert cap.complete
    debug = [s for k, s in cap.stats.items() if "debug" in cap.kernels[k].mangled]
    assert sum(s.denied for s in debug) == sum(s.launches for s in debug) == 100
    assert cap.rule_stats == {0: 100}
    # AND --strict says so
    assert run.proc.returncode == 3, run.stderr[-2000:]
    assert "100 launches or graph-node calls denied" in run.stderr


def test_a_constructor_that_only_loads_leaves_a_capture(native, clc_run):
    # GIVEN a library whose constructor loads a module, before the shim's constructor ran
    run = clc_run(AUDIT, [native["prog_life"], "plain", "2"], env={"LIFE_CTOR": "load"})
    assert run.proc.returncode == 0, run.stderr
    # THEN the run has its capture, with the load and the program's launches
    cap = run.capture()
    assert cap.complete and stats_of(cap, VECADD).launches == 2
    assert any(m.api_name == "cuModuleLoadData" for m in cap.modules)


@pytest.mark.parametrize("mode, status, how, code", [
    ("quick", 0, abi.END_QUICK, 0),
    ("exit_group", 0, abi.END_QUICK, 0),
    ("segv", 128 + signal.SIGSEGV, abi.END_SIGNAL, signal.SIGSEGV),
    ("abort", 128 + signal.SIGABRT, abi.END_SIGNAL, signal.SIGABRT),
    ("term", 128 + signal.SIGTERM, abi.END_SIGNAL, signal.SIGTERM),
    ("handler", 7, abi.END_QUICK, 7),
])
def test_every_record_is_kept_however_the_process_leaves(native, clc_run, mode, status, how,
                                                        code):
    # GIVEN a program that records 5000 launches, then leaves by _exit, exit_group, a fatal
    # signal, or a handler of its own that leaves by _exit
    run = clc_run(AUDIT, [native["prog_life"], mode, "5000"])
    # THEN it leaves as it would have without clc
    assert run.proc.returncode == status, run.stderr[-2000:]
    # AND its capture is complete: every launch recorded and counted, and it says how it ended
    cap = run.capture()
    assert cap.complete and cap.end_how == how and cap.exit_status == code
    assert stats_of(cap, VECADD).launches == 5000
    assert len([ln for ln in cap.launches if ln.kernel_id == 0]) == 5000
    if how == abi.END_SIGNAL:
        assert f"ended by {signal.Signals(code).name}" in run.stderr


def test_sigkill_loses_at_most_the_last_second(native, clc_run):
    # GIVEN a program killed by SIGKILL 1.5 s after its last launch
    run = clc_run(AUDIT, [native["prog_life"], "kill", "5000"])
    assert run.proc.returncode == 128 + signal.SIGKILL
    cap = run.capture()
    # THEN its capture has no END, but its counts of a second before and every record
    assert not cap.complete and cap.end_how is None
    stats = stats_of(cap, VECADD)
    assert stats.launches == 5000 and not stats.partial
    assert len(cap.launches) == 5000
    assert "INCOMPLETE" in run.stderr and "SIGKILL" in run.stderr


def test_a_signal_handler_interrupting_clc_is_decided(native, clc_run):
    # GIVEN a thread that signals the main thread every 20 us while it makes 2000 first
    # sights, whose handler launches a denied kernel (often while clc is deciding or
    # recording on that thread)
    run = clc_run(DENY, [native["prog_life"], "signals", "2000"], env=SIGNAL_SAFE)
    assert run.proc.returncode == 0, run.stderr[-2000:]
    m = re.search(r"^signals: launches=(\d+) refused=(\d+) ran=(\d+)$", run.stdout, re.M)
    # THEN every launch from the handler was refused: by its rule, or as on_error before the
    # kernel was decided
    assert m and int(m[1]) > 100 and int(m[1]) == int(m[2]) and m[3] == "0", run.stdout[-500:]
    assert run.fake_counts().get(DEBUG, 0) == 0
    cap = run.capture()
    assert cap.complete and sum(cap.rule_stats.values()) == int(m[1])


def test_every_launch_a_signal_handler_makes_under_on_error_allow_is_counted(native, clc_run):
    # GIVEN a policy that lets through what clc cannot decide, and a handler that, every 20 us
    # while its thread makes first sights of 500 denied kernels and writes their records,
    # launches the next of 500 other denied kernels: a first sight holds the handler until it is
    # done, but when the handler interrupts clc's record writing the kernel is not decided yet,
    # and the launch runs as on_error
    policy = DENY.replace("on_error: deny", "on_error: allow")
    run = clc_run(policy, [native["prog_life"], "signals_fresh", "500"], options=["--strict"],
                  env=SIGNAL_SAFE)
    m = re.search(r"^signals: launches=(\d+) refused=(\d+) ran=(\d+)$", run.stdout, re.M)
    main = re.search(r"^signals-main: launches=(\d+)$", run.stdout, re.M)
    assert m and main and int(m[3]) >= 1, run.stdout[-500:] + run.stderr[-2000:]
    launches, refused, ran = int(m[1]), int(m[2]), int(m[3])
    # THEN every launch that reached the driver is counted as fallen to on_error, and every
    # other (the main thread's too) was refused by the rule
    reached = sum(n for name, n in run.fake_counts().items() if name.startswith("debug_"))
    assert reached == ran
    cap = run.capture()
    assert cap.complete and cap.on_error_launches == ran
    assert cap.rule_stats.get(0, 0) == refused + int(main[1]) and refused + ran == launches
    assert f"Fell to on_error: {ran} launches" in run.stderr
    # AND --strict fails the run for them
    assert run.proc.returncode == 3 and f"{ran} launches fell to on_error" in run.stderr


def test_an_unload_racing_a_load_never_lends_a_decision(native, clc_run):
    # GIVEN two threads, one loading, launching and unloading an allowed kernel, the other a
    # denied one: the driver gives each new module's kernel the handle just unloaded
    run = clc_run(DENY, [native["prog_life"], "race", "50000"])
    assert run.proc.returncode == 0, run.stderr[-2000:]
    # THEN the denied kernel never ran, and the allowed one always did
    assert "race: ok=50000 debug_ran=0 debug_refused=50000" in run.stdout, run.stdout[-500:]
    assert run.fake_counts().get("debug_kernel", 0) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="changing to another user needs root")
def test_a_process_that_changes_its_user_is_decided_as_its_new_user(native, clc_run):
    # GIVEN a policy that denies everything to user 12345, and a program that launches vecAdd
    # as root, then becomes user 12345 and launches vecAdd and scale
    policy = DENY.replace('match: {kernel: "*debug*"}', 'match: {kernel: "*", user: "12345"}')
    run = clc_run(policy, [native["prog_life"], "setuid", "12345"])
    assert run.proc.returncode == 0, run.stderr[-2000:]
    # THEN what it launches as user 12345 is refused (clc-run's socket is root's alone: the
    # new user's launches are decided in the program, or fall to on_error), vecAdd's decision
    # for root included
    assert results(run, "main") == [0, 800, 800], run.stdout[-1000:] + run.stderr[-2000:]
    # AND the capture, opened by root, still holds everything (vecAdd twice: its decision as
    # root was forgotten, and it was decided anew)
    cap = run.capture()
    vecadd = [s for k, s in cap.stats.items() if cap.kernels[k].mangled == VECADD]
    assert cap.complete and [s.launches for s in vecadd] == [1, 1]
    assert [s.denied for s in vecadd] == [0, 1]


@pytest.fixture(scope="module")
def own_drivers(native, tmp_path_factory):
    """A copy of the driver without its SONAME, and a library with a cuLaunchKernel and
    nothing else of a driver's, in a folder the loader does not search."""
    out = tmp_path_factory.mktemp("drivers")
    src = os.path.join(os.path.dirname(__file__), "..", "fixtures", "native", "fake_cuda.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-std=gnu11", "-O1", f"-I{CUDA_INCLUDE}", "-o",
                    out / "libgpu.so", src, "-ldl", "-lpthread"], check=True)
    (out / "stub.c").write_text("int cuLaunchKernel(void *f, unsigned a, unsigned b, unsigned c,"
                                " unsigned d, unsigned e, unsigned g, unsigned s, void *st, "
                                "void **p, void **x) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", out / "libstub.so", out / "stub.c"],
                   check=True)
    return out


def test_a_driver_loaded_by_a_path_of_its_own_is_placed(native, clc_run, own_drivers):
    # GIVEN a program that opens a copy of the driver by its path (no SONAME libcuda.so.1)
    run = clc_run(DENY, [native["prog_path"], own_drivers / "libgpu.so"],
                  env={"LD_LIBRARY_PATH": ""})
    assert run.proc.returncode == 0, run.stderr[-2000:]
    # THEN the policy holds there: the debug kernel refused, vecAdd launched and recorded
    assert results(run, "cuLaunchKernel") == [800, 800, 800, 0, 0]
    cap = run.capture()
    assert stats_of(cap, DEBUG).denied == 3 and stats_of(cap, VECADD).recorded == 2


def test_a_driver_that_cannot_be_placed_fails_closed(native, clc_run, own_drivers):
    # GIVEN a program whose cuLaunchKernel comes from a library that is no whole driver
    run = clc_run(DENY, [native["prog_path"], own_drivers / "libstub.so", "stub"],
                  env={"LD_LIBRARY_PATH": ""}, options=["--strict"])
    # THEN its launches get on_error (deny here), said once, counted, and --strict fails
    assert results(run, "cuLaunchKernel") == [800, 800]
    assert run.stderr.count("clc: the CUDA driver the program calls could not be placed") == 1
    cap = run.capture()
    assert cap.undecided_launches == 2 and cap.on_error_launches == 2
    assert run.proc.returncode == 3 and "2 launches fell to on_error" in run.stderr


def test_a_signal_handlers_records_inside_the_threads_own_are_kept(native, clc_run):
    # GIVEN a thread recording 100,000 launches while a signal handler, every 20 us, makes a
    # launch that is refused and recorded (often while the thread is filling its own record);
    # refused, it never reaches the driver, which a signal handler could deadlock
    policy = DENY.replace("    action: deny\n", "    action: deny\n    record: true\n", 1)
    run = clc_run(policy, [native["prog_life"], "signals_launch", "100000"])
    assert run.proc.returncode == 0, run.stderr[-2000:]
    m = re.search(r"^signals: launches=(\d+) refused=(\d+) ran=(\d+)$", run.stdout, re.M)
    assert m and int(m[2]) == int(m[1]) > 100, run.stdout[-500:]
    # THEN every launch of both has its record, whole, and nothing was dropped
    cap = run.capture()
    assert cap.complete and cap.dropped == 0 and cap.trailing_bytes == 0
    recorded = {}
    for ln in cap.launches:
        name = cap.kernels[ln.kernel_id].mangled if ln.kernel_id in cap.kernels else "?"
        recorded[name] = recorded.get(name, 0) + 1
    handler = int(m[1]) - cap.rule_stats.get(abi.RULE_ON_ERROR, 0)
    main = re.search(r"^signals-main: launches=(\d+)$", run.stdout, re.M)
    assert main and int(main[1]) >= 100000
    assert recorded[VECADD] == int(main[1])
    assert recorded[DEBUG] == stats_of(cap, DEBUG).recorded == handler


SHORT_PROGRAMS = [("prog_teardown", ["1"]), ("prog_threads", ["4", "1"]), ("prog_cudart", []),
                  ("prog_triton", [])]


@pytest.mark.parametrize("wrapper", ["block_count", "deadline", "sm_share"])
@pytest.mark.parametrize("prog,args", SHORT_PROGRAMS)
def test_short_programs_end_cleanly_when_nothing_can_be_wrapped(native, clc_run, prog, args,
                                                                wrapper):
    # GIVEN a driver that cannot load clc's wrapped kernels (every wrap fails) and programs that
    # end right after their launches, from one thread or several
    params = "{ms: 1000}" if wrapper == "deadline" else "{share: 0.5}" \
        if wrapper == "sm_share" else "{}"
    policy = ("version: 1\ndefault: allow\non_error: allow\nrules:\n  - name: every\n"
              "    match: {kernel: '*'}\n    action: wrap\n"
              f"    wrapper: {wrapper}\n    params: {params}\n    on_unwrappable: allow\n"
              "    record: true\n")
    for _ in range(3):
        run = clc_run(policy, [native[prog], *args], env={"FAKE_CUDA_REFUSE_CUBIN": "1"})
        # THEN each run ends as the program does, with a complete capture of its launches
        assert run.proc.returncode == 0, run.stderr
        cap = run.capture()
        assert cap.complete, run.stderr
        assert sum(st.launches for st in cap.stats.values()) > 0


def test_a_signal_the_program_leaves_at_its_default_ends_it_during_a_long_first_sight(native,
                                                                                      tmp_path):
    # GIVEN a program whose first kernel is decided by a Python hook that takes 20 s, and which
    # leaves SIGTERM at its default (clc's own handler stands for it: it finishes the capture)
    from harness import clc_command, env_for
    hooks = tmp_path / "slow_hooks.py"
    entered = tmp_path / "hook-entered"
    hooks.write_text(f"import pathlib, time\n\ndef slow(launch):\n"
                     f"    pathlib.Path({str(entered)!r}).touch()\n"
                     f"    time.sleep(20)\n    return None\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ndefault: allow\nrules:\n  - name: slow\n"
                      f"    match: {{kernel: '*'}}\n    action: hook\n    hook: {hooks}:slow\n")
    proc = subprocess.Popen(clc_command() + ["--policy", str(policy), "-o",
                                             str(tmp_path / "cap.clc"), "--force", "--",
                                             str(native["prog_cudart"])],
                            env=env_for(native), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path)
    import time
    deadline = time.monotonic() + 60
    while not entered.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert entered.exists(), proc.communicate()[1].decode()[-2000:]
    time.sleep(0.2)  # the hook asleep inside the first sight
    start = time.monotonic()
    # WHEN it gets SIGTERM (clc-run passes it on) in the middle of that first sight
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # THEN it ends by that signal at once, as it would without clc, not when the hook returns
    assert time.monotonic() - start < 10, err.decode()[-2000:]
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err.decode()[-2000:])

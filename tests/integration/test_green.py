# SPDX-License-Identifier: Apache-2.0
"""sm_share by green context over the fake driver: the confined kernel's launches land on a
green context's stream of the right SMs, in the program's stream order, on every stream kind
and entry point, through stream capture, stream reuse, context destruction and a reset; what
cannot be confined gets its rule's on_unwrappable.

The fake driver (tests/fixtures/native/fake_cuda.c, "green contexts") splits 132 SMs in steps of 8,
records on which SMs each launch ran, and counts every break of stream order: a green launch
not ordered after the program's stream, or program work queued before it waited for the
launch."""

import re
import subprocess
import sys

import pytest
from harness import env_for

LABELS = ("legacy", "legacy-again", "ptsz", "per-thread", "stream", "priority", "ex",
          "cooperative", "new-stream", "captured", "other-context", "after-destroy",
          "after-reset")


def green_policy(params="{share: 0.25}", extra=""):
    return ("version: 1\ndefault: allow\nrules:\n  - name: quarter\n"
            "    match: {kernel: vecAdd}\n    action: wrap\n    wrapper: sm_share\n"
            f"    params: {params}\n{extra}")


def launches(stdout):
    """{label: (rc, first SM, SMs, ordered)} from prog_green's lines."""
    return {m[1]: (int(m[2]), int(m[3]), int(m[4]), int(m[5])) for m in re.finditer(
        r"^green (\S+) rc=(-?\d+) first=(\d+) sms=(\d+) ordered=(\d)$", stdout, re.M)}


def tail(stdout):
    violations = int(re.search(r"^order-violations (\d+)$", stdout, re.M)[1])
    counts = re.search(r"^green-contexts created=(\d+) destroyed=(\d+) streams=(\d+) "
                       r"streams-destroyed=(\d+)$", stdout, re.M)
    return violations, tuple(int(x) for x in counts.groups())


def test_without_clc_every_launch_runs_on_the_whole_device(native, run_native):
    # GIVEN the program alone
    proc = run_native([native["prog_green"]])
    # THEN every launch ran on all 132 SMs, and the program made no green context
    assert proc.returncode == 0, proc.stderr
    seen = launches(proc.stdout)
    assert set(seen) >= set(LABELS)
    assert all(sms == 132 for _, _, sms, _ in seen.values())
    assert tail(proc.stdout) == (0, (0, 0, 0, 0))


@pytest.mark.parametrize("params,sms", [("{share: 0.25}", 32), ("{sms: 20}", 24),
                                        ("{sms: 3}", 8), ("{share: 1.0}", 128)])
def test_confined_kernel_runs_on_its_partition_in_stream_order(clc_run, native, params, sms):
    # GIVEN vecAdd confined to a share (rounded to the device's step of 8 SMs, at least one
    # step, at most the whole steps the device has)
    run = clc_run(green_policy(params), [native["prog_green"]])
    assert run.proc.returncode == 0, run.stderr
    seen = launches(run.stdout)
    # THEN each of its launches, on every stream kind and entry point, through a capture, a
    # new stream, another context and a reset, ran on that many SMs, ordered after its stream
    for label in LABELS:
        assert seen[label] == (0, 0, sms, 1), label
    # AND the kernel left alone ran on the whole device
    assert seen["unconfined"] == (0, 0, 132, 0)
    # AND a graph kernel node of a library's kernel, named by the kernel or by its function in
    # the context (what cudart gives), runs on the partition;
    # one of a module's function, which cannot be put in a green context, gets on_unwrappable
    # (allow: the whole device), said once
    assert seen["graph-node-library"][:3] == (0, 0, sms)
    assert seen["graph-node-function"][:3] == (0, 0, sms)
    assert seen["graph-node-module"][:3] == (0, 0, 132)
    assert run.stderr.count("clc: sm_share: a confined kernel's graph node (made with the graph "
                            "API) could not be put in its green context (CUresult 801)") == 1
    assert "check cuStreamEndCapture -> 0" in run.stdout
    # AND the program's stream never ran ahead of a confined launch; the reset destroyed the
    # green context (it holds the primary context), and one was made again; the context the
    # program made (cuCtxCreate) was a green context of its own, destroyed with it
    violations, (created, destroyed, _, _) = tail(run.stdout)
    assert violations == 0
    assert (created, destroyed) == (3, 2)
    # AND the capture says which kernel was confined and on how many SMs
    cap = run.capture()
    assert any(f"is {sms} of its 132 SMs (a green context" in m.text for m in cap.messages)
    # AND nothing was built: no engine took part (the shim confines on its own)
    assert not any("wrap libraries" in m.text for m in cap.messages)
    # AND every launch counted as launched, none failed or denied
    # (one kernel per context and per load: summed)
    vecadd = [st for kid, st in cap.stats.items() if cap.kernels[kid].mangled.startswith(
        "_Z6vecAdd")]
    assert [sum(getattr(st, f) for st in vecadd) for f in ("launches", "denied", "failed")] == \
        [len(LABELS), 0, 0]
    # AND the exit statistics say on how many SMs each confined kernel ran, the summary too;
    # the kernel left alone ran confined nowhere
    assert {st.confined_sms for st in vecadd} == {sms}
    fill = [st for kid, st in cap.stats.items() if cap.kernels[kid].mangled.startswith("_Z4fill")]
    assert [st.confined_sms for st in fill] == [0]
    assert re.search(rf"^  {sms} SMs  vecAdd\(", run.stderr, re.M), run.stderr


def test_place_last_takes_the_devices_last_group(clc_run, native):
    # GIVEN vecAdd confined to 32 SMs at the device's far end
    run = clc_run(green_policy("{sms: 32, place: last}"), [native["prog_green"]])
    seen = launches(run.stdout)
    # THEN it ran on the last group of 32 the device splits into (132 SMs: 96..127), never on
    # the first SMs a tenant placed first would get
    assert seen["stream"] == (0, 96, 32, 1), run.stdout + run.stderr
    assert tail(run.stdout)[0] == 0


def test_one_green_stream_per_program_stream_and_context(clc_run, native):
    # GIVEN the confined launches of prog_green: the legacy stream (NULL and CU_STREAM_LEGACY
    # alike), the per-thread stream (ptsz NULL and CU_STREAM_PER_THREAD alike), two streams,
    # the same stream's new incarnation, another context's legacy stream, then after the
    # reset the legacy stream again
    run = clc_run(green_policy(), [native["prog_green"]])
    _, (_, _, streams, destroyed) = tail(run.stdout)
    # THEN green streams were made only for distinct (context, stream) pairs, never per launch:
    # in the primary context the legacy, per-thread, two streams and the new one; the other
    # context's legacy stream; the legacy stream again after the reset
    assert streams == 7, run.stdout
    # AND each went with what it stood for: the program's destroyed stream (1), the destroyed
    # context (1), everything of the device before the reset (4); the last one is left
    assert destroyed == 6, run.stdout


@pytest.mark.parametrize("on_unwrappable,rc", [("allow", 0), ("deny", 800)])
def test_a_device_without_partitions_gets_on_unwrappable(clc_run, native, on_unwrappable, rc):
    # GIVEN a device that cannot be partitioned
    run = clc_run(green_policy(extra=f"    on_unwrappable: {on_unwrappable}\n"),
                  [native["prog_green"]], env={"FAKE_CUDA_NO_GREEN": "1"})
    seen = launches(run.stdout)
    # THEN the kernel's launches are allowed on the whole device, or denied, as the rule says
    assert seen["stream"][0] == rc
    assert run.fake_counts().get("_Z6vecAddPKfS0_Pfi", 0) == (len(LABELS) if rc == 0 else 0)
    assert seen["unconfined"] == (0, 0, 132, 0)
    assert seen["graph-node-library"][0] == (0 if rc == 0 else 800)
    # AND that is said once
    assert run.stderr.count("clc: sm_share: a kernel could not be confined by a green context "
                            "(CUresult 801: no SM partitions on this driver or device)") == 1


@pytest.mark.parametrize("on_unwrappable,rc", [("allow", 0), ("deny", 720)])
def test_a_launch_the_partition_refuses_gets_on_unwrappable(clc_run, native, on_unwrappable,
                                                            rc):
    # GIVEN a driver that refuses every launch on a green stream (a cooperative grid too large
    # for the partition)
    run = clc_run(green_policy(extra=f"    on_unwrappable: {on_unwrappable}\n"),
                  [native["prog_green"]], env={"FAKE_CUDA_GREEN_REFUSE": "1"})
    seen = launches(run.stdout)
    # THEN the launch runs on the whole device (allow), or the program gets the driver's
    # refusal and the kernel never runs outside its share (deny)
    assert seen["stream"][0] == rc
    assert run.fake_counts().get("_Z6vecAddPKfS0_Pfi", 0) == (len(LABELS) if rc == 0 else 0)
    # AND the program's stream order held all the same, and it was said once
    assert tail(run.stdout)[0] == 0
    assert run.stderr.count("clc: sm_share: the driver refused a confined kernel's launch on its "
                            "green context (CUresult 720)") == 1


def test_hooks_confine_too(clc_run, native, tmp_path):
    # GIVEN a hook that answers sm_share for vecAdd (the engine decides, not clc-run)
    hook = tmp_path / "share.py"
    hook.write_text("import clc\n\n@clc.on_launch\ndef share(launch):\n"
                    "    if launch.base == 'vecAdd':\n"
                    "        return clc.wrap('sm_share', sms=16)\n")
    run = clc_run("version: 1\ndefault: allow\n", [native["prog_green"]],
                  options=["--hooks", str(hook)])
    seen = launches(run.stdout)
    # THEN its launches ran on 16 SMs, in order
    assert seen["stream"] == (0, 0, 16, 1), run.stdout + run.stderr
    assert tail(run.stdout)[0] == 0


def test_the_splice_is_still_there_when_asked_for(clc_run, native):
    # GIVEN sm_share asked of the splice for a kernel that ships no loopable PTX here (the
    # fake's vecAdd is an empty entry)
    run = clc_run(green_policy(extra="    mechanism: splice\n"), [native["prog_green"]])
    seen = launches(run.stdout)
    # THEN no launch went to a green context
    assert all(where[2] == 132 for where in seen.values())
    assert tail(run.stdout)[1][0] == 0


def doctor(native, env=None):
    return subprocess.run([sys.executable, "-m", "clc", "doctor"], env=env_for(native, env),
                          capture_output=True, text=True, timeout=60).stdout


def test_doctor_says_whether_the_gpu_can_be_partitioned(native):
    # GIVEN the fake driver's device (132 SMs, partitions in steps of 8)
    # THEN clc doctor says so
    assert re.search(r"^ok +partitions +green contexts: 0: 132 SMs in steps of 8$",
                     doctor(native), re.M)
    # AND says when the device cannot be partitioned
    assert "0: cannot be partitioned (CUresult 801)" in doctor(native, {"FAKE_CUDA_NO_GREEN": "1"})


def test_doctor_says_whether_an_mps_daemon_runs(native, tmp_path):
    # GIVEN no MPS daemon's control pipe, then one
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert "shares across processes cannot hold" in doctor(native, env)
    (tmp_path / "control").touch()
    # THEN clc doctor tells the two apart
    assert re.search(r"^ok +MPS +an MPS daemon is running", doctor(native, env), re.M)


def test_streams_made_and_destroyed_by_threads_while_others_launch(clc_run, native):
    # GIVEN four threads, each making a stream, launching the confined kernel on it and
    # destroying it, 200 times, at once
    run = clc_run(green_policy(), [native["prog_green_threads"]], timeout=300)
    assert run.proc.returncode == 0, run.stderr
    # THEN every launch went through, in stream order, and each green stream clc made went
    # with the program's stream it stood for
    assert "threads failures=0 launches=800" in run.stdout, run.stdout + run.stderr
    assert "order-violations 0" in run.stdout
    made, destroyed = map(int, re.search(r"^green-streams made=(\d+) destroyed=(\d+)$",
                                         run.stdout, re.M).groups())
    assert made == destroyed == 800, run.stdout


def program_policy(params="{share: 0.25, scope: program}", match="", extra=""):
    return ("version: 1\ndefault: allow\nrules:\n  - name: whole-program\n"
            f"{match}    action: wrap\n    wrapper: sm_share\n    params: {params}\n{extra}")


def test_scope_program_confines_the_primary_context_with_nothing_per_launch(clc_run, native):
    # GIVEN a policy that confines the whole process to a quarter of the device
    run = clc_run(program_policy(), [native["prog_green"]])
    assert run.proc.returncode == 0, run.stderr
    seen = launches(run.stdout)
    # THEN every launch in the primary context (the program was handed the partition's
    # context), on every stream kind and entry point, through a capture, a new stream and a
    # reset, ran on the partition's 32 SMs, with no redirect (no green stream, no reordering)
    for label in LABELS:
        assert seen[label] == (0, 0, 32, 0), label
    # AND so did the kernel no rule names, and every graph kernel node, a module function's too
    assert seen["unconfined"] == (0, 0, 32, 0)
    for label in ("graph-node-module", "graph-node-library", "graph-node-function"):
        assert seen[label][:3] == (0, 0, 32), label
    # AND a context the program made itself (cuCtxCreate) was a green context of the
    # partition's SMs: its kernel ran there as made, too (checked in the loop above)
    violations, (created, destroyed, streams, streams_destroyed) = tail(run.stdout)
    assert violations == 0
    # AND one green context was made for the primary context, destroyed by the reset and made
    # again at the next retain, and one for the program's own context, destroyed with it; no
    # green stream was needed
    assert (created, destroyed, streams, streams_destroyed) == (3, 2, 0, 0)
    # AND the report says each kernel ran confined, on how many SMs
    cap = run.capture()
    confined = {cap.kernels[kid].mangled[:8]: st.confined_sms for kid, st in cap.stats.items()}
    assert confined["_Z6vecAd"] == 32 and confined["_Z4fillP"] == 32, confined
    assert not any("could not" in m.text for m in cap.messages)


def test_scope_program_lives_through_the_programs_retains_and_threads(clc_run, native):
    # GIVEN a whole process confined to 16 SMs, retaining the primary context twice, releasing
    # once, then four threads launching on it, then its last release and a new retain
    run = clc_run(program_policy("{sms: 16, scope: program}"), [native["prog_green_program"]])
    assert run.proc.returncode == 0, run.stderr
    seen = launches(run.stdout)
    # THEN both retains got the partition's context, which outlived the first release
    assert "same-handle 1" in run.stdout
    assert "after-one-release destroyed=0" in run.stdout
    for label in ("legacy", "stream", "other-kernel", "after-one-release", "threads",
                  "after-release"):
        assert seen[label] == (0, 0, 16, 0), (label, run.stdout)
    # AND every thread's launch went through, on the partition, with no green stream made
    assert "threads failures=0 launches=200" in run.stdout
    violations, (created, destroyed, streams, _) = tail(run.stdout)
    assert (violations, streams) == (0, 0)
    # AND the last release destroyed the green context before the driver's (which then tears
    # the primary context down), and the next retain made another
    assert (created, destroyed) == (2, 1)


def test_scope_program_confines_the_runtimes_context_one_launch_at_a_time(clc_run, native):
    # GIVEN a whole process confined to 16 SMs, whose context comes as libcudart's does: the
    # driver retains it through a private path, not cuDevicePrimaryCtxRetain, and the program
    # makes it current
    run = clc_run(program_policy("{sms: 16, scope: program}"),
                  [native["prog_green_program"], "cudart"])
    assert run.proc.returncode == 0, run.stderr
    seen = launches(run.stdout)
    # THEN the program keeps that context, and every launch of every thread is confined to the
    # partition one launch at a time (on green streams clc made, in the program's stream
    # order), as is said once
    for label in ("legacy", "stream", "other-kernel", "after-one-release", "threads",
                  "after-release"):
        assert seen[label] == (0, 0, 16, 1), (label, run.stdout)
    assert "threads failures=0 launches=200" in run.stdout
    violations, (_, _, streams, _) = tail(run.stdout)
    assert violations == 0 and streams > 0
    cap = run.capture()
    assert sum("is confined one launch at a time" in m.text for m in cap.messages) == 1, \
        [m.text for m in cap.messages]


def test_scope_program_follows_the_rules_process_conditions(clc_run, native):
    # GIVEN a rule confining tenant b's processes only
    policy = program_policy(match="    match: {tenant: b}\n")
    # THEN tenant a's run is left whole, tenant b's is confined
    a = clc_run(policy, [native["prog_green_program"]], options=["--tenant", "a"])
    b = clc_run(policy, [native["prog_green_program"]], options=["--tenant", "b"])
    assert launches(a.stdout)["legacy"] == (0, 0, 132, 0), a.stderr
    assert launches(b.stdout)["legacy"] == (0, 0, 32, 0), b.stderr
    assert tail(a.stdout)[1][0] == 0


def test_scope_program_asks_the_programs_engine_with_hooks(clc_run, native, tmp_path):
    # GIVEN a policy with a hook (the program's engine decides, not clc-run) and scope: program
    hook = tmp_path / "allow.py"
    hook.write_text("import clc\n\n@clc.on_launch\ndef look(launch):\n    return None\n")
    run = clc_run(program_policy(), [native["prog_green_program"]],
                  options=["--hooks", str(hook)])
    # THEN the engine answered the program question: the process is confined
    assert launches(run.stdout)["legacy"] == (0, 0, 32, 0), run.stdout + run.stderr


def test_scope_program_without_partitions_falls_back_to_each_launch(clc_run, native):
    # GIVEN scope: program on a device that cannot be partitioned, with on_unwrappable: deny
    run = clc_run(program_policy(extra="    on_unwrappable: deny\n"),
                  [native["prog_green_program"]], env={"FAKE_CUDA_NO_GREEN": "1"})
    seen = launches(run.stdout)
    # THEN the program keeps its primary context, said once, and the rule's kernels are then
    # denied one launch at a time, as on_unwrappable says
    assert run.stderr.count("clc: sm_share: the program's context could not be made a green "
                            "context (scope: program) (CUresult 801") == 1, run.stderr
    assert seen["legacy"][0] == 800
    assert run.fake_counts().get("_Z6vecAddPKfS0_Pfi", 0) == 0


def test_scope_program_policy_errors(tmp_path):
    from clc.policy import PolicyError, load_policy
    path = tmp_path / "p.yaml"
    # A rule with scope: program may match only what a process is, and needs a green context
    path.write_text(program_policy(match="    match: {kernel: 'gemm*', tenant: b}\n"))
    with pytest.raises(PolicyError, match=r"p.yaml:5:13: 'kernel' cannot be matched by rule "
                                          r"'whole-program': scope: program confines every "
                                          r"kernel of a process"):
        load_policy(path)
    path.write_text(program_policy(extra="    mechanism: splice\n"))
    with pytest.raises(PolicyError, match=r"scope: program needs a green context"):
        load_policy(path)
    path.write_text(program_policy("{share: 0.5, scope: kernels}"))
    with pytest.raises(PolicyError, match=r"scope must be kernel or program"):
        load_policy(path)


def test_scope_program_holds_inside_the_process_whatever_kernel_rules_say(clc_run, native):
    # GIVEN a process confined to 32 SMs, after a rule that denies fill and one that would
    # confine vecAdd to 16 SMs one launch at a time
    policy = ("version: 1\ndefault: allow\nrules:\n"
              "  - name: no-fill\n    match: {kernel: fill}\n    action: deny\n"
              "  - name: vecadd-16\n    match: {kernel: vecAdd}\n    action: wrap\n"
              "    wrapper: sm_share\n    params: {sms: 16}\n"
              "  - name: whole-program\n    action: wrap\n    wrapper: sm_share\n"
              "    params: {share: 0.25, scope: program}\n")
    run = clc_run(policy, [native["prog_green_program"]])
    seen = launches(run.stdout)
    # THEN the earlier deny still refuses fill, and vecAdd runs on the process's partition,
    # launched as it is (no green stream): the other share is not applied inside it, said once
    assert seen["other-kernel"][0] == 800
    assert seen["legacy"] == (0, 0, 32, 0), run.stdout + run.stderr
    assert tail(run.stdout)[1][2] == 0
    assert run.stderr.count("clc: sm_share: a rule confines a kernel of a process confined "
                            "program-wide") == 1
    # AND the report lists vecAdd as confined, and not fill, which never ran
    cap = run.capture()
    confined = {cap.kernels[kid].mangled[:8]: st.confined_sms for kid, st in cap.stats.items()}
    assert confined == {"_Z6vecAd": 32, "_Z4fillP": 0}, confined


def test_only_a_process_confined_program_wide_is_told_its_launches_go_one_at_a_time(clc_run,
                                                                                   native):
    # GIVEN tenant b's processes confined program-wide, and every kernel confined per launch
    policy = ("version: 1\ndefault: allow\nrules:\n  - name: whole-program\n"
              "    match: {tenant: b}\n    action: wrap\n    wrapper: sm_share\n"
              "    params: {sms: 16, scope: program}\n"
              "  - name: each-kernel\n    action: wrap\n    wrapper: sm_share\n"
              "    params: {sms: 32}\n")
    said = "is confined one launch at a time"
    # WHEN a program that takes its context as libcudart does runs as tenant a, then as b
    # THEN both are confined one launch at a time (a by its kernel rule, to 32 SMs; b by its
    # program rule, to 16), and only b, whose process the program-wide rule holds, is told so
    # (each capture read before the next run writes its own)
    a = clc_run(policy, [native["prog_green_program"], "cudart"], options=["--tenant", "a"])
    assert launches(a.stdout)["legacy"] == (0, 0, 32, 1), a.stdout
    assert not any(said in m.text for m in a.capture().messages)
    b = clc_run(policy, [native["prog_green_program"], "cudart"], options=["--tenant", "b"])
    assert launches(b.stdout)["legacy"] == (0, 0, 16, 1), b.stdout
    assert sum(said in m.text for m in b.capture().messages) == 1

# SPDX-License-Identifier: Apache-2.0
"""Timed launches (`time: true`) timed from CUPTI's kernel records: over the fake driver and the
fake CUPTI of tests/fixtures/native/fake_cupti.c, which gives each launch a kernel record of
1000 + grid x + block x ns, and calls its subscriber back inside each launch. What is checked
here is clc's side: each record joined to its own launch, whatever the thread, the source said,
CUPTI given up to a program that comes for it, the fallback to events; tests/gpu checks the
real CUPTI."""

import json
import subprocess
import sys

import pytest
from harness import TIME_ALL, nonzero

LOST = "did not come back from CUPTI"


def fake_ns(launch):
    return 1000 + launch.grid[0] + launch.block[0]


def timing_sources(path):
    doc = json.loads(subprocess.run(
        [sys.executable, "-m", "clc", "report", str(path), "--format", "json", "-o", "-"],
        capture_output=True, text=True, check=True, timeout=60).stdout)
    out = {}
    for c in doc["captures"]:
        for source, n in c["timing_sources"].items():
            out[source] = out.get(source, 0) + n
    return out


@pytest.fixture
def cupti(native):
    return ["--cupti", str(native["libcupti"])]


def test_every_timed_launch_gets_its_own_kernels_time(native, clc_run, cupti):
    # WHEN a program of launches of several shapes runs under time-all, the fake CUPTI there
    run = clc_run(TIME_ALL, [native["prog_cudart"]], options=cupti)
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN every launch that ran has a GPU time, its own kernel's
    launches = [ln for ln in cap.launches if ln.result == 0 and not ln.entry_name.startswith(
        "cuGraph")]
    assert len({(ln.grid, ln.block) for ln in launches}) > 2
    assert [ln.gpu_ns for ln in launches] == [fake_ns(ln) for ln in launches]
    # AND the kernels' totals add up those times, from CUPTI, as the report says
    for kid, st in cap.stats.items():
        mine = [ln for ln in launches if ln.kernel_id == kid]
        assert st.timed == len(mine)
        assert st.gpu_ns == sum(fake_ns(ln) for ln in mine)
    assert timing_sources(run.output) == {"cupti": len(launches)}
    assert "GPU times: CUPTI kernel records" in run.stdout + run.stderr
    assert LOST not in run.stderr


def test_many_threads_lose_no_time(native, clc_run, cupti):
    # GIVEN the fake CUPTI, which hands records back from a thread of its own every 200 ms and
    # whenever a buffer's worth waits, and calls back inside each launch
    # WHEN 8 threads make 10000 timed launches each
    run = clc_run(TIME_ALL, [native["prog_threads"], "8", "10000"], options=cupti, timeout=300)
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN each one has its own launch's time: from CUPTI, but for the few launches of other
    # threads while one thread started CUPTI (no launch waits for that: they are timed by
    # events)
    by_seq = {ln.seq: ln for ln in cap.launches}
    assert len(by_seq) == 8 * 10000
    sources = timing_sources(run.output)
    assert set(sources) <= {"cupti", "events"}, sources
    # (how many fall in that window depends on how long the start takes on a loaded machine:
    # what holds is that once a thread's launch was timed by CUPTI, all its later ones are)
    by_thread = {}
    for ln in sorted(by_seq.values(), key=lambda ln: ln.seq):
        by_thread.setdefault(ln.tid, []).append(ln.gpu_ns == fake_ns(ln))
    for tid, by_cupti in by_thread.items():
        first = by_cupti.index(True) if True in by_cupti else len(by_cupti)
        assert all(by_cupti[first:]), (tid, first, by_cupti[first:].count(False), sources)
    assert sum(ln.gpu_ns == fake_ns(ln) for ln in by_seq.values()) == sources["cupti"]
    assert all(ln.gpu_ns for ln in by_seq.values())
    assert sum(st.timed for st in cap.stats.values()) == len(by_seq)
    assert LOST not in run.stderr


def test_lost_kernel_records_are_said_and_not_counted(native, clc_run, cupti):
    # GIVEN a CUPTI that never hands back every third kernel record
    run = clc_run(TIME_ALL, [native["prog_threads"], "1", "300"], options=cupti,
                  env={"FAKE_CUPTI_LOSE": "3"})
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN the launches whose records came are timed, the others not, and clc says how many
    timed = [ln for ln in cap.launches if ln.gpu_ns is not None]
    assert len(cap.launches) == 300 and len(timed) == 200
    assert all(ln.gpu_ns == fake_ns(ln) for ln in timed)
    assert sum(st.timed for st in cap.stats.values()) == 200
    said = "clc: 100 timed launches' GPU times did not come back from CUPTI"
    assert run.stderr.count(said) == 1, run.stderr


@pytest.mark.parametrize("timing", ["auto", "cupti"])
def test_a_cupti_that_refuses_leaves_the_events(native, clc_run, cupti, timing):
    # GIVEN a CUPTI that refuses clc as a subscriber (another tool holds it)
    run = clc_run(TIME_ALL, [native["prog_cudart"]], options=[*cupti, "--timing", timing],
                  env={"FAKE_CUPTI_REFUSE": "1"})
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN the launches are timed by events all the same
    ran = nonzero({k: st.launches - st.failed for k, st in cap.stats.items()})
    assert sum(st.timed for st in cap.stats.values()) == sum(ran.values())
    assert set(timing_sources(run.output)) == {"events"}
    # AND only where CUPTI was asked for by name is its refusal a warning, said once
    said = ("clc: GPU times come from CUDA events around each launch: another tool holds CUPTI "
            "(it takes one subscriber at a time)")
    assert run.stderr.count(said) == (1 if timing == "cupti" else 0), run.stderr


@pytest.mark.parametrize("code, why", [
    (35, "the driver lets only administrators trace GPU work here"),
    (43, "CUPTI cannot trace this device"),
    (15, "libcupti does not work with this driver"),
    (7, "CUPTI refused clc as a subscriber (CUptiResult 7)")])
def test_a_cupti_refusal_says_why(native, clc_run, cupti, code, why):
    # GIVEN a CUPTI that refuses clc with a code other than "another subscriber"
    run = clc_run(TIME_ALL, [native["prog_cudart"]], options=[*cupti, "--timing", "cupti"],
                  env={"FAKE_CUPTI_REFUSE": str(code)})
    assert run.proc.returncode == 0, run.stderr
    # THEN the launches are timed by events, and the warning says why CUPTI was not used
    assert set(timing_sources(run.output)) == {"events"}
    said = "clc: GPU times come from CUDA events around each launch: " + why
    assert run.stderr.count(said) == 1, run.stderr
    assert "another tool holds CUPTI" not in run.stderr


def test_timing_events_never_loads_cupti(native, clc_run, cupti):
    # WHEN the run asks for events, a libcupti named all the same
    run = clc_run(TIME_ALL, [native["prog_cudart"]], options=[*cupti, "--timing", "events"])
    assert run.proc.returncode == 0, run.stderr
    # THEN every time is an event's, and libcupti was never loaded
    assert set(timing_sources(run.output)) == {"events"}
    assert "fake_cupti: loaded" not in run.stderr
    # (as it is, by default)
    loaded = clc_run(TIME_ALL, [native["prog_cudart"]], options=cupti)
    assert "fake_cupti: loaded" in loaded.stderr


def test_records_without_timestamps_time_nothing(native, clc_run, cupti):
    # GIVEN a CUPTI that gives every third kernel record no timestamps
    run = clc_run(TIME_ALL, [native["prog_threads"], "1", "300"], options=cupti,
                  env={"FAKE_CUPTI_ZERO": "3"})
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN those launches have no GPU time (not 0 ns), and clc says how many
    assert sorted({ln.gpu_ns for ln in cap.launches}, key=str) == [fake_ns(cap.launches[0]),
                                                                   None]
    assert sum(st.timed for st in cap.stats.values()) == 200
    assert run.stderr.count("clc: 100 timed launches' GPU times did not come back") == 1


def test_a_forked_child_counts_nothing_of_its_parents_times(native, clc_run, cupti):
    # WHEN a program timed by CUPTI forks children while a thread of its own keeps launching
    # (a child of a process that started the driver cannot launch: the fake driver refuses as
    # the real one does)
    run = clc_run(TIME_ALL, [native["prog_fork"], "threaded", "2"], options=cupti)
    assert run.proc.returncode == 0, run.stdout + run.stderr
    caps = run.captures()
    assert len(caps) == 3
    pids = {c.pid for c in caps}
    (parent,) = [c for c in caps if c.ppid not in pids]
    # THEN the parent's launches are all timed, by CUPTI, and no child counts any time: what
    # the parent had in flight at the fork is not the child's
    assert sum(st.timed for st in parent.stats.values()) == sum(
        st.launches - st.failed for st in parent.stats.values())
    assert set(parent.timing_sources) <= {"cupti", "events"}
    assert parent.timing_sources.get("cupti", 0) > 0
    for child in (c for c in caps if c is not parent):
        assert not child.timing_sources and not sum(st.timed for st in child.stats.values())
    assert LOST not in run.stderr


def test_cupti_names_a_file(native, clc_run, tmp_path):
    run = clc_run(TIME_ALL, [native["prog_cudart"]],
                  options=["--cupti", str(tmp_path / "none.so")])
    assert run.proc.returncode == 2
    assert "none.so': no such file (expected a libcupti.so)" in run.stderr


def test_a_program_using_cupti_itself_gets_it_whole(native, clc_run, run_native, cupti):
    # GIVEN a program that launches 20 times, then takes CUPTI for itself (its own subscriber,
    # its own buffers) for 10 more launches
    argv = [native["prog_cupti_user"], "20", "10"]
    alone = run_native(argv)
    assert "records kernel=10 callbacks=10" in alone.stdout, alone.stdout
    # WHEN it runs under time-all, clc timing by CUPTI until then, verbose
    run = clc_run(TIME_ALL, argv, options=[*cupti, "-v"])
    assert run.proc.returncode == 0, run.stderr
    # THEN the program gets exactly what it gets alone
    assert "records kernel=10 callbacks=10" in run.stdout, run.stdout
    # AND clc said (verbose) it gave CUPTI up, and timed the first 20 launches by CUPTI, the
    # rest by events, as the report says
    assert run.stderr.count("clc: the program uses CUPTI itself") == 1, run.stderr
    assert timing_sources(run.output) == {"cupti": 20, "events": 10}
    cap = run.capture()
    assert [ln.gpu_ns for ln in cap.launches[:20]] == [fake_ns(ln) for ln in cap.launches[:20]]
    assert all(ln.gpu_ns for ln in cap.launches[20:])
    assert LOST not in run.stderr


def test_a_program_using_cupti_from_the_start_leaves_clc_the_events(native, clc_run, cupti):
    # WHEN the program takes CUPTI before its first launch
    run = clc_run(TIME_ALL, [native["prog_cupti_user"], "0", "10"], options=cupti)
    assert run.proc.returncode == 0, run.stderr
    # THEN it gets its records, and clc times by events, quietly
    assert "records kernel=10 callbacks=10" in run.stdout, run.stdout
    assert timing_sources(run.output) == {"events": 10}
    assert "CUPTI itself" not in run.stderr

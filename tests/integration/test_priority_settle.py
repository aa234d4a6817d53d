# SPDX-License-Identifier: Apache-2.0
"""Priority classes beyond kernel launches, over the fake driver: a latency-critical service that
replays CUDA graphs and waits on events, or ends its requests with a blocking copy to the host,
marks its GPU busy and idle as one that launches and synchronizes does; a best-effort process's
graph replays are held as its launches are.

The programs are tests/fixtures/native/prog_priority driven line by line (see test_priority.py):
the time a best-effort command's "done" line comes back is when its launches returned.
"""

import os
import struct
import time

import pytest

# test_priority's fixtures (board, policy, pair) are taken by name, which ruff reads as
# redefinitions.
# ruff: noqa: F811
from test_priority import (FAKE_UUID, HEADER, MAGIC, ROW, board, pair, policy,  # noqa: F401
                           slots, start_time_of, user_dir)

HELD = 0.05  # seconds a held launch must still be waiting


def assert_held(be, command):
    be.send(command)
    assert be.wait_for("done", HELD) is None, f"{command!r} was not held"


def assert_released(be, timeout=5):
    line = be.wait_for("done", timeout)
    assert line is not None and line.rstrip().endswith("rc=0"), line


def assert_let_go_by_the_service(be):
    """The best-effort process's holds ended because the service went idle, not by the floor."""
    be.finish()
    holds = be.holds()
    assert holds and not any(h.by_floor for h in holds), holds


@pytest.mark.parametrize("record", ["record", "recordf"])
def test_a_graph_replay_marks_the_gpu_busy_until_the_event_after_it_completes(pair, board, record):
    # GIVEN a latency-critical service that replays a graph and records an event after it
    lc = pair("serving")
    lc.do("graph 1")
    lc.do(record)
    assert len(slots(board)) == 1
    be = pair("batch")
    # WHEN a best-effort process launches: it waits while the replay is in flight
    assert_held(be, "launch 1")
    # THEN it goes on once the service's wait on the event returns
    lc.do("esync")
    assert_released(be)
    be.finish()
    (hold,) = be.holds()
    assert not hold.by_floor and hold.held_ns >= HELD * 1e9


# Waits that settle the service's work: (what it did before, the wait).
SETTLED = {
    # the fake's work is done when asked about
    "an-event-query-that-reports-completion": (["launch 3", "record"], ["equery"]),
    "a-blocking-copy-to-the-host": (["launch 3"], ["copy"]),
    # an event recorded while idle covers nothing; one recorded after the work covers it
    "an-event-recorded-after-the-work": (["record", "launch 2", "esync"], ["record", "esync"]),
}


@pytest.mark.parametrize("before,wait", SETTLED.values(), ids=SETTLED.keys())
def test_a_wait_that_covers_the_work_settles_it(pair, before, wait):
    # GIVEN a service with work in flight: a best-effort launch waits
    lc = pair("serving")
    for step in before:
        lc.do(step)
    be = pair("batch")
    assert_held(be, "launch 1")
    # WHEN the service waits for its work THEN the launch goes on, let go by the service
    for step in wait:
        lc.do(step)
    assert_released(be)
    assert_let_go_by_the_service(be)


# Waits that must not settle the service's work: (what the service does, why).
NOT_SETTLED = {
    # busy on two streams, it waits on an event recorded on one of them: the other's work may
    # still run
    "an-event-after-part-of-the-work": ["launch 2 s", "launch 1", "record", "esync"],
    # an event that covered the work, destroyed (a new one may get its handle), then a wait on
    # the new, never recorded event
    "a-destroyed-event": ["launch 2", "record", "edestroy", "esync"],
}


@pytest.mark.parametrize("steps", NOT_SETTLED.values(), ids=NOT_SETTLED.keys())
def test_a_wait_that_does_not_cover_the_work_settles_nothing(pair, steps):
    # GIVEN a service that did the steps
    lc = pair("serving")
    for step in steps:
        lc.do(step)
    # WHEN a best-effort process launches THEN it waits, until a synchronization covers everything
    be = pair("batch")
    assert_held(be, "launch 1")
    lc.do("sync ctx")
    assert_released(be)


def test_a_best_effort_graph_replay_is_held(pair):
    lc = pair("serving")
    lc.do("launch 1")
    be = pair("batch")
    assert_held(be, "graph 1")
    lc.do("sync ctx")
    assert_released(be)
    # and replays made while the service is idle are not held
    assert be.do("graph 50") < 0.5


def test_under_held_share_a_graph_replay_waits_where_a_launch_runs_on_the_share(pair):
    lc = pair("serving")
    lc.do("launch 1")
    be = pair("shared")
    # a launch is confined to the share at once...
    assert be.do("launch 1") < HELD
    first, sms = be.where()
    assert sms < 132 and first > 0
    # ...a graph replay cannot be: it waits
    assert_held(be, "graph 1")
    lc.do("sync ctx")
    assert_released(be)
    be.finish()
    kinds = {h.shared for h in be.holds()}
    assert kinds == {True, False}


def test_work_on_several_streams_is_settled_stream_by_stream(pair):
    # GIVEN a service whose warm-up ran on two streams, never synchronized as a whole (a graph
    # captured on a side stream, say), then replays on the default stream and waits on events
    lc = pair("serving")
    lc.do("launch 2 s")
    lc.do("launch 1")
    lc.do("record s")
    lc.do("esync")  # its own stream's work is done; the default stream's launch is not
    be = pair("batch")
    assert_held(be, "launch 1")
    # WHEN the default stream's work is waited for too, by an event after it
    lc.do("graph 1")
    lc.do("record")
    lc.do("esync")
    # THEN every stream's work is done: the GPU is idle
    assert_released(be)
    assert_let_go_by_the_service(be)


def test_a_stream_synchronization_settles_once_every_stream_is_done(pair):
    # GIVEN a service with work on three streams: two of them waited for
    lc = pair("serving")
    lc.do("launch 1 s")
    lc.do("ptsz 1")
    lc.do("launch 1")
    lc.do("sync s")
    lc.do("copy")  # the legacy default stream's work; not the per-thread stream's
    be = pair("batch")
    assert_held(be, "launch 1")
    # WHEN the third is waited for too
    lc.do("query t")
    # THEN the GPU is idle
    assert_released(be)
    assert_let_go_by_the_service(be)


def test_launches_captured_into_a_graph_do_not_mark_the_gpu_busy(pair):
    # GIVEN a service that captures its work into a graph on a side stream (it runs nothing)
    lc = pair("serving")
    lc.do("capture 5")
    # THEN a best-effort process is not held...
    be = pair("batch")
    assert be.do("launch 10") < HELD
    # ...until the service replays work
    lc.do("launch 1")
    assert_held(be, "launch 1")
    lc.do("sync ctx")
    assert_released(be)


def test_a_side_stream_quiet_for_idle_after_counts_as_done(pair):
    # GIVEN a service that warmed up on a side stream it never waits for (PyTorch makes its
    # default stream wait for the side stream's event instead), then serves by graph replays
    # and event waits on the default stream
    lc = pair("serving", idle=60)
    lc.do("launch 2 s")
    be = pair("batch", idle=60)
    lc.send("gcycle 2000 1500")
    time.sleep(0.4)
    # WHEN a best-effort process launches while the service serves
    # THEN it is held only while a replay is in flight, not to its floor
    assert be.do("launch 20") < HELD
    assert lc.wait_for("done", 10) is not None
    be.finish()
    assert not any(h.by_floor for h in be.holds())


def test_a_thread_blocked_in_a_wait_keeps_the_gpu_busy_whatever_is_settled(pair, board):
    # GIVEN a slot whose launches are all settled, but with a thread blocked in a wait for the
    # GPU (work clc does not count, or a stream counted done after idle_after_ms)
    mine = user_dir(board, make=True)
    me = os.getpid()
    row = ROW.pack(FAKE_UUID, 1, 1, 7, 7, 0, 0, 0, 0, 0)  # used, waiting 1, launched 7, settled 7
    slot = mine / f"lc.{me}.{start_time_of(me)}"
    slot.write_bytes(HEADER.pack(MAGIC, 1, 64 + 16 * 64, me, os.geteuid(), start_time_of(me),
                                 b"waiting") + row + bytes(64 * 15))
    os.chmod(slot, 0o644)
    be = pair("batch")
    # THEN a best-effort launch waits while the wait lasts
    assert_held(be, "launch 1")
    # AND goes on once it has ended (the row's waiting count, written in place)
    fd = os.open(slot, os.O_WRONLY)
    try:
        os.pwrite(fd, struct.pack("<I", 0), 64 + 20)
    finally:
        os.close(fd)
    assert_released(be)
    assert_let_go_by_the_service(be)

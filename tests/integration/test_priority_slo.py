# SPDX-License-Identifier: Apache-2.0
"""A latency-critical class's `slo`, over the fake driver: the service measures its busy periods
(quiet ones while it probes, best-effort work held whole; recent ones otherwise) and puts their
p99 on its slot; a best-effort process beside it steps below its class's held share while the
recent p99 is above slo x the quiet one, waits while the service probes, and steps back up
when the service is within its slo again.

The programs are tests/fixtures/native/prog_priority driven line by line (see test_priority.py);
slots written by hand stand for a service whose latency the test sets.
"""

import os
import struct
import time

import pytest

from clc.capture.reader import read_captures
from clc.capture.reports import summary
from clc.cli.run import capture_files
from test_priority import (ROW, ROW_SLO, Driven, start_time_of, user_dir,  # noqa: F401
                           write_slot)

# a service with slo 1.5, and a best-effort class with held_share 0.25 (flow style)
POLICY = ("version: 1\ndefault: allow\npriority:\n  board: {board}\n  idle_after_ms: 10000\n"
          "  classes:\n"
          "    - {{name: serving, class: latency-critical, match: {{tenant: serving}}, slo: 1.5}}\n"
          "    - {{name: shared, class: best-effort, match: {{tenant: shared}}, "
          "held_share: 0.25}}\n")

SLO = struct.Struct("<IIII")  # slo x 1000, quiet p99 us, recent p99 us, probe end ms


@pytest.fixture
def start(native, tmp_path):
    policy = tmp_path / "slo.yaml"
    policy.write_text(POLICY.format(board=tmp_path / "board"))
    started = []

    def run(tenant):
        d = Driven(native, tmp_path, policy, tenant, tenant)
        started.append(d)
        return d

    yield run
    for d in started:
        d.finish()


def service_slot(tmp_path, slo):
    """A busy service's slot written by hand in this user's board directory (this process
    stands for it), with the slo fields `slo`; read by the next scan."""
    mine = user_dir(tmp_path / "board", make=True)
    me = os.getpid()
    slot = mine / f"lc.{me}.1"
    write_slot(slot, me, start_time_of(me), launched=1, settled=0, slo=slo)
    time.sleep(0.06)  # the board's directories are read again every 50 ms
    return slot


def launched(slot, n):
    """The service of a slot written by hand launches again (its launches count n): it lives
    on the GPU, and stays busy."""
    fd = os.open(slot, os.O_WRONLY)
    os.pwrite(fd, struct.pack("<Q", n), 64 + 24)
    os.close(fd)


def a_second_later(slot, n):
    """A second passes, the service launching meanwhile (its launches count n before): its
    launches count after."""
    time.sleep(1.05)
    launched(slot, n + 1)
    time.sleep(0.01)
    return n + 1


def launches_a_second_apart(be, slot, n, times):
    """The best-effort process launches `times` times a second apart, the service launching
    meanwhile: the SMs each launch ran on, and the service's launches count after."""
    sms = []
    for _ in range(times):
        be.do("launch 1")
        sms.append(be.where()[1])
        n = a_second_later(slot, n)
    return sms, n


def row_slo(slot):
    """A slot's first row's slo fields."""
    return SLO.unpack_from(slot.read_bytes(), 64 + ROW_SLO)


def test_the_service_puts_the_p99_of_its_quiet_and_recent_busy_periods_on_its_slot(start,
                                                                                   tmp_path):
    # GIVEN a latency-critical process with slo 1.5 whose requests keep the GPU busy 2 ms
    lc = start("serving")
    # WHEN it serves requests for 1.5 s (a launch, 2 ms, a device synchronization, 1 ms idle)
    lc.do("cycle 2000 1000 1500", timeout=30)
    (slot,) = user_dir(tmp_path / "board").glob("lc.*")
    slo, quiet, recent, probe = row_slo(slot)
    # THEN its slot gives its slo, a probe it made (at its first busy period, 300 ms), and the
    # p99 of the busy periods of the probe and of those after it: each at least the 2 ms the
    # requests took
    assert slo == 1500 and probe > 0
    assert 2000 <= quiet < 100_000 and 2000 <= recent < 100_000, (quiet, recent)
    # AND says them at exit (-v), and keeps them in its capture, for its report
    said = lc.finish()
    line = (f"priority: slo 1.50 on device 0: busy periods' p99 {quiet / 1000:.2f} ms while "
            f"best-effort work was held (")
    assert line in said and f"{recent / 1000:.2f} ms otherwise (" in said, said
    caps = read_captures(capture_files(lc.output))
    assert any(m.text.startswith(line) for cap in caps for m in cap.messages)
    assert line in summary(caps)


def test_best_effort_steps_down_while_the_service_misses_its_slo_and_back_up(start, tmp_path):
    # GIVEN a best-effort process with held_share 0.25, and a service whose slot says it is
    # busy, its recent p99 5 ms against 1 ms quiet: 5x, its slo 1.1x
    be = start("shared")
    slot = service_slot(tmp_path, (1100, 1000, 5000, 0))
    # WHEN it launches, once a second, the service launching meanwhile
    shares, n = launches_a_second_apart(be, slot, 1, 2)
    # THEN each second it runs on a smaller share: half the class's share, then a quarter
    # (the fake's groups are of 8 SMs: the class's quarter of 132 SMs is 32 SMs)
    assert shares[0] < 32 and shares[1] < shares[0], shares
    # AND then its held launches wait, as without a share (down to the floor), and run on the
    # whole device once let go
    be.do("launch 1")
    assert be.where() == (0, 132)
    # WHEN the service is back well within its slo (recent 0.8 ms against 1 ms quiet)
    fd = os.open(slot, os.O_WRONLY)
    os.pwrite(fd, struct.pack("<I", 800), 64 + ROW_SLO + 8)
    os.close(fd)
    n = a_second_later(slot, n)
    # THEN it steps back up, a level a second, to its class's share
    seen, n = launches_a_second_apart(be, slot, n, 4)
    assert seen[-1] == 32 and seen == sorted(seen), seen
    be.finish()
    # AND the capture holds the periods kept below its bounds
    holds = [h for h in be.holds() if h.slo]
    assert holds and all(h.held_ns > 0 for h in holds)
    text = summary(read_captures(capture_files(be.output)))
    assert "kept below its bounds for a service's slo in" in text, text


def test_best_effort_work_waits_while_the_service_probes(start, tmp_path):
    # GIVEN a best-effort process with held_share 0.25, and a busy service within its slo that
    # probes for the next 0.9 s
    be = start("shared")
    until = (int(time.monotonic() * 1000) + 900) & 0xFFFFFFFF
    slot = service_slot(tmp_path, (1500, 1000, 1000, until))
    # THEN its launches wait (held whole: the service measures its quiet latency), not run on
    # the share
    be.do("launch 1")
    assert be.where() == (0, 132)
    # AND once the probe is over they run on the class's share at once
    time.sleep(max(0.0, until / 1000 - time.monotonic()) + 0.05)
    launched(slot, 2)  # the service still lives
    be.do("launch 1")
    assert be.where()[1] == 32


def test_a_probe_written_far_ahead_is_not_believed(start, tmp_path):
    # GIVEN a slot written by hand whose probe ends a minute from now (a service probes for
    # 300 ms at a time)
    be = start("shared")
    until = (int(time.monotonic() * 1000) + 60_000) & 0xFFFFFFFF
    service_slot(tmp_path, (1500, 1000, 1000, until))
    # THEN the best-effort launches run on their class's share, without waiting
    be.do("launch 1")
    assert be.where()[1] == 32

# SPDX-License-Identifier: Apache-2.0
"""A best-effort class's `reserve`, over the fake driver: while a latency-critical process lives
on the GPU (it launched there in the last second), the best-effort process's launches run on the
rest of the SMs, the device's last ones, so that the service's next request finds SMs free; with
no such process, or one quiet for long enough, they have the whole GPU again.

The programs are tests/fixtures/native/prog_priority driven line by line (see test_priority.py);
after a launch command each prints where its last launch ran, as the fake saw it.
"""

import time

import pytest

from clc.capture.reader import read_captures
from clc.capture.reports import summary
from clc.cli.run import capture_files
from test_priority import Driven

POLICY = """\
version: 1
default: allow
priority:
  board: {board}
  idle_after_ms: 10000
  classes:
    - name: serving
      class: latency-critical
      match: {{tenant: serving}}
    - name: reserved
      class: best-effort
      match: {{tenant: reserved}}
      reserve: 0.25
    - name: reserved-shared
      class: best-effort
      match: {{tenant: shared}}
      reserve: 0.25
      held_share: 0.25
"""


@pytest.fixture
def start(native, tmp_path):
    policy = tmp_path / "reserve.yaml"
    policy.write_text(POLICY.format(board=tmp_path / "board"))
    started = []

    def run(tenant, name=None):
        d = Driven(native, tmp_path, policy, tenant, name or tenant)
        started.append(d)
        return d

    yield run
    for d in started:
        d.finish()


def ran_on(be, command="launch 1"):
    """(first SM, SMs) of a launch made now, which must not wait."""
    assert be.do(command) < 0.05
    return be.where()


def test_the_reserve_is_kept_while_a_latency_critical_process_lives(start):
    be = start("reserved")
    # GIVEN no latency-critical process: the whole GPU
    first, whole = ran_on(be)
    assert first == 0
    # WHEN a service launches and goes idle again
    lc = start("serving")
    lc.do("launch 1")
    lc.do("sync ctx")
    time.sleep(0.06)  # the board's directories are read again every 50 ms
    # THEN the best-effort launches leave the first quarter of the SMs free, without waiting
    # (the fake's groups are of 8 SMs: the 4 left over, at the end, are in none)
    first, sms = ran_on(be)
    assert first >= whole * 0.25 and whole - 8 < first + sms <= whole, (first, sms, whole)
    # AND once the service has gone, the whole GPU is theirs again
    lc.finish()
    time.sleep(0.06)
    assert ran_on(be) == (0, whole)
    # AND the capture says for how long the reserve was kept: one period, none of it a wait
    be.finish()
    (period,) = be.holds()
    assert period.reserve and not period.shared and 0.05e9 < period.held_ns < 5e9
    report = summary(read_captures(capture_files(be.output)))
    assert "left the reserve free in 1 period" in report and "hold," not in report, report


def test_the_reserve_ends_when_the_service_is_quiet_for_a_second(start):
    be = start("reserved")
    _, whole = ran_on(be)
    lc = start("serving")
    lc.do("launch 1")
    lc.do("sync ctx")
    time.sleep(0.06)
    assert ran_on(be)[0] > 0
    time.sleep(1.1)
    assert ran_on(be) == (0, whole)
    lc.do("launch 1")  # busy, then idle, again
    lc.do("sync ctx")
    time.sleep(0.01)
    assert ran_on(be)[0] > 0


def test_with_held_share_the_share_while_busy_and_the_reserve_while_idle(start):
    be = start("shared")
    _, whole = ran_on(be)
    lc = start("serving")
    lc.do("launch 1")  # busy
    time.sleep(0.06)
    busy_first, busy_sms = ran_on(be)
    lc.do("sync ctx")  # idle, still living
    time.sleep(0.01)
    idle_first, idle_sms = ran_on(be)
    assert busy_sms < idle_sms < whole, (busy_sms, idle_sms, whole)
    # both at the device's last SMs (the held share's groups are of 8 SMs: 4 are left over)
    assert busy_first > idle_first >= whole * 0.25
    assert busy_first + busy_sms > whole - 8 and idle_first + idle_sms > whole - 8

# SPDX-License-Identifier: Apache-2.0
"""A latency-critical class's `slo` over the real driver: the service's busy periods (a launch,
a wait, a device synchronization) are measured and their p99 put on its board slot, for the
best-effort processes beside it (tests/integration/test_priority_slo.py has the rest over the
fake driver)."""

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_runs import describe
from test_fake_fidelity import native_dir, over_real  # noqa: F401 (native_dir: a fixture)

pytestmark = pytest.mark.gpu

SLO = struct.Struct("<IIII")  # a row's slo x 1000, quiet p99 us, recent p99 us, probe end ms


def slot_slo(board):
    """The slo fields of the first row of the board's first slot of this user, or None."""
    mine = board / f"u{os.geteuid()}"
    slots = sorted(mine.glob("lc.*")) if mine.exists() else []
    return SLO.unpack_from(slots[0].read_bytes(), 64 + 48) if slots else None


def test_a_service_with_an_slo_puts_its_busy_periods_p99_on_its_slot(native_dir,  # noqa: F811
                                                                      tmp_path):
    board = tmp_path / "board"
    policy = tmp_path / "slo.yaml"
    policy.write_text(f"version: 1\ndefault: allow\npriority:\n  board: {board}\n  classes:\n"
                      "    - {name: serving, class: latency-critical, slo: 1.25}\n")
    # GIVEN a service whose requests keep the GPU busy 2 ms (a launch, 2 ms, a device
    # synchronization, 1 ms idle) for 1.5 s, then a pause in which its slot is read
    commands = tmp_path / "commands"
    commands.write_text("cycle 2000 1000 1500\nsleep 3000\nexit\n")
    with open(commands) as stdin:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "clc-run"), "--policy", str(policy), "-o",
             str(tmp_path / "cap.clc"), "--force", "--no-report", "--",
             str(native_dir / "prog_priority")], stdin=stdin, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **over_real()})
        seen, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            seen = slot_slo(board) or seen
            if seen and seen[1] and seen[2]:
                break
            time.sleep(0.1)
        out, err = proc.communicate(timeout=60)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert seen is not None, describe(run)
    slo, quiet, recent, probe = seen
    # THEN its slot gives its slo, a probe it made, and the p99 of the busy periods measured
    # during the probe and after it: each at least the 2 ms the requests took
    assert slo == 1250 and probe > 0, describe(run)
    assert 2000 <= quiet < 100_000 and 2000 <= recent < 100_000, (seen, describe(run))
    assert run.returncode == 0, describe(run)

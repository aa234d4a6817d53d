# SPDX-License-Identifier: Apache-2.0
"""Priority classes over the fake driver: a best-effort process's launches wait while a
latency-critical process is busy on the same GPU, down to the floor, and the board they meet on
trusts only what the policy allows.

Each test drives two copies of tests/fixtures/native/prog_priority under clc-run, one per class (the
tenant decides the class), line by line: the time a command's "done" line comes back is when
its launches returned. The fake GPU runs work at once; busy and idle are what the
latency-critical process's launches and synchronizations say, as on a real GPU.
"""

import bisect
import os
import random
import re
import select
import signal
import struct
import subprocess
import time

import pytest

from harness import clc_command, env_for
from clc.capture.reader import read_captures
from clc.capture.reports import summary
from clc.cli.run import capture_files

POLICY = """\
version: 1
default: allow
priority:
  board: {board}
  idle_after_ms: {idle}
  classes:
    - name: serving
      class: latency-critical
      match: {{tenant: serving}}
    - name: batch
      class: best-effort
      match: {{tenant: batch}}
      floor: {floor}
      run_ahead: 16
    - name: batch-shared
      class: best-effort
      match: {{tenant: shared}}
      held_share: 0.25
"""

# The slot a latency-critical process writes (shim/priority/priority.c): a 64-byte header, then one
# 64-byte row per GPU.
HEADER = struct.Struct("<QIIiIQ32s")
# uuid, used, waiting, launched, settled, busy_since_ns, then the slo's: slo x 1000, quiet and
# recent p99 (us), the end of a probe (CLOCK_MONOTONIC ms, low 32 bits)
ROW = struct.Struct("<16sIIQQQIIII")
ROW_SLO = 48  # where the slo's fields begin in a row
MAGIC = 0x3144524f42434c43
FAKE_UUID = b"fake-gpu-0000000"


class Driven:
    """prog_priority under clc-run, fed one command at a time."""

    def __init__(self, native, tmp_path, policy, tenant, name, env=None):
        self.output = tmp_path / f"{name}.clc"
        cmd = clc_command() + ["--policy", str(policy), "--tenant", tenant, "-v", "-o",
                               str(self.output), "--force", "--no-report", "--",
                               str(native["prog_priority"])]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env_for(native, env),
                                     cwd=tmp_path)
        self.lines = []
        self.pending = b""  # read from stdout, not yet a whole line
        assert self.wait_for("ready", 30) is not None, self.finish()

    def send(self, command):
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def wait_for(self, prefix, timeout):
        """The next stdout line starting with prefix, or None after timeout seconds."""
        end = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.pending:
                raw, self.pending = self.pending.split(b"\n", 1)
                line = raw.decode(errors="replace")
                self.lines.append(line)
                if line.startswith(prefix):
                    return line
            left = end - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.pending += chunk

    def do(self, command, timeout=10):
        """Runs command; the seconds it took, as the caller saw it."""
        start = time.monotonic()
        self.send(command)
        line = self.wait_for("done", timeout)
        assert line is not None, f"no answer to {command!r}: {self.finish()}"
        assert line.rstrip().endswith("rc=0"), line
        return time.monotonic() - start

    def where(self):
        """(first SM, SMs) the last launch ran on, as the fake saw it."""
        line = next(ln for ln in reversed(self.lines) if ln.startswith("green "))
        fields = dict(f.split("=") for f in line.split()[2:])
        return int(fields["first"]), int(fields["sms"])

    def finish(self):
        """Ends the program; its stderr."""
        if self.proc.poll() is None:
            try:
                self.send("exit")
            except (BrokenPipeError, OSError):
                pass
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")

    def holds(self):
        caps = read_captures(capture_files(self.output))
        return [h for cap in caps for h in cap.holds]


@pytest.fixture
def board(tmp_path):
    return tmp_path / "board"


@pytest.fixture
def policy(tmp_path, board):
    def make(floor=0.05, idle=10000):
        path = tmp_path / f"policy-{floor}-{idle}.yaml"
        path.write_text(POLICY.format(board=board, floor=floor, idle=idle))
        return path
    return make


@pytest.fixture
def pair(native, tmp_path, policy):
    """start(name, tenant, floor=, idle=, env=) -> a Driven; every one is finished at the end."""
    started = []

    def start(tenant, name=None, env=None, **kw):
        d = Driven(native, tmp_path, policy(**kw), tenant, name or tenant, env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.finish()


def user_dir(board, uid=None, make=False):
    """board/u<uid>: where a user's latency-critical processes keep their slots."""
    d = board / f"u{os.geteuid() if uid is None else uid}"
    if make:
        board.mkdir(mode=0o1777, exist_ok=True)
        os.chmod(board, 0o1777)
        d.mkdir(mode=0o755, exist_ok=True)
        if uid is not None:
            os.chown(d, uid, uid)
    return d


def slots(board):
    d = user_dir(board)
    return sorted(p.name for p in d.iterdir() if p.name.startswith("lc.")) if d.exists() else []


def write_slot(path, pid, start_time, launched=5, settled=0, uuid=FAKE_UUID, mode=0o644,
               slo=(0, 0, 0, 0)):
    row = ROW.pack(uuid, 1, 0, launched, settled, 0, *slo)
    body = HEADER.pack(MAGIC, 1, 64 + 16 * 64, pid, os.geteuid(), start_time, b"forged") + row
    path.write_bytes(body + bytes(64 * 15))
    os.chmod(path, mode)


def start_time_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


# ---- holding and letting go -------------------------------------------------------------------

def test_best_effort_waits_until_the_latency_critical_process_synchronizes(pair, board):
    # GIVEN a latency-critical process with work in flight on the GPU (launched, not synced)
    lc = pair("serving")
    lc.do("launch 3")
    assert len(slots(board)) == 1
    be = pair("batch")
    # WHEN the best-effort process launches
    start = time.monotonic()
    be.send("launch 1")
    # THEN its launch does not return while the other is busy...
    assert be.wait_for("done", 0.04) is None
    # ...and returns once the latency-critical process's synchronization returned
    lc.do("sync ctx")
    assert be.wait_for("done", 5) is not None
    waited = time.monotonic() - start
    assert 0.04 <= waited < 0.095 + 0.5
    # AND launches made while it is idle are not held
    assert be.do("launch 200") < 0.5
    be.finish()
    (hold,) = be.holds()
    assert not hold.by_floor and not hold.no_board
    assert 0.03e9 < hold.held_ns < 0.095e9
    assert hold.lag_ns > 0
    assert "1 hold," in summary(read_captures(capture_files(be.output)))


def test_the_floor_lets_a_held_process_run(pair):
    # GIVEN a latency-critical process that stays busy, and a floor of one half
    lc = pair("serving", floor=0.5)
    lc.do("launch 1")
    be = pair("batch", floor=0.5)
    # WHEN the best-effort process launches for a while
    for _ in range(5):
        be.do("launch 1")
        be.do("sleep 20")
    be.finish()
    holds = be.holds()
    # THEN its holds are let go by the floor: half of each 100 ms window at most
    assert holds and all(h.by_floor for h in holds)
    assert all(h.held_ns <= 0.05e9 + 0.02e9 for h in holds)
    assert sum(h.held_ns for h in holds) >= 0.04e9


# The floor holds over any pattern of busy and idle, measured by the best-effort process itself:
# a latency-critical process (or a slot written directly) that goes idle for a moment before
# the floor would let a hold go does not keep best-effort work held for longer.
FLOOR = 0.1
TOLERANCE = 0.03  # a held thread's late wake-ups on a loaded machine


def worked(be):
    """(ms its launches were blocked, ms in all), as be's answer to a `work` command says."""
    line = be.wait_for("blocked", 30)
    assert line is not None, be.finish()
    blocked, total = re.match(r"blocked ([\d.]+) of ([\d.]+) ms", line).groups()
    assert be.wait_for("done", 10) is not None
    return float(blocked), float(total)


def most_held(holds, window_ns):
    """The largest share of any window of window_ns that the holds cover (the holds of one
    thread: they do not overlap)."""
    spans = sorted((h.t_ns, h.t_ns + h.held_ns) for h in holds)
    starts = [s for s, _ in spans]
    ends = [e for _, e in spans]
    covered = [0]
    for s, e in spans:
        covered.append(covered[-1] + e - s)

    def held_in(a):
        first = bisect.bisect_left(ends, a)  # the first span that ends after a
        last = bisect.bisect_left(starts, a + window_ns)  # spans from `first` to here start in it
        if last <= first:
            return 0
        inside = covered[last] - covered[first]
        return inside - max(0, a - starts[first]) - max(0, ends[last - 1] - (a + window_ns))

    # the most is covered by a window that starts where a hold starts or ends where one ends
    return max([held_in(s) for s in starts] + [held_in(e - window_ns) for e in ends]) / window_ns


def assert_held_to_the_floor(be, blocked, total):
    # as the program measured it: its launches were blocked at most 1 - floor of the time, and
    # were blocked most of it (the other process did hold it)
    assert 0.7 <= blocked / total <= 1 - FLOOR + TOLERANCE, (blocked, total)
    be.finish()
    holds = be.holds()
    # as its capture says: in all, and in every second of it
    assert sum(h.held_ns for h in holds) <= (1 - FLOOR + TOLERANCE) * total * 1e6
    assert most_held(holds, 1e9) <= 1 - FLOOR + TOLERANCE
    assert any(h.by_floor for h in holds)


def test_the_floor_holds_against_a_moment_of_idle_before_it_would_let_go(pair):
    # GIVEN a latency-critical process busy 85 ms, idle 0.3 ms, over and over: each busy period
    # ends before a hold reaches (1 - floor) x 100 ms
    lc = pair("serving", floor=FLOOR)
    be = pair("batch", floor=FLOOR)
    lc.send("cycle 85000 300 3600")
    time.sleep(0.1)  # its slot is made at its first launch
    # WHEN a best-effort process launches every 200 us for 3 s beside it
    be.send("work 200 3000")
    blocked, total = worked(be)
    # THEN it is held no more than the floor allows
    assert_held_to_the_floor(be, blocked, total)
    assert lc.wait_for("done", 10) is not None


def test_the_floor_holds_against_a_slot_written_directly_with_random_short_idles(pair, board):
    # GIVEN a slot of this user's, written directly as its latency-critical process may (it
    # shares the board): busy for 1 to 40 ms, idle for 20 to 500 us, at random
    mine = user_dir(board, make=True)
    me = os.getpid()
    slot = mine / f"lc.{me}.1"
    write_slot(slot, me, start_time_of(me), launched=1, settled=0)
    fd = os.open(slot, os.O_WRONLY)
    be = pair("batch", floor=FLOOR)
    # WHEN a best-effort process launches every 200 us for 3 s meanwhile
    be.send("work 200 3000")
    rng = random.Random(32)
    launched, end = 1, time.monotonic() + 3.2
    try:
        while time.monotonic() < end:
            time.sleep(rng.uniform(0.001, 0.040))
            os.pwrite(fd, struct.pack("<Q", launched), 64 + 32)  # settled: idle
            time.sleep(rng.uniform(20e-6, 500e-6))
            launched += 1
            os.pwrite(fd, struct.pack("<Q", launched), 64 + 24)  # launched: busy again
    finally:
        os.close(fd)
    blocked, total = worked(be)
    # THEN it is held no more than the floor allows
    assert_held_to_the_floor(be, blocked, total)


def test_a_quiet_latency_critical_process_counts_as_idle_after_idle_after_ms(pair):
    lc = pair("serving", idle=60)
    lc.do("launch 1")  # never synchronized: it may wait in a way clc does not see
    time.sleep(0.2)
    be = pair("batch", idle=60)
    # a process the best-effort one sees for the first time is busy for idle_after_ms
    assert 0.05 < be.do("launch 1") < 0.095 + 0.5
    assert be.do("launch 50") < 0.05
    be.finish()
    (hold,) = be.holds()
    assert not hold.by_floor


def test_a_synchronization_in_progress_keeps_the_gpu_busy_past_idle_after(pair, native):
    # The fake's synchronizations return at once; a stream query on another stream of a
    # latency-critical process does not settle the default stream's work.
    lc = pair("serving", idle=30)
    lc.do("launch 1")
    lc.do("launch 1 s")
    lc.do("sync s")  # its own stream: the default stream's launch is still in flight
    be = pair("batch", idle=10000)
    be.send("launch 1")
    assert be.wait_for("done", 0.06) is None
    lc.do("launch 1 s")
    lc.do("sync stream")  # the default stream's work is done, its own stream's is not
    assert be.wait_for("done", 0.02) is None
    lc.do("sync ctx")
    assert be.wait_for("done", 5) is not None


def test_a_stream_synchronization_settles_work_on_that_stream_alone(pair):
    lc = pair("serving")
    lc.do("launch 4 s")
    lc.do("sync s")
    be = pair("batch")
    assert be.do("launch 20") < 0.04
    lc.do("ptsz 2")
    lc.do("query s")  # not the stream the launches went to
    be.send("launch 1")
    assert be.wait_for("done", 0.04) is None
    lc.do("sync ctx")
    assert be.wait_for("done", 5) is not None


def test_another_gpu_is_not_held(pair):
    lc = pair("serving", env={"FAKE_CUDA_UUID": "gpu-a"})
    lc.do("launch 1")
    be = pair("batch", env={"FAKE_CUDA_UUID": "gpu-b"})
    assert be.do("launch 100") < 0.04
    be.finish()
    assert be.holds() == []


def test_processes_without_a_class_are_never_held(pair):
    lc = pair("serving")
    lc.do("launch 1")
    other = pair("nobody-named")
    assert other.do("launch 100") < 0.04
    assert "no priority class holds" in other.finish()


def test_held_share_confines_instead_of_waiting(pair):
    # GIVEN a best-effort class with held_share: 0.25
    lc = pair("serving")
    be = pair("shared")
    be.do("launch 1")
    assert be.where() == (0, 132)  # no latency-critical work: the whole device
    # WHEN the latency-critical process is busy
    lc.do("launch 1")
    time.sleep(0.06)  # its slot, made at its first launch, is seen at the next scan (50 ms)
    # THEN best-effort launches do not wait: they run on the device's last quarter of SMs
    assert be.do("launch 50") < 0.04
    first, sms = be.where()
    # (the fake splits its 132 SMs in groups of 8: the last whole groups are 96..127)
    assert 24 <= sms <= 40 and first >= 132 // 2 and first + sms <= 132
    # AND once it is idle, on the whole device again
    lc.do("sync ctx")
    be.do("launch 1")
    assert be.where() == (0, 132)
    be.finish()
    (period,) = be.holds()
    assert period.shared and not period.by_floor and period.held_ns > 0
    text = summary(read_captures(capture_files(be.output)))
    assert "on its held share in 1 busy period" in text
    assert "Confined by a green context" in text


# ---- the board: slots of live processes only, and only trusted ones -----------------------

def test_a_slot_goes_at_exit_and_a_killed_process_does_not_hold_anyone(pair, board):
    lc = pair("serving")
    assert slots(board) == []  # made at the first launch, not at start
    lc.do("launch 1")
    assert lc.do("sync ctx") < 1
    lc.finish()
    assert slots(board) == []
    crashed = pair("serving", name="crashed")
    crashed.do("launch 1")
    (name,) = slots(board)
    os.kill(int(name.split(".")[1]), signal.SIGKILL)
    crashed.finish()
    assert slots(board) == [name]  # left behind by the crash...
    be = pair("batch")
    assert be.do("launch 50") < 0.04  # ...and not believed
    later = pair("serving", name="later")
    later.do("launch 1")
    assert name not in slots(board)  # ...and removed by the user's next latency-critical one


def test_forged_slots_are_refused(pair, board, tmp_path):
    mine = user_dir(board, make=True)
    me = os.getpid()
    # writable by others: anyone could have written it
    write_slot(mine / f"lc.{me}.1", me, start_time_of(me), mode=0o666)
    # a link, to a slot that would be believed
    target = tmp_path / "target"
    write_slot(target, me, start_time_of(me))
    os.symlink(target, mine / f"lc.{me}.2")
    # in the board itself, not a user's directory: never read
    write_slot(board / f"lc.{me}.3", me, start_time_of(me))
    be = pair("batch")
    assert be.do("launch 20") < 0.04
    err = be.finish()
    assert "is not trusted (writable by others)" in err


def test_a_slot_of_this_user_is_believed(pair, board):
    # The board trusts by owner: a process of the same user can hold this user's own
    # best-effort work (docs/security.md says so), no one else's.
    mine = user_dir(board, make=True)
    me = os.getpid()
    write_slot(mine / f"lc.{me}.1", me, start_time_of(me))
    be = pair("batch")
    be.send("launch 1")
    assert be.wait_for("done", 0.04) is None
    os.unlink(mine / f"lc.{me}.1")
    assert be.wait_for("done", 5) is not None


def test_a_slot_cut_short_or_opened_to_others_while_read_is_believed_no_more(pair, board):
    # A slot's owner may shrink it or let others write it after a best-effort process took
    # it: the reader neither dies (it reads, it does not map) nor believes it any longer.
    mine = user_dir(board, make=True)
    me = os.getpid()
    for change in (lambda p: os.truncate(p, 0), lambda p: os.chmod(p, 0o666)):
        slot = mine / f"lc.{me}.1"
        write_slot(slot, me, start_time_of(me))
        be = pair("batch", name=f"be-{slot.stat().st_ino}")
        be.send("launch 1")
        assert be.wait_for("done", 0.04) is None  # held by it
        change(slot)
        assert be.wait_for("done", 5) is not None
        assert be.do("launch 20") < 0.04
        be.finish()
        assert be.proc.returncode == 0
        slot.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")
def test_another_users_slot_is_refused_unless_the_policy_names_that_user(pair, board, tmp_path,
                                                                         native):
    theirs = user_dir(board, 54321, make=True)
    me = os.getpid()
    write_slot(theirs / f"lc.{me}.1", me, start_time_of(me))
    os.chown(theirs / f"lc.{me}.1", 54321, 54321)
    be = pair("batch")
    assert be.do("launch 20") < 0.04  # that user's directory is not read
    be.finish()
    # the same slot, when a latency-critical class names its user
    named = tmp_path / "named.yaml"
    named.write_text(POLICY.format(board=board, floor=0.05, idle=10000).replace(
        "match: {tenant: serving}", "match: {tenant: serving, user: '54321'}"))
    be2 = Driven(native, tmp_path, named, "batch", "be2")
    try:
        be2.send("launch 1")
        assert be2.wait_for("done", 0.04) is None
        os.unlink(theirs / f"lc.{me}.1")
        assert be2.wait_for("done", 5) is not None
    finally:
        be2.finish()
    # a directory of that name another user controls is not read
    os.chown(theirs, 12345, 12345)
    write_slot(theirs / f"lc.{me}.2", me, start_time_of(me))
    os.chown(theirs / f"lc.{me}.2", 54321, 54321)
    be3 = Driven(native, tmp_path, named, "batch", "be3")
    try:
        assert be3.do("launch 20") < 0.04
    finally:
        assert "a directory another user controls" in be3.finish()


@pytest.mark.skipif(os.geteuid() != 0, reason="making files of another user needs root")
def test_a_board_another_user_controls_holds_best_effort_work_to_its_floor(pair, board):
    board.mkdir(mode=0o1777)
    os.chown(board, 54321, 54321)
    be = pair("batch", floor=0.5)
    assert be.do("launch 1") > 0.03
    err = be.finish()
    assert "the board" in err and "cannot be used" in err
    (hold, *_) = be.holds()
    assert hold.no_board and hold.by_floor


def test_a_shared_board_without_the_sticky_bit_is_refused(pair, board):
    board.mkdir()
    os.chmod(board, 0o777)
    lc = pair("serving")
    lc.do("launch 1")
    err = lc.finish()
    assert ("clc-run: warning: the priority board " + str(board) + " cannot be used (others "
            "may write it, and it is not sticky)") in err
    assert "clc: priority: the board" in err and "cannot be used" in err
    assert slots(board) == []


def test_a_flooded_directory_holds_to_the_floor_and_stays_quick(pair, board):
    # A user the policy trusts that fills its directory with entries holds best-effort work
    # down to the floor (as a latency-critical process busy on purpose would), said once;
    # each scan reads a bounded number of entries, so launches stay quick.
    mine = user_dir(board, make=True)
    for i in range(3000):
        (mine / f"junk{i}").touch()
    be = pair("batch", floor=0.5)
    start = time.monotonic()
    for _ in range(20):
        be.do("launch 50")
    assert time.monotonic() - start < 5
    err = be.finish()
    assert "more board entries than one scan reads" in err
    assert all(h.no_board for h in be.holds())


# ---- how far a best-effort process runs ahead ----------------------------------------------

def test_best_effort_work_is_kept_from_running_ahead_while_latency_critical_work_runs(pair):
    # Lazy events: recorded work completes 2 ms after its record, like a GPU that is behind.
    lazy = {"FAKE_CUDA_LAZY_EVENTS": "1", "FAKE_CUDA_EVENT_US": "2000"}
    alone = pair("batch", name="alone", env=lazy)
    alone.do("launch 100")
    assert "waits to keep the run-ahead bound" not in alone.finish()
    lc = pair("serving")
    lc.do("launch 1")
    lc.do("sync ctx")  # idle, but running on the machine
    be = pair("batch", env=lazy)
    # run_ahead 16: an event every 4 launches, 4 of them: from the 5th event on, each one
    # waits for the event recorded 16 launches before when it has not finished; launched at
    # once, 100 launches wait about once per 16 (each wait lets the 3 events after it finish).
    # However the process is scheduled, the 100th launch comes after the event of the 84th,
    # which came after the 68th's, ... the 4th's had finished: 6 x 2 ms at least.
    start = time.monotonic()
    be.do("launch 100")
    took = time.monotonic() - start
    waits = int(re.search(r"(\d+) waits to keep the run-ahead bound", be.finish())[1])
    assert 1 <= waits <= 21 and took >= 0.010, (waits, took)


def test_a_run_ahead_wait_gives_up_on_work_that_does_not_finish(pair):
    # Work that never finishes by itself (a stream waiting on the host, say): one wait of
    # 200 ms, said once, and no more waits on that stream until that work is done.
    lc = pair("serving")
    lc.do("launch 1")
    lc.do("sync ctx")
    time.sleep(0.06)
    be = pair("batch", env={"FAKE_CUDA_LAZY_EVENTS": "1"})
    start = time.monotonic()
    be.do("launch 100")
    assert 0.2 <= time.monotonic() - start < 2
    err = be.finish()
    assert "did not finish within 200 ms" in err
    assert "1 waits to keep the run-ahead bound" in err


def test_latency_critical_launches_are_counted_on_the_board(pair, board):
    lc = pair("serving")
    lc.do("launch 7")
    (name,) = slots(board)
    data = (user_dir(board) / name).read_bytes()
    magic, version, size, pid, uid, start, cls = HEADER.unpack_from(data)
    assert (magic, version, size, uid) == (MAGIC, 1, len(data), os.geteuid())
    assert cls.rstrip(b"\0") == b"serving"
    uuid, used, waiting, launched, settled, busy_since, *slo = ROW.unpack_from(data, 64)
    assert (uuid, used, waiting, launched, settled) == (FAKE_UUID, 1, 0, 7, 0)
    assert slo == [0, 0, 0, 0]  # its class has no slo
    assert busy_since > 0
    lc.do("sync ctx")
    data = (user_dir(board) / name).read_bytes()
    assert ROW.unpack_from(data, 64)[3:5] == (7, 7)

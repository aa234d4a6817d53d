# SPDX-License-Identifier: Apache-2.0
"""clc-run's status listener (clc.runtime.status): what the program's processes said reaches
the run's status, even a message its receiving thread had taken and not yet recorded when the
program ended."""

import subprocess
import sys
import threading
import time

from clc.runtime import status as status_module
from clc.runtime.status import StatusListener

SEND = ("import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
        "[s.sendto(m.encode(), sys.argv[1]) for m in sys.argv[2:]]")


def say(listener, *messages):
    """Sends the messages from a process of its own, as a program's would."""
    subprocess.run([sys.executable, "-c", SEND, listener.path, *messages], check=True)


class SlowLock:
    """A lock whose taking lasts in the receiving thread: it records a message late."""

    def __init__(self, delay):
        self.delay, self.lock = delay, threading.Lock()

    def __enter__(self):
        if threading.current_thread().name == "clc-status":
            time.sleep(self.delay)
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


def test_a_message_being_recorded_when_the_program_ends_is_kept():
    listener = StatusListener()
    try:
        # GIVEN a receiving thread that records each message 0.5 s after taking it
        listener._lock = SlowLock(0.5)
        listener.start()
        # WHEN a process says it started, and the program ends while the thread holds that
        say(listener, "start prog")
        time.sleep(0.1)
        status = listener.finish()
        # THEN the run's status has it
        assert list(status.started.values()) == ["prog"]
    finally:
        listener.close()


def test_only_clc_run_can_stop_its_listener():
    listener = StatusListener()
    try:
        listener.start()
        # WHEN a program says "stop", then starts
        say(listener, "stop")
        say(listener, "start prog")
        time.sleep(0.1)
        # THEN the listener went on receiving
        assert list(listener.finish().started.values()) == ["prog"]
    finally:
        listener.close()


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


FLOOD = ("import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); "
         "pad = 'x' * 3000; "
         "[s.sendto(f'capture /flood/{i}/{pad}'.encode(), sys.argv[1]) "
         "for i in range(int(sys.argv[2]))]")


def test_a_process_flooding_the_socket_is_bounded_and_said():
    listener = StatusListener()
    try:
        listener.start()
        before = rss_bytes()
        # WHEN one process sends 100,000 distinct 3 kB messages (300 MB), then another starts
        subprocess.run([sys.executable, "-c", FLOOD, listener.path, "100000"], check=True)
        say(listener, "start prog")
        time.sleep(0.1)
        status = listener.finish()
        grown = rss_bytes() - before
    finally:
        listener.close()
    # THEN clc-run kept at most what one process may keep, and said how much it dropped
    assert len(status.captures) == status_module.MAX_PER_SENDER
    assert status.dropped == 100000 - status_module.MAX_PER_SENDER
    assert status.dropped_senders == 1
    assert grown < 64 << 20, f"the listener grew by {grown >> 20} MiB"
    # AND the other process's message was kept
    assert list(status.started.values()) == ["prog"]


def test_repeated_messages_cost_nothing_and_all_senders_share_a_bound(monkeypatch):
    account = status_module._Account()
    # GIVEN a process repeating its start and its exec
    for _ in range(100000):
        account.add(1, "start", "prog")
        account.add(1, "exec", "/bin/true")
    assert account.cost < 1024 and account.dropped == 0
    # WHEN many processes each add what they may, past what all may keep together
    monkeypatch.setattr(status_module, "MAX_BYTES", 1 << 20)
    for pid in range(2, 2000):
        for n in range(4):
            account.add(pid, "capture", f"/cap/{pid}/{n}/" + "y" * 500)
    # THEN what is kept stays within the bound, and every message past it is counted
    status = account.status()
    assert account.cost <= 1 << 20
    assert len(status.captures) + status.dropped == 1998 * 4
    assert status.dropped > 0 and status.dropped_senders > 0
    # AND what one says last of itself is what it said last
    assert status.started == {1: "prog"} and status.unseen[0].path == "/bin/true"

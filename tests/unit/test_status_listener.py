# SPDX-License-Identifier: Apache-2.0
"""clc-run's status listener (clc.runtime.status): what the program's processes said reaches
the run's status, even a message its receiving thread had taken and not yet recorded when the
program ended."""

import subprocess
import sys
import threading
import time

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

# SPDX-License-Identifier: Apache-2.0
"""What the program's processes tell clc-run about themselves while it runs.

clc-run listens on a datagram socket in a private directory (mode 0700: this user's alone); its
path reaches the shim as the sealed CLC_STATUS setting (shim/settings.c, `clc_announce`). Each
process in which the shim starts says so, and says what clc-run must account for afterwards:
the programs it executes or spawns (each should start a shim of its own), and the capture it
opened or could not open. The kernel names the sender of each message (SCM_CREDENTIALS), so a
process speaks only for itself.

Messages are one line each: "start NAME", "exec PATH", "exec-failed ERRNO",
"spawn PID PATH", "capture PATH", "capture-failed PATH", and "no-settings NAME" from a process
of the run whose shim found none of its settings (it reaches the socket through the
environment's CLC_FALLBACK).
"""

import dataclasses
import os
import shutil
import socket
import struct
import tempfile
import threading

from clc import abi

__all__ = ["StatusListener", "RunStatus", "Unseen"]

_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAX_MESSAGE = 8192
# What clc-run sends its own listener when the program has ended: the receiving thread stops
# once it has recorded every message queued before it. Only clc-run's own pid can say it.
_STOP = b"stop"


@dataclasses.dataclass(frozen=True)
class Unseen:
    """A process that ran without clc's shim: `pid` executed `path` (or spawned it as `pid`),
    and no shim started in what it became."""

    pid: int
    path: str
    how: str  # "exec", "spawn", or "driver" (found loading the driver: driver_watch.py)


@dataclasses.dataclass
class RunStatus:
    """What the processes said, by the kernel's account of who said it."""

    started: dict = dataclasses.field(default_factory=dict)  # pid -> process name
    captures: dict = dataclasses.field(default_factory=dict)  # path -> pid that opened it
    failed_captures: dict = dataclasses.field(default_factory=dict)  # path -> pid
    unseen: list = dataclasses.field(default_factory=list)
    # pid -> process name: shims that started without their settings (launches on on_error)
    unsettled: dict = dataclasses.field(default_factory=dict)


class StatusListener:
    """Listens for the processes' messages: start() before the program runs, then finish()
    once it has ended, for the RunStatus; close() always."""

    def __init__(self):
        parent = tempfile.gettempdir()
        # A socket's path has at most 107 bytes: a long $TMPDIR gives way to /tmp.
        self._dir = tempfile.mkdtemp(prefix="clc-run-", dir=parent if len(parent) < 64 else "/tmp")
        self.path = os.path.join(self._dir, "status")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._sock.bind(self.path)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        except OSError:
            self._sock.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._events = []  # (pid, word, text) in the order they came
        self._lock = threading.Lock()
        self._thread = None

    def settings(self):
        return {"CLC_STATUS": self.path}

    def start(self):
        """Receive in a daemon thread (made with the caller's signal mask: clc-run's main thread
        waits for its signals with sigwaitinfo, and no other thread may take them)."""
        self._thread = threading.Thread(target=self._serve, name="clc-status", daemon=True)
        self._thread.start()

    def _serve(self):
        while True:
            try:
                if not self._receive(block=True):
                    return
            except OSError:
                return

    def _receive(self, block):
        """One message into the events; False when the socket is closed or (not blocking) when
        nothing is queued."""
        flags = 0 if block else socket.MSG_DONTWAIT
        try:
            data, ancillary, _, _ = self._sock.recvmsg(
                _MAX_MESSAGE, socket.CMSG_SPACE(_CREDENTIALS.size), flags)
        except BlockingIOError:
            return False
        if not data and not ancillary:
            return False
        pid = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                    and len(payload) >= _CREDENTIALS.size:
                pid = _CREDENTIALS.unpack_from(payload)[0]
        if pid == os.getpid() and data == _STOP:
            return False
        if pid:
            word, _, text = data.decode("utf-8", "replace").partition(" ")
            with self._lock:
                self._events.append((pid, word, text))
        return True

    def finish(self):
        """The RunStatus of everything said so far, after the messages still queued. The
        receiving thread is stopped first, behind every message queued before the stop: a
        message it had taken but not yet recorded would otherwise be missed."""
        if self._thread is not None and self._thread.is_alive():
            self._stop_receiving()
        try:
            while self._receive(block=False):
                pass
        except OSError:
            pass
        with self._lock:
            events = list(self._events)
        return _status_of(events)

    def _stop_receiving(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(2)  # the queue may be full for a moment: the thread is emptying it
            try:
                s.sendto(_STOP, self.path)
            except OSError:
                return
        self._thread.join(timeout=10)

    def close(self):
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


_START, _EXEC, _EXEC_FAILED, _SPAWN, _CAPTURE, _CAPTURE_FAILED, _NO_SETTINGS = (
    word.decode() for word in (
        abi.STATUS_START, abi.STATUS_EXEC, abi.STATUS_EXEC_FAILED, abi.STATUS_SPAWN,
        abi.STATUS_CAPTURE, abi.STATUS_CAPTURE_FAILED, abi.STATUS_NO_SETTINGS))


def _status_of(events):
    status = RunStatus()
    pending = {}  # pid -> the path it executed, until its new image starts or the exec fails
    spawned = {}  # pid of a spawned child -> its path
    for pid, word, text in events:
        if word == _START:
            status.started[pid] = text
            pending.pop(pid, None)
        elif word == _NO_SETTINGS:
            status.unsettled[pid] = text
            pending.pop(pid, None)
        elif word == _EXEC:
            pending[pid] = text
        elif word == _EXEC_FAILED:
            pending.pop(pid, None)
        elif word == _SPAWN:
            child, _, path = text.partition(" ")
            if child.isdigit():
                spawned[int(child)] = path
        elif word == _CAPTURE:
            status.captures[text] = pid
        elif word == _CAPTURE_FAILED:
            status.failed_captures[text] = pid
    status.unseen = [Unseen(pid, path, _EXEC) for pid, path in sorted(pending.items())]
    status.unseen += [Unseen(pid, path, _SPAWN) for pid, path in sorted(spawned.items())
                      if pid not in status.started and pid not in status.unsettled]
    return status

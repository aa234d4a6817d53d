# SPDX-License-Identifier: Apache-2.0
"""What the program's processes tell clc-run about themselves while it runs.

clc-run listens on a datagram socket in a private directory (mode 0700: this user's alone); its
path reaches the shim as the sealed CLC_STATUS setting (shim/core/settings.c, `clc_announce`). Each
process in which the shim starts says so, and says what clc-run must account for afterwards:
the programs it executes or spawns (each should start a shim of its own), and the capture it
opened or could not open. The kernel names the sender of each message (SCM_CREDENTIALS), so a
process speaks only for itself.

Messages are one line each: "start NAME", "exec PATH", "exec-failed ERRNO",
"spawn PID PATH", "capture PATH", "capture-failed PATH", and "no-settings NAME" from a process
of the run whose shim found none of its settings (it reaches the socket through the
environment's CLC_FALLBACK). What clc-run keeps of them is bounded per process and in all;
what it could not keep is counted, and makes the account incomplete (clc-run says so, and
--strict fails).
"""

import dataclasses
import os
import socket
import struct
import threading

from clc import abi
from clc.runtime.private_dir import PrivateDir

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
    """What the processes said, by the kernel's account of who said it. `dropped` messages
    from `dropped_senders` processes were not kept (each process, and all of them together,
    may keep only so much: _Account), so the account is incomplete when it is not 0."""

    started: dict = dataclasses.field(default_factory=dict)  # pid -> process name
    captures: dict = dataclasses.field(default_factory=dict)  # path -> pid that opened it
    failed_captures: dict = dataclasses.field(default_factory=dict)  # path -> pid
    unseen: list = dataclasses.field(default_factory=list)
    # pid -> process name: shims that started without their settings (launches on on_error)
    unsettled: dict = dataclasses.field(default_factory=dict)
    dropped: int = 0
    dropped_senders: int = 0


_START, _EXEC, _EXEC_FAILED, _SPAWN, _CAPTURE, _CAPTURE_FAILED, _NO_SETTINGS = (
    word.decode() for word in (
        abi.STATUS_START, abi.STATUS_EXEC, abi.STATUS_EXEC_FAILED, abi.STATUS_SPAWN,
        abi.STATUS_CAPTURE, abi.STATUS_CAPTURE_FAILED, abi.STATUS_NO_SETTINGS))

# What clc-run keeps of what the processes say. A message is folded into the account as it
# arrives (a name or path replaces the one before it), so that repeating a message costs
# nothing; a message that would add an entry past a limit is counted and dropped, so that
# a process flooding the socket cannot take clc-run's memory nor crowd out the others.
MAX_TEXT = 4096  # characters of a name or path kept (PATH_MAX); longer ones are cut
MAX_PER_SENDER = 4096  # entries one process may add: its spawns and captures
MAX_BYTES = 64 << 20  # what all entries together may cost
_ENTRY_COST = 256  # what an entry costs beside its text (dict slots, the str object)


def _cost(key, value):
    return _ENTRY_COST + len(key if isinstance(key, str) else value)


class _Account:
    """The run's status, kept as the messages arrive, within the limits above."""

    def __init__(self):
        self.started = {}  # pid -> name
        self.unsettled = {}  # pid -> name, of a shim that started without its settings
        self.pending = {}  # pid -> the path it executed, until its new image starts or fails
        self.spawned = {}  # pid of a spawned child -> its path
        self.captures = {}  # path -> pid
        self.failed_captures = {}  # path -> pid
        self.cost = 0
        self.per_sender = {}  # pid -> entries it added
        self.dropped = 0
        self.dropped_by = set()

    def add(self, pid, word, text):
        text = text[:MAX_TEXT]
        if word == _START:
            self._remove(self.pending, pid, pid)
            self._put(self.started, pid, text, pid)
        elif word == _NO_SETTINGS:
            self._remove(self.pending, pid, pid)
            self._put(self.unsettled, pid, text, pid)
        elif word == _EXEC:
            self._put(self.pending, pid, text, pid)
        elif word == _EXEC_FAILED:
            self._remove(self.pending, pid, pid)
        elif word == _SPAWN:
            child, _, path = text.partition(" ")
            if child.isdigit():
                self._put(self.spawned, int(child), path, pid)
        elif word == _CAPTURE:
            self._put(self.captures, text, pid, pid)
        elif word == _CAPTURE_FAILED:
            self._put(self.failed_captures, text, pid, pid)

    def _put(self, table, key, value, sender):
        """table[key] = value, unless that is a new entry past a limit (then counted dropped).
        A replaced entry keeps its place: what it held is what the sender said last."""
        if key in table:
            self.cost += _cost(key, value) - _cost(key, table[key])
            table[key] = value
            return
        cost = _cost(key, value)
        added = self.per_sender.get(sender, 0)
        if added >= MAX_PER_SENDER or self.cost + cost > MAX_BYTES:
            self.dropped += 1
            if len(self.dropped_by) < MAX_PER_SENDER:
                self.dropped_by.add(sender)
            return
        table[key] = value
        self.cost += cost
        self.per_sender[sender] = added + 1

    def _remove(self, table, key, sender):
        if key in table:
            self.cost -= _cost(key, table.pop(key))
            self.per_sender[sender] -= 1

    def status(self):
        status = RunStatus(started=dict(self.started), unsettled=dict(self.unsettled),
                           captures=dict(self.captures),
                           failed_captures=dict(self.failed_captures), dropped=self.dropped,
                           dropped_senders=len(self.dropped_by))
        status.unseen = [Unseen(pid, path, _EXEC) for pid, path in sorted(self.pending.items())]
        status.unseen += [Unseen(pid, path, _SPAWN) for pid, path in sorted(self.spawned.items())
                          if pid not in self.started and pid not in self.unsettled]
        return status


class StatusListener:
    """Listens for the processes' messages: start() before the program runs, then finish()
    once it has ended, for the RunStatus; close() always."""

    def __init__(self):
        self._dir = PrivateDir("clc-run")
        self.path = self._dir.join("status")
        self._sock = self._dir.bind("status", socket.SOCK_DGRAM, lambda s: s.setsockopt(
            socket.SOL_SOCKET, socket.SO_PASSCRED, 1))
        self._account = _Account()
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
                self._account.add(pid, word, text)
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
            return self._account.status()

    def _stop_receiving(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.settimeout(2)  # the queue may be full for a moment: the thread is emptying it
            try:
                s.sendto(_STOP, self.path)
            except OSError:
                return
        self._thread.join(timeout=10)

    def close(self):
        self._dir.close()

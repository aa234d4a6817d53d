# SPDX-License-Identifier: Apache-2.0
"""clc-run's private directories (its status socket's, its decider's): made so that a run
killed with SIGKILL, which removes nothing, leaves nothing that lasts.

Each directory is mode 0700 and holds a lock file that the run keeps locked (flock) while it
lives; the kernel lets go of the lock when the process dies, however it dies. The first
directory a process makes in a temporary directory first removes this user's directories of
every kind there whose lock nobody holds: a run killed outright is cleaned up by the next. A
lock, unlike a process id, holds across PID namespaces that share the temporary directory, and
cannot be mistaken for a reused pid.
"""

import fcntl
import os
import re
import shutil
import socket
import stat
import tempfile
import time

__all__ = ["PrivateDir", "KINDS", "sweep"]

_LOCK = "lock"
# The kinds of clc-run's private directories: one sweep of a temporary directory takes the
# abandoned ones of every kind, once per process.
KINDS = ("clc-run", "clc-decider")
_swept = set()


class PrivateDir:
    """A fresh 0700 directory named PREFIX-XXXXXXXX in the temporary directory (or parent),
    locked while this object lives; close() removes it."""

    def __init__(self, prefix, parent=None):
        parent = parent or tempfile.gettempdir()
        # A socket's path has at most 107 bytes: a long $TMPDIR gives way to /tmp.
        self.parent = parent if len(parent) < 64 else "/tmp"
        if self.parent not in _swept:
            _swept.add(self.parent)
            sweep(self.parent, *KINDS)
        self.path = tempfile.mkdtemp(prefix=f"{prefix}-", dir=self.parent)
        self._sockets = []
        try:
            # locked before it takes its name: a sweep never finds the lock file unlocked
            # while this run lives
            new = os.path.join(self.path, _LOCK + ".new")
            self._lock = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(new, os.path.join(self.path, _LOCK))
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def join(self, name):
        return os.path.join(self.path, name)

    def bind(self, name, kind, ready):
        """A Unix socket of `kind` bound at NAME here and made ready by ready(sock) (listen,
        options), which close() shuts down and closes; where that fails, neither the socket
        nor this directory is left behind."""
        sock = socket.socket(socket.AF_UNIX, kind)
        try:
            sock.bind(self.join(name))
            ready(sock)
        except OSError:
            sock.close()
            self.close()
            raise
        self._sockets.append(sock)
        return sock

    def close(self):
        if self._lock is None:
            return
        for sock in self._sockets:
            # Shut down first: a thread blocked in accept or recv on it returns.
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock)
        self._lock = None


def sweep(parent, *prefixes):
    """Removes this user's PREFIX-* directories in parent, of each prefix, that no live run
    holds: a directory (not a link) owned by this user, mode 0700, whose lock file can be taken.
    Anything else under such a name is left alone."""
    name = re.compile("(?:" + "|".join(map(re.escape, prefixes)) + r")-[A-Za-z0-9_]{8}\Z")
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for entry in os.listdir(fd):
            if name.match(entry) and _abandoned(fd, entry):
                shutil.rmtree(entry, dir_fd=fd, ignore_errors=True)
    except OSError:
        pass
    finally:
        os.close(fd)


def _abandoned(parent_fd, entry):
    try:
        st = os.stat(entry, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return False
    try:
        d = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=parent_fd)
    except OSError:
        return False
    try:
        lock = os.open(_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                       dir_fd=d)
    except FileNotFoundError:
        # killed between making it and naming its lock: a live run is never without its
        # lock for more than a moment, so only an old one is taken for abandoned
        return time.time() - os.fstat(d).st_mtime > 60
    except OSError:
        return False
    finally:
        os.close(d)
    try:
        if not stat.S_ISREG(os.fstat(lock).st_mode):
            return False
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(lock)


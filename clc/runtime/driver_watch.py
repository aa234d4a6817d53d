# SPDX-License-Identifier: Apache-2.0
"""The processes of a run that load the CUDA driver without clc's shim.

A process that the program starts past every hook clc has, with LD_PRELOAD removed from its
environment (the execve system call made by the program's own instructions; system() or popen()
after the program unset LD_PRELOAD), runs without the shim and tells clc-run nothing. But each
process that loads the driver opens its library file: clc-run watches the driver's files
(inotify) and, shortly after each open (once the loader has mapped the file) and again a little
later, looks at the run's processes, its own descendants and any process of this user started
since clc-run whose environment carries the run's CLC_FALLBACK. One that maps the driver (its
library or its /dev/nvidia* device files) but not the shim runs the driver unseen.

It cannot see a process that has ended by the time clc-run looks (a few milliseconds after the
driver was loaded), one that left clc-run's tree and removed CLC_FALLBACK from its environment,
nor a driver loaded from a copy outside the places watched (below).
"""

import ctypes
import glob
import os
import select
import signal
import subprocess
import threading
import time

from clc import abi
from clc.runtime.status import Unseen

__all__ = ["DriverWatch", "driver_files"]

_IN_OPEN = 0x20
# When clc-run looks after the first open of a burst, in seconds: once the loader has mapped
# the file, and again for a loader that was slow to.
_LOOKS_AFTER = (0.005, 0.1)
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
# Where NVIDIA's installers and container runtimes put libcuda, besides the loader's cache and
# the program's LD_LIBRARY_PATH.
_DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
                "/usr/lib", "/lib64", "/lib", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib",
                "/usr/local/cuda/compat", "/usr/lib/wsl/lib")


def _loader_cache():
    """The libcuda files the loader's cache names (`ldconfig -p`), or none."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.access(ldconfig, os.X_OK):
            try:
                out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True,
                                     timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return []
            return [line.rpartition("=> ")[2].strip() for line in out.splitlines()
                    if line.strip().startswith("libcuda.so")]
    return []


def driver_files(env):
    """The driver's library files the program's processes may load (their real paths): libcuda
    in the program's LD_LIBRARY_PATH, in the loader's cache and in the usual places."""
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d] + list(_DRIVER_DIRS)
    paths = [p for d in dirs for p in glob.glob(os.path.join(glob.escape(d), "libcuda.so*"))]
    paths += _loader_cache()
    return sorted({os.path.realpath(p) for p in paths if os.path.isfile(p)})


def _read(path, limit=None):
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


def _stat_fields(pid):
    """(ppid, start time in clock ticks) of a process, from /proc/PID/stat."""
    text = _read(f"/proc/{pid}/stat")
    fields = text[text.rindex(b")") + 2:].split()
    return int(fields[1]), int(fields[19])


class DriverWatch:
    """Watches the driver's files from before the program runs: start() once the program is
    forked, finish(run) once it has ended (it adds what it found to run.unseen), close()
    always. It never raises: where it cannot watch, `problem` says why."""

    def __init__(self, env, fallback, shim):
        self.problem = None
        self.files = driver_files(env)
        self._marker = abi.FALLBACK_VAR + b"=" + os.fsencode(fallback) + b"\0"
        self._shim = os.path.realpath(shim)
        self._me = os.getpid()
        self._uid = os.geteuid()
        self._found = {}  # pid -> Unseen
        self._lock = threading.Lock()
        self._thread = None
        self._fd = self._stop_r = self._stop_w = -1
        if not self.files:
            return
        try:
            self._since = _stat_fields(self._me)[1]
            libc = ctypes.CDLL(None, use_errno=True)
            self._fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if self._fd < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            for path in self.files:
                if libc.inotify_add_watch(self._fd, os.fsencode(path), _IN_OPEN) < 0:
                    raise OSError(ctypes.get_errno(), f"{path}: {os.strerror(ctypes.get_errno())}")
            self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        except (OSError, AttributeError, ValueError) as e:
            self.problem = f"inotify: {e.strerror if isinstance(e, OSError) else e}"
            self.close()

    def start(self):
        """Looks in a thread of its own, which takes no signal (clc-run's main thread waits for
        its signals with sigwaitinfo)."""
        if self._fd < 0:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        try:
            self._thread = threading.Thread(target=self._serve, name="clc-driver-watch",
                                            daemon=True)
            self._thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _serve(self):
        looks = []  # when the looks due are (time.monotonic())
        try:
            while True:
                wait = max(0.0, looks[0] - time.monotonic()) if looks else None
                ready, _, _ = select.select([self._fd, self._stop_r], [], [], wait)
                if self._stop_r in ready:
                    return
                if self._fd in ready:
                    try:
                        while os.read(self._fd, 65536):
                            pass
                    except BlockingIOError:
                        pass
                    now = time.monotonic()
                    if not looks:
                        looks = [now + after for after in _LOOKS_AFTER]
                    elif len(looks) < 2 and looks[-1] < now + _LOOKS_AFTER[-1]:
                        # an open while looks are due gets a look of its own after them (opens
                        # that keep coming neither put the looks off nor pile them up: at most
                        # two are due at once)
                        looks.append(now + _LOOKS_AFTER[-1])
                elif looks and time.monotonic() >= looks[0]:
                    looks.pop(0)
                    self._look()
        except Exception as e:  # the watch stops; clc-run and the program go on
            self.problem = f"{type(e).__name__}: {e}"

    def finish(self, run):
        """Stops watching, looks once more (at processes that outlive the program), and adds
        the processes found to run.unseen, but those already there."""
        if self._thread is not None:
            os.write(self._stop_w, b"x")
            self._thread.join(timeout=10)
            self._thread = None
        if self._fd >= 0:
            try:
                self._look()
            except Exception as e:
                self.problem = f"{type(e).__name__}: {e}"
        known = {u.pid for u in run.unseen}
        with self._lock:
            run.unseen += [u for pid, u in sorted(self._found.items()) if pid not in known]

    def close(self):
        for fd in (self._fd, self._stop_r, self._stop_w):
            if fd >= 0:
                os.close(fd)
        self._fd = self._stop_r = self._stop_w = -1

    def _processes(self):
        """pid -> (ppid, start time) of this user's processes."""
        out = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{name}").st_uid == self._uid:
                    out[int(name)] = _stat_fields(name)
            except (OSError, ValueError, IndexError):
                pass
        return out

    def _of_the_run(self, procs):
        """The run's processes: clc-run's descendants, and those started since clc-run that
        carry its CLC_FALLBACK."""
        children = {}
        for pid, (ppid, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        run, todo = set(), list(children.get(self._me, ()))
        while todo:
            pid = todo.pop()
            if pid not in run:
                run.add(pid)
                todo += children.get(pid, ())
        for pid, (_, start) in procs.items():
            if pid in run or pid == self._me or start < self._since:
                continue
            try:
                if self._marker in _read(f"/proc/{pid}/environ", 1 << 20):
                    run.add(pid)
            except OSError:
                pass
        return run

    def _look(self):
        for pid in self._of_the_run(self._processes()):
            if pid in self._found:
                continue
            try:
                maps = _read(f"/proc/{pid}/maps").decode("utf-8", "replace")
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            mapped = {parts[5] for parts in (line.split(None, 5) for line in maps.splitlines())
                      if len(parts) == 6}
            driver = any(p in self.files or p.startswith("/dev/nvidia") for p in mapped)
            if driver and self._shim not in mapped:
                with self._lock:
                    self._found[pid] = Unseen(pid, exe, "driver")

# SPDX-License-Identifier: Apache-2.0
"""MPS without hand work (`priority.mps`, docs/priority.md): clc-run joins this user's MPS
control daemon, or starts one, so that the processes of priority classes share the GPU through
an MPS server instead of time-slicing their contexts.

Where clc-run looks: in $CUDA_MPS_PIPE_DIRECTORY alone when the program's environment sets it;
else in clc's directory for this user and the visible devices
(/tmp/clc-mps-<uid>/<devices>/pipe), then in MPS's default (/tmp/nvidia-mps). A daemon there
is joined when
- its control socket belongs to this user or to root,
- it answers `get_server_list` within 5 s,
- and no MPS server of another user is active under it (a daemon serves one user at a time:
  this user's programs would wait until that server ends).

With `start`, when none is joined, clc-run starts `nvidia-cuda-mps-control -d` itself: pipe and
log directories in clc's directory for this user (mode 0700, this user's, no link on the way),
without clc's shim or settings in its environment. The daemon keeps running after the program
ends, for this user's next programs on the same devices (a service and a training job started
by two clc-run commands meet there); `clc doctor` names it, and `echo quit |
CUDA_MPS_PIPE_DIRECTORY=<pipe> nvidia-cuda-mps-control` stops it.
"""

import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import time

__all__ = ["MpsDaemon", "MpsProblem", "join_mps", "mps_environment", "find_daemon",
           "ours_intact", "clc_pipe_dir", "places", "DEFAULT_PIPE"]

DEFAULT_PIPE = "/tmp/nvidia-mps"
_ROOT = "/tmp"
_ASK_S = 5.0
_START_S = 10.0
_CONTROL = "nvidia-cuda-mps-control"


class MpsProblem(Exception):
    """Why a daemon cannot be joined or started here."""


class MpsDaemon:
    """An MPS control daemon that answers at `pipe`; `servers`: its active servers' pids;
    `unseen`: those not visible here (a daemon outside this PID namespace, as a container's)."""

    def __init__(self, pipe, servers, unseen=()):
        self.pipe = pipe
        self.servers = servers
        self.unseen = list(unseen)


def _devices_word(environ):
    """The visible devices as a directory name: `all`, `dev-0,1`, or `dev-<hash>` for UUIDs
    and anything else; under Slurm `job-<id>-` before it (two jobs' `0` may be two GPUs, and a
    daemon a task starts ends with its job)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        word = "all"
    elif re.fullmatch(r"[0-9,]{1,32}", visible):
        word = f"dev-{visible}"
    else:
        word = "dev-" + hashlib.sha256(visible.encode()).hexdigest()[:16]
    job = environ.get("SLURM_JOB_ID", "")
    return f"job-{job}-{word}" if re.fullmatch(r"[0-9]{1,12}", job) else word


def clc_pipe_dir(environ, uid=None):
    """clc's pipe directory for this user and the visible devices (not made)."""
    uid = os.geteuid() if uid is None else uid
    return os.path.join(_ROOT, f"clc-mps-{uid}", _devices_word(environ), "pipe")


def places(environ):
    """Where clc-run looks for a daemon, in order: $CUDA_MPS_PIPE_DIRECTORY alone when the
    program's environment sets it, else clc's directory for this user and these devices, then
    MPS's default."""
    explicit = environ.get("CUDA_MPS_PIPE_DIRECTORY")
    return [explicit] if explicit else [clc_pipe_dir(environ), DEFAULT_PIPE]


def _client_devices(visible):
    """The program's CUDA_VISIBLE_DEVICES under a daemon started with `visible`: the MPS server
    numbers the devices it was given from 0 and reads a client's indices in that numbering (a
    client that keeps `1` of a daemon given `1` finds no device), so each index becomes its
    place in the list; a UUID names the same device to both and stays."""
    return ",".join(str(i) if e.strip().isdigit() else e for i, e in enumerate(visible.split(",")))


def _ours_joined(pipe, environ, said):
    """What the program's environment gets on joining clc's own daemon at `pipe`, which was
    started with the program's visible devices (they name its directory)."""
    extra = {"CUDA_MPS_PIPE_DIRECTORY": pipe}
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and _client_devices(visible) != visible:
        extra["CUDA_VISIBLE_DEVICES"] = _client_devices(visible)
        said = said + [(False, f"MPS: CUDA_VISIBLE_DEVICES={visible} is "
                               f"{extra['CUDA_VISIBLE_DEVICES']} under that daemon (an MPS server "
                               f"numbers its devices from 0)")]
    return extra, said


def _private_dir(path):
    """Makes `path` (mode 0700) where it is missing, each directory from clc's per-user one
    down; each must be a directory (not a link) of this user that no one else may enter."""
    top = os.path.join(_ROOT, f"clc-mps-{os.geteuid()}")
    rel = os.path.relpath(path, top)
    if rel.startswith(".."):
        raise MpsProblem(f"{path} is not under {top}")
    here = top
    for part in [""] + rel.split(os.sep):
        here = os.path.join(here, part) if part else here
        try:
            os.mkdir(here, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise MpsProblem(f"cannot make {here}: {e.strerror}") from None
        _check_private(here)


def _check_private(path):
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise MpsProblem(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise MpsProblem(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise MpsProblem(f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):04o})")


def _clean_environment(environ, pipe, log=None):
    """The environment a control command or the daemon gets: the program's (its visible
    devices are the daemon's) without clc's shim and settings, and without MPS's own settings
    (a daemon takes CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, a memory limit, ... as the default of
    every client: one program's share would become the service's), with the daemon's
    directories."""
    env = {k: v for k, v in environ.items()
           if not k.startswith(("CLC_", "CUDA_MPS_")) and k not in ("LD_PRELOAD", "LD_AUDIT")}
    env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    if log:
        env["CUDA_MPS_LOG_DIRECTORY"] = log
    return env


def _ask(control, environ, pipe, command):
    """The daemon's answer to `command` (its output), or None when no daemon answers."""
    try:
        done = subprocess.run([control], input=command + "\n", capture_output=True, text=True,
                              errors="replace", env=_clean_environment(environ, pipe),
                              timeout=_ASK_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _uid_of(pid):
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ours_intact(pipe):
    """Whether the directories above clc's own `pipe` (/tmp/clc-mps-<uid>/<devices>) are
    private to this user (a user who made them first controls what is under them); False when
    they are missing (nothing to join there), MpsProblem when refused."""
    devices = os.path.dirname(pipe)
    try:
        _check_private(os.path.dirname(devices))
        _check_private(devices)
    except FileNotFoundError:
        return False
    return True


def find_daemon(control, pipe, environ=None):
    """An MpsDaemon that answers at `pipe`, None when none does; MpsProblem when one answers
    that this user must not join."""
    environ = os.environ if environ is None else environ
    try:
        where = os.lstat(pipe)
        st = os.lstat(os.path.join(pipe, "control"))
    except OSError:
        return None
    if stat.S_ISLNK(where.st_mode) or not stat.S_ISDIR(where.st_mode):
        raise MpsProblem(f"{pipe} is not a directory")
    # a directory others may write could hold anything under the daemon's names
    if where.st_uid not in (0, os.geteuid()) or where.st_mode & 0o022:
        raise MpsProblem(f"{pipe} belongs to uid {where.st_uid} or others may write it")
    if st.st_uid not in (0, os.geteuid()):
        raise MpsProblem(f"the MPS daemon at {pipe} belongs to uid {st.st_uid}")
    answer = _ask(control, environ, pipe, "get_server_list")
    if answer is None:
        return None
    servers = [int(w) for w in answer.split() if w.isascii() and w.isdigit()]
    owners = {p: _uid_of(p) for p in servers}
    others = [p for p, uid in owners.items() if uid not in (None, os.geteuid())]
    if others:
        raise MpsProblem(f"the MPS daemon at {pipe} serves another user now (server pid "
                         f"{others[0]}): this user's programs would wait until it ends")
    # A server this namespace cannot see (the daemon of the host, beside a container) has no
    # user to tell: the daemon is joined as the driver would join it by itself.
    return MpsDaemon(pipe, servers, [p for p, uid in owners.items() if uid is None])


def _lock(fd, what):
    """flock(fd) within _START_S x 3 (another clc-run starting a daemon holds it meanwhile)."""
    deadline = time.monotonic() + 3 * _START_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise MpsProblem(f"{what} stays locked by another clc-run") from None
            time.sleep(0.05)


def _start(control, environ, pipe):
    """Starts a daemon at clc's `pipe` (its log beside it), under a lock that a second clc-run
    starting at once waits for; the daemon found or started."""
    base = os.path.dirname(pipe)
    log = os.path.join(base, "log")
    _private_dir(pipe)
    _private_dir(log)
    lock = os.path.join(base, "start.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _lock(fd, lock)
        found = find_daemon(control, pipe, environ)
        if found is not None:
            return found, False
        try:
            # a session of its own, and nothing of clc-run's output held open by it
            subprocess.run([control, "-d"], env=_clean_environment(environ, pipe, log),
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, cwd="/", start_new_session=True,
                           timeout=_START_S, check=True)
        except (OSError, subprocess.SubprocessError) as e:
            raise MpsProblem(f"{control} -d failed ({e}); see {log}") from None
        deadline = time.monotonic() + _START_S
        while time.monotonic() < deadline:
            found = find_daemon(control, pipe, environ)
            if found is not None:
                return found, True
            time.sleep(0.05)
        raise MpsProblem(f"the MPS daemon started at {pipe} does not answer; see "
                         f"{log}/control.log")
    finally:
        os.close(fd)


def mps_environment(mode, environ):
    """(what the program's environment gets, [(said without -v, line)]) for `priority.mps:
    mode` ('join' or 'start'): the pipe directory of the daemon joined or started; when none,
    nothing (the driver's own default), or an empty directory when clc refused the daemon at
    the default, and a warning either way."""
    control = shutil.which(_CONTROL, path=environ.get("PATH"))
    explicit = environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if control is None:
        return _without_mps(mode, f"no {_CONTROL} on PATH")
    ours = clc_pipe_dir(environ)
    looked = places(environ)
    # where the driver goes by itself: refused there, the program must be kept off it
    driver_own = explicit or DEFAULT_PIPE
    problems, refused_own = [], False
    for pipe in looked:
        try:
            if pipe == ours and not ours_intact(ours):
                continue
            found = find_daemon(control, pipe, environ)
        except (MpsProblem, OSError, ValueError) as e:
            problems.append(str(e))
            refused_own |= pipe == driver_own and isinstance(e, MpsProblem)
            continue
        if found is not None:
            said = [(False, f"MPS: joined the daemon at {pipe}")]
            if found.unseen:
                said.append((False, f"MPS: its server pid {found.unseen[0]} is not visible "
                                    f"here (another PID namespace): whose it is is not known"))
            if pipe == ours:
                return _ours_joined(pipe, environ, said)
            return {"CUDA_MPS_PIPE_DIRECTORY": pipe}, said
    if mode == "start" and not explicit:
        try:
            found, started = _start(control, environ, ours)
        except (MpsProblem, OSError, ValueError) as e:
            problems.append(str(e))
        else:
            said = (f"MPS: started a control daemon for this user at {ours}; it keeps running "
                    f"for this user's next programs (stop it: echo quit | "
                    f"CUDA_MPS_PIPE_DIRECTORY={ours} {_CONTROL})" if started else
                    f"MPS: joined the daemon at {ours}")
            return _ours_joined(ours, environ, [(started, said)])
    where = " or ".join(looked)
    why = "; ".join(problems) or f"no MPS daemon answers at {where}"
    if mode == "start" and explicit:
        why += " (CUDA_MPS_PIPE_DIRECTORY is set: clc-run starts a daemon only in its own "
        why += "directory; unset it, or start one there)"
    return _without_mps(mode, why, refused_own)


def _without_mps(mode, why, refused_own=False):
    """The program runs without a daemon clc joined, said; when clc refused the one the driver
    would go to by itself (MPS's default, or $CUDA_MPS_PIPE_DIRECTORY), with an empty pipe
    directory of this user's instead."""
    fallback = "the program runs without MPS (processes' contexts time-slice the GPU)"
    if not refused_own:
        return {}, [(True, f"warning: priority.mps: {mode}: {why}: {fallback}, unless a daemon "
                           f"answers the driver itself there")]
    said = [(True, f"warning: priority.mps: {mode}: {why}: {fallback}")]
    # The driver would go to the refused daemon by itself: an empty pipe directory of this
    # user's keeps the program off every daemon.
    none = os.path.join(_ROOT, f"clc-mps-{os.geteuid()}", "none")
    try:
        _private_dir(none)
    except (MpsProblem, OSError) as e:
        return {}, said + [(True, f"warning: priority.mps: {e}: the driver may still join "
                                  f"{DEFAULT_PIPE}")]
    return {"CUDA_MPS_PIPE_DIRECTORY": none}, said


def join_mps(mode, env, verbose=False):
    """clc-run's part: the program's environment `env` joins the daemon that `priority.mps:
    mode` finds or starts ('off': nothing); what was done is said (joined: with -v only)."""
    if mode == "off":
        return
    extra, lines = mps_environment(mode, env)
    env.update(extra)
    for loud, line in lines:
        if loud or verbose:
            print(f"clc-run: {line}", file=sys.stderr)

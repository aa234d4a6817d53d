# SPDX-License-Identifier: Apache-2.0
"""The capture files of one clc-run: the program's, its child processes' (STEM.child-PID.clc
beside FILE.clc) and its re-executed images' (FILE.N), told from an earlier run's left under
the same names by the start time in their headers. clc-run reads them for its summary and
`clc report FILE` for its own."""

import glob
import os
import pathlib
import re
import stat
import struct

from clc.abi import CAPTURE_HEADER, CAPTURE_MAGIC
from clc.errors import EXIT_USAGE, ClcError

__all__ = ["default_output", "capture_files", "begun", "stem", "clear_children"]


def default_output(program, pid):
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(program)) or "program"
    return pathlib.Path(os.path.abspath(f"clc-{name}.{pid}.clc"))


def capture_files(output, since_ns=None, owner=None):
    """The program's capture and those of its child processes and re-executed images; with
    since_ns, only regular files of this user (or of owner) begun at or after that time
    (CLOCK_MONOTONIC, ns): an earlier run's children left under the same names are not this
    run's."""
    output = pathlib.Path(output)
    files = [output] if output.exists() else []
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(stem(output)) + ".child-*.clc"))
    files += sorted(pathlib.Path(p) for p in glob.glob(glob.escape(str(output)) + ".[0-9]*"))
    return [f for f in files if since_ns is None or begun(f, owner) >= since_ns]


def stem(path):
    """A capture's name without .clc: its children's captures are STEM.child-PID.clc."""
    return str(path).removesuffix(".clc")


def begun(path, owner=None):
    """The start time (CLOCK_MONOTONIC) in a capture's header; a file of this user's (or of
    owner) that has none is kept (and reported); another user's file, or one that is not a
    regular file, is not this run's (-1)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != (os.geteuid() if owner is None
                                                         else owner):
            return -1
        magic, _, _, _, _, start_monotonic_ns, _ = CAPTURE_HEADER.unpack(
            os.read(fd, CAPTURE_HEADER.size))
    except (OSError, struct.error):
        return float("inf")
    finally:
        os.close(fd)
    return start_monotonic_ns if magic == CAPTURE_MAGIC else float("inf")


def clear_children(output, force):
    """The captures an earlier run left under this capture's name (its child processes' and
    re-executed images'): removed with --force, so that this run's report holds this run's
    captures alone; refused without it. Only this user's regular files are removed; anything
    else there is refused."""
    stale = capture_files(output)
    stale = [f for f in stale if f != output]
    if not stale:
        return
    if not force:
        raise ClcError(f"{stale[0]} and {len(stale) - 1} more captures of an earlier run exist "
                       f"beside {output} (use --force to replace them, or -o to name another "
                       f"file)" if len(stale) > 1 else
                       f"{stale[0]}, a capture of an earlier run, exists beside {output} (use "
                       f"--force to replace it, or -o to name another file)", EXIT_USAGE)
    for f in stale:
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ClcError(f"{f} is in the way of this run's captures and is not this user's "
                           f"regular file: remove it, or name another file with -o", EXIT_USAGE)
        os.unlink(f)

# SPDX-License-Identifier: Apache-2.0
"""Programs that clc's preload cannot enter: the loader ignores LD_PRELOAD for setuid and
setgid programs (unless run by root), and a static binary loads nothing. clc-run says so
before the program starts, and does not count a static program that ran without the shim
as one that could have launched kernels."""

import os
import shutil
import stat
import struct
import sys

__all__ = ["warn_unpreloadable", "static_program"]


def warn_unpreloadable(program):
    """Say on stderr, before the program starts, that clc cannot see into it."""
    path = program if os.sep in program else shutil.which(program)
    try:
        st = os.stat(path) if path else None
    except OSError:
        return
    if st is None or not stat.S_ISREG(st.st_mode):
        return
    if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and os.geteuid() != 0:
        print(f"clc: {program} is set{'uid' if st.st_mode & stat.S_ISUID else 'gid'}: the "
              f"loader ignores clc's preload for it, so its launches cannot be seen or "
              f"controlled", file=sys.stderr)
        return
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return
    if head[:4] == b"\x7fELF" and not _has_interp(path):
        print(f"clc: {program} is statically linked: nothing can be preloaded into it, so its "
              f"launches cannot be seen or controlled", file=sys.stderr)


def static_program(path):
    """Whether `path` names a statically linked ELF executable (it cannot load the driver)."""
    if os.sep not in path:
        path = shutil.which(path) or ""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return False
    except OSError:
        return False
    return not _has_interp(path)


def _has_interp(path):
    """Whether an ELF executable names a dynamic loader (PT_INTERP)."""
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[4] != 2:  # 32-bit: do not guess
                return True
            phoff, = struct.unpack_from("<Q", ident, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", ident, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return True
    return any(struct.unpack_from("<I", table, i * phentsize)[0] == 3  # PT_INTERP
               for i in range(len(table) // max(phentsize, 1)))

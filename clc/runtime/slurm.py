# SPDX-License-Identifier: Apache-2.0
"""What clc-run takes from clc-slurm-exec, the launcher of the tasks that the SPANK plugin
(shim/slurm/) puts under clc: the job's environment. The launcher starts clc-run in an
environment of its own, so that nothing of the job's runs code inside clc's Python, and hands
the job's environment over whole in a memfd; clc-run gives it to the program. The names are
those of shim/slurm/clc_slurm.h, as clc.abi gives them."""

import os

from clc import abi

ENV_FD = abi.SLURM_ENV_FD.decode()
ENV_MEMFD = abi.SLURM_ENV_MEMFD.decode()
_MAX = 64 << 20


def job_environment(environ):
    """The environment the program is to get: the job's, from the memfd CLC_SLURM_ENV_FD
    names, when clc-run was started by clc-slurm-exec; else `environ` itself. A variable that
    names no such memfd is dropped (an ordinary run of clc-run with it set gets its own
    environment, without it)."""
    text = environ.get(ENV_FD)
    if text is None:
        return environ
    environ = {k: v for k, v in environ.items() if k != ENV_FD}
    try:
        fd = int(text)
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{ENV_MEMFD} "):
            return environ
    except (ValueError, OSError):
        return environ
    try:
        size = os.fstat(fd).st_size
        if size > _MAX:
            return environ
        chunks, at = [], 0
        while at < size:
            chunk = os.pread(fd, size - at, at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    job = {}
    for rec in b"".join(chunks).split(b"\0"):
        key, eq, value = rec.partition(b"=")
        if eq and key:
            job[os.fsdecode(key)] = os.fsdecode(value)
    return job

# SPDX-License-Identifier: Apache-2.0
"""The names shim/slurm/clc_slurm.h and clc/runtime/slurm.py share, and how clc-run takes the
job's environment from the memfd clc-slurm-exec hands it."""

import os
import re
from pathlib import Path

from clc.runtime import slurm

HEADER = (Path(__file__).resolve().parents[2] / "shim" / "slurm" / "clc_slurm.h").read_text()


def define(name):
    m = re.search(rf"^#define {name} (.+?)\s*(?:/\*.*)?$", HEADER, re.M)
    assert m, name
    return m[1]


def test_the_header_and_python_name_the_same_things():
    assert define("CLC_SLURM_ENV_FD") == f'"{slurm.ENV_FD}"'
    assert define("CLC_SLURM_ENV_MEMFD") == f'"{slurm.ENV_MEMFD}"'


def memfd(name, block):
    fd = os.memfd_create(name, 0)
    os.write(fd, block)
    return fd


def test_the_jobs_environment_comes_whole_from_the_memfd():
    fd = memfd("clc-slurm-env", b"LD_PRELOAD=/job/lib.so\0A=b=c\0EMPTY=\0")
    got = slurm.job_environment({"CLC_SLURM_ENV_FD": str(fd), "PATH": "/usr/bin"})
    assert got == {"LD_PRELOAD": "/job/lib.so", "A": "b=c", "EMPTY": ""}
    try:
        os.fstat(fd)
        raise AssertionError("the descriptor was left open")
    except OSError:
        pass


def test_a_descriptor_that_is_not_the_launchers_is_dropped():
    fd = memfd("other", b"X=1\0")
    try:
        got = slurm.job_environment({"CLC_SLURM_ENV_FD": str(fd), "PATH": "/usr/bin"})
        assert got == {"PATH": "/usr/bin"}
    finally:
        os.close(fd)
    assert slurm.job_environment({"CLC_SLURM_ENV_FD": "x", "B": "2"}) == {"B": "2"}
    assert slurm.job_environment({"B": "2"}) == {"B": "2"}

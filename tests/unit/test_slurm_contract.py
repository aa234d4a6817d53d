# SPDX-License-Identifier: Apache-2.0
"""The names shim/slurm/clc_slurm.h and clc/runtime/slurm.py share, and how clc-run gives the
program back the loader's variables that clc-slurm-exec moved out of its way."""

import re
from pathlib import Path

from clc.runtime import slurm

HEADER = (Path(__file__).resolve().parents[2] / "shim" / "slurm" / "clc_slurm.h").read_text()


def define(name):
    m = re.search(rf"^#define {name} (.+?)\s*(?:/\*.*)?$", HEADER, re.M)
    assert m, name
    return m[1]


def test_the_header_and_python_name_the_same_variables():
    assert define("CLC_SLURM_SAVED") == f'"{slurm.SAVED}"'
    assert define("CLC_SLURM_SAVED_PREFIX") == f'"{slurm.SAVED_PREFIX}"'
    names = re.findall(r'"(\w+)"', define("CLC_SLURM_LOADER_VARS"))
    assert tuple(names) == slurm.LOADER_VARS


def test_saved_loader_variables_come_back_and_the_copies_go():
    env = {"CLC_SLURM_SAVED": "LD_PRELOAD,LD_LIBRARY_PATH",
           "CLC_SLURM_SAVED_LD_PRELOAD": "/job/lib.so",
           "CLC_SLURM_SAVED_LD_LIBRARY_PATH": "/job/lib",
           "CLC_SLURM_SAVED_LD_AUDIT": "/not/listed.so", "HOME": "/home/u"}
    assert slurm.restore_loader_vars(env) == {"LD_PRELOAD": "/job/lib.so",
                                              "LD_LIBRARY_PATH": "/job/lib", "HOME": "/home/u"}


def test_without_the_list_nothing_is_restored():
    env = {"CLC_SLURM_SAVED_LD_PRELOAD": "/x.so", "LD_PRELOAD": "/mine.so"}
    assert slurm.restore_loader_vars(env) == {"LD_PRELOAD": "/mine.so"}

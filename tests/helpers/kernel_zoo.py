# SPDX-License-Identifier: Apache-2.0
"""The kernel zoo (tests/fixtures/zoo): its programs, and nvcc's PTX of each (the integration
suite's zoo_ptx fixture compiles them once)."""

import os
import pathlib
import shutil

import pytest

ZOO = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "zoo"
FILES = sorted(p.name for p in ZOO.glob("*.cu"))


def cuda_tool(name):
    """A CUDA toolkit program (nvcc, cuobjdump) on PATH or in /usr/local/cuda/bin, or None."""
    path = shutil.which(name) or f"/usr/local/cuda/bin/{name}"
    return path if os.access(path, os.X_OK) else None


def zoo_ptx_text(zoo_ptx, name):
    """The PTX of zoo program `name` out of the zoo_ptx fixture's; skipped when there is no such
    program, failed when nvcc could not compile it."""
    if name not in zoo_ptx:
        pytest.skip(f"tests/fixtures/zoo/{name} does not exist (yet)")
    ptx = zoo_ptx[name]
    if not isinstance(ptx, str):
        pytest.fail(f"nvcc -ptx -arch=sm_90 {name} failed:\n{ptx.stderr}")
    return ptx

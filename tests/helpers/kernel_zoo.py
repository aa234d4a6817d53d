# SPDX-License-Identifier: Apache-2.0
"""The kernel zoo (tests/fixtures/zoo): its programs, and nvcc's PTX of each (the integration
suite's zoo_ptx fixture compiles them once); the CUDA tools, and building with nvcc."""

import concurrent.futures
import functools
import os
import pathlib
import shutil
import subprocess

import pytest

import harness  # noqa: F401  (puts tests/fixtures/native on sys.path)
from build import wheel_tops  # noqa: E402

ZOO = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "zoo"
FILES = sorted(p.name for p in ZOO.glob("*.cu"))


def _runs(path):
    """Whether a CUDA tool answers `--version`: a wrapper left on PATH by a toolkit that is gone
    (a script that execs /usr/local/cuda-X/bin/nvcc) must not hide the wheels' tool."""
    try:
        return subprocess.run([path, "--version"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=None)
def cuda_tool(name):
    """A CUDA toolkit program (nvcc, ptxas) on PATH or in /usr/local/cuda/bin that runs, else the
    one the test extra's NVIDIA wheels bring (nvidia-cuda-nvcc: no CUDA toolkit needed), or
    None. The wheels' nvcc finds its libraries (for linking a program) through
    NVCC_APPEND_FLAGS, set here for every nvcc the tests run."""
    for path in (shutil.which(name), f"/usr/local/cuda/bin/{name}"):
        if path and os.access(path, os.X_OK) and os.path.isfile(path) and _runs(path):
            return path
    for top in wheel_tops():
        path = top / "bin" / name
        if os.access(path, os.X_OK):
            link = f"-L{top / 'lib'}"
            flags = os.environ.get("NVCC_APPEND_FLAGS", "")
            if name == "nvcc" and link not in flags.split():
                os.environ["NVCC_APPEND_FLAGS"] = f"{flags} {link}".strip()
            return str(path)
    return None


def nvcc_build(directory, builds, why):
    """Each name -> (source, nvcc options) of `builds` compiled in `directory` into
    directory/name, all at once: nvcc is slow and single-threaded. Skipped where there is no
    nvcc (`why`: what the tests build with it), failed with nvcc's words where a build fails.
    Returns name -> path."""
    nvcc = cuda_tool("nvcc")
    if nvcc is None:
        pytest.skip(f"nvcc not found (PATH, /usr/local/cuda/bin, nvidia-cuda-nvcc): {why}")

    def build(name):
        source, options = builds[name]
        return name, subprocess.run([nvcc, *options, source, "-o", name], cwd=directory,
                                    capture_output=True, text=True, timeout=300)

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for name, proc in pool.map(build, builds):
            if proc.returncode != 0:
                pytest.fail(f"nvcc {' '.join(builds[name][1])} failed:\n{proc.stderr}")
    return {name: directory / name for name in builds}


def zoo_ptx_text(zoo_ptx, name):
    """The PTX of zoo program `name` out of the zoo_ptx fixture's; skipped when there is no such
    program, failed when nvcc could not compile it."""
    if name not in zoo_ptx:
        pytest.skip(f"tests/fixtures/zoo/{name} does not exist (yet)")
    ptx = zoo_ptx[name]
    if not isinstance(ptx, str):
        pytest.fail(f"nvcc -ptx -arch=sm_90 {name} failed:\n{ptx.stderr}")
    return ptx

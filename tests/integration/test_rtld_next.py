# SPDX-License-Identifier: Apache-2.0
"""dlsym(RTLD_NEXT) must mean "next after the caller", not "next after the shim".

glibc resolves RTLD_NEXT from the caller's return address, so the shim's dlsym forwards such
lookups as a tail call. examples/bench_inproc relies on it: its helper library, linked before
libcuda, asks for RTLD_NEXT's cuLaunchKernel and must get the driver's own, past the shim.
"""

import os
import subprocess

import pytest

from harness import AUDIT, ROOT, kernel_launches

CUDA_INCLUDE = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")


@pytest.fixture(scope="module")
def bench_inproc(native, tmp_path_factory):
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda.h")):
        pytest.skip(f"no cuda.h under {CUDA_INCLUDE}")
    out = tmp_path_factory.mktemp("inproc")
    lib_dir = native["libcuda"].parent
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", out / "libbench_real.so",
                    ROOT / "examples" / "bench_real.c", "-ldl"], check=True)
    subprocess.run(["gcc", "-O2", f"-I{CUDA_INCLUDE}", "-o", out / "bench_inproc",
                    ROOT / "examples" / "bench_inproc.c", f"-L{out}", "-lbench_real",
                    f"-L{lib_dir}", "-lcuda", "-ldl", f"-Wl,-rpath,{out}"], check=True)
    return out / "bench_inproc"


def test_rtld_next_lookup_from_a_later_library_finds_the_driver(bench_inproc, clc_run):
    # GIVEN a program that launches through the plain symbol (the shim's hook) and through
    # the function its helper library found with dlsym(RTLD_NEXT)
    run = clc_run(AUDIT, [bench_inproc, "20", "50"])
    assert run.proc.returncode == 0, run.stderr
    # THEN the two are different functions, and the shim saw only the hooked launches:
    # 10 warm-up bursts and 20 measured ones, of 50 launches each
    assert "same_function=0" in run.stdout
    hooked = (10 + 20) * 50
    assert kernel_launches(run.capture()) == {"empty_kernel": hooked}

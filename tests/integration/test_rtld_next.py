# SPDX-License-Identifier: Apache-2.0
"""dlsym(RTLD_NEXT) must mean "next after the caller", not "next after the shim".

glibc resolves RTLD_NEXT from the caller's return address, so the shim's dlsym forwards such
lookups as a tail call. examples/bench_inproc relies on it: its helper library, linked before
libcuda, asks for RTLD_NEXT's cuLaunchKernel and must get the driver's own, past the shim.
"""

import re

import pytest

from harness import AUDIT, ROOT, gcc, kernel_launches
from harness import DENY_DEBUG_ONLY as DENY_DEBUG

SRC = ROOT / "tests" / "fixtures" / "native"


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


@pytest.fixture(scope="module")
def prog_lookup(native, tmp_path_factory):
    out = tmp_path_factory.mktemp("lookup")
    lib_dir = native["libcuda"].parent
    gcc(out, SRC / "lib_lookup.c", "liblookup.so", f"-L{lib_dir}", "-lcuda", "-ldl", shared=True)
    return gcc(out, SRC / "prog_lookup.c", "prog_lookup", f"-L{out}", "-llookup", f"-L{lib_dir}",
               "-lcuda", "-ldl", f"-Wl,-rpath,{out}")


def test_a_library_that_looks_the_driver_up_itself_is_still_decided(prog_lookup, clc_run,
                                                                    run_native):
    # GIVEN a library that finds cuLaunchKernel with dlsym(RTLD_NEXT), and launches with
    # cuLaunchCooperativeKernelMultiDevice: without clc every launch runs
    alone = run_native([prog_lookup])
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert " -> 800" not in alone.stdout and alone.stdout.count(" -> 0") == 4
    # WHEN it runs under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, [prog_lookup])
    assert run.proc.returncode == 0, run.stdout + run.stderr
    results = {(m[1], m[2]): int(m[3]) for m in re.finditer(r"^(\S+) (\S+) via \S+ -> (-?\d+)",
                                                          run.stdout, re.M)}
    # THEN each way reached the decision: debug_kernel refused, ok_kernel launched
    for way in ("rtld-next", "multi"):
        assert results[(way, "debug_kernel")] == 800, (way, run.stdout)
        assert results[(way, "ok_kernel")] == 0, (way, run.stdout)
    # AND the driver never ran the debug kernel
    assert run.fake_counts().get("debug_kernel", 0) == 0
    assert run.fake_counts()["ok_kernel"] == 2


def test_an_interposer_loaded_after_clc_gets_its_own_next(native, clc_run, tmp_path):
    # GIVEN another interposer of cuLaunchKernel, preloaded after clc's shim, that passes each
    # launch on to what dlsym(RTLD_NEXT) gives it
    lib = gcc(tmp_path, SRC / "lib_interpose.c", "libinterpose.so", "-ldl", shared=True)
    # WHEN a program linked with -lcuda runs under a policy that denies debug kernels
    alone = clc_run(DENY_DEBUG, [native["prog_linked"]])
    run = clc_run(DENY_DEBUG, [native["prog_linked"]], env={"LD_PRELOAD": str(lib)})
    assert run.proc.returncode == 0, run.stdout + run.stderr
    # THEN no launch loops between the two, and each launch gets what it gets without the
    # other interposer: the debug kernel is refused, and the driver never runs it
    m = re.search(r"^interposer: passed=(\d+) looped=(\d+)$", run.stdout, re.M)
    assert m and int(m[2]) == 0, run.stdout
    assert run.results() == alone.results()
    assert {r for (k, _), rs in run.results().items() if "debug" in k for r in rs} == {800}
    assert run.fake_counts() == alone.fake_counts()
    assert run.fake_counts().get("_Z12debug_kernelPi", 0) == 0


@pytest.fixture(scope="module")
def prog_escape(native, tmp_path_factory):
    out = tmp_path_factory.mktemp("escape")
    lib_dir = native["libcuda"].parent
    lib = gcc(out, SRC / "lib_escape.c", "libescape.so", f"-L{lib_dir}", "-Wl,--no-as-needed",
              "-lcuda", "-ldl", shared=True)
    return gcc(out, SRC / "prog_escape.c", "prog_escape", f"-L{lib_dir}", "-lcuda", "-ldl"), lib


def test_the_loaders_ordinary_ways_around_the_shim_are_closed(prog_escape, clc_run, run_native):
    prog, lib = prog_escape
    # GIVEN a library that defines a cuLaunchKernel it never uses, to ask dlsym(RTLD_NEXT) for
    # the driver's past it, and opens the driver in a namespace of its own: without clc both
    # reach the driver
    alone = run_native([prog, lib])
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "rtld-next-own debug_kernel via cuLaunchKernel -> 0" in alone.stdout
    assert "dlmopen opened" in alone.stdout
    # WHEN it runs under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, [prog, lib])
    assert run.proc.returncode == 0, run.stdout + run.stderr
    # THEN its RTLD_NEXT lookup got the shim's hook: debug_kernel refused, ok_kernel launched
    assert "rtld-next-own debug_kernel via cuLaunchKernel -> 800" in run.stdout
    assert "rtld-next-own ok_kernel via cuLaunchKernel -> 0" in run.stdout
    assert run.fake_counts().get("debug_kernel", 0) == 0
    # AND the new namespace was refused, dlerror and clc saying why
    assert "dlmopen refused: /clc: dlmopen into a new link-map namespace is refused" in run.stdout
    assert "dlmopen of libcuda.so.1 into a new link-map namespace was refused" in run.stderr

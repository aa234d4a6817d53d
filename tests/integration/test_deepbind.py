# SPDX-License-Identifier: Apache-2.0
"""A library opened with RTLD_DEEPBIND binds to its own dependencies before the global scope.

Its references to the driver (and to dlsym) would then bind to libcuda, past the preloaded
shim: the shim's dlopen lets libc do the load, then points them back at the hooks. The file it
opens must be the one the program's own call would have opened (libc searches the calling
object's RUNPATH and expands $ORIGIN against it), and any other dlopen must stay libc's own,
reached by a tail call so that libc still sees the program as its caller.
"""

import os
import re
import subprocess

import pytest

from harness import DENY_DEBUG_ONLY as DENY_DEBUG
from harness import CUDA_INCLUDE, ROOT

WAYS = ("direct", "table", "address", "dlsym", "saved", "libc")


@pytest.fixture(scope="module")
def deepbind(native, tmp_path_factory):
    """prog_deepbind, with the library in lib/ beside it: a directory that only the program's
    RUNPATH names (LD_LIBRARY_PATH holds the fake driver's)."""
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda.h")):
        pytest.skip(f"no cuda.h under {CUDA_INCLUDE}")
    out = tmp_path_factory.mktemp("deepbind")
    lib_dir = out / "lib"
    lib_dir.mkdir()
    src = ROOT / "tests" / "fixtures" / "native"
    cflags = ["gcc", "-O2", f"-I{CUDA_INCLUDE}", f"-I{src}"]
    driver = [f"-L{native['libcuda'].parent}", "-lcuda", "-ldl"]
    # Bound at load, its GOT read-only once relocated (RELRO); and one bound lazily, at first call.
    for name, binding in (("libdeepbind.so", "now"), ("libdeepbind_lazy.so", "lazy")):
        subprocess.run([*cflags, "-shared", "-fPIC", "-o", lib_dir / name, src / "lib_deepbind.c",
                        *driver, f"-Wl,-z,relro,-z,{binding}"], check=True)
    # The program alone, and one that has libcuda in the global scope from the start.
    for name, extra in (("prog_deepbind", []), ("prog_deepbind_linked", ["-Wl,--no-as-needed",
                                                                         *driver])):
        subprocess.run([*cflags, "-o", out / name, src / "prog_deepbind.c", "-ldl", *extra,
                        f"-Wl,--enable-new-dtags,-rpath,{lib_dir}"], check=True)
    return out


def results(stdout):
    """(way, kernel) -> the CUresult the library printed."""
    return {(m[1], m[2]): int(m[3])
            for m in re.finditer(r"^(\w+) (\w+) via \S+ -> (-?\d+)$", stdout, re.M)}


CASES = {
    "absolute-path": ("prog_deepbind", "now", "{dir}/lib/libdeepbind.so"),
    "name-in-runpath": ("prog_deepbind", "now", "libdeepbind.so"),
    "lazy": ("prog_deepbind", "lazy", "libdeepbind_lazy.so"),
    "origin": ("prog_deepbind", "now", "$ORIGIN/lib/libdeepbind.so"),
    "driver-already-global": ("prog_deepbind_linked", "now", "libdeepbind.so"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_deep_bound_library_is_decided(deepbind, clc_run, run_native, case):
    prog, mode, name = CASES[case]
    argv = [deepbind / prog, mode, name.format(dir=deepbind)]
    # GIVEN a library that calls the driver through every kind of reference: without clc
    # every launch runs
    alone = run_native(argv)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert set(results(alone.stdout).values()) == {0}
    assert len(results(alone.stdout)) == 2 * len(WAYS)
    # WHEN the program opens it with RTLD_DEEPBIND under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, argv)
    assert run.proc.returncode == 0, run.stdout + run.stderr
    # THEN the file the program named was opened, and dlopen left no error behind
    assert "dlerror none" in run.stdout
    # AND every way reached the decision: debug_kernel refused, ok_kernel launched
    got = results(run.stdout)
    for way in WAYS:
        assert got[(way, "debug_kernel")] == 800, (way, run.stdout)
        assert got[(way, "ok_kernel")] == 0, (way, run.stdout)
    # AND the driver never ran the debug kernel
    assert run.fake_counts().get("debug_kernel", 0) == 0
    assert run.fake_counts()["ok_kernel"] == len(WAYS)


def test_a_plain_dlopen_still_searches_the_programs_runpath(deepbind, clc_run):
    # GIVEN a library found only through the program's RUNPATH, opened without RTLD_DEEPBIND:
    # libc searches the caller's RUNPATH, so the shim's dlopen must leave libc the program's call
    run = clc_run(DENY_DEBUG, [deepbind / "prog_deepbind", "plain", "libdeepbind.so"])
    # THEN it is found, and its launches bind to the hooks as usual
    assert run.proc.returncode == 0, run.stdout + run.stderr
    assert "dlerror none" in run.stdout
    got = results(run.stdout)
    assert {got[(way, "debug_kernel")] for way in WAYS} == {800}, run.stdout
    assert {got[(way, "ok_kernel")] for way in WAYS} == {0}, run.stdout
    assert run.fake_counts().get("debug_kernel", 0) == 0


def test_a_failed_deep_bound_dlopen_says_why_as_without_clc(deepbind, clc_run, run_native):
    # GIVEN a name that no directory holds, opened with RTLD_DEEPBIND
    argv = [deepbind / "prog_deepbind", "now", "libnothere.so"]
    alone = run_native(argv)
    run = clc_run(DENY_DEBUG, argv)
    # THEN dlopen fails under clc as without it, with libc's own message in dlerror()
    assert alone.returncode == run.proc.returncode == 2, run.stdout + run.stderr
    line = re.search(r"^dlopen failed: .*$", alone.stdout, re.M)[0]
    assert "libnothere.so" in line
    assert line in run.stdout.splitlines()

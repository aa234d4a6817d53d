# SPDX-License-Identifier: Apache-2.0
"""The fake driver checked against the real one. The programs of tests/fixtures/native, which
the CPU tests run over the fake libcuda.so.1, run here over the real driver too, natively and under
clc-run, and what they observe through the CUDA API (each call's CUresult, the names they are
given, the lines they print) must be what they observe over the fake.

Over the real driver the programs print no `fake:` counts and no line about where the fake ran
a launch (common.h's fake_hook finds no test hooks there), so those are left out of the
comparison; elapsed times are compared as present, not by value. Threads print in no fixed
order, so the lines are compared as a multiset per program. Where they differ, the fake is
wrong (or the program relies on something only the fake does) and is to be fixed there.
"""

import collections
import ctypes
import os
import re
import sys
from pathlib import Path

import pytest

from gpu_runs import REPO, run_program, describe

pytestmark = pytest.mark.gpu

# (program, arguments): the programs that need no companion library the fake alone provides
# and no stdin; each as the CPU tests run it ("{driver}": the path of the run's driver).
# prog_reload (a program of its own that prints handles) has its GPU twin in
# examples/reload.c, tests/gpu/test_trust_gpu.py. prog_green_program's `cudart` mode takes the
# primary context through a test hook of the fake's, which stands for the private table the
# real driver keeps for libcudart: it runs over the fake only.
PROGRAMS = [
    ("prog_cudart",),
    ("prog_triton",),
    ("prog_threads", "4"),
    ("prog_fork",),
    ("prog_teardown",),
    ("prog_graph_generic",),
    ("prog_params",),
    ("prog_life", "plain"),
    ("prog_life", "fill"),
    ("prog_green",),
    ("prog_green_program",),
    ("prog_green_threads",),
    ("prog_conditional",),
    ("prog_coop",),
    ("prog_path", "{driver}"),  # the driver opened by its path: the fake's, or the real one's
]

# Lines that say what the fake saw (its counters), never printed over a real driver; and the
# line that says which driver the process used (CLC_NATIVE_SAY_DRIVER).
FAKE_ONLY = re.compile(r"^(child: )?(fake:|fake-entry:|after-one-release destroyed=|"
                       r"order-violations |green-contexts |green-streams |driver: )")
DRIVER = re.compile(r"^(?:child: )?driver: (\w+)$", re.M)
GREEN = re.compile(r"^((?:child: )?green \S+ rc=-?\d+)( first=.*)?$")


def observed(text):
    """What a program observed through the API, as a multiset of lines."""
    lines = []
    for line in text.splitlines():
        if FAKE_ONLY.match(line):
            continue
        line = GREEN.sub(r"\1", line)
        line = re.sub(r"elapsed_ms=\S+", "elapsed_ms=*", line)
        lines.append(line)
    return collections.Counter(lines)


def difference(fake, real):
    only_fake = sorted((fake - real).elements())
    only_real = sorted((real - fake).elements())
    return "\n".join([f"- fake: {x}" for x in only_fake] + [f"+ real: {x}" for x in only_real])


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "native"))
    try:
        from build import build_native
    finally:
        sys.path.pop(0)
    out = tmp_path_factory.mktemp("native")
    build_native(out)
    return out


def over_fake(native_dir):
    return {"LD_LIBRARY_PATH": f"{native_dir}:{os.environ.get('LD_LIBRARY_PATH', '')}",
            "CLC_NATIVE_SAY_DRIVER": "1"}


def real_driver_dir():
    """The directory of the libcuda.so.1 this process loads (the real driver)."""
    ctypes.CDLL("libcuda.so.1")
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "/libcuda.so" in path:
                return str(Path(path).parent)
    pytest.fail("libcuda.so.1 is not mapped in this process")


def over_real():
    """Most programs carry an rpath to the fake's directory (build.py), which the loader
    searches before its cache: the real driver's directory goes first."""
    return {"LD_LIBRARY_PATH": f"{real_driver_dir()}:{os.environ.get('LD_LIBRARY_PATH', '')}",
            "CLC_NATIVE_SAY_DRIVER": "1"}


def run(argv, env=None, tmp=None, policy=None):
    if policy is None:
        return run_program(argv, env=env)
    clc_run = Path(sys.executable).parent / "clc-run"
    return run_program([clc_run, "--policy", policy, "-o", tmp / "cap.clc", "--force",
                        "--no-report", "-q", "--", *argv], env=env)


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: "-".join(p))
def test_the_fake_observes_what_the_real_driver_does(native_dir, program, tmp_path):
    def argv(driver_dir):
        return [native_dir / program[0],
                *(a.replace("{driver}", f"{driver_dir}/libcuda.so.1") for a in program[1:])]

    audit = REPO / "policies" / "audit.yaml"
    (tmp_path / "fake").mkdir()
    (tmp_path / "real").mkdir()
    on_fake, on_real = argv(native_dir), argv(real_driver_dir())
    fake = run(on_fake, env=over_fake(native_dir))
    real = run(on_real, env=over_real())
    fake_clc = run(on_fake, env=over_fake(native_dir), tmp=tmp_path / "fake", policy=audit)
    real_clc = run(on_real, env=over_real(), tmp=tmp_path / "real", policy=audit)
    # (each run had the driver it meant: the fake's runs the fake, the others the real one)
    for proc, want in ((fake, "fake"), (fake_clc, "fake"), (real, "real"), (real_clc, "real")):
        said = DRIVER.findall(proc.stdout)
        assert said and set(said) == {want}, (want, describe(proc))
    # THEN the program ends as it does over the fake, natively and under clc
    assert fake.returncode == 0, describe(fake)
    assert real.returncode == fake.returncode, describe(fake) + "\n\n" + describe(real)
    assert real_clc.returncode == real.returncode, describe(real_clc)
    assert fake_clc.returncode == fake.returncode, describe(fake_clc)
    # AND it observes the same results of the same calls
    assert observed(real.stdout) == observed(fake.stdout), (
        difference(observed(fake.stdout), observed(real.stdout)) + "\n\n" + describe(real))
    # AND clc under an audit policy changes nothing it observes, over either driver
    assert observed(real_clc.stdout) == observed(real.stdout), (
        difference(observed(real.stdout), observed(real_clc.stdout)))
    assert observed(fake_clc.stdout) == observed(fake.stdout), (
        difference(observed(fake.stdout), observed(fake_clc.stdout)))

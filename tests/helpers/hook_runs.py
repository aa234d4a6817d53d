# SPDX-License-Identifier: Apache-2.0
"""What the tests of Python hooks over the fake driver share (tests/integration/test_hooks*.py):
prog_params (tests/fixtures/native/prog_params.c) prints an `arg` line before every launch saying
what it passed; the hooks write what they read into a file named by $CLC_TEST_OUT, and the
tests compare the two. The run_params fixture is tests/integration/conftest.py's."""

import collections
import re
import textwrap

from harness import ROOT

VECADD = "_Z6vecAddPKfS0_Pfi"
STRUCT = "_Z9structArg5Pointf"
DEBUG = "_Z12debug_kernelPi"
KERNELS = (VECADD, STRUCT, DEBUG)
EXAMPLES = ROOT / "examples" / "hooks"

ALLOW_ALL = """\
version: 1
default: allow
on_error: allow
"""

COUNT = 12  # prog_params' vecAdd launches per form: 2*COUNT in all, COUNT distinct grids
LAUNCH_RE = re.compile(r"^launch (\S+) via (\S+) -> (-?\d+)$", re.M)


def kernel_of(name):
    """The mangled name of prog_params' kernel that a hook's launch.name (mangled or
    demangled) stands for."""
    for mangled, word in ((VECADD, "vecAdd"), (STRUCT, "structArg"), (DEBUG, "debug_kernel")):
        if word in name:
            return mangled
    raise AssertionError(f"a hook saw a kernel prog_params does not launch: {name!r}")


def write_hooks(tmp_path, body, name="hooks.py"):
    """A hook file: the helpers every test hook uses, then body."""
    path = tmp_path / name
    path.write_text(textwrap.dedent("""\
        import os

        import clc


        def log(*fields):
            # One line per call into $CLC_TEST_OUT, tab-separated (launch.name is the
            # demangled name, with spaces), appended at once.
            with open(os.environ["CLC_TEST_OUT"], "a") as f:
                f.write("\\t".join(str(x) for x in fields) + "\\n")

    """) + textwrap.dedent(body))
    return path


def logged(path):
    """The lines the hooks wrote, split into fields."""
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def launches(run):
    """(kernel, entry, rc) of every launch prog_params printed, in order."""
    return [(m[1], m[2], int(m[3])) for m in LAUNCH_RE.finditer(run.stdout)]


def args(run):
    """(kernel, {field: value}) of every `arg` line prog_params printed, in order."""
    return parse_args(run.stdout)


def parse_args(stdout):
    out = []
    for m in re.finditer(r"^arg (\S+) (.*)$", stdout, re.M):
        out.append((m[1], dict(kv.split("=", 1) for kv in m[2].split())))
    return out


def rcs(run, kernel):
    return [rc for k, _, rc in launches(run) if k == kernel]


def by_mangled(cap, attr):
    out = collections.Counter()
    for kid, stats in cap.stats.items():
        out[cap.kernels[kid].mangled] += getattr(stats, attr)
    return dict(out)


def ok(run):
    assert run.proc.returncode == 0, f"exit {run.proc.returncode}\n{run.stderr}"
    assert "fake:" in run.stdout, run.stderr

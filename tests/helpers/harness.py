# SPDX-License-Identifier: Apache-2.0
"""Helpers for running the shim in small C programs over the fake libcuda of tests/fixtures/native.

The fake driver only stands in for the GPU in CI, to exercise the shim's logic; everything
that touches a real driver is proven by tests/gpu on a GPU machine.
"""

import collections
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

from clc.capture.reader import read_captures
from clc.runtime.run_captures import capture_files
from policy_cases import deny_debug

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "native"))

from build import BuildError, cuda_include_dir  # noqa: E402  (tests/fixtures/native)

try:
    CUDA_INCLUDE = str(cuda_include_dir())
except BuildError:
    CUDA_INCLUDE = "/usr/local/cuda/include"  # gcc() then says what is missing


def gcc(out, source, name, *flags, shared=False):
    """source compiled against CUDA's cuda.h into out/name (a shared library if shared);
    skips the test where cuda.h is missing."""
    if not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda.h")):
        import pytest

        pytest.skip(f"no cuda.h under {CUDA_INCLUDE}")
    target = pathlib.Path(out) / name
    subprocess.run(["gcc", "-O2", *(["-shared", "-fPIC"] if shared else []), f"-I{CUDA_INCLUDE}",
                    "-o", target, source, *flags], check=True)
    return target


def fake_counts(stdout):
    """The fake driver's own count of direct launches per kernel, printed at exit."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^fake: (\S+) launches=(\d+)", stdout, re.M)}


def clc_command():
    script = pathlib.Path(sys.executable).parent / "clc-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "clc", "run"]


@dataclasses.dataclass
class Run:
    proc: subprocess.CompletedProcess
    output: pathlib.Path

    @property
    def stdout(self):
        return self.proc.stdout

    @property
    def stderr(self):
        return self.proc.stderr

    def captures(self):
        return read_captures(capture_files(self.output))

    def capture(self):
        (cap,) = self.captures()
        return cap

    def fake_counts(self):
        return fake_counts(self.stdout)

    def fake_graph_counts(self):
        return {m[1]: int(m[2]) for m in re.finditer(r"^fake: (\S+) launches=\d+ graph=(\d+)",
                                                     self.stdout, re.M)}

    def results(self):
        """(kernel, entry point) -> the CUresults the program printed for its launches and
        graph-node calls."""
        out = collections.defaultdict(list)
        verbs = r"(?!graph-)\S*launch|graph-add|graph-set|graph-exec-set"  # not graph-launch
        for m in re.finditer(rf"^({verbs}) (\S+) via (\S+) -> (-?\d+)", self.stdout, re.M):
            out[(m[2], m[3])].append(int(m[4]))
        return out

    def attempts(self):
        """kernel -> direct launches the program attempted, whatever their result."""
        out = collections.Counter()
        for (kernel, entry), results in self.results().items():
            if not entry.startswith("cuGraph"):
                out[kernel] += len(results)
        return dict(out)


def env_for(native, extra=None):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(native["libcuda"].parent)
    env.pop("CLC_TENANT", None)
    env.update(extra or {})
    return env


AUDIT = (ROOT / "policies" / "audit.yaml").read_text()
TIME_ALL = (ROOT / "policies" / "time-all.yaml").read_text()
# Denies debug kernels and nothing else, records nothing.
DENY_DEBUG_ONLY = deny_debug()
DENY_DEBUG = deny_debug(message="debug kernels are not allowed here", record_rest=True)


def exec_results(run):
    """The CUresults of the launches prog_life's executed image made (`launch K via exec`), from
    a Run or a CompletedProcess."""
    return [int(m[1]) for m in re.finditer(r"^launch \S+ via exec -> (-?\d+)$", run.stdout, re.M)]


def kernel_launches(capture):
    """mangled name -> launches the shim counted (attempts: denied and failed ones included)."""
    out = collections.Counter()
    for kid, stats in capture.stats.items():
        out[capture.kernels[kid].mangled] += stats.launches
    return dict(out)


def executed(capture):
    """mangled name -> launches that reached the GPU: what the driver itself counts."""
    out = collections.Counter()
    for kid, stats in capture.stats.items():
        out[capture.kernels[kid].mangled] += stats.launches - stats.denied - stats.failed
    return {k: v for k, v in out.items() if v}


def nonzero(counts):
    return {k: v for k, v in counts.items() if v}

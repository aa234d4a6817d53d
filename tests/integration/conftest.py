# SPDX-License-Identifier: Apache-2.0
"""The shim preloaded into small C programs over the fake libcuda of tests/native.

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

import pytest

from clc.capture import read_captures
from clc.commands.run import capture_files
from clc.shim import bridge_path, preload_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "native"))

from build import build_native  # noqa: E402


@pytest.fixture(scope="session")
def native(tmp_path_factory):
    if preload_path() is None or bridge_path() is None:
        pytest.fail("the shim is not built: run the tests through `make test` (pip install -e .)")
    return build_native(tmp_path_factory.mktemp("native"))


def clc_command():
    script = pathlib.Path(sys.executable).parent / "clc-run"
    return [str(script)] if script.exists() else [sys.executable, "-m", "clc.cli", "run"]


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
        """The fake driver's own count of direct launches per kernel, printed at exit."""
        return {m[1]: int(m[2]) for m in re.finditer(r"^fake: (\S+) launches=(\d+)", self.stdout,
                                                     re.M)}

    def fake_graph_counts(self):
        return {m[1]: int(m[2]) for m in re.finditer(r"^fake: (\S+) launches=\d+ graph=(\d+)",
                                                     self.stdout, re.M)}

    def results(self):
        """(kernel, entry point) -> list of CUresults the program saw."""
        out = collections.defaultdict(list)
        for m in re.finditer(r"^launch (\S+) via (\S+) -> (-?\d+)", self.stdout, re.M):
            out[(m[1], m[2])].append(int(m[3]))
        return out


def env_for(native, extra=None):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(native["libcuda"].parent)
    env.pop("CLC_TENANT", None)
    env.update(extra or {})
    return env


@pytest.fixture
def clc_run(native, tmp_path):
    """Run argv under clc-run with a policy given as YAML text."""

    def run(policy, argv, *, options=(), env=None, timeout=120, output=None):
        output = output or tmp_path / "cap.clc"
        cmd = clc_command()
        if policy is not None:
            policy_file = tmp_path / "policy.yaml"
            policy_file.write_text(policy)
            cmd += ["--policy", str(policy_file)]
        cmd += ["-o", str(output), "--force", *options, "--", *map(str, argv)]
        proc = subprocess.run(cmd, env=env_for(native, env), capture_output=True, text=True,
                              timeout=timeout, cwd=tmp_path)
        return Run(proc, output)

    return run


@pytest.fixture
def run_native(native):
    def run(argv, env=None, timeout=120):
        return subprocess.run([str(a) for a in argv], env=env_for(native, env),
                              capture_output=True, text=True, timeout=timeout)

    return run


AUDIT = (ROOT / "policies" / "audit.yaml").read_text()
TIME_ALL = (ROOT / "policies" / "time-all.yaml").read_text()
DENY_DEBUG = """\
version: 1
default: allow
rules:
  - name: no-debug
    match: {kernel: "*debug*"}
    action: deny
    message: "debug kernels are not allowed here"
  - name: record-rest
    match: {kernel: "*"}
    action: allow
    record: true
"""


def kernel_launches(capture):
    """mangled name -> launches counted by the shim (from the exit statistics)."""
    out = collections.Counter()
    for kid, stats in capture.stats.items():
        out[capture.kernels[kid].mangled] += stats.launches
    return dict(out)

# SPDX-License-Identifier: Apache-2.0
"""benchmarks/ab_inproc.py over the fake driver: two builds of clc, each run from its own tree,
compared in pairs (the figures themselves mean something only on a GPU)."""

import json
import shutil
import statistics
import subprocess
import sys

import pytest

from harness import ROOT, env_for

SCRIPT = ROOT / "benchmarks" / "ab_inproc.py"


@pytest.fixture
def before_tree(tmp_path):
    """A copy of this tree's clc, its shim already built, as a second build to compare."""
    tree = tmp_path / "before"
    shutil.copytree(ROOT / "clc", tree / "clc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.py", tree / "setup.py")
    return tree


def ab(native, *args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], env=env_for(native),
                          capture_output=True, text=True, timeout=300)


def test_two_builds_are_compared_in_pairs(native, bench_inproc, before_tree, tmp_path):
    out = tmp_path / "ab.json"
    proc = ab(native, "--before", before_tree, "--pairs", 3, "--program", bench_inproc,
              "--json", out, "--", 20, 50)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 pairs, order alternating" in proc.stdout
    assert f"before: {before_tree}" in proc.stdout and f"after: {ROOT}" in proc.stdout
    assert "| before |" in proc.stdout and "| after |" in proc.stdout
    data = json.loads(out.read_text())
    added = data["added"]
    assert len(added["before"]) == len(added["after"]) == 3
    diffs = [a - b for a, b in zip(added["after"], added["before"])]
    assert data["summary"]["diff_mean"] == pytest.approx(statistics.mean(diffs))
    assert data["summary"]["builds"]["before"]["median"] == statistics.median(added["before"])
    assert f"mean {statistics.mean(diffs):+.1f} ns" in proc.stdout


def test_each_build_runs_from_its_own_tree(native, bench_inproc, before_tree):
    # GIVEN a before tree whose clc-run fails in a way of its own
    run_py = before_tree / "clc" / "cli" / "run.py"
    run_py.write_text(run_py.read_text().replace(
        "def main(argv=None):\n",
        "def main(argv=None):\n    raise SystemExit('the before tree ran')\n", 1))
    proc = ab(native, "--before", before_tree, "--pairs", 2, "--program", bench_inproc,
              "--", 20, 50)
    # THEN its runs are the ones that fail, with the tree's own message
    assert proc.returncode != 0
    assert "ab_inproc: a run failed" in proc.stderr
    assert "the before tree ran" in proc.stderr


def test_a_folder_that_is_not_clc_is_refused(native, tmp_path):
    proc = ab(native, "--before", tmp_path, "--pairs", 2)
    assert proc.returncode != 0
    assert f"ab_inproc: {tmp_path} is not a source tree of clc" in proc.stderr


def test_an_unknown_policy_is_refused_before_anything_is_built(native, tmp_path):
    proc = ab(native, "--before", tmp_path, "--policy", "nonsense", "--pairs", 2)
    assert proc.returncode != 0
    assert "--policy nonsense: expected allow, record or a policy file" in proc.stderr
    assert "is not a source tree" not in proc.stderr

# SPDX-License-Identifier: Apache-2.0
"""`clc report FILE` reads the captures clc-run wrote beside FILE for the same run (its child
processes', its re-executed programs'), as clc-run's own summary does; --no-children reads the
file alone. Captures left by an earlier run under the same names are not this run's."""

import os
import re
import subprocess
import sys

from harness import AUDIT


def report(*args):
    return subprocess.run([sys.executable, "-m", "clc", "report", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def total(text):
    return int(re.search(r"^\s*(\d+)\s.*Total \(", text, re.M)[1])


def test_a_report_of_the_programs_capture_covers_its_children(native, clc_run, tmp_path):
    # GIVEN a run whose program launches, forks two children that launch, and launches more
    run = clc_run(AUDIT, [native["prog_fork"], "plain", "2"])
    assert run.proc.returncode == 0, run.stderr
    children = sorted(tmp_path.glob("cap.child-*.clc"))
    assert len(children) == 2
    # WHEN its capture is reported
    whole = report(run.output)
    alone = report(run.output, "--no-children")
    # THEN the report counts every launch of the run, as clc-run's own summary did, and says it
    # read the children; --no-children counts the program's own
    assert whole.returncode == 0 and alone.returncode == 0, whole.stderr + alone.stderr
    assert total(whole.stdout) == total(run.stderr)
    assert "with 2 captures clc-run wrote beside it for the same run" in whole.stderr
    own = sum(s.launches for s in run.captures()[0].stats.values())
    assert total(alone.stdout) == own < total(whole.stdout)
    # AND a child named as well is read once
    again = report(run.output, children[0])
    assert total(again.stdout) == total(whole.stdout)


def test_an_earlier_runs_children_are_not_this_runs(native, clc_run, tmp_path):
    # GIVEN a capture beside which lies, under its children's name, an earlier run's child
    clc_run(AUDIT, [native["prog_fork"], "plain", "1"])
    old = next(tmp_path.glob("cap.child-*.clc"))
    later = clc_run(AUDIT, [native["prog_params"], "2"], output=tmp_path / "later.clc")
    own = sum(s.launches for s in later.capture().stats.values())
    os.rename(old, tmp_path / "later.child-1.clc")
    # WHEN the later capture is reported
    proc = report(later.output)
    # THEN the earlier run's child is left out
    assert proc.returncode == 0, proc.stderr
    assert "beside it" not in proc.stderr
    assert total(proc.stdout) == own

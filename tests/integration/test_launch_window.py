# SPDX-License-Identifier: Apache-2.0
"""clc-run --launch-skip and --launch-count limit what a long program's capture holds, as ncu's
-s and -c do: of the launches the policy records or times, each process writes the records of
only those in the window, and counts every one."""

import subprocess
import sys

from harness import AUDIT, DENY_DEBUG, TIME_ALL


def test_only_the_window_is_recorded_and_every_launch_counted(native, clc_run):
    # GIVEN a program making 25 launches (20 of vecAdd, 2 of structArg, 3 of debug_kernel),
    # all of which the policy records
    run = clc_run(AUDIT, [native["prog_params"], "10"],
                  options=["--launch-skip", "5", "--launch-count", "7"])
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    # THEN the capture holds the records of the 6th to the 12th launch and counts all 25
    assert [ln.seq for ln in cap.launches] == list(range(5, 12))
    assert sum(s.launches for s in cap.stats.values()) == 25
    assert sum(s.recorded for s in cap.stats.values()) == 7
    # AND it says which window it wrote, in the run's record the reports show
    assert cap.run["launch_window"] == {"skip": 5, "count": 7}


def test_timed_launches_outside_the_window_are_not_timed(native, clc_run):
    run = clc_run(TIME_ALL, [native["prog_params"], "10"], options=["--launch-count", "3"])
    assert run.proc.returncode == 0, run.stderr
    cap = run.capture()
    assert sum(s.timed for s in cap.stats.values()) == 3
    assert len(cap.launches) == 3
    assert sum(s.launches for s in cap.stats.values()) == 25


def test_denied_launches_are_recorded_for_audit_whatever_the_window(native, clc_run):
    # GIVEN a window that starts past every launch, under a policy that denies debug kernels
    run = clc_run(DENY_DEBUG, [native["prog_params"], "10"], options=["--launch-skip", "1000"])
    cap = run.capture()
    # THEN the three refused launches are still recorded, as every policy records denials
    denied = [ln for ln in cap.launches if ln.result == 800]
    assert len(denied) == 3 and len(cap.launches) == 3


def test_a_window_that_is_not_a_count_is_refused(tmp_path):
    for option, value in (("--launch-count", "0"), ("--launch-skip", "-1"),
                          ("--launch-count", "many")):
        p = subprocess.run([sys.executable, "-m", "clc", "run", option, value, "--", "true"],
                           capture_output=True, text=True, cwd=tmp_path)
        assert p.returncode == 2 and f"argument {option}: '{value}': expected a whole number" \
            in p.stderr, p.stderr

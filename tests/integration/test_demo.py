# SPDX-License-Identifier: Apache-2.0
"""`clc demo --no-gpu` shows what clc does on a machine with no GPU: a sample program run under
clc twice, over the stand-in driver that the install built, with the real reports."""

import subprocess
import sys

from clc.capture.reader import read_capture


def demo(*args, cwd):
    return subprocess.run([sys.executable, "-m", "clc", "demo", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_the_demo_runs_a_program_under_two_policies_and_reports(tmp_path):
    # WHEN a newcomer runs the demo
    proc = demo("--no-gpu", "-o", str(tmp_path / "demo"), "--steps", "100", cwd=tmp_path)
    # THEN it ends well, the program's debug kernel ran under the first policy and was refused
    # under the second, and each run's report was printed
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo_app: debug_kernel    2 launched\n" in proc.stdout
    assert "demo_app: debug_kernel    0 launched, 2 refused (CUDA_ERROR_NOT_PERMITTED)" \
        in proc.stdout
    assert proc.stderr.count("Total (4 kernels)") == 2
    assert "denied by rule 'no-debug-kernels'" in proc.stderr
    # AND the captures it names are there, with what the reports said
    audit = read_capture(tmp_path / "demo" / "audit.clc")
    policy = read_capture(tmp_path / "demo" / "policy.clc")
    assert sum(s.launches for s in audit.stats.values()) == 302
    assert sum(s.denied for s in policy.stats.values()) == 2
    assert f"clc report {tmp_path / 'demo' / 'policy.clc'}" in proc.stdout


def test_the_demo_writes_only_into_a_new_directory(tmp_path):
    (tmp_path / "demo").mkdir()
    proc = demo("--no-gpu", "-o", str(tmp_path / "demo"), cwd=tmp_path)
    assert proc.returncode != 0
    assert "exists: the demo writes into a new directory" in proc.stderr
    assert list((tmp_path / "demo").iterdir()) == []

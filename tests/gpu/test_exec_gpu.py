# SPDX-License-Identifier: Apache-2.0
"""Processes started past clc's exec hooks, and a signal handler's launches, over the real
driver: the fake driver's prog_life (tests/fixtures/native) run with the real libcuda.so.1.

- A forked child that closes every descriptor and runs a CUDA program by syscall(SYS_execve)
  keeps the policy; by the execve instruction it has no settings and fails closed; without
  LD_PRELOAD, clc-run finds it loading the real driver (its library and /dev/nvidia* mapped).
- A run of ordinary programs names no process that loaded the driver without the shim.
- A signal handler that launches kernels not decided yet under on_error: allow, while its thread
  loads modules and makes first sights, does not hang the program, and every launch that ran is
  counted.
"""

import re
import sys
from pathlib import Path

import pytest

from gpu_runs import REPO, describe, run_program
from harness import DENY_DEBUG_ONLY as DENY_DEBUG, exec_results
from test_fake_fidelity import native_dir, over_real  # noqa: F401 (native_dir: a fixture)

pytestmark = pytest.mark.gpu

UNSEEN = "loaded the CUDA driver without clc's shim"
NO_SETTINGS = "ran without clc-run's settings"


def clc_run(policy_text, argv, tmp_path, options=(), timeout=120):
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text)
    clc_run = Path(sys.executable).parent / "clc-run"
    return run_program([clc_run, "--policy", policy, "-o", tmp_path / "cap.clc", "--force",
                        *options, "--", *map(str, argv)], env=over_real(), timeout=timeout)


def test_syscall_execve_keeps_the_policy_on_the_real_driver(native_dir, tmp_path):  # noqa: F811
    proc = clc_run(DENY_DEBUG, [native_dir / "prog_life", "rawexec", "syscall_nopreload", "10"],
                   tmp_path, ["--strict"])
    assert exec_results(proc) == [800] * 10, describe(proc)
    assert proc.returncode == 3 and UNSEEN not in proc.stderr, describe(proc)


def test_a_process_without_settings_fails_closed_on_the_real_driver(native_dir,  # noqa: F811
                                                                     tmp_path):
    proc = clc_run(DENY_DEBUG, [native_dir / "prog_life", "rawexec", "asm", "10"], tmp_path,
                   ["--strict"])
    assert exec_results(proc) == [800] * 10, describe(proc)
    assert NO_SETTINGS in proc.stderr and proc.returncode == 3, describe(proc)


def test_the_real_driver_loaded_without_the_shim_fails_strict(native_dir, tmp_path):  # noqa: F811
    proc = clc_run(DENY_DEBUG, [native_dir / "prog_life", "rawexec", "asm_nopreload", "10"],
                   tmp_path, ["--strict"])
    assert exec_results(proc) == [0] * 10, describe(proc)
    assert UNSEEN in proc.stderr and proc.returncode == 3, describe(proc)


@pytest.mark.parametrize("program", [("prog_life", "plain", "5"), ("prog_fork",),
                                     ("prog_threads", "4")], ids=lambda p: p[0])
def test_ordinary_programs_name_no_unseen_process(native_dir, program, tmp_path):  # noqa: F811
    audit = (REPO / "policies" / "audit.yaml").read_text()
    proc = clc_run(audit, [native_dir / program[0], *program[1:]], tmp_path, ["--strict"])
    assert UNSEEN not in proc.stderr and NO_SETTINGS not in proc.stderr, describe(proc)
    assert "ran without clc's shim" not in proc.stderr, describe(proc)
    # prog_fork's child launches after the fork, which the driver refuses and clc cannot name:
    # those launches fall to on_error, which --strict fails, and nothing else does
    fork = program[0] == "prog_fork"
    assert proc.returncode == (3 if fork else 0), describe(proc)
    if fork:
        assert proc.stderr.split("--strict: ")[-1].startswith("3 launches fell to on_error"), \
            describe(proc)


def test_a_signal_handlers_on_error_launches_are_all_counted(native_dir, tmp_path):  # noqa: F811
    from clc.capture.reader import read_captures

    policy = DENY_DEBUG.replace("default: allow\n", "default: allow\non_error: allow\n")
    # 200 denied kernels: each is a PTX load the real driver compiles, under a signal every
    # 20 us whose handler launches kernels not decided yet. Without clc this program hangs in
    # the real driver (a handler's launch inside the driver's module load); clc's load hook
    # holds the signal across the driver's work
    proc = clc_run(policy, [native_dir / "prog_life", "signals_fresh", "200"], tmp_path,
                   timeout=180)
    m = re.search(r"^signals: launches=(\d+) refused=(\d+) ran=(\d+)$", proc.stdout, re.M)
    main = re.search(r"^signals-main: launches=(\d+)$", proc.stdout, re.M)
    assert m and main and proc.returncode == 0, describe(proc)
    (cap,) = read_captures([tmp_path / "cap.clc"])
    assert cap.on_error_launches == int(m[3]), describe(proc)
    assert cap.rule_stats.get(0, 0) == int(m[2]) + int(main[1]), describe(proc)

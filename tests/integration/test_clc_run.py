# SPDX-License-Identifier: Apache-2.0
"""clc-run as a process: what it passes on to the program and back to its caller."""

import os
import re
import signal
import subprocess

from harness import clc_command, env_for


def run(native, argv, *options, cwd=None, env=None):
    return subprocess.run(clc_command() + list(options) + ["--", *map(str, argv)],
                          env=env_for(native, env), capture_output=True, text=True, timeout=60,
                          cwd=cwd)


def test_exit_status_is_passed_on(native, tmp_path):
    proc = run(native, ["sh", "-c", "exit 3"], "-o", str(tmp_path / "c.clc"))
    assert proc.returncode == 3


def test_death_by_signal_is_128_plus_n(native, tmp_path):
    proc = run(native, ["sh", "-c", "kill -KILL $$"], "-o", str(tmp_path / "c.clc"))
    assert proc.returncode == 128 + signal.SIGKILL


def test_sigterm_is_forwarded(native, tmp_path):
    # GIVEN a program that reports SIGTERM and exits 7 on it
    script = 'trap "echo got-term; exit 7" TERM; echo ready; while :; do sleep 0.05; done'
    proc = subprocess.Popen(clc_command() + ["-o", str(tmp_path / "c.clc"), "--", "sh", "-c",
                                             script],
                            env=env_for(native), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    # WHEN clc-run alone is sent SIGTERM
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    # THEN the program got it, and its status comes back
    assert "got-term" in out
    assert proc.returncode == 7


def test_ld_preload_is_prepended_not_replaced(native, tmp_path):
    proc = run(native, ["sh", "-c", 'echo "$LD_PRELOAD"'], "-o", str(tmp_path / "c.clc"),
               env={"LD_PRELOAD": "libm.so.6"})
    first, second = proc.stdout.strip().split(":")
    assert first.endswith("libclc_preload.so") and second == "libm.so.6"


def test_existing_capture_is_not_overwritten(native, tmp_path):
    out = tmp_path / "c.clc"
    out.write_bytes(b"keep me")
    marker = tmp_path / "ran"
    proc = run(native, ["touch", marker], "-o", str(out))
    assert proc.returncode == 2
    assert "exists" in proc.stderr and "--force" in proc.stderr
    assert out.read_bytes() == b"keep me"
    assert not marker.exists()


def test_bad_policy_stops_before_the_program_starts(native, tmp_path):
    policy = tmp_path / "bad.yaml"
    policy.write_text("version: 1\nrules:\n  - match: {kernel: '*'}\n    action: alow\n")
    marker = tmp_path / "ran"
    proc = run(native, ["touch", marker], "--policy", str(policy), "-o", str(tmp_path / "c.clc"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"clc: {policy}:4:13: unknown action 'alow'")
    assert not marker.exists()


def test_missing_program_is_127(native, tmp_path):
    proc = run(native, [tmp_path / "no-such-program"], "-o", str(tmp_path / "c.clc"))
    assert proc.returncode == 127
    assert "cannot run" in proc.stderr and "No such file" in proc.stderr


def test_default_capture_name_holds_program_and_pid(native, tmp_path):
    proc = run(native, [native["prog_triton"]], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (capture,) = tmp_path.glob("clc-prog_triton.*.clc")
    pid = int(capture.name.split(".")[1])
    assert int.from_bytes(capture.read_bytes()[16:20], "little") == pid
    # The closing lines name the file and the command that turns it into a timeline.
    assert f"capture written to {capture}" in proc.stderr
    assert f"clc report {capture} --format chrome" in proc.stderr


def test_program_without_cuda_writes_no_capture(native, tmp_path):
    proc = run(native, ["true"], "-o", str(tmp_path / "c.clc"))
    assert proc.returncode == 0
    assert not (tmp_path / "c.clc").exists()
    assert "launched no kernel" in proc.stderr


def test_tenant_reaches_the_policy(native, tmp_path):
    policy = tmp_path / "tenant.yaml"
    policy.write_text('version: 1\nrules:\n  - match: {tenant: "b"}\n    action: deny\n')
    out_a = run(native, [native["prog_triton"]], "--policy", str(policy), "--tenant", "a",
                "-o", str(tmp_path / "a.clc"))
    out_b = run(native, [native["prog_triton"]], "--policy", str(policy), "--tenant", "b",
                "-o", str(tmp_path / "b.clc"))
    launches_a = re.findall(r"^launch \S+ via \S+ -> (\d+)$", out_a.stdout, re.M)
    launches_b = re.findall(r"^launch \S+ via \S+ -> (\d+)$", out_b.stdout, re.M)
    assert launches_a and set(launches_a) == {"0"}
    assert launches_b and set(launches_b) == {"800"}


def test_verbose_logs_from_the_shim(native, tmp_path):
    proc = run(native, [native["prog_cudart"]], "-v", "-o", str(tmp_path / "c.clc"))
    # One -v: the shim says what it hooked, the engine what it decided
    assert "clc: hooked cuLaunchKernel_ptsz" in proc.stderr
    assert re.search(r"^clc: first sight of vecAdd\(float const\*, float const\*, float\*, int\) "
                     r"on device 0: allow \(record\) by record-all$", proc.stderr, re.M), proc.stderr
    assert os.path.exists(tmp_path / "c.clc")

# SPDX-License-Identifier: Apache-2.0
"""clc-run as a process: what it passes on to the program and back to its caller."""

import os
import re
import signal
import subprocess

import pytest
from harness import clc_command, env_for
from policy_cases import deny_debug


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


def test_the_tenant_and_labels_are_kept_in_the_capture(native, tmp_path):
    from clc.capture.reader import read_captures
    out = tmp_path / "l.clc"
    proc = run(native, [native["prog_triton"]], "--tenant", "physics", "--label", "job=42",
               "--label", "step=batch", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    (cap,) = read_captures([str(out)])
    assert cap.run == {"tenant": "physics", "uid": os.getuid(),
                       "labels": {"job": "42", "step": "batch"}}


@pytest.mark.parametrize("label", ["job", "1job=2", "job=", "a-b=1", "j=" + "x" * 257])
def test_a_bad_label_is_refused_before_the_program_starts(native, tmp_path, label):
    proc = run(native, ["sh", "-c", "echo ran"], "--label", label, "-o", str(tmp_path / "b.clc"))
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert "--label: " in proc.stderr and "expected" in proc.stderr, proc.stderr


def test_verbose_logs_from_the_shim(native, tmp_path):
    proc = run(native, [native["prog_cudart"]], "-v", "-o", str(tmp_path / "c.clc"))
    # One -v: the shim says what it hooked, the engine what it decided
    assert "clc: hooked cuLaunchKernel_ptsz" in proc.stderr
    assert re.search(r"^clc: first sight of vecAdd\(float const\*, float const\*, float\*, int\) "
                     r"on device 0: allow \(record\) by record-all$", proc.stderr, re.M), \
        proc.stderr
    assert os.path.exists(tmp_path / "c.clc")


DENY_DEBUG = deny_debug(on_error="deny")

ALLOW_ALL = "version: 1\ndefault: allow\non_error: deny\n"


def _policy(tmp_path, text):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_strict_fails_a_run_whose_launches_were_denied(native, tmp_path):
    # GIVEN a program that launches a debug kernel and exits 0, under a policy that denies it
    proc = run(native, [native["prog_cudart"]], "--strict", "--policy",
               _policy(tmp_path, DENY_DEBUG), "-o", str(tmp_path / "c.clc"), cwd=tmp_path)
    # THEN clc-run exits 3 and says why
    assert proc.returncode == 3, proc.stderr
    assert re.search(r"^clc: --strict: 2 launches or graph-node calls denied; exit status 3$",
                     proc.stderr, re.M), proc.stderr


def test_strict_passes_a_run_with_nothing_refused(native, tmp_path):
    proc = run(native, [native["prog_cudart"]], "--strict", "--policy",
               _policy(tmp_path, ALLOW_ALL), "-o", str(tmp_path / "c.clc"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "--strict" not in proc.stderr


def test_strict_keeps_a_failing_programs_own_status(native, tmp_path):
    proc = run(native, ["sh", "-c", f"{native['prog_cudart']}; exit 5"], "--strict",
               "--policy", _policy(tmp_path, DENY_DEBUG), "-o", str(tmp_path / "c.clc"),
               cwd=tmp_path)
    assert proc.returncode == 5, proc.stderr


def test_strict_fails_a_program_clc_never_saw(native, tmp_path):
    # GIVEN a static program (the dynamic loader never preloads clc's shim into it)
    src = tmp_path / "static.c"
    src.write_text("int main(void) { return 0; }\n")
    static = tmp_path / "static"
    built = subprocess.run(["gcc", "-static", "-o", str(static), str(src)], capture_output=True,
                           text=True)
    if built.returncode != 0:
        pytest.skip(f"no static C library here: {built.stderr.strip()[:200]}")
    proc = run(native, [static], "--strict", "-o", str(tmp_path / "c.clc"), cwd=tmp_path)
    # THEN clc-run cannot vouch for it
    assert proc.returncode == 3, proc.stderr
    assert "clc's shim never started" in proc.stderr


def test_an_earlier_runs_child_captures_are_not_reported(native, tmp_path):
    # GIVEN a child capture left by an earlier run under the name this run's children use
    out = tmp_path / "c.clc"
    first = run(native, ["sh", "-c", f"{native['prog_cudart']}"], "-o", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    stale = sorted(tmp_path.glob("c.child-*.clc"))
    assert stale, first.stderr
    # WHEN the same command runs again over it
    again = run(native, ["sh", "-c", f"{native['prog_cudart']}"], "-o", str(out), "--force",
                cwd=tmp_path)
    # THEN its summary counts its own launches only
    assert again.returncode == 0, again.stderr
    totals = [re.search(r"^\s*(\d+)\s.*Total", p.stderr, re.M) for p in (first, again)]
    assert totals[0] and totals[1] and totals[0][1] == totals[1][1], again.stderr
    for path in stale:
        assert str(path) not in again.stderr


def test_launches_left_to_on_error_are_recorded_and_fail_strict(native, tmp_path):
    # GIVEN a hook that raises for every kernel, and on_error: allow
    hooks = tmp_path / "hooks.py"
    hooks.write_text("import clc\n\n@clc.on_launch\ndef broken(launch):\n"
                     "    raise RuntimeError('broken hook')\n")
    policy = _policy(tmp_path, "version: 1\ndefault: allow\non_error: allow\n")
    proc = run(native, [native["prog_cudart"]], "--strict", "--policy", policy, "--hooks",
               str(hooks), "-o", str(tmp_path / "c.clc"), cwd=tmp_path)
    # THEN the launches ran, and the report and --strict say that clc did not decide them
    m = re.search(r"^Fell to on_error: (\d+) launches that clc could not decide", proc.stderr,
                  re.M)
    assert m and int(m[1]) > 0, proc.stderr
    assert re.search(rf"^clc: --strict: {m[1]} launches fell to on_error; exit status 3$",
                     proc.stderr, re.M), proc.stderr
    assert proc.returncode == 3


def test_no_capture_enforces_the_policy_and_writes_nothing(native, tmp_path):
    # GIVEN --no-capture and a policy that denies debug kernels
    proc = run(native, [native["prog_cudart"]], "--no-capture", "--policy",
               _policy(tmp_path, DENY_DEBUG), cwd=tmp_path)
    # THEN the debug kernel is refused, and no capture or summary appears
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^launch \S*debug\S* via \S+ -> 800$", proc.stdout, re.M), proc.stdout
    assert not list(tmp_path.glob("*.clc"))
    assert "capture written" not in proc.stderr and "Launches" not in proc.stderr


def test_no_capture_refuses_what_needs_a_capture(native, tmp_path):
    for option in (["--strict"], ["-o", str(tmp_path / "c.clc")]):
        proc = run(native, ["true"], "--no-capture", *option, cwd=tmp_path)
        assert proc.returncode == 2
        assert "--no-capture writes no capture" in proc.stderr


def test_quiet_prints_only_where_the_capture_is(native, tmp_path):
    proc = run(native, [native["prog_cudart"]], "-q", "-o", str(tmp_path / "c.clc"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"clc: capture written to {tmp_path / 'c.clc'}"
    assert "Launches" not in proc.stderr


def test_the_closing_hint_names_the_childrens_captures_too(native, tmp_path):
    # GIVEN a program whose two children each launch kernels
    out = tmp_path / "c.clc"
    proc = run(native, ["sh", "-c", f"{native['prog_cudart']} && {native['prog_cudart']}"],
               "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # THEN the closing lines say how many captures there are, and the timeline command takes
    # them all
    children = sorted(tmp_path.glob("c.child-*.clc"))
    assert len(children) == 2
    assert re.search(rf"^clc: captures written to {re.escape(str(children[0]))} and 1 more, of "
                     rf"child processes \({re.escape(str(tmp_path / 'c'))}\*\.clc\)$",
                     proc.stderr, re.M), proc.stderr
    assert f"clc: timeline: clc report {tmp_path / 'c'}*.clc --format chrome -o c.json" in \
        proc.stderr

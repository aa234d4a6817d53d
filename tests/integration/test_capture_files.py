# SPDX-License-Identifier: Apache-2.0
"""The capture file: never written into the program's files or through links, checked before
the program starts, bounded, and honest about what it lost."""

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from clc.capture.reader import gpu_uuid
from harness import AUDIT, DENY_DEBUG, clc_command, env_for


def summary(run):
    m = re.search(r"^summary (.*)$", run.stdout, re.M)
    assert m, run.stdout + run.stderr
    return {k: int(v) for k, v in (kv.split("=") for kv in m[1].split())}


def test_a_program_that_closes_and_reuses_descriptors_keeps_its_file(native, clc_run, tmp_path):
    # GIVEN a program that, halfway through its launches, closes descriptors 3..1023, opens a
    # file of its own (which may get the number clc's file had) and writes 8 bytes into it
    own = tmp_path / "mine.txt"
    run = clc_run(AUDIT, [native["prog_reload"], "module", "400", f"own-file={own}"])
    assert run.proc.returncode == 0, run.stdout + run.stderr
    # THEN its file holds only what it wrote
    assert own.read_bytes() == b"my data\n"
    assert "own-file-size=8" in run.stdout
    # AND the capture has every launch, before and after
    cap = run.capture()
    assert cap.complete
    assert len(cap.launches) == 400
    assert sum(st.launches for st in cap.stats.values()) == 400


def run_clc(native, tmp_path, *args, env=None):
    return subprocess.run(clc_command() + list(map(str, args)), env=env_for(native, env),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def test_a_missing_output_folder_stops_before_the_program_runs(native, tmp_path):
    marker = tmp_path / "ran"
    proc = run_clc(native, tmp_path, "-o", tmp_path / "nope" / "cap.clc", "--", "sh", "-c",
                   f"touch {marker}")
    assert proc.returncode == 2, proc.stderr
    assert "the folder" in proc.stderr and "does not exist" in proc.stderr
    assert not marker.exists()


def test_a_link_at_the_output_is_refused_even_with_force(native, tmp_path):
    # GIVEN another user's file, and a link to it planted where the capture would go
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "cap.clc"
    link.symlink_to(victim)
    marker = tmp_path / "ran"
    # WHEN clc-run is asked to overwrite the capture
    proc = run_clc(native, tmp_path, "-o", link, "--force", "--", "sh", "-c", f"touch {marker}")
    # THEN it refuses before the program starts, and the link's target is untouched
    assert proc.returncode == 2, proc.stderr
    assert "symbolic link" in proc.stderr
    assert victim.read_text() == "precious\n" and not marker.exists()
    # AND a dangling link is refused the same way
    link.unlink()
    link.symlink_to(tmp_path / "nowhere")
    proc = run_clc(native, tmp_path, "-o", link, "--force", "--", "true")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr
    assert not (tmp_path / "nowhere").exists()


OTHER_UID = 12345


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")
def test_another_users_link_in_the_middle_of_the_path_is_refused(native, tmp_path):
    # GIVEN a world-writable sticky folder (as /tmp) where another user planted a link to the
    # victim's folder, and the victim's file there
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    home = tmp_path / "home"
    home.mkdir()
    victim = home / "cap.clc"
    victim.write_text("precious\n")
    link = shared / "run"
    link.symlink_to(home)
    os.lchown(link, OTHER_UID, OTHER_UID)
    marker = tmp_path / "ran"
    # WHEN clc-run is asked to write its capture through that link, with --force
    proc = run_clc(native, tmp_path, "-o", link / "cap.clc", "--force", "--", "sh", "-c",
                   f"touch {marker}")
    # THEN it refuses before the program starts, naming the link, and the file is untouched
    assert proc.returncode == 2, proc.stderr
    assert "owned by uid 12345" in proc.stderr and "links other users control" in proc.stderr
    assert victim.read_text() == "precious\n" and not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's files needs root")
def test_another_users_file_at_the_output_is_never_written(native, tmp_path):
    # GIVEN a mode-0666 file that another user made where the capture would go
    planted = tmp_path / "cap.clc"
    planted.write_text("theirs\n")
    planted.chmod(0o666)
    os.chown(planted, OTHER_UID, OTHER_UID)
    # WHEN clc-run is asked to overwrite it
    proc = run_clc(native, tmp_path, "-o", planted, "--force", "--", "true")
    # THEN it refuses, and the file receives nothing
    assert proc.returncode == 2, proc.stderr
    assert "another user" in proc.stderr
    assert planted.read_text() == "theirs\n"


def test_force_replaces_a_capture_rather_than_writing_into_it(native, clc_run, tmp_path):
    # GIVEN an earlier capture that some process still holds open
    out = tmp_path / "cap.clc"
    out.write_bytes(b"old capture\n")
    held = open(out, "rb")
    # WHEN a run replaces it with --force
    run = clc_run(AUDIT, [native["prog_life"], "plain", "3"], output=out)
    # THEN the new capture is a new file: the holder still reads the old one
    assert run.capture().complete
    assert held.read() == b"old capture\n"
    held.close()


def test_an_earlier_runs_child_captures_are_not_this_runs(native, clc_run, tmp_path):
    # GIVEN a child capture left by an earlier run under the same name
    out = tmp_path / "cap.clc"
    stale = tmp_path / "cap.child-99999.clc"
    stale.write_bytes(b"CLCCAPT1 stale")
    # WHEN a run is made without --force, then with it
    refused = run_clc(native, tmp_path, "-o", out, "--", native["prog_life"], "plain", "1")
    assert refused.returncode == 2 and "capture of an earlier run" in refused.stderr
    run = clc_run(AUDIT, [native["prog_life"], "plain", "2"], output=out)
    # THEN the stale capture is gone, and the run's report and hint are its own
    assert not stale.exists()
    assert len(run.captures()) == 1
    assert "child-99999" not in run.stderr and "of child processes" not in run.stderr


@pytest.mark.parametrize("target", ["/dev/full", "/dev/null"])
def test_an_output_that_is_not_a_regular_file_is_refused(native, tmp_path, target):
    proc = run_clc(native, tmp_path, "-o", target, "--force", "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file" in proc.stderr


def test_write_errors_are_said_at_once_and_the_program_is_unharmed(native, tmp_path):
    # GIVEN a program whose files may not grow past 64 KiB (as on a full disk, writes fail)
    script = (f"trap '' XFSZ; ulimit -f 64; exec {native['prog_reload']} module 3000")
    proc = run_clc(native, tmp_path, "-o", tmp_path / "cap.clc", "--", "sh", "-c", script)
    # THEN the program ran to its end and its exit status is its own
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "summary cycles=3000" in proc.stdout
    # AND clc said once, while it ran, that records were being lost, and why
    assert proc.stderr.count("writing the capture") == 1, proc.stderr[-3000:]
    assert "File too large" in proc.stderr
    # AND the file holds whole records only, within the limit
    assert (tmp_path / "cap.clc").stat().st_size <= 64 * 1024


@pytest.mark.parametrize("threads", [1, 16])
def test_the_capture_limit_is_never_exceeded(native, clc_run, tmp_path, threads):
    # GIVEN a program whose launch records fill many times a 256 KiB limit
    argv = [native["prog_threads"], str(threads), str(160000 // threads)]
    run = clc_run(AUDIT, argv, options=["--capture-limit", "256K"])
    assert run.proc.returncode == 0, run.stderr[-3000:]
    # THEN the file is within the limit, however many threads filled their buffers
    assert run.output.stat().st_size <= 256 * 1024
    # AND it said once that it dropped launch records, and kept the kernels, the exact counts
    # and the end record
    assert run.stderr.count("reached its size limit") == 1, run.stderr[-3000:]
    cap = run.capture()
    assert cap.complete and not cap.truncated and cap.capped_bytes > 0
    assert 0 < len(cap.launches) < 160000
    assert sum(st.launches for st in cap.stats.values()) == 160000
    assert len(cap.kernels) == 2


VECADD_NAME = "vecAdd(float const*, float const*, float*, int)"
DEBUG_NAME = "debug_kernel(int*)"


def flood_lines(stdout):
    """(ms, vecAdd launches the driver ran, debug_kernel launches refused) of each line
    prog_life flood printed, the last one at its end; the program's own counts are the
    driver's, and it ran no debug_kernel."""
    lines = []
    for m in re.finditer(r"^flood(?:-end)?: ms=(\d+) vecAdd=(\d+) refused=(\d+) "
                         r"driver=(\d+),(\d+)$", stdout, re.M):
        assert m[2] == m[4] and m[5] == "0", m[0]
        lines.append((int(m[1]), int(m[4]), int(m[3])))
    return lines


def clc(*args):
    return subprocess.run([sys.executable, "-m", "clc", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def reported_counts(path):
    """{kernel: (launches, denied)} and the no-debug rule's denied launches, as `clc report`
    gives them in its summary, its CSV and its JSON, and `clc metrics` as Prometheus counters;
    each format's mark of a partial capture."""
    out = {}
    summary = clc("report", path)
    assert summary.returncode == 0, summary.stderr
    cells = {ln.rsplit("  ", 1)[-1]: ln.split() for ln in summary.stdout.splitlines()}
    denied_by = re.search(r"^\s+(\S+)\s+no-debug$", summary.stdout, re.M)[1]
    out["summary"] = ({k: (cells[k][0], cells[k][2]) for k in (VECADD_NAME, DEBUG_NAME)},
                      denied_by, "PARTIAL" in summary.stdout.splitlines()[0])
    table = clc("report", path, "--format", "csv")
    rows = {r["kernel"]: r for r in csv.DictReader(io.StringIO(table.stdout))}
    out["csv"] = ({k: (rows[k]["launches"], rows[k]["denied"]) for k in (VECADD_NAME, DEBUG_NAME)},
                  None, all(rows[k]["capture_partial"] == "1" and rows[k]["partial"] == "0"
                            for k in rows))
    doc = json.loads(clc("report", path, "--format", "json").stdout)
    kernels = {k["name"]: k for k in doc["kernels"]}
    (rule,) = doc["denied_by_rule"]
    out["json"] = ({k: (str(kernels[k]["launches"]), str(kernels[k]["denied"]))
                    for k in (VECADD_NAME, DEBUG_NAME)}, str(rule["denied"]),
                   doc["captures"][0]["partial"] and not rule["partial"])
    metrics = clc("metrics", path)
    samples = {(s.name, s.labels.get("kernel")): s.value
               for fam in text_string_to_metric_families(metrics.stdout) for s in fam.samples}
    out["metrics"] = ({k: (str(int(samples[("clc_launches_total", k)])),
                           str(int(samples[("clc_launches_denied_total", k)])))
                       for k in (VECADD_NAME, DEBUG_NAME)}, None,
                      samples[("clc_captures_partial", None)] == 1
                      and "1 capture partial" in metrics.stderr)
    return out


@pytest.mark.parametrize("pause_ms", [0, 1500], ids=["killed-launching", "killed-idle"])
def test_counts_survive_the_size_cap_and_sigkill(native, clc_run, pause_ms):
    # GIVEN a program that makes millions of launches in 3 s, each recorded or denied, under a
    # capture limit of 1 MiB, then is killed by SIGKILL: at once, or 1.5 s after its last launch
    run = clc_run(DENY_DEBUG, [native["prog_life"], "flood", "3000", pause_ms],
                  options=["--capture-limit", "1M"])
    assert run.proc.returncode == 128 + signal.SIGKILL, run.stderr[-3000:]
    ticks = flood_lines(run.stdout)
    end_ms, launched, refused = ticks[-1]
    assert launched == refused > 1_000_000, run.stdout[-500:]
    assert run.output.stat().st_size <= 1 << 20
    # The counts can lag the kill by the last second at most (they are written every second);
    # on a loaded machine, a little more.
    lag_ms = 0 if pause_ms else 1500
    least = max((v, r) for ms, v, r in ticks if ms <= end_ms - lag_ms)
    # WHEN every report format and `clc metrics` read the capture
    for how, (kernels, denied_by_rule, marked) in reported_counts(run.output).items():
        launches, denied = int(kernels[VECADD_NAME][0]), int(kernels[DEBUG_NAME][1])
        # THEN their counts are the driver's (less at most the last second's), not the
        # launches recorded before the limit
        assert least[0] <= launches <= launched, (how, launches, least, launched)
        assert least[1] <= denied <= refused, (how, denied, least, refused)
        assert kernels[VECADD_NAME][1] == "0", how
        # Every launch of debug_kernel was denied: its launches are its denies, less the one
        # launch of the program's one launching thread that the kill may have caught between
        # being counted and being denied (never more denied than launched)
        in_flight = int(kernels[DEBUG_NAME][0]) - denied
        assert in_flight in ((0,) if pause_ms else (0, 1)), (how, in_flight)
        # The rule's count is read a moment after the kernels' (the program launching on)
        if denied_by_rule is not None:
            assert least[1] <= int(denied_by_rule) <= refused, (how, denied_by_rule)
        if pause_ms:
            assert (launches, denied) == (launched, refused), how
            assert denied_by_rule in (None, str(refused)), how
        # AND each marks the capture partial: launches are missing from it, not from its counts
        assert marked, how


def test_a_limit_too_small_for_the_kernels_truncates_and_says_so(native, clc_run):
    # GIVEN 3000 kernels (3000 modules) and a limit that cannot hold all their records
    run = clc_run(AUDIT, [native["prog_life"], "fill", "3000"],
                  options=["--capture-limit", "128K", "--strict"])
    # THEN the file stays within the limit, and the capture says what it could not keep
    assert run.output.stat().st_size <= 128 * 1024
    cap = run.capture()
    assert cap.complete and cap.truncated
    assert "records it must keep dropped at the size cap" in run.stderr
    # AND --strict fails the run: the capture cannot vouch for it
    assert run.proc.returncode == 3


def test_a_limit_below_what_any_capture_needs_is_refused(native, tmp_path):
    proc = run_clc(native, tmp_path, "--capture-limit", "1K", "-o", tmp_path / "c.clc", "--",
                   "true")
    assert proc.returncode == 2
    assert "--capture-limit 1024 is smaller than the smallest capture of this policy" in \
        proc.stderr
    assert not (tmp_path / "c.clc").exists()


def test_clc_run_says_when_its_shim_never_started(native, tmp_path):
    # GIVEN a statically linked program: nothing can be preloaded into it
    cc = shutil.which("gcc") or shutil.which("cc")
    src = tmp_path / "static.c"
    src.write_text("int main(void) { return 3; }\n")
    exe = tmp_path / "static_prog"
    if cc is None or subprocess.run([cc, "-static", "-o", exe, src]).returncode != 0:
        pytest.skip("no static C library to link a static program with")
    proc = run_clc(native, tmp_path, "-o", tmp_path / "c.clc", "--", exe)
    # THEN clc-run warns before it starts and says at the end that nothing was seen, rather
    # than "no kernel"; the program's status is passed on
    assert proc.returncode == 3
    assert "statically linked" in proc.stderr
    assert "never started" in proc.stderr, proc.stderr
    assert "launched no kernel" not in proc.stderr


def test_clc_run_names_the_processes_it_ran_in_when_no_kernel_was_launched(native, tmp_path):
    # GIVEN a script whose processes launch no kernel, one of them started with LD_PRELOAD
    # removed from its environment
    proc = run_clc(native, tmp_path, "-o", tmp_path / "c.clc", "--", "sh", "-c",
                   "ls / >/dev/null; env -u LD_PRELOAD true")
    assert proc.returncode == 0, proc.stderr
    # THEN clc-run says where it ran (each process, the one without the preload in its
    # environment too: clc puts it back), and that no capture was written
    assert "launched no kernel in the 3 processes clc ran in (sh" in proc.stderr, proc.stderr
    assert "true" in proc.stderr and "ls" in proc.stderr
    assert "No capture was written" in proc.stderr
    assert not os.path.exists(tmp_path / "c.clc")


def fake_uuid(name):
    """The UUID the fake driver gives its GPU under FAKE_CUDA_UUID=name, as nvidia-smi would
    write it."""
    return gpu_uuid(name.encode().ljust(16, b"0")[:16])


def test_each_capture_names_its_gpu_by_uuid(native, clc_run, tmp_path):
    # GIVEN two runs of one program on two GPUs, each the process's device 0 (as
    # CUDA_VISIBLE_DEVICES makes every Slurm job's GPU)
    captures = tmp_path / "captures"
    captures.mkdir()
    for job, gpu in (("7", "gpu-a"), ("8", "gpu-b")):
        run = clc_run(AUDIT, [native["prog_cudart"]], env={"FAKE_CUDA_UUID": gpu},
                      options=["--label", f"job={job}"], output=captures / f"{job}.clc")
        assert run.proc.returncode == 0, run.stderr
        # THEN each capture says which GPU its device 0 is, as the driver names it
        assert run.capture().devices == {0: fake_uuid(gpu)}
        assert {k.device for k in run.capture().kernels.values()} == {0}
    # AND the node's metrics tell the two GPUs apart, by the UUID DCGM's series carry
    p = subprocess.run([sys.executable, "-m", "clc", "metrics", captures], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    uuids = {(s.labels["hpc_job"], s.labels["UUID"])
             for fam in text_string_to_metric_families(p.stdout) for s in fam.samples
             if s.name == "clc_launches_total"}
    assert uuids == {("7", fake_uuid("gpu-a")), ("8", fake_uuid("gpu-b"))}


def test_a_forked_childs_capture_names_its_gpu_too(native, clc_run):
    # GIVEN a program that forks after launching (the driver runs nothing in the child, and
    # answers no question there)
    run = clc_run(AUDIT, [native["prog_fork"], "plain"], timeout=60)
    assert run.proc.returncode == 0, run.stderr + run.stdout
    # THEN the child's capture names the GPU of the kernels it inherited, as the parent's does
    caps = run.captures()
    assert len(caps) >= 2
    for cap in caps:
        assert cap.devices == {0: fake_uuid("fake-gpu-0000000")}, cap.path

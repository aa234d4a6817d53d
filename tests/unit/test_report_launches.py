# SPDX-License-Identifier: Apache-2.0
"""`clc report`'s launch listings cut down: the per-launch CSV, --kernel and a time window."""

import csv
import json
import re
import io
import tracemalloc

import pytest

from capture_writer import CaptureWriter, big_capture
from clc import abi
from clc.capture.per_launch import PER_LAUNCH_COLUMNS, write_per_launch_csv
from clc.capture.reader import scan_captures
from clc.capture.cells import csv_text as _csv_text
from clc.capture.reports import View
from clc.cli.main import main

VECADD = "_Z6vecAddPKfS0_Pfi"
SCALE = "_Z5scalePff"
START = 1_000_000_000


@pytest.fixture
def cap(tmp_path):
    """vecAdd launched at 1 s, 2 s and 3 s after the capture's start (the first two timed),
    scale at 1.5 s by another thread on a stream, denied by a rule named like a formula."""
    w = CaptureWriter(start_monotonic_ns=START)
    w.process("./app")
    w.policy({"rules": [{"name": "=deny scale", "kernel": "scale*", "action": "deny"}]})
    w.kernel(0, VECADD)
    w.kernel(1, SCALE)
    w.launch(0, 0, t_ns=START + 1_000_000_000, grid=(64, 2, 1), block=(256, 1, 1), timed=True)
    w.launch(1, 1, t_ns=START + 1_500_000_000, stream=0x7F00, tid=4243,
             action=abi.ACTION_DENY, rule=0, shared_mem=1024)
    w.launch(2, 0, t_ns=START + 2_000_000_000, timed=True)
    w.timing(0, 0, 5000)
    w.timing(2, 0, 7000)
    w.launch(3, 0, t_ns=START + 3_000_000_000)
    w.kernel_stats(0, launches=3, recorded=3, timed=2, gpu_ns=12000)
    w.kernel_stats(1, launches=1, recorded=1, denied=1)
    w.end()
    return w.write(tmp_path / "cap.clc")


def report(capsys, *argv):
    try:
        rc = main(["report", *map(str, argv)])
    except SystemExit as e:  # argparse's own refusals
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_per_launch_csv_has_a_row_per_launch(cap, capsys):
    rc, out, err = report(capsys, cap, "--format", "csv", "--per-launch")
    assert rc == 0, err
    assert out.splitlines()[0] == ",".join(PER_LAUNCH_COLUMNS)
    rows = rows_of(out)
    assert [r["seq"] for r in rows] == ["0", "1", "2", "3"]
    first, scale = rows[0], rows[1]
    assert first == {"pid": "4242", "seq": "0", "t_ns": str(START + 1_000_000_000),
                     "kernel": "vecAdd(float const*, float const*, float*, int)",
                     "mangled": VECADD, "grid": "64x2x1", "block": "256x1x1",
                     "shared_mem": "0", "stream": "0x0", "tid": "4242",
                     "entry": "cuLaunchKernel", "action": "allow", "rule": "default",
                     "result": "0", "gpu_ns": "5000"}
    assert (scale["kernel"], scale["stream"], scale["tid"], scale["action"],
            scale["shared_mem"]) == ("scale(float*, float)", "0x7f00", "4243", "deny", "1024")
    # a rule's name, the policy's to choose, cannot start a spreadsheet formula
    assert scale["rule"] == "'=deny scale"
    assert [r["gpu_ns"] for r in rows] == ["5000", "", "7000", ""]


def test_per_launch_csv_honours_kernel_and_the_time_window(cap, capsys):
    rc, out, _ = report(capsys, cap, "--format", "csv", "--per-launch", "--kernel", "vec*")
    assert rc == 0 and [r["seq"] for r in rows_of(out)] == ["0", "2", "3"]
    rc, out, _ = report(capsys, cap, "--format", "csv", "--per-launch", "--kernel-regex",
                        "^sc")
    assert [r["seq"] for r in rows_of(out)] == ["1"]
    # from 1.5 s up to, not including, 3 s
    rc, out, _ = report(capsys, cap, "--format", "csv", "--per-launch", "--from", "1.5",
                        "--to", "3")
    assert [r["seq"] for r in rows_of(out)] == ["1", "2"]
    rc, out, _ = report(capsys, cap, "--format", "csv", "--per-launch", "--from", "2",
                        "--kernel", "vec*")
    assert [r["seq"] for r in rows_of(out)] == ["2", "3"]


@pytest.mark.parametrize("argv, said", [
    (["--per-launch"], "--per-launch lists launches in a csv report"),
    (["--format", "json", "--per-launch"], "--per-launch lists launches in a csv report"),
    (["--format", "csv", "--per-launch", "--sort", "name"],
     "--sort orders the kernels of a summary or a per-kernel csv, not --per-launch"),
    (["--format", "csv", "--from", "1"], "--from and --to cut the launches listed"),
    (["--format", "csv", "--per-launch", "--from", "2", "--to", "1"],
     "--to 1 is not after --from 2"),
    (["--format", "csv", "--per-launch", "--from", "-1"], "'-1': expected seconds"),
    (["--format", "csv", "--per-launch", "--to", "nan"], "'nan': expected seconds"),
])
def test_options_that_do_not_apply_are_refused(cap, capsys, argv, said):
    rc, _, err = report(capsys, cap, *argv)
    assert rc == 2 and said in err


def test_per_launch_csv_memory_does_not_grow_with_launches(tmp_path):
    # GIVEN a capture of 100,000 launches (every tenth timed), three launch windows
    path = big_capture(tmp_path / "big.clc", 100_000)
    caps = scan_captures([path])

    class Counting:
        lines = 0

        def write(self, text):
            self.lines += text.count("\n")

    out = Counting()
    tracemalloc.start()
    try:
        unmatched = write_per_launch_csv(caps, out, View(), _csv_text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN every launch is a row, written while memory stays about the launch window's
    assert out.lines == 100_001 and unmatched == 0
    assert peak < 16 * 2**20


# ---- percentiles and standard deviation ----------------------------------------------------

@pytest.fixture
def spread(tmp_path):
    """vecAdd's 100 timed launches took 1, 2, ..., 100 us."""
    w = CaptureWriter(start_monotonic_ns=START)
    w.process("./app")
    w.kernel(0, VECADD)
    for seq in range(100):
        w.launch(seq, 0, timed=True)
        w.timing(seq, 0, 1000 * (seq + 1))
    w.kernel_stats(0, launches=100, recorded=100, timed=100, gpu_ns=5050 * 1000)
    w.end()
    return w.write(tmp_path / "spread.clc")


def summary_columns(text):
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("Launches"))
    row = next(ln for ln in lines if ln.endswith("int)"))
    names = re.split(r"\s{2,}", header.strip())
    return dict(zip(names, row.split()[:len(names) - 1]))


def test_chosen_percentiles_and_std_dev_in_summary_csv_and_json(spread, capsys):
    rc, out, err = report(capsys, spread, "--percentiles", "90,50,99.9")
    assert rc == 0, err
    cols = summary_columns(out)
    # nearest rank: the 90th of 1..100 us is 90, the 99.9th 100; the sample std dev 29.011
    assert (cols["Min (us)"], cols["Median (us)"], cols["P90 (us)"], cols["P99.9 (us)"],
            cols["Max (us)"], cols["Std dev (us)"]) == (
        "1.000", "50.000", "90.000", "100.000", "100.000", "29.011")
    assert "P99 (us)" not in cols
    rc, out, _ = report(capsys, spread, "--format", "csv", "--percentiles", "50,90,99.9")
    (row,) = rows_of(out)
    assert (row["gpu_median_us"], row["gpu_p90_us"], row["gpu_p99_9_us"], row["gpu_std_us"]) \
        == ("50.000", "90.000", "100.000", "29.011")
    rc, out, _ = report(capsys, spread, "--format", "json", "--percentiles", "90")
    (k,) = json.loads(out)["kernels"]
    assert k["gpu_ns_percentiles"] == {"90": 90_000}
    assert (k["gpu_ns_min"], k["gpu_ns_max"]) == (1000, 100_000)
    assert k["gpu_ns_std"] == pytest.approx(29011.49, abs=0.01)


def test_default_percentiles_are_the_median_and_p99(spread, capsys):
    cols = summary_columns(report(capsys, spread)[1])
    assert (cols["Median (us)"], cols["P99 (us)"], cols["Std dev (us)"]) == (
        "50.000", "99.000", "29.011")


@pytest.mark.parametrize("value, said", [
    ("0,50", "'0,50': 0 is not a percentile in (0, 100]"),
    ("50,101", "'50,101': 101 is not a percentile in (0, 100]"),
    ("50,,99", "'50,,99': '' is not a number"),
    ("p99", "'p99': 'p99' is not a number"),
    ("nan", "'nan': nan is not a percentile in (0, 100]"),
])
def test_percentiles_are_checked(spread, capsys, value, said):
    rc, _, err = report(capsys, spread, "--percentiles", value)
    assert rc == 2 and f"argument --percentiles: {said}" in err


def test_percentiles_are_refused_where_they_do_not_apply(spread, capsys):
    rc, _, err = report(capsys, spread, "--format", "chrome", "--percentiles", "90")
    assert rc == 2 and "--percentiles shapes the per-kernel summary, csv and json" in err


# ---- --kernel and the time window for JSON and the Chrome trace ---------------------------

def report_schema():
    import importlib.resources

    import jsonschema
    schema = json.loads(importlib.resources.files("clc.schemas").joinpath(
        "report-1.schema.json").read_text())
    return jsonschema.Draft202012Validator(schema)


def test_json_is_cut_down_by_kernel_and_time(cap, capsys):
    rc, out, err = report(capsys, cap, "--format", "json", "--kernel", "vec*", "--to", "2.5")
    assert rc == 0, err
    doc = json.loads(out)
    report_schema().validate(doc)
    # vecAdd's launches before 2.5 s, and only vecAdd's row
    assert [ln["seq"] for ln in doc["launches"]] == [0, 2]
    assert [k["mangled"] for k in doc["kernels"]] == [VECADD]
    assert doc["selection"] == {"kernels": ["vec*"], "kernel_regex": None, "from_s": None,
                                "to_s": 2.5}
    # the whole document says no selection
    rc, out, _ = report(capsys, cap, "--format", "json")
    doc = json.loads(out)
    assert "selection" not in doc and len(doc["launches"]) == 4


def test_chrome_trace_is_cut_down_by_kernel_and_time(cap, capsys):
    rc, out, err = report(capsys, cap, "--format", "chrome", "--from", "1.2")
    assert rc == 0, err
    events = json.loads(out)["traceEvents"]
    launches = [e for e in events if e.get("cat") in ("launch", "denied")]
    assert [e["args"]["seq"] for e in launches] == [1, 2, 3]
    # the trace's 0 is the capture's start: a window read off the timeline cuts the same
    assert launches[0]["ts"] == pytest.approx(1.5e6)
    assert [e["args"]["seq"] for e in events if e.get("cat") == "gpu"] == [2]
    rc, out, err = report(capsys, cap, "--format", "chrome", "--kernel-regex", "^scale")
    launches = [e for e in json.loads(out)["traceEvents"]
                if e.get("cat") in ("launch", "denied")]
    assert [e["name"] for e in launches] == ["scale(float*, float)"]


# ---- --baseline of partial captures ---------------------------------------------------------

def a_run(path, dropped=0, counts=True):
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.launch(0, 0)
    if counts:
        w.kernel_stats(0, launches=1, recorded=1)
    w.end(dropped=dropped)
    return w.write(path)


def test_baseline_warns_once_when_either_capture_is_partial(tmp_path, capsys):
    whole = a_run(tmp_path / "whole.clc")
    dropped = a_run(tmp_path / "dropped.clc", dropped=7)
    derived = a_run(tmp_path / "derived.clc", counts=False)
    rc, out, err = report(capsys, whole, "--baseline", dropped)
    assert rc == 0 and "Launches (base)" in out
    assert err.count("warning") == 1
    assert f"--baseline compares partial captures (baseline {dropped})" in err
    rc, _, err = report(capsys, derived, "--baseline", dropped, "--format", "csv")
    assert err.count("warning") == 1
    assert f"(baseline {dropped}; current {derived})" in err
    # two whole runs: nothing said
    rc, _, err = report(capsys, whole, "--baseline", a_run(tmp_path / "w2.clc"))
    assert rc == 0 and err == ""


# ---- the GPU times line of a summary cut down by --kernel ---------------------------------

def test_gpu_times_line_counts_only_the_kernels_shown(tmp_path, capsys):
    # GIVEN vecAdd timed 3 times by events, scale twice by CUPTI
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.kernel(1, SCALE)
    for seq, kid, source in ((0, 0, abi.TIMING_EVENTS), (1, 0, abi.TIMING_EVENTS),
                             (2, 0, abi.TIMING_EVENTS), (3, 1, abi.TIMING_CUPTI),
                             (4, 1, abi.TIMING_CUPTI)):
        w.launch(seq, kid, timed=True)
        w.timing(seq, kid, 1000, source=source)
    w.kernel_stats(0, launches=3, recorded=3, timed=3, gpu_ns=3000)
    w.kernel_stats(1, launches=2, recorded=2, timed=2, gpu_ns=2000)
    w.end()
    path = w.write(tmp_path / "two.clc")
    rc, out, _ = report(capsys, path)
    out = " ".join(out.split())  # the line is wrapped
    assert "GPU times: CUDA events recorded around each launch (3 launches), CUPTI kernel " \
        "records (the kernels' own start and end) (2 launches)." in out
    # WHEN only vecAdd is shown THEN only its timed launches are said
    rc, out, _ = report(capsys, path, "--kernel", "vec*")
    out = " ".join(out.split())
    assert rc == 0 and "GPU times: CUDA events recorded around each launch (3 launches)." in out
    assert "CUPTI" not in out


# ---- counts in words ------------------------------------------------------------------------

def test_counts_of_one_are_said_in_the_singular(tmp_path, capsys):
    # GIVEN a capture that lost 1 record, with 1 launch that fell to on_error and 1 GPU time
    # whose launch record is missing, read into a file
    w = CaptureWriter()
    w.process("./app")
    w.kernel(0, VECADD)
    w.launch(0, 0, rule=abi.RULE_ON_ERROR)
    w.timing(5, 0, 1000)
    w.wrap_stats("vecAdd", "sm_share share=0.25", blocks=1, threads=1, skipped=0,
                 max_resident=1, share_sms=1)
    w.end(dropped=1)
    path = w.write(tmp_path / "one.clc")
    rc, out, err = report(capsys, path, "--format", "json", "-o", tmp_path / "r.json")
    assert rc == 0
    assert "clc: 1 GPU time matched no launch record" in err
    assert f"clc: json report of 1 capture written to {tmp_path / 'r.json'}" in err
    rc, out, _ = report(capsys, path)
    text = " ".join(out.split())
    for said in ("1 record dropped (buffers full)", "Total (1 kernel)",
                 "Fell to on_error: 1 launch that clc",
                 "1 block run, 1 thread, 0 blocks skipped, 1 most resident, 1 SM"):
        assert said in text

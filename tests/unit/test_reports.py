# SPDX-License-Identifier: Apache-2.0
"""Reports over captures built by tests/helpers/capture_writer.py."""

import errno
import io
import json
import pathlib
import re
import tracemalloc

import pytest

from capture_writer import CaptureWriter, big_capture
from clc import abi
from clc.capture.reader import LAUNCH_WINDOW, read_capture, scan_capture, scan_captures
from clc.cli.run import load_policy_and_hooks
from clc.capture.reports import summary, to_chrome, to_json, write_chrome, write_json, write_report

ROOT = pathlib.Path(__file__).resolve().parents[2]
VECADD = "_Z6vecAddPKfS0_Pfi"
VECADD_NAME = "vecAdd(float const*, float const*, float*, int)"
SCALE = "_Z5scalePff"
SCALE_NAME = "scale(float*, float)"
LONG = "_Z" + "40" + "x" * 40 + "I" + "".join(f"Li{i}E" for i in range(40)) + "Evv"
POLICY = {"rules": [{"name": "deny-scale"}, {"name": "time-vecadd"}]}

CAPTURE_KEYS = {"path", "pid", "ppid", "command", "complete", "dropped", "write_lost_bytes",
                "capped_bytes", "write_errno", "write_error", "trailing_bytes",
                "launch_records", "timing_records", "timing_sources", "on_error_launches",
                "stats_partial", "partial",
                "ending", "table_full", "truncated", "undecided_launches", "run", "devices",
                "holds"}
KERNEL_KEYS = {"name", "mangled", "devices", "launches", "denied", "recorded", "timed",
               "graph_nodes", "failed", "gpu_ns_total", "gpu_ns_mean", "rules", "partial",
               "confined_sms", "gpu_ns_min", "gpu_ns_max", "gpu_ns_std", "gpu_ns_percentiles"}
RULE_KEYS = {"rule", "denied", "partial"}
LAUNCH_KEYS = {"pid", "seq", "kernel", "mangled", "t_ns", "grid", "block", "shared_mem",
               "stream", "tid", "entry", "ptsz", "action", "rule", "result", "gpu_ns"}
MODULE_KEYS = {"pid", "t_ns", "api", "image", "handle", "image_ptr", "image_size", "preserved",
               "result", "path"}
MESSAGE_KEYS = {"pid", "level", "text"}


def parent(tmp_path, reader=read_capture):
    """A complete capture: vecAdd timed, scale denied once."""
    w = CaptureWriter(pid=100, ppid=1, start_monotonic_ns=5_000_000)
    w.process("./app --size 4")
    w.policy(POLICY)
    w.module(path="/opt/app/kernels.cubin", t_ns=5_000_100)
    w.device(0, bytes(range(16)))
    w.kernel(0, VECADD, device=0)
    w.kernel(1, SCALE, device=0)
    w.launch(0, 0, t_ns=5_001_000, stream=0x10, grid=(8, 1, 1), block=(256, 1, 1), rule=1)
    w.timing(0, 0, 2_000_000)
    w.launch(1, 0, t_ns=5_002_000, stream=0x10, rule=1, entry=abi.ENTRY_LAUNCH | abi.ENTRY_PTSZ)
    w.timing(1, 0, 4_000_000)
    w.launch(2, 1, t_ns=5_003_000, action=abi.ACTION_DENY, rule=0, result=98)
    w.message("kernel scale denied", level=abi.MSG_WARNING)
    w.message("bridge not found", level=abi.MSG_ERROR)
    # Launches that were not recorded show only in the stats.
    w.kernel_stats(0, launches=10, recorded=2, timed=2, gpu_ns=6_000_000)
    w.kernel_stats(1, launches=3, denied=1, recorded=1, graph_nodes=2)
    w.rule_stats(0, 1)
    w.end(dropped=4)
    return reader(w.write(tmp_path / "100.clc"))


def child(tmp_path, reader=read_capture):
    """A crashed child process: the same vecAdd on device 1, plus a long-named kernel."""
    w = CaptureWriter(pid=101, ppid=100, start_monotonic_ns=4_000_000)
    w.process("./worker")
    w.policy({"rules": [{"name": "child-rule"}]})
    w.kernel(0, LONG, device=1)
    w.kernel(3, VECADD, device=1)
    w.launch(0, 3, t_ns=6_000_000, rule=0, tid=202)
    w.timing(0, 3, 3_000_000)
    w.launch(1, 0, t_ns=6_001_000, rule=-2, tid=202)
    w.message("kernel scale denied", level=abi.MSG_WARNING)
    return reader(w.write(tmp_path / "101.clc"))


# Reports read the same from captures held whole and from captures scanned (launches streamed
# from the file).
@pytest.fixture(params=[read_capture, scan_capture], ids=["read", "scan"])
def caps(tmp_path, request):
    return [parent(tmp_path, request.param), child(tmp_path, request.param)]


def table_row(text, name):
    (line,) = [ln for ln in text.splitlines() if ln.endswith(name)]
    return line[:-len(name)].split()


def test_summary_numbers(tmp_path):
    text = summary([parent(tmp_path)])
    # Launches, Graph nodes, Denied, Failed, Recorded, GPU total, Share, GPU mean, and the
    # timed launches' Min, Median, P99, Max and sample standard deviation: vecAdd's two timed
    # launches took 2 and 4 ms
    assert table_row(text, VECADD_NAME) == ["10", "0", "0", "0", "2", "6.000", "100.0",
                                            "3000.000", "2000.000", "2000.000", "4000.000",
                                            "4000.000", "1414.214"]
    assert table_row(text, SCALE_NAME) == ["3", "2", "1", "0", "1"] + ["-"] * 8
    assert table_row(text, "Total (2 kernels)") == ["13", "2", "1", "0", "3", "6.000", "100.0",
                                                    "3000.000"]
    lines = text.splitlines()
    header = next(ln for ln in lines if "Launches" in ln)
    assert re.split(r"\s{2,}", header.strip()) == [
        "Launches", "Graph nodes", "Denied", "Failed", "Recorded", "GPU total (ms)", "Share (%)",
        "GPU mean (us)", "Min (us)", "Median (us)", "P99 (us)", "Max (us)", "Std dev (us)",
        "Kernel"]
    # Sorted by launches, most first.
    assert lines.index(next(ln for ln in lines if ln.endswith(VECADD_NAME))) < \
        lines.index(next(ln for ln in lines if ln.endswith(SCALE_NAME)))


def test_summary_capture_lines_and_messages(caps):
    text = summary(caps)
    first, second = (capture_lines(text, cap) for cap in caps)
    assert first.startswith(caps[0].path) and "pid 100" in first and "./app --size 4" in first
    assert "complete" in first and "4 records dropped" in first
    # A capture that lost records says so, and that its counts are whole all the same.
    assert "PARTIAL" in first and "partial: records of the run are missing" in first
    assert second.startswith(caps[1].path) and "INCOMPLETE" in second
    assert "dropped" not in second and "PARTIAL" not in second
    # An incomplete capture names every cause, not only a crash.
    said = " ".join(text.split())
    assert ("no END record after its last records: the program was killed (SIGKILL), or its "
            "capture could not be written (full disk?); its counts are the last it wrote (every "
            "second); see what clc printed while it ran") in said
    # Both processes warned the same; it shows once.
    assert text.count("kernel scale denied") == 1
    assert "error: bridge not found" in text


def test_summary_merges_and_marks_partial(caps):
    text = summary(caps)
    # vecAdd: 10 launches from the parent's stats, 1 derived from the child's records.
    assert table_row(text, VECADD_NAME)[:8] == ["11*", "0*", "0*", "0*", "3", "9.000", "100.0",
                                                 "3000.000"]
    assert "* partial: the capture holds no counts of the kernel" in text


def test_summary_truncates_long_names(caps):
    long_name = to_json(caps)["kernels"][-1]["name"]
    assert len(long_name) > 120
    text = summary(caps)
    assert long_name not in text
    # cut in the middle: the start and the end of the name both shown
    (cut,) = [ln for ln in text.splitlines() if "..." in ln and "Total" not in ln]
    name = cut.split("  ")[-1]
    assert len(name) == 100 and long_name.startswith(name[:48]) and \
        long_name.endswith(name[-49:])
    assert max(len(ln) for ln in text.splitlines() if "Kernel" not in ln) < 250


def test_summary_says_when_a_best_effort_process_was_held(tmp_path):
    w = CaptureWriter(pid=77)
    w.process("./train")
    w.hold(10**9, 4_000_000, lag_ns=300_000)
    w.hold(2 * 10**9, 9_500_000, lag_ns=100_000, why=abi.HOLD_BUSY | abi.HOLD_FLOOR)
    w.hold(3 * 10**9, 500_000, lag_ns=0, why=abi.HOLD_NO_BOARD)
    w.end()
    cap = read_capture(w.write(tmp_path / "be.clc"))
    assert [(h.held_ns, h.by_floor, h.no_board) for h in cap.holds] == [
        (4_000_000, False, False), (9_500_000, True, False), (500_000, False, True)]
    text = summary([cap])
    assert ("  pid 77: 3 holds, 14.0 ms in all, longest 9.50 ms, held 300 us (median) after "
            "the GPU went busy, 1 let go by the floor, 1 because the board could not be read"
            in text)
    assert "Held (best-effort" not in summary([read_capture(
        CaptureWriter().write(tmp_path / "none.clc"))])


def test_summary_of_nothing():
    assert summary([]).strip()


def test_json_schema(caps):
    doc = json.loads(json.dumps(to_json(caps)))
    assert set(doc) == {"version", "captures", "kernels", "denied_by_rule", "launches",
                        "unmatched_timings", "modules", "wrapped", "messages"}
    assert doc["version"] == 1
    assert all(set(c) == CAPTURE_KEYS for c in doc["captures"])
    assert all(set(k) == KERNEL_KEYS for k in doc["kernels"])
    assert doc["denied_by_rule"] and all(set(r) == RULE_KEYS for r in doc["denied_by_rule"])
    assert all(set(ln) == LAUNCH_KEYS for ln in doc["launches"])
    assert all(set(m) == MODULE_KEYS for m in doc["modules"])
    assert all(set(m) == MESSAGE_KEYS for m in doc["messages"])

    assert doc["captures"][0] == {
        "path": caps[0].path, "pid": 100, "ppid": 1, "command": "./app --size 4",
        "complete": True, "dropped": 4, "write_lost_bytes": 0, "capped_bytes": 0,
        "write_errno": 0, "write_error": None, "trailing_bytes": 0, "launch_records": 3,
        "timing_records": 2, "timing_sources": {"events": 2}, "on_error_launches": 0,
        "stats_partial": False, "partial": True, "ending": None,
        "table_full": False, "truncated": False, "undecided_launches": 0, "run": {},
        "devices": [{"device": 0, "uuid": "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"}],
        "holds": []}
    assert doc["captures"][1]["complete"] is False
    assert doc["captures"][1]["stats_partial"] is True
    assert doc["captures"][1]["partial"] is False
    assert doc["denied_by_rule"] == [{"rule": "deny-scale", "denied": 1, "partial": False}]
    assert doc["unmatched_timings"] == 0


def test_json_kernels(caps):
    kernels = {k["mangled"]: k for k in to_json(caps)["kernels"]}
    assert set(kernels) == {VECADD, SCALE, LONG}
    vec = kernels[VECADD]
    assert vec == {"name": VECADD_NAME, "mangled": VECADD, "devices": [0, 1], "launches": 11,
                   "denied": 0, "recorded": 3, "timed": 3, "graph_nodes": 0, "failed": 0,
                   "gpu_ns_total": 9_000_000, "gpu_ns_mean": 3_000_000.0,
                   "rules": ["child-rule", "time-vecadd"], "partial": True, "confined_sms": [],
                   # its launches took 2, 3 and 4 ms
                   "gpu_ns_min": 2_000_000, "gpu_ns_max": 4_000_000, "gpu_ns_std": 1_000_000.0,
                   "gpu_ns_percentiles": {"50": 3_000_000, "99": 4_000_000}}
    scale = kernels[SCALE]
    assert (scale["launches"], scale["denied"], scale["graph_nodes"], scale["gpu_ns_mean"],
            scale["rules"]) == (3, 1, 2, None, ["deny-scale"])
    assert kernels[LONG]["rules"] == ["on_error"]
    assert [k["launches"] for k in to_json(caps)["kernels"]] == [11, 3, 1]


def test_json_launches_modules_messages(caps):
    doc = to_json(caps)
    first = doc["launches"][0]
    assert first == {"pid": 100, "seq": 0, "kernel": VECADD_NAME, "mangled": VECADD,
                     "t_ns": 5_001_000, "grid": [8, 1, 1], "block": [256, 1, 1],
                     "shared_mem": 0, "stream": 0x10, "tid": 100, "entry": "cuLaunchKernel",
                     "ptsz": False, "action": "allow", "rule": "time-vecadd", "result": 0,
                     "gpu_ns": 2_000_000}
    assert doc["launches"][1]["ptsz"] is True
    denied = doc["launches"][2]
    assert (denied["action"], denied["rule"], denied["result"], denied["gpu_ns"]) == \
        ("deny", "deny-scale", 98, None)
    assert [(ln["pid"], ln["seq"]) for ln in doc["launches"]] == \
        [(100, 0), (100, 1), (100, 2), (101, 0), (101, 1)]
    (mod,) = doc["modules"]
    assert (mod["pid"], mod["api"], mod["image"], mod["path"]) == \
        (100, "cuModuleLoad", "file", "/opt/app/kernels.cubin")
    assert [(m["pid"], m["level"]) for m in doc["messages"]] == \
        [(100, "warning"), (100, "error"), (101, "warning")]


def test_chrome_trace(caps):
    trace = json.loads(json.dumps(to_chrome(caps)))
    assert set(trace) == {"traceEvents", "displayTimeUnit"}
    assert trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} == {"M", "X", "i"}
    for e in events:
        assert {"ph", "name", "pid", "tid"} <= set(e)
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and isinstance(e["dur"], float)
            assert e["ts"] >= 0 and e["dur"] > 0
        if e["ph"] == "i":
            assert e["s"] == "p" and "ts" in e

    meta = {(e["pid"], e["tid"], e["name"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[(100, 0, "process_name")]["name"] == "./app --size 4 (pid 100)"
    assert (101, 202, "thread_name") in meta
    # The parent's capture dropped records: its track says that launches are missing.
    assert "partial capture" in meta[(100, 0, "process_labels")]["labels"]
    assert (101, 0, "process_labels") not in meta

    cpu = [e for e in events if e["ph"] == "X" and e["cat"] != "gpu"]
    assert len(cpu) == 5
    (denied,) = [e for e in cpu if e["cat"] == "denied"]
    assert denied["name"] == SCALE_NAME
    assert {"grid", "block", "shared_mem", "stream", "entry", "action", "rule",
            "result"} <= set(denied["args"])
    assert denied["args"]["action"] == "deny" and denied["args"]["rule"] == "deny-scale"
    # Times are relative to the earliest capture start (the child's, 4 ms).
    first = next(e for e in cpu if e["pid"] == 100 and e["args"]["seq"] == 0)
    assert first["ts"] == pytest.approx((5_001_000 - 4_000_000) / 1e3)

    gpu = [e for e in events if e["ph"] == "X" and e["cat"] == "gpu"]
    assert [(e["pid"], e["dur"]) for e in gpu] == [(100, 2000.0), (100, 4000.0),
                                                   (101, 3000.0)]
    assert gpu[0]["ts"] == first["ts"]
    track = meta[(100, gpu[0]["tid"], "thread_name")]["name"]
    assert track == "GPU stream 0x10"
    assert gpu[0]["tid"] != first["tid"] and gpu[0]["tid"] == gpu[1]["tid"]
    assert "approximated" in gpu[0]["args"]["note"]

    (load,) = [e for e in events if e["ph"] == "i" and e["cat"] == "module"]
    assert load["name"] == "cuModuleLoad" and load["args"]["path"] == "/opt/app/kernels.cubin"


@pytest.mark.parametrize("fmt", ["summary", "json", "chrome"])
def test_write_report(caps, fmt, tmp_path, capsys):
    out = tmp_path / f"report.{fmt}"
    write_report(caps, fmt, str(out))
    text = out.read_text()
    write_report(caps, fmt, None)
    assert capsys.readouterr().out == text
    if fmt == "summary":
        assert VECADD_NAME in text
    else:
        assert json.loads(text)


def test_write_report_unknown_format(caps):
    with pytest.raises(ValueError):
        write_report(caps, "xml", None)


def test_write_json_streams_to_json_document(caps, tmp_path):
    # WHEN the JSON is written launch by launch
    out = io.StringIO()
    assert write_json(caps, out) == 0
    text = out.getvalue()
    # THEN it is the same document as to_json's, one launch a line
    assert json.loads(text) == json.loads(json.dumps(to_json(caps)))
    lines = text.splitlines()
    first = lines.index('  "launches": [')
    assert all(json.loads(ln.strip().rstrip(",")) for ln in lines[first + 1:first + 6])


def test_write_chrome_is_to_chrome_compact(caps):
    out = io.StringIO()
    write_chrome(caps, out)
    assert out.getvalue() == json.dumps(to_chrome(caps), separators=(",", ":")) + "\n"


def test_empty_launch_list_is_valid_json(tmp_path):
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.kernel_stats(0, launches=5)
    w.end()
    out = io.StringIO()
    write_json([scan_capture(w.write(tmp_path / "n.clc"))], out)
    assert json.loads(out.getvalue())["launches"] == []


def capture_lines(text, cap):
    """The capture's line and the indented lines under it."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(cap.path))
    j = i + 1
    while j < len(lines) and lines[j].startswith("  "):
        j += 1
    return " ".join(" ".join(lines[i:j]).split())


def test_summary_reports_write_errors_and_the_size_cap(tmp_path):
    # GIVEN a program whose capture met a full disk, then its size cap, and still ended
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.kernel_stats(0, launches=4_000_000, recorded=600_000)
    w.end(write_lost_bytes=5 * 2**20, capped_bytes=2048, write_errno=errno.ENOSPC)
    cap = scan_capture(w.write(tmp_path / "full.clc"))
    text = capture_lines(summary([cap]), cap)
    # THEN the summary says what was lost and why, and blames no crash
    assert "complete" in text and "INCOMPLETE" not in text and "crash" not in text
    assert "5.0 MiB (5242880 bytes) lost to write errors (ENOSPC (No space left on device))" \
        in text
    assert ("2.0 KiB (2048 bytes) not written (size cap reached: clc-run --capture-limit)"
            in text)
    assert "PARTIAL" in text and "partial: records of the run are missing from the file" in text
    assert "its counts are whole" in text
    (c,) = to_json([cap])["captures"]
    assert (c["write_lost_bytes"], c["capped_bytes"], c["write_errno"], c["write_error"]) == \
        (5 * 2**20, 2048, errno.ENOSPC, "ENOSPC (No space left on device)")


def test_summary_of_a_capture_cut_mid_record(tmp_path):
    # GIVEN a capture that ends inside a record (the disk filled, or the program was killed)
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.launch(0, 0)
    w.launch(1, 0)
    path = tmp_path / "cut.clc"
    path.write_bytes(w.data()[:-30])
    cap = scan_capture(path)
    text = capture_lines(summary([cap]), cap)
    # THEN the summary names the cut and every cause, not only a crash
    assert "INCOMPLETE" in text and "last 58 bytes not whole records" in text
    assert "was killed (SIGKILL), or its capture could not be written (full disk?)" in text


def deny_example_capture(tmp_path, name="deny.clc", pid=300, denied=20, by_hook=0):
    """A run under policies/deny-example.yaml (no rule records anything) with one --hooks
    hook: the policy record as clc-run writes it, 20 debug launches denied, the first 16
    recorded for audit, and the exit counts per rule."""
    hooks = tmp_path / "h.py"
    hooks.write_text("import clc\n\n@clc.on_launch(kernel='*')\ndef first(launch):\n"
                     "    return None\n")
    _, policy_json = load_policy_and_hooks(str(ROOT / "policies" / "deny-example.yaml"),
                                           [str(hooks)])
    n_rules = len(json.loads(policy_json)["rules"])
    w = CaptureWriter(pid=pid)
    w.process("./app")
    w.policy(policy_json)
    w.kernel(0, "_Z12debug_kernelPi")
    w.kernel(1, VECADD)
    for seq in range(min(denied, abi.DENIED_RECORDED)):
        w.launch(seq, 0, action=abi.ACTION_DENY, rule=0, result=800)
    w.kernel_stats(0, launches=denied, denied=denied, recorded=min(denied, abi.DENIED_RECORDED))
    w.kernel_stats(1, launches=30, denied=by_hook)
    w.rule_stats(0, denied)
    if by_hook:
        w.rule_stats(n_rules, by_hook)
    w.end()
    return scan_capture(w.write(tmp_path / name))


def test_denied_launches_recorded_for_audit(tmp_path):
    cap = deny_example_capture(tmp_path)
    text = summary([cap])
    # THEN the table counts 16 records of 20 denied launches and says why they are recorded
    assert table_row(text, "debug_kernel(int*)") == ["20", "0", "20", "0", "16"] + ["-"] * 8
    assert "The first 16 denied launches of each kernel are recorded for audit" in \
        " ".join(text.split())
    # AND the JSON names the rule that denied them, from the capture's policy
    kernels = {k["mangled"]: k for k in to_json([cap])["kernels"]}
    assert kernels["_Z12debug_kernelPi"]["rules"] == ["no-debug-kernels"]
    assert all(ln["rule"] == "no-debug-kernels" and ln["action"] == "deny"
               for ln in to_json([cap])["launches"])


def denied_by_rule_rows(text):
    lines = text.splitlines()
    i = lines.index("Denied by rule:")
    rows = []
    for ln in lines[i + 3:]:
        if not ln.strip() or ln.strip().startswith("*"):
            break
        count, name = ln.split(None, 1)
        rows.append((count, name))
    return rows


def test_denied_by_rule(tmp_path):
    # GIVEN two processes under the same policy; in one, a --hooks hook denied launches too
    a = deny_example_capture(tmp_path, "a.clc", 300, denied=20, by_hook=7)
    b = deny_example_capture(tmp_path, "b.clc", 301, denied=5)
    text = summary([a, b])
    # THEN the summary lists each rule's denied launches, merged by name, most first
    assert denied_by_rule_rows(text) == [("25", "no-debug-kernels"), ("7", "hook h.py:first")]
    assert to_json([a, b])["denied_by_rule"] == [
        {"rule": "no-debug-kernels", "denied": 25, "partial": False},
        {"rule": "hook h.py:first", "denied": 7, "partial": False}]


def test_denied_by_rule_from_records_is_marked_partial(caps):
    # The crashed child wrote no RULE_STATS; the parent did. Give the child a denied record.
    text = summary(caps)
    assert denied_by_rule_rows(text) == [("1", "deny-scale")]
    caps[0].rule_stats, caps[0].rule_stats_partial = {0: 1}, True
    text = summary(caps)
    assert denied_by_rule_rows(text) == [("1*", "deny-scale")]
    assert "* counted from the recorded denied launches only" in text


def test_summary_explains_columns_only_where_needed(tmp_path):
    # GIVEN a capture with neither graph nodes nor denied launches
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.launch(0, 0)
    w.kernel_stats(0, launches=9, recorded=1)
    w.end()
    plain = summary([scan_capture(w.write(tmp_path / "p.clc"))])
    assert "Graph nodes:" not in plain and "Recorded:" not in plain
    assert "Denied by rule" not in plain
    # AND one with graph nodes: Denied and Recorded count them with the launches
    w.records.insert(-1, w.kernel_stats(0, launches=1, graph_nodes=1, denied=2, recorded=2))
    w.records.pop()
    text = " ".join(summary([scan_capture(w.write(tmp_path / "g.clc"))]).split())
    assert ("Graph nodes: kernel nodes made or changed in CUDA graphs, not launches. Denied, "
            "Failed and Recorded count graph nodes as well as launches.") in text


def test_unmatched_timings_are_reported(tmp_path, capsys):
    # GIVEN a timed launch whose LAUNCH record was lost (a full buffer)
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.launch(0, 0)
    w.timing(0, 0, 10)
    w.timing(1, 0, 20)
    w.end()
    cap = scan_capture(w.write(tmp_path / "t.clc"))
    out = io.StringIO()
    notes = write_report([cap], "json", out)
    assert json.loads(out.getvalue())["unmatched_timings"] == 1
    assert notes == ["1 GPU time matched no launch record: the launch's record was lost, or lay "
                     f"more than {LAUNCH_WINDOW} launch records away in the file"]
    assert write_report([cap], "summary", io.StringIO()) == []


# ---- memory --------------------------------------------------------------------------------

def test_summary_memory_does_not_grow_with_launches(tmp_path):
    # GIVEN a capture of 300,000 launches (read whole, over 100 MB of Python objects)
    path = big_capture(tmp_path / "big.clc", 300_000)
    # WHEN it is scanned and summarized
    tracemalloc.start()
    try:
        text = summary(scan_captures([path]))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN the peak is about the read buffer, and the counts are the exit statistics
    assert table_row(text, VECADD_NAME)[:5] == ["300000", "0", "0", "0", "300000"]
    assert peak < 2 * 2**20


def test_confined_kernels_are_said_with_their_sms(tmp_path):
    # GIVEN a capture whose exit statistics say a kernel ran confined on 32 SMs, another not
    w = CaptureWriter()
    w.process()
    w.kernel(0, VECADD)
    w.kernel(1, SCALE)
    w.kernel_stats(0, launches=5, confined_sms=32)
    w.kernel_stats(1, launches=2)
    w.end()
    path = tmp_path / "c.clc"
    path.write_bytes(w.data())
    cap = read_capture(path)
    # THEN the summary names it with its SMs, and the JSON carries them
    text = summary([cap])
    assert "Confined by a green context (sm_share): 1 kernel" in text
    assert re.search(r"^  32 SMs  vecAdd", text, re.M)
    kernels = {k["mangled"]: k for k in to_json([cap])["kernels"]}
    assert kernels[VECADD]["confined_sms"] == [32] and kernels[SCALE]["confined_sms"] == []



def test_a_wrapped_kernels_counts_read_as_words(tmp_path):
    w = CaptureWriter(pid=5)
    w.process("./app")
    w.wrap_stats("vecAdd", "block_count", blocks=1024, threads=262144, max_resident=132)
    w.wrap_stats("scale", "sm_share share=0.25", blocks=64, threads=8192, skipped=3,
                 max_resident=33, share_sms=33)
    w.end()
    cap = read_capture(w.write(tmp_path / "w.clc"))
    text = summary([cap])
    assert ("  vecAdd (block_count): 1024 blocks run, 262144 threads, 0 blocks skipped, "
            "132 most resident\n") in text
    assert ("  scale (sm_share share=0.25): 64 blocks run, 8192 threads, 3 blocks skipped, "
            "33 most resident, 33 SMs\n") in text
    assert "{" not in text.split("Wrapped kernels")[1]
    assert to_json([cap])["wrapped"] == [
        {"pid": 5, "kernel": "vecAdd", "wrapper": "block_count", "blocks": 1024,
         "threads": 262144, "skipped": 0, "max_resident": 132, "share_sms": 0},
        {"pid": 5, "kernel": "scale", "wrapper": "sm_share share=0.25", "blocks": 64,
         "threads": 8192, "skipped": 3, "max_resident": 33, "share_sms": 33}]


def test_control_characters_of_a_capture_do_not_reach_the_terminal(tmp_path):
    w = CaptureWriter(pid=6)
    w.process("./app \x1b]2;owned\x07")
    w.kernel(0, "_Z1kv")
    w.kernel_stats(0, launches=1)
    w.message("bad \x1b[2J news")
    w.end()
    text = summary([read_capture(w.write(tmp_path / "c.clc"))])
    assert "\x1b" not in text and "\x07" not in text
    assert "./app \\x1b]2;owned\\x07" in text and "bad \\x1b[2J news" in text

# SPDX-License-Identifier: Apache-2.0
"""Reports over captures built by tests/unit/capture_writer.py."""

import json

import pytest

from capture_writer import CaptureWriter
from clc import abi
from clc.capture import read_capture
from clc.reports import summary, to_chrome, to_json, write_report

VECADD = "_Z6vecAddPKfS0_Pfi"
VECADD_NAME = "vecAdd(float const*, float const*, float*, int)"
SCALE = "_Z5scalePff"
SCALE_NAME = "scale(float*, float)"
LONG = "_Z" + "40" + "x" * 40 + "I" + "".join(f"Li{i}E" for i in range(40)) + "Evv"
POLICY = {"rules": [{"name": "deny-scale"}, {"name": "time-vecadd"}]}

CAPTURE_KEYS = {"path", "pid", "ppid", "command", "complete", "dropped"}
KERNEL_KEYS = {"name", "mangled", "devices", "launches", "denied", "recorded", "timed",
               "graph_nodes", "failed", "gpu_ns_total", "gpu_ns_mean", "rules"}
LAUNCH_KEYS = {"pid", "seq", "kernel", "mangled", "t_ns", "grid", "block", "shared_mem",
               "stream", "tid", "entry", "ptsz", "action", "rule", "result", "gpu_ns"}
MODULE_KEYS = {"pid", "t_ns", "api", "image", "handle", "image_ptr", "image_size", "preserved",
               "result", "path"}
MESSAGE_KEYS = {"pid", "level", "text"}


def parent(tmp_path):
    """A complete capture: vecAdd timed, scale denied once."""
    w = CaptureWriter(pid=100, ppid=1, start_monotonic_ns=5_000_000)
    w.process("./app --size 4")
    w.policy(POLICY)
    w.module(path="/opt/app/kernels.cubin", t_ns=5_000_100)
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
    w.end(dropped=4)
    return read_capture(w.write(tmp_path / "100.clc"))


def child(tmp_path):
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
    return read_capture(w.write(tmp_path / "101.clc"))


@pytest.fixture
def caps(tmp_path):
    return [parent(tmp_path), child(tmp_path)]


def table_row(text, name):
    (line,) = [ln for ln in text.splitlines() if ln.endswith(name)]
    return line[:-len(name)].split()


def test_summary_numbers(tmp_path):
    text = summary([parent(tmp_path)])
    assert table_row(text, VECADD_NAME) == ["10", "0", "0", "2", "6.000", "3000.000", "0"]
    assert table_row(text, SCALE_NAME) == ["3", "1", "0", "1", "-", "-", "2"]
    assert table_row(text, "Total (2 kernels)") == ["13", "1", "0", "3", "6.000", "3000.000",
                                                    "2"]
    lines = text.splitlines()
    header = next(ln for ln in lines if "Launches" in ln)
    for col in ("Launches", "Denied", "Failed", "Recorded", "GPU total (ms)", "GPU mean (us)",
                "Graph nodes", "Kernel"):
        assert col in header
    # Sorted by launches, most first.
    assert lines.index(next(ln for ln in lines if ln.endswith(VECADD_NAME))) < \
        lines.index(next(ln for ln in lines if ln.endswith(SCALE_NAME)))


def test_summary_capture_lines_and_messages(caps):
    text = summary(caps)
    first, second = text.splitlines()[:2]
    assert first.startswith(caps[0].path) and "pid 100" in first and "./app --size 4" in first
    assert "complete" in first and "4 records dropped" in first
    assert second.startswith(caps[1].path) and "INCOMPLETE (program crashed?)" in second
    assert "dropped" not in second
    # Both processes warned the same; it shows once.
    assert text.count("kernel scale denied") == 1
    assert "error: bridge not found" in text


def test_summary_merges_and_marks_partial(caps):
    text = summary(caps)
    # vecAdd: 10 launches from the parent's stats, 1 derived from the child's records.
    assert table_row(text, VECADD_NAME) == ["11*", "0*", "0*", "3", "9.000", "3000.000", "0*"]
    assert "partial" in text


def test_summary_truncates_long_names(caps):
    long_name = to_json(caps)["kernels"][-1]["name"]
    assert len(long_name) > 120
    text = summary(caps)
    assert long_name not in text
    assert any(ln.endswith("...") for ln in text.splitlines())
    assert max(len(ln) for ln in text.splitlines() if "Kernel" not in ln
               and "partial" not in ln) < 200


def test_summary_of_nothing():
    assert summary([]).strip()


def test_json_schema(caps):
    doc = json.loads(json.dumps(to_json(caps)))
    assert set(doc) == {"version", "captures", "kernels", "launches", "modules", "messages"}
    assert doc["version"] == 1
    assert all(set(c) == CAPTURE_KEYS for c in doc["captures"])
    assert all(set(k) == KERNEL_KEYS for k in doc["kernels"])
    assert all(set(ln) == LAUNCH_KEYS for ln in doc["launches"])
    assert all(set(m) == MODULE_KEYS for m in doc["modules"])
    assert all(set(m) == MESSAGE_KEYS for m in doc["messages"])

    assert doc["captures"][0] == {"path": caps[0].path, "pid": 100, "ppid": 1,
                                  "command": "./app --size 4", "complete": True, "dropped": 4}
    assert doc["captures"][1]["complete"] is False


def test_json_kernels(caps):
    kernels = {k["mangled"]: k for k in to_json(caps)["kernels"]}
    assert set(kernels) == {VECADD, SCALE, LONG}
    vec = kernels[VECADD]
    assert vec == {"name": VECADD_NAME, "mangled": VECADD, "devices": [0, 1], "launches": 11,
                   "denied": 0, "recorded": 3, "timed": 3, "graph_nodes": 0, "failed": 0,
                   "gpu_ns_total": 9_000_000, "gpu_ns_mean": 3_000_000.0,
                   "rules": ["child-rule", "time-vecadd"]}
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

# SPDX-License-Identifier: Apache-2.0
"""`clc report --format chrome`: a Chrome trace event file (chrome://tracing, Perfetto) of
the launches, their GPU time, loads and messages, written one event at a time."""

import json

from clc import abi
from clc.capture.per_launch import Picker, run_start
from clc.capture.reader import launch_stream
from clc.capture.reporters.json_doc import unmatched_timings
from clc.capture.reporters.progress import Progress
from clc.capture.rows import View

__all__ = ["to_chrome", "write_chrome"]

LAUNCH_DUR_US = 1.0  # nominal width of a CPU-side launch in the trace, so it can be clicked
# Real tids stay below pid_max (at most 2**22); trace viewers read tids as 32-bit numbers.
GPU_TID_BASE = 0x40000000


def _meta(name, pid, tid, value):
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": value}


def _chrome_events(captures, streams, view=None):
    base = run_start(captures)
    pick = Picker(captures, view or View())

    def us(t_ns):
        return (t_ns - base) / 1e3

    for cap in captures:
        pid = cap.pid
        yield _meta("process_name", pid, 0, {"name": f"{cap.command or '?'} (pid {pid})"})
        if cap.partial:
            yield _meta("process_labels", pid, 0, {"labels": "partial capture: launches missing"})
        gpu_tids = {}
        cpu_tids = set()
        stream = launch_stream(cap)
        streams.append(stream)
        for ln in pick.launches(cap, stream):
            name = cap.kernel(ln.kernel_id).name
            cpu_tids.add(ln.tid)
            args = {
                "seq": ln.seq,
                "grid": list(ln.grid),
                "block": list(ln.block),
                "shared_mem": ln.shared_mem,
                "stream": f"{ln.stream:#x}",
                "entry": ln.entry_name + ("_ptsz" if ln.ptsz else ""),
                "action": ln.action_name,
                "rule": cap.rule_name(ln.rule),
                "result": ln.result,
            }
            if ln.gpu_ns is not None:
                args["gpu_ns"] = ln.gpu_ns
            yield {"ph": "X", "name": name,
                   "cat": "denied" if ln.action == abi.ACTION_DENY else "launch",
                   "pid": pid, "tid": ln.tid, "ts": us(ln.t_ns), "dur": LAUNCH_DUR_US,
                   "args": args}
            if ln.gpu_ns is None:
                continue
            tid = gpu_tids.get(ln.stream)
            if tid is None:
                tid = gpu_tids[ln.stream] = GPU_TID_BASE + len(gpu_tids)
            yield {"ph": "X", "name": name, "cat": "gpu", "pid": pid, "tid": tid,
                   "ts": us(ln.t_ns), "dur": ln.gpu_ns / 1e3,
                   "args": {"seq": ln.seq, "gpu_ns": ln.gpu_ns,
                            "note": "GPU start approximated by the launch's CPU time; "
                                    "the duration is measured"}}
        for tid in sorted(cpu_tids):
            yield _meta("thread_name", pid, tid,
                        {"name": "main thread" if tid == pid else f"thread {tid}"})
        for s, tid in gpu_tids.items():
            yield _meta("thread_name", pid, tid, {"name": f"GPU stream {s:#x}"})
            # Below the CPU threads, which sort by tid.
            yield _meta("thread_sort_index", pid, tid, {"sort_index": tid})
        for m in (m for m in cap.modules if pick.in_window(m.t_ns)):
            yield {"ph": "i", "s": "p", "name": m.api_name, "cat": "module",
                   "pid": pid, "tid": pid, "ts": us(m.t_ns),
                   "args": {"image": m.image_name, "handle": f"{m.handle:#x}",
                            "image_size": m.image_size, "path": m.path,
                            "result": m.result}}
        for m in (m for m in cap.messages if pick.in_window(m.t_ns)):
            yield {"ph": "i", "s": "p", "name": f"clc {m.level_name}",
                   "cat": "message", "pid": pid, "tid": pid, "ts": us(m.t_ns),
                   "args": {"text": m.text}}


def to_chrome(captures, view=None):
    """A Chrome trace event file (chrome://tracing, Perfetto) of launches, GPU time, loads, in
    memory; write_chrome streams the same."""
    captures = list(captures)
    return {"traceEvents": list(_chrome_events(captures, [], view)), "displayTimeUnit": "ns"}


def write_chrome(captures, out, view=None):
    """Write to_chrome's trace to the text file `out`, one event at a time; returns the number
    of GPU times matched to no launch record."""
    captures = list(captures)
    streams = []
    out.write('{"traceEvents":[')
    sep = ""
    progress = Progress(sum(c.launch_records for c in captures), "clc report: trace", out)
    try:
        for event in _chrome_events(captures, streams, view):
            out.write(sep)
            out.write(json.dumps(event, separators=(",", ":")))
            sep = ","
            if event.get("cat") in ("launch", "denied"):
                progress.step()
    finally:
        progress.close()
    out.write('],"displayTimeUnit":"ns"}\n')
    return unmatched_timings(streams)


# SPDX-License-Identifier: Apache-2.0
"""Reports computed from captures: a text summary, JSON, and a Chrome/Perfetto trace.

Per-kernel figures merge kernel ids by mangled name, so one kernel loaded in two contexts or
launched by two processes is one row.
"""

import json
import sys
from dataclasses import dataclass, field

from clc import abi

__all__ = ["FORMATS", "summary", "to_json", "to_chrome", "write_report"]

FORMATS = ("summary", "json", "chrome")

JSON_VERSION = 1
KERNEL_WIDTH = 100  # summary column; the json carries the full name
LAUNCH_DUR_US = 1.0  # nominal width of a CPU-side launch in the trace, so it can be clicked
# Real tids stay below pid_max (at most 2**22); trace viewers read tids as 32-bit numbers.
GPU_TID_BASE = 0x40000000


@dataclass
class _Row:
    name: str
    mangled: str
    devices: set = field(default_factory=set)
    launches: int = 0
    denied: int = 0
    recorded: int = 0
    timed: int = 0
    graph_nodes: int = 0
    gpu_ns: int = 0
    failed: int = 0
    rules: set = field(default_factory=set)
    partial: bool = False


def _kernel_rows(captures):
    """One _Row per kernel (merged by mangled name), most launched first."""
    rows = {}
    for ci, cap in enumerate(captures):
        keys = {}
        for kid, k in cap.kernels.items():
            # Stand-ins for ids whose KERNEL record was lost have no name to merge by.
            key = k.mangled if k.mangled else (ci, kid)
            keys[kid] = key
            row = rows.get(key)
            if row is None:
                row = rows[key] = _Row(k.name, k.mangled)
            if k.device >= 0:
                row.devices.add(k.device)
        for kid, st in cap.stats.items():
            row = rows[keys[kid]]
            row.launches += st.launches
            row.denied += st.denied
            row.recorded += st.recorded
            row.timed += st.timed
            row.graph_nodes += st.graph_nodes
            row.gpu_ns += st.gpu_ns
            row.failed += st.failed
            row.partial |= st.partial
        for ln in cap.launches:
            rows[keys[ln.kernel_id]].rules.add(cap.rule_name(ln.rule))
    return sorted(rows.values(), key=lambda r: (-r.launches, -r.graph_nodes, r.name))


# ---- summary ----------------------------------------------------------------------------------

def _capture_line(cap):
    parts = [f"pid {cap.pid}", f"command: {cap.command or '?'}",
             "complete" if cap.complete else "INCOMPLETE (program crashed?)"]
    if cap.dropped:
        parts.append(f"{cap.dropped} records dropped (buffers full)")
    return f"{cap.path}: " + ", ".join(parts)


def _truncate(name, width):
    return name if len(name) <= width else name[:width - 3] + "..."


def _gpu_cells(timed, gpu_ns):
    if not timed:
        return "-", "-"
    return f"{gpu_ns / 1e6:.3f}", f"{gpu_ns / timed / 1e3:.3f}"


def _row_cells(launches, denied, failed, recorded, timed, gpu_ns, graph_nodes, partial, name):
    total, mean = _gpu_cells(timed, gpu_ns)
    mark = "*" if partial else ""
    return [f"{launches}{mark}", f"{denied}{mark}", f"{failed}{mark}", f"{recorded}", total,
            mean, f"{graph_nodes}{mark}", name]


def summary(captures):
    """A text report in the manner of `nsys stats`: captures, a per-kernel table, messages."""
    captures = list(captures)
    if not captures:
        return "no captures\n"
    out = [_capture_line(cap) for cap in captures]
    out.append("")

    rows = _kernel_rows(captures)
    headers = ["Launches", "Denied", "Failed", "Recorded", "GPU total (ms)", "GPU mean (us)",
               "Graph nodes", "Kernel"]
    table = [_row_cells(r.launches, r.denied, r.failed, r.recorded, r.timed, r.gpu_ns, r.graph_nodes,
                        r.partial, _truncate(r.name, KERNEL_WIDTH)) for r in rows]
    partial = any(r.partial for r in rows)
    table.append(_row_cells(
        sum(r.launches for r in rows), sum(r.denied for r in rows),
        sum(r.failed for r in rows), sum(r.recorded for r in rows), sum(r.timed for r in rows),
        sum(r.gpu_ns for r in rows), sum(r.graph_nodes for r in rows), partial,
        f"Total ({len(rows)} kernel{'' if len(rows) == 1 else 's'})"))
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(headers)]

    def line(cells):
        nums = [c.rjust(w) for c, w in zip(cells[:-1], widths)]
        return "  ".join(nums + [cells[-1]]).rstrip()

    out.append(line(headers))
    out.append(line(["-" * w for w in widths[:-1]] + ["-" * widths[-1]]))
    out.extend(line(t) for t in table[:-1])
    out.append(line(["-" * w for w in widths[:-1]] + ["-" * widths[-1]]))
    out.append(line(table[-1]))
    if partial:
        out.append("")
        out.append("* partial: the shim wrote no exit statistics (did the program crash?);")
        out.append("  counts come from the LAUNCH records alone, so unrecorded launches are "
                   "missing.")

    counts = {}
    for cap in captures:
        for m in cap.messages:
            key = (m.level_name, m.text)
            counts[key] = counts.get(key, 0) + 1
    if counts:
        out.append("")
        out.append("Messages:")
        for (level, text), n in counts.items():
            # A traceback was shown when it happened and stays in the JSON report.
            first, _, rest = text.partition("\n")
            more = " (traceback: clc report --format json)" if rest else ""
            out.append(f"  {level}: {first}{more}" + (f" (x{n})" if n > 1 else ""))
    return "\n".join(out) + "\n"


# ---- json -------------------------------------------------------------------------------------

def to_json(captures):
    """Everything in the captures as plain data (schema version JSON_VERSION)."""
    captures = list(captures)
    kernels = [{
        "name": r.name,
        "mangled": r.mangled,
        "devices": sorted(r.devices),
        "launches": r.launches,
        "denied": r.denied,
        "recorded": r.recorded,
        "timed": r.timed,
        "graph_nodes": r.graph_nodes,
        "failed": r.failed,
        "gpu_ns_total": r.gpu_ns,
        "gpu_ns_mean": r.gpu_ns / r.timed if r.timed else None,
        "rules": sorted(r.rules),
    } for r in _kernel_rows(captures)]
    launches = [{
        "pid": cap.pid,
        "seq": ln.seq,
        "kernel": cap.kernels[ln.kernel_id].name,
        "mangled": cap.kernels[ln.kernel_id].mangled,
        "t_ns": ln.t_ns,
        "grid": list(ln.grid),
        "block": list(ln.block),
        "shared_mem": ln.shared_mem,
        "stream": ln.stream,
        "tid": ln.tid,
        "entry": ln.entry_name,
        "ptsz": ln.ptsz,
        "action": ln.action_name,
        "rule": cap.rule_name(ln.rule),
        "result": ln.result,
        "gpu_ns": ln.gpu_ns,
    } for cap in captures for ln in cap.launches]
    modules = [{
        "pid": cap.pid,
        "t_ns": m.t_ns,
        "api": m.api_name,
        "image": m.image_name,
        "handle": m.handle,
        "image_ptr": m.image_ptr,
        "image_size": m.image_size,
        "preserved": bool(m.preserved),
        "result": m.result,
        "path": m.path,
    } for cap in captures for m in cap.modules]
    messages = [{"pid": cap.pid, "level": m.level_name, "text": m.text}
                for cap in captures for m in cap.messages]
    return {
        "version": JSON_VERSION,
        "captures": [{"path": c.path, "pid": c.pid, "ppid": c.ppid, "command": c.command,
                      "complete": c.complete, "dropped": c.dropped} for c in captures],
        "kernels": kernels,
        "launches": launches,
        "modules": modules,
        "messages": messages,
    }


# ---- chrome trace -----------------------------------------------------------------------------

def _meta(name, pid, tid, value):
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": value}


def to_chrome(captures):
    """A Chrome trace event file (chrome://tracing, Perfetto) of launches, GPU time, loads."""
    captures = list(captures)
    base = min((c.start_monotonic_ns for c in captures), default=0)

    def us(t_ns):
        return (t_ns - base) / 1e3

    events = []
    for cap in captures:
        pid = cap.pid
        events.append(_meta("process_name", pid, 0,
                            {"name": f"{cap.command or '?'} (pid {pid})"}))
        gpu_tids = {}
        cpu_tids = set()
        for ln in cap.launches:
            name = cap.kernels[ln.kernel_id].name
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
            events.append({"ph": "X", "name": name,
                           "cat": "denied" if ln.action == abi.ACTION_DENY else "launch",
                           "pid": pid, "tid": ln.tid, "ts": us(ln.t_ns), "dur": LAUNCH_DUR_US,
                           "args": args})
            if ln.gpu_ns is None:
                continue
            tid = gpu_tids.get(ln.stream)
            if tid is None:
                tid = gpu_tids[ln.stream] = GPU_TID_BASE + len(gpu_tids)
            events.append({"ph": "X", "name": name, "cat": "gpu", "pid": pid, "tid": tid,
                           "ts": us(ln.t_ns), "dur": ln.gpu_ns / 1e3,
                           "args": {"seq": ln.seq, "gpu_ns": ln.gpu_ns,
                                    "note": "GPU start approximated by the launch's CPU time; "
                                            "the duration is measured"}})
        for tid in sorted(cpu_tids):
            events.append(_meta("thread_name", pid, tid,
                                {"name": "main thread" if tid == pid else f"thread {tid}"}))
        for stream, tid in gpu_tids.items():
            events.append(_meta("thread_name", pid, tid, {"name": f"GPU stream {stream:#x}"}))
            # Below the CPU threads, which sort by tid.
            events.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        for m in cap.modules:
            events.append({"ph": "i", "s": "p", "name": m.api_name, "cat": "module",
                           "pid": pid, "tid": pid, "ts": us(m.t_ns),
                           "args": {"image": m.image_name, "handle": f"{m.handle:#x}",
                                    "image_size": m.image_size, "path": m.path,
                                    "result": m.result}})
        for m in cap.messages:
            events.append({"ph": "i", "s": "p", "name": f"clc {m.level_name}",
                           "cat": "message", "pid": pid, "tid": pid, "ts": us(m.t_ns),
                           "args": {"text": m.text}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


# ---- output -----------------------------------------------------------------------------------

def write_report(captures, fmt, out=None):
    """Write the `fmt` report (one of FORMATS) of `captures` to the path `out`, or stdout."""
    if fmt == "summary":
        text = summary(captures)
    elif fmt == "json":
        text = json.dumps(to_json(captures), indent=2) + "\n"
    elif fmt == "chrome":
        text = json.dumps(to_chrome(captures), separators=(",", ":")) + "\n"
    else:
        raise ValueError(f"unknown report format {fmt!r} (one of {', '.join(FORMATS)})")
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)

# SPDX-License-Identifier: Apache-2.0
"""`clc report --format json`: everything in the captures as plain data (schema version
JSON_VERSION; clc/schemas/), the kernels' rows with the columns of clc.capture.columns that
the JSON shows, the launches written one at a time."""

import json

from clc.capture.cells import ending
from clc.capture.columns import Frame, json_columns
from clc.capture.per_launch import Picker
from clc.capture.reader import error_name, launch_stream
from clc.capture.reporters.progress import Progress
from clc.capture.rows import View, kernel_rows, rule_rows

__all__ = ["JSON_VERSION", "to_json", "write_json", "unmatched_timings"]

JSON_VERSION = 1


def _json_captures(captures):
    return [{
        "path": c.path, "pid": c.pid, "ppid": c.ppid, "command": c.command,
        "complete": c.complete, "dropped": c.dropped,
        "write_lost_bytes": c.write_lost_bytes, "capped_bytes": c.capped_bytes,
        "write_errno": c.write_errno,
        "write_error": error_name(c.write_errno) if c.write_errno else None,
        "trailing_bytes": c.trailing_bytes, "launch_records": c.launch_records,
        "timing_records": c.timing_records, "timing_sources": c.timing_sources,
        "on_error_launches": c.on_error_launches,
        "stats_partial": c.stats_partial, "partial": c.partial, "ending": ending(c),
        "table_full": c.table_full,
        "truncated": c.truncated, "undecided_launches": c.undecided_launches,
        "run": c.run,
        "devices": [{"device": d, "uuid": u} for d, u in sorted(c.devices.items())],
        "holds": [{"t_ns": h.t_ns, "held_ns": h.held_ns, "lag_ns": h.lag_ns,
                   "device": h.device, "no_board": h.no_board, "by_floor": h.by_floor,
                   "shared": h.shared, "reserve": h.reserve, "slo": h.slo}
                  for h in c.holds],
    } for c in captures]


def _json_kernels(captures, view):
    columns = json_columns(view.percentiles)
    frame = Frame()
    return [{c.json: c.value(r, frame) for c in columns}
            for r in kernel_rows(captures, times=True) if view.shows(r)]


def _json_rules(captures):
    return [{"rule": name, "denied": n, "partial": p} for name, n, p in rule_rows(captures)]


def _json_launches(cap, stream):
    pid = cap.pid
    for ln in stream:
        k = cap.kernel(ln.kernel_id)
        yield {
            "pid": pid,
            "seq": ln.seq,
            "kernel": k.name,
            "mangled": k.mangled,
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
        }


def _json_modules(captures, pick):
    return [{
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
    } for cap in captures for m in cap.modules if pick.in_window(m.t_ns)]


def _json_wrapped(captures):
    return [{"pid": cap.pid, "kernel": w.kernel, "wrapper": w.wrapper, "blocks": w.blocks,
             "threads": w.threads, "skipped": w.skipped, "max_resident": w.max_resident,
             "share_sms": w.share_sms}
            for cap in captures for w in cap.wrap_stats]


def _json_messages(captures, pick):
    return [{"pid": cap.pid, "level": m.level_name, "text": m.text}
            for cap in captures for m in cap.messages if pick.in_window(m.t_ns)]


def _head(captures, view):
    head = {"version": JSON_VERSION, "captures": _json_captures(captures),
            "kernels": _json_kernels(captures, view), "denied_by_rule": _json_rules(captures)}
    if view.filtered or view.t_from is not None or view.t_to is not None:
        # a reader of the file must know its launches are not all of the run's
        head["selection"] = {"kernels": list(view.kernels), "kernel_regex": view.kernel_regex,
                             "from_s": view.t_from, "to_s": view.t_to}
    return head


def unmatched_timings(streams):
    return sum(s.unmatched_timings for s in streams)


def to_json(captures, view=None):
    """Everything in the captures as plain data (schema version JSON_VERSION), launches
    included: in memory, for small captures; write_json streams the same document."""
    captures = list(captures)
    view = view or View()
    pick = Picker(captures, view)
    streams = [launch_stream(cap) for cap in captures]
    doc = _head(captures, view)
    doc["launches"] = [d for cap, s in zip(captures, streams)
                       for d in _json_launches(cap, pick.launches(cap, s))]
    doc["unmatched_timings"] = unmatched_timings(streams)
    doc["modules"] = _json_modules(captures, pick)
    doc["wrapped"] = _json_wrapped(captures)
    doc["messages"] = _json_messages(captures, pick)
    return doc


def write_json(captures, out, view=None):
    """Write to_json's document to the text file `out`, one launch at a time (one launch a
    line); returns the number of GPU times matched to no launch record."""
    captures = list(captures)
    view = view or View()
    pick = Picker(captures, view)

    def item(key, value, last=False):
        text = json.dumps(value, indent=2).replace("\n", "\n  ")
        out.write(f"  {json.dumps(key)}: {text}{'' if last else ','}\n")

    out.write("{\n")
    for key, value in _head(captures, view).items():
        item(key, value)
    out.write('  "launches": [')
    sep = "\n    "
    streams = []
    progress = Progress(sum(c.launch_records for c in captures), "clc report: JSON", out)
    try:
        for cap in captures:
            stream = launch_stream(cap)
            streams.append(stream)
            for d in _json_launches(cap, pick.launches(cap, stream)):
                out.write(sep)
                out.write(json.dumps(d))
                sep = ",\n    "
                progress.step()
    finally:
        progress.close()
    out.write("\n  ],\n" if sep != "\n    " else "],\n")
    unmatched = unmatched_timings(streams)
    item("unmatched_timings", unmatched)
    item("modules", _json_modules(captures, pick))
    item("wrapped", _json_wrapped(captures))
    item("messages", _json_messages(captures, pick), last=True)
    out.write("}\n")
    return unmatched


# SPDX-License-Identifier: Apache-2.0
"""Reading the capture files the shim writes (layout: shim/clc_abi.h, mirrored in clc.abi;
described for users in docs/capture.md).

A capture can hold millions of launches, so it is read as a stream of records through a
buffer of fixed size. `scan_capture` makes one pass and keeps what does not grow with the
launches (kernels, their counts, per-rule counts, modules, messages, the END record);
`launch_stream` then reads the LAUNCH records again, one at a time. `read_capture` also keeps
every launch in a list, sorted by seq: for tests and small captures.

The reader is lenient where a crashed program or a full disk leaves its mark (a file cut
short, a copy of the counts cut short or never written) and strict where the file is not a
capture at all.

The reader is in rooms: the record scanner (clc.capture.records), the Capture model
(clc.capture.model), the counts' copies (clc.capture.counts) and the launch stream
(clc.capture.launches); what they export is importable from here as well.
"""

import json

from clc import abi
from clc.capture.counts import counts_entry, derive, embedded, merge_capture_counts, newest_copy
from clc.capture.launches import LAUNCH_WINDOW, LaunchStream, launch_record, launch_stream
from clc.capture.model import (LEVEL_NAMES, Capture, Hold, Kernel, KernelStatsRecord,
                               LaunchRecord, Message, Module, WrapStats, error_name, gpu_uuid)
from clc.capture.records import (CHUNK, MAX_GPU_NS, MAX_RECORD, CaptureError, Records,
                                 checked_gpu_ns, file_kind, gpu_times, named, open_capture,
                                 body_text)
from clc.demangle import demangle

__all__ = [
    "CaptureError", "Capture", "Kernel", "LaunchRecord", "Module", "Message", "Hold",
    "KernelStatsRecord", "WrapStats",
    "LEVEL_NAMES", "gpu_uuid", "gpu_times", "newest_copy", "read_capture", "read_captures",
    "scan_capture", "scan_captures",
    "launch_stream", "LaunchStream", "LAUNCH_WINDOW", "MAX_GPU_NS", "error_name", "file_kind",
    "CHUNK", "MAX_RECORD",
]

# What the counts derived from LAUNCH records need: kernel_id, entry, action, rule, result.
_LAUNCH_COUNTED = abi.REC_LAUNCH_FIELDS.picker("kernel_id", "entry", "action", "rule", "result")


def _scan(path, keep_launches):
    path = str(path)
    f, fields, size = open_capture(path)
    (_, _, header_size, pid, ppid, start_mono, start_real) = fields
    cap = Capture(path=path, pid=pid, ppid=ppid, start_monotonic_ns=start_mono,
                  start_realtime_ns=start_real, header_size=header_size,
                  launches=[] if keep_launches else None)
    # Counts of (kernel_id, entry, action, rule, result) over the LAUNCH records, and
    # kernel_id -> [TIMING records, their gpu_ns]: what derived statistics and the per-kernel
    # rules need, in memory that grows with kernels and rules, not launches.
    launch_counts = {}
    timing_sums = {}
    timing_sources = {}  # clc_rec_timing.source -> records
    raw_launches = []
    timings = {}
    rule_stats = {}
    launch_size = abi.REC_LAUNCH_BODY.size
    timing = abi.REC_TIMING_BODY
    counted = _LAUNCH_COUNTED.unpack_from
    records = Records(f, header_size, size)
    try:
        for rtype, buf, b, e in records:
            if rtype != abi.REC_PAD:
                cap.complete = False  # until an END record follows
            if rtype == abi.REC_LAUNCH:
                if e - b >= launch_size:
                    key = counted(buf, b)
                    launch_counts[key] = launch_counts.get(key, 0) + 1
                    if keep_launches:
                        raw_launches.append(abi.REC_LAUNCH_BODY.unpack_from(buf, b))
            elif rtype == abi.REC_TIMING:
                if e - b >= timing.size:
                    seq, kid, source, gpu_ns = timing.unpack_from(buf, b)
                    gpu_ns = checked_gpu_ns(path, records, b, gpu_ns)
                    timing_sources[source] = timing_sources.get(source, 0) + 1
                    t = timing_sums.get(kid)
                    if t is None:
                        t = timing_sums[kid] = [0, 0]
                    t[0] += 1
                    t[1] += gpu_ns
                    if keep_launches:
                        timings.setdefault(seq, gpu_ns)
            elif rtype != abi.REC_PAD:
                _other_record(cap, rtype, buf[b:e], rule_stats)
    except OSError as e:
        raise CaptureError(path, f"cannot read: {e.strerror or e}") from None
    finally:
        f.close()
    cap.trailing_bytes = records.trailing

    cap.launch_records = sum(launch_counts.values())
    cap.timing_records = sum(n for n, _ in timing_sums.values())
    cap.timing_sources = {abi.TIMING_SOURCES.get(s, str(s)): n
                          for s, n in sorted(timing_sources.items())}
    if keep_launches:
        raw_launches.sort(key=lambda r: r[0])
        cap.launches = [launch_record(r, timings.get(r[0])) for r in raw_launches]
    cap.modules.sort(key=lambda m: m.t_ns)
    cap.messages.sort(key=lambda m: m.t_ns)
    derive(cap, launch_counts, timing_sums, rule_stats)
    return cap


def _other_record(cap, rtype, body, rule_stats):
    if rtype == abi.REC_KERNEL:
        s = abi.REC_KERNEL_BODY
        if len(body) >= s.size:
            kid, device, handle, ctx, t_ns = s.unpack_from(body)
            mangled = body_text(body[s.size:])
            cap.kernels.setdefault(kid, Kernel(kid, device, handle, ctx, t_ns, mangled,
                                               demangle(mangled)))
    elif rtype == abi.REC_DEVICE:
        if len(body) >= abi.REC_DEVICE_BODY.size:
            device, uuid = abi.REC_DEVICE_BODY.unpack_from(body)
            cap.devices[device] = gpu_uuid(uuid)
    elif rtype == abi.REC_PROCESS:
        s = abi.REC_PROCESS_BODY
        if len(body) >= s.size:
            cap.command = body_text(body[s.size:])
    elif rtype == abi.REC_POLICY:
        try:
            policy = json.loads(body_text(body))
        except (ValueError, RecursionError):  # not JSON, or nested deeper than json reads
            policy = None
        cap.policy = policy if isinstance(policy, dict) else None
    elif rtype == abi.REC_RUN:
        try:
            run = json.loads(body_text(body))
        except (ValueError, RecursionError):
            run = None
        cap.run = run if isinstance(run, dict) else {}
    elif rtype == abi.REC_MODULE:
        s = abi.REC_MODULE_BODY
        if len(body) >= s.size:
            t_ns, api, image, handle, ptr, isize, preserved, result = s.unpack_from(body)
            cap.modules.append(Module(
                t_ns, api, image, handle, ptr, isize, preserved, result,
                named(abi.LOAD_NAMES, api, "api"), named(abi.IMAGE_NAMES, image, "image"),
                body_text(body[s.size:]) or None))
    elif rtype == abi.REC_COUNTS:
        copy = newest_copy(body)
        if copy is not None:
            head, records = copy
            merge_capture_counts(cap, head["dropped"], head["write_lost_bytes"],
                                  head["capped_bytes"], head["write_errno"], head["flags"],
                                  head["undecided"])
            for kind, entry in embedded(records):
                counts_entry(cap, kind, entry, rule_stats)
    elif rtype == abi.REC_MESSAGE:
        s = abi.REC_MESSAGE_BODY
        if len(body) >= s.size:
            level, t_ns = s.unpack_from(body)
            cap.messages.append(Message(level, t_ns, body_text(body[s.size:]),
                                        named(LEVEL_NAMES, level, "level")))
    elif rtype == abi.REC_HOLD:
        if len(body) >= abi.REC_HOLD_BODY.size:
            t_ns, held, lag, device, why = abi.REC_HOLD_BODY.unpack_from(body)
            cap.holds.append(Hold(t_ns, held, lag, device, (why & 15) == abi.HOLD_NO_BOARD,
                                  bool(why & abi.HOLD_FLOOR), bool(why & abi.HOLD_SHARED),
                                  bool(why & abi.HOLD_RESERVE), bool(why & abi.HOLD_SLO)))
    elif rtype == abi.REC_WRAP_STATS:
        s = abi.REC_WRAP_STATS_BODY
        if len(body) >= s.size:
            kernel, _, wrapper = bytes(body[s.size:]).partition(b"\0")
            cap.wrap_stats.append(WrapStats(
                kernel.decode("utf-8", "replace"), body_text(wrapper),
                **dict(zip(abi.REC_WRAP_STATS_FIELDS.names, s.unpack_from(body)))))
    elif rtype == abi.REC_END:
        if len(body) >= abi.REC_END_BODY.size:
            (_, dropped, lost, capped, write_errno, cap.end_how, cap.exit_status, flags,
             undecided) = abi.REC_END_BODY.unpack_from(body)
            merge_capture_counts(cap, dropped, lost, capped, write_errno, flags, undecided)
            cap.complete = True
    # Any other type comes from a newer writer; its size already moved us past it.


def read_capture(path):
    """Read one capture file whole into a Capture, every launch in `launches` (sorted by seq);
    CaptureError when it is not a readable capture. Memory grows with the launches: reports
    use scan_capture."""
    return _scan(path, True)


def read_captures(paths):
    """Read several captures (a program and each child process write their own file)."""
    return [read_capture(p) for p in paths]


def scan_capture(path):
    """Read one capture in one streaming pass, in memory that does not grow with its
    launches: everything but the launches (`launches` is None; see launch_stream)."""
    return _scan(path, False)


def scan_captures(paths):
    """scan_capture of each file."""
    return [scan_capture(p) for p in paths]

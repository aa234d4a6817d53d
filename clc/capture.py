# SPDX-License-Identifier: Apache-2.0
"""Reading the capture files the shim writes (layout: shim/clc_abi.h, mirrored in clc.abi).

A capture is read whole into plain dataclasses; reports are computed from those afterwards.
The reader is lenient where a crashed program leaves its mark (a file cut short, KERNEL_STATS
never written) and strict where the file is not a capture at all.
"""

import json
import struct
from dataclasses import dataclass, field
from typing import Optional

from clc import abi
from clc.demangle import demangle

__all__ = [
    "CaptureError", "Capture", "Kernel", "Launch", "Module", "Message", "KernelStats",
    "LEVEL_NAMES", "read_capture", "read_captures",
]

LEVEL_NAMES = {abi.MSG_INFO: "info", abi.MSG_WARNING: "warning", abi.MSG_ERROR: "error"}

_DIRECT_ENTRIES = (abi.ENTRY_LAUNCH, abi.ENTRY_LAUNCH_EX, abi.ENTRY_LAUNCH_COOPERATIVE)


class CaptureError(Exception):
    """A file that cannot be read as a capture at all."""

    def __init__(self, path, message):
        super().__init__(f"{path}: {message}")
        self.path = str(path)
        self.message = message


@dataclass(slots=True)
class Kernel:
    kernel_id: int
    device: int
    handle: int
    ctx: int
    t_ns: int
    mangled: str
    name: str


@dataclass(slots=True)
class Launch:
    seq: int
    t_ns: int
    stream: int
    kernel_id: int
    entry: int
    grid: tuple
    block: tuple
    shared_mem: int
    tid: int
    action: int
    rule: int
    result: int
    gpu_ns: Optional[int]
    entry_name: str
    ptsz: bool
    action_name: str


@dataclass(slots=True)
class Module:
    t_ns: int
    api: int
    image_kind: int
    handle: int
    image_ptr: int
    image_size: int
    preserved: int
    result: int
    api_name: str
    image_name: str
    path: Optional[str]


@dataclass(slots=True)
class Message:
    level: int
    t_ns: int
    text: str
    level_name: str


@dataclass(slots=True)
class KernelStats:
    kernel_id: int
    launches: int
    denied: int
    recorded: int
    timed: int
    graph_nodes: int
    gpu_ns: int
    failed: int
    # True when the shim never wrote this kernel's KERNEL_STATS (it died before exit) and the
    # counts were derived from the records that exist: launches it did not record are missing.
    partial: bool = False


@dataclass
class Capture:
    path: str
    pid: int
    ppid: int
    start_monotonic_ns: int
    start_realtime_ns: int
    command: str = ""
    policy: Optional[dict] = None
    kernels: dict = field(default_factory=dict)
    launches: list = field(default_factory=list)
    modules: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    complete: bool = False
    dropped: int = 0

    @property
    def stats_partial(self):
        """True when some kernel's counts are derived rather than the shim's exit totals."""
        return any(s.partial for s in self.stats.values())

    def rule_name(self, rule):
        """The policy's name for a LAUNCH record's `rule`."""
        if rule == abi.RULE_DEFAULT:
            return "default"
        if rule == abi.RULE_ON_ERROR:
            return "on_error"
        policy = self.policy if isinstance(self.policy, dict) else {}
        rules = policy.get("rules") if isinstance(policy.get("rules"), list) else []
        if 0 <= rule < len(rules) and isinstance(rules[rule], dict):
            name = rules[rule].get("name")
            if isinstance(name, str) and name:
                return name
        # Python hooks from --hooks files are numbered after the rules (clc-run writes their
        # names into the policy it passes on).
        hooks = policy.get("hook_deciders")
        if isinstance(hooks, list) and 0 <= rule - len(rules) < len(hooks):
            return f"hook {hooks[rule - len(rules)]}"
        return f"rule {rule}"


def _text(raw):
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _name(names, value, what):
    return names.get(value, f"{what} {value}")


def read_capture(path):
    """Read one capture file into a Capture; CaptureError when it is not a readable capture."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CaptureError(path, f"cannot read: {e.strerror or e}") from None

    # A prefix of the magic (an empty file included) is a header the program died writing.
    if not abi.CAPTURE_MAGIC.startswith(data[:len(abi.CAPTURE_MAGIC)]):
        raise CaptureError(path, "not a clc capture file")
    if len(data) < abi.CAPTURE_HEADER.size:
        raise CaptureError(path, f"header cut short ({len(data)} of "
                                 f"{abi.CAPTURE_HEADER.size} bytes): the program died at start")
    (_, version, header_size, pid, ppid, start_mono,
     start_real) = abi.CAPTURE_HEADER.unpack_from(data, 0)
    if version != abi.CAPTURE_VERSION:
        raise CaptureError(path, f"unsupported capture version {version} "
                                 f"(this clc reads version {abi.CAPTURE_VERSION})")
    if header_size < abi.CAPTURE_HEADER.size or header_size > len(data):
        raise CaptureError(path, f"bad header size {header_size}")

    cap = Capture(path=path, pid=pid, ppid=ppid, start_monotonic_ns=start_mono,
                  start_realtime_ns=start_real)
    raw_launches = []
    timings = {}

    hdr = abi.RECORD_HEADER
    off = header_size
    end = len(data)
    while end - off >= hdr.size:
        rtype, _, size = hdr.unpack_from(data, off)
        # A size that cannot be right means the rest is not records (a writer that died
        # between reserving space and filling it leaves zeros): stop as at a cut.
        if size < hdr.size or size % 8 or size > end - off:
            break
        body = data[off + hdr.size:off + size]
        off += size
        if rtype == abi.REC_LAUNCH:
            if len(body) >= abi.REC_LAUNCH_BODY.size:
                raw_launches.append(abi.REC_LAUNCH_BODY.unpack_from(body))
        elif rtype == abi.REC_TIMING:
            if len(body) >= abi.REC_TIMING_BODY.size:
                seq, kid, gpu_ns = abi.REC_TIMING_BODY.unpack_from(body)
                timings.setdefault(seq, (kid, gpu_ns))
        elif rtype == abi.REC_KERNEL:
            s = abi.REC_KERNEL_BODY
            if len(body) >= s.size:
                kid, device, handle, ctx, t_ns = s.unpack_from(body)
                mangled = _text(body[s.size:])
                cap.kernels.setdefault(kid, Kernel(kid, device, handle, ctx, t_ns, mangled,
                                                   demangle(mangled)))
        elif rtype == abi.REC_PROCESS:
            s = abi.REC_PROCESS_BODY
            if len(body) >= s.size:
                cap.command = _text(body[s.size:])
        elif rtype == abi.REC_POLICY:
            try:
                policy = json.loads(_text(body))
            except ValueError:
                policy = None
            cap.policy = policy if isinstance(policy, dict) else None
        elif rtype == abi.REC_MODULE:
            s = abi.REC_MODULE_BODY
            if len(body) >= s.size:
                t_ns, api, image, handle, ptr, isize, preserved, result = s.unpack_from(body)
                cap.modules.append(Module(
                    t_ns, api, image, handle, ptr, isize, preserved, result,
                    _name(abi.LOAD_NAMES, api, "api"), _name(abi.IMAGE_NAMES, image, "image"),
                    _text(body[s.size:]) or None))
        elif rtype == abi.REC_KERNEL_STATS:
            if len(body) >= abi.REC_KERNEL_STATS_BODY.size:
                st = KernelStats(*abi.REC_KERNEL_STATS_BODY.unpack_from(body))
                cap.stats[st.kernel_id] = st
        elif rtype == abi.REC_MESSAGE:
            s = abi.REC_MESSAGE_BODY
            if len(body) >= s.size:
                level, t_ns = s.unpack_from(body)
                cap.messages.append(Message(level, t_ns, _text(body[s.size:]),
                                            _name(LEVEL_NAMES, level, "level")))
        elif rtype == abi.REC_END:
            if len(body) >= 16:  # t_ns, dropped; later fields when the writer has them
                _, cap.dropped = struct.unpack_from("<QQ", body)
                cap.complete = True
        # Any other type comes from a newer writer; its size already moved us past it.

    raw_launches.sort(key=lambda r: r[0])
    for (seq, t_ns, stream, kid, entry, gx, gy, gz, bx, by, bz, smem, tid, action, rule,
         result) in raw_launches:
        timing = timings.pop(seq, None)
        gpu_ns = timing[1] if timing is not None else None
        cap.launches.append(Launch(
            seq, t_ns, stream, kid, entry, (gx, gy, gz), (bx, by, bz), smem, tid, action,
            rule, result, gpu_ns,
            _name(abi.ENTRY_NAMES, entry & ~abi.ENTRY_PTSZ, "entry"),
            bool(entry & abi.ENTRY_PTSZ), _name(abi.ACTION_NAMES, action, "action")))
    # Timings whose launch was not recorded (FLAG_TIME without FLAG_RECORD, or the LAUNCH
    # record was lost) still count towards their kernel's derived totals.
    orphan_timings = list(timings.values())

    cap.modules.sort(key=lambda m: m.t_ns)
    cap.messages.sort(key=lambda m: m.t_ns)
    _derive_missing_stats(cap, orphan_timings)
    # Threads flush in chunks, so a LAUNCH can outlive the KERNEL record of another thread's
    # chunk that the crash cut off; give such ids a stand-in so every id resolves.
    for kid in sorted(set(cap.stats) - set(cap.kernels)):
        cap.kernels[kid] = Kernel(kid, -1, 0, 0, 0, "", f"<unknown kernel {kid}>")
    cap.kernels = dict(sorted(cap.kernels.items()))
    return cap


def _derive_missing_stats(cap, orphan_timings):
    derived = {}

    def get(kid):
        if kid in cap.stats:
            return None
        st = derived.get(kid)
        if st is None:
            st = derived[kid] = KernelStats(kid, 0, 0, 0, 0, 0, 0, 0, partial=True)
        return st

    for kid in cap.kernels:
        get(kid)
    for ln in cap.launches:
        st = get(ln.kernel_id)
        if st is None:
            continue
        st.recorded += 1
        if ln.entry & ~abi.ENTRY_PTSZ in _DIRECT_ENTRIES:
            st.launches += 1
            if ln.action == abi.ACTION_DENY:
                st.denied += 1
            elif ln.result != 0:
                st.failed += 1
        else:
            st.graph_nodes += 1
        if ln.gpu_ns is not None:
            st.timed += 1
            st.gpu_ns += ln.gpu_ns
    for kid, gpu_ns in orphan_timings:
        st = get(kid)
        if st is not None:
            st.timed += 1
            st.gpu_ns += gpu_ns
    cap.stats.update(derived)
    cap.stats = dict(sorted(cap.stats.items()))


def read_captures(paths):
    """Read several captures (a program and each child process write their own file)."""
    return [read_capture(p) for p in paths]

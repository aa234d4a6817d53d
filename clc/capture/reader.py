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
"""

import errno
import heapq
import json
import os
import stat
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

from clc import abi
from clc.demangle import demangle

__all__ = [
    "CaptureError", "Capture", "Kernel", "LaunchRecord", "Module", "Message",
    "KernelStatsRecord", "WrapStats",
    "LEVEL_NAMES", "gpu_uuid", "gpu_times", "newest_copy", "read_capture", "read_captures",
    "scan_capture", "scan_captures",
    "launch_stream", "LaunchStream", "LAUNCH_WINDOW", "MAX_GPU_NS", "error_name", "file_kind",
]

LEVEL_NAMES = {abi.MSG_INFO: "info", abi.MSG_WARNING: "warning", abi.MSG_ERROR: "error"}

_DIRECT_ENTRIES = (abi.ENTRY_LAUNCH, abi.ENTRY_LAUNCH_EX, abi.ENTRY_LAUNCH_COOPERATIVE)

CHUNK = 1 << 20
# The shim's records are at most half of its 256 KiB per-thread buffer, but for its COUNTS
# records (at most about 9.5 MiB: 65536 kernels' counts, twice); a size above this is not a
# record but garbage (a file overwritten, or not a capture past its header).
MAX_RECORD = 16 << 20
# LAUNCH records kept back while their TIMING record may still come, and to put launches that
# threads wrote out of order back in seq order. Timed by events, a thread writes a launch's
# TIMING at one of its later timed launches (at most 1024 later) or at exit; timed by CUPTI,
# when CUPTI hands its buffer back (full, after about ten thousand launches, or every 200 ms).
LAUNCH_WINDOW = 1 << 15
# GPU times are u64 nanoseconds; one of 2**63 or more (292 years) is no kernel's: an end
# before its start taken as unsigned, or a damaged file. Such a record is refused with its
# offset rather than counted into every total and distribution.
MAX_GPU_NS = (1 << 63) - 1

# What the counts derived from LAUNCH records need: kernel_id, entry, action, rule, result;
# a record's seq; its flags.
_LAUNCH_COUNTED = abi.REC_LAUNCH_FIELDS.picker("kernel_id", "entry", "action", "rule", "result")
_SEQ = abi.REC_LAUNCH_FIELDS.picker("seq")
_FLAGS = abi.REC_LAUNCH_FIELDS.picker("flags")


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
class LaunchRecord:
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
class Hold:
    """A best-effort launch held while a latency-critical process was busy on its GPU."""

    t_ns: int  # CLOCK_MONOTONIC when the hold began
    held_ns: int
    lag_ns: int  # from the latency-critical GPU going busy to this hold; 0: unknown
    device: int
    no_board: bool  # held because the board could not be read: down to the floor
    by_floor: bool  # let go by the floor, the GPU still busy
    # not a wait: a busy period whose launches ran on the class's held_share of the SMs
    shared: bool = False


@dataclass(slots=True)
class WrapStats:
    """A wrapped kernel's counts, as its wrapper counted them on the GPU over the process."""

    kernel: str  # the kernel's name (demangled)
    wrapper: str  # the wrapper's file and parameters ("sm_share share=0.25")
    t_ns: int
    blocks: int  # virtual blocks run
    threads: int  # the threads of those blocks
    skipped: int  # virtual blocks the deadline wrapper skipped
    max_resident: int  # the most blocks resident at once
    share_sms: int  # sm_share: the SMs of its share; 0: none


@dataclass(slots=True, kw_only=True)
class KernelStatsRecord(abi.Counters):
    """A kernel's counts (abi.KERNEL_COUNTERS) in a capture: its KERNEL_STATS record in the
    newest valid copy of the COUNTS records, or what its other records say when it has none."""

    kernel_id: int
    # the SMs of the green context its launches ran on (sm_share by a green context); 0: none
    confined_sms: int = 0
    # True when the capture holds no counts of this kernel (the process died within a second
    # of its first launch, the counts found no room, or the file refused them) and they were
    # derived from the records that exist: launches it did not record are missing.
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
    # What clc-run said of the run (its RUN record): "tenant", "uid", "labels" ({name: value})
    run: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    # device ordinal (Kernel.device) -> the GPU's UUID ("GPU-..."), from the DEVICE records
    devices: dict = field(default_factory=dict)
    # Every LAUNCH record sorted by seq (read_capture), or None: scan_capture leaves them in
    # the file, for launch_stream.
    launches: Optional[list] = field(default_factory=list)
    modules: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    holds: list = field(default_factory=list)  # Hold records (a best-effort process's)
    wrap_stats: list = field(default_factory=list)  # WrapStats, one per wrapped kernel
    stats: dict = field(default_factory=dict)
    # rule -> launches it denied: the RULE_STATS records, else counted from denied LAUNCH
    # records (rule_stats_partial).
    rule_stats: dict = field(default_factory=dict)
    rule_stats_partial: bool = False
    # kernel_id -> the rules named by its LAUNCH records
    kernel_rules: dict = field(default_factory=dict)
    # LAUNCH records of launches clc could not decide (the policy's on_error decided them:
    # such launches are always recorded)
    on_error_launches: int = 0
    launch_records: int = 0
    timing_records: int = 0
    # TIMING records by where their GPU times came from (abi.TIMING_SOURCES' names; an unknown
    # source by its number)
    timing_sources: dict = field(default_factory=dict)
    # An END record follows every other record: the process wrote its counts after its last
    # launch (a crash or SIGKILL leaves the last snapshot of its counts, and no END after them).
    complete: bool = False
    dropped: int = 0
    write_lost_bytes: int = 0
    capped_bytes: int = 0
    write_errno: int = 0
    # How the process left, from its last END record: abi.END_EXIT, END_QUICK (_exit,
    # exit_group) or END_SIGNAL (exit_status is then the signal's number); None without END.
    end_how: Optional[int] = None
    exit_status: int = 0
    # The decision table filled (later kernels were decided at each launch), and records the
    # capture keeps were dropped at its size cap.
    table_full: bool = False
    truncated: bool = False
    # Launches on_error decided with no kernel to count them under (the driver was not placed,
    # or a signal handler launched a kernel not decided yet while clc worked on its thread).
    undecided_launches: int = 0
    # Bytes after the last whole record: a record cut short, or what is not records at all.
    trailing_bytes: int = 0
    header_size: int = abi.CAPTURE_HEADER.size

    @property
    def stats_partial(self):
        """True when some kernel's counts are derived rather than the shim's own."""
        return any(s.partial for s in self.stats.values())

    @property
    def partial(self):
        """True when records of the run are missing from the file: launch and timing records
        dropped at the size cap, for a full buffer or to write errors, or records every capture
        keeps (kernels, loads, messages) dropped at the cap. The counts are the shim's all the
        same (see stats_partial); the launches listed and the GPU times' distribution lack
        what was dropped."""
        return bool(self.capped_bytes or self.dropped or self.write_lost_bytes or self.truncated)

    def kernel(self, kernel_id):
        """The kernel of a record's kernel_id; a stand-in when its KERNEL record is missing."""
        k = self.kernels.get(kernel_id)
        return k if k is not None else _stand_in(kernel_id)

    def rule_name(self, rule):
        """The policy's name for a LAUNCH or RULE_STATS record's `rule`."""
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


def error_name(code):
    """'ENOSPC (No space left on device)' for an errno value."""
    name = errno.errorcode.get(code, f"errno {code}")
    return f"{name} ({os.strerror(code)})"


def _stand_in(kernel_id):
    return Kernel(kernel_id, -1, 0, 0, 0, "", f"<unknown kernel {kernel_id}>")


def gpu_uuid(raw):
    """cuDeviceGetUuid's 16 bytes as nvidia-smi and DCGM write a GPU's UUID:
    GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _text(raw):
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")


def _name(names, value, what):
    return names.get(value, f"{what} {value}")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def file_kind(mode):
    """'a directory', 'a FIFO (named pipe)'... for an st_mode that is not a regular file's."""
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _open(path):
    """The capture at `path`, open for reading, and its size. Only a regular file is read: a
    FIFO or a device could block or never end. O_NONBLOCK keeps the open itself from waiting
    for a FIFO's writer; links are followed, a link to one's own capture being a fine input."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        mode = None
        if e.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
            try:
                mode = os.stat(path).st_mode
            except OSError:
                pass
        if mode is None:
            raise CaptureError(path, f"cannot read: {e.strerror or e}") from None
        raise _refusal(path, mode) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, st.st_mode)
        f = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    return f, st.st_size


def _refusal(path, mode):
    return CaptureError(path, f"is {file_kind(mode)}, not a capture file (captures are regular "
                              f"files)")


def _read_exact(f, n):
    out = b""
    while len(out) < n:
        more = f.read(n - len(out))
        if not more:
            break
        out += more
    return out


def _open_capture(path):
    """Open and check the header: (file, header fields, file size)."""
    path = str(path)
    f, size = _open(path)
    try:
        try:
            head = _read_exact(f, abi.CAPTURE_HEADER.size)
        except OSError as e:
            raise CaptureError(path, f"cannot read: {e.strerror or e}") from None
        # A prefix of the magic (an empty file included) is a header the program died writing.
        if not abi.CAPTURE_MAGIC.startswith(head[:len(abi.CAPTURE_MAGIC)]):
            raise CaptureError(path, "not a clc capture file")
        if len(head) < abi.CAPTURE_HEADER.size:
            raise CaptureError(path, f"header cut short ({len(head)} of "
                                     f"{abi.CAPTURE_HEADER.size} bytes): the program died at "
                                     f"start, or its capture could not be written")
        fields = abi.CAPTURE_HEADER.unpack(head)
        version, header_size = fields[1], fields[2]
        if version != abi.CAPTURE_VERSION:
            raise CaptureError(path, f"unsupported capture version {version} "
                                     f"(this clc reads version {abi.CAPTURE_VERSION})")
        if header_size < abi.CAPTURE_HEADER.size or header_size > size:
            raise CaptureError(path, f"bad header size {header_size}")
        if header_size > len(head):
            f.seek(header_size)
    except BaseException:
        f.close()
        raise
    return f, fields, size


class _Records:
    """The records of an open capture, read through one buffer of CHUNK bytes: iterating
    yields (type, buffer, body start, body end), the buffer being reused at the next step;
    `offset(body start)` is then the record's offset in the file. Afterwards `trailing`
    counts the bytes after the last whole record."""

    def __init__(self, f, start, size):
        self._f = f
        self._start = start
        self._size = size
        self._base = start
        self.trailing = 0

    def offset(self, body):
        """The file offset of the record being looked at, whose body starts at `body`."""
        return self._base + body - abi.RECORD_HEADER.size

    def __iter__(self):
        f = self._f
        unpack = abi.RECORD_HEADER.unpack_from
        buf = bytearray(CHUNK)
        pos = end = 0  # the unread records are buf[pos:end]
        base = self._start  # file offset of buf[0]
        eof = False
        while True:
            need = 8
            if end - pos >= 8:
                rtype, _, size = unpack(buf, pos)
                # A size that cannot be right means the rest is not records (a writer that
                # died between reserving space and filling it leaves zeros): stop as at a cut.
                if size < 8 or size % 8 or size > MAX_RECORD:
                    break
                if end - pos >= size:
                    yield rtype, buf, pos + 8, pos + size
                    pos += size
                    continue
                need = size
            if eof:
                break
            # Move the part of a record left at the end to the front, and read after it into
            # the same buffer: one buffer, grown only for a record larger than it.
            rest = end - pos
            buf[:rest] = buf[pos:end]
            base += pos
            self._base = base
            pos, end = 0, rest
            if need > len(buf):
                # A record the file cannot hold is cut short, or garbage: stop as at a cut,
                # before making room for it.
                if base + need > os.fstat(f.fileno()).st_size:
                    break
                buf += bytes(need - len(buf))
            with memoryview(buf) as whole, whole[end:] as free:
                n = f.readinto(free)
            if not n:
                eof = True
            end += n or 0
        self.trailing = max(self._size, base + end) - (base + pos)


def _gpu_ns(path, records, b, gpu_ns):
    """A TIMING record's gpu_ns, or CaptureError naming the record when it is no GPU time."""
    if gpu_ns > MAX_GPU_NS:
        raise CaptureError(path, f"TIMING record at byte {records.offset(b)}: a GPU time of "
                                 f"{gpu_ns} ns (2**63 or more) is not one the shim measured: "
                                 "the capture is damaged")
    return gpu_ns


def _iter_file(cap):
    """The records of `cap`'s file, read again; the caller closes the file it gets."""
    f, _, size = _open_capture(cap.path)
    return f, _Records(f, cap.header_size, size)


def gpu_times(cap):
    """(kernel_id, gpu_ns, source name) of each TIMING record of cap's file, read again, in
    file order: the GPU time of every timed launch, for distributions (reports)."""
    f, records = _iter_file(cap)
    timing = abi.REC_TIMING_BODY
    try:
        for rtype, buf, b, e in records:
            if rtype == abi.REC_TIMING and e - b >= timing.size:
                _, kernel_id, source, gpu_ns = timing.unpack_from(buf, b)
                yield (kernel_id, _gpu_ns(cap.path, records, b, gpu_ns),
                       abi.TIMING_SOURCES.get(source, str(source)))
    except OSError as e:
        raise CaptureError(cap.path, f"cannot read: {e.strerror or e}") from None
    finally:
        f.close()


def _scan(path, keep_launches):
    path = str(path)
    f, fields, size = _open_capture(path)
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
    records = _Records(f, header_size, size)
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
                    gpu_ns = _gpu_ns(path, records, b, gpu_ns)
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
        cap.launches = [_launch(r, timings.get(r[0])) for r in raw_launches]
    cap.modules.sort(key=lambda m: m.t_ns)
    cap.messages.sort(key=lambda m: m.t_ns)
    _derive(cap, launch_counts, timing_sums, rule_stats)
    return cap


def _other_record(cap, rtype, body, rule_stats):
    if rtype == abi.REC_KERNEL:
        s = abi.REC_KERNEL_BODY
        if len(body) >= s.size:
            kid, device, handle, ctx, t_ns = s.unpack_from(body)
            mangled = _text(body[s.size:])
            cap.kernels.setdefault(kid, Kernel(kid, device, handle, ctx, t_ns, mangled,
                                               demangle(mangled)))
    elif rtype == abi.REC_DEVICE:
        if len(body) >= abi.REC_DEVICE_BODY.size:
            device, uuid = abi.REC_DEVICE_BODY.unpack_from(body)
            cap.devices[device] = gpu_uuid(uuid)
    elif rtype == abi.REC_PROCESS:
        s = abi.REC_PROCESS_BODY
        if len(body) >= s.size:
            cap.command = _text(body[s.size:])
    elif rtype == abi.REC_POLICY:
        try:
            policy = json.loads(_text(body))
        except (ValueError, RecursionError):  # not JSON, or nested deeper than json reads
            policy = None
        cap.policy = policy if isinstance(policy, dict) else None
    elif rtype == abi.REC_RUN:
        try:
            run = json.loads(_text(body))
        except (ValueError, RecursionError):
            run = None
        cap.run = run if isinstance(run, dict) else {}
    elif rtype == abi.REC_MODULE:
        s = abi.REC_MODULE_BODY
        if len(body) >= s.size:
            t_ns, api, image, handle, ptr, isize, preserved, result = s.unpack_from(body)
            cap.modules.append(Module(
                t_ns, api, image, handle, ptr, isize, preserved, result,
                _name(abi.LOAD_NAMES, api, "api"), _name(abi.IMAGE_NAMES, image, "image"),
                _text(body[s.size:]) or None))
    elif rtype == abi.REC_COUNTS:
        copy = newest_copy(body)
        if copy is not None:
            head, records = copy
            _merge_capture_counts(cap, head["dropped"], head["write_lost_bytes"],
                                  head["capped_bytes"], head["write_errno"], head["flags"],
                                  head["undecided"])
            for kind, entry in _embedded(records):
                _counts_entry(cap, kind, entry, rule_stats)
    elif rtype == abi.REC_MESSAGE:
        s = abi.REC_MESSAGE_BODY
        if len(body) >= s.size:
            level, t_ns = s.unpack_from(body)
            cap.messages.append(Message(level, t_ns, _text(body[s.size:]),
                                        _name(LEVEL_NAMES, level, "level")))
    elif rtype == abi.REC_HOLD:
        if len(body) >= abi.REC_HOLD_BODY.size:
            t_ns, held, lag, device, why = abi.REC_HOLD_BODY.unpack_from(body)
            cap.holds.append(Hold(t_ns, held, lag, device, (why & 15) == abi.HOLD_NO_BOARD,
                                  bool(why & abi.HOLD_FLOOR), bool(why & abi.HOLD_SHARED)))
    elif rtype == abi.REC_WRAP_STATS:
        s = abi.REC_WRAP_STATS_BODY
        if len(body) >= s.size:
            kernel, _, wrapper = bytes(body[s.size:]).partition(b"\0")
            cap.wrap_stats.append(WrapStats(
                kernel.decode("utf-8", "replace"), _text(wrapper),
                **dict(zip(abi.REC_WRAP_STATS_FIELDS.names, s.unpack_from(body)))))
    elif rtype == abi.REC_END:
        if len(body) >= abi.REC_END_BODY.size:
            (_, dropped, lost, capped, write_errno, cap.end_how, cap.exit_status, flags,
             undecided) = abi.REC_END_BODY.unpack_from(body)
            _merge_capture_counts(cap, dropped, lost, capped, write_errno, flags, undecided)
            cap.complete = True
    # Any other type comes from a newer writer; its size already moved us past it.


def _merge_capture_counts(cap, dropped, lost, capped, write_errno, flags, undecided):
    """The capture's own counts from an END record or a copy of the counts: each only grows,
    so the largest holds, whichever of the two was written last."""
    cap.dropped = max(cap.dropped, dropped)
    cap.write_lost_bytes = max(cap.write_lost_bytes, lost)
    cap.capped_bytes = max(cap.capped_bytes, capped)
    cap.write_errno = cap.write_errno or write_errno
    cap.undecided_launches = max(cap.undecided_launches, undecided)
    cap.table_full |= bool(flags & abi.END_TABLE_FULL)
    cap.truncated |= bool(flags & abi.END_TRUNCATED)


_CHECKSUM_AT = abi.COUNTS_COPY_FIELDS.at["checksum"]


def newest_copy(body):
    """({field: value} of its clc_counts_copy, its records' bytes) of a COUNTS record's body: the
    valid copy of the higher generation, or None when neither is (never written, or cut short:
    a write the process did not finish, or a file read while it was being written)."""
    s, copy = abi.REC_COUNTS_BODY, abi.COUNTS_COPY
    if len(body) < s.size:
        return None
    (capacity,) = s.unpack_from(body)
    best = None
    for start in (s.size, s.size + capacity):
        if capacity < copy.size or start + capacity > len(body):
            break
        head = dict(zip(abi.COUNTS_COPY_FIELDS.names, copy.unpack_from(body, start)))
        length = head["length"]
        if not head["generation"] or length > capacity - copy.size:
            continue
        records = bytes(body[start + copy.size:start + copy.size + length])
        zeroed = bytearray(body[start:start + copy.size])
        zeroed[_CHECKSUM_AT:_CHECKSUM_AT + 4] = bytes(4)
        if zlib.crc32(zeroed, zlib.crc32(records)) != head["checksum"]:
            continue
        if best is None or head["generation"] > best[0]["generation"]:
            best = (head, records)
    return best


def _embedded(records):
    """(type, body) of each record in a copy of the counts, up to the first that cannot be
    right."""
    unpack = abi.RECORD_HEADER.unpack_from
    pos = 0
    while pos + abi.RECORD_HEADER.size <= len(records):
        rtype, _, size = unpack(records, pos)
        if size < abi.RECORD_HEADER.size or size % 8 or pos + size > len(records):
            return
        yield rtype, memoryview(records)[pos + abi.RECORD_HEADER.size:pos + size]
        pos += size


def _counts_entry(cap, rtype, body, rule_stats):
    """A kernel's or a rule's counts: those of a later COUNTS record replace an earlier's."""
    if rtype == abi.REC_KERNEL_STATS:
        if len(body) >= abi.REC_KERNEL_STATS_BODY.size:
            st = KernelStatsRecord(**dict(zip(abi.REC_KERNEL_STATS_FIELDS.names,
                                              abi.REC_KERNEL_STATS_BODY.unpack_from(body))))
            cap.stats[st.kernel_id] = st
    elif rtype == abi.REC_RULE_STATS:
        if len(body) >= abi.REC_RULE_STATS_BODY.size:
            rule, denied = abi.REC_RULE_STATS_BODY.unpack_from(body)
            rule_stats[rule] = denied


def _launch(raw, gpu_ns):
    (seq, t_ns, stream, kid, entry, gx, gy, gz, bx, by, bz, smem, tid, action, rule,
     result, _) = raw
    return LaunchRecord(seq, t_ns, stream, kid, entry, (gx, gy, gz), (bx, by, bz), smem, tid,
                        action, rule, result, gpu_ns,
                        _name(abi.ENTRY_NAMES, entry & ~abi.ENTRY_PTSZ, "entry"),
                        bool(entry & abi.ENTRY_PTSZ), _name(abi.ACTION_NAMES, action, "action"))


def _derive(cap, launch_counts, timing_sums, rule_stats):
    """Counts of the kernels that have none in the COUNTS records, from their LAUNCH and TIMING
    records; per-kernel rules; per-rule denied counts when no RULE_STATS exist."""
    derived = {}

    def get(kid):
        if kid in cap.stats:
            return None
        st = derived.get(kid)
        if st is None:
            st = derived[kid] = KernelStatsRecord(kernel_id=kid, partial=True)
        return st

    for kid in cap.kernels:
        get(kid)
    denied_by_rule = {}
    cap.on_error_launches = cap.undecided_launches
    for (kid, entry, action, rule, result), n in launch_counts.items():
        cap.kernel_rules.setdefault(kid, set()).add(rule)
        if rule == abi.RULE_ON_ERROR:
            cap.on_error_launches += n
        if action == abi.ACTION_DENY:
            denied_by_rule[rule] = denied_by_rule.get(rule, 0) + n
        st = get(kid)
        if st is None:
            continue
        st.recorded += n
        if entry & ~abi.ENTRY_PTSZ in _DIRECT_ENTRIES:
            st.launches += n
        else:
            st.graph_nodes += n
        # The shim counts denied and failed graph-node calls as it does launches.
        if action == abi.ACTION_DENY:
            st.denied += n
        elif result != 0:
            st.failed += n
    # Every TIMING record counts, its LAUNCH record there or not (lost: dropped, not written).
    for kid, (n, gpu_ns) in timing_sums.items():
        st = get(kid)
        if st is not None:
            st.timed += n
            st.gpu_ns += gpu_ns
    cap.stats.update(derived)
    cap.stats = dict(sorted(cap.stats.items()))
    # Threads flush in chunks, so a LAUNCH can outlive the KERNEL record of another thread's
    # chunk that the crash cut off; give such ids a stand-in so every id resolves.
    for kid in sorted(set(cap.stats) - set(cap.kernels)):
        cap.kernels[kid] = _stand_in(kid)
    cap.kernels = dict(sorted(cap.kernels.items()))
    if rule_stats:
        cap.rule_stats = rule_stats
    elif denied_by_rule:
        # No RULE_STATS (the program died before its counts were written, or within a second
        # of its first deny): the denied launches that were recorded, a lower bound.
        cap.rule_stats = denied_by_rule
        cap.rule_stats_partial = True


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


class LaunchStream:
    """A capture's launches, each with its GPU time when its TIMING record was found.

    A capture from read_capture gives its list. Otherwise the file is read again and launches
    come out in seq order as far as a window of `window` LAUNCH records can restore it. A timed
    launch (its LAUNCH record says a TIMING record follows) whose TIMING has not come by the time
    it leaves the window waits for it, and comes out when it does: timed by events, a thread
    writes its launches' TIMING records at its later timed launches, so with many threads they
    can lie far apart in the file (waiting launches are then bounded by the timings a thread
    keeps pending, 1024 in shim/records/timing.c, times the threads); timed by CUPTI, they come when
    CUPTI hands its buffer back (every 200 ms, or a buffer's worth of launches). Once
    iterated, `unmatched_timings` counts the TIMING records that matched no launch: its LAUNCH
    record was lost (dropped, capped) or never written.
    """

    def __init__(self, cap, window=LAUNCH_WINDOW):
        self.cap = cap
        self.window = window
        self.unmatched_timings = 0

    def __iter__(self):
        matched = 0
        try:
            for ln in self._launches():
                if ln.gpu_ns is not None:
                    matched += 1
                yield ln
        finally:
            self.unmatched_timings = max(0, self.cap.timing_records - matched)

    def _launches(self):
        if self.cap.launches is not None:
            yield from self.cap.launches
            return
        f, records = _iter_file(self.cap)
        try:
            yield from self._stream(records)
        except OSError as e:
            raise CaptureError(self.cap.path, f"cannot read: {e.strerror or e}") from None
        finally:
            f.close()

    def _stream(self, records):
        window = self.window
        launch_size = abi.REC_LAUNCH_BODY.size
        unpack_launch = abi.REC_LAUNCH_BODY.unpack
        unpack_seq = _SEQ.unpack_from
        unpack_flags = _FLAGS.unpack_from
        timing = abi.REC_TIMING_BODY
        heap = []  # (seq, the LAUNCH body's bytes): a third of its unpacked size
        pending = {}  # seq -> gpu_ns of launches in the heap; None until timed
        awaiting = {}  # seq -> body of timed launches past the window, their TIMING not come
        early = OrderedDict()  # seq -> gpu_ns of timings whose launch has not come yet

        def pop():
            """The launch leaving the window, or None when it waits for its GPU time."""
            seq, body = heapq.heappop(heap)
            gpu_ns = pending.pop(seq, None)
            if gpu_ns is None and unpack_flags(body)[0] & abi.LAUNCH_TIMED:
                awaiting[seq] = body
                return None
            return _launch(unpack_launch(body), gpu_ns)

        for rtype, buf, b, e in records:
            if rtype == abi.REC_LAUNCH:
                if e - b < launch_size:
                    continue
                body = bytes(buf[b:b + launch_size])
                seq = unpack_seq(body)[0]
                if seq in pending or seq in awaiting:  # only a damaged or hand-made file
                    yield _launch(unpack_launch(body), None)  # repeats a seq
                    continue
                pending[seq] = early.pop(seq, None)
                heapq.heappush(heap, (seq, body))
                if len(heap) > window:
                    ln = pop()
                    if ln is not None:
                        yield ln
            elif rtype == abi.REC_TIMING:
                if e - b < timing.size:
                    continue
                seq, _, _, gpu_ns = timing.unpack_from(buf, b)
                gpu_ns = _gpu_ns(self.cap.path, records, b, gpu_ns)
                if seq in pending:
                    if pending[seq] is None:
                        pending[seq] = gpu_ns
                elif seq in awaiting:
                    yield _launch(unpack_launch(awaiting.pop(seq)), gpu_ns)
                else:  # its launch has not come yet (another thread's chunk), or never will
                    early.setdefault(seq, gpu_ns)
                    if len(early) > window:
                        early.popitem(last=False)
        while heap:
            ln = pop()
            if ln is not None:
                yield ln
        for seq in sorted(awaiting):  # their TIMING never came: lost with the process
            yield _launch(unpack_launch(awaiting[seq]), None)


def launch_stream(cap, window=LAUNCH_WINDOW):
    """The launches of `cap` (see LaunchStream)."""
    return LaunchStream(cap, window)

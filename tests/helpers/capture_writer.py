# SPDX-License-Identifier: Apache-2.0
"""A test-only writer of capture files, byte for byte as shim/clc_abi.h lays them out.

The real writer is the C shim; this one lets unit tests build captures of any shape, including
ones a crash would leave (cut short, no counts, a copy of the counts torn, no END). Each record
method appends the
record to `records` and returns its bytes, so tests can reorder records (as writer threads
interleave them) or cut the file anywhere. launch_block and big_capture make captures of
millions of launches in a second or two.
"""

import array
import json
import zlib
from dataclasses import dataclass, field

from clc import abi

__all__ = ["CaptureWriter", "record", "launch_block", "big_capture", "counts_copy"]


def record(rtype, body):
    """One record: header, body, and the zero padding that rounds it to 8 bytes."""
    padded = len(body) + (-(abi.RECORD_HEADER.size + len(body)) % 8)
    size = abi.RECORD_HEADER.size + padded
    return abi.RECORD_HEADER.pack(rtype, 0, size) + body.ljust(padded, b"\0")


def launch_block(first_seq, count, kernel_id=0, t0_ns=1_000_000_000, **fields):
    """`count` LAUNCH records of seqs first_seq, first_seq + 1, ..., 1 us apart: the bytes,
    made without a Python loop per record so that tests can write millions."""
    one = CaptureWriter().launch(0, kernel_id, t_ns=0, **fields)
    words = len(one) // 8
    block = array.array("Q", one * count)
    # seq and t_ns are the body's first two words, after the 8-byte record header.
    block[1::words] = array.array("Q", range(first_seq, first_seq + count))
    block[2::words] = array.array("Q", range(t0_ns, t0_ns + 1000 * count, 1000))
    return block.tobytes()


def _cstr(text):
    return text.encode() + b"\0"


def counts_copy(records, capacity, generation=1, t_ns=0, dropped=0, write_lost_bytes=0,
                capped_bytes=0, undecided=0, write_errno=0, flags=0, checksum=None):
    """One copy of a COUNTS record, `capacity` bytes: its header (the checksum computed unless
    given), the records, PAD records filling the rest as the shim's unused slots do."""
    spare = capacity - abi.COUNTS_COPY.size - len(records)
    assert spare >= 0 and spare % 8 == 0
    body = records + (record(abi.REC_PAD, bytes(spare - 8)) if spare else b"")
    fields = (generation, t_ns, dropped, write_lost_bytes, capped_bytes, undecided, write_errno,
              flags, len(body))
    if checksum is None:
        checksum = zlib.crc32(abi.COUNTS_COPY.pack(*fields, 0), zlib.crc32(body))
    return abi.COUNTS_COPY.pack(*fields, checksum) + body


@dataclass
class CaptureWriter:
    pid: int = 4242
    ppid: int = 1
    start_monotonic_ns: int = 1_000_000_000
    start_realtime_ns: int = 1_700_000_000_000_000_000
    magic: bytes = abi.CAPTURE_MAGIC
    version: int = abi.CAPTURE_VERSION
    records: list = field(default_factory=list, init=False)
    generation: int = field(default=0, init=False)

    def header(self):
        return abi.CAPTURE_HEADER.pack(self.magic, self.version, abi.CAPTURE_HEADER.size,
                                       self.pid, self.ppid, self.start_monotonic_ns,
                                       self.start_realtime_ns)

    def add(self, rtype, body):
        rec = record(rtype, body)
        self.records.append(rec)
        return rec

    def process(self, command="./app --flag"):
        return self.add(abi.REC_PROCESS,
                        abi.REC_PROCESS_BODY.pack(self.pid, self.ppid) + _cstr(command))

    def policy(self, policy):
        text = policy if isinstance(policy, str) else json.dumps(policy)
        return self.add(abi.REC_POLICY, _cstr(text))

    def run(self, run):
        return self.add(abi.REC_RUN, _cstr(json.dumps(run)))

    def kernel(self, kernel_id, mangled, device=0, handle=None, ctx=0xC0, t_ns=None):
        handle = 0x1000 + kernel_id if handle is None else handle
        t_ns = self.start_monotonic_ns + 10 if t_ns is None else t_ns
        return self.add(abi.REC_KERNEL,
                        abi.REC_KERNEL_BODY.pack(kernel_id, device, handle, ctx, t_ns)
                        + _cstr(mangled))

    def device(self, device, uuid):
        """A DEVICE record: `uuid` the driver's 16 bytes (cuDeviceGetUuid_v2)."""
        return self.add(abi.REC_DEVICE, abi.REC_DEVICE_BODY.pack(device, uuid))

    def launch(self, seq, kernel_id, t_ns=None, stream=0, entry=abi.ENTRY_LAUNCH,
               grid=(1, 1, 1), block=(128, 1, 1), shared_mem=0, tid=None,
               action=abi.ACTION_ALLOW, rule=abi.RULE_DEFAULT, result=0, timed=False):
        t_ns = self.start_monotonic_ns + 1000 * (seq + 1) if t_ns is None else t_ns
        tid = self.pid if tid is None else tid
        return self.add(abi.REC_LAUNCH, abi.REC_LAUNCH_BODY.pack(
            seq, t_ns, stream, kernel_id, entry, *grid, *block, shared_mem, tid, action, rule,
            result, abi.LAUNCH_TIMED if timed else 0))

    def timing(self, seq, kernel_id, gpu_ns, source=abi.TIMING_EVENTS):
        return self.add(abi.REC_TIMING, abi.REC_TIMING_BODY.pack(seq, kernel_id, source, gpu_ns))

    def module(self, api=1, image_kind=5, handle=0xAB00, image_ptr=0, image_size=0,
               preserved=0, result=0, path="", t_ns=None):
        t_ns = self.start_monotonic_ns + 5 if t_ns is None else t_ns
        return self.add(abi.REC_MODULE, abi.REC_MODULE_BODY.pack(
            t_ns, api, image_kind, handle, image_ptr, image_size, preserved, result)
            + _cstr(path))

    @staticmethod
    def kernel_stats_entry(kernel_id, confined_sms=0, **counters):
        """A KERNEL_STATS record as a copy of the counts holds it; counters by name
        (abi.KERNEL_COUNTERS), 0 when not given."""
        unknown = set(counters) - set(abi.KERNEL_COUNTERS)
        if unknown:
            raise TypeError(f"not counters: {sorted(unknown)}")
        return record(abi.REC_KERNEL_STATS, abi.REC_KERNEL_STATS_BODY.pack(
            kernel_id, confined_sms, *(counters.get(name, 0) for name in abi.KERNEL_COUNTERS)))

    @staticmethod
    def rule_stats_entry(rule, denied):
        return record(abi.REC_RULE_STATS, abi.REC_RULE_STATS_BODY.pack(rule, denied))

    def counts(self, *entries, copies=None, capacity=None, **header):
        """A COUNTS record holding `entries` (kernel_stats_entry, rule_stats_entry) in its first
        copy, of the next generation, the other never written; `copies` gives both copies'
        bytes instead (counts_copy). `header`: the copy's other fields (counts_copy's)."""
        records = b"".join(entries)
        if capacity is None:
            capacity = abi.COUNTS_COPY.size + len(records) + 16
        if copies is None:
            self.generation += 1
            copies = (counts_copy(records, capacity, self.generation, **header),
                      bytes(capacity))
        capacity = len(copies[0])
        return self.add(abi.REC_COUNTS, abi.REC_COUNTS_BODY.pack(capacity) + b"".join(copies))

    def kernel_stats(self, kernel_id, confined_sms=0, **counters):
        """A COUNTS record of one kernel's counts; counters by name (abi.KERNEL_COUNTERS), 0 when
        not given. A later one replaces an earlier one's."""
        return self.counts(self.kernel_stats_entry(kernel_id, confined_sms, **counters))

    def wrap_stats(self, kernel, wrapper, t_ns=None, **counts):
        """A WRAP_STATS record; counts by name (abi.REC_WRAP_STATS_FIELDS), 0 when not given."""
        t_ns = self.start_monotonic_ns + 9 if t_ns is None else t_ns
        names = abi.REC_WRAP_STATS_FIELDS.names[1:]
        unknown = set(counts) - set(names)
        if unknown:
            raise TypeError(f"not wrap counts: {sorted(unknown)}")
        return self.add(abi.REC_WRAP_STATS, abi.REC_WRAP_STATS_BODY.pack(
            t_ns, *(counts.get(name, 0) for name in names))
            + kernel.encode() + b"\0" + _cstr(wrapper))

    def message(self, text, level=abi.MSG_WARNING, t_ns=None):
        t_ns = self.start_monotonic_ns + 1 if t_ns is None else t_ns
        return self.add(abi.REC_MESSAGE, abi.REC_MESSAGE_BODY.pack(level, t_ns) + _cstr(text))

    def rule_stats(self, rule, denied):
        """A COUNTS record of one rule's denied launches."""
        return self.counts(self.rule_stats_entry(rule, denied))

    def hold(self, t_ns, held_ns, lag_ns=0, device=0, why=abi.HOLD_BUSY):
        return self.add(abi.REC_HOLD, abi.REC_HOLD_BODY.pack(t_ns, held_ns, lag_ns, device, why))

    def end(self, dropped=0, t_ns=None, write_lost_bytes=0, capped_bytes=0, write_errno=0,
            how=abi.END_EXIT, status=0, flags=0, undecided=0):
        t_ns = self.start_monotonic_ns + 10**9 if t_ns is None else t_ns
        return self.add(abi.REC_END, abi.REC_END_BODY.pack(
            t_ns, dropped, write_lost_bytes, capped_bytes, write_errno, how, status, flags,
            undecided))

    def data(self):
        return self.header() + b"".join(self.records)

    def write(self, path):
        path.write_bytes(self.data())
        return path


def big_capture(path, launches, kernel="_Z6vecAddPKfS0_Pfi"):
    """Write a complete capture of `launches` launches (a multiple of 10,000) of one kernel,
    every tenth one timed, its TIMING record after the next 10,000 launches, to `path`;
    returns `path`."""
    w = CaptureWriter()
    w.process("./big")
    w.kernel(0, kernel)
    head = w.data()
    tail = CaptureWriter()
    tail.kernel_stats(0, launches=launches, recorded=launches, timed=launches // 10,
                      gpu_ns=launches // 10 * 1000)
    tail.end()
    block = 10_000
    with open(path, "wb") as f:
        f.write(head)
        for first in range(0, launches, block):
            f.write(launch_block(first, block))
            f.write(b"".join(CaptureWriter().timing(seq, 0, 1000)
                             for seq in range(first, first + block, 10)))
        f.write(b"".join(tail.records))
    return path

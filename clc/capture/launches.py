# SPDX-License-Identifier: Apache-2.0
"""A capture's launches, read again from its file one at a time, in seq order and each with
its GPU time (LaunchStream): reports list millions of launches in memory that does not grow
with them."""

import heapq
from collections import OrderedDict

from clc import abi
from clc.capture.model import LaunchRecord
from clc.capture.records import CaptureError, checked_gpu_ns, iter_file, named

__all__ = ["LAUNCH_WINDOW", "LaunchStream", "launch_stream", "launch_record"]

# LAUNCH records kept back while their TIMING record may still come, and to put launches that
# threads wrote out of order back in seq order. Timed by events, a thread writes a launch's
# TIMING at one of its later timed launches (at most 1024 later) or at exit; timed by CUPTI,
# when CUPTI hands its buffer back (full, after about ten thousand launches, or every 200 ms).
LAUNCH_WINDOW = 1 << 15
# A LAUNCH record's seq and flags, read without unpacking the rest: most wait in the window
# as bytes.
_SEQ = abi.REC_LAUNCH_FIELDS.picker("seq")
_FLAGS = abi.REC_LAUNCH_FIELDS.picker("flags")


def launch_record(raw, gpu_ns):
    (seq, t_ns, stream, kid, entry, gx, gy, gz, bx, by, bz, smem, tid, action, rule,
     result, _) = raw
    return LaunchRecord(seq, t_ns, stream, kid, entry, (gx, gy, gz), (bx, by, bz), smem, tid,
                        action, rule, result, gpu_ns,
                        named(abi.ENTRY_NAMES, entry & ~abi.ENTRY_PTSZ, "entry"),
                        bool(entry & abi.ENTRY_PTSZ), named(abi.ACTION_NAMES, action, "action"))


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
        f, records = iter_file(self.cap)
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
            return launch_record(unpack_launch(body), gpu_ns)

        for rtype, buf, b, e in records:
            if rtype == abi.REC_LAUNCH:
                if e - b < launch_size:
                    continue
                body = bytes(buf[b:b + launch_size])
                seq = unpack_seq(body)[0]
                if seq in pending or seq in awaiting:  # only a damaged or hand-made file
                    yield launch_record(unpack_launch(body), None)  # repeats a seq
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
                gpu_ns = checked_gpu_ns(self.cap.path, records, b, gpu_ns)
                if seq in pending:
                    if pending[seq] is None:
                        pending[seq] = gpu_ns
                elif seq in awaiting:
                    yield launch_record(unpack_launch(awaiting.pop(seq)), gpu_ns)
                else:  # its launch has not come yet (another thread's chunk), or never will
                    early.setdefault(seq, gpu_ns)
                    if len(early) > window:
                        early.popitem(last=False)
        while heap:
            ln = pop()
            if ln is not None:
                yield ln
        for seq in sorted(awaiting):  # their TIMING never came: lost with the process
            yield launch_record(unpack_launch(awaiting[seq]), None)


def launch_stream(cap, window=LAUNCH_WINDOW):
    """The launches of `cap` (see LaunchStream)."""
    return LaunchStream(cap, window)

# SPDX-License-Identifier: Apache-2.0
"""A capture's counts: the newest valid copy in its COUNTS records (the shim writes two
copies, each with a generation and a checksum, so that a write cut short leaves the other),
the END record's counts of the capture, and counts derived from the LAUNCH and TIMING records
for kernels the copies do not hold."""

import zlib

from clc import abi
from clc.capture.model import KernelStatsRecord, stand_in

__all__ = ["newest_copy", "merge_capture_counts", "embedded", "counts_entry", "derive"]

_DIRECT_ENTRIES = (abi.ENTRY_LAUNCH, abi.ENTRY_LAUNCH_EX, abi.ENTRY_LAUNCH_COOPERATIVE)


def merge_capture_counts(cap, dropped, lost, capped, write_errno, flags, undecided):
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


def embedded(records):
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


def counts_entry(cap, rtype, body, rule_stats):
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


def derive(cap, launch_counts, timing_sums, rule_stats):
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
        cap.kernels[kid] = stand_in(kid)
    cap.kernels = dict(sorted(cap.kernels.items()))
    if rule_stats:
        cap.rule_stats = rule_stats
    elif denied_by_rule:
        # No RULE_STATS (the program died before its counts were written, or within a second
        # of its first deny): the denied launches that were recorded, a lower bound.
        cap.rule_stats = denied_by_rule
        cap.rule_stats_partial = True

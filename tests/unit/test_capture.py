# SPDX-License-Identifier: Apache-2.0
"""The capture reader, on files built by tests/helpers/capture_writer.py."""

import errno
import os
import socket
import tracemalloc

import pytest

from alarms import deadline
from capture_writer import CaptureWriter, counts_copy, launch_block, record
from clc import abi
from clc.capture import records as capture
from clc.capture.reader import (CaptureError, launch_stream, read_capture, read_captures,
                                scan_capture)

VECADD = "_Z6vecAddPKfS0_Pfi"
VECADD_NAME = "vecAdd(float const*, float const*, float*, int)"
SCALE = "_Z5scalePff"
POLICY = {"version": 1, "default": "allow",
          "rules": [{"name": "deny-scale", "action": "deny"}, {"name": "time-all"}]}


def normal_writer(**kw):
    w = CaptureWriter(**kw)
    w.process("./vecadd --n 1024")
    w.policy(POLICY)
    w.module(api=1, image_kind=5, handle=0xAB, path="/tmp/k.cubin",
             t_ns=w.start_monotonic_ns + 3)
    w.kernel(0, VECADD, device=0)
    w.kernel(1, SCALE, device=1)
    w.launch(0, 0, grid=(4, 1, 1), block=(256, 1, 1), stream=0x10, tid=w.pid, rule=1)
    w.timing(0, 0, 1500)
    w.launch(1, 1, action=abi.ACTION_DENY, rule=0, result=98)
    w.launch(2, 0, entry=abi.ENTRY_LAUNCH_EX | abi.ENTRY_PTSZ, shared_mem=4096, rule=1)
    w.timing(2, 0, 2500)
    w.launch(3, 0, entry=abi.ENTRY_GRAPH_ADD_NODE)
    w.message("could not time a launch", level=abi.MSG_WARNING, t_ns=w.start_monotonic_ns + 7)
    w.kernel_stats(0, launches=2, recorded=3, timed=2, graph_nodes=1, gpu_ns=4000)
    w.kernel_stats(1, launches=1, denied=1, recorded=1)
    w.end(dropped=2)
    return w


def test_normal_capture(tmp_path):
    w = normal_writer(pid=77, ppid=7)
    cap = read_capture(w.write(tmp_path / "a.clc"))
    assert cap.path == str(tmp_path / "a.clc")
    assert (cap.pid, cap.ppid) == (77, 7)
    assert cap.start_monotonic_ns == w.start_monotonic_ns
    assert cap.start_realtime_ns == w.start_realtime_ns
    assert cap.command == "./vecadd --n 1024"
    assert cap.policy == POLICY
    assert cap.complete and cap.dropped == 2
    assert not cap.stats_partial

    assert sorted(cap.kernels) == [0, 1]
    k = cap.kernels[0]
    assert (k.kernel_id, k.device, k.mangled, k.name) == (0, 0, VECADD, VECADD_NAME)
    assert cap.kernels[1].device == 1

    assert [ln.seq for ln in cap.launches] == [0, 1, 2, 3]
    first, denied, ex, node = cap.launches
    assert first.grid == (4, 1, 1) and first.block == (256, 1, 1)
    assert first.stream == 0x10 and first.tid == 77
    assert (first.entry_name, first.ptsz, first.action_name) == ("cuLaunchKernel", False, "allow")
    assert first.gpu_ns == 1500
    assert (denied.action, denied.action_name, denied.rule, denied.result) == \
        (abi.ACTION_DENY, "deny", 0, 98)
    assert denied.gpu_ns is None
    assert (ex.entry_name, ex.ptsz, ex.shared_mem, ex.gpu_ns) == \
        ("cuLaunchKernelEx", True, 4096, 2500)
    assert node.entry_name == "cuGraphAddKernelNode"

    (m,) = cap.modules
    assert (m.api_name, m.image_name, m.handle, m.path) == ("cuModuleLoad", "file", 0xAB,
                                                            "/tmp/k.cubin")
    (msg,) = cap.messages
    assert (msg.level, msg.level_name, msg.text) == (abi.MSG_WARNING, "warning",
                                                     "could not time a launch")
    st = cap.stats[0]
    assert (st.launches, st.denied, st.recorded, st.timed, st.graph_nodes, st.gpu_ns,
            st.partial) == (2, 0, 3, 2, 1, 4000, False)
    assert cap.rule_name(0) == "deny-scale"
    assert cap.rule_name(abi.RULE_DEFAULT) == "default"
    assert cap.rule_name(abi.RULE_ON_ERROR) == "on_error"
    assert cap.rule_name(9) == "rule 9"


def test_module_without_path(tmp_path):
    w = CaptureWriter()
    w.module(api=2, image_kind=3, image_ptr=0x7000, image_size=12345, preserved=1)
    (m,) = read_capture(w.write(tmp_path / "m.clc")).modules
    assert (m.api_name, m.image_name, m.image_ptr, m.image_size, m.preserved, m.path) == \
        ("cuModuleLoadData", "cubin", 0x7000, 12345, 1, None)


def test_interleaved_threads(tmp_path):
    # Two writer threads flush chunks of records; thread B's chunk lands first, before the
    # KERNEL record its launches refer to, and timings arrive apart from their launches.
    w = CaptureWriter()
    w.process()
    a = [w.kernel(0, VECADD), w.launch(0, 0, tid=10), w.launch(2, 0, tid=10),
         w.timing(0, 0, 100)]
    b = [w.launch(1, 0, tid=11), w.timing(1, 0, 200), w.launch(3, 0, tid=11),
         w.timing(2, 0, 300)]
    w.records = [w.records[0]] + b[:2] + a[:2] + b[2:] + a[2:]
    w.end()
    cap = read_capture(w.write(tmp_path / "i.clc"))
    assert [ln.seq for ln in cap.launches] == [0, 1, 2, 3]
    assert [ln.tid for ln in cap.launches] == [10, 11, 10, 11]
    assert [ln.gpu_ns for ln in cap.launches] == [100, 200, 300, None]
    assert cap.kernels[0].name == VECADD_NAME
    assert cap.complete


def crashed_writer():
    """A program that died mid-run: no counts, no END, last record a LAUNCH."""
    w = CaptureWriter()
    w.process()
    w.policy(POLICY)
    w.kernel(0, VECADD)
    w.kernel(1, SCALE)
    w.launch(0, 0)
    w.timing(0, 0, 1000)
    w.launch(1, 1, action=abi.ACTION_DENY, rule=0)
    w.launch(2, 0, entry=abi.ENTRY_GRAPH_EXEC_NODE_SET)
    w.timing(7, 0, 500)  # a launch timed but not recorded
    w.launch(3, 0)
    return w


def test_truncated_at_every_byte_of_the_last_record(tmp_path):
    w = crashed_writer()
    data = w.data()
    last = len(w.records[-1])
    path = tmp_path / "t.clc"
    for cut in range(len(data) - last, len(data) + 1):
        path.write_bytes(data[:cut])
        cap = read_capture(path)
        assert not cap.complete
        assert [ln.seq for ln in cap.launches] == ([0, 1, 2, 3] if cut == len(data)
                                                   else [0, 1, 2])


def test_truncated_inside_end_record(tmp_path):
    w = normal_writer()
    data = w.data()
    path = tmp_path / "t.clc"
    end_size = len(w.records[-1])
    for cut in range(len(data) - end_size, len(data)):
        path.write_bytes(data[:cut])
        cap = read_capture(path)
        assert not cap.complete and cap.dropped == 0
        assert len(cap.launches) == 4
    path.write_bytes(data)
    assert read_capture(path).complete


def test_truncated_anywhere_never_raises(tmp_path):
    data = normal_writer().data()
    path = tmp_path / "t.clc"
    for cut in range(abi.CAPTURE_HEADER.size, len(data)):
        path.write_bytes(data[:cut])
        assert not read_capture(path).complete


def test_header_cut_short(tmp_path):
    data = CaptureWriter().header()
    path = tmp_path / "h.clc"
    for cut in (0, 4, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CaptureError, match="cut short"):
            read_capture(path)


def test_zero_filled_tail_ends_the_records(tmp_path):
    w = crashed_writer()
    path = tmp_path / "z.clc"
    path.write_bytes(w.data() + b"\0" * 64)
    cap = read_capture(path)
    assert len(cap.launches) == 4 and not cap.complete


def test_derived_counts_when_stats_are_missing(tmp_path):
    cap = read_capture(crashed_writer().write(tmp_path / "c.clc"))
    assert cap.stats_partial
    vec, scale = cap.stats[0], cap.stats[1]
    assert vec.partial and scale.partial
    assert (vec.launches, vec.denied, vec.recorded, vec.graph_nodes) == (2, 0, 3, 1)
    # The timing of unrecorded launch 7 still counts.
    assert (vec.timed, vec.gpu_ns) == (2, 1500)
    assert (scale.launches, scale.denied, scale.recorded, scale.timed) == (1, 1, 1, 0)


def test_stats_records_win_over_derived_counts(tmp_path):
    w = crashed_writer()
    w.kernel_stats(0, launches=50, recorded=3, timed=2, graph_nodes=1, gpu_ns=1500)
    cap = read_capture(w.write(tmp_path / "s.clc"))
    assert cap.stats[0].launches == 50 and not cap.stats[0].partial
    # Kernel 1's stats record was never written: derived, and marked so.
    assert cap.stats[1].partial and cap.stats[1].launches == 1
    assert cap.stats_partial


def test_launch_of_a_kernel_whose_record_was_lost(tmp_path):
    w = CaptureWriter()
    w.launch(0, 5)
    cap = read_capture(w.write(tmp_path / "l.clc"))
    assert cap.kernels[5].mangled == ""
    assert "5" in cap.kernels[5].name
    assert cap.stats[5].launches == 1


def test_bad_magic(tmp_path):
    path = tmp_path / "x.clc"
    path.write_bytes(b"ELF\x7fwhatever" + bytes(100))
    with pytest.raises(CaptureError) as e:
        read_capture(path)
    assert str(e.value) == f"{path}: not a clc capture file"
    assert e.value.path == str(path)


def test_wrong_version(tmp_path):
    path = CaptureWriter(version=abi.CAPTURE_VERSION + 1).write(tmp_path / "v.clc")
    with pytest.raises(CaptureError) as e:
        read_capture(path)
    assert str(abi.CAPTURE_VERSION + 1) in str(e.value)
    assert str(abi.CAPTURE_VERSION) in e.value.message


def test_missing_file(tmp_path):
    with pytest.raises(CaptureError) as e:
        read_capture(tmp_path / "nope.clc")
    assert str(e.value).startswith(f"{tmp_path / 'nope.clc'}: ")


def test_unknown_record_types_are_skipped(tmp_path):
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.records.append(record(200, b"future stuff, any length"))
    w.records.append(record(201, b""))
    w.launch(0, 0)
    w.end()
    cap = read_capture(w.write(tmp_path / "u.clc"))
    assert [ln.seq for ln in cap.launches] == [0]
    assert cap.complete


def test_bad_policy_json_is_none(tmp_path):
    w = CaptureWriter()
    w.policy("{not json")
    assert read_capture(w.write(tmp_path / "p.clc")).policy is None


def test_read_captures(tmp_path):
    parent = normal_writer(pid=100, ppid=1).write(tmp_path / "100.clc")
    child = crashed_writer()
    child.pid, child.ppid = 101, 100
    caps = read_captures([parent, child.write(tmp_path / "101.clc")])
    assert [(c.pid, c.ppid, c.complete) for c in caps] == [(100, 1, True), (101, 100, False)]


def test_rule_names_cover_python_hooks_after_the_rules(tmp_path):
    # GIVEN a capture whose policy has one rule and two hooks from --hooks files
    from capture_writer import CaptureWriter

    w = CaptureWriter()
    w.policy({"version": 1, "rules": [{"name": "only-rule"}],
              "hook_deciders": ["h.py:first", "h.py:second"]})
    path = tmp_path / "hooks.clc"
    w.write(path)
    cap = read_capture(path)
    # THEN indices past the rules name the hooks, in order
    assert [cap.rule_name(i) for i in (0, 1, 2, 3, -1)] == [
        "only-rule", "hook h.py:first", "hook h.py:second", "rule 3", "default"]


# ---- streaming ------------------------------------------------------------------------------

def test_scan_keeps_everything_but_the_launches(tmp_path):
    # GIVEN a capture with every kind of record
    path = normal_writer().write(tmp_path / "a.clc")
    # WHEN it is scanned rather than read whole
    full, scanned = read_capture(path), scan_capture(path)
    # THEN only the launch list differs, and streaming the launches gives the same ones
    assert scanned.launches is None
    for name in ("pid", "command", "policy", "kernels", "modules", "messages", "stats",
                 "rule_stats", "kernel_rules", "complete", "dropped", "launch_records",
                 "timing_records"):
        assert getattr(scanned, name) == getattr(full, name), name
    assert list(launch_stream(scanned)) == full.launches
    assert scanned.launch_records == 4 and scanned.timing_records == 2


@pytest.mark.parametrize("chunk", [8, 24, 100])
def test_records_across_buffer_refills(tmp_path, monkeypatch, chunk):
    # GIVEN a read buffer smaller than most records, so that records straddle every refill
    path = normal_writer().write(tmp_path / "a.clc")
    expected = read_capture(path)
    monkeypatch.setattr(capture, "CHUNK", chunk)
    # THEN the capture reads the same
    for reader in (read_capture, scan_capture):
        cap = reader(path)
        assert (cap.kernels, cap.stats, cap.messages, cap.policy, cap.complete, cap.dropped) == \
            (expected.kernels, expected.stats, expected.messages, expected.policy, True, 2)
    assert list(launch_stream(scan_capture(path))) == expected.launches


def test_a_record_larger_than_the_buffer(tmp_path):
    # GIVEN a message record of several read buffers (a long traceback)
    w = CaptureWriter()
    text = "x" * (3 * capture.CHUNK + 5)
    w.message(text)
    w.end()
    cap = scan_capture(w.write(tmp_path / "m.clc"))
    # THEN it reads whole, and so do the records after it
    assert [m.text for m in cap.messages] == [text]
    assert cap.complete


def test_garbage_size_stops_the_records(tmp_path):
    # GIVEN records followed by a header claiming a size no writer makes
    w = crashed_writer()
    path = tmp_path / "g.clc"
    path.write_bytes(w.data() + abi.RECORD_HEADER.pack(abi.REC_MESSAGE, 0, 1 << 30) + b"\1" * 64)
    cap = scan_capture(path)
    # THEN what came before reads, and the rest is counted as trailing bytes
    assert cap.launch_records == 4 and not cap.complete
    assert cap.trailing_bytes == 8 + 64


def test_trailing_bytes_of_a_cut_record(tmp_path):
    data = crashed_writer().data()
    path = tmp_path / "t.clc"
    path.write_bytes(data[:-5])
    cap = scan_capture(path)
    assert cap.trailing_bytes == len(CaptureWriter().launch(3, 0)) - 5
    path.write_bytes(data)
    assert scan_capture(path).trailing_bytes == 0


def window_writer(n, timing_lag, timed=False):
    """n launches of one kernel; the launch `timing_lag` launches back gets its TIMING after
    each even launch; the records of launches 10 and 11 are swapped (two threads' chunks).
    `timed`: the LAUNCH records of the launches that get a TIMING say so, as the shim's do."""
    w = CaptureWriter()
    w.kernel(0, VECADD)
    for i in range(n):
        w.launch(i, 0, timed=timed and i % 2 == 0 and i + timing_lag < n)
        if i >= timing_lag and i % 2 == 0:
            w.timing(i - timing_lag, 0, 1000 + i)
    w.records[11], w.records[12] = w.records[12], w.records[11]
    w.end()
    return w


def test_launch_stream_restores_seq_order_and_matches_timings_in_its_window(tmp_path):
    cap = scan_capture(window_writer(200, timing_lag=30).write(tmp_path / "w.clc"))
    # WHEN the launches are streamed with a window wider than the timings' lag
    stream = launch_stream(cap, window=40)
    launches = list(stream)
    # THEN they come in seq order, every timing found its launch
    assert [ln.seq for ln in launches] == list(range(200))
    timed = [ln.seq for ln in launches if ln.gpu_ns is not None]
    assert timed == [i - 30 for i in range(30, 200) if i % 2 == 0]
    assert all(ln.gpu_ns == 1000 + ln.seq + 30 for ln in launches if ln.gpu_ns is not None)
    assert stream.unmatched_timings == 0


def test_launch_stream_counts_timings_beyond_its_window(tmp_path):
    cap = scan_capture(window_writer(200, timing_lag=30).write(tmp_path / "w.clc"))
    # WHEN the window is narrower than the lag
    stream = launch_stream(cap, window=10)
    launches = list(stream)
    # THEN every launch still comes out once, and the timings that came too late are counted
    assert sorted(ln.seq for ln in launches) == list(range(200))
    assert all(ln.gpu_ns is None for ln in launches)
    assert stream.unmatched_timings == cap.timing_records == 85


def test_a_timed_launch_past_the_window_waits_for_its_time(tmp_path):
    # GIVEN timed launches whose TIMING records lie further from them than the window (many
    # threads' chunks between a thread's launch and its timing)
    cap = scan_capture(window_writer(200, timing_lag=30, timed=True).write(tmp_path / "w.clc"))
    stream = launch_stream(cap, window=10)
    launches = list(stream)
    # THEN every launch comes out once, each timed one with its GPU time
    assert sorted(ln.seq for ln in launches) == list(range(200))
    timed = sorted(ln.seq for ln in launches if ln.gpu_ns is not None)
    assert timed == [i - 30 for i in range(30, 200) if i % 2 == 0]
    assert stream.unmatched_timings == 0
    # AND the others keep their order
    assert [ln.seq for ln in launches if ln.gpu_ns is None] == \
        sorted(ln.seq for ln in launches if ln.gpu_ns is None)


def test_launch_stream_memory_is_bounded_by_its_window(tmp_path):
    # GIVEN 50,000 launches (about 20 MB as LaunchRecord objects) streamed through a window of 1,000
    w = CaptureWriter()
    w.kernel(0, VECADD)
    path = tmp_path / "big.clc"
    path.write_bytes(w.data() + launch_block(0, 50_000))
    cap = scan_capture(path)
    tracemalloc.start()
    try:
        n = sum(1 for _ in launch_stream(cap, window=1000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN the peak is the read buffer and the window, not the launches
    assert n == 50_000
    assert peak < capture.CHUNK + 1_000_000


def test_timing_before_its_launch_is_matched(tmp_path):
    # A fast GPU can finish a launch before the thread writes its LAUNCH record.
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.timing(0, 0, 777)
    w.launch(0, 0)
    w.end()
    cap = scan_capture(w.write(tmp_path / "e.clc"))
    assert [ln.gpu_ns for ln in launch_stream(cap)] == [777]


# ---- END and RULE_STATS -----------------------------------------------------------------------

def test_end_record_with_write_errors(tmp_path):
    w = crashed_writer()
    w.end(dropped=3, write_lost_bytes=123456, capped_bytes=789, write_errno=errno.ENOSPC)
    cap = read_capture(w.write(tmp_path / "e.clc"))
    assert cap.complete
    assert (cap.dropped, cap.write_lost_bytes, cap.capped_bytes, cap.write_errno) == \
        (3, 123456, 789, errno.ENOSPC)


def test_the_last_counts_and_end_hold(tmp_path):
    # GIVEN a process that wrote its counts every second, then an END record, then launched
    # again (an exit handler) and wrote its counts and END again
    w = crashed_writer()
    w.kernel_stats(0, launches=2)
    w.rule_stats(0, 1)
    w.kernel_stats(0, launches=5)
    w.rule_stats(0, 3)
    w.end()
    w.launch(99, 0)
    w.kernel_stats(0, launches=6, recorded=1)
    w.rule_stats(0, 4)
    w.end(how=abi.END_SIGNAL, status=11, flags=abi.END_TABLE_FULL | abi.END_TRUNCATED,
          undecided=2)
    cap = read_capture(w.write(tmp_path / "e.clc"))
    # THEN each kernel's and each rule's last counts are the process's, not their sum
    assert cap.stats[0].launches == 6 and cap.rule_stats == {0: 4}
    # AND the last END says how it left and what the table and the cap did
    assert cap.complete and cap.end_how == abi.END_SIGNAL and cap.exit_status == 11
    assert cap.table_full and cap.truncated and cap.undecided_launches == 2
    assert cap.on_error_launches == 2


def test_records_after_the_last_end_leave_it_incomplete(tmp_path):
    # GIVEN a process killed after its END record and one more launch (a SIGKILL in a
    # destructor)
    w = crashed_writer()
    w.kernel_stats(0, launches=1)
    w.end()
    w.launch(7, 0)
    cap = read_capture(w.write(tmp_path / "k.clc"))
    # THEN the capture is incomplete: what followed was not counted by an END
    assert not cap.complete


def test_rule_stats_records(tmp_path):
    w = crashed_writer()
    w.rule_stats(0, 40)
    w.rule_stats(abi.RULE_DEFAULT, 2)
    w.end()
    cap = read_capture(w.write(tmp_path / "r.clc"))
    assert cap.rule_stats == {0: 40, abi.RULE_DEFAULT: 2}
    assert not cap.rule_stats_partial


def test_rule_counts_from_denied_launch_records_without_rule_stats(tmp_path):
    # GIVEN a crashed program: no RULE_STATS, one denied launch recorded (rule 0)
    cap = read_capture(crashed_writer().write(tmp_path / "c.clc"))
    # THEN the per-rule count comes from it, marked partial
    assert cap.rule_stats == {0: 1} and cap.rule_stats_partial
    assert cap.kernel_rules == {0: {abi.RULE_DEFAULT}, 1: {0}}


# ---- COUNTS: two copies overwritten in turn ------------------------------------------------

def two_copies(first, second, capacity=256):
    """A COUNTS record's copies: each (generation, launches of kernel 0, capped_bytes, torn)."""
    out = []
    for generation, launches, capped, torn in (first, second):
        entry = CaptureWriter.kernel_stats_entry(0, launches=launches, recorded=3)
        copy = counts_copy(entry, capacity, generation, capped_bytes=capped)
        if torn:  # the entries of a newer write, the header of an older one
            copy = copy[:abi.COUNTS_COPY.size] + CaptureWriter.kernel_stats_entry(
                0, launches=launches + 1, recorded=3) + copy[abi.COUNTS_COPY.size + len(entry):]
        out.append(copy)
    return out


@pytest.mark.parametrize("first, second, launches", [
    ((3, 30, 0, False), (4, 40, 0, False), 40),
    ((6, 60, 0, False), (5, 50, 0, False), 60),
    ((7, 70, 0, True), (6, 60, 0, False), 60),
    ((8, 80, 0, False), (9, 90, 0, True), 80),
    ((1, 10, 0, False), (0, 0, 0, False), 10),
], ids=["second-newer", "first-newer", "newer-torn", "second-torn", "second-never-written"])
def test_the_newer_whole_copy_holds(tmp_path, first, second, launches):
    # GIVEN a process whose counts' two copies were written in turn, the last write perhaps
    # cut short (SIGKILL mid-write: its checksum no longer matches) or never made
    w = crashed_writer()
    w.counts(copies=two_copies(first, second))
    cap = read_capture(w.write(tmp_path / "c.clc"))
    # THEN the counts are the newer copy's that is whole: the shim's, not derived
    assert cap.stats[0].launches == launches and not cap.stats[0].partial


def test_no_whole_copy_leaves_the_counts_to_the_records(tmp_path):
    # GIVEN a process killed while both copies were still unwritten or torn
    w = crashed_writer()
    w.counts(copies=two_copies((2, 20, 0, True), (0, 0, 0, False)))
    cap = read_capture(w.write(tmp_path / "c.clc"))
    # THEN its counts come from its records, marked so
    assert cap.stats[0].launches == 2 and cap.stats[0].partial


def test_a_later_counts_record_replaces_an_earlier_ones_counts(tmp_path):
    # GIVEN counts in two COUNTS records (the second holds the kernels that outgrew the first),
    # the first written again later, and a third cut short by the kill
    w = crashed_writer()
    w.counts(w.kernel_stats_entry(0, launches=5), w.rule_stats_entry(0, 2), capacity=256)
    w.counts(w.kernel_stats_entry(1, launches=7, denied=7))
    w.counts(w.kernel_stats_entry(0, launches=9), w.rule_stats_entry(0, 7), capacity=256)
    data = w.data() + w.counts(w.kernel_stats_entry(0, launches=100))[:40]
    path = tmp_path / "c.clc"
    path.write_bytes(data)
    cap = read_capture(path)
    # THEN each kernel's and rule's counts are those of the last whole record that holds them
    assert (cap.stats[0].launches, cap.stats[1].launches, cap.stats[1].denied) == (9, 7, 7)
    assert cap.rule_stats == {0: 7} and not cap.rule_stats_partial
    assert cap.trailing_bytes == 40


def test_a_killed_capture_says_what_its_cap_dropped(tmp_path):
    # GIVEN a process killed after its size cap had stopped its launch records: no END, its
    # counts' copy says how much was not written
    w = crashed_writer()
    w.counts(copies=two_copies((2, 2000, 4096, False), (1, 1000, 1024, False)))
    cap = read_capture(w.write(tmp_path / "c.clc"))
    # THEN the capture is incomplete and partial, and its counts are whole
    assert not cap.complete and cap.partial and cap.capped_bytes == 4096
    assert cap.stats[0].launches == 2000 and not cap.stats[0].partial


def test_the_capture_counts_of_an_end_and_of_a_later_copy_merge(tmp_path):
    # GIVEN an END record, then (launches in a destructor) a copy of the counts written after it
    w = crashed_writer()
    w.counts(w.kernel_stats_entry(0, launches=5), capacity=256)
    w.end(capped_bytes=100, dropped=1)
    w.counts(copies=two_copies((3, 6, 300, False), (0, 0, 0, False)))
    cap = read_capture(w.write(tmp_path / "c.clc"))
    # THEN the larger of each holds: counts only grow
    assert cap.capped_bytes == 300 and cap.dropped == 1 and cap.stats[0].launches == 6


@pytest.mark.parametrize("lost, partial", [
    ({}, False), ({"capped_bytes": 80}, True), ({"dropped": 1}, True),
    ({"write_lost_bytes": 8}, True), ({"flags": abi.END_TRUNCATED}, True),
    ({"flags": abi.END_TABLE_FULL}, False),
])
def test_a_capture_is_partial_when_records_are_missing(tmp_path, lost, partial):
    w = crashed_writer()
    w.end(**lost)
    assert read_capture(w.write(tmp_path / "c.clc")).partial is partial


def test_denied_graph_nodes_in_derived_counts(tmp_path):
    # The shim counts a denied graph-node call in `denied` and its record in `recorded`.
    w = CaptureWriter()
    w.kernel(0, VECADD)
    w.launch(0, 0, action=abi.ACTION_DENY, rule=0)
    w.launch(1, 0, entry=abi.ENTRY_GRAPH_ADD_NODE, action=abi.ACTION_DENY, rule=0)
    st = read_capture(w.write(tmp_path / "g.clc")).stats[0]
    assert (st.launches, st.graph_nodes, st.denied, st.recorded) == (1, 1, 2, 2)


# ---- inputs that are not capture files ---------------------------------------------------------

@pytest.fixture
def alarm():
    """Fail instead of hanging: a read that blocks is the bug these tests look for."""
    with deadline(10, TimeoutError("reading blocked")):
        yield


def fifo(tmp_path):
    path = tmp_path / "pipe.clc"
    os.mkfifo(path)
    return path


def unix_socket(tmp_path):
    path = tmp_path / "sock.clc"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return path, s


@pytest.mark.parametrize("reader", [read_capture, scan_capture])
def test_non_regular_files_are_refused_at_once(tmp_path, alarm, reader):
    path, sock = unix_socket(tmp_path)
    try:
        cases = [(fifo(tmp_path), "is a FIFO"), ("/dev/zero", "is a character device"),
                 (tmp_path, "is a directory"), (path, "is a socket")]
        for target, said in cases:
            with pytest.raises(CaptureError) as e:
                reader(target)
            assert e.value.message.startswith(said), e.value.message
            assert "not a capture file" in e.value.message
    finally:
        sock.close()


def test_a_link_to_a_capture_is_read(tmp_path):
    target = normal_writer().write(tmp_path / "a.clc")
    link = tmp_path / "link.clc"
    link.symlink_to(target)
    assert scan_capture(link).complete


def test_timing_records_are_counted_by_source(tmp_path):
    # GIVEN TIMING records from events, from CUPTI, and from a source this reader does not know
    w = CaptureWriter()
    w.process("./p")
    w.policy(POLICY)
    w.kernel(0, VECADD, device=0)
    for seq, source in enumerate((abi.TIMING_EVENTS, abi.TIMING_CUPTI, abi.TIMING_CUPTI, 7)):
        w.launch(seq, 0)
        w.timing(seq, 0, 1000 + seq, source=source)
    w.end()
    cap = read_capture(w.write(tmp_path / "a.clc"))
    # THEN each counts under its source's name, the unknown one by its number, and every time
    # reaches its launch whatever its source
    assert cap.timing_sources == {"events": 1, "cupti": 2, "7": 1}
    assert [ln.gpu_ns for ln in cap.launches] == [1000, 1001, 1002, 1003]

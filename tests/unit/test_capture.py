# SPDX-License-Identifier: Apache-2.0
"""The capture reader, on files built by tests/unit/capture_writer.py."""

import pytest

from capture_writer import CaptureWriter, record
from clc import abi
from clc.capture import CaptureError, read_capture, read_captures

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
    """A program that died mid-run: no KERNEL_STATS, no END, last record a LAUNCH."""
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

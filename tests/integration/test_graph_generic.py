# SPDX-License-Identifier: Apache-2.0
"""Kernel nodes made or changed through the generic graph-node API of CUDA 12.2+
(cuGraphAddNode in its 12.2 and 12.3 ABIs, cuGraphNodeSetParams, cuGraphExecNodeSetParams):
the same decision as a launch, taken when the node is made or changed; other node types pass.

prog_graph_generic (tests/fixtures/native) makes, in one graph, a vecAdd node (A, through the
12.3 ABI), a debug_kernel node (B, 12.2 ABI) and a memset node; sets A to debug_kernel then
scale, and in the executable graph to debug_kernel then vecAdd; launches the graph once."""

import collections
import re

from clc import abi
from harness import AUDIT, DENY_DEBUG, Run

VECADD, SCALE, DEBUG = "_Z6vecAddPKfS0_Pfi", "_Z5scalePff", "_Z12debug_kernelPi"
GENERIC_ENTRIES = {  # the program's entry point -> the entry point a capture records
    "cuGraphAddNode": abi.ENTRY_GRAPH_ADD_NODE,
    "cuGraphAddNode_v2": abi.ENTRY_GRAPH_ADD_NODE,
    "cuGraphNodeSetParams": abi.ENTRY_GRAPH_NODE_SET,
    "cuGraphExecNodeSetParams": abi.ENTRY_GRAPH_EXEC_NODE_SET,
}
# Every call the program makes, in order: (subject, entry point, grid X of its kernel params).
CALLS = [
    (VECADD, "cuGraphAddNode_v2", 4),
    (DEBUG, "cuGraphAddNode", 1),
    ("memset", "cuGraphAddNode_v2", None),
    (DEBUG, "cuGraphNodeSetParams", 2),
    (SCALE, "cuGraphNodeSetParams", 8),
    (DEBUG, "cuGraphExecNodeSetParams", 3),
    (VECADD, "cuGraphExecNodeSetParams", 16),
]
KERNEL_CALLS = [call for call in CALLS if call[0] != "memset"]


def fake_entries(stdout):
    """entry point -> the calls of it that reached the fake driver and succeeded."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^fake-entry: (\S+) calls=(\d+)", stdout, re.M)}


def graph_launch(stdout):
    (m,) = re.findall(r"^graph-launch nodes=(\d+) via cuGraphLaunch -> (-?\d+)$", stdout, re.M)
    return int(m[0]), int(m[1])


def test_generic_graph_calls_work_without_clc(native, run_native):
    # GIVEN the program over the fake driver alone
    proc = run_native([native["prog_graph_generic"]])
    # THEN both ABIs of cuGraphAddNode resolve, and every call succeeds
    assert proc.returncode == 0, proc.stderr
    assert "getproc cuGraphAddNode version=12030 flags=0 -> 0 status=0" in proc.stdout
    assert "getproc cuGraphAddNode version=12020 flags=0 -> 0 status=0" in proc.stdout
    run = Run(proc, None)
    assert run.results() == {(subject, entry): [0] * CALLS.count((subject, entry, grid))
                             for subject, entry, grid in CALLS}
    assert graph_launch(proc.stdout) == (3, 0)
    # AND each call reached the driver on the entry point it names (the 12.2 ABI once, the
    # 12.3 ABI twice), and the launch ran A (vecAdd in the executable graph) and B once
    entries = fake_entries(proc.stdout)
    assert {e: entries[e] for e in GENERIC_ENTRIES} == {
        "cuGraphAddNode": 1, "cuGraphAddNode_v2": 2, "cuGraphNodeSetParams": 2,
        "cuGraphExecNodeSetParams": 2}
    assert run.fake_graph_counts() == {VECADD: 1, DEBUG: 1, SCALE: 0}


def test_deny_refuses_debug_kernel_nodes_and_passes_the_rest(native, clc_run, run_native):
    # GIVEN a policy denying *debug* kernels
    baseline = Run(run_native([native["prog_graph_generic"]]), None).results()
    # WHEN the program runs under it
    run = clc_run(DENY_DEBUG, [native["prog_graph_generic"]])
    assert run.proc.returncode == 0, run.stderr
    results = run.results()
    # THEN every call that names debug_kernel, through either ABI and both setters, gets
    # CUDA_ERROR_NOT_PERMITTED
    assert {key: rs for key, rs in results.items() if key[0] == DEBUG} == {
        (DEBUG, "cuGraphAddNode"): [800],
        (DEBUG, "cuGraphNodeSetParams"): [800],
        (DEBUG, "cuGraphExecNodeSetParams"): [800]}
    # AND every other call gets what it gets without clc; the memset node passes untouched
    assert {key: rs for key, rs in results.items() if key[0] != DEBUG} == \
        {key: rs for key, rs in baseline.items() if key[0] != DEBUG}
    assert results[("memset", "cuGraphAddNode_v2")] == [0]
    # AND the driver never saw debug_kernel: no node B (the 12.2 ABI was never called), and the
    # graph ran without it
    assert fake_entries(run.stdout)["cuGraphAddNode"] == 0
    assert graph_launch(run.stdout) == (2, 0)
    assert run.fake_graph_counts() == {VECADD: 1, DEBUG: 0, SCALE: 0}
    # AND the rule's message is said once
    assert run.stderr.count("debug kernels are not allowed here") == 1
    # AND the capture counts every gated call as a graph node, the refused ones as denied
    cap = run.capture()
    assert cap.complete
    counted = {cap.kernels[kid].mangled: (s.launches, s.graph_nodes, s.denied)
               for kid, s in cap.stats.items()}
    assert {k: v for k, v in counted.items() if any(v)} == {
        VECADD: (0, 2, 0), SCALE: (0, 1, 0), DEBUG: (0, 3, 3)}


def test_audit_records_each_kernel_node_call_on_its_graph_entry_point(native, clc_run):
    # WHEN the program runs under the audit policy
    run = clc_run(AUDIT, [native["prog_graph_generic"]])
    # THEN it behaves as without clc
    assert run.proc.returncode == 0, run.stderr
    assert all(r == 0 for rs in run.results().values() for r in rs)
    assert graph_launch(run.stdout) == (3, 0)
    assert run.fake_graph_counts() == {VECADD: 1, DEBUG: 1, SCALE: 0}
    # AND the capture holds one record per kernel-node call, in order, on the graph entry point
    # of the call, with the shape its CUgraphNodeParams gave; none for the memset node
    cap = run.capture()
    assert cap.complete
    records = sorted(cap.launches, key=lambda launch: launch.seq)
    assert [(cap.kernels[r.kernel_id].mangled, r.entry, r.grid, r.block, r.action)
            for r in records] == \
        [(kernel, GENERIC_ENTRIES[entry], (grid, 1, 1), (256, 1, 1), abi.ACTION_ALLOW)
         for kernel, entry, grid in KERNEL_CALLS]
    # AND the kernel stats agree: every call a graph node, recorded, none denied
    per_kernel = collections.Counter(kernel for kernel, _, _ in KERNEL_CALLS)
    counted = {cap.kernels[kid].mangled: (s.launches, s.graph_nodes, s.recorded, s.denied)
               for kid, s in cap.stats.items()}
    assert {k: v for k, v in counted.items() if any(v)} == \
        {k: (0, n, n, 0) for k, n in per_kernel.items()}

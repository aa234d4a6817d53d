# SPDX-License-Identifier: Apache-2.0
"""clc.wrapping.ptx on the kernel zoo (tests/fixtures/zoo): nvcc's PTX of each program is parsed,
printed back (ptxas must still take it), and each kernel gets the loop verdict that
tests/fixtures/zoo/README.md promises. No GPU needed; skipped without nvcc."""

import os
import subprocess

import pytest

from kernel_zoo import FILES, cuda_tool, zoo_ptx_text
from clc.wrapping.ptx import (barriers, calls, cluster_directives, ctaid_reads, envreg_reads,
                     loop_verdict, nctaid_reads, parse, remap_verdict)

# file -> {PTX entry: (loopable, a phrase of the reason)}. Loopable kernels with a barrier
# say "no thread-divergent exit", those without "no block barrier": the phrase checks that
# the analysis saw the barriers the README lists.
EXPECTED = {
    "grid_stride.cu": {"grid_stride_saxpy": (True, "no block barrier")},
    "grid2d3d.cu": {"transpose2d": (True, "1 block barrier, and no thread-divergent exit"),
                    "volume3d": (True, "no block barrier")},
    "dyn_shared.cu": {"reverse_dynamic_smem": (True, "no thread-divergent exit")},
    "struct_param.cu": {"axpy_struct": (True, "no block barrier")},
    "templates.cu": {"_Z7scale_tIfEvPT_S0_i": (True, "no block barrier"),
                     "_Z7scale_tIiEvPT_S0_i": (True, "no block barrier")},
    "reduction.cu": {"block_reduce_sum": (True, "no thread-divergent exit")},
    "divergent_exit.cu": {"divergent_exit_then_barrier": (
        False, "a block barrier can run after a thread-divergent exit")},
    "cooperative.cu": {"grid_sync_kernel": (False, "cooperative kernel")},
    "clusters.cu": {"cluster_kernel": (False, "cluster kernel")},
    "printf_kernel.cu": {"hello_printf": (True, "no block barrier")},
    "atomics.cu": {"histogram_atomic": (True, "no block barrier")},
    "graph_replay.cu": {"graph_accumulate": (True, "no block barrier")},
}
KERNELS = [(f, k) for f in EXPECTED for k in EXPECTED[f]]


@pytest.mark.parametrize("name", FILES)
def test_round_trip_assembles(zoo_ptx, name, tmp_path):
    # GIVEN a zoo program's PTX WHEN it is parsed and printed back
    text = str(parse(zoo_ptx_text(zoo_ptx, name)))
    # THEN printing is stable, and ptxas still assembles it (when ptxas is installed)
    assert str(parse(text)) == text
    ptxas = cuda_tool("ptxas")
    if ptxas is not None:
        path = tmp_path / "rt.ptx"
        path.write_text(text)
        proc = subprocess.run([ptxas, "-arch=sm_90", str(path), "-o", os.devnull],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"ptxas refused the round trip of {name}:\n{proc.stderr}"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_entries_are_the_tables(zoo_ptx, name):
    # THEN each file defines exactly the kernels the README's table names
    assert set(parse(zoo_ptx_text(zoo_ptx, name)).entries) == set(EXPECTED[name])


@pytest.mark.parametrize("name,kernel", KERNELS)
def test_loop_verdict(zoo_ptx, name, kernel):
    # GIVEN a zoo kernel WHEN its loop verdict is asked
    entry = parse(zoo_ptx_text(zoo_ptx, name)).entries.get(kernel)
    assert entry is not None, f"no .entry {kernel} in {name}'s PTX"
    verdict = loop_verdict(entry)
    loopable, phrase = EXPECTED[name][kernel]
    # THEN it is the README's, for the README's reason
    assert (verdict.loopable, phrase in verdict.reason) == (loopable, True), verdict.reason
    # AND a 1:1 remap is refused for the cluster kernel only
    assert remap_verdict(entry).ok is (kernel != "cluster_kernel")


def test_queries_see_what_the_readme_lists(zoo_ptx):
    # GIVEN the zoo kernels whose README entries name PTX features
    def entry(name, kernel):
        return parse(zoo_ptx_text(zoo_ptx, name)).entries[kernel]

    # THEN the 3D kernel's block index and grid size reads are all found
    volume = entry("grid2d3d.cu", "volume3d")
    assert {r.register for r in ctaid_reads(volume)} == {"%ctaid.x", "%ctaid.y", "%ctaid.z"}
    assert {r.register for r in nctaid_reads(volume)} == {"%nctaid.x", "%nctaid.y",
                                                          "%nctaid.z"}
    assert {r.register for r in ctaid_reads(entry("grid2d3d.cu", "transpose2d"))} == {
        "%ctaid.x", "%ctaid.y"}
    # AND grid.sync() reads both halves of the workspace and uses barrier.sync
    coop = entry("cooperative.cu", "grid_sync_kernel")
    assert {r.register for r in envreg_reads(coop)} == {"%envreg1", "%envreg2"}
    assert {b.opcode for b in barriers(coop)} == {"barrier.sync"}
    # AND the cluster shape is in the directives, printf is a call to vprintf
    assert ".reqnctapercluster 2, 1, 1" in map(str, cluster_directives(
        entry("clusters.cu", "cluster_kernel")))
    assert [c.callee for c in calls(entry("printf_kernel.cu", "hello_printf"))] == ["vprintf"]
    assert len(barriers(entry("reduction.cu", "block_reduce_sum"))) >= 2

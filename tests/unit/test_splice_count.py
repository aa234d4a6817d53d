# SPDX-License-Identifier: Apache-2.0
"""block_count's 1:1 splice: each exit of the kernel gets its own copy of the counting tail,
so that threads other than thread 0 leave where the original's do (no shared epilogue that
every warp must reconverge at: on short blocks that cost 5.6 % of a reduction's time)."""

import os
import subprocess

import pytest

from clc.wrapping.ptx import Instruction, Label, parse
from clc.wrapping.splice import _MAX_TAILS, splice

from test_ptx import HEADER, PTXAS

COUNT = "red.global.add.u64 [%__clc_slot], 1;"
THREADS = "red.global.add.u64 [%__clc_slot+8], %__clc_vb;"


def module(body, regs=".reg .pred %p<9>;\n.reg .b32 %r<40>;\n.reg .b64 %rd<20>;"):
    return (f"{HEADER}.visible .entry k(.param .u64 k_param_0, .param .u32 k_param_1)\n{{\n"
            f"{regs}\n{body}\n}}\n")


def spliced_entry(body, tmp_path=None):
    out = splice(module(body), "k", loop=False)
    assert not out.looped
    if tmp_path is not None and PTXAS is not None:
        path = tmp_path / "k.ptx"
        path.write_text(out.ptx)
        proc = subprocess.run([PTXAS, "-arch=sm_90", "-c", str(path), "-o", os.devnull],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"ptxas refused the splice:\n{proc.stderr}\n{out.ptx}"
    return parse(out.ptx).entries["k"]


def flat(fn):
    return [s for s in fn.body.walk() if isinstance(s, (Instruction, Label))]


def assert_every_exit_counts(fn):
    """Every ret is the counting tail's: its thread-0 tests (guarded by %__clc_p) or its last
    instruction, right after the thread count; the kernel's own exits are all gone."""
    stmts = flat(fn)
    for k, s in enumerate(stmts):
        if isinstance(s, Instruction) and s.base in ("ret", "exit"):
            assert s.base == "ret"
            if s.guard:
                assert s.guard == "%__clc_p" and not s.negated, str(s)
            else:
                assert str(stmts[k - 1]) == THREADS, [str(x) for x in stmts[k - 3:k + 1]]


def tails(fn):
    return sum(str(s) == COUNT for s in flat(fn))


def test_merge_point_gets_a_copy_on_each_incoming_path(tmp_path):
    # GIVEN a reduction's ending: thread 0 stores, the others branch past it, both reach the
    # one `ret` at a label
    fn = spliced_entry("mov.u32 %r3, %tid.x;\nmov.u32 %r2, %ctaid.x;\n"
                       "setp.ne.s32 %p5, %r3, 0;\n@%p5 bra $L_end;\n"
                       "ld.param.u64 %rd1, [k_param_0];\nst.global.u32 [%rd1], %r2;\n"
                       "$L_end:\nret;", tmp_path)
    # THEN the fall-through path ends in a copy of its own before the label, the branch's
    # target holds another: no path joins another before leaving
    stmts = [str(s) for s in flat(fn)]
    assert tails(fn) == 2
    assert "__clc_done:" not in stmts
    label = stmts.index("$L_end:")
    assert stmts[label - 1] == "ret;" and stmts[label - 2] == THREADS
    assert_every_exit_counts(fn)
    # AND the kernel's own %tid.x and %ctaid.x registers are the tail's (ptxas folds the
    # thread-0 test into the kernel's own)
    assert "setp.ne.s32 %__clc_p, %r3, 0;" in stmts
    assert "and.b32 %__clc_t0, %r2, 31;" in stmts
    assert not any(s in stmts for s in ("mov.u32 %__clc_t2, %tid.x;",
                                         "mov.u32 %__clc_v0, %ctaid.x;"))


def test_guarded_exits_branch_to_copies_at_the_end(tmp_path):
    # GIVEN two guarded rets and a final one, in a nested block too
    fn = spliced_entry("mov.u32 %r1, %tid.x;\nsetp.eq.s32 %p1, %r1, 5;\n@%p1 ret;\n"
                       "{\nsetp.eq.s32 %p2, %r1, 7;\n@!%p2 exit;\n}\n"
                       "ld.param.u64 %rd1, [k_param_0];\nst.global.u32 [%rd1], %r1;\nret;",
                       tmp_path)
    stmts = [str(s) for s in flat(fn)]
    # THEN each guarded exit keeps its guard on a branch to its own copy, placed after the
    # body's last ret
    assert "@%p1 bra __clc_x0;" in stmts and "@!%p2 bra __clc_x1;" in stmts
    assert stmts.index("__clc_x0:") > stmts.index("@!%p2 bra __clc_x1;")
    assert tails(fn) == 3
    assert_every_exit_counts(fn)


def test_registers_the_kernel_rewrites_are_not_reused(tmp_path):
    # GIVEN a kernel whose %tid.x register is written again later, and whose %ctaid.x read is
    # not at its straight-line start
    fn = spliced_entry("mov.u32 %r3, %tid.x;\nsetp.eq.s32 %p1, %r3, 0;\n@%p1 bra $L1;\n"
                       "mov.u32 %r2, %ctaid.x;\n$L1:\nadd.s32 %r3, %r3, 1;\n"
                       "ld.param.u64 %rd1, [k_param_0];\nst.global.u32 [%rd1], %r3;\nret;",
                       tmp_path)
    stmts = [str(s) for s in flat(fn)]
    # THEN the tail reads both afresh
    assert "mov.u32 %__clc_t2, %tid.x;" in stmts and "mov.u32 %__clc_v0, %ctaid.x;" in stmts
    assert "setp.ne.s32 %__clc_p, %__clc_t2, 0;" in stmts
    assert "and.b32 %__clc_t0, %__clc_v0, 31;" in stmts
    assert_every_exit_counts(fn)


def test_a_body_that_falls_off_its_end_is_counted(tmp_path):
    fn = spliced_entry("mov.u32 %r1, %tid.x;\nsetp.eq.s32 %p1, %r1, 5;\n@%p1 ret;\n"
                       "ld.param.u64 %rd1, [k_param_0];\nst.global.u32 [%rd1], %r1;", tmp_path)
    stmts = [str(s) for s in flat(fn)]
    assert tails(fn) == 2
    assert stmts.index(COUNT) < stmts.index("__clc_x0:")  # the end's copy, then the guarded one
    assert_every_exit_counts(fn)


def test_many_exits_share_one_copy(tmp_path):
    # GIVEN more exits than the copies allowed
    body = "mov.u32 %r1, %tid.x;\n" + "".join(
        f"setp.eq.s32 %p1, %r1, {i};\n@%p1 ret;\n" for i in range(_MAX_TAILS + 1)) + "ret;"
    fn = spliced_entry(body, tmp_path)
    stmts = [str(s) for s in flat(fn)]
    # THEN they branch to the one shared epilogue, as before
    assert tails(fn) == 1
    assert "__clc_done:" in stmts
    assert sum(s == "@%p1 bra __clc_done;" for s in stmts) == _MAX_TAILS + 1
    assert_every_exit_counts(fn)


@pytest.mark.parametrize("enter", [False, True])
def test_deadline_and_policies_keep_the_shared_epilogue(enter):
    # (they call clc_finish, which needs the block's virtual index and policy state)
    out = splice(module("mov.u32 %r1, %tid.x;\nret;"), "k", loop=False, enter=enter)
    assert ("call clc_finish" in out.ptx or "call.uni clc_finish" in out.ptx) == enter
    assert ("__clc_done:" in out.ptx) == enter

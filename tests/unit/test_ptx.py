# SPDX-License-Identifier: Apache-2.0
"""clc.wrapping.ptx: the PTX tokenizer and parser, the per-kernel queries, and the loop verdict.

The rules are checked on hand-written kernels (each one shows a single shape); real nvcc
output (templates, struct parameters, printf call sequences, -G debug sections) is built
here when nvcc is installed, and every round trip is given to ptxas when it is.
"""

import concurrent.futures
import os
import subprocess

import pytest

from clc.wrapping.ptx import (INDIRECT, Block, Label, PtxError, barriers, calls, callees,
                     cluster_directives, cluster_uses, ctaid_reads, envreg_reads, exits,
                     loop_verdict, nctaid_reads, parse, remap_ok, remap_verdict, tokenize)
from kernel_zoo import cuda_tool

HEADER = ".version 9.0\n.target sm_90\n.address_size 64\n"


NVCC, PTXAS = cuda_tool("nvcc"), cuda_tool("ptxas")


def kernel(body, params=".param .u64 k_param_0, .param .u32 k_param_1", before="",
           directives=""):
    """The entry `k` of a module holding `before` and a kernel with `body`."""
    text = (f"{HEADER}{before}\n.visible .entry k({params})\n{directives}\n{{\n"
            "\t.reg .pred %p<9>;\n\t.reg .b32 %r<40>;\n\t.reg .b64 %rd<20>;\n"
            f"{body}\n}}\n")
    return parse(text).entries["k"]


def assert_ptxas_accepts(text, tmp_path, name="m"):
    if PTXAS is None:
        return
    path = tmp_path / f"{name}.ptx"
    path.write_text(text)
    proc = subprocess.run([PTXAS, "-arch=sm_90", str(path), "-o", os.devnull],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"ptxas refused the round trip of {name}:\n{proc.stderr}"


# -- tokenizer -------------------------------------------------------------------------------

def test_tokens_kinds_and_positions():
    # GIVEN PTX with both comment styles, a string, registers, labels, ::-qualified opcodes
    text = ('/* a\n   comment */ mov.u32\t%r1, %ctaid.x; // tail\n'
            '$L__BB0_1: .file 1 "a \\"b\\".cu"\n'
            'cp.async.bulk.shared::cluster.global [%rd1+-4], {%f1};')
    # WHEN it is tokenized
    toks = tokenize(text)
    # THEN comments are gone, each token has its kind, text, line and column
    assert [(t.kind, t.text) for t in toks[:6]] == [
        ("ident", "mov.u32"), ("ident", "%r1"), ("punct", ","), ("ident", "%ctaid.x"),
        ("punct", ";"), ("ident", "$L__BB0_1")]
    assert (toks[0].line, toks[0].column) == (2, 15)
    assert (toks[3].line, toks[3].column) == (2, 28)   # a tab is one column
    assert (toks[5].line, toks[5].column) == (3, 1)
    assert toks[6].text == ":" and toks[7].text == ".file"
    assert toks[9].kind == "string" and toks[9].text == '"a \\"b\\".cu"'
    assert toks[10].text == "cp.async.bulk.shared::cluster.global" and toks[10].line == 4
    assert [t.text for t in toks[11:]] == ["[", "%rd1", "+", "-", "4", "]", ",", "{", "%f1",
                                           "}", ";"]


@pytest.mark.parametrize("literal", ["0f3F800000", "0d3FF0000000000000", "0x1F", "0xffU",
                                     "0b101", "42", "42U", "1.5", "2.5e-3", "017"])
def test_number_literals(literal):
    # GIVEN a PTX number literal THEN it is one number token
    assert [(t.kind, t.text) for t in tokenize(literal)] == [("number", literal)]


@pytest.mark.parametrize("text,where,what", [
    ("mov.u32 %r1, 1;\n  # 2;", (2, 3), "unexpected character '#'"),
    ("ret;\n/* never closed", (2, 1), "unterminated /* comment"),
    ('.file 1 "open', (1, 9), "unterminated string"),
])
def test_tokenizer_errors_point_at_the_character(text, where, what):
    # GIVEN text no PTX token can start THEN the error says what and where
    with pytest.raises(PtxError) as e:
        tokenize(text)
    assert (e.value.line, e.value.column) == where
    assert str(e.value) == f"{where[0]}:{where[1]}: {what}"


# -- parser ----------------------------------------------------------------------------------

HANDWRITTEN = HEADER + r"""
.extern .func (.param .b32 func_retval0) vprintf
(
	.param .b64 vprintf_param_0,
	.param .b64 vprintf_param_1
)
;
.extern .shared .align 16 .b8 dyn[];
.global .align 4 .u32 counter;
.global .align 1 .b8 $str[4] = {104, 105, 10, 0};
.const .align 8 .u64 table[2] = {1, 2};

.func stop()
.noreturn
{
	trap;
}

.func (.param .b32 func_retval0) twice(
	.param .b32 twice_param_0
)
{
	.reg .b32 %r<3>;
	ld.param.b32 %r1, [twice_param_0];
	add.s32 %r2, %r1, %r1;
	st.param.b32 [func_retval0+0], %r2;
	ret;
}

.visible .entry s(
	.param .align 8 .b8 s_param_0[40],
	.param .u64 .ptr .global .align 16 s_param_1,
	.param .u32 s_param_2
)
.maxntid 128, 1, 1
.minnctapersm 2
.pragma "nounroll";
{
	.local .align 8 .b8 __local_depot0[8];
	.reg .b64 %SP;
	.reg .pred %p<3>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<10>;
	.shared .align 4 .b8 tile[512];
	ld.param.v2.f32 {%r1, %r2}, [s_param_0];
	ld.param.u32 %r3, [s_param_0+8];
	ld.param.u64 %rd1, [s_param_1];
	mov.u32 %r4, %tid.x;
	setp.lt.s32 %p1|%p2, %r4, %r3;
	@!%p1 bra $L__BB0_2;
	{
	.reg .b32 inner;
	mov.u32 inner, %ctaid.x;
	}
	{ // callseq 0, 0
	.param .b32 param0;
	st.param.b32 [param0+0], %r4;
	.param .b32 retval0;
	call.uni (retval0),
	twice,
	(
	param0
	);
	ld.param.b32 %r5, [retval0+0];
	}
	bar.sync 0;
$L__BB0_2:
	ret;
}
"""


def test_module_header_items_and_entries():
    # WHEN a module with declarations, variables, a .func and an .entry is parsed
    m = parse(HANDWRITTEN)
    # THEN the header, the entries and the functions are there
    assert (m.version, m.target, m.address_size) == ("9.0", ["sm_90"], 64)
    assert list(m.entries) == ["s"]
    assert list(m.functions) == ["vprintf", "stop", "twice"]
    assert m.functions["vprintf"].body is None and m.functions["vprintf"].linkage[0].text \
        == ".extern"
    variables = [str(i) for i in m.items if i.__class__.__name__ == "Variable"]
    assert variables == [".extern .shared .align 16 .b8 dyn[];",
                         ".global .align 4 .u32 counter;",
                         ".global .align 1 .b8 $str[4] = {104, 105, 10, 0};",
                         ".const .align 8 .u64 table[2] = {1, 2};"]
    assert m.entries["s"].module is m


def test_parameters_struct_ptr_align_and_returns():
    m = parse(HANDWRITTEN)
    s = m.entries["s"]
    struct, ptr, scalar = s.params
    # THEN a struct by value is a .b8 array with its alignment
    assert (struct.name, struct.type, struct.align, struct.array) == ("s_param_0", ".b8", 8,
                                                                      [40])
    # AND .ptr attributes are kept apart from the parameter's own alignment
    assert (ptr.type, ptr.ptr, ptr.ptr_space, ptr.ptr_align, ptr.align) == (
        ".u64", True, ".global", 16, None)
    assert (scalar.name, scalar.type, scalar.ptr) == ("s_param_2", ".u32", False)
    twice = m.functions["twice"]
    assert [p.name for p in twice.returns] == ["func_retval0"]
    assert [d.name for d in m.functions["stop"].directives] == [".noreturn"]


def test_performance_directives():
    # GIVEN an entry's .maxntid/.minnctapersm/.pragma THEN they are its directives, in order
    s = parse(HANDWRITTEN).entries["s"]
    assert [str(d) for d in s.directives] == [".maxntid 128, 1, 1", ".minnctapersm 2",
                                              '.pragma "nounroll";']
    assert s.directive(".maxntid").args == "128, 1, 1"
    assert s.directive(".maxnreg") is None
    # AND the others of an entry parse the same way, ahead of its body
    k = kernel("ret;", directives=".reqntid 256\n.maxnreg 64\n.maxclusterrank 4")
    assert [(d.name, d.args) for d in k.directives] == [(".reqntid", "256"),
                                                        (".maxnreg", "64"),
                                                        (".maxclusterrank", "4")]
    assert str(k).split("{")[0].endswith(")\n.reqntid 256\n.maxnreg 64\n.maxclusterrank 4\n")


def test_body_tree_guards_operands_nested_blocks():
    s = parse(HANDWRITTEN).entries["s"]
    top = s.body.statements
    # THEN declarations, instructions, nested blocks and labels are statements of the tree
    assert [type(x).__name__ for x in top[:6]] == ["Directive"] * 6
    assert isinstance(top[-2], Label) and top[-2].name == "$L__BB0_2"
    blocks = [x for x in top if isinstance(x, Block)]
    assert len(blocks) == 2 and str(blocks[0].statements[1]) == "mov.u32 inner, %ctaid.x;"
    branch = next(i for i in s.instructions() if i.base == "bra")
    assert (branch.guard, branch.negated, branch.opcode) == ("%p1", True, "bra")
    assert str(branch) == "@!%p1 bra $L__BB0_2;"
    setp = next(i for i in s.instructions() if i.base == "setp")
    assert [str(o) for o in setp.operands] == ["%p1|%p2", "%r4", "%r3"]
    assert setp.parts == ["setp", "lt", "s32"]
    ld = s.instructions()[0]
    assert [str(o) for o in ld.operands] == ["{%r1, %r2}", "[s_param_0]"]
    assert ld.operands[1].is_memory and ld.operands[0].registers() == ["%r1", "%r2"]
    call = next(i for i in s.instructions() if i.base == "call")
    assert [str(o) for o in call.operands] == ["(retval0)", "twice", "(param0)"]
    line = HANDWRITTEN.splitlines().index("\tld.param.v2.f32 {%r1, %r2}, [s_param_0];") + 1
    assert (ld.line, ld.column) == (line, 2)


def test_round_trip_is_stable_and_assembles(tmp_path):
    # WHEN the module is printed and parsed again
    once = str(parse(HANDWRITTEN))
    twice = str(parse(once))
    # THEN the second print is the first, and ptxas accepts it
    assert once == twice
    assert once.startswith(HEADER)
    assert_ptxas_accepts(once, tmp_path)


def test_line_directives_and_debug_sections_kept():
    text = (HEADER + '.file 1 "/tmp/a.cu"\n.visible .entry k()\n{\n.loc 1 3 0\nret;\n}\n'
            "\t.section\t.debug_str\n\t{\n$L__info_string0:\n.b8 95,90\n.b8 0\n\t}\n")
    m = parse(text)
    out = str(m)
    assert '.file 1 "/tmp/a.cu"\n' in out and "\t.loc 1 3 0\n" in out
    # THEN the .section is kept line by line, as DWARF data needs
    assert out.endswith(".section\t.debug_str\n\t{\n$L__info_string0:\n.b8 95,90\n.b8 0\n\t}\n")
    assert str(parse(out)) == out


@pytest.mark.parametrize("text,where,what", [
    (HEADER + ".visible .entry k()\n{\n\tret;\n", (5, 1), "'{' is never closed"),
    (HEADER + ".visible .entry k()\n{\n\tmov.u32 %r1, 1\n}", (7, 1),
     "expected ';', found '}'"),
    (HEADER + ".visible .entry k()\n{\n\tmov.u32 %r1, 1", (6, 16),
     "unexpected end of text: expected ';'"),
    (HEADER + ".visible .entry k(.param .u32)\n{\nret;\n}", (4, 19),
     "parameter without a name"),
    (HEADER + ".visible .entry k()\n{\n\tret;\n\t@%p1;\n}", (7, 6),
     "expected an opcode, found ';'"),
    (HEADER + ".visible .entry k()\n{\n\t@[x] ret;\n}", (6, 3),
     "expected a predicate after '@', found '['"),
    (HEADER + "mov.u32 %r1, 1;", (4, 1), "expected a directive at module scope, found "
     "'mov.u32'"),
    (HEADER + ".visible .entry k()\n{\n\tmov.u32 %r1,, 1;\n}", (6, 2),
     "empty operand in mov.u32"),
])
def test_parse_errors_have_line_and_column(text, where, what):
    # GIVEN malformed PTX WHEN it is parsed THEN PtxError points at the line and column
    with pytest.raises(PtxError) as e:
        parse(text)
    assert (e.value.line, e.value.column, e.value.message) == (*where, what)


# -- queries ---------------------------------------------------------------------------------

def test_ctaid_and_nctaid_reads():
    # GIVEN reads of %ctaid and %nctaid by mov and cvt, and one of %tid
    k = kernel("mov.u32 %r1, %ctaid.x;\nmov.u32 %r2, %ctaid.z;\nmov.u32 %r3, %nctaid.y;\n"
               "cvt.u64.u32 %rd1, %ctaid.y;\nmov.u32 %r4, %tid.x;\nret;")
    assert [(r.register, r.dests, r.instruction.line) for r in ctaid_reads(k)] == [
        ("%ctaid.x", ("%r1",), 11), ("%ctaid.z", ("%r2",), 12), ("%ctaid.y", ("%rd1",), 14)]
    assert [(r.register, r.dests) for r in nctaid_reads(k)] == [("%nctaid.y", ("%r3",))]


def test_exits_barriers_and_calls():
    k = kernel("@%p1 ret;\nbar.sync 0;\nbar 1;\nbarrier.sync.aligned 0;\nbar.red.popc.u32 %r1, 0, "
               "%p1;\nbarrier.cta.arrive 2, 64;\nbar.warp.sync -1;\nbarrier.cluster.arrive;\n"
               "call.uni f, ();\ncall (retval0), %rd1, (param0), proto;\n@!%p2 exit;\nret;",
               before=".extern .func f();")
    assert [(str(e), e.guard) for e in exits(k)] == [("@%p1 ret;", "%p1"),
                                                   ("@!%p2 exit;", "%p2"), ("ret;", None)]
    # THEN block barriers are found in every spelling, warp and cluster syncs are not
    assert [b.opcode for b in barriers(k)] == ["bar.sync", "bar", "barrier.sync.aligned",
                                               "bar.red.popc.u32", "barrier.cta.arrive"]
    assert [c.callee for c in calls(k)] == ["f", None]


def test_envreg_and_cluster_queries():
    # GIVEN a kernel using environment registers, cluster registers, mapa and cluster barriers
    k = kernel("mov.u32 %r1, %envreg2;\nmov.u32 %r2, %cluster_ctarank;\n"
               "mov.u32 %r3, %clusterid.x;\nmapa.u64 %rd2, %rd1, %r1;\nbarrier.cluster.wait;\n"
               "ret;", directives=".reqnctapercluster 2, 1, 1\n.explicitcluster\n"
               ".maxclusterrank 8")
    assert [r.register for r in envreg_reads(k)] == ["%envreg2"]
    assert [u.register for u in cluster_uses(k)] == ["%cluster_ctarank", "%clusterid.x",
                                                     "mapa.u64", "barrier.cluster.wait"]
    assert [str(d) for d in cluster_directives(k)] == [".reqnctapercluster 2, 1, 1",
                                                       ".explicitcluster", ".maxclusterrank 8"]


def test_callees_follow_calls_and_function_pointers():
    # GIVEN direct calls, nested calls, an extern, and a call through a pointer whose only
    # possible target is the function a global table holds
    before = (".func leaf()\n{\nret;\n}\n.func mid()\n{\ncall.uni leaf, ();\nret;\n}\n"
              ".func taken()\n{\nret;\n}\n.global .u64 vtable[1] = {taken};\n"
              ".extern .func ext();")
    k = kernel("call.uni mid, ();\ncall.uni ext, ();\ncall %rd1, (), proto;\nret;",
               before=before)
    reached, indirect = callees(k)
    assert [f if isinstance(f, str) else f.name for f in reached] == ["mid", "ext", "taken",
                                                                      "leaf"]
    assert indirect
    # AND a pointer that no function of the module can be is code from elsewhere
    k = kernel("call %rd1, (), proto;\nret;")
    assert callees(k) == ([INDIRECT], True)


# -- the loop verdict ------------------------------------------------------------------------

# Block-uniform inputs: the block index and size, and kernel parameters.
UNIFORM_PRELUDE = ("ld.param.u32 %r10, [k_param_1];\nmov.u32 %r1, %ctaid.x;\n"
                   "mov.u32 %r2, %ntid.x;\nmul.lo.s32 %r3, %r1, %r2;\n")
TID = "mov.u32 %r4, %tid.x;\nmad.lo.s32 %r5, %r1, %r2, %r4;\n"


def test_no_barrier_is_loopable_even_with_divergent_exits():
    # GIVEN `if (i >= n) return;` with i from %tid.x, and no barrier anywhere
    k = kernel(UNIFORM_PRELUDE + TID + "setp.ge.s32 %p1, %r5, %r10;\n@%p1 bra $L_end;\n"
               "st.global.u32 [%rd1], %r5;\n$L_end:\nret;")
    v = loop_verdict(k)
    assert v and v.loopable and v.ok
    assert v.reason == "no block barrier: its exits can become branches to the next step"


def test_block_uniform_early_exit_before_barrier_is_loopable():
    # GIVEN `if (blockIdx.x * blockDim.x >= n) return;` then a barrier (reduction's shape)
    k = kernel(UNIFORM_PRELUDE + "setp.ge.u32 %p1, %r3, %r10;\n@%p1 bra $L_end;\n" + TID +
               "bar.sync 0;\nsetp.ne.s32 %p2, %r4, 0;\n@%p2 bra $L_end;\n"
               "st.global.u32 [%rd1], %r5;\n$L_end:\nret;")
    # THEN it may loop: the only exit before the barrier is taken by whole blocks
    v = loop_verdict(k)
    assert v.loopable, v.reason
    assert v.reason == "1 block barrier, and no thread-divergent exit before one"


def test_divergent_exit_then_barrier_is_refused():
    # GIVEN `if (i >= n) return;` with i from %tid.x, then __syncthreads()
    k = kernel(UNIFORM_PRELUDE + TID + "setp.ge.s32 %p1, %r5, %r10;\n@%p1 bra $L_end;\n"
               "st.shared.u32 [%r4], %r5;\nbar.sync 0;\nld.shared.u32 %r6, [%r4];\n"
               "$L_end:\nret;")
    v = loop_verdict(k)
    # THEN looping is refused, and the reason names the exit, its cause and the barrier
    assert not v and not v.loopable
    assert v.reason == ("a block barrier can run after a thread-divergent exit: "
                        "`@%p1 bra $L_end` (line 18) depends on %tid.x, so some threads may "
                        "leave while others reach bar.sync at line 20; looped, they would "
                        "wait at different barrier generations")
    # AND a 1:1 remap stays allowed
    assert remap_ok(k) is True


@pytest.mark.parametrize("source,why", [
    ("ld.global.u32 %r7, [%rd1];", "a load from memory (ld.global.u32, line 11)"),
    ("mov.u32 %r7, %laneid;", "%laneid"),
    ("atom.global.add.u32 %r7, [%rd1], 1;", "the result of atom.global.add.u32 (line 11)"),
    ("ld.param.u32 %r7, [retval0];", "a load from memory (ld.param.u32, line 11)"),
    ("mov.u32 %r7, %weird;", "%weird (unknown)"),
])
def test_divergence_sources(source, why):
    # GIVEN an exit predicate computed from `source`, before a barrier
    k = kernel(f"{source}\nsetp.eq.s32 %p1, %r7, 0;\n@%p1 ret;\nbar.sync 0;\nret;")
    v = loop_verdict(k)
    assert not v.loopable and f"depends on {why}," in v.reason


def test_constant_memory_at_a_uniform_address_is_uniform():
    # GIVEN `if (blockIdx.x >= c_limit) return;` with c_limit a __constant__, then a barrier
    before = ".const .align 4 .u32 c_limit;"
    k = kernel("ld.const.u32 %r7, [c_limit];\nmov.u32 %r1, %ctaid.x;\n"
               "setp.ge.u32 %p1, %r1, %r7;\n@%p1 ret;\nbar.sync 0;\nret;", before=before)
    # THEN the exit is block-uniform: constant memory does not change during a launch
    assert loop_verdict(k).loopable
    # AND at a thread-dependent address it is not
    k = kernel("mov.u32 %r4, %tid.x;\nmov.u32 %r5, c_limit;\nadd.s32 %r6, %r5, %r4;\n"
               "ld.const.u32 %r7, [%r6];\nsetp.eq.u32 %p1, %r7, 0;\n@%p1 ret;\nbar.sync 0;\n"
               "ret;", before=before)
    assert "depends on %tid.x" in loop_verdict(k).reason


def test_uniform_values_followed_through_registers():
    # GIVEN an exit predicate from parameters, %nctaid, constants and symbol addresses only,
    # through mov/add/mad/shl/and/selp/cvt
    k = kernel("ld.param.u64 %rd2, [k_param_0];\nmov.u32 %r1, %nctaid.y;\n"
               "add.s32 %r2, %r1, 3;\nmad.lo.s32 %r3, %r2, %r1, 7;\nshl.b32 %r4, %r3, 2;\n"
               "and.b32 %r5, %r4, 255;\nmov.u64 %rd3, $str;\ncvt.u32.u64 %r6, %rd2;\n"
               "setp.lt.s32 %p2, %r6, 0;\nselp.b32 %r7, %r5, %r6, %p2;\n"
               "setp.eq.s32 %p1, %r7, 0;\n@%p1 ret;\nbar.sync 0;\nret;",
               before=".global .align 1 .b8 $str[1];")
    assert loop_verdict(k).loopable


def test_guarded_ret_after_the_last_barrier_is_loopable():
    # GIVEN `@%p ret` on a %tid predicate after the only barrier THEN looping is safe
    k = kernel(TID + "bar.sync 0;\nsetp.ne.s32 %p1, %r4, 0;\n@%p1 ret;\n"
               "st.global.u32 [%rd1], %r4;\nret;")
    assert loop_verdict(k).loopable


def test_guarded_ret_before_a_barrier_is_refused():
    # GIVEN `@%p ret` on a %tid predicate before a barrier THEN looping is refused
    k = kernel(TID + "setp.ne.s32 %p1, %r4, 0;\n@%p1 ret;\nbar.sync 0;\nret;")
    assert "thread-divergent exit" in loop_verdict(k).reason


def test_divergent_exit_in_a_loop_reaches_the_barrier_by_the_back_edge():
    # GIVEN a loop whose top is a barrier and whose body may leave on a %tid predicate
    k = kernel(TID + "mov.u32 %r6, 0;\n$L_top:\nbar.sync 0;\nsetp.eq.s32 %p1, %r4, %r6;\n"
               "@%p1 bra $L_out;\nadd.s32 %r6, %r6, 1;\nsetp.lt.s32 %p2, %r6, 8;\n"
               "@%p2 bra $L_top;\n$L_out:\nret;")
    assert not loop_verdict(k).loopable


def test_divergent_branch_that_rejoins_before_the_barrier_is_loopable():
    # GIVEN `if (tid < k) s[tid] += ...; __syncthreads();` in a uniform loop
    k = kernel(UNIFORM_PRELUDE + TID + "shr.u32 %r6, %r2, 1;\n$L_top:\n"
               "setp.ge.u32 %p1, %r4, %r6;\n@%p1 bra $L_sync;\nst.shared.u32 [%r4], %r6;\n"
               "$L_sync:\nbar.sync 0;\nshr.u32 %r6, %r6, 1;\nsetp.ne.s32 %p2, %r6, 0;\n"
               "@%p2 bra $L_top;\nret;")
    assert loop_verdict(k).loopable


def test_value_set_under_a_divergent_branch_is_divergent():
    # GIVEN a flag set to constants on either side of a %tid branch, then tested to exit
    k = kernel(TID + "setp.lt.u32 %p1, %r4, 32;\nmov.u32 %r6, 0;\n@%p1 bra $L_join;\n"
               "mov.u32 %r6, 1;\n$L_join:\nsetp.eq.s32 %p2, %r6, 0;\n@%p2 bra $L_end;\n"
               "bar.sync 0;\n$L_end:\nret;")
    v = loop_verdict(k)
    # THEN the flag is divergent through control flow, and looping is refused
    assert not v.loopable and "(through the branch at line" in v.reason


def test_negated_guard_and_exit_instruction():
    # GIVEN `@!%p exit` on a %tid predicate before a barrier THEN it is the exit named
    k = kernel(TID + "setp.lt.u32 %p1, %r4, 32;\n@!%p1 exit;\nbar.sync 0;\nret;")
    assert "`@!%p1 exit` (line 14)" in loop_verdict(k).reason


def test_warp_sync_is_not_a_block_barrier():
    # GIVEN a divergent exit followed only by bar.warp.sync THEN looping is safe
    k = kernel(TID + "setp.lt.u32 %p1, %r4, 32;\n@%p1 ret;\nbar.warp.sync -1;\nret;")
    assert loop_verdict(k).loopable


def test_divergent_trap_is_not_an_exit():
    # GIVEN a %tid-dependent trap (an assert): the launch fails, no loop step follows
    k = kernel(TID + "setp.lt.u32 %p1, %r4, 32;\n@%p1 bra $L_ok;\ntrap;\n$L_ok:\nbar.sync 0;\n"
               "ret;")
    assert loop_verdict(k).loopable


@pytest.mark.parametrize("body,what,bar", [
    ("brx.idx %r1, $L_targets;\n$L_targets: .branchtargets $L_a, $L_b;\n$L_a:\nbar.sync 0;\n"
     "$L_b:\nret;", "an indirect branch (brx.idx) at line 11", 14),
    ("@%p1 bra $L_nowhere;\nbar.sync 0;\nret;",
     "a branch to an unknown label $L_nowhere at line 11", 12),
])
def test_unclear_exit_positions_with_a_barrier_are_refused(body, what, bar):
    # GIVEN a kernel whose branches cannot all be followed, and a barrier
    v = loop_verdict(kernel(body))
    # THEN looping is refused, saying the exits could not be placed
    assert not v.loopable
    assert v.reason == (f"exit position unclear: {what}, and a block barrier (bar.sync at "
                        f"line {bar}); refused to be safe")


def test_indirect_branch_without_barrier_is_loopable():
    # GIVEN brx.idx in a kernel without barriers THEN where it exits does not matter
    k = kernel("brx.idx %r1, $L_t;\n$L_t: .branchtargets $L_a;\n$L_a:\nret;")
    assert loop_verdict(k).loopable


def test_cooperative_kernels_are_refused():
    # GIVEN nvcc 13's grid.sync(): the grid workspace read from %envreg1/%envreg2
    k = kernel("mov.u32 %r1, %envreg2;\nmov.u32 %r2, %envreg1;\nbarrier.sync 0;\nret;")
    v = loop_verdict(k)
    assert v.reason.startswith("cooperative kernel: reads %envreg2 (line 11)")
    # AND the older toolkits' runtime call
    k = kernel("call.uni cudaCGSynchronizeGrid, ();\nret;",
               before=".extern .func cudaCGSynchronizeGrid();")
    assert loop_verdict(k).reason.startswith("cooperative kernel: calls cudaCGSynchronizeGrid")
    # AND a remap stays allowed: every block still runs at once
    assert remap_ok(k)


@pytest.mark.parametrize("body,directives,mark", [
    ("ret;", ".reqnctapercluster 2, 1, 1", ".reqnctapercluster 2, 1, 1 (line 6)"),
    ("ret;", ".explicitcluster", ".explicitcluster (line 6)"),
    ("mov.u32 %r1, %cluster_ctarank;\nret;", "", "%cluster_ctarank (mov.u32 at line 11)"),
    ("barrier.cluster.arrive;\nret;", "", "barrier.cluster.arrive (barrier.cluster.arrive at "
     "line 11)"),
    ("mapa.u64 %rd1, %rd2, 1;\nret;", "", "mapa.u64 (mapa.u64 at line 11)"),
])
def test_cluster_kernels_are_refused_for_loop_and_remap(body, directives, mark):
    # GIVEN each mark of a cluster kernel, alone
    k = kernel(body, params="", directives=directives)
    v = loop_verdict(k)
    assert not v.loopable and v.reason.startswith(f"cluster kernel: {mark}")
    r = remap_verdict(k)
    assert remap_ok(k) is False and not r.ok
    assert r.reason.startswith(f"cluster kernel: {mark}") and "virtual ones" in r.reason


def test_cluster_register_read_in_a_called_function():
    # GIVEN a cluster register read in a function the kernel calls THEN it is a cluster kernel
    k = kernel("call.uni f, ();\nret;",
               before=".func f()\n{\n.reg .b32 %r<2>;\nmov.u32 %r1, %cluster_nctarank;\nret;\n}")
    assert "in f" in loop_verdict(k).reason and not remap_ok(k)


def test_callee_that_exits_is_refused_even_without_barrier():
    # GIVEN a call into a function that executes exit THEN looping is refused: the thread
    # would be gone for every later virtual block
    k = kernel("call.uni f, ();\nret;", before=".func f()\n{\nexit;\n}")
    assert loop_verdict(k).reason.startswith("calls f, which executes exit (line 6)")


def test_barrier_inside_a_callee_counts():
    # GIVEN a divergent exit, then a call to a function whose body has the barrier
    before = ".func sync()\n{\nbar.sync 0;\nret;\n}"
    k = kernel(TID + "setp.lt.u32 %p1, %r4, 32;\n@%p1 ret;\ncall.uni sync, ();\nret;",
               before=before)
    v = loop_verdict(k)
    assert not v.loopable and "reach call.uni at line" in v.reason
    # AND the same call with no divergent exit before it is fine
    assert loop_verdict(kernel("call.uni sync, ();\nret;", before=before)).loopable


@pytest.mark.parametrize("before,call,loopable,reason", [
    (".extern .func ext();", "call.uni ext, ();", False,
     "exit position unclear: calls ext, whose code is not in this PTX"),
    ("", "call %rd1, (), proto;", False,
     "exit position unclear: calls through a function pointer whose targets are not in "
     "this PTX"),
    (".func t()\n{\nret;\n}\n.global .u64 fp = t;", "call %rd1, (), proto;", True, ""),
    (".extern .func (.param .b32 r) vprintf(.param .b64 a, .param .b64 b);",
     "call.uni (r), vprintf, (a, b);", True, ""),
])
def test_extern_and_indirect_callees(before, call, loopable, reason):
    # GIVEN a call whose target's code may or may not be in the module
    v = loop_verdict(kernel(call + "\nret;", before=before))
    assert v.loopable is loopable and v.reason.startswith(reason)


def test_a_func_is_not_a_kernel():
    # GIVEN a .func THEN there is no loop to speak of
    f = parse(HANDWRITTEN).functions["twice"]
    assert loop_verdict(f) == loop_verdict(f) and not loop_verdict(f).loopable
    assert loop_verdict(f).reason == "twice is not a kernel definition"


def test_remap_mentions_callees_that_read_ctaid():
    # GIVEN a called function reading %ctaid THEN a remap is fine and says the callee reads it
    k = kernel("call.uni f, ();\nret;",
               before=".func f()\n{\n.reg .b32 %r<2>;\nmov.u32 %r1, %ctaid.x;\nret;\n}")
    r = remap_verdict(k)
    assert r.ok and "f (called) also read %ctaid/%nctaid" in r.reason


def test_handwritten_kernels_assemble(tmp_path):
    # GIVEN the kernels the rules above are shown on THEN they are real PTX: ptxas takes
    # their round trip (when ptxas is installed)
    k = kernel(UNIFORM_PRELUDE + TID + "setp.ge.s32 %p1, %r5, %r10;\n@%p1 bra $L_end;\n"
               "cvt.u64.u32 %rd2, %r4;\nst.shared.u32 [%rd2], %r5;\nbar.sync 0;\n"
               "$L_end:\nret;")
    assert_ptxas_accepts(str(k.module), tmp_path, "divergent")


# -- real nvcc output ------------------------------------------------------------------------

NVCC_SOURCE = r"""
#include <cstdio>
struct P { float a; int n; double d[2]; };
template <typename T> __global__ void scale(T *x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
template __global__ void scale<float>(float *, float, int);
template __global__ void scale<double>(double *, double, int);
__device__ __noinline__ float helper(float v) { return v * 3 + 1; }
__global__ void __launch_bounds__(128, 2) by_value(P p, float *y) {
    __shared__ float s[128];
    if (blockIdx.x >= p.n) return;
    s[threadIdx.x] = helper(p.a) + p.d[1];
    __syncthreads();
    y[threadIdx.x] = s[127 - threadIdx.x];
    if (threadIdx.x == 0) printf("%f\n", y[0]);
}
__global__ void early(float *y, int n) {
    __shared__ float s[128];
    if (threadIdx.x >= n) return;
    s[threadIdx.x] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[(threadIdx.x + 1) % 128];
}
"""
NVCC_BUILDS = {"plain": [], "debug": ["-G"], "lineinfo": ["-lineinfo"], "rdc": ["-rdc=true"]}


@pytest.fixture(scope="module")
def nvcc_ptx(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found (PATH, /usr/local/cuda/bin, nvidia-cuda-nvcc): "
                    "these tests parse its output")
    d = tmp_path_factory.mktemp("ptx")
    (d / "k.cu").write_text(NVCC_SOURCE)

    def build(name):
        out = d / f"{name}.ptx"
        proc = subprocess.run([NVCC, "-ptx", "-arch=sm_90", *NVCC_BUILDS[name], "k.cu", "-o",
                               out.name], cwd=d, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return name, out.read_text()

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(NVCC_BUILDS)) as pool:
        return dict(pool.map(build, NVCC_BUILDS))


@pytest.mark.parametrize("build", list(NVCC_BUILDS))
def test_nvcc_output_round_trips(nvcc_ptx, build, tmp_path):
    # GIVEN nvcc's PTX (plain, -G with DWARF sections, -lineinfo, -rdc) WHEN printed back
    # THEN printing is stable, every kernel is there, and ptxas assembles it
    m = parse(nvcc_ptx[build])
    out = str(m)
    assert str(parse(out)) == out
    assert set(m.entries) == {"_Z5scaleIfEvPT_S0_i", "_Z5scaleIdEvPT_S0_i",
                              "_Z8by_value1PPf", "_Z5earlyPfi"}
    assert_ptxas_accepts(out, tmp_path, build)


@pytest.mark.parametrize("build", list(NVCC_BUILDS))
def test_nvcc_output_verdicts(nvcc_ptx, build):
    # GIVEN the same kernels THEN their verdicts hold in every build
    m = parse(nvcc_ptx[build])
    verdicts = {name: loop_verdict(e) for name, e in m.entries.items()}
    assert verdicts["_Z5scaleIfEvPT_S0_i"].loopable
    if build == "debug":
        # -G spills the parameters to the local stack and reloads them: a reload is a load
        # from memory, so the uniform early exit looks divergent (conservative, not wrong)
        assert "depends on a load from memory (ld.u32" in verdicts["_Z8by_value1PPf"].reason
    else:
        assert verdicts["_Z8by_value1PPf"].loopable, verdicts["_Z8by_value1PPf"].reason
    assert "thread-divergent exit" in verdicts["_Z5earlyPfi"].reason


def test_nvcc_struct_param_launch_bounds_and_call(nvcc_ptx):
    # GIVEN nvcc's struct-by-value, __launch_bounds__ kernel with calls THEN all is found
    e = parse(nvcc_ptx["plain"]).entries["_Z8by_value1PPf"]
    p = e.params[0]
    assert (p.type, p.align, p.array) == (".b8", 8, [24])
    assert [str(d) for d in e.directives] == [".maxntid 128, 1, 1", ".minnctapersm 2"]
    assert {c.callee for c in calls(e)} == {"_Z6helperf", "vprintf"}
    assert [r.register for r in ctaid_reads(e)] == ["%ctaid.x"]

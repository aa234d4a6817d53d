# SPDX-License-Identifier: Apache-2.0
"""The splice: one kernel's PTX rewritten in place to run under clc's wrapper runtime.

`splice(ptx, kernel, loop=True)` returns a `Spliced` whose `.ptx` keeps the kernel's entry,
its parameters and performance directives (.maxntid, .reqntid, .minnctapersm, .maxnreg), its
module's .version/.target/.address_size, functions and variables, drops the module's other
entries, and changes three things (clc/wrappers/runtime.cu has the runtime's side):

- one parameter is appended, `.param .align 8 .b8 __clc_arg[32]` (struct clc_launch_arg: the
  launch's slot address and virtual grid), which the shim adds to each launch;
- reads of %ctaid.{x,y,z} and %nctaid.{x,y,z} take registers holding the virtual block's
  coordinates and the virtual grid;
- the body runs under a claim loop: at the top every thread calls `clc_next`, which returns
  the next virtual block for the whole block (or -1: done), and each `ret`/`exit` becomes a
  branch to the loop's next step. When the body may not loop (clc.ptx.loop_verdict: a
  thread-divergent exit before a barrier, grid sync) or `loop=False`, it runs once, 1:1,
  its exits branching to the end, where `clc_finish` frees the launch's slot.

A kernel the splice must refuse raises `Unwrappable` with the reason: clusters, cooperative
kernels (grid sync), module variables shared with the rest of the program (a wrapped copy
would not see the program's writes), %ctaid read inside called functions, a bare vector
%ctaid read.
"""

from dataclasses import dataclass

from clc.ptx import (Block, Directive, Function, Instruction, Label, Operand, Token, Variable,
                     callees, exits, loop_verdict, parse, remap_verdict, special_reads)

__all__ = ["Spliced", "Unwrappable", "splice", "ARG_NAME", "ARG_SIZE", "RUNTIME_FUNCTIONS"]

ARG_NAME = "__clc_arg"
ARG_SIZE = 32
RUNTIME_FUNCTIONS = ("clc_next", "clc_finish")

_PREFIX = "__clc_"
_AXES = ("x", "y", "z")

_EXTERNS = """
.extern .func (.param .b64 func_retval0) clc_next(.param .b64 slot, .param .b32 grid_x,
    .param .b32 grid_y, .param .b32 grid_z, .param .b32 iter, .param .b64 prev);
.extern .func clc_finish(.param .b64 slot);
"""

_DECLS = """
.reg .b32 %__clc_v<3>;
.reg .b32 %__clc_g<3>;
.reg .b32 %__clc_iter;
.reg .b64 %__clc_slot;
.reg .b64 %__clc_vb;
.reg .b64 %__clc_prev;
.reg .b64 %__clc_t<4>;
.reg .pred %__clc_p;
"""

_PROLOGUE = """
ld.param.u64 %__clc_slot, [__clc_arg];
ld.param.u32 %__clc_g0, [__clc_arg+8];
ld.param.u32 %__clc_g1, [__clc_arg+12];
ld.param.u32 %__clc_g2, [__clc_arg+16];
mov.u32 %__clc_iter, 0;
mov.s64 %__clc_prev, -1;
__clc_loop:
{
.param .b64 __clc_a0;
.param .b32 __clc_a1;
.param .b32 __clc_a2;
.param .b32 __clc_a3;
.param .b32 __clc_a4;
.param .b64 __clc_a5;
.param .b64 __clc_r0;
st.param.b64 [__clc_a0], %__clc_slot;
st.param.b32 [__clc_a1], %__clc_g0;
st.param.b32 [__clc_a2], %__clc_g1;
st.param.b32 [__clc_a3], %__clc_g2;
st.param.b32 [__clc_a4], %__clc_iter;
st.param.b64 [__clc_a5], %__clc_prev;
call.uni (__clc_r0), clc_next, (__clc_a0, __clc_a1, __clc_a2, __clc_a3, __clc_a4, __clc_a5);
ld.param.b64 %__clc_vb, [__clc_r0];
}
setp.lt.s64 %__clc_p, %__clc_vb, 0;
@%__clc_p bra __clc_done;
cvt.u64.u32 %__clc_t0, %__clc_g0;
cvt.u64.u32 %__clc_t1, %__clc_g1;
rem.u64 %__clc_t2, %__clc_vb, %__clc_t0;
cvt.u32.u64 %__clc_v0, %__clc_t2;
div.u64 %__clc_t3, %__clc_vb, %__clc_t0;
rem.u64 %__clc_t2, %__clc_t3, %__clc_t1;
cvt.u32.u64 %__clc_v1, %__clc_t2;
div.u64 %__clc_t2, %__clc_t3, %__clc_t1;
cvt.u32.u64 %__clc_v2, %__clc_t2;
"""

_STEP = """
__clc_step:
mov.u64 %__clc_prev, %__clc_vb;
add.u32 %__clc_iter, %__clc_iter, 1;
bra.uni __clc_loop;
"""

_EPILOGUE = """
__clc_done:
{
.param .b64 __clc_f0;
st.param.b64 [__clc_f0], %__clc_slot;
call.uni clc_finish, (__clc_f0);
}
ret;
"""

_ARG_PARAM = f".param .align 8 .b8 {ARG_NAME}[{ARG_SIZE}]"


class Unwrappable(Exception):
    """Why a kernel cannot be wrapped (the reason is what `on_unwrappable` reports)."""


@dataclass
class Spliced:
    ptx: str            # the spliced module
    kernel: str         # the entry's name
    looped: bool        # the body runs in the claim loop (else once, 1:1)
    reason: str         # why it loops or not (clc.ptx's verdict)
    params: int         # the kernel's own parameters (the shim appends one more)
    target: list        # the module's .target


def _snippet(function_text):
    """The parsed statements/params of a snippet wrapped in a throwaway module."""
    module = parse(".version 7.0\n.target sm_70\n.address_size 64\n" + function_text)
    return [i for i in module.items if isinstance(i, Function)]


def _statements(text):
    return _snippet(".entry __clc_snippet()\n{\n" + text + "\n}\n")[0].body.statements


def _referenced_symbols(fn):
    return {name for ins in fn.instructions() for op in ins.operands for name in op.symbols()}


def _shared_variable_reason(module, functions):
    """Why a module variable the kernel uses makes a wrapped copy wrong, or None."""
    variables = {i.name: i for i in module.items if isinstance(i, Variable)}
    used = set()
    for f in functions:
        used |= _referenced_symbols(f)
    for name in sorted(used & variables.keys()):
        var = variables[name]
        texts = [t.text for t in var.tokens]
        if ".extern" in texts or var.space in (".shared", ".local", ".param"):
            continue
        initialized = "=" in texts
        if var.space == ".global" and initialized and name.startswith("$str"):
            continue  # nvcc's string literals (printf formats): constant data
        if var.space == ".const" and initialized:
            continue
        kind = "__constant__" if var.space == ".const" else "__device__"
        return (f"uses the module variable {name} ({kind}, line {var.line}), which the program "
                "may write from the host or from other kernels: a wrapped copy would not see "
                "those writes")
    return None


def splice(ptx, kernel, loop=True):
    """The spliced PTX of entry `kernel` of PTX text `ptx` (str or bytes)."""
    if isinstance(ptx, (bytes, bytearray)):
        ptx = bytes(ptx).split(b"\0", 1)[0].decode("utf-8", "replace")
    module = parse(ptx)
    fn = module.entries.get(kernel)
    if fn is None:
        raise Unwrappable(f"no .entry {kernel} in this PTX")
    for f in module.items:
        if isinstance(f, Function) and f.name in RUNTIME_FUNCTIONS:
            raise Unwrappable(f"the PTX defines {f.name}, a name the wrapper runtime uses")
    _check_names(fn)
    remap = remap_verdict(fn)
    if not remap.ok:
        raise Unwrappable(remap.reason)
    reached = [f for f in callees(fn)[0] if isinstance(f, Function)]
    inside = sorted({f.name for f in reached if special_reads(f, ("%ctaid", "%nctaid"))})
    if inside:
        raise Unwrappable(f"{', '.join(inside)} (called by the kernel) read %ctaid/%nctaid; only "
                          "the kernel's own reads can take virtual block indices")
    why = _shared_variable_reason(module, [fn] + reached)
    if why:
        raise Unwrappable(why)
    for f in [fn] + reached:
        for read in special_reads(f, ("%envreg",)):
            raise Unwrappable(f"cooperative kernel: reads {read.register} (line "
                              f"{read.instruction.line}), the grid-sync workspace; the program "
                              "sizes a cooperative grid by the original kernel's occupancy, "
                              "which a wrapped copy does not have")
    verdict = loop_verdict(fn)
    looped = loop and verdict.ok
    if not verdict.ok and not looped:
        for f in reached:
            if any(e.base == "exit" for e in exits(f)):
                raise Unwrappable(f"calls {f.name}, which executes exit: the block could not "
                                  "free its launch slot")

    _rewrite_specials(fn)
    _rewrite_exits(fn, "__clc_step" if looped else "__clc_done")
    fn.params.append(_snippet(f".entry __clc_snippet({_ARG_PARAM})\n{{\nret;\n}}\n")[0].params[0])

    statements = fn.body.statements
    first = next((i for i, s in enumerate(statements)
                  if not (isinstance(s, Directive) and s.name != ".loc")), len(statements))
    prologue = _statements(_PROLOGUE)
    fn.body.statements = (_statements(_DECLS) + statements[:first] + prologue
                          + statements[first:]
                          + (_statements(_STEP) if looped else []) + _statements(_EPILOGUE))

    # Only this entry: the others would be compiled for nothing (their functions stay).
    externs = _snippet(_EXTERNS)
    items = [i for i in module.items if not (isinstance(i, Function) and i.is_entry
                                             and i is not fn)]
    at = next((k for k, i in enumerate(items) if not isinstance(i, Directive)
               or i.name not in (".version", ".target", ".address_size")), len(items))
    module.items = items[:at] + externs + items[at:]
    return Spliced(str(module), kernel, looped,
                   verdict.reason if looped else
                   ("a 1:1 remap was asked for" if verdict.ok else verdict.reason),
                   len(fn.params) - 1, module.target)


def _rewrite_specials(fn):
    for ins in fn.instructions():
        for op in ins.operands:
            for k, tok in enumerate(op.tokens):
                text = tok.text
                if tok.kind != "ident" or not text.startswith(("%ctaid", "%nctaid")):
                    continue
                base, _, axis = text.partition(".")
                if base not in ("%ctaid", "%nctaid"):
                    continue
                if axis not in _AXES:
                    raise Unwrappable(f"reads {text} as a whole at line {ins.line}; only "
                                      "%ctaid.x/.y/.z reads can be remapped")
                reg = "%__clc_v" if base == "%ctaid" else "%__clc_g"
                op.tokens[k] = Token("ident", f"{reg}{_AXES.index(axis)}", tok.line, tok.column)


def _rewrite_exits(fn, label):
    def walk(block):
        for k, s in enumerate(block.statements):
            if isinstance(s, Block):
                walk(s)
            elif isinstance(s, Instruction) and s.base in ("ret", "exit"):
                opcode = "bra" if s.guard else "bra.uni"
                block.statements[k] = Instruction(
                    opcode, [_operand(label, s)], s.guard, s.negated, s.line, s.column)
    walk(fn.body)


def _operand(name, at):
    return Operand([Token("ident", name, at.line, at.column)])


# Labels are names the splice adds; a kernel that already has them would be ambiguous.
def _check_names(fn):
    for s in fn.body.walk():
        if isinstance(s, Label) and s.name.startswith(_PREFIX):
            raise Unwrappable(f"the kernel has a label {s.name}, a name the splice uses")

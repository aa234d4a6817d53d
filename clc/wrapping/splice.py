# SPDX-License-Identifier: Apache-2.0
"""The splice: one kernel's PTX rewritten in place to run under clc's wrapper runtime.

`splice(ptx, kernel, loop=True)` returns a `Spliced` whose `.ptx` keeps the kernel's entry,
its parameters and performance directives (.maxntid, .reqntid, .minnctapersm, .maxnreg), its
module's .version/.target/.address_size, functions and variables, drops the module's other
entries, and changes three things (clc/wrapping/device/runtime.cu has the runtime's side):

- one parameter is appended, `.param .align 8 .b8 __clc_arg[32]` (struct clc_launch_arg: the
  launch's slot address and virtual grid), which the shim adds to each launch;
- in the claim loop, reads of %ctaid.{x,y,z} and %nctaid.{x,y,z} take registers holding the
  virtual block's coordinates and the program's grid (a 1:1 kernel keeps its own);
- the body runs under a claim loop: every thread calls `clc_claim` for a batch of virtual
  blocks [base, end), runs the body once per virtual block of it, and each `ret`/`exit`
  becomes a branch to the loop's next step. When the body may not loop
  (clc.wrapping.ptx.loop_verdict: a thread-divergent exit before a barrier) or `loop=False`, it
  runs once, 1:1, for the index `clc_enter` gives (its own, or -1: skip), its exits branching
  to the end, where `clc_finish` adds the block's counts; a 1:1 kernel that calls no runtime
  function (block_count) counts its block at each exit instead, with a copy of the counting
  code there.
clc/wrapping/device/runtime.cu describes the protocol and its costs.

A kernel the splice must refuse raises `Unwrappable` with the reason: clusters, cooperative
kernels (grid sync), module variables shared with the rest of the program (a wrapped copy
would not see the program's writes), %ctaid read inside called functions, a bare vector
%ctaid read, PTX that clc's reader cannot parse. `check(module, kernel, loop)` makes every one
of those refusals without changing the module; `splice` is `check` then `splice_checked`.
"""

import copy
from dataclasses import dataclass

from clc import abi
from clc.wrapping.ptx import (Block, Directive, Function, Instruction, Label, Operand, PtxError,
                              Token, Variable, callees, exits, loop_verdict, parse, remap_verdict,
                              special_reads)

__all__ = ["Spliced", "Checked", "Unwrappable", "parsed", "check", "splice", "splice_checked",
           "single_entry", "ptx_text", "ARG_NAME", "ARG_SIZE", "RUNTIME_FUNCTIONS"]

ARG_NAME = "__clc_arg"
ARG_SIZE = abi.LAUNCH_ARG.size
RUNTIME_FUNCTIONS = ("clc_claim", "clc_enter", "clc_finish")

_PREFIX = "__clc_"
_AXES = ("x", "y", "z")
_REMAPPED = {f"{base}.{axis}" for base in ("%ctaid", "%nctaid") for axis in _AXES}

_EXTERNS = """
.extern .func (.param .align 8 .b8 func_retval0[16]) clc_claim(.param .b64 slot,
    .param .b32 total, .param .b32 share_sms, .param .b32 want, .param .b32 seq,
    .param .b32 batch, .param .b64 prev);
.extern .func (.param .b64 func_retval0) clc_enter(.param .b64 slot, .param .b32 grid_x,
    .param .b32 grid_y, .param .b32 grid_z, .param .b32 seq);
.extern .func clc_finish(.param .b64 slot, .param .b32 seq, .param .b64 last);
.extern .global .attribute(.managed) .align {stripe} .b8 clc_stats[{size}];
""".format(stripe=abi.STATS_STRIPE_BYTES, size=abi.STATS_BYTES)

_DECLS = """
.reg .pred %__clc_p1d;
.reg .b32 %__clc_v<3>;
.reg .b32 %__clc_g<3>;
.reg .b32 %__clc_seq;
.reg .b32 %__clc_batch;
.reg .b32 %__clc_t<3>;
.reg .b64 %__clc_slot;
.reg .b64 %__clc_vb;
.reg .b64 %__clc_end;
.reg .b64 %__clc_last;
.reg .pred %__clc_p;
"""

def _call(function, args, result=None, into=(), uniform=True):
    """A PTX call of a runtime function, in a block of its own: `args` are (type, register)
    pairs, `result` the return parameter's declaration with {} for its name, `into` the
    (register, byte offset) pairs read back from it. `uniform`: every thread of the block
    calls it at once (call.uni)."""
    names = [f"__{function}_a{i}" for i in range(len(args))]
    ret = f"__{function}_r"
    lines = ["{"] + [f".param .{kind} {name};" for name, (kind, _) in zip(names, args)]
    if result:
        lines.append(f".param {result.format(ret)};")
    lines += [f"st.param.{kind} [{name}], {reg};" for name, (kind, reg) in zip(names, args)]
    lines.append(f"call{'.uni' if uniform else ''} {f'({ret}), ' if result else ''}{function}, "
                 f"({', '.join(names)});")
    lines += [f"ld.param.b64 {reg}, [{ret}{f'+{offset}' if offset else ''}];"
              for reg, offset in into]
    return "\n".join(lines + ["}"]) + "\n"


_AT = abi.LAUNCH_ARG_AT
assert _AT["slot"] == 0
_ARGS = f"""
ld.param.u64 %__clc_slot, [__clc_arg];
ld.param.u32 %__clc_g0, [__clc_arg+{_AT['grid']}];
ld.param.u32 %__clc_g1, [__clc_arg+{_AT['grid'] + 4}];
ld.param.u32 %__clc_g2, [__clc_arg+{_AT['grid'] + 8}];
ld.param.u32 %__clc_seq, [__clc_arg+{_AT['seq']}];
"""

# The virtual block's coordinates from its linear index (the shim keeps grids below 2^31
# blocks, so 32-bit arithmetic holds); a 1D grid needs no division.
_COORDS = """
cvt.u32.u64 %__clc_t0, %__clc_vb;
@!%__clc_p1d bra.uni __clc_coords3;
mov.u32 %__clc_v0, %__clc_t0;
mov.u32 %__clc_v1, 0;
mov.u32 %__clc_v2, 0;
bra.uni __clc_coords;
__clc_coords3:
rem.u32 %__clc_v0, %__clc_t0, %__clc_g0;
div.u32 %__clc_t1, %__clc_t0, %__clc_g0;
rem.u32 %__clc_v1, %__clc_t1, %__clc_g1;
div.u32 %__clc_v2, %__clc_t1, %__clc_g1;
__clc_coords:
"""

_LOOP_HEAD = _ARGS + f"""
setp.eq.u32 %__clc_p1d, %__clc_g1, 1;
setp.eq.and.u32 %__clc_p1d, %__clc_g2, 1, %__clc_p1d;
mov.u32 %__clc_batch, 0;
mov.s64 %__clc_vb, -1;
mov.s64 %__clc_end, -1;
__clc_loop:
add.s64 %__clc_vb, %__clc_vb, 1;
setp.lt.s64 %__clc_p, %__clc_vb, %__clc_end;
@%__clc_p bra.uni __clc_body;
sub.s64 %__clc_last, %__clc_vb, 1;
mul.lo.u32 %__clc_t0, %__clc_g0, %__clc_g1;
mul.lo.u32 %__clc_t0, %__clc_t0, %__clc_g2;
ld.param.u32 %__clc_t1, [__clc_arg+{_AT['share_sms']}];
ld.param.u32 %__clc_t2, [__clc_arg+{_AT['batch']}];
""" + _call("clc_claim", [("b64", "%__clc_slot"), ("b32", "%__clc_t0"), ("b32", "%__clc_t1"),
                         ("b32", "%__clc_t2"), ("b32", "%__clc_seq"), ("b32", "%__clc_batch"),
                         ("b64", "%__clc_last")],
            ".align 8 .b8 {}[16]", [("%__clc_vb", 0), ("%__clc_end", 8)]) + """
add.u32 %__clc_batch, %__clc_batch, 1;
setp.lt.s64 %__clc_p, %__clc_vb, 0;
@%__clc_p bra.uni __clc_done;
__clc_body:
""" + _COORDS

_ONCE_HEAD = _ARGS + _call(
    "clc_enter", [("b64", "%__clc_slot"), ("b32", "%__clc_g0"), ("b32", "%__clc_g1"),
                  ("b32", "%__clc_g2"), ("b32", "%__clc_seq")],
    ".b64 {}", [("%__clc_vb", 0)]) + """
mov.b64 %__clc_last, %__clc_vb;
setp.lt.s64 %__clc_p, %__clc_vb, 0;
@%__clc_p bra.uni __clc_done;
"""

_PLAIN_HEAD = ""

# Where every thread leaves: thread 0 goes on to count the block, the others to __clc_exit.
# Most threads leave on %tid.x alone (which the kernel has usually read already); only the
# first thread of each row reads %tid.y and %tid.z: for a short block (a reduction step) the
# epilogue is a measurable part of each thread's work.
_DONE_THREAD0 = """
__clc_done:
mov.u32 %__clc_t0, %tid.x;
setp.ne.u32 %__clc_p, %__clc_t0, 0;
@%__clc_p bra __clc_exit;
mov.u32 %__clc_t0, %tid.y;
mov.u32 %__clc_t1, %tid.z;
or.b32 %__clc_t0, %__clc_t0, %__clc_t1;
setp.ne.u32 %__clc_p, %__clc_t0, 0;
@%__clc_p bra __clc_exit;
"""

# A 1:1 kernel without clc_enter (block_count) counts its block where it leaves: thread 0
# adds 1 block and its threads to the stripe of its %ctaid.x, as clc_finish would. Each exit
# gets a copy of this tail (_inline_exits), so that the threads other than thread 0 leave
# where the original's do, with no reconvergence before a shared epilogue: on a kernel of
# short blocks (a reduction step) every instruction per warp shows in its run time. {tx} and
# {cx} are registers holding %tid.x and %ctaid.x (the kernel's own when it keeps them, so
# that ptxas folds the thread-0 test into the kernel's own).
_COUNT_TAIL = """
setp.ne.s32 %__clc_p, {tx}, 0;
@%__clc_p ret;
mov.u32 %__clc_t0, %tid.y;
mov.u32 %__clc_t1, %tid.z;
or.b32 %__clc_t0, %__clc_t0, %__clc_t1;
setp.ne.u32 %__clc_p, %__clc_t0, 0;
@%__clc_p ret;
and.b32 %__clc_t0, {cx}, 31;
mul.wide.u32 %__clc_vb, %__clc_t0, 128;
mov.u64 %__clc_slot, clc_stats;
add.u64 %__clc_slot, %__clc_slot, %__clc_vb;
red.global.add.u64 [%__clc_slot], 1;
mov.u32 %__clc_t0, %ntid.x;
mov.u32 %__clc_t1, %ntid.y;
mul.lo.u32 %__clc_t0, %__clc_t0, %__clc_t1;
mov.u32 %__clc_t1, %ntid.z;
mul.wide.u32 %__clc_vb, %__clc_t0, %__clc_t1;
red.global.add.u64 [%__clc_slot+8], %__clc_vb;
ret;
"""

# With more exits than this, they branch to one shared copy instead (code size).
_MAX_TAILS = 8

# The shared form: every exit branches to __clc_done.
_PLAIN_EPILOGUE = """
__clc_done:
mov.u32 %__clc_t2, %tid.x;
mov.u32 %__clc_v0, %ctaid.x;
""" + _COUNT_TAIL.format(tx="%__clc_t2", cx="%__clc_v0")

_STEP = """
__clc_step:
bra.uni __clc_loop;
"""

_EPILOGUE = _DONE_THREAD0 + _call(
    "clc_finish", [("b64", "%__clc_slot"), ("b32", "%__clc_seq"), ("b64", "%__clc_last")],
    uniform=False) + """
__clc_exit:
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
    reason: str         # why it loops or not (clc.wrapping.ptx's verdict)
    params: int         # the kernel's own parameters (the shim appends one more)


def ptx_text(ptx):
    """PTX as text: str as it is, bytes up to their first NUL (as the driver reads them)."""
    if isinstance(ptx, (bytes, bytearray)):
        return bytes(ptx).split(b"\0", 1)[0].decode("utf-8", "replace")
    return ptx


def _module_items(text):
    """The items of a throwaway module made of `text`, its header directives left out."""
    module = parse(".version 7.0\n.target sm_70\n.address_size 64\n" + text)
    return [i for i in module.items if not isinstance(i, Directive)]


def _only_entry(module, fn):
    """The module's items without its other entries (their functions stay)."""
    return [i for i in module.items if not (isinstance(i, Function) and i.is_entry
                                            and i is not fn)]


def _snippet(function_text):
    """The parsed functions of a snippet wrapped in a throwaway module."""
    return [i for i in _module_items(function_text) if isinstance(i, Function)]


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


@dataclass
class Checked:
    """A kernel the splice accepts, and how it would run: what check() found."""

    module: object      # the parsed module (splice_checked rewrites it in place)
    fn: object          # the kernel's entry
    looped: bool        # its body runs in the claim loop (else once, 1:1)
    verdict: object     # clc.wrapping.ptx.loop_verdict of the entry


def parsed(ptx):
    """The Module of PTX text or bytes; Unwrappable when clc's PTX reader cannot read it."""
    try:
        return parse(ptx_text(ptx))
    except PtxError as e:
        raise Unwrappable(f"its PTX does not parse: {e}") from None


def check(module, kernel, loop=True):
    """Whether entry `kernel` of a parsed module can be spliced, looped when `loop` and its
    body may loop, else 1:1: a Checked, or Unwrappable with the reason. Changes nothing."""
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
    if looped:
        for read in special_reads(fn, ("%ctaid", "%nctaid")):
            if read.register not in _REMAPPED:
                raise Unwrappable(f"reads {read.register} as a whole at line "
                                  f"{read.instruction.line}; only %ctaid.x/.y/.z reads can be "
                                  "remapped")
    return Checked(module, fn, looped, verdict)


def splice(ptx, kernel, loop=True, enter=False):
    """The spliced PTX of entry `kernel` of PTX text `ptx` (str or bytes). A kernel that runs
    1:1 keeps its %ctaid reads and calls clc_enter only when `enter` (a wrapper that may skip
    a block or that tells a policy about it)."""
    return splice_checked(check(parsed(ptx), kernel, loop), enter)


def splice_checked(checked, enter=False):
    """splice() of a kernel check() accepted: its module rewritten in place."""
    module, fn, looped, verdict = checked.module, checked.fn, checked.looped, checked.verdict
    if looped:
        _rewrite_specials(fn)
    inline = not looped and not enter and _inline_exits(fn)
    if not inline:
        _rewrite_exits(fn, "__clc_step" if looped else "__clc_done")
    fn.params.append(_snippet(f".entry __clc_snippet({_ARG_PARAM})\n{{\nret;\n}}\n")[0].params[0])

    statements = fn.body.statements
    first = next((i for i, s in enumerate(statements)
                  if not (isinstance(s, Directive) and s.name != ".loc")), len(statements))
    prologue = _statements(_LOOP_HEAD if looped else _ONCE_HEAD if enter else _PLAIN_HEAD)
    fn.body.statements = (_statements(_DECLS) + statements[:first] + prologue
                          + statements[first:]
                          + (_statements(_STEP) if looped else [])
                          + (_statements(_EPILOGUE) if looped or enter else
                             [] if inline else _statements(_PLAIN_EPILOGUE)))

    # Only this entry: the others would be compiled for nothing (their functions stay).
    externs = _module_items(_EXTERNS)
    items = _only_entry(module, fn)
    at = next((k for k, i in enumerate(items) if not isinstance(i, Directive)
               or i.name not in (".version", ".target", ".address_size")), len(items))
    module.items = items[:at] + externs + items[at:]
    return Spliced(str(module), fn.name, looped,
                   verdict.reason if looped else
                   ("a 1:1 remap was asked for" if verdict.ok else verdict.reason),
                   len(fn.params) - 1)


def single_entry(ptx, kernel):
    """The module with entry `kernel` and no other entry, unchanged otherwise: what the
    original kernel compiles to on its own (for its register count)."""
    module = parse(ptx_text(ptx))
    fn = module.entries.get(kernel)
    if fn is None:
        raise Unwrappable(f"no .entry {kernel} in this PTX")
    module.items = _only_entry(module, fn)
    return str(module)


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


def _kept_special(fn, special):
    """A 32-bit register that holds `special` (%tid.x) wherever the kernel may exit: set by a
    `mov` in the entry's straight-line start and written nowhere else; else None."""
    for s in fn.body.statements:
        if isinstance(s, (Label, Block)):
            break
        if not isinstance(s, Instruction):
            continue
        if s.base in ("bra", "brx", "ret", "exit", "call"):
            break
        if (s.base == "mov" and not s.guard and s.parts[1:] in (["u32"], ["b32"], ["s32"])
                and len(s.operands) == 2 and str(s.operands[1]) == special):
            reg = str(s.operands[0])
            if reg.startswith("%") and not any(
                    ins is not s and ins.operands and not ins.operands[0].is_memory
                    and reg in ins.operands[0].registers() for ins in fn.instructions()):
                return reg
    return None


def _falls_through(statement):
    return not (isinstance(statement, Instruction) and not statement.guard
                and statement.base in ("bra", "ret", "exit", "brx", "trap"))


def _inline_exits(fn):
    """Give each exit of a 1:1 kernel with no runtime call its own copy of _COUNT_TAIL: an
    unguarded exit is replaced by one (and, when labels put it where a fall-through and
    branches meet, a second copy ends the fall-through path before them), a guarded one
    branches to a copy at the end. False, the kernel unchanged, when that would take more
    than _MAX_TAILS copies."""
    tx, cx = _kept_special(fn, "%tid.x"), _kept_special(fn, "%ctaid.x")
    text = _COUNT_TAIL.format(tx=tx or "%__clc_t2", cx=cx or "%__clc_v0")
    head = ("" if tx else "mov.u32 %__clc_t2, %tid.x;\n") + \
           ("" if cx else "mov.u32 %__clc_v0, %ctaid.x;\n")
    tails = []
    appended = []

    def tail():
        tails.append(1)
        return _statements(head + text)

    def rewrite(block):
        out = []
        for s in block.statements:
            if isinstance(s, Block):
                rewrite(s)
            if not (isinstance(s, Instruction) and s.base in ("ret", "exit")):
                out.append(s)
                continue
            if s.guard:
                label = f"__clc_x{len(tails)}"
                out.append(Instruction("bra", [_operand(label, s)], s.guard, s.negated, s.line,
                                       s.column))
                appended.append(Label(label, s.line, s.column))
                appended.extend(tail())
                continue
            j = len(out)
            while j > 0 and isinstance(out[j - 1], (Label, Directive)):
                j -= 1
            joined = any(isinstance(x, Label) for x in out[j:])
            if joined and (j == 0 or _falls_through(out[j - 1])):
                out[j:j] = tail()
            out.extend(tail())
        block.statements = out

    original = copy.deepcopy(fn.body)
    rewrite(fn.body)
    statements = fn.body.statements
    if not statements or _falls_through(statements[-1]):
        statements.extend(tail())   # the end of the body is an exit too
    statements.extend(appended)
    if len(tails) > _MAX_TAILS:
        fn.body = original
        return False
    return True


def _operand(name, at):
    return Operand([Token("ident", name, at.line, at.column)])


# Labels are names the splice adds; a kernel that already has them would be ambiguous.
def _check_names(fn):
    for s in fn.body.walk():
        if isinstance(s, Label) and s.name.startswith(_PREFIX):
            raise Unwrappable(f"the kernel has a label {s.name}, a name the splice uses")

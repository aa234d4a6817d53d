# SPDX-License-Identifier: Apache-2.0
"""Whether a kernel's body may run in a persistent loop, from its PTX (clc.wrapping.ptx_reader).

Wrapping rewrites a kernel in place: its reads of %ctaid/%nctaid take virtual block
indices, and a persistent loop may run the body once per claimed virtual block, its ret/exit
turned into branches to the loop's next step. The queries below find what that rewrite touches
(`ctaid_reads`, `nctaid_reads`, `exits`, `barriers`, `calls`, ...) and `loop_verdict` decides
whether the loop is safe, with the reason:
- cluster kernels (cluster directives, %cluster_* registers, cluster barriers, mapa) are
  refused: their blocks are co-scheduled in hardware clusters that virtual indices would not
  match. `remap_ok` refuses only these: a 1:1 remap keeps every other kernel's semantics.
- cooperative kernels (%envreg reads: nvcc 13 inlines grid.sync(), which reads the grid
  workspace from %envreg1/%envreg2; or a call to the older cudaCG* runtime functions) are
  refused: grid sync needs all of the grid's blocks resident at once.
- a call into a function that may execute `exit` is refused: only the body's own ret/exit
  can become branches.
- a block barrier that can run after a thread-divergent exit is refused: looped, the threads
  that left would reach the next iteration's barriers while the others wait at this one.
  Block-uniform exits (conditions computed from %ctaid, %nctaid, %ntid, constants, kernel
  parameters and .const memory at block-uniform addresses only) are fine.
A launch attribute (cooperative launch, runtime cluster dimensions) is not in the PTX: the
caller must check the launch too.
"""

import re
from dataclasses import dataclass

from clc.wrapping.ptx_reader import Directive, Function, Instruction, Label, Variable, int_token

__all__ = ["SpecialRead", "Call", "Verdict", "special_reads", "ctaid_reads", "nctaid_reads",
           "envreg_reads", "cluster_uses", "cluster_directives", "exits", "barriers", "calls",
           "callees", "is_block_barrier", "loop_verdict", "remap_ok", "remap_verdict", "INDIRECT"]


# -- queries ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecialRead:
    """An instruction reading a special register: `mov.u32 %r1, %ctaid.x` -> %ctaid.x, [%r1]."""

    instruction: Instruction
    register: str                # "%ctaid.x"
    dests: tuple                 # the registers it writes


@dataclass(frozen=True)
class Call:
    instruction: Instruction
    callee: str | None           # None: an indirect call through a register


_CLUSTER_SREGS = ("%clusterid", "%nclusterid", "%cluster_ctaid", "%cluster_nctaid",
                  "%cluster_ctarank", "%cluster_nctarank", "%is_explicit_cluster")
_CLUSTER_DIRECTIVES = (".reqnctapercluster", ".explicitcluster", ".maxclusterrank")
# Opcodes that exist only for clusters: cluster barriers, distributed shared memory mapping.
_CLUSTER_OPCODES = ("barrier.cluster", "mapa", "getctarank")


def _sreg_base(name):
    """%ctaid.x -> %ctaid, %envreg3 -> %envreg."""
    base = name.split(".")[0]
    return "%envreg" if re.fullmatch(r"%envreg\d+", base) else base


def special_reads(fn, names):
    """The instructions of `fn` reading a special register whose base is in `names`
    (`%ctaid` matches %ctaid.x and %ctaid; `%envreg` matches %envreg0..31)."""
    return [SpecialRead(ins, reg, tuple(_defs(ins))) for ins in fn.instructions()
            for op in ins.operands for reg in op.registers() if _sreg_base(reg) in names]


def ctaid_reads(fn):
    return special_reads(fn, ("%ctaid",))


def nctaid_reads(fn):
    return special_reads(fn, ("%nctaid",))


def envreg_reads(fn):
    return special_reads(fn, ("%envreg",))


def cluster_uses(fn):
    """Reads of cluster special registers, and cluster-only instructions (as SpecialRead with
    the opcode as `register`)."""
    out = special_reads(fn, _CLUSTER_SREGS)
    out += [SpecialRead(i, i.opcode, tuple(_defs(i))) for i in fn.instructions()
            if i.opcode.startswith(_CLUSTER_OPCODES)]
    return sorted(out, key=lambda r: (r.instruction.line, r.instruction.column))


def cluster_directives(fn):
    return [d for d in fn.directives if d.name in _CLUSTER_DIRECTIVES]


def exits(fn):
    """Every ret and exit, guarded or not."""
    return [i for i in fn.instructions() if i.base in ("ret", "exit")]


def is_block_barrier(ins):
    """bar / bar.sync / bar.arrive / bar.red / barrier.* / barrier.cta.*; not bar.warp.sync
    (a warp's own sync) nor barrier.cluster.* (a cluster's, see cluster_uses)."""
    parts = ins.parts
    return parts[0] in ("bar", "barrier") and (len(parts) == 1
                                               or parts[1] not in ("warp", "cluster"))


def barriers(fn):
    return [i for i in fn.instructions() if is_block_barrier(i)]


def _call_target(ins):
    """The index of a call's target operand: the first one not in parentheses."""
    return next((i for i, op in enumerate(ins.operands) if op.tokens[0].text != "("), None)


def calls(fn):
    out = []
    for ins in fn.instructions():
        if ins.base == "call":
            i = _call_target(ins)
            name = ins.operands[i].tokens[0].text if i is not None else "%"
            out.append(Call(ins, None if name.startswith("%") else name))
    return out


INDIRECT = "(a function pointer)"


def _address_taken(module):
    """The functions whose address the module takes: named anywhere but as a call's target
    (`mov.u64 %rd1, f;`, a vtable's initializer)."""
    funcs = module.functions
    named = set()
    for item in module.items:
        if isinstance(item, Variable):
            named.update(t.text for t in item.tokens if t.text in funcs)
        elif isinstance(item, Function) and item.body is not None:
            for ins in item.instructions():
                ops = list(ins.operands)
                if ins.base == "call" and _call_target(ins) is not None:
                    del ops[_call_target(ins)]
                named.update(s for op in ops for s in op.symbols() if s in funcs)
    return sorted(named)


def callees(fn):
    """(the functions `fn` may call, directly or not, as Function objects or, for externs
    without a body, names; whether any of those calls is indirect). An indirect call may reach
    any function whose address the module takes, or, when it takes none, code elsewhere:
    then INDIRECT is among the names."""
    module = fn.module
    funcs = module.functions if module else {}
    seen, order, indirect = set(), [], False
    todo = [fn]
    while todo:
        for call in calls(todo.pop()):
            if call.callee is None:
                indirect = True
                names = (_address_taken(module) if module else []) or [INDIRECT]
            else:
                names = [call.callee]
            for name in names:
                if name not in seen:
                    seen.add(name)
                    f = funcs.get(name)
                    order.append(f if f is not None and f.body is not None else name)
                    if f is not None and f.body is not None:
                        todo.append(f)
    return order, indirect


# -- dataflow facts ---------------------------------------------------------------------------

# Instructions whose first operand is read, not written (or that write nothing).
_NO_DEST = {"st", "red", "bar", "barrier", "bra", "brx", "ret", "exit", "trap", "brkpt",
            "membar", "fence", "prefetch", "prefetchu", "call", "nanosleep", "pmevent", "cp",
            "stmatrix", "griddepcontrol", "setmaxnreg", "applypriority", "discard", "sust",
            "sured", "multimem", "wgmma", "tensormap", "mbarrier"}
# Arithmetic and moves: the result is block-uniform when every input is.
_UNIFORM_OPS = {"mov", "add", "sub", "mul", "mad", "mul24", "mad24", "sad", "div", "rem", "abs",
                "neg", "min", "max", "and", "or", "xor", "not", "cnot", "shl", "shr", "shf",
                "lop3", "bfe", "bfi", "brev", "clz", "popc", "bfind", "fns", "prmt", "setp",
                "set", "selp", "slct", "cvt", "cvta", "fma", "rcp", "sqrt", "rsqrt", "sin",
                "cos", "lg2", "ex2", "tanh", "copysign", "testp", "addc", "subc", "madc",
                "dp4a", "dp2a", "isspacep", "ld"}    # ld: of a kernel parameter or .const only
# Special registers with one value for the whole block.
_UNIFORM_SREGS = {"%ctaid", "%nctaid", "%ntid", "%gridid", "%nsmid", "%nwarpid",
                  "%total_smem_size", "%aggr_smem_size", "%dynamic_smem_size",
                  "%current_graph_exec", "%envreg", *_CLUSTER_SREGS}
# Special registers that differ between threads or over time (others are unknown: divergent).
_DIVERGENT_SREGS = {"%tid", "%laneid", "%warpid", "%smid", "%clock", "%clock_hi", "%clock64",
                    "%globaltimer", "%globaltimer_lo", "%globaltimer_hi", "%lanemask_eq",
                    "%lanemask_le", "%lanemask_lt", "%lanemask_ge", "%lanemask_gt"}
_EXTERN_SAFE = {"vprintf", "malloc", "free", "__assertfail"}


def _defs(ins):
    """The registers an instruction writes: those of its first operand, for most opcodes."""
    if ins.base in _NO_DEST or not ins.operands or ins.operands[0].tokens[0].text in "[(":
        return []
    return ins.operands[0].registers()


def _extern_kind(name):
    if name.startswith("cudaCG"):
        return "cooperative"        # the grid/multi-grid sync of older CUDA toolkits
    if name in _EXTERN_SAFE or name.startswith(("cuda", "__cuda")):
        return "safe"               # device runtime: printf, malloc, device-side launches
    return "unknown"


class _Registers:
    """The names a function declares with `.reg`, so that `%x` is told from a special one."""

    def __init__(self, fn):
        self.exact, self.ranges = set(), {}
        for s in fn.body.walk():
            if isinstance(s, Directive) and s.name == ".reg":
                toks = [t for t in s.tokens if not t.text.startswith(".")]
                for i, t in enumerate(toks):
                    if t.text.startswith("%"):
                        if i + 2 < len(toks) and toks[i + 1].text == "<":
                            self.ranges[t.text] = int_token(toks[i + 2])
                        else:
                            self.exact.add(t.text)
        for p in fn.params + (fn.returns or []):
            if p.space == ".reg":
                self.exact.add(p.name)

    def __contains__(self, name):
        if name in self.exact:
            return True
        m = re.fullmatch(r"(.*?)(\d+)", name)
        return bool(m) and m.group(1) in self.ranges and int(m.group(2)) < self.ranges[m.group(1)]


class _Cfg:
    """Basic blocks of a body (nested `{}` flattened; labels are function-wide in nvcc's PTX),
    each block starting at a label, after a branch/ret/exit/trap, or at a barrier, so that a
    barrier is always a block's first instruction."""

    EXIT = -1

    def __init__(self, fn, is_barrier):
        self.ins, labels, pending = [], {}, []
        for s in fn.body.walk():
            if isinstance(s, Label):
                pending.append(s.name)
            elif isinstance(s, Instruction):
                for name in pending:
                    labels[name] = len(self.ins)
                pending = []
                self.ins.append(s)
        for name in pending:
            labels[name] = len(self.ins)
        n = len(self.ins)
        leaders = {0} | set(labels.values())
        for i, ins in enumerate(self.ins):
            if ins.base in ("bra", "brx", "ret", "exit", "trap"):
                leaders.add(i + 1)
            if is_barrier(ins):
                leaders.add(i)
        starts = sorted(x for x in leaders if x < n)
        self.blocks = [range(a, b) for a, b in zip(starts, starts[1:] + [n])]
        at = {start: b for b, start in enumerate(starts)}
        self.barrier = [is_barrier(self.ins[r[0]]) for r in self.blocks]
        self.unclear = []            # instructions whose successors are not known
        self.succ = []
        for b, r in enumerate(self.blocks):
            last = self.ins[r[-1]]
            fall = at.get(r[-1] + 1, self.EXIT)
            succ = [fall]
            if last.base == "bra":
                label = next(iter(last.operands[-1].symbols()), None) if last.operands else None
                if label in labels:
                    target = at.get(labels[label], self.EXIT)
                else:
                    self.unclear.append((last, f"a branch to an unknown label {label}"))
                    target = self.EXIT
                succ = [target, fall] if last.guard else [target]
            elif last.base in ("ret", "exit"):
                succ = [self.EXIT, fall] if last.guard else [self.EXIT]
            elif last.base == "trap":
                # The launch fails: nothing after it runs, no loop step included.
                succ = [fall] if last.guard else []
            elif last.base == "brx":
                self.unclear.append((last, "an indirect branch (brx.idx)"))
                succ = sorted(set(at.get(i, self.EXIT) for i in labels.values()) | {fall})
            self.succ.append(list(dict.fromkeys(succ)))
        self.ipdom = self._post_dominators()

    def _post_dominators(self):
        """Immediate post-dominators (Cooper, Harvey, Kennedy), EXIT as the root; blocks that
        never reach EXIT (a trap) have none and do not constrain their predecessors."""
        n = len(self.blocks)
        preds = [[] for _ in range(n)]
        exit_preds = []
        for b, succ in enumerate(self.succ):
            for s in succ:
                (exit_preds if s == self.EXIT else preds[s]).append(b)
        order, seen = [], set()
        for root in exit_preds:     # postorder of the reverse graph from EXIT
            if root in seen:
                continue
            seen.add(root)
            stack = [(root, iter(preds[root]))]
            while stack:
                node, it = stack[-1]
                nxt = next((p for p in it if p not in seen), None)
                if nxt is None:
                    order.append(node)
                    stack.pop()
                else:
                    seen.add(nxt)
                    stack.append((nxt, iter(preds[nxt])))
        rank = {b: i for i, b in enumerate(order)}
        rank[self.EXIT] = len(order)
        ipdom = {self.EXIT: self.EXIT}

        def meet(a, b):
            while a != b:
                while rank[a] < rank[b]:
                    a = ipdom[a]
                while rank[b] < rank[a]:
                    b = ipdom[b]
            return a

        changed = True
        while changed:
            changed = False
            for b in reversed(order):
                new = None
                for s in self.succ[b]:
                    if s in ipdom:
                        new = s if new is None else meet(s, new)
                if new is not None and ipdom.get(b) != new:
                    ipdom[b] = new
                    changed = True
        return ipdom

    def reach(self, starts, stop=None):
        """Blocks reachable from `starts` (included), not going through `stop`."""
        seen, todo = set(), [s for s in starts if s not in (self.EXIT, stop)]
        while todo:
            b = todo.pop()
            if b not in seen:
                seen.add(b)
                todo += [s for s in self.succ[b] if s not in (self.EXIT, stop)]
        return seen


def _why(ins, div, regs, params):
    """Why the registers `ins` writes may differ between the threads of a block; None if not."""
    if ins.base == "ld":
        # Kernel parameters and constant memory cannot change during a launch: one address
        # gives every thread one value. Any other memory may differ or be written meanwhile.
        space = ins.parts[1] if len(ins.parts) > 1 else ""
        if not (space == "const" or space == "param" and len(ins.operands) > 1
                and set(ins.operands[1].symbols()) & params):
            return f"a load from memory ({ins.opcode}, line {ins.line})"
    elif ins.base not in _UNIFORM_OPS:
        return f"the result of {ins.opcode} (line {ins.line})"
    names = [r for op in ins.operands[1:] for r in op.registers()]
    for name in names + ([ins.guard] if ins.guard else []):
        if name in div:
            return div[name]
        if name in regs or _sreg_base(name) in regs or _sreg_base(name) in _UNIFORM_SREGS:
            continue
        return name if _sreg_base(name) in _DIVERGENT_SREGS else f"{name} (unknown)"
    return None


def _condition(ins):
    """What decides where a branch, ret, exit or trap goes: its guard, or brx's index."""
    if ins.base in ("bra", "ret", "exit", "trap") and ins.guard:
        return ins.guard
    if ins.base == "brx" and ins.operands and ins.operands[0].registers():
        return ins.operands[0].registers()[0]
    return None


def _divergence(fn, cfg):
    """{register: why it may differ between a block's threads}: data from %tid, loads and
    unknown values, and control: whatever is written under a divergent branch, before the
    threads that took either side meet again (its immediate post-dominator)."""
    regs = _Registers(fn)
    params = {p.name for p in fn.params}
    div, under, regions = {}, {}, {}
    changed = True
    while changed:
        changed = False
        for b, r in enumerate(cfg.blocks):
            for i in r:
                ins = cfg.ins[i]
                defs = _defs(ins)
                if not defs:
                    continue
                why = under.get(b) or _why(ins, div, regs, params)
                for d in defs:
                    if why and d not in div:
                        div[d] = why
                        changed = True
        for b, r in enumerate(cfg.blocks):
            last = cfg.ins[r[-1]]
            cond = _condition(last)
            if b in regions or cond not in div:
                continue
            regions[b] = cfg.reach(cfg.succ[b], cfg.ipdom.get(b, cfg.EXIT))
            for x in regions[b]:
                if x not in under:
                    under[x] = f"{div[cond]} (through the branch at line {last.line})"
                    changed = True
    return div, regions


# -- verdicts --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """A yes or no with its reason; true when yes. `loopable` is `ok` under the name the loop
    verdict's callers read."""

    ok: bool
    reason: str

    @property
    def loopable(self):
        return self.ok

    def __bool__(self):
        return self.ok


def _where(ins):
    return f"{ins.opcode} at line {ins.line}"


def _cluster_reason(fn, funcs):
    directives = cluster_directives(fn)
    if directives:
        return f"cluster kernel: {', '.join(map(str, directives))} (line {directives[0].line})"
    for f in [fn] + funcs:
        for use in cluster_uses(f):
            inside = "" if f is fn else f" in {f.name}"
            return (f"cluster kernel: {use.register} ({_where(use.instruction)}{inside})")
    return None


def remap_verdict(fn):
    """Whether a 1:1 remap of %ctaid/%nctaid (no loop) is safe: always, but for clusters."""
    funcs = [f for f in callees(fn)[0] if isinstance(f, Function)]
    why = _cluster_reason(fn, funcs)
    if why:
        return Verdict(False, why + "; the hardware places a cluster's blocks together by "
                       "their real indices, which virtual ones would not match")
    inside = sorted({f.name for f in funcs if ctaid_reads(f) or nctaid_reads(f)})
    note = f"; {', '.join(inside)} (called) also read %ctaid/%nctaid" if inside else ""
    return Verdict(True, "a 1:1 remap keeps each block's work" + note)


def remap_ok(fn):
    return remap_verdict(fn).ok


def loop_verdict(fn):
    """Whether `fn`'s body may run in a persistent loop, its ret/exit made branches to the
    loop's next step; the reason says why (not), naming the lines concerned."""
    if not fn.is_entry or fn.body is None:
        return Verdict(False, f"{fn.name} is not a kernel definition")
    reached, _ = callees(fn)
    funcs = [f for f in reached if isinstance(f, Function)]
    externs = [f for f in reached if isinstance(f, str)]
    why = _cluster_reason(fn, funcs)
    if why:
        return Verdict(False, why + "; its blocks must run as hardware clusters")
    for f in [fn] + funcs:
        for read in envreg_reads(f):
            inside = "" if f is fn else f" in {f.name}"
            return Verdict(False, f"cooperative kernel: reads {read.register} (line "
                           f"{read.instruction.line}{inside}), the grid-sync workspace of a "
                           "cooperative launch; grid sync needs every block resident at once")
    for name in externs:
        if _extern_kind(name) == "cooperative":
            return Verdict(False, f"cooperative kernel: calls {name}, a grid-sync function; "
                           "grid sync needs every block resident at once")
    for f in funcs:
        for e in exits(f):
            if e.base == "exit":
                return Verdict(False, f"calls {f.name}, which executes exit (line {e.line}): "
                               "a looped body cannot resume a thread that exits in a function")
    unknown = [n for n in externs if _extern_kind(n) == "unknown"]
    if unknown:
        what = ("through a function pointer whose targets are not in this PTX"
                if unknown[0] == INDIRECT else f"{unknown[0]}, whose code is not in this PTX")
        return Verdict(False, f"exit position unclear: calls {what}; it could exit the thread "
                       "or wait at a barrier")
    # A call into a function with a barrier is a barrier where it stands in the body.
    barrier_funcs = {f.name for f in funcs if barriers(f)}
    targets = {id(c.instruction): c.callee for c in calls(fn)}

    def is_barrier(ins):
        if ins.base == "call":
            target = targets[id(ins)]
            return target in barrier_funcs if target else bool(barrier_funcs)
        return is_block_barrier(ins)

    return _barrier_exit_verdict(fn, _Cfg(fn, is_barrier))


def _barrier_exit_verdict(fn, cfg):
    bars = [cfg.blocks[b][0] for b in range(len(cfg.blocks)) if cfg.barrier[b]]
    if not bars:
        return Verdict(True, "no block barrier: its exits can become branches to the next step")
    first_bar = cfg.ins[bars[0]]
    if cfg.unclear:
        ins, what = cfg.unclear[0]
        return Verdict(False, f"exit position unclear: {what} at line {ins.line}, and a block "
                       f"barrier ({_where(first_bar)}); refused to be safe")
    div, regions = _divergence(fn, cfg)
    # Blocks from which some thread can reach ret/exit without passing a barrier.
    free_exit = [False] * len(cfg.blocks)
    changed = True
    while changed:
        changed = False
        for b in range(len(cfg.blocks)):
            if not free_exit[b] and not cfg.barrier[b] and any(
                    s == cfg.EXIT or free_exit[s] for s in cfg.succ[b]):
                free_exit[b] = changed = True
    for b in sorted(regions):
        branch = cfg.ins[cfg.blocks[b][-1]]
        join = cfg.ipdom.get(b, cfg.EXIT)
        if join == cfg.EXIT:
            # The two sides never meet again: each leaves on its own.
            hit = [x for x in cfg.reach(cfg.succ[b]) if cfg.barrier[x]]
        elif free_exit[join]:
            # They meet where exiting needs no barrier: a barrier before that point is one
            # that only some threads pass before leaving.
            hit = [x for x in regions[b] if cfg.barrier[x]]
        else:
            hit = []
        if hit:
            bar = cfg.ins[cfg.blocks[min(hit)][0]]
            return Verdict(False, "a block barrier can run after a thread-divergent exit: "
                           f"`{str(branch)[:-1]}` (line {branch.line}) depends on "
                           f"{div[_condition(branch)]}, so some threads may leave while "
                           f"others reach {_where(bar)}; looped, they would wait at different "
                           "barrier generations")
    return Verdict(True, f"{len(bars)} block barrier{'s' if len(bars) > 1 else ''}, and no "
                   "thread-divergent exit before one")

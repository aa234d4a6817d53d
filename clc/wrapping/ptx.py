# SPDX-License-Identifier: Apache-2.0
"""A small structural PTX reader, and whether a kernel's body may run in a persistent loop.

`parse(text)` tokenizes PTX (comments, strings, identifiers with `%`/`$`/`.`, numbers with
PTX's `0f`/`0d` float forms, punctuation; each token keeps its line and column) and builds a
`Module`: its `.version`/`.target`/`.address_size`, module variables, and each `.entry` and
`.func` with its parameters, performance directives and body, a tree of `{}` blocks holding
labels, instructions and declarations. `str(module)` prints it back as PTX: the formatting is
not preserved, the program is (comments are dropped; `.section` debug data is kept verbatim).

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
from dataclasses import dataclass, field

__all__ = ["PtxError", "Token", "tokenize", "parse", "Module", "Function", "Param", "Block",
           "Label", "Instruction", "Operand", "Directive", "Variable", "SpecialRead", "Call",
           "Verdict", "special_reads", "ctaid_reads", "nctaid_reads", "envreg_reads",
           "cluster_uses", "cluster_directives", "exits", "barriers", "calls", "callees",
           "is_block_barrier", "loop_verdict", "remap_ok", "remap_verdict", "INDIRECT"]


class PtxError(ValueError):
    """What is wrong with a PTX text, and where (1-based line and column)."""

    def __init__(self, message, line=None, column=None):
        self.message, self.line, self.column = message, line, column
        super().__init__(message if line is None else f"{line}:{column}: {message}")


# -- tokens ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Token:
    kind: str           # "ident" | "number" | "string" | "punct"
    text: str
    line: int
    column: int


_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>0[fF][0-9A-Fa-f]{8}|0[dD][0-9A-Fa-f]{16}|0[xX][0-9A-Fa-f]+U?|0[bB][01]+U?
              |\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?)(?![\w$])
    # `::` joins state-space qualifiers (`.shared::cluster`); a single `:` ends a label.
  | (?P<ident>[A-Za-z_$%.][\w$.]*(?:::[\w$.]+)*)
  | (?P<punct>[{}()\[\]<>,;:+\-*/=!@|&~^?])
""", re.X | re.S)


def tokenize(text):
    """The tokens of a PTX text, comments and blanks dropped; PtxError on a stray character."""
    tokens = []
    pos, line, line_start = 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            what = ("unterminated string" if text[pos] == '"' else
                    f"unexpected character {text[pos]!r}")
            raise PtxError(what, line, pos - line_start + 1)
        kind = m.lastgroup
        if kind == "punct" and text.startswith("/*", pos):
            raise PtxError("unterminated /* comment", line, pos - line_start + 1)
        if kind not in ("space", "comment"):
            tokens.append(Token(kind, m.group(), line, pos - line_start + 1))
        newlines = text.count("\n", pos, m.end())
        if newlines:
            line += newlines
            line_start = text.rindex("\n", pos, m.end()) + 1
        pos = m.end()
    return tokens


def _join(tokens):
    """Tokens as PTX text: a blank only where two words meet, after a comma, around `=`."""
    out = []
    prev = None
    for t in tokens:
        if prev is not None and (prev.kind != "punct" and t.kind != "punct"
                                 or prev.text == "," or "=" in (prev.text, t.text)):
            out.append(" ")
        out.append(t.text)
        prev = t
    return "".join(out)


# -- the tree --------------------------------------------------------------------------------

@dataclass(eq=False)
class Operand:
    """One comma-separated operand, as tokens: `%r1`, `[%rd1+8]`, `{%f1, %f2}`, `%p1|%p2`."""

    tokens: list

    def __str__(self):
        return _join(self.tokens)

    @property
    def is_memory(self):
        return self.tokens[0].text == "["

    def registers(self):
        """The `%` names in it: registers and special registers (`%ctaid.x`)."""
        return [t.text for t in self.tokens if t.kind == "ident" and t.text.startswith("%")]

    def symbols(self):
        """The other names in it: labels, variables, parameters, functions."""
        return [t.text for t in self.tokens if t.kind == "ident" and t.text[0] not in "%."]


@dataclass(eq=False)
class Instruction:
    opcode: str                  # "ld.param.u64": the base and its dot-suffixes
    operands: list               # of Operand
    guard: str | None = None     # the predicate of `@%p` / `@!%p`
    negated: bool = False        # `@!%p`
    line: int = 0
    column: int = 0

    @property
    def parts(self):
        return self.opcode.split(".")

    @property
    def base(self):
        return self.parts[0]

    def __str__(self):
        guard = f"@{'!' if self.negated else ''}{self.guard} " if self.guard else ""
        ops = ", ".join(map(str, self.operands))
        return f"{guard}{self.opcode}{' ' + ops if ops else ''};"


@dataclass(eq=False)
class Label:
    name: str
    line: int = 0
    column: int = 0

    def __str__(self):
        return f"{self.name}:"


@dataclass(eq=False)
class Directive:
    """A directive kept as its tokens: `.reg .b32 %r<5>;`, `.maxntid 128, 1, 1`, `.loc 1 2 3`.

    `raw` holds the source text of a `.section` (DWARF data is line-oriented: kept verbatim).
    """

    name: str                    # ".reg"
    tokens: list                 # after the name, without the `;`
    terminated: bool = True      # printed with a `;`
    line: int = 0
    column: int = 0
    raw: str | None = None

    @property
    def args(self):
        return _join(self.tokens)

    def __str__(self):
        if self.raw is not None:
            return self.raw
        args = self.args
        return f"{self.name}{' ' + args if args else ''}{';' if self.terminated else ''}"


@dataclass(eq=False)
class Variable:
    """A module-scope declaration: `.global .align 4 .b8 x[16] = {...};`, `.extern .shared ...`."""

    tokens: list                 # all of it, linkage included, without the `;`
    name: str
    line: int = 0
    column: int = 0

    @property
    def space(self):
        return next((t.text for t in self.tokens if t.text in _SPACES), None)

    def __str__(self):
        return _join(self.tokens) + ";"


@dataclass(eq=False)
class Block:
    statements: list             # Label | Instruction | Directive | Block
    line: int = 0
    column: int = 0

    def walk(self):
        """Every statement, nested blocks' statements in place (the blocks themselves too)."""
        for s in self.statements:
            yield s
            if isinstance(s, Block):
                yield from s.walk()

    def lines(self, indent):
        pad = "\t" * indent
        out = [pad[:-1] + "{"]
        for s in self.statements:
            if isinstance(s, Block):
                out += s.lines(indent + 1)
            else:
                out.append(("" if isinstance(s, Label) else pad) + str(s))
        out.append(pad[:-1] + "}")
        return out


@dataclass(eq=False)
class Param:
    """`.param .align 8 .b8 name[40]`, `.param .u64 .ptr .global .align 16 name`, `.reg .b32 x`."""

    tokens: list
    name: str
    space: str                   # ".param" | ".reg"
    type: str | None             # ".u64", ".b8"
    align: int | None = None
    ptr: bool = False            # `.ptr`: a pointer attribute (entries only)
    ptr_space: str | None = None  # `.global` after `.ptr`
    ptr_align: int | None = None  # `.align N` after `.ptr`
    array: list = field(default_factory=list)   # dimensions; None for `[]`

    def __str__(self):
        return _join(self.tokens)


@dataclass(eq=False)
class Function:
    kind: str                    # "entry" | "func"
    name: str
    linkage: list                # ".visible", ".extern", ".weak", ".attribute(...)" tokens
    params: list                 # of Param
    returns: list | None = None  # a .func's return parameters
    directives: list = field(default_factory=list)   # performance directives, in order
    body: Block | None = None    # None: a declaration
    line: int = 0
    column: int = 0
    module: "Module | None" = field(default=None, repr=False)

    @property
    def is_entry(self):
        return self.kind == "entry"

    def directive(self, name):
        """The first performance directive called `name` (".maxntid"), or None."""
        return next((d for d in self.directives if d.name == name), None)

    def instructions(self):
        return [s for s in self.body.walk() if isinstance(s, Instruction)] if self.body else []

    def __str__(self):
        head = [_join(self.linkage)] if self.linkage else []
        head.append("." + self.kind)
        if self.returns is not None:
            head.append("(" + ", ".join(map(str, self.returns)) + ")")
        head.append(self.name)
        lines = [" ".join(head) + "("]
        lines += [f"\t{p}{',' if i < len(self.params) - 1 else ''}"
                  for i, p in enumerate(self.params)]
        lines.append(")")
        lines += [str(d) for d in self.directives]
        lines += self.body.lines(1) if self.body else [";"]
        return "\n".join(lines)


@dataclass(eq=False)
class Module:
    items: list                  # Directive | Variable | Function, in order

    def _directive(self, name):
        return next((i for i in self.items if isinstance(i, Directive) and i.name == name),
                    None)

    @property
    def version(self):
        d = self._directive(".version")
        return d.args if d else None

    @property
    def target(self):
        """The `.target` list: ["sm_90"], ["sm_90a", "debug"]."""
        d = self._directive(".target")
        return [t.text for t in d.tokens if t.text != ","] if d else []

    @property
    def address_size(self):
        d = self._directive(".address_size")
        return int(d.args) if d else None

    @property
    def entries(self):
        """Kernel definitions by name."""
        return {i.name: i for i in self.items
                if isinstance(i, Function) and i.is_entry and i.body is not None}

    @property
    def functions(self):
        """`.func`s by name: a definition wins over its declarations."""
        out = {}
        for i in self.items:
            if isinstance(i, Function) and not i.is_entry:
                if i.body is not None or i.name not in out:
                    out[i.name] = i
        return out

    def __str__(self):
        out = []
        for i, item in enumerate(self.items):
            # .version/.target/.address_size stay together; everything else is a paragraph.
            header = isinstance(item, Directive) and item.name in _LINE_DIRECTIVES
            if i and not (header and out[-1][1]):
                out.append(("", False))
            out.append((str(item), header))
        return "\n".join(text for text, _ in out) + "\n"


# -- the parser ------------------------------------------------------------------------------

_LINKAGE = {".visible", ".extern", ".weak", ".common"}
_SPACES = {".global", ".shared", ".const", ".local", ".param", ".reg", ".tex", ".texref",
           ".surfref", ".samplerref"}
# Directives without a `;`, whose arguments run to the end of their line.
_LINE_DIRECTIVES = {".version", ".target", ".address_size", ".file", ".loc"}


def parse(text):
    """The Module of a PTX text; PtxError with line:column when it is not PTX this reads."""
    module = _Parser(text).module()
    for item in module.items:
        if isinstance(item, Function):
            item.module = module
    return module


class _Parser:
    def __init__(self, text):
        self.text = text
        self.toks = tokenize(text)
        self.pos = 0

    # token helpers
    def peek(self, ahead=0):
        i = self.pos + ahead
        return self.toks[i] if i < len(self.toks) else None

    def at(self, text):
        t = self.peek()
        return t is not None and t.text == text

    def next(self, what="more PTX"):
        t = self.peek()
        if t is None:
            last = self.toks[-1] if self.toks else Token("punct", "", 1, 0)
            raise PtxError(f"unexpected end of text: expected {what}", last.line,
                           last.column + len(last.text))
        self.pos += 1
        return t

    def expect(self, text):
        t = self.next(repr(text))
        if t.text != text:
            raise PtxError(f"expected {text!r}, found {t.text!r}", t.line, t.column)
        return t

    def until(self, stop=";"):
        """Tokens up to `stop` at bracket depth 0 (consumed, not returned)."""
        out, depth = [], 0
        while True:
            t = self.next(repr(stop))
            if depth == 0 and t.text == stop:
                return out
            if t.text in "([{":
                depth += 1
            elif t.text in ")]}":
                depth -= 1
                if depth < 0:
                    raise PtxError(f"expected {stop!r}, found {t.text!r}", t.line, t.column)
            out.append(t)

    def line_args(self, start):
        """Tokens on `start`'s line (and the next line after a trailing comma)."""
        out, line = [], start.line
        while (t := self.peek()) is not None and (t.line == line or out and out[-1].text == ","):
            line = t.line
            out.append(self.next())
        return out

    # module level
    def module(self):
        items = []
        while (t := self.peek()) is not None:
            if t.text in _LINE_DIRECTIVES:
                self.next()
                items.append(Directive(t.text, self.line_args(t), False, t.line, t.column))
            elif t.text == ".section":
                items.append(self.section())
            else:
                items.append(self.declaration())
        return Module(items)

    def section(self):
        start = self.next()
        while not self.at("{"):
            self.next("'{' of the .section")
        depth = 0
        while True:
            t = self.next("'}' closing the .section")
            depth += {"{": 1, "}": -1}.get(t.text, 0)
            if depth == 0:
                break
        lines = self.text.split("\n")     # as tokenize counts lines
        raw = "\n".join(lines[start.line - 1:t.line])
        # Cut the first and last lines at the tokens' columns: nothing else shares them in
        # nvcc's output, but a hand-written file may put the .section after other code.
        raw = raw[start.column - 1:len(raw) - (len(lines[t.line - 1]) - t.column)]
        return Directive(".section", [], False, start.line, start.column, raw=raw)

    def declaration(self):
        first = self.peek()
        linkage = []
        while (t := self.peek()) is not None and (t.text in _LINKAGE or t.text == ".attribute"):
            linkage.append(self.next())
            if t.text == ".attribute":
                linkage += self.group()
        t = self.peek()
        if t is not None and t.text in (".entry", ".func"):
            return self.function(linkage, first)
        if t is not None and t.text in _SPACES:
            tokens = linkage + self.until(";")
            return Variable(tokens, _variable_name(tokens, first), first.line, first.column)
        t = self.next()
        if t.kind != "ident" or not t.text.startswith("."):
            raise PtxError(f"expected a directive at module scope, found {t.text!r}",
                           t.line, t.column)
        return Directive(t.text, linkage + self.until(";"), True, t.line, t.column)

    def group(self):
        """A parenthesized token group, parentheses included."""
        inner = [self.expect("(")] + self.until(")")
        return inner + [self.toks[self.pos - 1]]

    def function(self, linkage, first):
        kind = self.next().text[1:]
        while self.at(".attribute"):
            linkage.append(self.next())
            linkage += self.group()
        returns = None
        if kind == "func" and self.at("("):
            returns = self.params()
        name = self.next("a function name")
        if name.kind != "ident" or name.text.startswith("."):
            raise PtxError(f"expected the name of the .{kind}, found {name.text!r}",
                           name.line, name.column)
        params = self.params() if self.at("(") else []
        directives = []
        while (t := self.peek()) is not None and t.kind == "ident" and t.text.startswith("."):
            directives.append(self.performance_directive())
        fn = Function(kind, name.text, linkage, params, returns, directives, None,
                      first.line, first.column)
        if self.at(";"):
            self.next()
        else:
            fn.body = self.block()
        return fn

    def params(self):
        start = self.expect("(")
        return [_param(tokens, start) for tokens in _split(self.until(")"), start, "parameter")]

    def performance_directive(self):
        t = self.next()
        args = []
        while (a := self.peek()) is not None and (a.kind in ("number", "string")
                                                  or a.text == "," and args):
            args.append(self.next())
        terminated = self.at(";")
        if terminated:
            self.next()
        return Directive(t.text, args, terminated, t.line, t.column)

    # function bodies
    def block(self):
        start = self.expect("{")
        statements = []
        while True:
            t = self.peek()
            if t is None:
                raise PtxError("'{' is never closed", start.line, start.column)
            if t.text == "}":
                self.next()
                return Block(statements, start.line, start.column)
            statements.append(self.statement())

    def statement(self):
        t = self.peek()
        if t.text == "{":
            return self.block()
        nxt = self.peek(1)
        if t.kind == "ident" and not t.text.startswith(".") and nxt is not None \
                and nxt.text == ":":
            self.pos += 2
            return Label(t.text, t.line, t.column)
        if t.kind == "ident" and t.text.startswith("."):
            self.next()
            if t.text in _LINE_DIRECTIVES:
                return Directive(t.text, self.line_args(t), False, t.line, t.column)
            return Directive(t.text, self.until(";"), True, t.line, t.column)
        return self.instruction()

    def instruction(self):
        first = self.next()
        guard, negated = None, False
        t = first
        if t.text == "@":
            if self.at("!"):
                self.next()
                negated = True
            g = self.next("a guard predicate")
            if g.kind != "ident":
                raise PtxError(f"expected a predicate after '@', found {g.text!r}",
                               g.line, g.column)
            guard = g.text
            t = self.next("an opcode")
            if t.kind != "ident":
                raise PtxError(f"expected an opcode, found {t.text!r}", t.line, t.column)
        if t.kind != "ident" or t.text.startswith((".", "%")):
            raise PtxError(f"expected an instruction, found {t.text!r}", t.line, t.column)
        operands = [Operand(o) for o in _split(self.until(";"), t, f"operand in {t.text}")]
        return Instruction(t.text, operands, guard, negated, first.line, first.column)


def _int(token):
    """A PTX integer literal: decimal, 0x hex, 0b binary, 0 octal, with an optional U."""
    text = token.text.rstrip("U")
    try:
        if len(text) > 1 and text[0] == "0" and text[1] in "0123456789":
            return int(text, 8)
        return int(text, 0)
    except ValueError:
        raise PtxError(f"expected an integer, found {token.text!r}", token.line,
                       token.column) from None


def _split(tokens, where, what):
    """`tokens` cut at the commas outside brackets; [] for none; PtxError on an empty piece."""
    out, current, depth = [], [], 0
    for t in tokens + [None]:
        if t is None or t.text == "," and depth == 0:
            if not current and (t is not None or out):
                raise PtxError(f"empty {what}", where.line, where.column)
            out += [current] if current else []
            current = []
            continue
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(t.text, 0)
        current.append(t)
    return out


def _variable_name(tokens, first):
    """The declared name: the last identifier before `[`, `<`, `=` or the end."""
    name = None
    for t in tokens:
        if t.text in ("[", "=", "<"):
            break
        if t.kind == "ident" and not t.text.startswith("."):
            name = t.text
    if name is None:
        raise PtxError("declaration without a name", first.line, first.column)
    return name


def _param(tokens, start):
    p = Param(tokens, "", tokens[0].text, None)
    if p.space not in (".param", ".reg"):
        raise PtxError(f"a parameter starts with .param or .reg, not {p.space!r}",
                       tokens[0].line, tokens[0].column)
    it = iter(range(1, len(tokens)))
    for i in it:
        t = tokens[i]
        if t.text == ".align":
            n = _int(tokens[i + 1]) if i + 1 < len(tokens) else None
            next(it, None)
            if p.ptr:
                p.ptr_align = n
            else:
                p.align = n
        elif t.text == ".ptr":
            p.ptr = True
        elif p.ptr and t.text in _SPACES:
            p.ptr_space = t.text
        elif t.text.startswith("."):
            p.type = t.text
        elif t.text == "[":
            dim = tokens[i + 1].text if i + 1 < len(tokens) else "]"
            p.array.append(None if dim == "]" else _int(tokens[i + 1]))
        elif t.kind == "ident" and not p.name:
            p.name = t.text
    if not p.name:
        raise PtxError("parameter without a name", tokens[0].line, tokens[0].column)
    return p


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
                            self.ranges[t.text] = _int(toks[i + 2])
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

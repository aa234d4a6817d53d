# SPDX-License-Identifier: Apache-2.0
"""A small structural PTX reader.

`parse(text)` tokenizes PTX (comments, strings, identifiers with `%`/`$`/`.`, numbers with
PTX's `0f`/`0d` float forms, punctuation; each token keeps its line and column) and builds a
`Module`: its `.version`/`.target`/`.address_size`, module variables, and each `.entry` and
`.func` with its parameters, performance directives and body, a tree of `{}` blocks holding
labels, instructions and declarations. `str(module)` prints it back as PTX: the formatting is
not preserved, the program is (comments are dropped; `.section` debug data is kept verbatim).
clc.wrapping.loop_safety asks it what a kernel does; clc.wrapping.ptx re-exports both.
"""

import re
from dataclasses import dataclass, field

__all__ = ["PtxError", "Token", "tokenize", "parse", "Module", "Function", "Param", "Block",
           "Label", "Instruction", "Operand", "Directive", "Variable"]


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


def int_token(token):
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
            n = int_token(tokens[i + 1]) if i + 1 < len(tokens) else None
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
            p.array.append(None if dim == "]" else int_token(tokens[i + 1]))
        elif t.kind == "ident" and not p.name:
            p.name = t.text
    if not p.name:
        raise PtxError("parameter without a name", tokens[0].line, tokens[0].column)
    return p

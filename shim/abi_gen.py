# SPDX-License-Identifier: Apache-2.0
"""Writes clc/_abi_generated.py from the contract headers, when clc is built (setup.py).

The headers are the one place a constant, a record or a field is written: clc_abi.h (the shim
and the engine) and slurm/clc_slurm.h (the SPANK plugin and its launcher, which build without
the rest). This reads their #defines (numbers, strings, the X-macro lists), the clc_shim_
prototypes, and every struct's layout as cffi computes it for this platform; clc/abi.py builds
the Python layer (Struct formats, field pickers, name maps) on what it writes. A header that
holds something this cannot read stops the build, naming it, rather than leaving it out.
"""

import ast
import pathlib
import re

__all__ = ["declarations", "generate", "write", "HEADERS", "OUTPUT"]

SHIM = pathlib.Path(__file__).resolve().parent
# (header, the prefix its names lose in Python); clc_slurm.h's keep SLURM_, so that the two
# headers' names cannot meet.
HEADERS = ((SHIM / "clc_abi.h", "CLC_"), (SHIM / "slurm" / "clc_slurm.h", "CLC_"))
OUTPUT = SHIM.parent / "clc" / "_abi_generated.py"


def _strip_comments(text):
    return re.sub(r"//[^\n]*", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def declarations(text):
    """clc_abi.h as cffi's cdef reads it: its integer #defines and typedefs, without the other
    preprocessor lines (guards, includes, strings, fractions) and without stage 1's exports,
    which cffi's embedding would otherwise take for its own."""
    text = _strip_comments(text).replace("\\\n", " ")
    text = re.sub(r"^[^\n;#{}]*\bclc_shim_\w+\([^;]*\);", "", text, flags=re.M)
    numeric = re.compile(r"#define\s+\w+\s+\d+\s*$")
    return "\n".join(line for line in text.splitlines()
                     if not line.lstrip().startswith("#") or numeric.match(line.strip()))


_OPS = {ast.LShift: lambda a, b: a << b, ast.BitOr: lambda a, b: a | b,
        ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b}


def _number(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_number(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_number(node.left), _number(node.right))
    raise ValueError


def _value(name, body, where):
    if body.startswith('"'):
        if not re.fullmatch(r'("[^"\\]*"\s*)+', body):
            raise ValueError(f"{where}: {name}: a string with escapes or text beside it")
        return "".join(re.findall(r'"([^"]*)"', body)).encode()
    c = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", body)
    try:
        return _number(ast.parse(c, mode="eval").body)
    except (SyntaxError, ValueError):
        raise ValueError(f"{where}: {name}: cannot read {body!r} (a string, or a number: "
                         "literals, -, <<, |, +, *)") from None


def _defines(text, where):
    """{name: int, float, bytes, or a tuple of an X-macro list's names}, in the header's order
    (include guards left out)."""
    out = {}
    text = _strip_comments(text).replace("\\\n", " ")
    for name, params, body in re.findall(
            r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?[ \t]*(.*?)[ \t]*$", text, flags=re.M):
        if not body:
            continue  # an include guard
        if params:
            items = re.findall(r"X\((\w+)\)", body)
            if params != "(X)" or not items or re.sub(r"X\(\w+\)", "", body).strip():
                raise ValueError(f"{where}: {name}{params}: only X-macro lists (X(a) X(b) ...)"
                                 " cross to Python")
            out[name] = tuple(items)
        else:
            out[name] = _value(name, body, where)
    return out


def _prototypes(text):
    """{name: (result, (parameter types...))} of the clc_shim_ prototypes, each type as
    written, without the parameter's name."""
    out = {}
    for result, name, params in re.findall(r"^([\w ]+?\s*\**)\s*(clc_shim_\w+)\(([^)]*)\);",
                                           _strip_comments(text), re.M):
        types = tuple(re.sub(r"\s*\b\w+$", "", " ".join(p.split())).strip()
                      for p in params.split(","))
        out[name] = (" ".join(result.split()), types)
    return out


def _type_name(ctype):
    if ctype.kind == "pointer":
        return "pointer"
    return ctype.cname.removeprefix("struct ")


def _layouts(text):
    """{struct: (size, ((member, offset, type, count), ...))}; an array is one member of
    `count` items, a pointer's type is "pointer"."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef(declarations(text))
    out = {}
    for name in re.findall(r"typedef\s+struct\s+\w+\s*\{.*?\}\s*(\w+)\s*;", _strip_comments(text),
                           flags=re.S):
        members = []
        for member, field in ffi.typeof(name).fields:
            t, count = field.type, 1
            if t.kind == "array":
                t, count = t.item, t.length
            members.append((member, field.offset, _type_name(t), count))
        out[name] = (ffi.sizeof(name), tuple(members))
    return out


def generate(headers=HEADERS):
    """The generated module's text."""
    lines = ['# Generated by shim/abi_gen.py from the contract headers when clc is built: edit',
             '# the headers, not this file (clc/abi.py is the Python layer on top).', '']
    names, layouts, exports, origin = [], {}, {}, {}
    for path, prefix in headers:
        text = path.read_text()
        where = f"{path.parent.name}/{path.name}"
        lines.append(f"# {where}")
        for name, value in _defines(text, where).items():
            short = name.removeprefix(prefix)
            if short in origin:
                raise ValueError(f"{where}: {name} gives Python's {short}, which "
                                 f"{origin[short]} gives already")
            origin[short] = where
            names.append(short)
            if isinstance(value, int) and value > 0xFFFF:
                lines.append(f"{short} = {value:#x}")
            else:
                lines.append(f"{short} = {value!r}")
        if "typedef struct" in text:
            layouts.update(_layouts(text))
        exports.update(_prototypes(text))
        lines.append("")
    lines.append("# Each struct: (size, ((member, offset, type, count), ...)).")
    lines.append("LAYOUTS = {")
    for name, (size, members) in layouts.items():
        lines.append(f"    {name!r}: ({size}, (")
        lines += [f"        {m!r}," for m in members]
        lines.append("    )),")
    lines.append("}")
    lines.append("# Stage 1's exports: name -> (result, parameter types), as spelled there.")
    lines.append("SHIM_EXPORTS = {")
    lines += [f"    {name!r}: {proto!r}," for name, proto in exports.items()]
    lines.append("}")
    names += ["LAYOUTS", "SHIM_EXPORTS"]
    lines.append("__all__ = [")
    lines += [f"    {n!r}," for n in names]
    lines.append("]")
    return "\n".join(lines) + "\n"


def write(output=OUTPUT):
    """Writes the module, leaving the file untouched when it already holds that text."""
    text = generate()
    if not output.exists() or output.read_text() != text:
        output.write_text(text)
    return output


if __name__ == "__main__":
    print(write())

# SPDX-License-Identifier: Apache-2.0
"""clc's Python modules and the shim's C files stay small rooms: a module of the package or a C
file of the product is at most 700 lines and a function at most 80, so that a reader finds one
concern per file (docs/architecture.md maps them). The modules and functions listed below are
larger still and are to be split; nothing may join them."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80

LARGER_MODULES = set()
LARGER_FUNCTIONS = set()


def modules():
    return sorted(p for p in (ROOT / "clc").rglob("*.py") if "__pycache__" not in p.parts)


def shown(path):
    return path.relative_to(ROOT).as_posix()


def test_no_module_is_over_700_lines():
    lines = {shown(p): len(p.read_text().splitlines()) for p in modules()}
    large = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    assert {name: n for name, n in large.items() if name not in LARGER_MODULES} == {}
    assert LARGER_MODULES <= set(large), "split already: take it off LARGER_MODULES"


def test_no_function_is_over_80_lines():
    long = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{shown(path)}:{node.name}"] = n
    assert {name: n for name, n in long.items() if name not in LARGER_FUNCTIONS} == {}
    assert LARGER_FUNCTIONS <= set(long), "split already: take it off LARGER_FUNCTIONS"


# ---- the C files of the product: the shim (both stages, the Slurm programs) and clc's own ----


def c_files():
    found = [*(ROOT / "shim").rglob("*.[ch]"), *(ROOT / "clc").rglob("*.[ch]"),
             *(ROOT / "clc").rglob("*.cu")]
    assert found, "no C files found"
    return sorted(found)


# A definition's first line, at the left margin: not a comment, a preprocessor line, a type or a
# table (clang-format puts every function's closing brace alone at the left margin).
NOT_A_FUNCTION = re.compile(r"^(?:[\s/#*}]|typedef\b|struct\b|enum\b|union\b|$)")


def c_functions(path):
    """{name: lines} of the functions defined in a C file, signature to closing brace."""
    lines = path.read_text().splitlines()
    found, start = {}, None
    for i, line in enumerate(lines):
        if not NOT_A_FUNCTION.match(line):
            start = i
        if line.endswith(";"):  # a declaration, not a definition
            start = None
        if start is None or not line.endswith("{") or line.endswith("\\"):
            continue
        signature = " ".join(lines[start:i + 1])
        name = re.search(r"(\w+)\s*\(", signature.split("=")[0])
        if name:
            end = next(j for j in range(i + 1, len(lines)) if lines[j] == "}")
            found[name.group(1)] = end - start + 1
        start = None
    return found


def test_no_c_file_is_over_700_lines():
    large = {shown(p): n for p in c_files() if (n := len(p.read_text().splitlines())) > 700}
    assert large == {}


def test_no_c_function_is_over_80_lines():
    long = {f"{shown(p)}:{name}": n for p in c_files()
            for name, n in c_functions(p).items() if n > MAX_FUNCTION_LINES}
    assert long == {}


def test_c_functions_are_found(tmp_path):
    # GIVEN a C file with a type, a table, a one-line function, declarations, a macro and two
    # functions, one with its signature on two lines
    src = tmp_path / "x.c"
    src.write_text("""typedef struct {
    int a;
} pair;
static const int table[] = {
    1,
};
static inline int one(void) { return 1; }
int declared(int a,
             int b);
_Static_assert(sizeof(int) == 4, "ints");
#define TWICE(x) \\
    do {         \\
    } while (0)
int first(int a) {
    return a;
}

/* a comment */
static int second(int a,
                  int b) {
    if (a) {
        return b;
    }
    return a;
}
""")
    # THEN the reader finds the two functions and their lengths, signature to closing brace
    assert c_functions(src) == {"first": 3, "second": 7}

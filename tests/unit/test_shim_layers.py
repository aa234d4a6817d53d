# SPDX-License-Identifier: Apache-2.0
"""The preload library's C files call each other in layers and never in a loop.

The layers are listed once, in shim/shim.h's opening comment. Each file that setup.py builds into
the preload library is compiled to an object with setup.py's flags; the global symbols each object
defines and the ones it needs (nm) say which file calls, or reads, which.
"""

import ast
import concurrent.futures
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHIM = ROOT / "shim"

# " *   core:     core.c settings.c real.c" in shim.h's opening comment, lowest layer first.
LAYER_LINE = re.compile(r"^ \*   (\w+): +((?:[\w.]+\.c ?)+)$", re.M)


def preload_build() -> tuple[list[str], list[str]]:
    """The preload Extension's C sources (paths from the root) and compile flags, from setup.py."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            args = {k.arg: k.value for k in node.keywords}
            sources = [c.value for c in ast.walk(args["sources"])
                       if isinstance(c, ast.Constant) and str(c.value).endswith(".c")]
            return [f"shim/{pathlib.Path(s).name}" for s in sources], \
                ast.literal_eval(args["extra_compile_args"])
    raise AssertionError("setup.py builds no Extension")


def layers() -> dict[str, int]:
    """Each file's layer in shim.h's list, 0 the lowest."""
    found = LAYER_LINE.findall((SHIM / "shim.h").read_text())
    assert found, "shim/shim.h lists no layers"
    return {f: i for i, (_, files) in enumerate(found) for f in files.split()}


def symbols(obj: pathlib.Path) -> tuple[set[str], set[str]]:
    """The global symbols an object defines, and the ones it needs."""
    defined, needed = set(), set()
    for line in subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        name, kind = line.split()[:2]
        if kind in "Uwv":
            needed.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, needed


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    """file -> {file it calls: [the symbols]}, over the files of the preload library."""
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and nm are needed to compile the shim")
    sources, flags = preload_build()
    out = tmp_path_factory.mktemp("shim_objects")

    def compile_one(src: str) -> pathlib.Path:
        obj = out / (pathlib.Path(src).stem + ".o")
        subprocess.run(["gcc", "-c", *flags, "-fPIC", "-Ishim", src, "-o", str(obj)], cwd=ROOT,
                       check=True, capture_output=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor() as pool:
        objects = dict(zip((pathlib.Path(s).name for s in sources), pool.map(compile_one, sources)))
    table = {name: symbols(obj) for name, obj in objects.items()}
    owner = {sym: name for name, (defined, _) in table.items() for sym in defined}
    graph = {name: {} for name in table}
    for name, (_, needed) in table.items():
        for sym in sorted(needed):
            if owner.get(sym, name) != name:
                graph[name].setdefault(owner[sym], []).append(sym)
    return graph


def find_loop(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """A loop of calls, as files from the first back to itself; None when there is none."""
    state, path = {}, []

    def visit(f: str) -> list[str] | None:
        state[f] = "open"
        path.append(f)
        for g in sorted(graph[f]):
            if state.get(g) == "open":
                return path[path.index(g):] + [g]
            if g not in state and (loop := visit(g)):
                return loop
        state[f] = "done"
        path.pop()
        return None

    for f in sorted(graph):
        if f not in state and (loop := visit(f)):
            return loop
    return None


def describe(graph: dict[str, dict[str, list[str]]], a: str, b: str) -> str:
    return f"{a} -> {b} ({', '.join(graph[a][b])})"


def test_every_file_of_the_library_has_a_layer():
    # GIVEN the files setup.py builds into the preload library, and shim.h's layers
    sources, _ = preload_build()
    # THEN each file is in exactly one layer, and each layer's file is built
    names = [pathlib.Path(s).name for s in sources]
    listed = [f for _, files in LAYER_LINE.findall((SHIM / "shim.h").read_text())
              for f in files.split()]
    assert sorted(listed) == sorted(set(listed)), "a file is listed in two layers"
    assert sorted(names) == sorted(listed)


def test_no_files_call_each_other_in_a_loop(calls):
    # WHEN the files' calls are followed
    loop = find_loop(calls)
    # THEN none leads back to where it started
    assert loop is None, "the shim's files call each other in a loop: " + "; ".join(
        describe(calls, a, b) for a, b in zip(loop, loop[1:]))


def test_calls_go_down_the_layers(calls):
    # GIVEN each file's layer
    layer = layers()
    # THEN a file calls only into its own layer or those below
    upward = [describe(calls, a, b) for a in sorted(calls) for b in sorted(calls[a])
              if layer[b] > layer[a]]
    assert not upward, "calls up the layers of shim/shim.h: " + "; ".join(upward)


# Each layer's header: it includes the one below it, and each file of the layer includes it
# (the entry layer's is shim.h, which includes them all).
LAYER_HEADERS = {"core": "core.h", "records": "records.h", "deciding": "deciding.h",
                 "hooks": "hooks.h", "entry": "shim.h"}
INCLUDE = re.compile(r'^#include "(\w+\.h)"', re.M)


def test_each_file_includes_its_layers_header():
    # GIVEN each file's layer, by name, and each header of the project each file includes
    named = {f: name for name, files in LAYER_LINE.findall((SHIM / "shim.h").read_text())
             for f in files.split()}
    layer_of = {header: name for name, header in LAYER_HEADERS.items()}
    order = list(LAYER_HEADERS)
    for f, name in sorted(named.items()):
        includes = set(INCLUDE.findall((SHIM / f).read_text())) - {"clc_abi.h"}
        # the launch gate's header stands for the hooks layer's (it includes hooks.h)
        includes = {"hooks.h" if h == "gate.h" else h for h in includes}
        layered = {h for h in includes if h in layer_of}
        # THEN it includes its own layer's header, and none of a layer above its own
        assert LAYER_HEADERS[name] in layered, f"{f} does not include {LAYER_HEADERS[name]}"
        above = [h for h in layered if order.index(layer_of[h]) > order.index(name)]
        assert not above, f"{f} ({name}) includes {above}"


def test_each_layers_header_includes_the_one_below():
    order = list(LAYER_HEADERS.values())
    for below, header in zip(order, order[1:]):
        includes = INCLUDE.findall((SHIM / header).read_text())
        assert below in includes, f"{header} does not include {below}"
        assert not set(includes) & set(order[order.index(header) + 1:]), header
    assert "gate.h" in (SHIM / "launch.c").read_text()
    assert '#include "hooks.h"' in (SHIM / "gate.h").read_text()

# SPDX-License-Identifier: Apache-2.0
"""The preload library's C files call each other in layers and never in a loop.

The layers are the folders of shim/, named once, lowest first, in shim/LAYERS. Each file that
setup.py builds into the preload library is compiled to an object with setup.py's flags; the
global symbols each object defines and the ones it needs (nm) say which file calls, or reads,
which; its folder says its layer.
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
# Folders of shim/ that are not layers of the preload library: stage 2 (the cffi bridge) and the
# Slurm programs, each built on its own.
OTHER_STAGES = {"bridge", "slurm"}
# The contract of both stages and Python, included by name from any layer.
CONTRACT = "clc_abi.h"


def layer_order() -> list[str]:
    """The layers' folders in shim/LAYERS (a name first on each line), the lowest first."""
    names = [line.split()[0] for line in (SHIM / "LAYERS").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert names, "shim/LAYERS names no layers"
    assert len(names) == len(set(names)), f"shim/LAYERS names a layer twice: {names}"
    return names


def preload_build() -> tuple[list[str], list[str]]:
    """The preload Extension's C sources (paths from the root) and compile flags, from setup.py."""
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            args = {k.arg: k.value for k in node.keywords}
            sources = [c.value for c in ast.walk(args["sources"])
                       if isinstance(c, ast.Constant) and str(c.value).endswith(".c")]
            return [f"shim/{s.removeprefix('shim/')}" for s in sources], \
                ast.literal_eval(args["extra_compile_args"])
    raise AssertionError("setup.py builds no Extension")


def name(path: pathlib.Path | str) -> str:
    """A file of shim/ by its layer: "records/capture.c"."""
    return pathlib.Path(path).resolve().relative_to(SHIM).as_posix()


def layers() -> dict[str, int]:
    """Each built file's layer ("records/capture.c": 1), from its folder, 0 the lowest."""
    order = layer_order()
    sources, _ = preload_build()
    return {name(ROOT / s): order.index(pathlib.Path(s).parent.name) for s in sources}


def symbols(obj: pathlib.Path) -> tuple[set[str], set[str]]:
    """The global symbols an object defines, and the ones it needs."""
    defined, needed = set(), set()
    for line in subprocess.run(["nm", "-P", str(obj)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        sym, kind = line.split()[:2]
        if kind in "Uwv":
            needed.add(sym)
        elif kind.isupper():
            defined.add(sym)
    return defined, needed


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> dict[str, dict[str, list[str]]]:
    """file -> {file it calls: [the symbols]}, over the files of the preload library."""
    if shutil.which("gcc") is None or shutil.which("nm") is None:
        pytest.skip("gcc and nm are needed to compile the shim")
    sources, flags = preload_build()
    out = tmp_path_factory.mktemp("shim_objects")

    def compile_one(src: str) -> pathlib.Path:
        obj = out / (name(ROOT / src).replace("/", "__") + ".o")
        subprocess.run(["gcc", "-c", *flags, "-fPIC", "-Ishim", src, "-o", str(obj)], cwd=ROOT,
                       check=True, capture_output=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor() as pool:
        objects = dict(zip((name(ROOT / s) for s in sources), pool.map(compile_one, sources)))
    table = {f: symbols(obj) for f, obj in objects.items()}
    owner = {sym: f for f, (defined, _) in table.items() for sym in defined}
    graph = {f: {} for f in table}
    for f, (_, needed) in table.items():
        for sym in sorted(needed):
            if owner.get(sym, f) != f:
                graph[f].setdefault(owner[sym], []).append(sym)
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


def test_each_layer_is_a_folder_with_its_header():
    # GIVEN shim/LAYERS and the folders of shim/
    order = layer_order()
    folders = {p.name for p in SHIM.iterdir() if p.is_dir()}
    # THEN each layer is a folder holding a header of its name, and every folder is a layer or
    # another stage
    for layer in order:
        assert (SHIM / layer / f"{layer}.h").is_file(), f"no shim/{layer}/{layer}.h"
    assert folders - OTHER_STAGES == set(order), "shim/'s folders are not shim/LAYERS' layers"
    # AND no C file lies loose in shim/: only the contract stays at its top
    loose = sorted(p.name for p in SHIM.iterdir() if p.suffix in (".c", ".h"))
    assert loose == [CONTRACT], f"C files outside a layer's folder: {loose}"


def test_every_file_of_the_library_is_in_a_layer():
    # GIVEN the files setup.py builds into the preload library
    sources, _ = preload_build()
    built = sorted(name(ROOT / s) for s in sources)
    # THEN they are exactly the C files of the layers' folders: none left out, none from elsewhere
    in_layers = sorted(name(p) for layer in layer_order() for p in (SHIM / layer).glob("*.c"))
    assert built == in_layers


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
    assert not upward, "calls up the layers of shim/LAYERS: " + "; ".join(upward)


# `#include "x.h"` names a file of the includer's own folder, `#include "core/core.h"` another
# folder's (the build's one include directory is shim/).
INCLUDE = re.compile(r'^#include "([\w/]+\.h)"', re.M)


def included(path: pathlib.Path) -> set[str]:
    """The project's headers `path` includes, as names from shim/ ("core/core.h")."""
    folder = path.parent.name
    return {h if "/" in h or h == CONTRACT else f"{folder}/{h}"
            for h in INCLUDE.findall(path.read_text())}


def test_each_file_includes_its_layers_header():
    order = layer_order()
    for layer in order:
        for path in sorted((SHIM / layer).glob("*.[ch]")):
            includes = included(path)
            # THEN a C file includes its own layer's header (the launch gate's, gate.h, stands for
            # the hooks layer's: it includes hooks.h)
            if path.suffix == ".c":
                own = {f"{layer}/{layer}.h"} | ({"hooks/gate.h"} if layer == "hooks" else set())
                assert includes & own, f"{name(path)} does not include {layer}/{layer}.h"
            # AND no file, header or not, includes a header of a layer above its own
            above = sorted(h for h in includes - {CONTRACT}
                           if order.index(h.split("/")[0]) > order.index(layer))
            assert not above, f"{name(path)} ({layer}) includes {above}"


def test_each_layers_header_includes_the_one_below():
    order = layer_order()
    headers = [f"{layer}/{layer}.h" for layer in order]
    for below, header in zip([CONTRACT] + headers, headers):
        includes = included(SHIM / header)
        assert below in includes, f"{header} does not include {below}"
    assert "hooks/gate.h" in included(SHIM / "hooks" / "launch.c")
    assert "hooks/hooks.h" in included(SHIM / "hooks" / "gate.h")

# SPDX-License-Identifier: Apache-2.0
"""Builds the fake CUDA driver and the native test programs of tests/native with gcc.

    build_native(outdir) -> {"libcuda": outdir/libcuda.so.1, "prog_cudart": ..., ...}

The fake is built as libcuda.so.1 (soname libcuda.so.1) with a libcuda.so symlink beside it
for -lcuda. Programs find it at run time through LD_LIBRARY_PATH=<outdir>, which the tests set
(prog_linked also has an rpath to it). Only cuda.h is needed from a CUDA toolkit: it is looked
for in $CUDA_HOME/include, else /usr/local/cuda/include.

Outputs newer than all their inputs are not rebuilt. Each output is written under a temporary
name and renamed into place, so test processes building into the same directory at once never
see a half-written file.

Run as a script to build by hand: python3 tests/native/build.py OUTDIR
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

HERE = pathlib.Path(__file__).resolve().parent

# The Python host program; it needs no build, only LD_LIBRARY_PATH=<outdir>.
PYHOST = HERE / "pyhost.py"

_CFLAGS = ["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
_PROGRAMS = ("prog_cudart", "prog_triton", "prog_linked", "prog_threads", "prog_fork",
             "prog_teardown", "prog_graph_generic", "prog_params", "prog_wrap", "prog_reload",
             "prog_stdin_thread", "prog_green", "prog_green_threads", "prog_green_program",
             "prog_life", "prog_path", "prog_conditional", "prog_coop", "prog_priority",
             "prog_cupti_user")


class BuildError(RuntimeError):
    """The native test binaries could not be built (no compiler, no cuda.h, a compile error)."""


def cuda_include_dir() -> pathlib.Path:
    """The directory holding cuda.h: $CUDA_HOME/include when CUDA_HOME is set."""
    home = os.environ.get("CUDA_HOME")
    inc = pathlib.Path(home) / "include" if home else pathlib.Path("/usr/local/cuda/include")
    if not (inc / "cuda.h").is_file():
        where = "$CUDA_HOME/include" if home else "/usr/local/cuda/include (CUDA_HOME is unset)"
        raise BuildError(
            f"cuda.h not found in {inc}: the fake driver and test programs are compiled "
            f"against the real CUDA headers, looked for in {where}. Install the CUDA toolkit "
            f"headers or point CUDA_HOME at a toolkit (its include/cuda.h is all that is used)."
        )
    return inc


def _compiler() -> str:
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise BuildError(f"C compiler {cc!r} not found (set CC to use another)")
    return cc


def _up_to_date(out: pathlib.Path, inputs: list[pathlib.Path]) -> bool:
    try:
        built = out.stat().st_mtime_ns
    except FileNotFoundError:
        return False
    return all(built > p.stat().st_mtime_ns for p in inputs)


def _run_into(out: pathlib.Path, argv_for: Callable[[pathlib.Path], list[str]]) -> None:
    """Runs the command argv_for(tmp), which writes tmp, then renames tmp to out."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        argv = argv_for(tmp)
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(
                f"building {out.name} failed ({proc.returncode}):\n  {' '.join(argv)}\n"
                f"{proc.stdout}{proc.stderr}"
            )
        tmp.chmod(0o755)  # mkstemp made it 0600
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _symlink(link: pathlib.Path, target: str) -> None:
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp = link.with_name(f".{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, link)


def build_native(outdir: pathlib.Path) -> dict[str, pathlib.Path]:
    """Builds libcuda.so.1 and the programs into outdir; returns name -> path.

    Keys: "libcuda", "libcupti", "prog_cudart", "prog_triton", "prog_linked", "prog_threads",
    "prog_fork", "prog_teardown", "prog_graph_generic", "prog_params", "prog_wrap",
    "prog_reload", "prog_stdin_thread", "prog_green", "prog_green_threads",
    "prog_green_program", "prog_life",
    "prog_path", "prog_conditional", "prog_coop", "prog_priority", "prog_cupti_user",
    "liblife".
    """
    inc = cuda_include_dir()
    cc = _compiler()
    outdir = pathlib.Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    common = [HERE / "common.h", inc / "cuda.h", pathlib.Path(__file__).resolve()]

    lib = outdir / "libcuda.so.1"
    fake_src = HERE / "fake_cuda.c"
    fake_parts = sorted((HERE / "fake").glob("*.c"))
    if not _up_to_date(lib, [fake_src, *fake_parts, inc / "cuda.h",
                             pathlib.Path(__file__).resolve()]):
        _run_into(
            lib,
            lambda tmp: [cc, "-shared", "-fPIC", *_CFLAGS, f"-I{inc}",
                         "-Wl,-soname,libcuda.so.1", "-o", str(tmp), str(fake_src),
                         "-ldl", "-lpthread"],
        )
    _symlink(outdir / "libcuda.so", "libcuda.so.1")

    # libcupti.so: the fake CUPTI (fake_cupti.c), loaded by clc-run --cupti only
    cupti = outdir / "libcupti.so"
    cupti_src = HERE / "fake_cupti.c"
    if not _up_to_date(cupti, [cupti_src, HERE.parents[1] / "shim" / "cupti_abi.h",
                               pathlib.Path(__file__).resolve()]):
        _run_into(
            cupti,
            lambda tmp: [cc, "-shared", "-fPIC", *_CFLAGS, f"-I{HERE.parents[1] / 'shim'}",
                         "-Wl,-soname,libcupti.so", "-o", str(tmp), str(cupti_src), "-ldl",
                         "-lpthread"],
        )

    built = {"libcuda": lib, "libcupti": cupti}
    # liblife.so: a library of prog_life's whose constructor and destructor launch.
    life = outdir / "liblife.so"
    life_src = HERE / "lib_life.c"
    if not _up_to_date(life, [life_src, lib, *common]):
        _run_into(
            life,
            lambda tmp: [cc, "-shared", "-fPIC", *_CFLAGS, f"-I{inc}", "-o", str(tmp),
                         str(life_src), f"-L{outdir}", "-lcuda", "-ldl"],
        )
    built["liblife"] = life
    for name in _PROGRAMS:
        src = HERE / f"{name}.c"
        out = outdir / name
        if name in ("prog_linked", "prog_reload", "prog_stdin_thread", "prog_green",
                    "prog_green_threads", "prog_green_program", "prog_life",
                    "prog_conditional", "prog_coop"):
            # Linked against the fake like a real program against the driver; the rpath keeps
            # it runnable without LD_LIBRARY_PATH too.
            link = [f"-L{outdir}", "-lcuda", f"-Wl,-rpath,{outdir}"]
            inputs = [src, lib, *common]
            if name == "prog_life":
                link = [f"-L{outdir}", "-llife", *link]
                inputs.append(life)
        elif name == "prog_cupti_user":
            # linked with the fake CUPTI too, as a program using CUPTI is with the real one
            link = [f"-L{outdir}", "-lcupti", "-lcuda", f"-Wl,-rpath,{outdir}"]
            inputs = [src, lib, cupti, *common]
        else:
            link = []
            inputs = [src, *common]
        if not _up_to_date(out, inputs):
            _run_into(
                out,
                lambda tmp, src=src, link=link: [cc, *_CFLAGS, f"-I{inc}", "-o", str(tmp),
                                                 str(src), *link, "-ldl", "-lpthread"],
            )
        built[name] = out
    return built


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUTDIR")
    for key, path in build_native(pathlib.Path(sys.argv[1])).items():
        print(f"{key}={path}")

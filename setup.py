# SPDX-License-Identifier: Apache-2.0
"""Builds both stages of the shim as part of `pip install .`.

Stage 1, the preload library, is plain C with no libpython: it is built as an "extension"
only so that setuptools compiles it, and is named libclc_preload.so, without the interpreter
tag, because one build serves every Python; its C files live in shim/ by layer, a folder each
(shim/LAYERS). Stage 2 is the cffi bridge (shim/bridge/bridge_build.py), one build per CPython
version.

The Slurm parts (shim/slurm/, docs/deploy.md) are built beside the preload library: the task
launcher clc-slurm-exec (static, always) and the SPANK plugin libclc_spank.so (where Slurm's
spank.h is found: Debian's libslurm-dev; $CLC_SLURM_INCLUDE names another include directory).
"""

import os
import pathlib
import runpy
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PRELOAD = "clc.libclc_preload"
SPANK = "clc.libclc_spank"
PLAIN = (PRELOAD, SPANK)  # shared objects named without the interpreter tag
LAUNCHER = "clc-slurm-exec"
SLURM_INCLUDE = os.environ.get("CLC_SLURM_INCLUDE", "/usr/include")


class BuildShim(build_ext):
    def get_ext_filename(self, fullname):
        # Asked both with the full dotted name and with its last part alone.
        name = super().get_ext_filename(fullname)
        if fullname.split(".")[-1] in [p.split(".")[-1] for p in PLAIN]:
            name = name[: -len(sysconfig.get_config_var("EXT_SUFFIX"))] + ".so"
        return name

    def get_export_symbols(self, ext):
        return [] if ext.name in PLAIN else super().get_export_symbols(ext)

    def run(self):
        super().run()
        # the task launcher, beside the preload library; static, so that the loader's
        # variables of a job run nothing inside it
        dest = os.path.dirname(self.get_ext_fullpath(PRELOAD))
        objects = self.compiler.compile(["shim/slurm/clc_slurm_exec.c"],
                                        output_dir=self.build_temp, include_dirs=["shim/slurm"],
                                        extra_postargs=["-O2", "-Wall", "-Wextra"])
        self.compiler.link_executable(objects, LAUNCHER, output_dir=dest,
                                      extra_postargs=["-static"])
        self.build_demo(os.path.join(dest, "demo"))

    def build_demo(self, dest):
        """`clc demo --no-gpu`'s stand-in driver (the fake libcuda of clc's tests) and its
        program, where the tests' sources and a cuda.h are found (the build requires the
        nvidia-cuda-runtime wheel's); else the demo says it was not built."""
        native = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests", "fixtures",
                              "native")
        if not os.path.isdir(native):
            print("clc: tests/fixtures/native not found: clc demo --no-gpu is not built")
            return
        sys.path.insert(0, native)
        try:
            from build import BuildError, build_fake_driver, cuda_include_dir
            inc = cuda_include_dir()
            os.makedirs(dest, exist_ok=True)
            cc = os.environ.get("CC", "gcc")
            build_fake_driver(pathlib.Path(dest), inc, cc)
            subprocess.run([cc, "-O2", "-Wall", "-Wextra", f"-I{inc}", "-o",
                            os.path.join(dest, "demo_app"), "clc/demo/demo_app.c",
                            f"-L{dest}", "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN"], check=True)
            os.unlink(os.path.join(dest, "libcuda.so"))  # for -lcuda only: not shipped
        except (BuildError, OSError, subprocess.CalledProcessError) as e:
            print(f"clc: clc demo --no-gpu is not built: {e}")
        finally:
            sys.path.remove(native)


preload = Extension(
    PRELOAD,
    sources=[f"shim/{f}" for f in ("core/core.c", "core/settings.c", "core/real.c", "core/files.c",
                                  "records/decision_cache.c", "records/capture.c",
                                  "records/counts.c", "records/capture_cap.c",
                                  "records/capture_file.c", "records/clock.c",
                                  "records/timing.c", "records/cupti.c",
                                  "priority/green.c", "priority/green_graph.c",
                                  "priority/priority.c", "priority/best_effort.c",
                                  "priority/run_ahead.c", "priority/latency_critical.c",
                                  "priority/board.c",
                                  "deciding/decide.c", "deciding/decider.c",
                                  "deciding/bridge_loader.c", "deciding/replace.c",
                                  "hooks/launch.c", "hooks/graph.c", "hooks/load.c",
                                  "hooks/context.c", "hooks/process.c", "hooks/leave.c",
                                  "hooks/image.c", "hooks/settle.c",
                                  "entry/interpose.c", "entry/dlopen.c")],
    # every header of the layers' folders, and the contract
    depends=["shim/clc_abi.h"] + sorted(str(p) for p in pathlib.Path("shim").glob("*/*.h")
                                        if p.parent.name != "slurm"),
    # one include directory: a file names another layer's header by its folder (core/core.h)
    include_dirs=["shim"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-unused-parameter"],
    extra_link_args=["-ldl", "-lpthread"],
)

spank = Extension(
    SPANK,
    sources=["shim/slurm/clc_spank.c", "shim/slurm/clc_multi_prog.c"],
    depends=["shim/slurm/clc_slurm.h", "shim/slurm/clc_multi_prog.h"],
    include_dirs=["shim/slurm", SLURM_INCLUDE],
    # slurmstepd finds the plugin's symbols by name: every one not static is exported
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)
have_spank = os.path.exists(os.path.join(SLURM_INCLUDE, "slurm", "spank.h"))
if not have_spank:
    print(f"clc: {SLURM_INCLUDE}/slurm/spank.h not found: the SPANK plugin is not built "
          "(install libslurm-dev, or set CLC_SLURM_INCLUDE)")

# clc/_abi_generated.py, the contract headers as Python (shim/abi_gen.py): written before
# setuptools lists the package's modules, so that the wheel holds it and an editable install
# imports it from the tree.
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "shim", "abi_gen.py"))[
    "write"]()

setup(
    ext_modules=[preload, spank] if have_spank else [preload],
    cffi_modules=["shim/bridge/bridge_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildShim},
)

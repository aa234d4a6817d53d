# SPDX-License-Identifier: Apache-2.0
"""Builds both stages of the shim as part of `pip install .`.

Stage 1, the preload library, is plain C with no libpython: it is built as an "extension"
only so that setuptools compiles it, and is named libclc_preload.so, without the interpreter
tag, because one build serves every Python. Stage 2 is the cffi bridge (shim/bridge_build.py),
one build per CPython version.

The Slurm parts (shim/slurm/, docs/deploy.md) are built beside the preload library: the task
launcher clc-slurm-exec (static, always) and the SPANK plugin libclc_spank.so (where Slurm's
spank.h is found: Debian's libslurm-dev; $CLC_SLURM_INCLUDE names another include directory).
"""

import os
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


preload = Extension(
    PRELOAD,
    sources=[f"shim/{f}" for f in ("core.c", "settings.c", "real.c", "files.c", "decision_cache.c",
                                  "capture.c", "timing.c", "cupti.c", "decide.c", "decider.c",
                                  "bridge_loader.c", "replace.c", "green.c", "priority.c",
                                  "launch.c", "graph.c", "load.c", "context.c", "process.c",
                                  "leave.c", "image.c",
                                  "interpose.c", "dlopen.c")],
    depends=[f"shim/{h}.h" for h in ("shim", "core", "records", "deciding", "hooks", "gate",
                                     "clc_abi", "elf_dynamic")],
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

setup(
    ext_modules=[preload, spank] if have_spank else [preload],
    cffi_modules=["shim/bridge_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildShim},
)

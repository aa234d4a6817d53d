# SPDX-License-Identifier: Apache-2.0
"""Builds both stages of the shim as part of `pip install .`.

Stage 1, the preload library, is plain C with no libpython: it is built as an "extension"
only so that setuptools compiles it, and is named libclc_preload.so, without the interpreter
tag, because one build serves every Python. Stage 2 is the cffi bridge (shim/bridge_build.py),
one build per CPython version.
"""

import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PRELOAD = "clc.libclc_preload"


class BuildShim(build_ext):
    def get_ext_filename(self, fullname):
        # Asked both with the full dotted name and with its last part alone.
        name = super().get_ext_filename(fullname)
        if fullname.split(".")[-1] == PRELOAD.split(".")[-1]:
            name = name[: -len(sysconfig.get_config_var("EXT_SUFFIX"))] + ".so"
        return name

    def get_export_symbols(self, ext):
        return [] if ext.name == PRELOAD else super().get_export_symbols(ext)


preload = Extension(
    PRELOAD,
    sources=[f"shim/{f}" for f in ("core.c", "settings.c", "real.c", "files.c", "decision_cache.c",
                                  "capture.c", "timing.c", "decide.c", "decider.c",
                                  "bridge_loader.c", "replace.c", "green.c", "priority.c",
                                  "launch.c", "graph.c", "load.c", "context.c", "process.c",
                                  "leave.c", "image.c",
                                  "interpose.c", "dlopen.c")],
    depends=["shim/shim.h", "shim/gate.h", "shim/clc_abi.h", "shim/elf_dynamic.h"],
    include_dirs=["shim"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-unused-parameter"],
    extra_link_args=["-ldl", "-lpthread"],
)

setup(
    ext_modules=[preload],
    cffi_modules=["shim/bridge_build.py:ffibuilder"],
    cmdclass={"build_ext": BuildShim},
)

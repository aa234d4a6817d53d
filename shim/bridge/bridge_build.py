# SPDX-License-Identifier: Apache-2.0
"""cffi build script for stage 2, the bridge from the C shim into Python.

Built in embedding mode as the extension `clc.runtime._bridge`, once per CPython minor version, with
no DT_NEEDED on libpython: in a Python host the symbols come from the running interpreter; in
a C host stage 1 has loaded libpython with RTLD_GLOBAL first and calls clc_bridge_start().
"""

import pathlib
import runpy

import cffi

__all__ = ["ffibuilder"]

HERE = pathlib.Path(__file__).resolve().parent
SHIM = HERE.parent  # clc_abi.h, the contract, is shared with stage 1


# clc_abi.h as cffi reads it: the same declarations clc/_abi_generated.py's layouts come from.
_abi_declarations = runpy.run_path(str(SHIM / "abi_gen.py"))["declarations"]


ffibuilder = cffi.FFI()
ffibuilder.cdef(_abi_declarations((SHIM / "clc_abi.h").read_text()))
# For the engine (clc.runtime._bridge.lib): the time its timed dispatchers took, by kernel id.
ffibuilder.cdef("int clc_bridge_dispatch_time(uint32_t kernel_id, uint64_t out[3]);")
# For the exit entry: the program's C stdio flushed.
ffibuilder.cdef("int clc_bridge_flush_stdio(void);")
ffibuilder.embedding_api(
    """
    int clc_bridge_decide(const clc_kernel_query *q, clc_decision *out);
    int clc_bridge_module(const clc_module_event *ev);
    int clc_bridge_exit(void);
    """
)

# The C side (clc_bridge_start, which runs before any Python exists, and the per-launch entry
# through Python's C API) is shim/bridge/bridge.c.
_SOURCE = (HERE / "bridge.c").read_text()

ffibuilder.set_source("clc.runtime._bridge", _SOURCE, include_dirs=[str(SHIM)],
                      py_limited_api=False)

# Runs once, inside the traced program, at the first call. CLC_PKG_PATH (from the shim's copy of
# clc-run's settings) is appended (never prepended) so that the program's own packages keep
# precedence.
ffibuilder.embedding_init_code(
    """
import ctypes, sys
_get = getattr(ctypes.CDLL(None), "clc_shim_setting", None)
if _get is not None:
    _get.restype = ctypes.c_char_p
    _get.argtypes = [ctypes.c_char_p]
    _path = _get(b"CLC_PKG_PATH")
    _path = _path.decode() if _path else None
    if _path and _path not in sys.path:
        sys.path.append(_path)

from clc.runtime._bridge import ffi, lib
from clc.runtime import bridge_entry

@ffi.def_extern(error=-1)
def clc_bridge_decide(query, out):
    return bridge_entry.bridge_decide(ffi, query, out)

@ffi.def_extern(error=-1)
def clc_bridge_module(event):
    return bridge_entry.bridge_module(ffi, event)

# The end of a C or C++ program (its atexit), whose interpreter clc started and never
# finalizes: the program's C stdio is flushed first and Python's stdout and stderr last
# (bridge_entry.bridge_exit), so that what the exit hooks print reaches a pipe or a file, after what
# the program printed.
@ffi.def_extern(error=-1)
def clc_bridge_exit():
    lib.clc_bridge_flush_stdio()
    return bridge_entry.bridge_exit()
"""
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

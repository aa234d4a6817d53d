# SPDX-License-Identifier: Apache-2.0
"""Itanium C++ name demangling through libstdc++'s own `__cxa_demangle`.

Standard library only: this is imported wherever captures are read, and the C++ runtime is
on every machine that runs CUDA programs, so calling it beats shipping a demangler.
"""

import ctypes
import ctypes.util
import functools

__all__ = ["demangle"]


def _load():
    """Return (__cxa_demangle, free), or None when the C++ runtime cannot be loaded."""
    try:
        cxx = ctypes.CDLL("libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        cxa = cxx.__cxa_demangle
        free = libc.free
    except (OSError, AttributeError):
        return None
    cxa.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                    ctypes.POINTER(ctypes.c_int)]
    # c_void_p, not c_char_p: the buffer is malloc'd by the callee and must be freed by us,
    # which c_char_p's automatic conversion to bytes would make impossible.
    cxa.restype = ctypes.c_void_p
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    return cxa, free


_FUNCS = _load()


def demangle(name):
    """The demangled form of `name`; `name` itself when it is not mangled or cannot be."""
    # Only Itanium mangled names start with _Z; __cxa_demangle would also "demangle" plain
    # identifiers such as `i` (to `int`) as if they were type encodings. The type check comes
    # before the cache because lru_cache raises on unhashable arguments.
    if _FUNCS is None or not isinstance(name, str) or not name.startswith("_Z"):
        return name
    return _demangle(name)


@functools.lru_cache(maxsize=65536)
def _demangle(name):
    cxa, free = _FUNCS
    try:
        raw = name.encode("utf-8", "surrogateescape")
    except UnicodeError:
        return name
    if b"\0" in raw:
        return name
    status = ctypes.c_int(-1)
    out = cxa(raw, None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        if status.value != 0:
            return name
        return ctypes.string_at(out).decode("utf-8", "replace")
    finally:
        free(out)

# SPDX-License-Identifier: Apache-2.0
"""Stage 1's exports, called from the program's Python: the sealed settings, messages into the
capture, every kernel's counts, a wrapped kernel's counts. Each is typed from
clc.abi.SHIM_EXPORTS, generated from clc_abi.h's prototypes. Outside a
process clc started (no stage 1), each says so: {} / False / [].

Standard library only: it runs in the traced program's Python."""

import collections
import ctypes

from clc import abi

__all__ = ["shim_function", "shim_settings", "shim_message", "shim_kernel_counts",
           "shim_wrap_stats"]

# How each C type of SHIM_EXPORTS crosses: pointers to the ABI's structs as bytes buffers.
_CTYPES = {
    "void": None,
    "int": ctypes.c_int,
    "const char *": ctypes.c_char_p,
    "clc_kernel_counts *": ctypes.c_void_p,
    "const clc_rec_wrap_stats *": ctypes.c_void_p,
}

_functions = {}


def shim_function(name):
    """Stage 1's export `name` (one of abi.SHIM_EXPORTS) typed as the header declares it, or
    None where the process has no stage 1."""
    fn = _functions.get(name)
    if fn is None:
        result, params = abi.SHIM_EXPORTS[name]
        try:
            fn = getattr(ctypes.CDLL(None), name)
        except (OSError, AttributeError):
            return None
        fn.restype = _CTYPES[result]
        fn.argtypes = [_CTYPES[p] for p in params]
        _functions[name] = fn
    return fn


# The wrap disk cache's place, shared place and cap, as clc-run sealed them
# (clc.wrapping.cache.CACHE_SETTINGS, not imported: a program that wraps nothing loads no
# part of clc.wrapping).
CACHE_SETTINGS = ("CLC_CACHE_DIR", "CLC_CACHE_SHARED_DIR", "CLC_CACHE_MAX_BYTES")
_READ = ("CLC_POLICY", "CLC_TENANT", "CLC_VERBOSE", *CACHE_SETTINGS)


def shim_settings():
    """The settings clc-run gave the program, as the shim copied them when the process started
    (a program's own changes to its environment do not reach them)."""
    fn = shim_function("clc_shim_setting")
    if fn is None:
        return {}
    out = {}
    for key in _READ:
        value = fn(key.encode())
        if value is not None:
            out[key] = value.decode("utf-8", "replace")
    return out


def shim_message(level, text):
    """A message into the capture (on stderr from warnings up); False without stage 1."""
    fn = shim_function("clc_shim_message")
    if fn is None:
        return False
    fn(level, text.encode("utf-8", "replace"))
    return True


KernelCounts = collections.namedtuple("KernelCounts", abi.KERNEL_COUNTS_FIELDS.names)


def shim_kernel_counts(most=65536):
    """Every kernel's counts so far (KernelCounts), [] without stage 1."""
    fn = shim_function("clc_shim_kernel_counts")
    if fn is None:
        return []
    rows = ctypes.create_string_buffer(abi.KERNEL_COUNTS.size * most)
    n = fn(rows, most)
    return [KernelCounts(*row) for row in
            abi.KERNEL_COUNTS.iter_unpack(rows.raw[:n * abi.KERNEL_COUNTS.size])]


def shim_wrap_stats(kernel, wrapper, counts):
    """A WRAP_STATS record of a wrapped kernel's counts ({blocks, threads, skipped,
    max_resident, share_sms}); False without stage 1."""
    fn = shim_function("clc_shim_wrap_stats")
    if fn is None:
        return False
    body = abi.REC_WRAP_STATS_BODY.pack(
        0, *(int(counts.get(name, 0)) for name in abi.REC_WRAP_STATS_FIELDS.names[1:]))
    fn(body, kernel.encode("utf-8", "replace"), wrapper.encode("utf-8", "replace"))
    return True

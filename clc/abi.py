# SPDX-License-Identifier: Apache-2.0
"""The constants and record layouts shared with the C shim.

They are written once, in shim/clc_abi.h (and shim/slurm/clc_slurm.h for the Slurm plugin's
names): the build turns the headers into clc._abi_generated (shim/abi_gen.py), whose every
name this module gives under the same name, the header's less its CLC_ prefix. What is here is
what Python makes of them: the layouts as struct.Struct formats, field pickers, name maps.
"""

import dataclasses
import re
import struct

try:
    import clc._abi_generated as _h
except ModuleNotFoundError as e:
    if e.name != "clc._abi_generated":
        raise
    raise ImportError("clc/_abi_generated.py is missing: it is made from shim/clc_abi.h when clc "
                      "is built (in a source checkout: pip install -e .)") from None
from clc._abi_generated import *  # noqa: E402,F403  (every constant, under the header's name)

# Each C integer type the layouts use, as struct reads it; pointers are read as the 8-byte
# integers they are on LP64.
_CODES = {"uint8_t": "B", "int8_t": "b", "uint16_t": "H", "int16_t": "h", "uint32_t": "I",
          "int32_t": "i", "uint64_t": "Q", "int64_t": "q", "pointer": "Q"}


def _layout(name, keep=()):
    """The header's struct `name` as a little-endian struct.Struct: an array is one format item
    (3I), a char array bytes (16s), a reserved member pad bytes unless `keep` names it. The
    header promises explicit layouts with no implicit padding: one that has some is refused."""
    size, members = _h.LAYOUTS[name]
    fmt, at = "<", 0
    for member, offset, ctype, count in members:
        if offset != at:
            raise ValueError(f"{name}: {offset - at} bytes of implicit padding before {member}")
        if ctype == "char":
            fmt += f"{count}s"
            at += count
            continue
        if ctype not in _CODES:
            raise ValueError(f"{name}.{member}: a {ctype} has no struct format")
        code = _CODES[ctype]
        width = struct.calcsize("<" + code) * count
        if member.startswith("reserved") and member not in keep:
            fmt += f"{width}x"
        else:
            fmt += f"{count if count > 1 else ''}{code}"
        at += width
    if at != size:
        raise ValueError(f"{name}: {size - at} bytes of implicit padding at its end")
    return struct.Struct(fmt)


def _members(name, keep=()):
    """The members `_layout(name, keep)` reads, in order."""
    return tuple(m[0] for m in _h.LAYOUTS[name][1] if not m[0].startswith("reserved") or
                 m[0] in keep)


class Fields:
    """A layout's fields by name, in the header's order: `at[name]` is a field's offset,
    `picker(*names)` a Struct that reads those fields (in layout order) out of a buffer so laid
    out, skipping the rest. One name per format item: an array (3I) is one field, pad bytes (x)
    have none."""

    def __init__(self, layout, names):
        items, at = [], 0
        for count, code in re.findall(r"(\d*)([a-zA-Z?])", layout.format[1:]):
            n = int(count or 1)
            size = n if code in "xs" else n * struct.calcsize("<" + code)
            if code != "x":
                items.append((at, f"{count}{code}", size))
            at += size
        if len(items) != len(names):
            raise ValueError(f"{len(names)} names for {len(items)} fields of {layout.format}")
        self.layout = layout
        self.names = tuple(names)
        self._items = dict(zip(names, items))
        self.at = {name: item[0] for name, item in self._items.items()}

    def picker(self, *names):
        fmt, pos = "<", 0
        for name in names:
            at, code, size = self._items[name]
            if at < pos:
                raise ValueError(f"{name} comes before the fields picked ahead of it")
            fmt += (f"{at - pos}x" if at > pos else "") + code
            pos = at + size
        return struct.Struct(fmt)


def _fields(name):
    return Fields(_layout(name), _members(name))


ACTION_NAMES = {_h.ACTION_ALLOW: "allow", _h.ACTION_DENY: "deny", _h.ACTION_REPLACE: "replace",
                _h.ACTION_CONFINE: "confine"}


def confine_word(kind, value, last=False, deny=False):
    """clc_outcome.replacement of a confined kernel (ACTION_CONFINE)."""
    return kind << _h.CONFINE_KIND_SHIFT | value | (_h.CONFINE_LAST if last else 0) | \
        (_h.CONFINE_DENY if deny else 0)


# clc_stats, the wrapped library's counts: per stripe blocks and threads (then padding), then
# skipped, max_resident, share_sms; CLC_STATS_BYTES with the stripes' alignment.
STATS = struct.Struct("<" + f"QQ{_h.STATS_STRIPE_BYTES - 16}x" * _h.STATS_STRIPES + "QII")
# The ABI's layouts as the device runtime (clc/wrapping/device/runtime.cu) is compiled with them.
DEVICE_DEFINES = (f"-DCLC_STATS_STRIPES={_h.STATS_STRIPES}",
                  f"-DCLC_STATS_STRIPE_BYTES={_h.STATS_STRIPE_BYTES}",
                  f"-DCLC_STATS_BYTES={_h.STATS_BYTES}", f"-DCLC_SLOT_BYTES={_h.SLOT_BYTES}",
                  f"-DCLC_GRAPH_SEQ={_h.GRAPH_SEQ:#x}u")
REPLACEMENT = _layout("clc_replacement")
LAUNCH_ARG = _layout("clc_launch_arg")
# Each field's offset, as the splice reads them from the wrapped kernel's __clc_arg parameter.
LAUNCH_ARG_AT = _fields("clc_launch_arg").at

# The sealed settings' keys, each once (CLC_SETTING_KEYS).
SETTINGS = frozenset(_h.SETTING_KEYS.decode().split())

# clc_kernel_query; the launch's argument bytes follow it
KERNEL_QUERY = _layout("clc_kernel_query")
KERNEL_QUERY_FIELDS = _fields("clc_kernel_query")
# Where clc_kernel_query.args_status lies (a CLC_ARGS_* value, < 256: read as one byte).
QUERY_ARGS_STATUS_AT = KERNEL_QUERY_FIELDS.at["args_status"]
PARAM_INFO = _layout("clc_param_info")

# The decider's messages (clc/runtime/decider.py answers the shim's shim/deciding/decider.c)
DECIDE_REQUEST = _layout("clc_decide_request")
DECIDE_REPLY = _layout("clc_decide_reply")

# clc_decision: n_clauses, mode, clauses[MAX_CLAUSES] (three clc_range, a clc_outcome), fallback
_RANGES = struct.Struct("<" + _layout("clc_range").format[1:] * 3)
OUTCOME = _layout("clc_outcome")
# The counters as a dataclass's fields, each an int from 0: what Python's kernel rows (the
# reader's KERNEL_STATS, the report's rows) take them from.
Counters = dataclasses.make_dataclass(
    "Counters", [(name, int, 0) for name in _h.KERNEL_COUNTERS], slots=True)
Counters.__module__ = __name__
Counters.__doc__ = "A kernel's counters (KERNEL_COUNTERS), each from 0."
KERNEL_COUNTS = _layout("clc_kernel_counts")
KERNEL_COUNTS_FIELDS = _fields("clc_kernel_counts")


def _outcome_bytes(o):
    return OUTCOME.pack(o.action, o.flags, o.error, o.rule, o.replacement)


def pack_decision(clauses, fallback, mode=_h.MODE_CACHED):
    """clc_decision's bytes: `clauses` as (grid_blocks, block_threads, shared_mem, outcome),
    each range a (lo, hi) pair, and outcomes with action, flags, error, rule and replacement."""
    if len(clauses) > _h.MAX_CLAUSES:
        raise ValueError(f"{len(clauses)} shape clauses, at most {_h.MAX_CLAUSES} fit")
    parts = [struct.pack("<II", len(clauses), mode)]
    for grid, block, shared, outcome in clauses:
        parts.append(_RANGES.pack(*grid, *block, *shared) + _outcome_bytes(outcome))
    parts.append(bytes((_h.MAX_CLAUSES - len(clauses)) * (_RANGES.size + OUTCOME.size)))
    parts.append(_outcome_bytes(fallback))
    return b"".join(parts)


ENTRY_NAMES = {
    _h.ENTRY_LAUNCH: "cuLaunchKernel",
    _h.ENTRY_LAUNCH_EX: "cuLaunchKernelEx",
    _h.ENTRY_LAUNCH_COOPERATIVE: "cuLaunchCooperativeKernel",
    _h.ENTRY_GRAPH_ADD_NODE: "cuGraphAddKernelNode",
    _h.ENTRY_GRAPH_NODE_SET: "cuGraphKernelNodeSetParams",
    _h.ENTRY_GRAPH_EXEC_NODE_SET: "cuGraphExecKernelNodeSetParams",
}
LOAD_NAMES = {
    _h.LOAD_MODULE_LOAD: "cuModuleLoad", _h.LOAD_MODULE_LOAD_DATA: "cuModuleLoadData",
    _h.LOAD_MODULE_LOAD_DATA_EX: "cuModuleLoadDataEx",
    _h.LOAD_MODULE_LOAD_FATBINARY: "cuModuleLoadFatBinary",
    _h.LOAD_LIBRARY_LOAD_DATA: "cuLibraryLoadData",
    _h.LOAD_LIBRARY_LOAD_FILE: "cuLibraryLoadFromFile", _h.LOAD_MODULE_UNLOAD: "cuModuleUnload",
    _h.LOAD_LIBRARY_UNLOAD: "cuLibraryUnload", _h.LOAD_CONTEXT_DESTROYED: "context destroyed",
    _h.LOAD_KERNEL_FORGOTTEN: "kernel forgotten",
}
IMAGE_NAMES = {_h.IMAGE_UNKNOWN: "unknown", _h.IMAGE_FATBIN_WRAPPER: "fatbin-wrapper",
               _h.IMAGE_FATBIN: "fatbin", _h.IMAGE_ELF: "cubin", _h.IMAGE_PTX: "ptx",
               _h.IMAGE_FILE: "file"}
TIMING_SOURCES = {_h.TIMING_EVENTS: "events", _h.TIMING_CUPTI: "cupti"}

# clc_capture_header, whose reserved words are skipped
CAPTURE_HEADER = _layout("clc_capture_header")
# clc_record_header: type, reserved, size (a reader checks that reserved is 0)
RECORD_HEADER = _layout("clc_record_header", keep=("reserved",))
# Every record's body, clc_rec_X as REC_X_BODY: a record added to the header has its Struct.
_BODIES = {"REC_" + name[len("clc_rec_"):].upper() + "_BODY": _layout(name)
           for name in _h.LAYOUTS if name.startswith("clc_rec_")}
globals().update(_BODIES)
REC_LAUNCH_FIELDS = _fields("clc_rec_launch")
REC_KERNEL_STATS_FIELDS = _fields("clc_rec_kernel_stats")
REC_WRAP_STATS_FIELDS = _fields("clc_rec_wrap_stats")
# clc_counts_copy: a COUNTS record's copy, then `length` bytes of KERNEL_STATS and RULE_STATS
# records (PAD where unused)
COUNTS_COPY = _layout("clc_counts_copy")
COUNTS_COPY_FIELDS = _fields("clc_counts_copy")

__all__ = [
    *_h.__all__, *_BODIES,
    "Fields", "ACTION_NAMES", "confine_word", "STATS", "DEVICE_DEFINES", "REPLACEMENT",
    "LAUNCH_ARG", "LAUNCH_ARG_AT", "SETTINGS", "KERNEL_QUERY", "KERNEL_QUERY_FIELDS",
    "PARAM_INFO", "DECIDE_REQUEST", "DECIDE_REPLY", "OUTCOME", "Counters", "KERNEL_COUNTS",
    "KERNEL_COUNTS_FIELDS", "pack_decision", "ENTRY_NAMES", "LOAD_NAMES", "IMAGE_NAMES",
    "TIMING_SOURCES", "CAPTURE_HEADER", "RECORD_HEADER", "REC_LAUNCH_FIELDS",
    "REC_KERNEL_STATS_FIELDS", "REC_WRAP_STATS_FIELDS", "COUNTS_COPY", "COUNTS_COPY_FIELDS",
]

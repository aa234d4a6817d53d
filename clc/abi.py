# SPDX-License-Identifier: Apache-2.0
"""The constants and record layouts shared with the C shim.

The C side is shim/clc_abi.h; tests/unit/test_abi.py parses it and checks that every value and
size here matches. Change both together.
"""

import dataclasses
import re
import struct

__all__ = [
    "SETTINGS_NAME", "SETTINGS_VAR", "SETTING_KEYS", "SETTINGS", "STATUS_START", "STATUS_EXEC",
    "STATUS_EXEC_FAILED", "STATUS_SPAWN", "STATUS_CAPTURE", "STATUS_CAPTURE_FAILED",
    "STATUS_NO_SETTINGS", "FALLBACK_VAR", "Fields",
    "KERNEL_QUERY_FIELDS",
    "REC_LAUNCH_FIELDS", "KERNEL_COUNTERS", "Counters", "KERNEL_COUNTS_FIELDS",
    "REC_KERNEL_STATS_FIELDS",
    "ACTION_ALLOW", "ACTION_DENY", "ACTION_REPLACE", "ACTION_CONFINE", "ACTION_NAMES",
    "CONFINE_KIND_SHIFT", "CONFINE_DENY", "CONFINE_LAST", "confine_word",
    "FLAG_RECORD", "FLAG_TIME",
    "RULE_DEFAULT", "RULE_ON_ERROR", "MAX_CLAUSES", "MODE_CACHED", "MODE_PER_SHAPE",
    "MODE_EVERY_LAUNCH",
    "ENTRY_LAUNCH", "ENTRY_LAUNCH_EX", "ENTRY_LAUNCH_COOPERATIVE", "ENTRY_GRAPH_ADD_NODE",
    "ENTRY_GRAPH_NODE_SET", "ENTRY_GRAPH_EXEC_NODE_SET", "ENTRY_PTSZ", "ENTRY_NAMES",
    "LOAD_NAMES", "IMAGE_NAMES", "LOAD_CONTEXT_DESTROYED", "LOAD_KERNEL_FORGOTTEN",
    "CTX_DESTROYED", "KERNEL_UNCACHED",
    "CAPTURE_MAGIC", "CAPTURE_VERSION", "CAPTURE_HEADER", "RECORD_HEADER",
    "REC_PAD", "REC_PROCESS", "REC_POLICY", "REC_KERNEL", "REC_LAUNCH", "REC_TIMING", "REC_MODULE",
    "REC_KERNEL_STATS", "REC_MESSAGE", "REC_END", "END_EXIT", "END_QUICK", "END_SIGNAL",
    "END_TABLE_FULL", "END_TRUNCATED", "REC_RULE_STATS", "DENIED_RECORDED",
    "REC_PROCESS_BODY", "REC_KERNEL_BODY", "REC_LAUNCH_BODY", "REC_TIMING_BODY",
    "REC_MODULE_BODY", "REC_KERNEL_STATS_BODY", "REC_MESSAGE_BODY", "REC_END_BODY",
    "REC_RULE_STATS_BODY", "REC_WRAP_STATS", "REC_WRAP_STATS_BODY", "REC_WRAP_STATS_FIELDS",
    "REC_COUNTS", "REC_COUNTS_BODY", "COUNTS_COPY", "COUNTS_COPY_FIELDS",
    "LAUNCH_TIMED", "SHIM_EXPORTS",
    "TIMING_EVENTS", "TIMING_CUPTI", "TIMING_SOURCES", "REC_HOLD", "REC_RUN", "REC_HOLD_BODY",
    "REC_DEVICE", "REC_DEVICE_BODY",
    "HOLD_BUSY",
    "HOLD_NO_BOARD", "HOLD_FLOOR", "HOLD_SHARED",
    "MSG_INFO", "MSG_WARNING", "MSG_ERROR",
    "CAP_NONE", "CAP_SHARE", "CAP_SMS", "REPLACE_LOOPED", "REPLACE_SLOT", "SLOT_BYTES",
    "GRAPH_SLOTS", "GRAPH_SEQ", "OCCUPANCY_WAYS", "STATS_STRIPES", "STATS_STRIPE_BYTES",
    "STATS_BYTES", "STATS", "DEVICE_DEFINES",
    "REPLACEMENT", "LAUNCH_ARG", "LAUNCH_ARG_AT", "KERNEL_QUERY", "PARAM_INFO", "ARGS_OK",
    "ARGS_NONE",
    "ARGS_NULL_ENTRY", "ARGS_BAD_EXTRA", "ARGS_NO_MEMORY", "ARGS_NO_LAYOUT", "ASK_KERNEL",
    "ASK_PROGRAM",
    "DECIDE_MAGIC", "DECIDE_MAX_NAME", "DECIDE_MAX_TEXT", "DECIDE_OK", "DECIDE_ENGINE",
    "DECIDE_FAILED",
    "DECIDE_REQUEST", "DECIDE_REPLY", "pack_decision", "OUTCOME", "KERNEL_COUNTS",
    "SLOW_HOOK_NS",
]

ACTION_ALLOW = 0
ACTION_DENY = 1
ACTION_REPLACE = 2
ACTION_CONFINE = 3
ACTION_NAMES = {ACTION_ALLOW: "allow", ACTION_DENY: "deny", ACTION_REPLACE: "replace",
                ACTION_CONFINE: "confine"}

FLAG_RECORD = 1
FLAG_TIME = 2

RULE_DEFAULT = -1
RULE_ON_ERROR = -2

MAX_CLAUSES = 8

MODE_CACHED = 0
MODE_PER_SHAPE = 1
MODE_EVERY_LAUNCH = 2

# clc_replacement (CLC_ACTION_REPLACE): how the shim launches a wrapped kernel
CAP_NONE = 0
CAP_SHARE = 1
CAP_SMS = 2
REPLACE_LOOPED = 1
REPLACE_SLOT = 2
SLOT_BYTES = 32
# clc_outcome.replacement of ACTION_CONFINE: the share, CAP_SHARE (millionths of the SMs) or
# CAP_SMS (a count) at CONFINE_KIND_SHIFT over the value; CONFINE_LAST takes the device's last
# SMs rather than its first; CONFINE_DENY: a launch that cannot be confined is denied.
CONFINE_KIND_SHIFT = 32
CONFINE_LAST = 0x10000000000
CONFINE_DENY = 0x20000000000


def confine_word(kind, value, last=False, deny=False):
    """clc_outcome.replacement of a confined kernel (ACTION_CONFINE)."""
    return kind << CONFINE_KIND_SHIFT | value | (CONFINE_LAST if last else 0) | \
        (CONFINE_DENY if deny else 0)
GRAPH_SLOTS = 4096
GRAPH_SEQ = 0xFFFFFFFF
OCCUPANCY_WAYS = 4
# clc_stats, the wrapped library's counts: per stripe blocks and threads (then padding), then
# skipped, max_resident, share_sms; CLC_STATS_BYTES with the stripes' alignment.
STATS_STRIPES = 32
STATS_STRIPE_BYTES = 128
STATS_BYTES = 4224
STATS = struct.Struct("<" + f"QQ{STATS_STRIPE_BYTES - 16}x" * STATS_STRIPES + "QII")
# The ABI's layouts as the device runtime (clc/wrapping/device/runtime.cu) is compiled with them.
DEVICE_DEFINES = (f"-DCLC_STATS_STRIPES={STATS_STRIPES}",
                  f"-DCLC_STATS_STRIPE_BYTES={STATS_STRIPE_BYTES}",
                  f"-DCLC_STATS_BYTES={STATS_BYTES}", f"-DCLC_SLOT_BYTES={SLOT_BYTES}",
                  f"-DCLC_GRAPH_SEQ={GRAPH_SEQ:#x}u")
# function, slots, cursor, arg_offset, n_slots, n_params, cap_kind, cap_value, sm_count, flags,
# occupancy[4]
REPLACEMENT = struct.Struct("<QQQQIIIIII4Q")
# slot, grid[3], seq, share_sms, batch
LAUNCH_ARG = struct.Struct("<Q3IIII")
# Each field's offset, as the splice reads them from the wrapped kernel's __clc_arg parameter.
LAUNCH_ARG_AT = {"slot": 0, "grid": 8, "seq": 20, "share_sms": 24, "batch": 28}



# The sealed settings (clc_abi.h's CLC_SETTING_KEYS): the memfd's name, the variable naming its
# descriptor, every key.
SETTINGS_NAME = b"clc-settings"
SETTINGS_VAR = b"CLC_SETTINGS_FD"
# In the environment beside LD_PRELOAD, and sealed: "ON_ERROR STATUS" for a process of the run
# whose shim finds no settings.
FALLBACK_VAR = b"CLC_FALLBACK"
SETTING_KEYS = (
    b"CLC_BRIDGE CLC_CACHE_DIR CLC_CACHE_MAX_BYTES CLC_CACHE_SHARED_DIR "
    b"CLC_CAPTURE_MAX_BYTES CLC_CUPTI CLC_DECIDER CLC_DECIDER_PID CLC_DECIDER_UID "
    b"CLC_FALLBACK CLC_FORCE CLC_LAUNCH_COUNT CLC_LAUNCH_SKIP CLC_ON_ERROR CLC_OUTPUT "
    b"CLC_PKG_PATH CLC_POLICY CLC_POLICY_CONFINES "
    b"CLC_POLICY_DECIDERS CLC_POLICY_PROGRAM CLC_POLICY_WRAPS CLC_PRIORITY "
    b"CLC_PRIORITY_BOARD CLC_PRIORITY_FLOOR CLC_PRIORITY_HELD_SHARE CLC_PRIORITY_IDLE_MS "
    b"CLC_PRIORITY_NAME CLC_PRIORITY_RUN_AHEAD CLC_PRIORITY_TRUST CLC_PYTHON_EXE "
    b"CLC_PYTHON_LIB CLC_PYTHON_VERSION CLC_ROOT_PID CLC_RUN CLC_STATUS CLC_SYS_PATH "
    b"CLC_TENANT CLC_TIMING CLC_VERBOSE"
)
SETTINGS = frozenset(SETTING_KEYS.decode().split())

# The status socket's words (clc_abi.h's CLC_STATUS_*): what each process tells clc-run.
STATUS_START = b"start"
STATUS_EXEC = b"exec"
STATUS_EXEC_FAILED = b"exec-failed"
STATUS_SPAWN = b"spawn"
STATUS_CAPTURE = b"capture"
STATUS_CAPTURE_FAILED = b"capture-failed"
STATUS_NO_SETTINGS = b"no-settings"


class Fields:
    """A layout's fields by name, in the header's order (tests/unit/test_abi.py holds them to
    its member names and offsets): `at[name]` is a field's offset, `picker(*names)` a Struct
    that reads those fields (in layout order) out of a buffer so laid out, skipping the rest.
    One name per format item: an array (3I) is one field, pad bytes (x) have none."""

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


# clc_kernel_query; the launch's argument bytes follow it
KERNEL_QUERY = struct.Struct("<QQiIIIQ3I3IIIQQQQIII4x")
KERNEL_QUERY_FIELDS = Fields(KERNEL_QUERY, (
    "handle", "ctx", "device", "entry", "kernel_id", "args_status", "name", "grid", "block",
    "shared_mem", "tid", "stream", "params", "extra", "layout", "n_params", "args_size",
    "question"))
# Where clc_kernel_query.args_status lies (a CLC_ARGS_* value, < 256: read as one byte).
QUERY_ARGS_STATUS_AT = KERNEL_QUERY_FIELDS.at["args_status"]
PARAM_INFO = struct.Struct("<II")  # clc_param_info: offset, size
ARGS_OK = 0
ARGS_NONE = 1
ARGS_NULL_ENTRY = 2
ARGS_BAD_EXTRA = 3
ARGS_NO_MEMORY = 4
ARGS_NO_LAYOUT = 5
# clc_kernel_query.question and clc_decide_request.question: a kernel, or the process as a whole
ASK_KERNEL = 0
ASK_PROGRAM = 1

# The decider's messages (clc/runtime/decider.py answers the shim's shim/decider.c)
DECIDE_MAGIC = 0x44434C43
DECIDE_MAX_NAME = 65536
DECIDE_MAX_TEXT = 4096
DECIDE_OK = 0
DECIDE_ENGINE = 1
DECIDE_FAILED = 2
DECIDE_REQUEST = struct.Struct("<IiIII4x")  # magic, device, name_size, seq, question
DECIDE_REPLY = struct.Struct("<IIII")  # magic, status, text_size, seq

# clc_decision: n_clauses, mode, clauses[MAX_CLAUSES] (three clc_range, a clc_outcome), fallback
_RANGES = struct.Struct("<6Q")
OUTCOME = struct.Struct("<IIiiQ")  # clc_outcome: action, flags, error, rule, replacement
# CLC_KERNEL_COUNTERS: a kernel's counters, in the order both layouts that hold them keep them
KERNEL_COUNTERS = ("launches", "denied", "failed", "recorded", "timed", "graph_nodes", "gpu_ns")
# The counters as a dataclass's fields, each an int from 0: what Python's kernel rows (the
# reader's KERNEL_STATS, the report's rows) take them from.
Counters = dataclasses.make_dataclass(
    "Counters", [(name, int, 0) for name in KERNEL_COUNTERS], slots=True)
Counters.__module__ = __name__
Counters.__doc__ = "A kernel's counters (KERNEL_COUNTERS), each from 0."
KERNEL_COUNTS = struct.Struct("<IiQQ" + "Q" * len(KERNEL_COUNTERS) + "I4x")  # clc_kernel_counts
KERNEL_COUNTS_FIELDS = Fields(
    KERNEL_COUNTS, ("kernel_id", "device", "handle", "ctx", *KERNEL_COUNTERS, "confined_sms"))
SLOW_HOOK_NS = 1_000_000


def _outcome_bytes(o):
    return OUTCOME.pack(o.action, o.flags, o.error, o.rule, o.replacement)


def pack_decision(clauses, fallback, mode=MODE_CACHED):
    """clc_decision's bytes: `clauses` as (grid_blocks, block_threads, shared_mem, outcome),
    each range a (lo, hi) pair, and outcomes with action, flags, error, rule and replacement."""
    if len(clauses) > MAX_CLAUSES:
        raise ValueError(f"{len(clauses)} shape clauses, at most {MAX_CLAUSES} fit")
    parts = [struct.pack("<II", len(clauses), mode)]
    for grid, block, shared, outcome in clauses:
        parts.append(_RANGES.pack(*grid, *block, *shared) + _outcome_bytes(outcome))
    parts.append(bytes((MAX_CLAUSES - len(clauses)) * (_RANGES.size + OUTCOME.size)))
    parts.append(_outcome_bytes(fallback))
    return b"".join(parts)


ENTRY_LAUNCH = 0
ENTRY_LAUNCH_EX = 1
ENTRY_LAUNCH_COOPERATIVE = 2
ENTRY_GRAPH_ADD_NODE = 3
ENTRY_GRAPH_NODE_SET = 4
ENTRY_GRAPH_EXEC_NODE_SET = 5
ENTRY_PTSZ = 16
ENTRY_NAMES = {
    ENTRY_LAUNCH: "cuLaunchKernel",
    ENTRY_LAUNCH_EX: "cuLaunchKernelEx",
    ENTRY_LAUNCH_COOPERATIVE: "cuLaunchCooperativeKernel",
    ENTRY_GRAPH_ADD_NODE: "cuGraphAddKernelNode",
    ENTRY_GRAPH_NODE_SET: "cuGraphKernelNodeSetParams",
    ENTRY_GRAPH_EXEC_NODE_SET: "cuGraphExecKernelNodeSetParams",
}

# CLC_LOAD_* and CLC_IMAGE_*
LOAD_NAMES = {
    1: "cuModuleLoad", 2: "cuModuleLoadData", 3: "cuModuleLoadDataEx",
    4: "cuModuleLoadFatBinary", 5: "cuLibraryLoadData", 6: "cuLibraryLoadFromFile",
    7: "cuModuleUnload", 8: "cuLibraryUnload", 9: "context destroyed", 10: "kernel forgotten",
}
LOAD_CONTEXT_DESTROYED = 9
LOAD_KERNEL_FORGOTTEN = 10
KERNEL_UNCACHED = 0xFFFFFFFF
CTX_DESTROYED = 1 << 63
IMAGE_NAMES = {0: "unknown", 1: "fatbin-wrapper", 2: "fatbin", 3: "cubin", 4: "ptx", 5: "file"}

CAPTURE_MAGIC = b"CLCCAPT1"
CAPTURE_VERSION = 4

# clc_capture_header: magic, version, header_size, pid, ppid, start_monotonic_ns,
# start_realtime_ns, reserved[2]
CAPTURE_HEADER = struct.Struct("<8sIIIIQQ16x")
# clc_record_header: type, reserved, size
RECORD_HEADER = struct.Struct("<HHI")

REC_PAD = 0
REC_PROCESS = 1
REC_POLICY = 2
REC_KERNEL = 3
REC_LAUNCH = 4
REC_TIMING = 5
REC_MODULE = 6
REC_KERNEL_STATS = 7
REC_MESSAGE = 8
REC_END = 9
REC_RULE_STATS = 10
REC_HOLD = 11
REC_RUN = 12
REC_WRAP_STATS = 13
REC_DEVICE = 14
REC_COUNTS = 15
DENIED_RECORDED = 16

REC_PROCESS_BODY = struct.Struct("<II")  # pid, ppid
REC_KERNEL_BODY = struct.Struct("<IiQQQ")  # kernel_id, device, handle, ctx, t_ns
REC_DEVICE_BODY = struct.Struct("<i4x16s")  # device, uuid (cuDeviceGetUuid_v2's 16 bytes)
REC_LAUNCH_BODY = struct.Struct("<QQQII3I3IIIIiiI")
REC_LAUNCH_FIELDS = Fields(REC_LAUNCH_BODY, (
    "seq", "t_ns", "stream", "kernel_id", "entry", "grid", "block", "shared_mem", "tid",
    "action", "rule", "result", "flags"))
LAUNCH_TIMED = 1  # clc_rec_launch.flags
REC_TIMING_BODY = struct.Struct("<QIIQ")  # seq, kernel_id, source, gpu_ns
TIMING_EVENTS = 0  # clc_rec_timing.source: CUDA events around the launch
TIMING_CUPTI = 1  # CUPTI's kernel activity record
TIMING_SOURCES = {TIMING_EVENTS: "events", TIMING_CUPTI: "cupti"}
# t_ns, api, image_kind, handle, image_ptr, image_size, preserved, result
REC_MODULE_BODY = struct.Struct("<QIIQQQIi")
REC_KERNEL_STATS_BODY = struct.Struct("<II" + "Q" * len(KERNEL_COUNTERS))
REC_KERNEL_STATS_FIELDS = Fields(REC_KERNEL_STATS_BODY,
                                 ("kernel_id", "confined_sms", *KERNEL_COUNTERS))
REC_MESSAGE_BODY = struct.Struct("<I4xQ")  # level, t_ns
# t_ns, dropped, write_lost_bytes, capped_bytes, write_errno, how, status, flags, undecided
REC_END_BODY = struct.Struct("<QQQQiIiIQ")
# clc_rec_end.how and .flags
END_EXIT = 0
END_QUICK = 1
END_SIGNAL = 2
END_TABLE_FULL = 1
END_TRUNCATED = 2
REC_RULE_STATS_BODY = struct.Struct("<i4xQ")  # rule, denied
REC_HOLD_BODY = struct.Struct("<QQQiI")  # t_ns, held_ns, lag_ns, device, why
REC_WRAP_STATS_BODY = struct.Struct("<QQQQII")
REC_WRAP_STATS_FIELDS = Fields(REC_WRAP_STATS_BODY, (
    "t_ns", "blocks", "threads", "skipped", "max_resident", "share_sms"))
REC_COUNTS_BODY = struct.Struct("<I4x")  # capacity (bytes of each of the two copies after it)
# clc_counts_copy: a COUNTS record's copy, then `length` bytes of KERNEL_STATS and RULE_STATS
# records (PAD where unused)
COUNTS_COPY = struct.Struct("<QQQQQQiIII")
COUNTS_COPY_FIELDS = Fields(COUNTS_COPY, (
    "generation", "t_ns", "dropped", "write_lost_bytes", "capped_bytes", "undecided",
    "write_errno", "flags", "length", "checksum"))
# clc_rec_hold.why: the hold's cause, with HOLD_FLOOR when the floor let it go
HOLD_BUSY = 0
HOLD_NO_BOARD = 1
HOLD_FLOOR = 16
HOLD_SHARED = 32  # not a wait: a busy period whose launches ran on the held share

MSG_INFO = 0
MSG_WARNING = 1
MSG_ERROR = 2


# Stage 1's exports the engine calls through ctypes (clc_abi.h's prototypes): name ->
# (result, parameters), each type as the header spells it.
SHIM_EXPORTS = {
    "clc_shim_setting": ("const char *", ("const char *",)),
    "clc_shim_message": ("void", ("int", "const char *")),
    "clc_shim_kernel_counts": ("int", ("clc_kernel_counts *", "int")),
    "clc_shim_wrap_stats": ("void", ("const clc_rec_wrap_stats *", "const char *", "const char *")),
}

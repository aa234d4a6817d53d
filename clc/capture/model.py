# SPDX-License-Identifier: Apache-2.0
"""What a capture holds once read: the Capture and its kernels, launches, loads, messages,
holds, wrapped kernels' counts and per-kernel counts (clc.capture.reader makes them)."""

import errno
import os
from dataclasses import dataclass, field
from typing import Optional

from clc import abi

__all__ = ["LEVEL_NAMES", "Kernel", "LaunchRecord", "Module", "Message", "Hold", "WrapStats",
           "KernelStatsRecord", "Capture", "error_name", "stand_in", "gpu_uuid"]

LEVEL_NAMES = {abi.MSG_INFO: "info", abi.MSG_WARNING: "warning", abi.MSG_ERROR: "error"}


@dataclass(slots=True)
class Kernel:
    kernel_id: int
    device: int
    handle: int
    ctx: int
    t_ns: int
    mangled: str
    name: str


@dataclass(slots=True)
class LaunchRecord:
    seq: int
    t_ns: int
    stream: int
    kernel_id: int
    entry: int
    grid: tuple
    block: tuple
    shared_mem: int
    tid: int
    action: int
    rule: int
    result: int
    gpu_ns: Optional[int]
    entry_name: str
    ptsz: bool
    action_name: str


@dataclass(slots=True)
class Module:
    t_ns: int
    api: int
    image_kind: int
    handle: int
    image_ptr: int
    image_size: int
    preserved: int
    result: int
    api_name: str
    image_name: str
    path: Optional[str]


@dataclass(slots=True)
class Message:
    level: int
    t_ns: int
    text: str
    level_name: str


@dataclass(slots=True)
class Hold:
    """A best-effort launch held while a latency-critical process was busy on its GPU."""

    t_ns: int  # CLOCK_MONOTONIC when the hold began
    held_ns: int
    lag_ns: int  # from the latency-critical GPU going busy to this hold; 0: unknown
    device: int
    no_board: bool  # held because the board could not be read: down to the floor
    by_floor: bool  # let go by the floor, the GPU still busy
    # not a wait: a busy period whose launches ran on the class's held_share of the SMs
    shared: bool = False
    # not a wait: a period whose launches left the class's reserve of the SMs free
    reserve: bool = False
    # not a wait: a period in which a latency-critical class's slo kept the launches below the
    # class's own bounds (a smaller share or none, a shorter run-ahead)
    slo: bool = False


@dataclass(slots=True)
class WrapStats:
    """A wrapped kernel's counts, as its wrapper counted them on the GPU over the process."""

    kernel: str  # the kernel's name (demangled)
    wrapper: str  # the wrapper's file and parameters ("sm_share share=0.25")
    t_ns: int
    blocks: int  # virtual blocks run
    threads: int  # the threads of those blocks
    skipped: int  # virtual blocks the deadline wrapper skipped
    max_resident: int  # the most blocks resident at once
    share_sms: int  # sm_share: the SMs of its share; 0: none


@dataclass(slots=True, kw_only=True)
class KernelStatsRecord(abi.Counters):
    """A kernel's counts (abi.KERNEL_COUNTERS) in a capture: its KERNEL_STATS record in the
    newest valid copy of the COUNTS records, or what its other records say when it has none."""

    kernel_id: int
    # the SMs of the green context its launches ran on (sm_share by a green context); 0: none
    confined_sms: int = 0
    # True when the capture holds no counts of this kernel (the process died within a second
    # of its first launch, the counts found no room, or the file refused them) and they were
    # derived from the records that exist: launches it did not record are missing.
    partial: bool = False


@dataclass
class Capture:
    path: str
    pid: int
    ppid: int
    start_monotonic_ns: int
    start_realtime_ns: int
    command: str = ""
    policy: Optional[dict] = None
    # What clc-run said of the run (its RUN record): "tenant", "uid", "labels" ({name: value})
    run: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    # device ordinal (Kernel.device) -> the GPU's UUID ("GPU-..."), from the DEVICE records
    devices: dict = field(default_factory=dict)
    # Every LAUNCH record sorted by seq (read_capture), or None: scan_capture leaves them in
    # the file, for launch_stream.
    launches: Optional[list] = field(default_factory=list)
    modules: list = field(default_factory=list)
    messages: list = field(default_factory=list)
    holds: list = field(default_factory=list)  # Hold records (a best-effort process's)
    wrap_stats: list = field(default_factory=list)  # WrapStats, one per wrapped kernel
    stats: dict = field(default_factory=dict)
    # rule -> launches it denied: the RULE_STATS records, else counted from denied LAUNCH
    # records (rule_stats_partial).
    rule_stats: dict = field(default_factory=dict)
    rule_stats_partial: bool = False
    # kernel_id -> the rules named by its LAUNCH records
    kernel_rules: dict = field(default_factory=dict)
    # LAUNCH records of launches clc could not decide (the policy's on_error decided them:
    # such launches are always recorded)
    on_error_launches: int = 0
    launch_records: int = 0
    timing_records: int = 0
    # TIMING records by where their GPU times came from (abi.TIMING_SOURCES' names; an unknown
    # source by its number)
    timing_sources: dict = field(default_factory=dict)
    # An END record follows every other record: the process wrote its counts after its last
    # launch (a crash or SIGKILL leaves the last snapshot of its counts, and no END after them).
    complete: bool = False
    dropped: int = 0
    write_lost_bytes: int = 0
    capped_bytes: int = 0
    write_errno: int = 0
    # How the process left, from its last END record: abi.END_EXIT, END_QUICK (_exit,
    # exit_group) or END_SIGNAL (exit_status is then the signal's number); None without END.
    end_how: Optional[int] = None
    exit_status: int = 0
    # The decision table filled (later kernels were decided at each launch), and records the
    # capture keeps were dropped at its size cap.
    table_full: bool = False
    truncated: bool = False
    # Launches on_error decided with no kernel to count them under (the driver was not placed,
    # or a signal handler launched a kernel not decided yet while clc worked on its thread).
    undecided_launches: int = 0
    # Bytes after the last whole record: a record cut short, or what is not records at all.
    trailing_bytes: int = 0
    header_size: int = abi.CAPTURE_HEADER.size

    @property
    def stats_partial(self):
        """True when some kernel's counts are derived rather than the shim's own."""
        return any(s.partial for s in self.stats.values())

    @property
    def partial(self):
        """True when records of the run are missing from the file: launch and timing records
        dropped at the size cap, for a full buffer or to write errors, or records every capture
        keeps (kernels, loads, messages) dropped at the cap. The counts are the shim's all the
        same (see stats_partial); the launches listed and the GPU times' distribution lack
        what was dropped."""
        return bool(self.capped_bytes or self.dropped or self.write_lost_bytes or self.truncated)

    def kernel(self, kernel_id):
        """The kernel of a record's kernel_id; a stand-in when its KERNEL record is missing."""
        k = self.kernels.get(kernel_id)
        return k if k is not None else stand_in(kernel_id)

    def rule_name(self, rule):
        """The policy's name for a LAUNCH or RULE_STATS record's `rule`."""
        if rule == abi.RULE_DEFAULT:
            return "default"
        if rule == abi.RULE_ON_ERROR:
            return "on_error"
        policy = self.policy if isinstance(self.policy, dict) else {}
        rules = policy.get("rules") if isinstance(policy.get("rules"), list) else []
        if 0 <= rule < len(rules) and isinstance(rules[rule], dict):
            name = rules[rule].get("name")
            if isinstance(name, str) and name:
                return name
        # Python hooks from --hooks files are numbered after the rules (clc-run writes their
        # names into the policy it passes on).
        hooks = policy.get("hook_deciders")
        if isinstance(hooks, list) and 0 <= rule - len(rules) < len(hooks):
            return f"hook {hooks[rule - len(rules)]}"
        return f"rule {rule}"


def error_name(code):
    """'ENOSPC (No space left on device)' for an errno value."""
    name = errno.errorcode.get(code, f"errno {code}")
    return f"{name} ({os.strerror(code)})"


def stand_in(kernel_id):
    return Kernel(kernel_id, -1, 0, 0, 0, "", f"<unknown kernel {kernel_id}>")


def gpu_uuid(raw):
    """cuDeviceGetUuid's 16 bytes as nvidia-smi and DCGM write a GPU's UUID:
    GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


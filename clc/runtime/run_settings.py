# SPDX-License-Identifier: Apache-2.0
"""What clc-run seals for the program besides the policy and the preload's own settings
(clc.runtime.shim): the capture's cap and the run's record (tenant, user, labels), where GPU
times come from, what the policy asks of the shim, and the priority class."""

import json
import os

from clc.errors import EXIT_USAGE, ClcError
from clc.runtime.cupti import timing_settings
from clc.runtime.priority_class import priority_settings

__all__ = ["DEFAULT_CAPTURE_LIMIT", "smallest_capture_limit", "count_deciders", "run_record",
           "check_capture_limit", "run_settings"]

DEFAULT_CAPTURE_LIMIT = 2 << 30
# What a capture holds besides launches, at the least: its header, the process's command line,
# a few kernels, loads and messages, its counts and the END record (the shim sets room aside for
# them).
_CAPTURE_FLOOR = 64 << 10
_RULE_STATS_RECORD = 24  # a RULE_STATS record, header included (shim/clc_abi.h)
_RECORD_ROOM = 16  # a record's header, and its padding


def smallest_capture_limit(policy_json, deciders):
    """The smallest --capture-limit a capture of this policy fits in: it holds the policy, and
    its counts have a RULE_STATS slot per decider that may deny, in each of their two copies."""
    return _CAPTURE_FLOOR + len(policy_json.encode()) + (deciders + 3) * 2 * _RULE_STATS_RECORD


def count_deciders(policy_json):
    """How many deciders the program's policy has: its rules and the --hooks files' hooks."""
    compiled = json.loads(policy_json)
    return len(compiled.get("rules", [])) + len(compiled.get("hook_deciders", []))


def run_record(environ, labels, launch_skip=0, launch_count=None):
    """The run's record in every capture (CLC_RUN): its tenant, this user, the --label pairs,
    and the window of launches whose records each process writes, when one was given."""
    record = {"tenant": environ.get("CLC_TENANT", ""), "uid": os.getuid(),
              "labels": dict(labels)}
    if launch_skip or launch_count:
        record["launch_window"] = {"skip": launch_skip, "count": launch_count}
    return json.dumps(record, separators=(",", ":"))


def check_capture_limit(limit, policy_json, deciders, run_json):
    """ClcError (EXIT_USAGE) when a --capture-limit other than 0 cannot hold the policy, the
    run's record and the exit counts."""
    floor = smallest_capture_limit(policy_json, deciders) + _RECORD_ROOM + \
        len(run_json.encode())
    if limit and limit < floor:
        raise ClcError(f"--capture-limit {limit} is smaller than the smallest "
                       f"capture of this policy ({floor} bytes: the policy itself, the "
                       f"process and room for its counts); give at least "
                       f"{-(-floor // 1024)}K, or 0 for no limit", EXIT_USAGE)


def run_settings(policy, argv, deciders, run_json, capture_limit, timing, cupti, tenant,
                 verbose):
    """The settings above, for the program `argv` under `policy` (its `deciders`)."""
    settings = {"CLC_CAPTURE_MAX_BYTES": str(capture_limit), "CLC_RUN": run_json}
    settings.update(timing_settings(timing, cupti))
    settings["CLC_POLICY_PROGRAM"] = "1" if policy.program_wide else "0"
    # held_share and reserve confine launches as sm_share does: contexts the program makes
    # (cuCtxCreate) are then green contexts of their own too
    held_share = policy.priority is not None and any(
        c.held_share or c.reserve for c in policy.priority.classes)
    settings["CLC_POLICY_CONFINES"] = "1" if policy.confines or held_share else "0"
    settings["CLC_POLICY_DECIDERS"] = str(deciders)
    settings.update(priority_settings(policy, argv, tenant, verbose))
    return settings

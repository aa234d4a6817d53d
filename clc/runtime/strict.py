# SPDX-License-Identifier: Apache-2.0
"""--strict: a run whose program exits 0 fails when what clc saw cannot vouch for it, with the
reasons in one line; and a process of the run whose shim has no settings gets deny where the
policy names no on_error."""

import os

from clc.runtime.run_report import dropped, unseen
from clc.words import count

__all__ = ["fallback_on_error", "strict_violation"]


def fallback_on_error(policy, strict):
    """What the launches of a process of the run whose shim has no settings get: the policy's
    on_error, or deny under --strict where the policy does not say."""
    return policy.on_error if policy.on_error_given or not strict else "deny"


def strict_violation(files, captures, run):
    """Why a --strict run fails, or None: launches denied or left to on_error, a process that
    ran without the shim, a capture that is missing, cannot be read, is incomplete or lost
    records, or a decision table that filled."""
    parts = []
    unshimmed = unseen(run)
    if unshimmed:
        parts.append(f"{count(len(unshimmed), 'process', 'processes')} ran without clc's "
                     f"shim ({unshimmed[0].path})")
    if run.dropped:
        parts.append(f"the run's account of its processes is incomplete ({dropped(run)})")
    if run.unsettled:
        n = len(run.unsettled)
        parts.append(f"{count(n, 'process', 'processes')} ran without clc-run's settings "
                     f"({min(run.unsettled.items())[1]})")
    if not files:
        if not run.started:
            parts.append("clc's shim never started in the program")
    elif captures is None:
        parts.append("the capture cannot be read")
    read = {os.path.abspath(c.path) for c in captures or ()}
    missing = sorted(p for p in run.captures if os.path.abspath(p) not in read)
    missing += sorted(run.failed_captures)
    if captures is not None and missing:
        parts.append(f"{count(len(missing), 'capture')} of the run missing or unwritable "
                     f"({missing[0]})")
    captures = captures or []
    denied = sum(sum(c.rule_stats.values()) if c.rule_stats
                 else sum(s.denied for s in c.stats.values()) for c in captures)
    on_error = sum(c.on_error_launches for c in captures)
    lost = [c for c in captures
            if not c.complete or c.dropped or c.capped_bytes or c.write_lost_bytes
            or c.truncated]
    full = [c for c in captures if c.table_full]
    if lost:
        parts.append(f"{count(len(lost), 'capture')} incomplete or short of records "
                     f"({lost[0].path}), so what they hold cannot vouch for the run")
    if full:
        parts.append(f"the decision table filled in {count(len(full), 'process', 'processes')} "
                     f"({full[0].path})")
    if denied:
        parts.append(f"{count(denied, 'launch', 'launches')} or graph-node call"
                     f"{'s' if denied != 1 else ''} denied")
    if on_error:
        parts.append(f"{count(on_error, 'launch', 'launches')} fell to on_error")
    return " and ".join(parts) or None

# SPDX-License-Identifier: Apache-2.0
"""The text summary, in the manner of `nsys stats`: the captures, a per-kernel table, the
launches each rule denied, holds, wrapped kernels, the messages."""

from clc import abi
from clc.capture.cells import aligned, ending, shown, size, truncate, wrap
from clc.capture.columns import Frame, summary_columns
from clc.capture.reader import error_name
from clc.capture.rows import TotalRow, View, rule_rows, view_rows
from clc.words import count

__all__ = ["summary"]

_TIMING_SOURCE_WORDS = {"cupti": "CUPTI kernel records (the kernels' own start and end)",
                        "events": "CUDA events recorded around each launch"}


def _capture_lines(cap):
    parts = [f"pid {cap.pid}", f"command: {shown(cap.command) or '?'}",
             "complete" if cap.complete else "INCOMPLETE"]
    if cap.partial:
        parts.append("PARTIAL")
    if ending(cap):
        parts.append(ending(cap))
    notes = []
    if cap.dropped:
        parts.append(f"{count(cap.dropped, 'record')} dropped (buffers full)")
    if cap.write_lost_bytes:
        why = f" ({error_name(cap.write_errno)})" if cap.write_errno else ""
        parts.append(f"{size(cap.write_lost_bytes)} lost to write errors{why}")
    if cap.capped_bytes:
        parts.append(f"{size(cap.capped_bytes)} not written (size cap reached: "
                     "clc-run --capture-limit)")
    if cap.trailing_bytes:
        parts.append(f"last {size(cap.trailing_bytes)} not whole records")
    if cap.truncated:
        parts.append("records it must keep dropped at the size cap (--capture-limit too small)")
    if cap.table_full:
        parts.append("decision table full")
    if cap.undecided_launches:
        parts.append(f"{count(cap.undecided_launches, 'launch', 'launches')} decided by "
                     f"on_error without a kernel "
                     f"(the driver could not be placed, or a signal handler launched a kernel "
                     f"not decided yet)")
    if not cap.complete:
        notes.append("no END record after its last records: the program was killed (SIGKILL), "
                     "or its capture could not be written (full disk?); its counts are the last "
                     "it wrote (every second); see what clc printed while it ran")
    if cap.partial:
        notes.append("partial: records of the run are missing from the file (said above); its "
                     "counts are whole, but the JSON and the timeline lack the missing launches, "
                     "and the GPU times' Min, Median, Max and P99 the missing timings")
    return [f"{cap.path}: " + ", ".join(parts)] + [wrap(n, "  ") for n in notes]


def _hold_line(cap):
    waits = [h for h in cap.holds if not h.shared and not h.reserve and not h.slo]
    parts = []
    if waits:
        total = sum(h.held_ns for h in waits)
        longest = max(h.held_ns for h in waits)
        parts.append(f"{count(len(waits), 'hold')}, {total / 1e6:.1f} ms in all, longest "
                     f"{longest / 1e6:.2f} ms")
    # the records that are periods, not waits: which flag, what was done in them, what a
    # period is called
    for flag, done, period in (("shared", "on its held share", "busy period"),
                               ("reserve", "left the reserve free", "period"),
                               ("slo", "kept below its bounds for a service's slo", "period")):
        periods = [h for h in cap.holds if getattr(h, flag)]
        if periods:
            total = sum(h.held_ns for h in periods)
            parts.append(f"{done} in {count(len(periods), period)}, {total / 1e6:.1f} ms in all")
    text = f"pid {cap.pid}: " + ", ".join(parts)
    lags = sorted(h.lag_ns for h in cap.holds if h.lag_ns)
    if lags:
        text += f", held {lags[len(lags) // 2] / 1e3:.0f} us (median) after the GPU went busy"
    by_floor = sum(h.by_floor for h in waits)
    if by_floor:
        text += f", {by_floor} let go by the floor"
    no_board = sum(h.no_board for h in waits)
    if no_board:
        text += f", {no_board} because the board could not be read"
    return text


# (count, its noun or None, the words after)
_WRAP_WORDS = (("blocks", "block", " run"), ("threads", "thread", ""),
               ("skipped", "block", " skipped"), ("max_resident", None, " most resident"),
               ("share_sms", "SM", ""))


def _wrap_line(w):
    """A wrapped kernel's counts in words."""
    parts = [(count(getattr(w, key), noun) if noun else str(getattr(w, key))) + after
             for key, noun, after in _WRAP_WORDS if key != "share_sms" or w.share_sms]
    return f"{shown(w.kernel)} ({shown(w.wrapper)}): " + ", ".join(parts)


def summary(captures, view=None):
    """A text report in the manner of `nsys stats`: the captures, a per-kernel table, the
    launches each rule denied, the messages.

    The table's columns (clc.capture.columns), per kernel (merged over contexts and processes
    by mangled name):

    - Launches: direct launches the program made (cuLaunchKernel, cuLaunchKernelEx,
      cuLaunchCooperativeKernel), denied and failed ones included.
    - Graph nodes: kernel nodes added to or changed in CUDA graphs (cuGraphAddKernelNode and
      the setters). They are not launches: a graph's replays do not pass through clc.
    - Denied: launches and graph-node calls the policy refused.
    - Failed: launches and graph-node calls the driver itself refused (denies not counted).
      Launches - Denied - Failed is what reached the GPU.
    - Recorded: LAUNCH records written to the capture, for launches and graph-node calls;
      besides those the policy asks to record, the first abi.DENIED_RECORDED denied launches
      of each kernel are recorded for audit. At most Launches + Graph nodes.
    - GPU total (ms), Share (%), GPU mean (us): over the launches timed; the share of all
      kernels' GPU time. Min, the view's percentiles (Median, P99 by default), Max (us): of
      the timed launches' GPU times (their TIMING records), by nearest rank; Std dev (us):
      their sample standard deviation.

    view (a View) picks the kernels shown, their order and the names' width; the Total row
    adds up the kernels shown.

    A `*` marks counts derived from the records because the capture holds none of the
    shim's for the kernel: launches it did not record are missing from them.
    """
    captures = list(captures)
    if not captures:
        return "no captures\n"
    out = [ln for cap in captures for ln in _capture_lines(cap)]
    out.append("")
    view = view or View()
    rows, every = view_rows(captures, view)
    out += _kernel_table(rows, every, view)
    for section in (_notes(rows), _confined(rows, view.width), _denied_by_rule(captures),
                    _held(captures), _wrapped(captures), _on_error(captures),
                    _messages(captures)):
        if section:
            out.append("")
            out += section
    return "\n".join(out) + "\n"


def _kernel_table(rows, every, view):
    """The per-kernel table and its Total row, under the column headers."""
    columns = summary_columns(view.percentiles)
    frame = Frame(total_ns=sum(r.gpu_ns for r in every), width=view.width)
    label = count(len(rows), "kernel")
    if view.filtered:
        label += f" of {len(every)}"
    total = TotalRow.of(rows, f"Total ({label})")
    table = [[c.text(c.value(r, frame), r, frame) for c in columns] for r in (*rows, total)]
    headers = [c.header for c in columns]
    line, rule = aligned(headers, table)
    return [line(headers), rule, *(line(t) for t in table[:-1]), rule, line(table[-1])]


def _notes(rows):
    """What the table's figures mean, said only where a row could look inconsistent
    without it."""
    notes = []
    if any(r.graph_nodes for r in rows):
        notes.append("Graph nodes: kernel nodes made or changed in CUDA graphs, not launches. "
                     "Denied, Failed and Recorded count graph nodes as well as launches.")
    if any(r.denied for r in rows):
        notes.append(f"Recorded: LAUNCH records written. The first {abi.DENIED_RECORDED} "
                     "denied launches of each kernel are recorded for audit, even when the "
                     "policy records nothing.")
    sources = {}  # of the kernels shown only, as the table's totals
    for r in rows:
        for source, n in r.sources.items():
            sources[source] = sources.get(source, 0) + n
    if sources:
        notes.append("GPU times: " + ", ".join(
            f"{_TIMING_SOURCE_WORDS.get(s, f'source {s}')} ({count(n, 'launch', 'launches')})"
            for s, n in sources.items()) + ".")
    if any(r.partial for r in rows):
        notes.append("* partial: the capture holds no counts of the kernel (see above); its "
                     "counts come from its records alone, so launches that were not recorded "
                     "are missing.")
    return [wrap(n) for n in notes]


def _confined(rows, width):
    confined = [r for r in rows if r.confined_sms]
    if not confined:
        return []
    out = [f"Confined by a green context (sm_share): {count(len(confined), 'kernel')}"]
    for r in confined:
        sms = " or ".join(str(n) for n in sorted(r.confined_sms))
        out.append(f"  {sms} SMs  {truncate(r.name, width)}")
    return out


def _denied_by_rule(captures):
    rows = rule_rows(captures)
    if not rows:
        return []
    cells = [[f"{n}{'*' if p else ''}", name] for name, n, p in rows]
    line, rule = aligned(["Denied", "Rule"], cells)
    out = ["Denied by rule:", "  " + line(["Denied", "Rule"]), "  " + rule]
    out.extend("  " + line(c) for c in cells)
    if any(p for _, _, p in rows):
        out.append(wrap("* counted from the recorded denied launches only: the capture "
                        "has no per-rule counts", "  "))
    return out


def _held(captures):
    held = [cap for cap in captures if cap.holds]
    if not held:
        return []
    return ["Held (best-effort, while latency-critical work was busy on its GPU):",
            *("  " + _hold_line(cap) for cap in held)]


def _wrapped(captures):
    wrapped = [w for cap in captures for w in cap.wrap_stats]
    if not wrapped:
        return []
    return ["Wrapped kernels (their wrappers' counts on the GPU):",
            *("  " + _wrap_line(w) for w in wrapped)]


def _on_error(captures):
    on_error = sum(c.on_error_launches for c in captures)
    if not on_error:
        return []
    return [wrap(f"Fell to on_error: {count(on_error, 'launch', 'launches')} "
                 "that clc could not decide got the policy's on_error (the messages "
                 "say why).")]


def _messages(captures):
    counts = {}
    for cap in captures:
        for m in cap.messages:
            key = (m.level_name, m.text)
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return []
    out = ["Messages:"]
    for (level, text), n in counts.items():
        # A traceback was shown when it happened and stays in the JSON report.
        first, _, rest = text.partition("\n")
        more = " (traceback: clc report --format json)" if rest else ""
        out.append(f"  {level}: {shown(first)}{more}" + (f" (x{n})" if n > 1 else ""))
    return out

# SPDX-License-Identifier: Apache-2.0
"""A latency-critical inference service beside a best-effort training job on one GPU.

    python3 benchmarks/bench_colocate.py [--rounds 3] [--requests 400] [--gap-ms 10]
                                         [--configs NAME,...] [--run-ahead 32] [--json OUT]

The two programs are examples/colocate.py's `infer` (a transformer forward pass in bf16, one
request every 10 ms, each request's latency from its arrival) and `train` (a transformer
training step repeated). Configurations, every one by default (--configs picks some):

    alone           the inference alone; the training alone, for a window as long
    shared          both; no MPS, so the two contexts time-slice
    mps             both, clients of one MPS server
    mps-50, mps-25  both under MPS, the training's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 50 or 25
    mps-prio        both under MPS, the training a client of below-normal priority
                    (CUDA_MPS_CLIENT_PRIORITY=1: MPS ranks its streams below the inference's)
    clc-S-P         both under MPS, the training held by clc to a share S (0.5, 0.25) of the
                    SMs, its whole process (scope: program), placed P (first, last)
    priority        both under clc-run with a priority policy: the inference latency-critical,
                    the training best-effort (its launches wait while the inference is busy,
                    floor 0.1); no MPS
    priority-mps    the same under MPS
    priority-share-mps  under MPS, the training's held launches run on a quarter of the SMs
                    (held_share 0.25, the device's last SMs) instead of waiting
    shared-two      three programs, no MPS: the inference, a second inference service of its
                    own rhythm (a request every 7 ms), and the training
    priority-two    the same three under the priority policy: the first service
                    latency-critical, the second service and the training best-effort (one
                    class, tenant batch); the second service's latencies are a table of their own

Rounds are interleaved (every configuration once per round: those under MPS first, with a
daemon of the round's own, then the others) so that drift in the machine falls on all alike;
each figure is the median over rounds, with the rounds' range beside it. Per configuration:
the inference's p50, p99 and max latency and its p99 relative to alone; the training's steps
per second inside the inference's window and relative to alone. On another H200 host the same
inference alone measured 4.8 to 7.5 ms p50 between runs: only interleaved rounds rank
configurations.

Needs PyTorch and a GPU; MPS configurations are left out, said, where the MPS daemon does not
start. Exit status 0 when every run worked.
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_launch import device_name, find_script  # noqa: E402
from benchmarks.mps import MpsUnavailable, mps_daemon  # noqa: E402

SCRIPT = REPO / "examples" / "colocate.py"
SHARES = (0.5, 0.25)
PLACES = ("first", "last")
CONFIGS = ("alone", "shared", "mps", "mps-50", "mps-25", "mps-prio",
           *(f"clc-{s}-{p}" for s in SHARES for p in PLACES), "priority", "priority-mps",
           "priority-share-mps", "shared-two", "priority-two")
PRIORITY_CONFIGS = ("priority", "priority-mps", "priority-share-mps", "priority-two")
SECOND_GAP_MS = 7.0
PRIORITY_FLOOR = 0.1
PRIORITY_RUN_AHEAD = 32
PRIORITY_HELD_SHARE = 0.25
READY_TIMEOUT_S = 300


# ---- what the programs print --------------------------------------------------------------

def percentile(values, q):
    """The q-th quantile (0..1) of values, interpolated between the two nearest ranks."""
    if not values:
        raise ValueError("no values")
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def parse_infer(stdout):
    """(window start, window end, latencies in ms) from colocate.py infer's output."""
    window = latencies = None
    for line in stdout.splitlines():
        if line.startswith("window "):
            _, a, b = line.split()
            window = (float(a), float(b))
        elif line.startswith("latencies_ms "):
            latencies = [float(v) for v in line.split(" ", 1)[1].split(",") if v]
    if window is None or not latencies:
        raise ValueError(f"no window or latencies in the inference's output: {stdout[-500:]!r}")
    return window[0], window[1], latencies


def parse_train(stdout):
    """The training's step end times (time.monotonic() seconds)."""
    for line in stdout.splitlines():
        if line.startswith("steps"):
            rest = line[len("steps"):].strip()
            return [float(v) for v in rest.split(",") if v]
    raise ValueError(f"no steps line in the training's output: {stdout[-500:]!r}")


def rate_in_window(ends, start, end):
    """Steps per second that ended inside [start, end]."""
    if end <= start:
        raise ValueError(f"an empty window ({start} .. {end})")
    return sum(1 for t in ends if start <= t <= end) / (end - start)


def latency_row(latencies):
    return {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
            "max": max(latencies), "n": len(latencies)}


def summarize(rounds):
    """rounds: [{config: {"infer": latency_row or None, "train": steps/s or None}}] ->
    {config: {field: (median, min, max)}}, with p99 and steps/s relative to alone."""
    out = {}
    for config in rounds[0]:
        fields = {}
        for key in ("p50", "p99", "max"):
            vals = [r[config]["infer"][key] for r in rounds if r[config].get("infer")]
            if vals:
                fields[key] = (statistics.median(vals), min(vals), max(vals))
        for key in ("p50", "p99", "max"):
            vals = [r[config]["second"][key] for r in rounds if r[config].get("second")]
            if vals:
                fields[f"second_{key}"] = (statistics.median(vals), min(vals), max(vals))
        vals = [r[config]["train"] for r in rounds if r[config].get("train") is not None]
        if vals:
            fields["steps_s"] = (statistics.median(vals), min(vals), max(vals))
        out[config] = fields
    alone = out.get("alone", {})
    for fields in out.values():
        if "p99" in fields and "p99" in alone:
            fields["p99_vs_alone"] = fields["p99"][0] / alone["p99"][0]
        if "second_p99" in fields and "p99" in alone:
            fields["second_p99_vs_alone"] = fields["second_p99"][0] / alone["p99"][0]
        if "steps_s" in fields and "steps_s" in alone:
            fields["train_vs_alone"] = fields["steps_s"][0] / alone["steps_s"][0]
    return out


def priority_policy(path, board, held_share=0, run_ahead=PRIORITY_RUN_AHEAD):
    """The inference (tenant serving) latency-critical, the training (tenant batch)
    best-effort: its held launches wait (down to the floor), or with held_share run on that
    share of the SMs; at most run_ahead launches queued per stream."""
    held = f"      held_share: {held_share}\n" if held_share else \
        f"      floor: {PRIORITY_FLOOR}\n"
    held += f"      run_ahead: {run_ahead}\n"
    Path(path).write_text(
        "# SPDX-License-Identifier: Apache-2.0\nversion: 1\ndefault: allow\npriority:\n"
        f"  board: {board}\n  classes:\n"
        "    - name: serving\n      class: latency-critical\n      match: {tenant: serving}\n"
        "    - name: training\n      class: best-effort\n      match: {tenant: batch}\n"
        + held)
    return Path(path)


def hold_row(capture):
    """How often and how long the best-effort training was held, from its capture: holds,
    held ms in all, the median microseconds from the inference going busy to a hold."""
    from clc.capture.reader import read_captures
    from clc.cli.run import capture_files
    holds = [h for cap in read_captures(capture_files(capture)) for h in cap.holds]
    lags = [h.lag_ns / 1e3 for h in holds if h.lag_ns]
    return {"holds": len(holds), "held_ms": sum(h.held_ns for h in holds) / 1e6,
            "by_floor": sum(h.by_floor for h in holds),
            "lag_us_p50": statistics.median(lags) if lags else None}


def share_policy(path, share, place):
    """A policy holding the whole training process to `share` of the SMs, placed `place`."""
    Path(path).write_text(
        "# SPDX-License-Identifier: Apache-2.0\nversion: 1\ndefault: allow\nrules:\n"
        "  - name: best-effort-share\n    action: wrap\n    wrapper: sm_share\n"
        f"    params: {{share: {share}, place: {place}, scope: program}}\n"
        "    on_unwrappable: allow\n")
    return Path(path)


# ---- running them -------------------------------------------------------------------------

def _start(argv, env, stdin=False):
    """The program, its standard output a pipe read line by line; its standard error a file
    (a pipe nobody drains while it runs could fill and stop it)."""
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.PIPE if stdin else None,
                            stdout=subprocess.PIPE, stderr=err, text=True,
                            env={**os.environ, **env})
    proc.err = err
    return proc


def _stderr(proc):
    proc.err.seek(0)
    return proc.err.read()[-2000:]


def _wait_ready(proc, what):
    """Reads the program's output up to its `ready` line; a program that is not ready within
    READY_TIMEOUT_S is killed (a watchdog: a silent program would block the read)."""
    watchdog = threading.Timer(READY_TIMEOUT_S, proc.kill)
    watchdog.start()
    try:
        for line in proc.stdout:
            if line.strip() == "ready":
                return
    finally:
        watchdog.cancel()
    proc.wait()
    raise RuntimeError(f"{what} exited {proc.returncode} before it was ready (killed after "
                       f"{READY_TIMEOUT_S} s when it is -9): {_stderr(proc)}")


def _stop_train(proc):
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the training exited {proc.returncode}: {_stderr(proc)}")
    return parse_train(out)


def _go(proc):
    """Starts an inference's requests (the line it waits for once ready)."""
    proc.stdin.write("go\n")
    proc.stdin.flush()


def _finish_infer(proc, what):
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} exited {proc.returncode}: {_stderr(proc)}")
    return parse_infer(out)


def _reap(*procs):
    """Kills and waits for whichever of the programs still runs: none outlives its
    configuration to skew the next."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def run_alone(args, env):
    """The inference alone, then the training alone over a window as long."""
    infer = train = None
    try:
        infer = _start(args.infer, env, stdin=True)
        _wait_ready(infer, "the inference")
        _go(infer)
        start, end, latencies = _finish_infer(infer, "the inference")
        train = _start(args.train, env)
        _wait_ready(train, "the training")
        t0 = time.monotonic() + 0.5
        time.sleep(0.5 + (end - start))
        t1 = time.monotonic()
        ends = _stop_train(train)
    finally:
        _reap(infer, train)
    return {"infer": latency_row(latencies), "train": rate_in_window(ends, t0, t1)}


def run_together(args, env, train_prefix=(), train_env=None, infer_prefix=(),
                 second_prefix=None):
    """Both at once: the training first, then the inference's requests once both are ready;
    the training's rate is counted inside the inference's window. With second_prefix, a
    second inference service (args.second) runs too, its requests starting with the first's;
    its latencies are `second`."""
    infer = train = second = None
    try:
        train = _start([*train_prefix, *args.train], {**env, **(train_env or {})})
        _wait_ready(train, "the training")
        infer = _start([*infer_prefix, *args.infer], env, stdin=True)
        _wait_ready(infer, "the inference")
        if second_prefix is not None:
            second = _start([*second_prefix, *args.second], env, stdin=True)
            _wait_ready(second, "the second service")
            _go(second)
        _go(infer)
        start, end, latencies = _finish_infer(infer, "the inference")
        if second is not None:
            second_latencies = _finish_infer(second, "the second service")[2]
        ends = _stop_train(train)
    finally:
        _reap(infer, train, second)
    got = {"infer": latency_row(latencies), "train": rate_in_window(ends, start, end)}
    if second is not None:
        got["second"] = latency_row(second_latencies)
    return got


def run_config(name, args, tmp, mps_env):
    if name == "alone":
        return run_alone(args, {})
    if name == "shared":
        return run_together(args, {})
    if name == "shared-two":
        return run_together(args, {}, second_prefix=())
    if name in ("priority", "priority-two"):
        return run_priority(name, args, tmp, {})
    if mps_env is None:
        return None
    if name in ("priority-mps", "priority-share-mps"):
        return run_priority(name, args, tmp, mps_env)
    if name == "mps":
        return run_together(args, mps_env)
    if name == "mps-prio":
        return run_together(args, mps_env, train_env={"CUDA_MPS_CLIENT_PRIORITY": "1"})
    if name.startswith("mps-"):
        return run_together(args, mps_env,
                            train_env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": name[4:]})
    _, share, place = name.split("-")
    policy = share_policy(tmp / f"{name}.yaml", share, place)
    prefix = [args.clc_run, "--policy", policy, "-o", tmp / f"{name}.clc", "--force",
              "--no-report", "-q", "--"]
    return run_together(args, mps_env, train_prefix=prefix)


def run_priority(name, args, tmp, env):
    policy = priority_policy(tmp / f"{name}.yaml", tmp / f"{name}-board",
                             PRIORITY_HELD_SHARE if "share" in name else 0, args.run_ahead)

    def prefix(tenant, program):
        return [args.clc_run, "--policy", policy, "--tenant", tenant, "-o",
                tmp / f"{name}-{program}.clc", "--force", "--no-report", "-q", "--"]
    got = run_together(args, env, train_prefix=prefix("batch", "batch"),
                       infer_prefix=prefix("serving", "serving"),
                       second_prefix=prefix("batch", "second") if name == "priority-two" else None)
    got["held"] = hold_row(tmp / f"{name}-batch.clc")
    if name == "priority-two":
        got["second_held"] = hold_row(tmp / f"{name}-second.clc")
    return got


def measured(r, name, args, tmp, mps_env):
    """One configuration's figures, printed as they come; a run that fails is said and left
    out of the summary (its error kept in the JSON), and the rounds go on."""
    try:
        got = run_config(name, args, tmp, mps_env)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        got = {"error": str(e)}
    print(f"round {r + 1}: {name}: {json.dumps(got)}", flush=True)
    return got


# ---- the report ---------------------------------------------------------------------------

def hold_line(who, held):
    """How a best-effort program was held over the runs (hold_row per run), in words."""
    lags = [h["lag_us_p50"] for h in held if h["lag_us_p50"] is not None]
    return (f"{who} held {statistics.median(h['holds'] for h in held):.0f} times per run "
            f"({statistics.median(h['held_ms'] for h in held):.0f} ms in all, "
            f"{statistics.median(h['by_floor'] for h in held):.0f} let go by the floor); from "
            "the inference going busy to the hold: "
            + (f"{statistics.median(lags):.0f} us (median of the runs' medians)"
               if lags else "-"))


def _cell(field, fmt):
    if field is None:
        return "-"
    med, lo, hi = field
    return f"{med:{fmt}} ({lo:{fmt}} .. {hi:{fmt}})"


def print_table(summary):
    print("| config | inference p50 ms | p99 ms | max ms | p99 vs alone | training steps/s "
          "| vs alone |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, f in summary.items():
        vs = f"{f['p99_vs_alone']:.2f}x" if "p99_vs_alone" in f else "-"
        tv = f"{f['train_vs_alone']:.2f}" if "train_vs_alone" in f else "-"
        print(f"| {name} | {_cell(f.get('p50'), '.2f')} | {_cell(f.get('p99'), '.2f')} | "
              f"{_cell(f.get('max'), '.2f')} | {vs} | {_cell(f.get('steps_s'), '.1f')} | {tv} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--gap-ms", type=float, default=10.0)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--run-ahead", type=int, default=PRIORITY_RUN_AHEAD,
                    help="the priority policy's run_ahead (4 to 256)")
    ap.add_argument("--json", metavar="OUT", help="write every round's figures here")
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {', '.join(unknown)}: choose from "
                 f"{', '.join(CONFIGS)}")
    if not 4 <= args.run_ahead <= 256:
        ap.error(f"--run-ahead {args.run_ahead}: expected 4 to 256")
    if "alone" not in configs:
        configs.insert(0, "alone")  # every figure is relative to it
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("bench_colocate: PyTorch is not installed in this Python")
    args.clc_run = find_script("clc-run")
    if args.clc_run is None and any(c.startswith(("clc", "priority")) for c in configs):
        sys.exit("bench_colocate: clc-run is not installed beside this Python nor on PATH "
                 "(pip install -e . first, or leave out the clc-* configurations)")
    args.infer = [sys.executable, SCRIPT, "infer", "--requests", args.requests,
                  "--gap-ms", args.gap_ms]
    args.second = [sys.executable, SCRIPT, "infer", "--requests",
                   round(args.requests * args.gap_ms / SECOND_GAP_MS), "--gap-ms", SECOND_GAP_MS]
    args.train = [sys.executable, SCRIPT, "train"]
    print(f"device: {device_name()}")
    rounds, note = [], None
    with tempfile.TemporaryDirectory(prefix="clc-colocate-") as tmpdir:
        tmp = Path(tmpdir)
        for r in range(args.rounds):
            row = {}
            # MPS clients and plain contexts do not share a GPU: the MPS configurations run
            # under a daemon of the round's own, the others after it has stopped
            mps_configs = [c for c in configs if c.startswith(("mps", "clc")) or
                           c.endswith("-mps")]
            if mps_configs:
                try:
                    with mps_daemon(tmp, f"mps{r}") as mps_env:
                        for name in mps_configs:
                            row[name] = measured(r, name, args, tmp, mps_env)
                except MpsUnavailable as e:
                    note = str(e)
            for name in configs:
                if name not in mps_configs:
                    row[name] = measured(r, name, args, tmp, None)
            rounds.append({name: row.get(name) or {} for name in configs})
    summary = summarize(rounds)
    print(f"\n{args.rounds} interleaved rounds, {args.requests} requests every "
          f"{args.gap_ms:g} ms; medians (range over rounds)\n")
    print_table(summary)
    seconds = {n: f for n, f in summary.items() if "second_p99" in f}
    if seconds:
        print(f"\nThe second service (a request every {SECOND_GAP_MS:g} ms), its p99 against "
              "the inference's alone:\n")
        print("| config | p50 ms | p99 ms | max ms | p99 vs alone |")
        print("|---|---:|---:|---:|---:|")
        for name, f in seconds.items():
            vs = f"{f['second_p99_vs_alone']:.2f}x" if "second_p99_vs_alone" in f else "-"
            print(f"| {name} | {_cell(f.get('second_p50'), '.2f')} | "
                  f"{_cell(f.get('second_p99'), '.2f')} | {_cell(f.get('second_max'), '.2f')} | "
                  f"{vs} |")
    for name in PRIORITY_CONFIGS:
        for key, who in (("held", "the training"), ("second_held", "the second service")):
            held = [r[name][key] for r in rounds if r.get(name, {}).get(key)]
            if held:
                print(f"\n{name}: {hold_line(who, held)}")
    if note:
        print(f"\nMPS configurations left out: {note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2)
                                   + "\n")


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""A latency-critical inference service beside a best-effort training job on one GPU.

    python3 benchmarks/bench_colocate.py [--pairs PAIR,...] [--configs NAME,...]
                                         [--policy-config NAME=POLICY.yaml[:mps]]...
                                         [--rounds 3] [--requests 400] [--gap-ms 10]
                                         [--quick] [--run-ahead 32] [--json OUT [--force]]
                                         [--gpus N]
    python3 benchmarks/bench_colocate.py --report OUT.json [--report MORE.json]...

The two programs are examples/colocate.py's `infer` (a transformer forward pass in bf16, one
request every 10 ms, each request's latency from its arrival) and `train` (a GPT-2-like
training step repeated). A pair is a service and a training job, SERVICE-TRAINING, every one
of the six by default (--pairs picks some):

    services    sync (each request ends with cudaDeviceSynchronize), copy (with a blocking
                copy of its result to the host), graph (it replays a CUDA graph and waits on
                an event recorded after it)
    trainings   light (GPT-2 12 x 768, batch 16 x 512), heavy (GPT-2 16 x 2048, batch
                16 x 1024), both bf16 autocast; and encoder (a transformer encoder 12 x 768,
                batch 16 x 512, colocate.py's default), named only: sync-encoder, ...

Configurations (--configs picks some, or `all`; the default is every one but mps-prio,
clc-0.5-*, clc-0.25-last, shared-two and priority-two):

    alone           each service alone; each training alone, for a window as long
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
    priority-reserve-mps  under MPS, the training keeps a quarter of the SMs free while the
                    inference lives on the GPU (reserve 0.25); held launches wait
    priority-reserve-share-mps  the same, held launches on an eighth (held_share 0.125)
    priority-slo    no MPS, the inference's class with slo 1.10: the training's held
                    launches wait, its run-ahead stepped down while the slo is missed
    priority-slo-mps  under MPS, the inference's class with slo 1.10: the training's held
                    launches wait, its run-ahead stepped down while the slo is missed
    priority-slo-share-mps  the same with held_share 0.25: the share stepped down (half, a
                    quarter, waits) while the slo is missed
    shared-two      three programs, no MPS: the inference, a second inference service of its
                    own rhythm (a request every 7 ms), and the training
    priority-two    the same three under the priority policy: the first service
                    latency-critical, the second service and the training best-effort (one
                    class, tenant batch); the second service's latencies are a table of their own
    NAME            --policy-config NAME=POLICY.yaml: both programs under clc-run with that
                    policy, the service as tenant `serving` and the training as tenant
                    `batch` (match on them); with `:mps`, under MPS. The policy is checked
                    before anything runs and read once: every round runs the same text.

Rounds are interleaved (every configuration of every pair once per round: those under MPS
first, with a daemon of the round's own, then the others) so that drift in the machine falls
on all alike. A service's alone figures are measured once per round for each service, a
training's for each training, and each pair is compared with the alone runs of its own round.
--gpus N runs the pairs on N GPUs at once (a machine of several): the pairs are dealt out in
turn, each pair's runs and its service's and training's alone runs on one GPU, each GPU with
an MPS daemon of its own per round; the tables name each pair's GPU.
Per pair and configuration: the service's p50, p99 and max latency, its p99 against alone,
the training's steps per second inside the service's window and against alone, each the
median over rounds with the rounds' range; then a summary (a row per pair, a column per
configuration, each cell `p99 vs alone / training vs alone`) and the wall time each
configuration took. On another H200 host the same inference alone measured 4.8 to 7.5 ms p50
between runs: only interleaved rounds rank configurations.

--quick: 200 requests and 1 round (unless --requests or --rounds say otherwise), to check a
machine before a full run. --json OUT writes every run's figures (refused, before anything
runs, where OUT exists, unless --force, or where it is reached through a link another user
controls); --report OUT.json prints the tables of such a file again, without a GPU.

Needs PyTorch and a GPU; MPS configurations are left out, said, where the MPS daemon does not
start. Exit status 0 when every run worked.
"""

import argparse
import importlib.util
import json
import os
import re
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_launch import device_name, find_script  # noqa: E402
from benchmarks.mps import MpsUnavailable, mps_daemon  # noqa: E402
from clc.errors import ClcError  # noqa: E402

SCRIPT = REPO / "examples" / "colocate.py"


def _colocate():
    """examples/colocate.py, for its services and trainings (it imports PyTorch only to run)."""
    spec = importlib.util.spec_from_file_location("colocate_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_EXAMPLE = _colocate()
SERVICES = _EXAMPLE.MODES
TRAININGS = tuple(_EXAMPLE.TRAIN_SIZES)
PAIRS = tuple(f"{s}-{t}" for s in SERVICES for t in TRAININGS)
# colocate.py's training without --size, which the figures before the GPT-2 pairs ran:
# accepted by --pairs (sync-encoder, ...), never in all
ENCODER = "encoder"
KNOWN_PAIRS = (*PAIRS, *(f"{s}-{ENCODER}" for s in SERVICES))
SHARES = (0.5, 0.25)
PLACES = ("first", "last")
CONFIGS = ("alone", "shared", "mps", "mps-50", "mps-25", "mps-prio",
           *(f"clc-{s}-{p}" for s in SHARES for p in PLACES), "priority", "priority-mps",
           "priority-share-mps", "priority-reserve-mps", "priority-reserve-share-mps",
           "priority-slo", "priority-slo-mps", "priority-slo-share-mps", "shared-two",
           "priority-two")
DEFAULT_CONFIGS = ("alone", "shared", "mps", "mps-50", "mps-25", "clc-0.25-first", "priority",
                   "priority-mps", "priority-share-mps", "priority-reserve-mps",
                   "priority-reserve-share-mps")
PRIORITY_CONFIGS = ("priority", "priority-mps", "priority-share-mps", "priority-reserve-mps",
                    "priority-reserve-share-mps", "priority-slo", "priority-slo-mps",
                    "priority-slo-share-mps", "priority-two")
SECOND_GAP_MS = 7.0
PRIORITY_FLOOR = 0.1
PRIORITY_RUN_AHEAD = 32
PRIORITY_HELD_SHARE = 0.25
PRIORITY_RESERVE = 0.25
PRIORITY_RESERVE_HELD_SHARE = 0.125
PRIORITY_SLO = 1.10
READY_TIMEOUT_S = 300
DEFAULT_ROUNDS = 3
DEFAULT_REQUESTS = 400
QUICK_REQUESTS = 200
# A configuration's name is also part of file names in the bench's own folder.
_NAME = re.compile(r"[a-z0-9][a-z0-9._+-]{0,39}")
# Names that --configs or a round's plan give a meaning of their own.
_RESERVED = ("all", "default", "alone-service", "alone-training")


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


def parse_peak(stdout):
    """The most GPU memory the training held, GiB, or None where it did not say."""
    for line in stdout.splitlines():
        if line.startswith("peak_gib "):
            return float(line.split()[1])
    return None


def rate_in_window(ends, start, end):
    """Steps per second that ended inside [start, end]."""
    if end <= start:
        raise ValueError(f"an empty window ({start} .. {end})")
    return sum(1 for t in ends if start <= t <= end) / (end - start)


def latency_row(latencies):
    return {"p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
            "max": max(latencies), "n": len(latencies)}


# ---- what is asked for --------------------------------------------------------------------

def parse_pairs(text):
    """The pairs named in text (comma-separated, or `all`), in the order given, once each."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(PAIRS)
    unknown = [n for n in names if n not in KNOWN_PAIRS]
    if unknown or not names:
        raise ValueError(f"unknown pair(s) {', '.join(unknown) or '(none given)'}: choose "
                         f"from {', '.join(KNOWN_PAIRS)}, or all")
    return list(dict.fromkeys(names))


def parse_policy_config(spec):
    """NAME=POLICY.yaml[:mps] -> a namespace (name, path, mps, text): the policy checked as
    clc-run would check it, and its text kept so that every run uses the same."""
    from clc.policy.errors import PolicyError
    from clc.policy.loader import load_policy
    name, eq, rest = spec.partition("=")
    mps = rest.endswith(":mps")
    path = rest[:-len(":mps")] if mps else rest
    if not eq or not path:
        raise ValueError(f"--policy-config {spec!r}: expected NAME=POLICY.yaml or "
                         "NAME=POLICY.yaml:mps")
    if not _NAME.fullmatch(name):
        raise ValueError(f"--policy-config {spec!r}: a name is 1 to 40 of a-z, 0-9, '.', '_', "
                         "'+', '-', starting with a letter or digit")
    if name in (*CONFIGS, *_RESERVED):
        raise ValueError(f"--policy-config {spec!r}: {name} is a name of the bench's own; "
                         "name yours otherwise")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            # it is read twice, to check it and to keep it: a pipe would give its text once
            raise ValueError(f"--policy-config {name}: {path} is not a regular file")
    except OSError as e:
        raise ValueError(f"--policy-config {name}: cannot read the policy {path}: "
                         f"{e.strerror or e}") from None
    try:
        policy = load_policy(path)
    except PolicyError as e:
        raise ValueError(f"--policy-config {name}: {e}") from None
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    return SimpleNamespace(name=name, path=str(path), mps=mps, text=text,
                           warnings=[str(w) for w in policy.warnings])


def parse_configs(text, policy_names=()):
    """The configurations named in text (comma-separated, `all`, or `default`), then the
    policy configurations; `alone` first, as every figure is relative to it."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        names = list(CONFIGS)
    elif names == ["default"]:
        names = list(DEFAULT_CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown configuration(s) {', '.join(unknown)}: choose from "
                         f"{', '.join(CONFIGS)}, or all (--policy-config adds your own)")
    names = list(dict.fromkeys(["alone", *names, *policy_names]))
    return names


def under_mps(config, policy_configs):
    if config in policy_configs:
        return policy_configs[config].mps
    return config.startswith(("mps", "clc")) or config.endswith("-mps")


def plan_round(pairs, configs, policy_configs):
    """One round's runs in order, as (configuration, target): first those under MPS (the
    round's daemon), then the others. A target is a pair, except for the alone runs: each
    service of the pairs alone ("alone-service", service), each training ("alone-training",
    training)."""
    mps, plain = [], []
    if "alone" in configs:
        for service in dict.fromkeys(p.split("-")[0] for p in pairs):
            plain.append(("alone-service", service))
        for training in dict.fromkeys(p.split("-")[1] for p in pairs):
            plain.append(("alone-training", training))
    for pair in pairs:
        for config in configs:
            if config != "alone":
                (mps if under_mps(config, policy_configs) else plain).append((config, pair))
    return mps, plain


def programs(service, training, args):
    """The command lines of a service (infer, and second, the same at its own rhythm) and of
    a training (train), each where named."""
    progs = SimpleNamespace(clc_run=args.clc_run, run_ahead=args.run_ahead)
    if service:
        infer = [sys.executable, SCRIPT, "infer", "--mode", service]
        progs.infer = [*infer, "--requests", args.requests, "--gap-ms", args.gap_ms]
        progs.second = [*infer, "--requests",
                        round(args.requests * args.gap_ms / SECOND_GAP_MS),
                        "--gap-ms", SECOND_GAP_MS]
    if training:
        progs.train = [sys.executable, SCRIPT, "train",
                       *(() if training == ENCODER else ("--size", training))]
    return progs


# ---- policies -----------------------------------------------------------------------------

def priority_policy(path, board, held_share=0, run_ahead=PRIORITY_RUN_AHEAD, reserve=0,
                    slo=0):
    """The inference (tenant serving) latency-critical, the training (tenant batch)
    best-effort: its held launches wait (down to the floor), or with held_share run on that
    share of the SMs; at most run_ahead launches queued per stream; with reserve, that share of
    the SMs left free while the inference lives on the GPU; with slo, the inference's target."""
    serving = f"      slo: {slo}\n" if slo else ""
    held = f"      held_share: {held_share}\n" if held_share else \
        f"      floor: {PRIORITY_FLOOR}\n"
    held += f"      run_ahead: {run_ahead}\n"
    if reserve:
        held += f"      reserve: {reserve}\n"
    Path(path).write_text(
        "# SPDX-License-Identifier: Apache-2.0\nversion: 1\ndefault: allow\npriority:\n"
        f"  board: {board}\n  classes:\n"
        "    - name: serving\n      class: latency-critical\n      match: {tenant: serving}\n"
        + serving +
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
    """(step end times, peak GiB or None) of the training, stopped by its signal."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"the training exited {proc.returncode}: {_stderr(proc)}")
    return parse_train(out), parse_peak(out)


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


def _train_row(ends, peak, start, end):
    got = {"train": rate_in_window(ends, start, end),
           "train_steps": sum(1 for t in ends if start <= t <= end)}
    if peak is not None:
        got["train_peak_gib"] = peak
    return got


def run_service_alone(progs, env):
    """The inference alone."""
    infer = None
    try:
        infer = _start(progs.infer, env, stdin=True)
        _wait_ready(infer, "the inference")
        _go(infer)
        _, _, latencies = _finish_infer(infer, "the inference")
    finally:
        _reap(infer)
    return {"infer": latency_row(latencies)}


def run_train_alone(progs, env, seconds):
    """The training alone, its rate counted over a window of `seconds` (the service's)."""
    train = None
    try:
        train = _start(progs.train, env)
        _wait_ready(train, "the training")
        t0 = time.monotonic() + 0.5
        time.sleep(0.5 + seconds)
        t1 = time.monotonic()
        ends, peak = _stop_train(train)
    finally:
        _reap(train)
    return _train_row(ends, peak, t0, t1)


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
        ends, peak = _stop_train(train)
    finally:
        _reap(infer, train, second)
    got = {"infer": latency_row(latencies), **_train_row(ends, peak, start, end)}
    if second is not None:
        got["second"] = latency_row(second_latencies)
    return got


def run_config(name, target, args, tmp, mps_env, gpu_env=None):
    """One run: the configuration `name` of the pair `target` (or an alone run); gpu_env the
    environment that puts a run outside MPS on its GPU (--gpus: CUDA_VISIBLE_DEVICES; an MPS
    client sees the GPU of its daemon)."""
    gpu_env = gpu_env or {}
    if name == "alone-service":
        return run_service_alone(programs(target, None, args), dict(gpu_env))
    if name == "alone-training":
        return run_train_alone(programs(None, target, args), dict(gpu_env),
                               args.requests * args.gap_ms / 1e3)
    progs = programs(*target.split("-"), args)
    env = mps_env if under_mps(name, args.policy_configs) else dict(gpu_env)
    tag = f"{target}-{name}"
    if gpu_env:
        tag += "-gpu" + gpu_env["CUDA_VISIBLE_DEVICES"]
    if name in args.policy_configs:
        return run_under_clc(progs, env, tmp / f"{name}.yaml", tmp, tag)
    if name == "shared":
        return run_together(progs, env)
    if name == "shared-two":
        return run_together(progs, env, second_prefix=())
    if name in PRIORITY_CONFIGS:
        reserve = PRIORITY_RESERVE if "reserve" in name else 0
        held_share = 0 if "share" not in name else \
            PRIORITY_RESERVE_HELD_SHARE if reserve else PRIORITY_HELD_SHARE
        policy = priority_policy(tmp / f"{tag}.yaml", tmp / f"{tag}-board", held_share,
                                 args.run_ahead, reserve, PRIORITY_SLO if "slo" in name else 0)
        return run_under_clc(progs, env, policy, tmp, tag, second=name == "priority-two")
    if name == "mps":
        return run_together(progs, env)
    if name == "mps-prio":
        return run_together(progs, env, train_env={"CUDA_MPS_CLIENT_PRIORITY": "1"})
    if name.startswith("mps-"):
        return run_together(progs, env,
                            train_env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": name[4:]})
    _, share, place = name.split("-")
    policy = share_policy(tmp / f"{tag}.yaml", share, place)
    prefix = [args.clc_run, "--policy", policy, "-o", tmp / f"{tag}.clc", "--force",
              "--no-report", "-q", "--"]
    return run_together(progs, env, train_prefix=prefix)


def run_under_clc(progs, env, policy, tmp, tag, second=False):
    """Both programs under clc-run with the policy, the service as tenant serving and the
    training (and a second service) as tenant batch; how the training was held, from its
    capture."""
    def prefix(tenant, program):
        return [progs.clc_run, "--policy", policy, "--tenant", tenant, "-o",
                tmp / f"{tag}-{program}.clc", "--force", "--no-report", "-q", "--"]
    got = run_together(progs, env, train_prefix=prefix("batch", "batch"),
                       infer_prefix=prefix("serving", "serving"),
                       second_prefix=prefix("batch", "second") if second else None)
    got["held"] = hold_row(tmp / f"{tag}-batch.clc")
    if second:
        got["second_held"] = hold_row(tmp / f"{tag}-second.clc")
    return got


def measured(r, name, target, args, tmp, mps_env, gpu_env=None):
    """One run's figures and its wall time, printed as they come; a run that fails is said
    and left out of the summary (its error kept in the JSON), and the rounds go on."""
    began = time.monotonic()
    try:
        got = dict(run_config(name, target, args, tmp, mps_env, gpu_env))
    except (RuntimeError, ValueError, OSError, ClcError, subprocess.TimeoutExpired) as e:
        got = {"error": str(e)}
    got["wall_s"] = round(time.monotonic() - began, 1)
    on = f" (GPU {gpu_env['CUDA_VISIBLE_DEVICES']})" if gpu_env else ""
    print(f"round {r + 1}: {target}: {name}{on}: {json.dumps(got)}", flush=True)
    return got


def run_round(r, args, tmp, data, saved=lambda: None):
    """Every run of a round, into a new entry of data["rounds"], {"alone": {"service": {..},
    "training": {..}}, "pairs": {pair: {config: figures}}}, calling saved() after each."""
    got = {"alone": {"service": {}, "training": {}}, "pairs": {p: {} for p in args.pairs}}
    data["rounds"].append(got)

    def keep(name, target, figures):
        if name.startswith("alone-"):
            got["alone"][name[len("alone-"):]][target] = figures
        else:
            got["pairs"][target][name] = figures
        saved()

    if args.gpus > 1:
        return _run_round_on_gpus(r, args, tmp, data, got, saved)
    _run_pairs(r, args.pairs, args, tmp, data, keep)


def _run_pairs(r, pairs, args, tmp, data, keep, gpu=None):
    """A round's runs of `pairs`, each kept by keep(name, target, figures): the MPS
    configurations under a daemon of the round's own (of the GPU's own, on `gpu`), the others
    after it has stopped, as MPS clients and plain contexts do not share a GPU."""
    mps_runs, plain_runs = plan_round(pairs, args.configs, args.policy_configs)
    gpu_env = {"CUDA_VISIBLE_DEVICES": str(gpu)} if gpu is not None else None
    daemon = f"mps{r}" if gpu is None else f"mps{r}-gpu{gpu}"
    if mps_runs:
        try:
            with mps_daemon(tmp, daemon, gpu_env) as mps_env:
                for name, target in mps_runs:
                    keep(name, target, measured(r, name, target, args, tmp, mps_env, gpu_env))
        except MpsUnavailable as e:
            on = "" if gpu is None else f" on GPU {gpu}"
            data["notes"].append(f"round {r + 1}: MPS configurations{on} left out: {e}")
    for name, target in plain_runs:
        keep(name, target, measured(r, name, target, args, tmp, None, gpu_env))


def gpu_groups(pairs, gpus):
    """The pairs each GPU runs (--gpus): dealt out in turn, a pair's every run on one GPU so
    that its configurations and its alone runs meet the same hardware."""
    return [g for g in (pairs[i::gpus] for i in range(gpus)) if g]


def _run_round_on_gpus(r, args, tmp, data, got, saved):
    """A round with --gpus: each GPU runs its pairs' runs, alone runs included, in a thread of
    its own, at once. A pair's alone figures are those of its GPU (got["alone_by_pair"]); the
    alone runs are kept under "SERVICE@gpuN" for the wall times."""
    lock = threading.Lock()
    got["alone_by_pair"], got["gpu_of"] = {}, {}

    def on_gpu(gpu, pairs):
        alone = {"service": {}, "training": {}}

        def keep(name, target, figures):
            with lock:
                if name.startswith("alone-"):
                    kind = name[len("alone-"):]
                    alone[kind][target] = figures
                    got["alone"][kind][f"{target}@gpu{gpu}"] = figures
                else:
                    got["pairs"][target][name] = figures
                for pair in pairs:
                    got["gpu_of"][pair] = gpu
                    got["alone_by_pair"][pair] = _pair_run({"alone": alone}, pair, "alone")
                saved()
        _run_pairs(r, pairs, args, tmp, data, keep, gpu)

    threads = [threading.Thread(target=on_gpu, args=(gpu, pairs), daemon=True)
               for gpu, pairs in enumerate(gpu_groups(args.pairs, args.gpus))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- the figures --------------------------------------------------------------------------

def _pair_run(round_, pair, config):
    """A configuration's figures for a pair in one round; for alone, those of the pair's
    service and training alone."""
    if config == "alone" and pair in (round_.get("alone_by_pair", {})
                                      if isinstance(round_, dict) else {}):
        return round_["alone_by_pair"][pair]
    if config == "alone":
        service, training = pair.split("-")
        s = round_["alone"]["service"].get(service) or {}
        t = round_["alone"]["training"].get(training) or {}
        got = {"infer": s.get("infer"), "train": t.get("train")}
        errors = [e for e in (s.get("error"), t.get("error")) if e]
        return {**got, "error": "; ".join(errors)} if errors else got
    return round_["pairs"].get(pair, {}).get(config) or {}


def _count(n, what):
    return f"{n} {what}" + ("" if n == 1 else "s")


def _spread(values):
    return (statistics.median(values), min(values), max(values)) if values else None


def summarize(rounds, pairs, configs):
    """{pair: {config: {field: (median, min, max)}}} over the rounds: the service's p50, p99,
    max (and a second service's, second_*), the training's steps_s, and p99_vs_alone and
    train_vs_alone, each round against the alone runs of its own round; `failed`, the rounds
    whose run failed."""
    out = {}
    for pair in pairs:
        rows = {}
        for config in configs:
            runs = [(_pair_run(r, pair, "alone"), _pair_run(r, pair, config)) for r in rounds]
            fields = {}
            for who, prefix in (("infer", ""), ("second", "second_")):
                for key in ("p50", "p99", "max"):
                    fields[prefix + key] = _spread([g[who][key] for _, g in runs if g.get(who)])
                fields[prefix + "p99_vs_alone"] = _spread(
                    [g[who]["p99"] / a["infer"]["p99"] for a, g in runs
                     if g.get(who) and a.get("infer")])
            fields["steps_s"] = _spread([g["train"] for _, g in runs
                                         if g.get("train") is not None])
            fields["train_vs_alone"] = _spread([g["train"] / a["train"] for a, g in runs
                                                if g.get("train") is not None and a.get("train")])
            row = {k: v for k, v in fields.items() if v is not None}
            failed = sum(1 for _, g in runs if g.get("error"))
            if failed:
                row["failed"] = failed
            rows[config] = row
        out[pair] = rows
    return out


def _cell(field, fmt, unit=""):
    if not field:
        return "-"
    med, lo, hi = field
    return f"{med:{fmt}}{unit} ({lo:{fmt}} .. {hi:{fmt}})"


def pair_table(pair, rows, gpu=None):
    """The table of one pair: a row per configuration (on GPU `gpu`, with --gpus)."""
    service, training = pair.split("-")
    on = "" if gpu is None else f" (GPU {gpu})"
    lines = [f"### {pair}: the `{service}` service beside the `{training}` training{on}", "",
             "| config | service p50 ms | p99 ms | max ms | p99 vs alone | training steps/s "
             "| vs alone |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, f in rows.items():
        shown = f"{name} (failed {f['failed']}x)" if f.get("failed") else name
        lines.append(
            f"| {shown} | {_cell(f.get('p50'), '.2f')} | {_cell(f.get('p99'), '.2f')} | "
            f"{_cell(f.get('max'), '.2f')} | {_cell(f.get('p99_vs_alone'), '.2f', 'x')} | "
            f"{_cell(f.get('steps_s'), '.2f')} | {_cell(f.get('train_vs_alone'), '.2f')} |")
    return lines


def second_table(pair, rows):
    """The second service's figures (shared-two, priority-two), or no lines."""
    seconds = {n: f for n, f in rows.items() if "second_p99" in f}
    if not seconds:
        return []
    lines = [f"{pair}: the second service (a request every {SECOND_GAP_MS:g} ms), its p99 "
             "against the first service's alone:", "",
             "| config | p50 ms | p99 ms | max ms | p99 vs alone |", "|---|---:|---:|---:|---:|"]
    for name, f in seconds.items():
        lines.append(f"| {name} | {_cell(f.get('second_p50'), '.2f')} | "
                     f"{_cell(f.get('second_p99'), '.2f')} | {_cell(f.get('second_max'), '.2f')} "
                     f"| {_cell(f.get('second_p99_vs_alone'), '.2f', 'x')} |")
    return lines


def summary_cell(f):
    """`p99 vs alone / training vs alone`, medians over rounds."""
    if not f or ("p99_vs_alone" not in f and "train_vs_alone" not in f):
        return "failed" if f and f.get("failed") else "-"
    p99 = f"{f['p99_vs_alone'][0]:.2f}x" if "p99_vs_alone" in f else "-"
    train = f"{f['train_vs_alone'][0]:.2f}" if "train_vs_alone" in f else "-"
    return f"{p99} / {train}"


def summary_table(summary, configs):
    """A row per pair, a column per configuration."""
    lines = ["| pair | " + " | ".join(configs) + " |",
             "|---|" + "---:|" * len(configs)]
    for pair, rows in summary.items():
        lines.append(f"| {pair} | " + " | ".join(summary_cell(rows.get(c)) for c in configs)
                     + " |")
    return lines


def wall_table(rounds, configs):
    """The wall time each configuration took over every pair and round, alone's being the
    services' and trainings' alone runs."""
    lines = ["| config | runs | wall s in all | s per run |", "|---|---:|---:|---:|"]
    total = 0.0
    for config in configs:
        if config == "alone":
            runs = [g for r in rounds for kind in ("service", "training")
                    for g in r["alone"][kind].values()]
        else:
            runs = [r["pairs"][p][config] for r in rounds for p in r["pairs"]
                    if config in r["pairs"][p]]
        walls = [g["wall_s"] for g in runs if "wall_s" in g]
        if walls:
            total += sum(walls)
            lines.append(f"| {config} | {len(walls)} | {sum(walls):.0f} | "
                         f"{sum(walls) / len(walls):.1f} |")
    lines.append(f"| all | | {total:.0f} | |")
    return lines


def hold_line(who, held):
    """How a best-effort program was held over the runs (hold_row per run), in words."""
    lags = [h["lag_us_p50"] for h in held if h["lag_us_p50"] is not None]
    return (f"{who} held {statistics.median(h['holds'] for h in held):.0f} times per run "
            f"({statistics.median(h['held_ms'] for h in held):.0f} ms in all, "
            f"{statistics.median(h['by_floor'] for h in held):.0f} let go by the floor); from "
            "the inference going busy to the hold: "
            + (f"{statistics.median(lags):.0f} us (median of the runs' medians)"
               if lags else "-"))


def report(data):
    """The tables of a run (what --json wrote) as lines of Markdown."""
    rounds, pairs, configs = data["rounds"], data["pairs"], data["configs"]
    summary = summarize(rounds, pairs, configs)
    lines = [f"device: {data['device']}",
             f"{_count(len(rounds), 'interleaved round')}, {data['requests']} requests every "
             f"{data['gap_ms']:g} ms; medians (range over rounds), each round against the "
             "alone runs of its own round", ""]
    for pair in pairs:
        gpus = {r.get("gpu_of", {}).get(pair) for r in rounds if isinstance(r, dict)} - {None}
        lines += [*pair_table(pair, summary[pair], min(gpus) if len(gpus) == 1 else None), ""]
        second = second_table(pair, summary[pair])
        if second:
            lines += [*second, ""]
        for name in configs:
            if name not in PRIORITY_CONFIGS and name not in data.get("policy_configs", {}):
                continue
            for key, who in (("held", "the training"), ("second_held", "the second service")):
                held = [r["pairs"][pair][name][key] for r in rounds
                        if r["pairs"].get(pair, {}).get(name, {}).get(key)]
                if held:
                    lines += [f"{pair}, {name}: {hold_line(who, held)}", ""]
    lines += ["Summary: the service's p99 against alone / the training's throughput against "
              "alone (medians over rounds)", "", *summary_table(summary, configs), "",
              "Wall time per configuration (starting the programs included):", "",
              *wall_table(rounds, configs)]
    for name, pc in data.get("policy_configs", {}).items():
        lines.append(f"\n{name}: {pc['path']}" + (" under MPS" if pc["mps"] else ""))
    for note in data.get("notes", ()):
        lines.append(f"\n{note}")
    return lines


def load_report(path):
    """A --json file read back for --report; ValueError saying what is wrong with it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None
    need = ("device", "requests", "gap_ms", "pairs", "configs", "rounds")
    missing = [k for k in need if not isinstance(data, dict) or k not in data]
    if missing:
        raise ValueError(f"{path} is not what bench_colocate --json writes (no "
                         f"{', '.join(missing)})")
    return data


def merged(runs):
    """Several --json files as one run: their rounds together, the pairs and configurations of
    any of them (a configuration a round did not run is left out of its medians). ValueError
    when they differ in requests or gap, which would make their figures incomparable."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    for other in runs[1:]:
        for key in ("requests", "gap_ms"):
            if other[key] != first[key]:
                raise ValueError(f"the files differ in {key} ({first[key]} and {other[key]}): "
                                 "their figures cannot be taken together")
    return {**first,
            "device": ", ".join(dict.fromkeys(r["device"] for r in runs)),
            "pairs": list(dict.fromkeys(p for r in runs for p in r["pairs"])),
            "configs": list(dict.fromkeys(c for r in runs for c in r["configs"])),
            "rounds": [rnd for r in runs for rnd in r["rounds"]],
            "notes": [n for r in runs for n in r.get("notes", [])]}


# ---- the command --------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", default="all",
                    help=f"comma-separated, of: {', '.join(KNOWN_PAIRS)}; or all (default: "
                    "the six but *-encoder)")
    ap.add_argument("--configs", default="default",
                    help=f"comma-separated, of: {', '.join(CONFIGS)}; or all (default: "
                    f"{','.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--policy-config", action="append", default=[],
                    metavar="NAME=POLICY.yaml[:mps]",
                    help="a configuration of your own: both programs under clc-run with the "
                    "policy (the service tenant serving, the training tenant batch); :mps "
                    "runs it under MPS; may be given again")
    ap.add_argument("--rounds", type=int, help=f"default {DEFAULT_ROUNDS} (--quick: 1)")
    ap.add_argument("--requests", type=int,
                    help=f"per service run; default {DEFAULT_REQUESTS} (--quick: "
                    f"{QUICK_REQUESTS})")
    ap.add_argument("--gap-ms", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_REQUESTS} requests and 1 round, to try a machine")
    ap.add_argument("--run-ahead", type=int, default=PRIORITY_RUN_AHEAD,
                    help="the priority policy's run_ahead (4 to 256)")
    ap.add_argument("--gpus", type=int, default=1,
                    help="run the pairs on this many GPUs at once (0 to N-1), each pair's "
                    "runs on one GPU, each GPU with its own MPS daemon (default 1: the "
                    "first visible GPU)")
    ap.add_argument("--json", metavar="OUT", help="write every run's figures here")
    ap.add_argument("--force", action="store_true", help="let --json replace a file of yours")
    ap.add_argument("--report", metavar="IN", action="append",
                    help="print the tables of a file --json wrote, and run nothing; given "
                    "again, the files' rounds are taken together (runs of the same requests "
                    "and gap, split over several commands)")
    return ap


def parse_args(argv=None):
    """The options, checked: pairs, configs and policy configurations expanded."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.report:
        return args
    if args.rounds is None:
        args.rounds = 1 if args.quick else DEFAULT_ROUNDS
    if args.requests is None:
        args.requests = QUICK_REQUESTS if args.quick else DEFAULT_REQUESTS
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected at least 1")
    if args.gpus < 1:
        ap.error(f"--gpus {args.gpus}: expected at least 1")
    if args.requests < 1 or not args.gap_ms > 0:
        ap.error("--requests must be at least 1 and --gap-ms more than 0")
    if not 4 <= args.run_ahead <= 256:
        ap.error(f"--run-ahead {args.run_ahead}: expected 4 to 256")
    try:
        args.pairs = parse_pairs(args.pairs)
        policies = [parse_policy_config(s) for s in args.policy_config]
        names = [p.name for p in policies]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"--policy-config {', '.join(repeated)} given twice")
        args.policy_configs = {p.name: p for p in policies}
        args.configs = parse_configs(args.configs, names)
    except ValueError as e:
        ap.error(str(e))
    return args


def _write_json(path, force, data):
    from clc.outputs import open_output
    with open_output(path, force, text=True) as f:
        f.write(json.dumps(data, indent=2) + "\n")


def main(argv=None):
    args = parse_args(argv)
    if args.report:
        try:
            lines = report(merged([load_report(path) for path in args.report]))
        except ValueError as e:
            sys.exit(f"bench_colocate: {e}")
        except (KeyError, TypeError, AttributeError, IndexError) as e:
            sys.exit(f"bench_colocate: {', '.join(args.report)} is not what bench_colocate "
                     f"--json writes ({type(e).__name__}: {e})")
        print("\n".join(lines))
        return
    for pc in args.policy_configs.values():
        for warning in pc.warnings:
            print(f"bench_colocate: {pc.name}: {warning}", file=sys.stderr)
    if args.json:
        from clc.outputs import check_output
        try:
            check_output(args.json, args.force)
        except ClcError as e:
            sys.exit(f"bench_colocate: {e}")
    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("bench_colocate: PyTorch is not installed in this Python")
    args.clc_run = find_script("clc-run")
    if args.clc_run is None and any(c.startswith(("clc", "priority")) or
                                    c in args.policy_configs for c in args.configs):
        sys.exit("bench_colocate: clc-run is not installed beside this Python nor on PATH "
                 "(pip install -e . first, or leave out the configurations under clc)")
    mps_runs, plain_runs = plan_round(args.pairs, args.configs, args.policy_configs)
    device = device_name()
    print(f"device: {device}\n{len(mps_runs) + len(plain_runs)} runs per round "
          f"({len(mps_runs)} under MPS), {_count(args.rounds, 'round')}, {args.requests} "
          "requests per "
          "service run", flush=True)
    data = {"device": device, "requests": args.requests, "gap_ms": args.gap_ms,
            "pairs": args.pairs, "configs": args.configs,
            "policy_configs": {n: {"path": p.path, "mps": p.mps, "policy": p.text}
                               for n, p in args.policy_configs.items()},
            "rounds": [], "notes": []}
    written = []

    def save():
        """The figures so far into --json, after every run: a run cut short by a time limit
        keeps what it measured. The first write is the one --force allows; the later ones
        replace the bench's own file, checked the same way."""
        if not args.json:
            return
        data["summary"] = summarize(data["rounds"], args.pairs, args.configs)
        try:
            _write_json(args.json, args.force or any(written), data)
            written.append(True)
        except ClcError as e:
            written.append(False)
            print(f"bench_colocate: {e}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="clc-colocate-") as tmpdir:
        tmp = Path(tmpdir)
        for name, pc in args.policy_configs.items():
            (tmp / f"{name}.yaml").write_text(pc.text, encoding="utf-8")
        for r in range(args.rounds):
            run_round(r, args, tmp, data, save)
    data["summary"] = summarize(data["rounds"], args.pairs, args.configs)
    print("\n" + "\n".join(report(data)))
    failed = any("error" in g for r in data["rounds"]
                 for g in [*r["alone"]["service"].values(), *r["alone"]["training"].values(),
                           *(g for p in r["pairs"].values() for g in p.values())])
    sys.exit(1 if failed or not all(written) else 0)


if __name__ == "__main__":
    main()

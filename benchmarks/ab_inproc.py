# SPDX-License-Identifier: Apache-2.0
"""Two builds of clc compared on one launch: bench_inproc under each, in pairs.

    python benchmarks/ab_inproc.py --before TREE [--after TREE] [--policy allow]
                                   [--pairs 60] [--cpu 3] [--program EXE] [--json OUT]

For a change to the launch path, where the question is "is a launch still as fast?".
bench_launch's in-process figure moves by tens of ns from one process to the next on a virtual
machine (the same build, run after run), more than such a change. Here each pair runs
examples/bench_inproc once under each build, the order alternating from pair to pair, both
pinned to one core; the verdict is the mean of the pairs' differences (after - before) with its
standard error, so that drift falls on both sides of a pair and the noise shrinks with
--pairs.

TREE is a source tree of clc: for a commit, `git worktree add /tmp/before COMMIT`. Its shim is
built in place (setup.py build_ext --inplace) when it is missing there, and each run imports
clc from its own tree (PYTHONPATH), whatever is installed. --after defaults to this repository.

--policy: allow (a policy that allows everything: the fast path), record (policies/audit.yaml)
or the path of a policy file. --program: a bench_inproc already built (built with nvcc here
otherwise). Extra arguments after `--` go to bench_inproc (bursts, burst size).

Prints each build's median and quartiles and the paired difference. Exit status 0 when every
run worked.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_launch import POLICIES, REPO, build_inproc, device_name, find_nvcc, parse_lines  # noqa: E402

CLC_RUN = "import sys; from clc.cli.run import main; sys.argv[0] = 'clc-run'; sys.exit(main())"
BUILDS = ("before", "after")


def prepared(tree, rebuild=False):
    """tree's clc, its shim built in place; returns the environment that imports it."""
    tree = Path(tree).resolve()
    if not (tree / "clc" / "__init__.py").is_file() or not (tree / "setup.py").is_file():
        sys.exit(f"ab_inproc: {tree} is not a source tree of clc (no clc/__init__.py, setup.py)")
    shim = tree / "clc" / "libclc_preload.so"
    bridge = tree / "clc" / "runtime" / f"_bridge{sysconfig.get_config_var('EXT_SUFFIX')}"
    if rebuild or not shim.exists() or not bridge.exists():
        build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                               cwd=tree, capture_output=True, text=True)
        if build.returncode != 0 or not shim.exists() or not bridge.exists():
            sys.exit(f"ab_inproc: building the shim in {tree} failed (exit {build.returncode})\n"
                     f"{build.stdout[-4000:]}{build.stderr[-4000:]}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH")) if p)
    where = subprocess.run([sys.executable, "-P", "-c", "import clc; print(clc.__file__)"],
                           env=env, capture_output=True, text=True)
    if where.returncode != 0 or Path(where.stdout.strip()).parent != tree / "clc":
        sys.exit(f"ab_inproc: a run for {tree} would import clc from "
                 f"{where.stdout.strip() or where.stderr.strip()[-500:]}")
    return env


def run_once(env, policy, program, extra, cpu, output):
    argv = [sys.executable, "-P", "-c", CLC_RUN, "--policy", str(policy), "-o", str(output),
            "--force", "--no-report", "--", str(program), *extra]
    if cpu is not None:
        argv = ["taskset", "-c", str(cpu), *argv]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    values = parse_lines(proc.stdout)
    if proc.returncode != 0 or "ns_added" not in values:
        sys.exit(f"ab_inproc: a run failed (exit {proc.returncode})\n$ {' '.join(argv)}\n"
                 f"{proc.stdout}{proc.stderr}")
    return values["ns_added"]


def quartiles(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def summary(added):
    """The per-build medians and the paired difference of {build: [ns added per run]}."""
    diffs = [a - b for a, b in zip(added["after"], added["before"])]
    mean = statistics.mean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return {"builds": {b: dict(zip(("q1", "median", "q3"), quartiles(added[b])),
                               fastest=min(added[b]), slowest=max(added[b])) for b in BUILDS},
            "pairs": len(diffs), "diff_mean": mean, "diff_median": statistics.median(diffs),
            "diff_se": se, "diff_low": mean - 2 * se, "diff_high": mean + 2 * se}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, metavar="TREE")
    ap.add_argument("--after", default=str(REPO), metavar="TREE")
    ap.add_argument("--policy", default="allow")
    ap.add_argument("--pairs", type=int, default=60)
    ap.add_argument("--cpu", type=int, default=None, help="pin every run to this core")
    ap.add_argument("--program", help="a built bench_inproc (else built here with nvcc)")
    ap.add_argument("--rebuild", action="store_true", help="build both shims even if present")
    ap.add_argument("--json", metavar="OUT", help="write the raw numbers here")
    ap.add_argument("extra", nargs="*", help="bench_inproc's arguments (after --)")
    args = ap.parse_args()
    if args.pairs < 2:
        ap.error("--pairs must be at least 2")
    if args.policy not in ("allow", "record") and not Path(args.policy).is_file():
        ap.error(f"--policy {args.policy}: expected allow, record or a policy file")

    envs = {b: prepared(getattr(args, b), args.rebuild) for b in BUILDS}
    with tempfile.TemporaryDirectory(prefix="clc-ab-") as tmp:
        tmp = Path(tmp)
        if args.policy == "allow":
            policy = tmp / "allow-all.yaml"
            policy.write_text("version: 1\ndefault: allow\n")
        else:
            policy = POLICIES / "audit.yaml" if args.policy == "record" else Path(args.policy)
        if args.program:
            program = Path(args.program)
        else:
            nvcc = find_nvcc()
            if not nvcc:
                sys.exit("ab_inproc: nvcc not found (or give --program)")
            program = build_inproc(nvcc, tmp)

        added = {b: [] for b in BUILDS}
        for i in range(args.pairs):
            for build in (BUILDS if i % 2 == 0 else BUILDS[::-1]):
                added[build].append(run_once(envs[build], policy, program, args.extra, args.cpu,
                                             tmp / f"{build}.clc"))
            print(f"pair {i + 1}: before +{added['before'][-1]:.1f} ns, "
                  f"after +{added['after'][-1]:.1f} ns", file=sys.stderr, flush=True)

    s = summary(added)
    device = device_name()
    print(f"device: {device}")
    print(f"bench_inproc under {policy.name}, {s['pairs']} pairs, order alternating"
          + (f", pinned to core {args.cpu}" if args.cpu is not None else ""))
    print(f"before: {Path(args.before).resolve()}\nafter: {Path(args.after).resolve()}\n")
    print("| build | ns added per launch, median | quartiles | fastest .. slowest |")
    print("|---|---:|---|---|")
    for b in BUILDS:
        r = s["builds"][b]
        print(f"| {b} | {r['median']:+.1f} | {r['q1']:+.1f} .. {r['q3']:+.1f} | "
              f"{r['fastest']:+.1f} .. {r['slowest']:+.1f} |")
    print(f"\nafter - before, paired: mean {s['diff_mean']:+.1f} ns, standard error "
          f"{s['diff_se']:.1f}; two standard errors: {s['diff_low']:+.1f} .. "
          f"{s['diff_high']:+.1f} ns (median of the differences {s['diff_median']:+.1f})")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "policy": str(policy),
                                               "before": str(args.before),
                                               "after": str(args.after), "added": added,
                                               "summary": s}, indent=1))


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""A small, deterministic PyTorch workload for clc's GPU tests.

    python torch_snippet.py [--iterations N] [--profile]

Plain mode runs the workload and prints `done <checksum>`. With --profile it runs the same
workload under torch.profiler with CUDA activity and prints, besides `done`, one line per
kernel the profiler saw, `count <kernel name> <launches>`, sorted by name: a count of the
kernel launches taken independently of clc, to hold the capture against. No other line starts
with `count`.

The workload's ops (matmuls, elementwise ops, softmax, reductions) run different numbers of
times, so that two kernels are unlikely to share a launch count: a test that falls back to
comparing counts without names still has something to compare.

A CUDA error inside an iteration (a launch clc refused, say) is caught: the iteration is
abandoned, the first message of each kind is printed as `cuda_error <op> <first line>`, and
the run goes on; `errors <n>` follows when there were any. The exit status is 0 unless
something other than a CUDA error went wrong.
"""

import argparse
import json
import os
import sys
import tempfile

import torch


def workload(iterations, errors):
    """Run the ops; return a checksum. `errors` collects (op, message) of caught errors."""
    device = torch.device("cuda")
    # A generator of our own: the values do not depend on any other use of the global RNG.
    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    x = torch.randn(256, 512, device=device, generator=gen)
    w1 = torch.randn(512, 512, device=device, generator=gen) / 16
    w2 = torch.randn(512, 128, device=device, generator=gen) / 16
    acc = torch.zeros((), device=device)

    for i in range(iterations):
        op = "matmul"
        try:
            h = x @ w1
            op = "elementwise"
            h = torch.relu(h) * 0.5 + 0.25
            op = "matmul"
            o = h @ w2
            if i % 2 == 0:
                op = "softmax"
                p = torch.softmax(o, dim=-1)
                op = "reduction"
                acc = acc + p.amax(dim=-1).sum()
            if i % 3 == 0:
                op = "reduction"
                acc = acc + o.abs().mean()
        except RuntimeError as exc:  # torch.AcceleratorError is a RuntimeError
            errors.append((op, str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)))
    torch.cuda.synchronize()
    return acc.item()


def kernel_counts_from_trace(path):
    """Kernel name -> launches, from a Chrome trace the profiler exported."""
    with open(path) as f:
        trace = json.load(f)
    counts = {}
    for ev in trace.get("traceEvents", []):
        # Kineto marks GPU kernel activities with cat "kernel" (memcpy and memset have their
        # own categories), which is exactly what clc counts as a launch.
        if str(ev.get("cat", "")).lower() == "kernel" and ev.get("ph") == "X":
            name = ev.get("name", "")
            counts[name] = counts.get(name, 0) + 1
    return counts


def kernel_counts_from_events(prof):
    """Fallback when the trace has no kernel category: the profiler's device-side events."""
    counts = {}
    for ev in prof.events():
        if getattr(ev, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name
        if name.startswith(("Memcpy", "Memset")):
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--profile", action="store_true",
                    help="count kernel launches with torch.profiler and print `count` lines")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("torch_snippet: CUDA is not available", file=sys.stderr)
        return 3

    errors = []
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        # The profiler wraps everything that touches the GPU, tensor creation included, so
        # that its counts cover every launch the plain run makes.
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            checksum = workload(args.iterations, errors)
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(trace)
            counts = kernel_counts_from_trace(trace)
        if not counts:
            counts = kernel_counts_from_events(prof)
        for name in sorted(counts):
            # A name on one line, always: the tests split on the last space.
            print(f"count {' '.join(name.split())} {counts[name]}")
    else:
        checksum = workload(args.iterations, errors)

    seen = set()
    for op, msg in errors:
        if (op, msg) not in seen:
            seen.add((op, msg))
            print(f"cuda_error {op} {msg}")
    if errors:
        print(f"errors {len(errors)}")
    # Six significant digits: enough to see a wrong result, and the same in every run of the
    # same kernels on the same inputs.
    print(f"done {checksum:.6g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

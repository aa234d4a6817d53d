# SPDX-License-Identifier: Apache-2.0
"""Two PyTorch programs that share a GPU: a latency-critical inference service and a
best-effort training job (benchmarks/bench_colocate.py runs them side by side).

    colocate.py infer [--requests 400] [--gap-ms 10] [--layers 8] [--width 1024]
    colocate.py train [--layers 12] [--width 768]

infer: a transformer encoder's forward pass in bf16 (8 layers, d_model 1024, batch 8 x 512
tokens). After a warm-up it prints `ready`, waits for a line on its standard input (`go`, so
that a benchmark can start it in step with other work), then serves `--requests` requests
that arrive every `--gap-ms` milliseconds (an open loop: request i arrives at start + i * gap,
whether the one before it has finished or not). A request's latency runs from its arrival to
the end of its forward pass (a stream synchronize). It prints

    window <start> <end>            time.monotonic() seconds: the first arrival, the last end
    latencies_ms <l0>,<l1>,...      every request's latency, in arrival order

train: a training step of a transformer encoder (12 layers, d_model 768, batch 16 x 512
tokens, bf16 autocast, AdamW), repeated until SIGTERM or SIGINT. After 3 steps of warm-up it
prints `ready`; at the signal it prints, and exits 0:

    steps <t0>,<t1>,...             time.monotonic() at the end of each step after the warm-up

time.monotonic() is CLOCK_MONOTONIC, one clock for every process of the machine, so a
benchmark can count the training steps that ended inside the inference's window.
"""

import argparse
import signal
import sys
import time

import torch


def encoder(layers, width, heads):
    layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, batch_first=True,
                                             dropout=0.0)
    return torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def infer(args):
    torch.manual_seed(0)
    model = encoder(args.layers, args.width, 16).cuda().to(torch.bfloat16).eval()
    x = torch.randn(8, 512, args.width, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(10):
            model(x)
        torch.cuda.synchronize()
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            sys.exit("colocate infer: expected `go` on standard input")
        gap = args.gap_ms / 1e3
        start = time.monotonic() + 0.01
        latencies = []
        for i in range(args.requests):
            arrival = start + i * gap
            wait = arrival - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            model(x)
            torch.cuda.synchronize()
            latencies.append((time.monotonic() - arrival) * 1e3)
        end = time.monotonic()
    print(f"window {start:.6f} {end:.6f}")
    print("latencies_ms " + ",".join(f"{v:.3f}" for v in latencies), flush=True)


def train(args):
    torch.manual_seed(0)
    model = encoder(args.layers, args.width, 12).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(16, 512, args.width, device="cuda")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    ends = []
    step = 0
    while not stop:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        step += 1
        if step == 3:
            print("ready", flush=True)
        elif step > 3:
            ends.append(time.monotonic())
    print("steps " + ",".join(f"{t:.6f}" for t in ends), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    i = sub.add_parser("infer")
    i.add_argument("--requests", type=int, default=400)
    i.add_argument("--gap-ms", type=float, default=10.0)
    i.add_argument("--layers", type=int, default=8)
    i.add_argument("--width", type=int, default=1024)
    t = sub.add_parser("train")
    t.add_argument("--layers", type=int, default=12)
    t.add_argument("--width", type=int, default=768)
    args = ap.parse_args()
    (infer if args.role == "infer" else train)(args)


if __name__ == "__main__":
    main()

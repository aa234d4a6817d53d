# SPDX-License-Identifier: Apache-2.0
"""Two Triton kernels for clc's GPU tests.

    python triton_snippet.py [--iterations N]

`add_kernel` (out = x + y) is launched N times and `mul_kernel` (out = x * y) 2N times;
Triton launches through cuLaunchKernelEx, a path the plain CUDA examples do not take.

Output, the same line formats as examples/vecadd.cu:
    info triton_snippet iterations=<n>
    cuda_error <kernel> <message>     first time each (kernel, message) pair is seen
    count add_kernel <n>              launches attempted, refused ones included
    count mul_kernel <n>
    errors <kernel> <n>               only for kernels that had errors
    result <kernel> ok|mismatch|skipped

A refused launch makes Triton's launcher raise (RuntimeError "Triton Error [CUDA]: operation
not permitted"); that is reported and the run goes on. Exit status 0, 1 on a mismatch.
"""

import argparse
import sys
import traceback

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * y, mask=mask)


class Tally:
    """Launches and errors per kernel; each distinct error is printed once, when first seen."""

    def __init__(self, names):
        self.launches = {n: 0 for n in names}
        self.errors = {n: 0 for n in names}
        self.seen = set()

    def launch(self, name, fn):
        self.launches[name] += 1
        try:
            fn()
        except Exception as exc:  # Triton raises RuntimeError; anything else is reported too
            self.errors[name] += 1
            text = str(exc).strip()
            msg = text.splitlines()[0] if text else type(exc).__name__
            if (name, msg) not in self.seen:
                self.seen.add((name, msg))
                print(f"cuda_error {name} {msg}", flush=True)
                # The whole story once, on stderr, for whoever debugs an unexpected error.
                traceback.print_exc()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("triton_snippet: CUDA is not available", file=sys.stderr)
        return 3

    n = 1 << 20
    block = 1024
    grid = (triton.cdiv(n, block),)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    x = torch.randn(n, device="cuda", generator=gen)
    y = torch.randn(n, device="cuda", generator=gen)
    out_add = torch.zeros(n, device="cuda")
    out_mul = torch.zeros(n, device="cuda")

    print(f"info triton_snippet iterations={args.iterations}")
    names = ("add_kernel", "mul_kernel")
    tally = Tally(names)
    for _ in range(args.iterations):
        tally.launch("add_kernel", lambda: add_kernel[grid](x, y, out_add, n, BLOCK=block))
        for _ in range(2):
            tally.launch("mul_kernel", lambda: mul_kernel[grid](x, y, out_mul, n, BLOCK=block))
    torch.cuda.synchronize()

    # One add or multiply of the same floats: torch's result is bit-identical.
    expected = {"add_kernel": (out_add, x + y), "mul_kernel": (out_mul, x * y)}
    results = {}
    for name in names:
        got, want = expected[name]
        if tally.errors[name]:
            results[name] = "skipped"
        elif torch.equal(got, want):
            results[name] = "ok"
        else:
            results[name] = "mismatch"
            diff = (got - want).abs().max().item()
            print(f"triton_snippet: {name} max abs difference {diff}", file=sys.stderr)

    for name in names:
        print(f"count {name} {tally.launches[name]}")
    for name in names:
        if tally.errors[name]:
            print(f"errors {name} {tally.errors[name]}")
    for name in names:
        print(f"result {name} {results[name]}")
    return 1 if "mismatch" in results.values() else 0


if __name__ == "__main__":
    sys.exit(main())

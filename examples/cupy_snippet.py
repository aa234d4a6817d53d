# SPDX-License-Identifier: Apache-2.0
"""CuPy RawKernel and ElementwiseKernel launches for clc's GPU tests.

    python cupy_snippet.py [--iterations N]

`cupy_scale` (a RawKernel, extern "C": y = a * x) is launched N times and `clc_cupy_add` (an
ElementwiseKernel: z = x + y) 2N times. CuPy compiles both with NVRTC and launches them
through the driver's cuLaunchKernel. The program launches no other kernel: inputs come from
the host and results go back to the host for checking, so a capture of it holds these two
kernels alone. (The elementwise kernel is not called `cupy_add`: that is the name of CuPy's
own `+`.)

Output, the same line formats as examples/vecadd.cu:
    info cupy_snippet iterations=<n>
    cuda_error <kernel> <message>     first time each (kernel, message) pair is seen
    count cupy_scale <n>
    count clc_cupy_add <n>
    errors <kernel> <n>               only for kernels that had errors
    result <kernel> ok|mismatch|skipped

A refused launch raises cupy.cuda.driver.CUDADriverError ("CUDA_ERROR_NOT_PERMITTED:
operation not permitted"); it is reported and the run goes on. Exit 0, 1 on a mismatch.
"""

import argparse
import sys
import traceback

import cupy as cp
import numpy as np

SCALE_SOURCE = r"""
extern "C" __global__ void cupy_scale(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = a * x[i];
}
"""


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
        # A refusal is a cupy.cuda.driver.CUDADriverError; anything else (a compile error,
        # say) is reported the same way, so one run shows it, and shown in full on stderr.
        except Exception as exc:
            self._error(name, exc)

    def _error(self, name, exc):
        self.errors[name] += 1
        text = str(exc).strip()
        msg = text.splitlines()[0] if text else type(exc).__name__
        if (name, msg) not in self.seen:
            self.seen.add((name, msg))
            print(f"cuda_error {name} {msg}", flush=True)
            traceback.print_exc()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    args = ap.parse_args()

    n = 1 << 20
    block = 256
    grid = (n + block - 1) // block
    scale = cp.RawKernel(SCALE_SOURCE, "cupy_scale")
    add = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x + y", "clc_cupy_add")

    # Small integers: every sum and product is exact, so the checks compare for equality.
    hx = (np.arange(n) % 1000).astype(np.float32)
    hy = (np.arange(n) % 7).astype(np.float32)
    x = cp.asarray(hx)
    y = cp.asarray(hy)
    # zeros is a memset, not a kernel launch.
    out_scale = cp.zeros(n, dtype=cp.float32)
    out_add = cp.zeros(n, dtype=cp.float32)

    print(f"info cupy_snippet iterations={args.iterations}")
    names = ("cupy_scale", "clc_cupy_add")
    tally = Tally(names)
    a = np.float32(3.0)
    for _ in range(args.iterations):
        tally.launch("cupy_scale",
                     lambda: scale((grid,), (block,), (x, out_scale, a, np.int32(n))))
        for _ in range(2):
            tally.launch("clc_cupy_add", lambda: add(x, y, out_add))
    cp.cuda.runtime.deviceSynchronize()

    expected = {"cupy_scale": (out_scale, hx * a), "clc_cupy_add": (out_add, hx + hy)}
    results = {}
    for name in names:
        dev, want = expected[name]
        if tally.errors[name]:
            results[name] = "skipped"
            continue
        got = cp.asnumpy(dev)
        if np.array_equal(got, want):
            results[name] = "ok"
        else:
            results[name] = "mismatch"
            bad = int(np.flatnonzero(got != want)[0])
            print(f"cupy_snippet: {name} wrong at {bad}: {got[bad]} != {want[bad]}",
                  file=sys.stderr)

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

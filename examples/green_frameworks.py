# SPDX-License-Identifier: Apache-2.0
"""Kernels that ship no PTX clc could splice, run as a program would: prints what each computed
(bit for bit, as hex digests) and where a stamping kernel's blocks ran.

    python3 green_frameworks.py WHAT      WHAT: torch | cublas | triton | cupy | torch-step

- torch: a training step of a small transformer encoder (deterministic algorithms, a fixed
  seed): the loss and a digest of every parameter after two optimizer steps.
- cublas: torch.matmul of float32 matrices (cuBLAS sgemm): a digest of the product.
- triton: a Triton add kernel: a digest of the sum.
- cupy: a CuPy elementwise kernel (a digest), and a CuPy RawKernel (NVRTC) stamping each
  block's %smid: `smids distinct=N max=M`.
- torch-step: the time of a training step of a larger encoder (8 layers, d_model 1024, batch
  32 x 512 tokens, bf16 autocast: bound by the GPU's SMs, not by launching), median of 20 steps
  after 5 of warm-up: `step_ms X`.
"""

import hashlib
import os
import sys


def digest(array_bytes):
    return hashlib.sha256(array_bytes).hexdigest()[:16]


def run_torch():
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256,
                                         dropout=0.0, batch_first=True), num_layers=2).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64, 128, device="cuda")
    for _ in range(2):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    params = b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    print(f"torch loss={loss.item():.9g} params={digest(params)}")


def run_torch_step():
    import time

    import torch
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096,
                                         dropout=0.0, batch_first=True), num_layers=8).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 512, 1024, device="cuda")
    times = []
    for i in range(25):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if i >= 5:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    print(f"step_ms {times[len(times) // 2]:.3f}")


def run_cublas():
    import torch
    torch.manual_seed(1)
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    print(f"cublas product={digest(c.cpu().numpy().tobytes())}")


def run_triton():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        tl.store(out + i, tl.load(x + i, mask=mask) + tl.load(y + i, mask=mask), mask=mask)

    torch.manual_seed(2)
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    print(f"triton sum={digest(out.cpu().numpy().tobytes())}")


def run_cupy():
    import cupy
    x = cupy.arange(1 << 20, dtype=cupy.float32)
    y = cupy.ElementwiseKernel("float32 a", "float32 b", "b = a * 2.5f + 1.0f", "axpb")(x)
    print(f"cupy elementwise={digest(cupy.asnumpy(y).tobytes())}")
    stamp = cupy.RawKernel(r'''
extern "C" __global__ void stamp(unsigned *where) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        long long start = clock64();
        while (clock64() - start < 40000) {}
        where[blockIdx.x] = smid;
    }
}''', "stamp")
    where = cupy.full(2048, 0xFFFFFFFF, dtype=cupy.uint32)
    stamp((2048,), (32,), (where,))
    seen = cupy.asnumpy(where)
    print(f"smids distinct={len(set(seen.tolist()))} max={int(seen.max())}")


if __name__ == "__main__":
    {"torch": run_torch, "cublas": run_cublas, "triton": run_triton, "cupy": run_cupy,
     "torch-step": run_torch_step}[sys.argv[1]]()

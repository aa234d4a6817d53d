# SPDX-License-Identifier: Apache-2.0
"""PyTorch with its own threads launching: a DataLoader (two worker processes and the
pin-memory thread), autograd's device thread running the backward pass, and the main thread.
A CuPy kernel stamping each block's %smid runs from the backward pass (autograd's thread) and
from the main thread; prints

    stamp THREAD distinct=N max=M threads=[names]     (THREAD: main | backward)
    loss=X

where a whole program confined by a green context (scope: program) must stay on its SMs.
"""

import threading

import cupy
import torch

SOURCE = r'''extern "C" __global__ void stamp(unsigned *where) {
    if (threadIdx.x == 0) {
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        long long start = clock64();
        while (clock64() - start < 20000) {}
        where[blockIdx.x] = smid;
    }
}'''
KERNEL = cupy.RawKernel(SOURCE, "stamp")
seen, names = {}, {}


def stamp(tag):
    where = cupy.full(1024, 0xFFFFFFFF, dtype=cupy.uint32)
    KERNEL((1024,), (32,), (where,))
    seen.setdefault(tag, set()).update(cupy.asnumpy(where).tolist())
    names.setdefault(tag, set()).add(threading.current_thread().name)


class Stamped(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        stamp("backward")
        return grad


def main():
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(512, 64), torch.randn(512, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=2, pin_memory=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(2):
        for x, y in loader:
            x = x.cuda(non_blocking=True).requires_grad_()
            y = y.cuda(non_blocking=True)
            loss = (model(Stamped.apply(x)) - y).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    stamp("main")
    torch.cuda.synchronize()
    for tag in ("main", "backward"):
        print(f"stamp {tag} distinct={len(seen[tag])} max={max(seen[tag])} "
              f"threads={sorted(names[tag])}")
    print(f"loss={loss.item():.6f}")


if __name__ == "__main__":
    main()

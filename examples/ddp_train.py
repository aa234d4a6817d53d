# SPDX-License-Identifier: Apache-2.0
"""A small DistributedDataParallel training run over NCCL, one process per GPU (torchrun).

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py [--steps N]

Each rank trains the same two-layer model on its own fixed batches; the gradients are averaged
by NCCL's all-reduce, so every rank ends with the same weights. Then each rank runs a cumulative
sum (a scan kernel, which a deny rule may refuse). Prints, per rank:

    rank R loss=<final loss> checksum=<sum of the weights>
    rank R cumsum=<last element> | rank R cumsum refused: <error>
    rank R done
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def say(line):
    """One line in one write: the ranks share the pipe, and print() may write a line's text
    and its end separately (with PYTHONUNBUFFERED), letting another rank's line in between."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator(device="cpu").manual_seed(1000 + rank)
    loss = None
    for _ in range(args.steps):
        x = torch.randn(64, 256, generator=gen).to(device)
        y = torch.randint(0, 10, (64,), generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
    # The mean loss over the ranks, the same on every rank.
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    say(f"rank {rank} loss={mean.item():.6f} checksum={checksum:.6f}")
    try:
        total = torch.arange(1, 1001, device=device, dtype=torch.float32).cumsum(0)
        say(f"rank {rank} cumsum={total[-1].item():.0f}")
    except Exception as exc:  # torch raises RuntimeError or a subclass (AcceleratorError)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        say(f"rank {rank} cumsum refused: {first}")
    dist.barrier()
    dist.destroy_process_group()
    say(f"rank {rank} done")


if __name__ == "__main__":
    main()

"""Data-parallel training of a small MLP with DistributedDataParallel on
synthetic data (labels from a fixed random linear teacher): run it on a lab's accelerators with

    ethplus run erack-8x4 -- python examples/ddp_mlp.py [--steps N]

Each rank trains on its own shard (its own seed); DDP all-reduces the
gradients, so every rank holds the same weights after every step.  Each step
prints the loss averaged over the ranks; the end prints a digest of the
weights (the same on every rank, bit for bit).
"""

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import dataplane.run.torch_backend  # noqa: F401 - registers the "ethplus" backend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=512)
    args = p.parse_args()
    dist.init_process_group(os.environ.get("ETHPLUS_BACKEND", "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP checks them)
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )  # fmt: skip
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    teacher = torch.randn(64, 10, generator=torch.Generator().manual_seed(7))  # what to learn
    data = torch.Generator().manual_seed(1000 + rank)  # this rank's shard
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=data)
        y = (x @ teacher).argmax(dim=1)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        print(f"step {step} loss {mean.item() / world:.9g}", flush=True)
    weights = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    print(f"weights sha256 {hashlib.sha256(weights.numpy().tobytes()).hexdigest()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

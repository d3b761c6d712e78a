"""Mixture-of-experts training steps with expert parallelism: one expert per
rank, tokens routed by a learned gate, sent to their expert with an uneven
all_to_all_single and brought back with another (the splits reversed).
Run it on a lab's accelerators with

    ethplus run erack-8x4 -- python examples/moe_step.py [--steps N]

Each step prints the loss averaged over the ranks and how many tokens this
rank sent to each expert (uneven: the gate decides).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dnn
import torch.nn.functional as F
from torch import nn

import dataplane.run.torch_backend  # noqa: F401 - registers the "ethplus" backend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--dim", type=int, default=128)
    args = p.parse_args()
    dist.init_process_group(os.environ.get("ETHPLUS_BACKEND", "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    gate = nn.Linear(args.dim, world)  # the same on every rank
    for q in gate.parameters():
        dist.broadcast(q.data, 0)
    torch.manual_seed(1 + rank)  # this rank's expert
    expert = nn.Sequential(nn.Linear(args.dim, 2 * args.dim), nn.GELU(),
                           nn.Linear(2 * args.dim, args.dim))  # fmt: skip
    opt = torch.optim.SGD([*gate.parameters(), *expert.parameters()], lr=0.1)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(args.tokens, args.dim, generator=data)
        target = torch.roll(x, 1, dims=1)
        scores = gate(x).softmax(dim=1)
        weight, choice = scores.max(dim=1)
        order = torch.argsort(choice, stable=True)
        send_splits = torch.bincount(choice, minlength=world)
        recv_splits = torch.empty_like(send_splits)
        dist.all_to_all_single(recv_splits, send_splits)  # how many each expert gets
        send, recv = send_splits.tolist(), recv_splits.tolist()
        tokens = x[order]
        arrived = dnn.all_to_all_single(
            torch.empty(sum(recv), args.dim), tokens, output_split_sizes=recv,
            input_split_sizes=send,
        )  # fmt: skip
        done = expert(arrived)
        back = dnn.all_to_all_single(
            torch.empty(args.tokens, args.dim), done, output_split_sizes=send,
            input_split_sizes=recv,
        )  # fmt: skip
        out = torch.empty_like(back)
        out[order] = back * weight[order].unsqueeze(1)
        loss = F.mse_loss(out, target)
        opt.zero_grad()
        loss.backward()
        for q in gate.parameters():  # the gate is replicated: average its gradient
            dist.all_reduce(q.grad, op=dist.ReduceOp.SUM)
            q.grad /= world
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        print(f"step {step} loss {mean.item() / world:.9g} sent {send}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Every collective the ethplus backend implements, on inputs whose results
are exact whatever the reduction order (small integers), saved per rank for
the test to compare with stock gloo's: python collectives.py OUT_DIR."""

import os
import sys

import torch
import torch.distributed as dist

import dataplane.run.torch_backend  # noqa: F401 - registers "ethplus"

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
       "avg": dist.ReduceOp.AVG}  # fmt: skip


def data(rank: int, n: int, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(-8, 9, (n,), generator=g).to(dtype)


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group(os.environ.get("ETHPLUS_BACKEND", "gloo"))
    r, n = dist.get_rank(), dist.get_world_size()
    res: dict[str, torch.Tensor] = {}
    for dt in DTYPES:
        for name, op in OPS.items():
            if name == "avg" and not dt.is_floating_point:
                continue
            x = data(r, 70001, dt)  # not a multiple of the world size
            dist.all_reduce(x, op=op)
            res[f"all_reduce/{name}/{dt}"] = x
    big = data(r, 3 << 20, torch.float32)  # 12 MiB: the pipelined ring
    work = dist.all_reduce(big, async_op=True)
    work.wait()
    res["all_reduce/async/12MiB"] = big
    x = data(r, 1000, torch.bfloat16)
    outs = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(outs, x)
    res["all_gather"] = torch.stack(outs)
    flat = torch.empty(1000 * n, dtype=torch.int32)
    dist.all_gather_into_tensor(flat, data(r, 1000, torch.int32))
    res["all_gather_into_tensor"] = flat
    rs = torch.empty(4096, dtype=torch.float32)
    dist.reduce_scatter_tensor(rs, data(r, 4096 * n, torch.float32))
    res["reduce_scatter_tensor"] = rs
    rs16 = torch.empty(333, dtype=torch.float16)
    dist.reduce_scatter(rs16, [data(r + 10 * d, 333, torch.float16) for d in range(n)],
                        op=dist.ReduceOp.MAX)  # fmt: skip
    res["reduce_scatter/max"] = rs16
    even = data(r, 256 * n, torch.int64)
    got = torch.empty_like(even)
    dist.all_to_all_single(got, even)
    res["all_to_all_single/even"] = got
    # uneven: rank r sends (r + d) % 3 + 1 rows of 5 to rank d
    send_rows = [(r + d) % 3 + 1 for d in range(n)]
    recv_rows = [(s + r) % 3 + 1 for s in range(n)]
    src = data(r, sum(send_rows) * 5, torch.float32).reshape(-1, 5)
    dst = torch.empty(sum(recv_rows), 5)
    dist.all_to_all_single(dst, src, output_split_sizes=recv_rows, input_split_sizes=send_rows)
    res["all_to_all_single/uneven"] = dst
    ins = [data(r * n + d, 7, torch.float32) for d in range(n)]
    outs = [torch.empty(7) for _ in range(n)]
    dist.all_to_all(outs, ins)  # gloo's takes tensors of one size
    res["all_to_all"] = torch.cat(outs)
    if os.environ.get("ETHPLUS_TRANSPORT") != "gloo":  # ours: any sizes
        ins = [data(r * n + d, 7 * (d + 1), torch.float32) for d in range(n)]
        outs = [torch.empty(7 * (r + 1)) for _ in range(n)]
        dist.all_to_all(outs, ins)
        want = [data(s * n + r, 7 * (r + 1), torch.float32) for s in range(n)]
        ok = all(torch.equal(o, w) for o, w in zip(outs, want, strict=True))
        print(f"uneven all_to_all {'exact' if ok else 'WRONG'}", flush=True)
    b = data(r, 100000, torch.float32)
    dist.broadcast(b, src=1)
    res["broadcast"] = b
    dist.barrier()
    right, left = (r + 1) % n, (r - 1) % n
    ring = torch.empty(50000)
    sends = [dist.isend(data(r, 50000, torch.float32), right, tag=3)]
    dist.recv(ring, left, tag=3)
    for w in sends:
        w.wait()
    res["send_recv"] = ring
    torch.save(res, os.path.join(out_dir, f"rank-{r}.pt"))
    if os.environ.get("ETHPLUS_TRANSPORT") != "gloo":
        for bad, why in ((torch.zeros(8, dtype=torch.float64), "dtype"),
                         (torch.zeros(8, 8).t(), "contiguous")):  # fmt: skip
            try:
                dist.all_reduce(bad)
            except TypeError as e:
                print(f"refused {why}: {e}", flush=True)
        try:
            dist.send(torch.zeros(4), (r + 1) % n, tag=999)
        except ValueError as e:
            print(f"refused tag: {e}", flush=True)
    # a refused call leaves the group working; and every rank is done before
    # any tears down (gloo fails a rank whose peer closed its pairs first)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One collective, one size, back to back under the ethplus torch backend
(each call timed by the backend): the program scripts/bench_torch.py runs
under `ethplus run` to set the backend against `ethplus bench`.

python scripts/torch_loop.py all-reduce|all-to-all SIZE ITERS
"""

import os
import sys

import torch
import torch.distributed as dist

import dataplane.run.torch_backend  # noqa: F401 - registers "ethplus"
from dataplane.run.bench import parse_sizes


def main() -> None:
    coll, size, iters = sys.argv[1], parse_sizes(sys.argv[2])[0], int(sys.argv[3])
    dist.init_process_group(os.environ.get("ETHPLUS_BACKEND", "gloo"))
    x = torch.ones(size // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    for _ in range(iters):
        if coll == "all-reduce":
            dist.all_reduce(x)
        else:
            dist.all_to_all_single(y, x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A torchrun worker for the `shardstream run` tests: joins the gloo process group, all-reduces
its rank + 1, leaves a file named after its global rank in the node's cache folder, and writes
the environment it saw (and the sum) to OUT_DIR/rank<R>.json."""

import json
import os
import sys

import torch
import torch.distributed as dist

KEYS = [
    "SHARDSTREAM_RUN_ID",
    "SHARDSTREAM_NODE_RANK",
    "SHARDSTREAM_CACHE_DIR",
    "TORCHELASTIC_RUN_ID",
    "GROUP_RANK",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
]


def main() -> None:
    out_dir = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    cache_dir = os.environ["SHARDSTREAM_CACHE_DIR"]
    with open(os.path.join(cache_dir, f"rank{rank}"), "w") as f:
        f.write(str(rank))
    record = {k: os.environ.get(k) for k in KEYS}
    record.update(rank=rank, world=world, sum=total.item())
    tmp = os.path.join(out_dir, f".rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(out_dir, f"rank{rank}.json"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Work done and reported, process group destroyed: skip interpreter teardown, where gloo's
    # background threads can hit std::terminate while C++ statics are destroyed (exit code -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

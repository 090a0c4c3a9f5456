"""A tiny torchrun training job for the restart test of `shardstream run`.

Every rank streams `DATASET` with `shardstream.StreamingDataset` (shuffled, batches of BATCH),
trains a 1-weight linear model with gradients all-reduced over gloo, and every CKPT_EVERY steps
saves {model, optimizer, step, data position} with `shardstream.checkpoint.StorageWriter` under
CKPT_ROOT. At start it loads `shardstream.checkpoint.latest(CKPT_ROOT)` if there is one and
continues from its step and data position. It appends one JSON line per event to
LOG_DIR/node<SHARDSTREAM_NODE_RANK>.jsonl: {"event": "start", "resumed_from": step or null, "cache_dir": ...} and
{"event": "step", "step": s, "ids": [...]}; after the last step, {"event": "done"}.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import shardstream
from shardstream.checkpoint import StorageReader, StorageWriter, latest

BATCH = 2
CKPT_EVERY = 2


def main() -> None:
    dataset, ckpt_root, log_dir, total_steps, pause = sys.argv[1:6]
    total_steps, pause = int(total_steps), float(pause)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ["SHARDSTREAM_NODE_RANK"]
    log = open(os.path.join(log_dir, f"node{node}.jsonl"), "a", buffering=1)

    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = shardstream.StreamingDataset(remote=dataset, shuffle=True, shuffle_seed=7, batch_size=BATCH)

    step = 0
    resumed_from = None
    url = latest(ckpt_root)
    if url is not None:
        # DCP loads into the structure it is given: the current state is the template.
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0,
                 "data": ds.state_dict(num_samples=0)}
        dcp.load(state, storage_reader=StorageReader(url))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step = int(state["step"])
        ds.load_state_dict(state["data"])
        resumed_from = step
    log.write(json.dumps({"event": "start", "resumed_from": resumed_from, "pid": os.getpid(),
                          "cache_dir": ds.cache_dir}) + "\n")

    it = iter(ds)
    while step < total_steps:
        batch = [next(it) for _ in range(BATCH)]
        ids = [int(s["id"]) for s in batch]
        x = torch.tensor([[float(i)] for i in ids])
        loss = ((model(x) - x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        log.write(json.dumps({"event": "step", "step": step, "ids": ids}) + "\n")
        step += 1
        if step % CKPT_EVERY == 0:
            state = {
                "model": model.state_dict(),
                "optim": opt.state_dict(),
                "step": step,
                "data": ds.state_dict(num_samples=step * BATCH * world),
            }
            dcp.save(state, storage_writer=StorageWriter(f"{ckpt_root}/step-{step:06d}"))
        time.sleep(pause)
    dist.barrier()
    log.write(json.dumps({"event": "done", "step": step}) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Work done and reported, process group destroyed: skip interpreter teardown, where gloo's
    # background threads can hit std::terminate while C++ statics are destroyed (exit code -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

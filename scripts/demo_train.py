#!/usr/bin/env python3
"""The demo's training job: stream a sharded dataset into a small torch model, checkpoint the
model, the optimizer and the loader's position with shardstream's DCP backend, and resume.

    demo_train.py DATASET CKPT_ROOT --steps N [--crash-after K] [--log FILE]

With --crash-after K the process kills itself with SIGKILL right after step K (after the
checkpoint of step K, if K is a checkpoint step), as a node failure would. Run again without it:
the job resumes from the latest complete checkpoint. Each run appends the sample ids it trained
on, one line per step, to --log, so a resumed run can be compared with an uninterrupted one.
"""

import argparse
import json
import os
import signal
import sys

import torch
import torch.distributed.checkpoint as dcp

import shardstream
from shardstream import checkpoint as ss_ckpt

BATCH = 16
CKPT_EVERY = 10


def collate(samples):
    ids = torch.tensor([int(s["id"]) for s in samples])
    labels = torch.tensor([int(s["label"]) for s in samples])
    # A bag of 4 word counts as features: enough for a model that learns something.
    words = ["alpha", "beta", "gamma", "delta"]
    feats = torch.tensor([[s["text"].split().count(w) for w in words] for s in samples], dtype=torch.float32)
    return ids, feats, labels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("ckpt_root")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--crash-after", type=int, default=None)
    ap.add_argument("--log", default=None)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = shardstream.StreamingDataset(
        remote=args.dataset, shuffle=True, shuffle_seed=7, batch_size=BATCH, memory_limit="64MiB"
    )

    # shardstream's StreamingDataLoader (Mosaic's): its state_dict() is the position of the whole
    # job in the epoch, and it reads each epoch's first batch before its workers have started.
    loader = shardstream.StreamingDataLoader(ds, batch_size=BATCH, num_workers=args.workers, collate_fn=collate)
    step = 0
    latest = ss_ckpt.latest(args.ckpt_root)
    if latest is not None:
        # The loader state travels as one JSON string: DCP would flatten a dict into keys the
        # empty template below could not name.
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "loader": "", "step": 0}
        dcp.load(state, storage_reader=ss_ckpt.StorageReader(latest))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(json.loads(state["loader"]))
        step = int(state["step"])
        print(f"resumed from {latest} at step {step}")

    log = open(args.log, "a") if args.log else None
    loss = torch.tensor(0.0)
    while step < args.steps:
        for ids, feats, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(feats), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if log:
                log.write(" ".join(map(str, ids.tolist())) + "\n")
                log.flush()
            if step % CKPT_EVERY == 0:
                state = {
                    "model": model.state_dict(),
                    "optim": opt.state_dict(),
                    "loader": json.dumps(loader.state_dict()),
                    "step": step,
                }
                url = f"{args.ckpt_root.rstrip('/')}/step-{step:06d}"
                dcp.save(state, storage_writer=ss_ckpt.StorageWriter(url))
                print(f"step {step}: loss {loss.item():.3f}, checkpoint {url}")
            if args.crash_after is not None and step == args.crash_after:
                print(f"step {step}: simulating a node failure (SIGKILL)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if step >= args.steps:
                break
        # The next iteration streams the next epoch by itself (also after a resumed one).
    print(f"done: {step} steps, final loss {loss.item():.3f}")


if __name__ == "__main__":
    sys.exit(main())

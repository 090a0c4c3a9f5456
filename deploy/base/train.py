"""The training script the overlays run: `torchrun ... /workspace/train.py` in the trainer image.

An EXAMPLE to replace with your own. It reaches /workspace/train.py through the
`shardstream-train` ConfigMap (deploy/base/kustomization.yaml); or COPY your script to
/workspace/train.py in an image FROM the trainer image and drop the `train-script` volume.

What it shows: a StreamingDataset on SHARDSTREAM_DATASET (the base ConfigMap), DDP across
torchrun's workers, and checkpoints of the model, the optimizer and the loader's position to
CHECKPOINT_ROOT (default: <dataset>-checkpoints) with shardstream's DCP backend; a restarted pod
resumes from the latest complete checkpoint. It trains a tiny model on JSONL-made records
(`text`, `label`: scripts/demo_data.py's); STEPS (default 100) bounds the run.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import shardstream
from shardstream import checkpoint as ss_ckpt

WORDS = ["alpha", "beta", "gamma", "delta"]
BATCH = 16
CKPT_EVERY = 10


def collate(samples):
    feats = torch.tensor([[s["text"].split().count(w) for w in WORDS] for s in samples], dtype=torch.float32)
    labels = torch.tensor([int(s["label"]) for s in samples])
    return feats, labels


def main() -> None:
    dataset = os.environ["SHARDSTREAM_DATASET"]
    ckpt_root = os.environ.get("CHECKPOINT_ROOT", dataset.rstrip("/") + "-checkpoints")
    steps = int(os.environ.get("STEPS", "100"))
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(len(WORDS), 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # The node cache, run id and node rank come from `shardstream run` (SHARDSTREAM_CACHE_DIR).
    ds = shardstream.StreamingDataset(remote=dataset, shuffle=True, shuffle_seed=7, batch_size=BATCH)
    loader = shardstream.StreamingDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=collate)

    step = 0
    latest = ss_ckpt.latest(ckpt_root)
    if latest is not None:
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "loader": "", "step": 0}
        dcp.load(state, storage_reader=ss_ckpt.StorageReader(latest))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(json.loads(state["loader"]))
        step = int(state["step"])
        print(f"resumed from {latest} at step {step}", flush=True)

    loss = torch.tensor(0.0)
    while step < steps:
        for feats, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(feats), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % CKPT_EVERY == 0 or step == steps:
                state = {"model": model.state_dict(), "optim": opt.state_dict(),
                         "loader": json.dumps(loader.state_dict()), "step": step}
                url = f"{ckpt_root.rstrip('/')}/step-{step:06d}"
                dcp.save(state, storage_writer=ss_ckpt.StorageWriter(url))
                if int(os.environ.get("RANK", "0")) == 0:
                    print(f"step {step}: loss {loss.item():.3f}, checkpoint {url}", flush=True)
            if step >= steps:
                break
    if distributed:
        dist.destroy_process_group()
    print(f"done: {step} steps, loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()

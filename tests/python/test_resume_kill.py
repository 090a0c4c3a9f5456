"""A small training loop (DataLoader with 2 workers, a linear model, SGD) that saves the loader
state with its checkpoint every few steps is killed with SIGKILL mid-epoch, restarted, and
finishes: the sequence of samples it trained on (up to the checkpoint, then after the restart)
equals that of an uninterrupted run, and so do the final weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch

from conftest import write_ids

N = 240
BATCH = 4
EPOCHS = 2
EVERY = 5

TRAIN = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from torch.utils.data import DataLoader
    import shardstream

    data, ckpt, log_path, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    ds = shardstream.StreamingDataset(local=data, shuffle=True, shuffle_seed=3, batch_size={batch},
                                      shuffle_window=2)
    step, epoch_steps = 0, 0
    if os.path.exists(ckpt):
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"]); opt.load_state_dict(saved["opt"])
        ds.load_state_dict(saved["loader"])
        step, epoch_steps = saved["step"], saved["epoch_steps"]
        with open(log_path) as f:
            lines = f.readlines()[:step]  # work after the checkpoint is lost
        with open(log_path, "w") as f:
            f.writelines(lines)
    log = open(log_path, "a")
    while ds.epoch < {epochs}:
        epoch = ds.epoch
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size={batch}, num_workers=2, multiprocessing_context="fork")
        for batch in loader:
            x = batch["x"].to(torch.float32).unsqueeze(1)
            loss = ((model(x) - batch["id"].to(torch.float32).unsqueeze(1)) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            step += 1; epoch_steps += 1
            log.write(json.dumps([epoch] + batch["id"].tolist()) + "\\n"); log.flush()
            if step % {every} == 0:
                state = {{"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                         "epoch_steps": epoch_steps,
                         "loader": ds.state_dict(num_samples=epoch_steps * {batch})}}
                torch.save(state, ckpt + ".tmp"); os.replace(ckpt + ".tmp", ckpt)
            time.sleep(delay)
        ds.set_epoch(epoch + 1); epoch_steps = 0
    torch.save(model.state_dict(), ckpt + ".final")
    """
).format(batch=BATCH, epochs=EPOCHS, every=EVERY)


def _run(tmp: Path, tag: str, env: dict, delay: float, kill_after_lines: int | None = None) -> None:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    ckpt, log = tmp / f"{tag}.pt", tmp / f"{tag}.log"
    cmd = [sys.executable, str(script), str(tmp / "mds"), str(ckpt), str(log), str(delay)]
    if kill_after_lines is None:
        subprocess.run(cmd, env=env, check=True, timeout=300)
        return
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    deadline = time.monotonic() + 180
    while not (log.exists() and len(log.read_text().splitlines()) >= kill_after_lines):
        assert proc.poll() is None, "the training run ended before it could be killed"
        assert time.monotonic() < deadline, "the training run made no progress"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its DataLoader workers
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_killed_run_resumes_with_the_same_sequence(tmp_path, stream_env):
    write_ids(tmp_path / "mds", N, size_limit=400)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    _run(tmp_path, "straight", env, 0.0)
    # Killed mid-epoch 0 (after step 13, checkpoint at 10), and again in epoch 1 (after step 88,
    # checkpoint at 85); the third start finishes.
    _run(tmp_path, "killed", env, 0.02, kill_after_lines=13)
    _run(tmp_path, "killed", env, 0.02, kill_after_lines=88)
    _run(tmp_path, "killed", env, 0.0)
    straight = (tmp_path / "straight.log").read_text().splitlines()
    resumed = (tmp_path / "killed.log").read_text().splitlines()
    assert len(straight) == EPOCHS * N // BATCH
    assert resumed == straight
    for e in range(EPOCHS):
        rows = [json.loads(line) for line in straight]
        ids = sorted(i for row in rows if row[0] == e for i in row[1:])
        assert ids == list(range(N)), f"epoch {e} is not every sample once"
    a = torch.load(tmp_path / "straight.pt.final")
    b = torch.load(tmp_path / "killed.pt.final")
    assert all(torch.equal(a[k], b[k]) for k in a)

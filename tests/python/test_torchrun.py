"""Real `torchrun` jobs (gloo, rendezvous on 127.0.0.1) streaming from a real S3 server (moto).

- 2 "nodes" x 2 processes (two torchrun invocations, --nnodes 2 --node-rank 0/1), each process
  with 2 DataLoader workers: the ranks' samples are disjoint, together every sample of the epoch
  (plus the documented padding), and, put back in position order, the same global order as a
  1 x 1 run.
- The 2 x 2 job saves its loader state after a few steps; a 1 x 3 job (another world size)
  loads it and continues exactly: the samples it reads are the 1 x 1 order from that point on.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import boto3

from conftest import write_ids

N = 301
BATCH = 4
STOP_STEP = 7

JOB = textwrap.dedent(
    """
    import json, os, sys
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    import shardstream

    remote, out_dir, workers, state_in, state_out, stop_step = sys.argv[1:7]
    workers, stop_step = int(workers), int(stop_step)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = shardstream.StreamingDataset(
        remote=remote, shuffle=True, shuffle_seed=5, batch_size={batch},
        num_canonical_nodes=2, shuffle_window=2,
    )
    if state_in != "-":
        with open(state_in) as f:
            ds.load_state_dict(json.load(f))
    start = ds.state_dict(num_samples=0, from_beginning=False)["sample_in_epoch"]
    loader = DataLoader(ds, batch_size={batch}, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    steps = []
    for step, batch in enumerate(loader):
        steps.append(batch["id"].tolist())
        if step + 1 == stop_step and state_out != "-":
            state = ds.state_dict(num_samples=(step + 1) * {batch} * world, from_beginning=False)
            if rank == 0:
                with open(state_out, "w") as f:
                    json.dump(state, f)
    dist.barrier()
    with open(os.path.join(out_dir, f"rank{{rank}}.json"), "w") as f:
        json.dump({{"rank": rank, "world": world, "start": start, "steps": steps,
                   "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
                   "node": int(os.environ["GROUP_RANK"])}}, f)
    dist.destroy_process_group()
    # Skip interpreter teardown (gloo threads can std::terminate at exit; see ckpt_helpers.py).
    sys.stdout.flush()
    os._exit(0)
    """
).format(batch=BATCH)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp: Path, env: dict, nnodes: int, nproc: int, args: list[str], tag: str) -> Path:
    out = tmp / tag
    out.mkdir()
    script = tmp / "job.py"
    script.write_text(JOB)
    port = _port()
    torchrun = str(Path(sys.executable).parent / "torchrun")
    procs = []
    for node in range(nnodes):
        cmd = [
            torchrun, f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--node-rank={node}",
            "--master-addr=127.0.0.1", f"--master-port={port}",
            str(script), args[0], str(out), *args[1:],
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        output, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"torchrun ({tag}) failed:\n{output[-4000:]}"
    return out


def _global(out: Path) -> tuple[int, dict[int, int]]:
    """Puts each rank's samples back at their global positions: the process of residue
    `local * nodes + node` reads positions `p >= start` with `p % processes == residue`."""
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    world = ranks[0]["world"]
    local_world = ranks[0]["local_world"]
    nodes = world // local_world
    start = ranks[0]["start"]
    positions: dict[int, int] = {}
    for r in ranks:
        local = r["rank"] % local_world
        residue = local * nodes + r["node"]
        ids = [i for step in r["steps"] for i in step]
        first = start + (residue - start) % world
        for k, sample in enumerate(ids):
            p = first + k * world
            assert p not in positions
            positions[p] = sample
    return start, positions


def test_torchrun_two_nodes_and_resume_at_another_size(tmp_path, moto, stream_env):
    data = tmp_path / "mds"
    write_ids(data, N, size_limit=500)
    bucket = moto.create_bucket("torchrun")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in data.iterdir():
        s3.upload_file(str(f), "torchrun", f"ds/{f.name}")
    remote = f"{bucket}/ds"
    env = dict(os.environ)
    env.update(moto.env)
    env.update(stream_env)
    env["OMP_NUM_THREADS"] = "1"

    ref_out = _torchrun(tmp_path, env, 1, 1, [remote, "0", "-", "-", "0"], "ref")
    _, ref_pos = _global(ref_out)
    ref = [ref_pos[p] for p in range(N)]
    assert sorted(ref) == list(range(N)) and ref != list(range(N))

    state = tmp_path / "state.json"
    two = _torchrun(tmp_path, env, 2, 2, [remote, "2", "-", str(state), str(STOP_STEP)], "two")
    start, pos = _global(two)
    assert start == 0
    real = {p: s for p, s in pos.items() if p < N}
    assert [real[p] for p in range(N)] == ref, "2 x 2 global order differs from 1 x 1"
    padding = {p: s for p, s in pos.items() if p >= N}
    assert len(padding) == -(-N // 4) * 4 - N  # each process at most one repeat
    assert all(pos[p] == pos[p - 4] for p in padding)
    per_rank = [json.loads(p.read_text()) for p in two.glob("rank*.json")]
    seen = [i for r in per_rank for step in r["steps"] for i in step]
    assert len(seen) == len(set(seen)) + len(padding), "ranks overlap beyond the padding"

    saved = json.loads(state.read_text())
    assert saved["sample_in_epoch"] == STOP_STEP * BATCH * 4
    three = _torchrun(tmp_path, env, 1, 3, [remote, "0", str(state), "-", "0"], "three")
    start3, pos3 = _global(three)
    assert start3 == saved["sample_in_epoch"]
    resumed = [pos3[p] for p in range(start3, N)]
    assert resumed == ref[start3:], "the 1 x 3 job did not continue where the 2 x 2 job stopped"

"""Helpers for the checkpoint tests, and the worker that `torchrun` runs.

As a script (under torchrun, or plain python for world size 1):

    ckpt_helpers.py save URL REF_DIR [--pause PHASE --pause-rank R --pause-dir DIR]
                                         [--part-size N] [--ballast-mb M]
    ckpt_helpers.py load URL REF_DIR
    ckpt_helpers.py async URL REF_DIR [--ballast-mb M]
    ckpt_helpers.py memory URL REF_DIR --ballast-mb M --budget-mb B --part-size N [--ballast-tensors K]

`save` trains a small MLP with Adam for a few steps (the same on every rank, seeded), shards every
parameter and every optimizer-state tensor over the ranks along dim 0 as DTensors, and saves
model + optimizer + a step counter with `dcp.save` and shardstream's StorageWriter. Rank 0 also
writes the full tensors to REF_DIR/ref.pt. `load` builds the same structure sharded over the
*current* world (plain tensors at world size 1), loads it with StorageReader, and checks every
tensor against ref.pt. `--pause PHASE` makes rank R write its pid to DIR/paused-PHASE and sleep
there, so a test can `kill -9` it at that point of the save:
  - `mid-upload`: in write_data, after the first item was handed to the uploader, before the file
    is finished (with a small part size, a multipart upload is in flight);
  - `before-commit`: the coordinator in finish, after every file and `.metadata` are uploaded,
    before the manifest is created.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN_STEPS = 3
WIDTH = 256


# --------------------------------------------------------------------------------------------
# Used by the tests (parent process)
# --------------------------------------------------------------------------------------------


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    """`torchrun` on 127.0.0.1 with a free rendezvous port, running this file."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "--max-restarts=0",
        str(HERE / "ckpt_helpers.py"),
        *args,
    ]


def run_workers(nproc: int, *args: str, env: dict | None = None, timeout: float = 300):
    """Runs the worker under torchrun (or plainly for nproc == 1); returns the CompletedProcess
    and fails with the output when it does not exit 0."""
    cmd = (
        torchrun_cmd(nproc, *args)
        if nproc > 1
        else [sys.executable, str(HERE / "ckpt_helpers.py"), *args]
    )
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=child_env(env), timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} on {nproc} process(es) failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def result_lines(proc) -> list[dict]:
    """The flat JSON objects the workers printed with `RESULT ` in front (ranks share stdout,
    so two may land on one line)."""
    import re

    return [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)]


def kill_at(nproc: int, phase: str, rank: int, url: str, ref_dir: Path, pause_dir: Path,
            env: dict | None = None, part_size: int | None = None, ballast_mb: int = 0) -> int:
    """Starts a save under torchrun that pauses `rank` at `phase`, SIGKILLs that process once it
    is there, and waits for torchrun to give up. Returns torchrun's exit code."""
    extra = ["--pause", phase, "--pause-rank", str(rank), "--pause-dir", str(pause_dir)]
    if part_size:
        extra += ["--part-size", str(part_size)]
    if ballast_mb:
        extra += ["--ballast-mb", str(ballast_mb)]
    cmd = torchrun_cmd(nproc, "save", url, str(ref_dir), *extra)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(env),
        start_new_session=True,
    )
    marker = pause_dir / f"paused-{phase}"
    deadline = time.monotonic() + 240
    try:
        while not marker.exists():
            if proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                raise AssertionError(f"save exited ({proc.returncode}) before pausing at {phase}:\n{out[-6000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"save never reached {phase}")
            time.sleep(0.05)
        time.sleep(0.1)  # the pid is written before the marker
        pid = int((pause_dir / f"pid-{phase}").read_text())
        os.kill(pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return proc.returncode
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------------------------
# The worker (child processes)
# --------------------------------------------------------------------------------------------


def _train():
    """A small MLP and its Adam state after TRAIN_STEPS identical steps on every rank."""
    import torch

    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 8 * 4)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.randn(32, WIDTH)
    for _ in range(TRAIN_STEPS):
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
    return model, opt


def _full_state(model, opt) -> dict:
    """{"model": {name: tensor}, "optim": {"<param>.<state>": tensor}} of plain tensors."""
    import torch

    names = {id(p): n for n, p in model.named_parameters()}
    optim = {}
    for p, st in opt.state.items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                optim[f"{names[id(p)]}.{k}"] = v.detach().clone()
    return {
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optim": optim,
    }


def _shard(full: dict, world: int, fill_zero: bool = False) -> dict:
    """Every tensor as a DTensor sharded along dim 0 over the current world (plain at 1)."""
    import torch

    out: dict = {}
    mesh = None
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (world,))
    for group, tensors in full.items():
        out[group] = {}
        for k, v in tensors.items():
            t = torch.zeros_like(v) if fill_zero else v
            if mesh is not None:
                from torch.distributed.tensor import Shard, distribute_tensor

                t = distribute_tensor(t, mesh, [Shard(0)])
            out[group][k] = t
    return out


class _Paused(Exception):
    pass


def _pause(args, phase: str, rank: int) -> None:
    if args.pause == phase and args.pause_rank == rank:
        d = Path(args.pause_dir)
        (d / f"pid-{phase}").write_text(str(os.getpid()))
        (d / f"paused-{phase}").write_text("")
        while True:  # until the test's SIGKILL
            time.sleep(1)


def _writer(args, rank: int):
    from shardstream.checkpoint import StorageWriter

    class PausingWriter(StorageWriter):
        def write_data(self, plan, planner):
            if args.pause == "mid-upload" and args.pause_rank == rank:
                from shardstream import checkpoint as ck

                orig_write = ck._ItemSink.write

                def write(sink, data):
                    n = orig_write(sink, data)
                    # More than a part of the ballast shard (larger than a part) is in its file:
                    # the file's multipart upload is open and a part is in flight.
                    if sink.file.bytes_written() > (args.part_size or 64 << 20):
                        _pause(args, "mid-upload", rank)
                    return n

                ck._ItemSink.write = write
            return super().write_data(plan, planner)

        def finish(self, metadata, results):
            if args.pause != "before-commit" or args.pause_rank != rank:
                return super().finish(metadata, results)
            from shardstream import checkpoint as ck

            # Pause right before the manifest put, after .metadata is uploaded.
            orig_store = ck._store
            ck._store = lambda root, storage_options=None: _PauseBeforeCommit(
                orig_store(root, storage_options), lambda: _pause(args, "before-commit", rank)
            )
            try:
                return super().finish(metadata, results)
            finally:
                ck._store = orig_store

    # Files over a part go up as multipart uploads (not one PUT) so that mid-upload is inside one.
    return PausingWriter(args.url, part_size=args.part_size, single_put_max=0)


class _PauseBeforeCommit:
    """A CheckpointStore proxy whose commit() pauses first."""

    def __init__(self, store, pause) -> None:
        self._store = store
        self._pause = pause

    def commit(self, *a, **kw):
        self._pause()
        return self._store.commit(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._store, name)


def count_fetched(reader) -> list[int]:
    """Makes `reader` (a shardstream StorageReader) count the item bytes it fetches; returns
    the one-element list the count accumulates in."""
    fetched = [0]
    orig_open = reader._open

    class Counting:
        def __init__(self, files):
            self.files = files

        def start_read(self, reqs):
            fetched[0] += sum(r[2] for r in reqs)
            return self.files.start_read(reqs)

        def __getattr__(self, name):
            return getattr(self.files, name)

    def counting_open():
        files = orig_open()
        return files if isinstance(files, Counting) else Counting(files)

    reader._open = counting_open
    return fetched


def _local_bytes(state: dict) -> int:
    """Tensor bytes this rank holds (its shards of DTensors)."""
    total = 0
    for group in ("model", "optim", "ballast"):
        for t in state.get(group, {}).values():
            t = t.to_local() if hasattr(t, "to_local") else t
            total += t.numel() * t.element_size()
    return total


def _compare(loaded: dict, ref: dict) -> tuple[int, int]:
    import torch

    n = nbytes = 0
    for group, tensors in ref.items():
        for k, want in tensors.items():
            got = loaded[group][k]
            if hasattr(got, "full_tensor"):
                got = got.full_tensor()
            if not torch.equal(got, want):
                raise AssertionError(f"{group}.{k} differs after load")
            n += 1
            nbytes += want.numel() * want.element_size()
    return n, nbytes


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["save", "load", "async", "memory"])
    ap.add_argument("url")
    ap.add_argument("ref_dir")
    ap.add_argument("--pause")
    ap.add_argument("--pause-rank", type=int, default=0)
    ap.add_argument("--pause-dir")
    ap.add_argument("--part-size", type=int)
    ap.add_argument("--ballast-mb", type=int, default=0)
    ap.add_argument("--budget-mb", type=int, default=512)
    ap.add_argument("--ballast-tensors", type=int, default=1)
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    ref_path = Path(args.ref_dir) / "ref.pt"

    if args.mode == "memory":
        # Peak RSS growth while saving --ballast-mb of tensors (--ballast-tensors of them) with
        # a --budget-mb upload budget.
        import resource

        from shardstream.checkpoint import StorageWriter

        mib = 1 << 20
        per = args.ballast_mb * mib // 4 // args.ballast_tensors
        state = {f"w{i}": torch.ones(per) for i in range(args.ballast_tensors)}  # allocated and touched
        dcp.save({"x": torch.zeros(4)}, storage_writer=StorageWriter(args.url + "_warm"), no_dist=True)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        writer = StorageWriter(args.url, part_size=args.part_size, memory_budget=args.budget_mb * mib)
        dcp.save(state, storage_writer=writer, no_dist=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("RESULT " + json.dumps({"growth": peak - base, "tensor": args.ballast_mb * mib}), flush=True)
        return 0
    if args.mode == "save":
        model, opt = _train()
        full = _full_state(model, opt)
        if args.ballast_mb:
            gen = torch.Generator().manual_seed(99)
            full["ballast"] = {"x": torch.randn(args.ballast_mb << 18, generator=gen)}
        state = _shard(full, world)
        state["meta"] = {"step": TRAIN_STEPS}
        dcp.save(state, storage_writer=_writer(args, rank))
        if rank == 0:
            torch.save(full, ref_path)
        print("RESULT " + json.dumps({"rank": rank, "saved": True}), flush=True)
    elif args.mode == "load":
        from shardstream.checkpoint import StorageReader

        ref = torch.load(ref_path, weights_only=True)
        state = _shard(ref, world, fill_zero=True)
        # A load may ask for a subset: here everything the reference has.
        state["meta"] = {"step": -1}
        reader = StorageReader(args.url)
        fetched = count_fetched(reader)
        dcp.load(state, storage_reader=reader)
        needed = _local_bytes(state)
        n, nbytes = _compare(state, ref)
        assert state["meta"]["step"] == TRAIN_STEPS, state["meta"]
        print("RESULT " + json.dumps({"rank": rank, "world": world, "tensors": n, "bytes": nbytes,
                                      "fetched": fetched[0], "needed": needed}), flush=True)
    else:  # async: save asynchronously and keep training while it uploads
        from shardstream.checkpoint import StorageWriter

        model, opt = _train()
        full = _full_state(model, opt)
        # Ballast, so that the upload takes long enough to train during it.
        gen = torch.Generator().manual_seed(99)
        full["ballast"] = {"x": torch.randn(max(args.ballast_mb, 1) << 18, generator=gen)}
        state = _shard(full, world)
        state["meta"] = {"step": TRAIN_STEPS}
        fut = dcp.async_save(state, storage_writer=StorageWriter(args.url))
        # async_save has staged a copy: changing the state now must not reach the checkpoint.
        for group in ("model", "optim", "ballast"):
            for t in state[group].values():
                (t.to_local() if hasattr(t, "to_local") else t).add_(1.0)
        if hasattr(fut, "upload_completion"):
            fut = fut.upload_completion
        steps = 0
        data = torch.randn(32, WIDTH)
        while not fut.done():
            opt.zero_grad()
            model(data).square().mean().backward()
            opt.step()
            steps += 1
        fut.result()
        if world > 1:
            dist.barrier()
        if rank == 0:
            torch.save(full, ref_path)
        changed = not torch.equal(model[0].weight.detach(), full["model"]["0.weight"])
        print("RESULT " + json.dumps({"rank": rank, "steps_during_upload": steps, "params_changed": changed}), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # The worker's work is done and reported (and its process group destroyed). Skip interpreter
    # teardown: gloo's background threads can hit std::terminate while C++ statics are destroyed
    # at exit, which once turned a finished, correct load into exit code -6 in CI.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

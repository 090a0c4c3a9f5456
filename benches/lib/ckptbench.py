"""Checkpoint runners: torch.distributed.checkpoint save and load of one state dict through torch's
FileSystemWriter/Reader (local disk), s3torchconnector's S3StorageWriter/Reader and shardstream's
StorageWriter/Reader (the S3 server), next to the ceilings (raw parallel PUT/GET of the same bytes
with boto3; write + fsync and read of the same bytes on local disk).

Every load is checked: each tensor equal to the saved one. Each DCP system also loads every other
tensor (a `partial load`, as a resume that needs only some keys does): the bytes the server sent
per byte asked for (the `amplif.` column, measured at the server for every S3 load) show whether a
reader fetches only what it needs. Run as a script (`python ckptbench.py SPEC_JSON`) it is the
child that does `runs` saves and loads of one system, one JSON line each.

With `ranks` > 1 the child starts that many rank processes (torch.distributed on gloo over
loopback TCP, as `torchrun` would): each rank holds a state dict of its own (`mb` MiB, keys of its
own) and every save and load is collective, timed by rank 0 from a barrier before to a barrier
after, so a figure is the slowest rank's. Only the S3 systems run there (the question is how
ranks share one server and its PUT/GET ceiling, where the ceiling's ranks each PUT/GET their own
bytes at the same time).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from measure import run_child
from results import Row, Skip, aggregate

SYSTEMS = [
    ("torch FileSystemWriter/Reader (local disk)", "peer", "import torch.distributed.checkpoint"),
    ("s3torchconnector S3StorageWriter/Reader", "peer", "import s3torchconnector.dcp"),
    ("shardstream.checkpoint StorageWriter/Reader", "shardstream",
     "from shardstream.checkpoint import StorageWriter, StorageReader"),
    ("ceiling: boto3 PUT/GET, 8 threads", "ceiling", "import boto3"),
    ("ceiling: local write+fsync / read", "ceiling", "import os"),
]


# The op of a load of every other tensor (its row's configuration in the report).
PARTIAL = "partial load (every other tensor)"


def _s3_only(system: str) -> bool:
    return "local" not in system


def _child(spec: dict) -> None:
    if spec.get("ranks", 1) > 1 and "rank" not in spec:
        _start_ranks(spec)
        return
    for system, _, probe in SYSTEMS:
        if spec.get("ranks", 1) > 1 and not _s3_only(system):
            continue
        try:
            exec(probe, {})
        except Exception as e:  # noqa: BLE001 - the reason is reported, never hidden
            print(json.dumps({"system": system, "skip": f"{probe!r} failed: {e.__class__.__name__}: {e}"}), flush=True)
            continue
        try:
            _one(spec, system)
        except (Exception, _checkpoint_exception()) as e:  # noqa: BLE001
            # A failed collective save or load raises on every rank at once, so the ranks go on
            # to the next system together.
            print(json.dumps({"system": system, "error": f"{e.__class__.__name__}: {str(e)[:300]}"}), flush=True)


def _checkpoint_exception() -> type[BaseException]:
    """torch's `CheckpointException`, which derives from BaseException (not Exception): a
    failed load (s3torchconnector's client gives up on moto's slow whole-object reads when 4 ranks
    share it) would otherwise end the rank instead of the one system."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except ImportError:
        return Exception
    return CheckpointException


def _start_ranks(spec: dict) -> None:
    """Run one process per rank; rank 0's lines are this child's output (the others' lines, which
    are only what fails on them, go to its stderr). A rank that exits non-zero fails the child."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(spec["ranks"]):
        rank_spec = {**spec, "rank": rank, "init": f"tcp://127.0.0.1:{port}"}
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(rank_spec)],
                                      stdout=None if rank == 0 else sys.stderr))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"rank exit codes {codes}")


def _one(spec: dict, system: str) -> None:
    import os
    import shutil

    import torch

    runs, mb = spec["runs"], spec["mb"]
    ranks, rank = spec.get("ranks", 1), spec.get("rank", 0)
    dist = None
    if ranks > 1:
        import datetime

        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=ranks,
                                    timeout=datetime.timedelta(seconds=spec.get("rank_timeout", 600)))
    n_tensors = 8
    per = mb * (1 << 20) // n_tensors // 4
    gen = torch.Generator().manual_seed(rank)
    # Keys of its own per rank: each rank saves and loads its own tensors, as data-parallel
    # ranks with sharded optimizer state (or pipeline stages) do.
    prefix_key = f"rank{rank}." if ranks > 1 else ""
    state = {f"{prefix_key}layer{i}.weight": torch.randn(per, generator=gen) for i in range(n_tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values()) * ranks

    def sync():
        if dist is not None:
            dist.barrier()

    def start():
        sync()
        return time.time()

    def sent_bytes():
        """What the S3 server has sent so far (its counter, read by rank 0 outside the timed part
        while every rank waits at a barrier); None off S3."""
        if rank != 0 or not _s3_only(system) or "counters_url" not in spec:
            return None
        from s3server import read_counters

        return read_counters(spec["counters_url"])["bytes_sent"]

    def emit(op, t0, check, rep, sent0=None, needed=None):
        """One timed operation's line; `needed`: the bytes it moved, of all ranks (default the
        whole state dict); `sent0`: the server's counter before it, for a load's amplification."""
        # Every rank's check travels to rank 0, which times the slowest rank (the barrier).
        checks = [check]
        if dist is not None:
            checks = [None] * ranks
            dist.all_gather_object(checks, check)
        t_end = time.time()
        if rep < 0 or rank != 0:  # the untimed first save/load: lazy imports and first-touch allocations
            return
        needed = needed or nbytes
        bad = sorted({c for c in checks if c != "ok"})
        line = {"system": system, "op": op, "rep": rep, "t0": t0, "t_end": t_end, "bytes": needed,
                "check": "; ".join(bad) or "ok"}
        if sent0 is not None:
            line["amp"] = (sent_bytes() - sent0) / needed
        print(json.dumps(line), flush=True)

    t_system = time.monotonic()

    def over_budget(rep):
        """After a timed run, whether this system has used its share of time (`budget_s`): the
        remaining runs are left out (the row's `runs` says how many counted). Rank 0 decides for
        every rank, so that no rank waits at a barrier the others have left."""
        stop = [rep >= 0 and time.monotonic() - t_system > spec.get("budget_s", float("inf"))]
        if dist is not None:
            dist.broadcast_object_list(stop, src=0)
        return stop[0]

    def drop(prefix):
        """Delete one run's objects once it is loaded (4 ranks x 1 GiB x 3 runs x 3 systems
        would not fit the server's disk or moto's memory); outside the timed part."""
        sync()
        if rank != 0 or "endpoint" not in spec:
            return
        import boto3
        from s3server import delete_prefix

        delete_prefix(boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id="bench",
                                   aws_secret_access_key="bench", region_name="us-east-1"), "bench", prefix)

    def compare(loaded):
        bad = [k for k in loaded if not torch.equal(state[k], loaded[k])]
        return "ok" if not bad else f"{len(bad)} tensors differ after load"

    def empty(every_other=False):
        return {k: torch.zeros_like(v) for i, (k, v) in enumerate(state.items()) if not every_other or i % 2 == 0}

    if system.startswith("ceiling: boto3"):
        import concurrent.futures as cf

        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id="bench", aws_secret_access_key="bench",
                          region_name="us-east-1", config=Config(max_pool_connections=16))
        blobs = {k: v.numpy().tobytes() for k, v in state.items()}
        for rep in range(-1, runs):
            prefix = f"ckpt/raw/{rep}"
            t0 = start()
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda kv: s3.put_object(Bucket="bench", Key=f"{prefix}/{kv[0]}", Body=kv[1]), blobs.items()))
            emit("save", t0, "ok", rep)
            sent0 = sent_bytes()
            t0 = start()
            with cf.ThreadPoolExecutor(8) as ex:
                got = dict(ex.map(lambda k: (k, s3.get_object(Bucket="bench", Key=f"{prefix}/{k}")["Body"].read()), blobs))
            emit("load", t0, "ok" if got == blobs else "bytes differ", rep, sent0)
            del got
            drop(prefix + "/")
            if over_budget(rep):
                break
        return
    if system.startswith("ceiling: local"):
        blobs = {k: v.numpy().tobytes() for k, v in state.items()}
        for rep in range(-1, runs):
            d = Path(spec["root"]) / f"raw{rep}"
            d.mkdir(parents=True, exist_ok=True)
            t0 = time.time()
            for k, b in blobs.items():
                with open(d / k, "wb") as f:
                    f.write(b)
                    f.flush()
                    os.fsync(f.fileno())
            emit("save", t0, "ok", rep)
            t0 = time.time()
            got = {k: (d / k).read_bytes() for k in blobs}
            emit("load", t0, "ok" if got == blobs else "bytes differ", rep)
            shutil.rmtree(d)
        return

    import torch.distributed.checkpoint as dcp

    for rep in range(-1, runs):
        if system.startswith("torch"):
            path = str(Path(spec["root"]) / f"torch{rep}")
            writer, reader = (lambda: dcp.FileSystemWriter(path)), (lambda: dcp.FileSystemReader(path))
        elif system.startswith("s3torchconnector"):
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client
            from s3torchconnector.dcp import S3StorageReader, S3StorageWriter

            key_prefix = f"ckpt/s3tc{rep}/"
            url, cfg = f"{spec['url']}/s3tc{rep}", S3ClientConfig(force_path_style=True)

            def with_endpoint(obj):
                # Its DCP classes take no endpoint argument; the loopback server needs one.
                obj.fs._client = S3Client(region="us-east-1", endpoint=spec["endpoint"], s3client_config=cfg)
                return obj

            writer = lambda: with_endpoint(S3StorageWriter(region="us-east-1", path=url, s3client_config=cfg))  # noqa: E731
            reader = lambda: with_endpoint(S3StorageReader(region="us-east-1", path=url, s3client_config=cfg))  # noqa: E731
        else:
            from shardstream.checkpoint import StorageReader, StorageWriter

            key_prefix = f"ckpt/ss{rep}/"
            url = f"{spec['url']}/ss{rep}"
            writer, reader = (lambda: StorageWriter(url)), (lambda: StorageReader(url))
        try:
            t0 = start()
            dcp.save(state, storage_writer=writer(), no_dist=dist is None)
            emit("save", t0, "ok", rep)
            loaded = empty()
            sent0 = sent_bytes()
            t0 = start()
            dcp.load(loaded, storage_reader=reader(), no_dist=dist is None)
            emit("load", t0, compare(loaded), rep, sent0)
            del loaded
            part = empty(every_other=True)
            part_bytes = sum(t.numel() * t.element_size() for t in part.values()) * ranks
            sent0 = sent_bytes()
            t0 = start()
            dcp.load(part, storage_reader=reader(), no_dist=dist is None)
            emit(PARTIAL, t0, compare(part), rep, sent0, part_bytes)
            del part
        finally:
            # Also after a failed (collective, so every rank's) save or load: its objects
            # would otherwise stay in the server's memory for the systems after it.
            if not system.startswith("torch"):
                drop(key_prefix)
        if over_budget(rep):
            break


def profile_name(mb: int, ranks: int = 1) -> str:
    """The report's name for one checkpoint shape (the `data` column; goals look rows up by it)."""
    return f"{mb} MiB state dict" if ranks == 1 else f"{ranks} ranks × {mb} MiB state dict"


def run_all(ctx, log, mb: int, ranks: int = 1) -> tuple[list[Row], list[Skip]]:
    """One child process runs every system in turn (torch is imported once); with `ranks` > 1 it
    starts one process per rank and only the S3 systems run."""
    import shutil

    rows, skips = [], []
    profile = profile_name(mb, ranks)
    root = ctx.work / "scratch" / f"ckpt{ranks}"
    # Each system gets the runner's per-child bound (a slow peer, e.g. s3torchconnector's ranged
    # GETs on moto, counts fewer runs rather than failing the whole child); the child's bound
    # leaves room for every system to overrun its share by one save and load.
    n_systems = sum(1 for system, _, _ in SYSTEMS if ranks == 1 or _s3_only(system))
    spec = {"runs": ctx.runs, "mb": mb, "ranks": ranks, "root": str(root), "url": "s3://bench/ckpt",
            "endpoint": ctx.server.endpoint, "counters_url": ctx.server.counters_url, "budget_s": ctx.timeout}
    bound = ctx.timeout * (2 if ranks == 1 else n_systems + 1)
    res = run_child([ctx.python, str(Path(__file__).resolve()), json.dumps(spec)], bound, env=ctx.server.env)
    shutil.rmtree(root, ignore_errors=True)
    failure = None
    if res.timed_out:
        failure = f"timed out after {bound:.0f} s"
    elif res.rc != 0:
        failure = "exit %s: %s" % (res.rc, (res.stderr_tail.strip().splitlines() or ["?"])[-1][:300])
    for system, kind, _ in SYSTEMS:
        if ranks > 1 and not _s3_only(system):
            continue
        lines = [x for x in res.lines if x.get("system") == system]
        skip = next((x["skip"] for x in lines if "skip" in x), None)
        if skip:
            if "shardstream" in system:
                skip = f"shardstream.checkpoint is not in the installed package: {skip}"
            skips.append(Skip("checkpoint", system, skip))
            log(f"checkpoint: skip {system}: {skip}")
            continue
        error = next((x["error"] for x in lines if "error" in x), None) or failure
        if not lines and not error:
            error = "no result"
        for op in ("save", "load") + ((PARTIAL,) if kind != "ceiling" else ()):
            runs = []
            for line in lines:
                if line.get("op") == op:
                    line["epoch_s"] = line["t_end"] - line["t0"]
                    line["peak_mem"] = res.sampler.peak(line["t0"], line["t_end"])
                    runs.append(line)
            row = aggregate("checkpoint", system, profile, op, kind, runs)
            if error and len(runs) < ctx.runs:
                row.check = (row.check + "; " if runs else "") + error
            rows.append(row)
        log(f"checkpoint ({profile}): {system}: " + " / ".join(r.check for r in rows if r.system == system))
    return rows, skips


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))

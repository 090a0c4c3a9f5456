"""Checkpoint runners: torch.distributed.checkpoint save and load of one state dict through torch's
FileSystemWriter/Reader (local disk), s3torchconnector's S3StorageWriter/Reader and shardstream's
StorageWriter/Reader (the S3 server), next to the ceilings (raw parallel PUT/GET of the same bytes
with boto3; write + fsync and read of the same bytes on local disk).

Every load is checked: each tensor equal to the saved one. Run as a script (`python ckptbench.py
SPEC_JSON`) it is the child that does `runs` saves and loads of one system, one JSON line each.
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


def _child(spec: dict) -> None:
    import importlib

    for system, _, probe in SYSTEMS:
        try:
            exec(probe, {})
        except Exception as e:  # noqa: BLE001 - the reason is reported, never hidden
            print(json.dumps({"system": system, "skip": f"{probe!r} failed: {e.__class__.__name__}: {e}"}), flush=True)
            continue
        try:
            _one(spec, system)
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"system": system, "error": f"{e.__class__.__name__}: {str(e)[:300]}"}), flush=True)
    del importlib


def _one(spec: dict, system: str) -> None:
    import os
    import shutil

    import torch

    runs, mb = spec["runs"], spec["mb"]
    n_tensors = 8
    per = mb * (1 << 20) // n_tensors // 4
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(per, generator=gen) for i in range(n_tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())

    def emit(op, t0, check, rep):
        if rep < 0:  # the untimed first save/load: lazy imports and first-touch allocations
            return
        print(json.dumps({"system": system, "op": op, "rep": rep, "t0": t0, "t_end": time.time(), "bytes": nbytes, "check": check}), flush=True)

    def compare(loaded):
        bad = [k for k in state if not torch.equal(state[k], loaded[k])]
        return "ok" if not bad else f"{len(bad)} tensors differ after load"

    def empty():
        return {k: torch.zeros_like(v) for k, v in state.items()}

    if system.startswith("ceiling: boto3"):
        import concurrent.futures as cf

        import boto3
        from botocore.config import Config

        s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id="bench", aws_secret_access_key="bench",
                          region_name="us-east-1", config=Config(max_pool_connections=16))
        blobs = {k: v.numpy().tobytes() for k, v in state.items()}
        for rep in range(-1, runs):
            prefix = f"ckpt/raw/{rep}"
            t0 = time.time()
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda kv: s3.put_object(Bucket="bench", Key=f"{prefix}/{kv[0]}", Body=kv[1]), blobs.items()))
            emit("save", t0, "ok", rep)
            t0 = time.time()
            with cf.ThreadPoolExecutor(8) as ex:
                got = dict(ex.map(lambda k: (k, s3.get_object(Bucket="bench", Key=f"{prefix}/{k}")["Body"].read()), blobs))
            emit("load", t0, "ok" if got == blobs else "bytes differ", rep)
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

            url, cfg = f"{spec['url']}/s3tc{rep}", S3ClientConfig(force_path_style=True)

            def with_endpoint(obj):
                # Its DCP classes take no endpoint argument; the loopback server needs one.
                obj.fs._client = S3Client(region="us-east-1", endpoint=spec["endpoint"], s3client_config=cfg)
                return obj

            writer = lambda: with_endpoint(S3StorageWriter(region="us-east-1", path=url, s3client_config=cfg))  # noqa: E731
            reader = lambda: with_endpoint(S3StorageReader(region="us-east-1", path=url, s3client_config=cfg))  # noqa: E731
        else:
            from shardstream.checkpoint import StorageReader, StorageWriter

            url = f"{spec['url']}/ss{rep}"
            writer, reader = (lambda: StorageWriter(url)), (lambda: StorageReader(url))
        t0 = time.time()
        dcp.save(state, storage_writer=writer())
        emit("save", t0, "ok", rep)
        loaded = empty()
        t0 = time.time()
        dcp.load(loaded, storage_reader=reader())
        emit("load", t0, compare(loaded), rep)
        del loaded


def run_all(ctx, log, mb: int) -> tuple[list[Row], list[Skip]]:
    """One child process runs every system in turn (torch is imported once)."""
    import shutil

    rows, skips = [], []
    root = ctx.work / "scratch" / "ckpt"
    spec = {"runs": ctx.runs, "mb": mb, "root": str(root), "url": "s3://bench/ckpt", "endpoint": ctx.server.endpoint}
    bound = ctx.timeout * 2
    res = run_child([ctx.python, str(Path(__file__).resolve()), json.dumps(spec)], bound, env=ctx.server.env)
    shutil.rmtree(root, ignore_errors=True)
    failure = None
    if res.timed_out:
        failure = f"timed out after {bound:.0f} s"
    elif res.rc != 0:
        failure = "exit %s: %s" % (res.rc, (res.stderr_tail.strip().splitlines() or ["?"])[-1][:300])
    for system, kind, _ in SYSTEMS:
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
        for op in ("save", "load"):
            runs = []
            for line in lines:
                if line.get("op") == op:
                    line["epoch_s"] = line["t_end"] - line["t0"]
                    line["peak_mem"] = res.sampler.peak(line["t0"], line["t_end"])
                    runs.append(line)
            row = aggregate("checkpoint", system, f"{mb} MiB state dict", op, kind, runs)
            if error and len(runs) < ctx.runs:
                row.check = (row.check + "; " if runs else "") + error
            rows.append(row)
        log(f"checkpoint: {system}: {rows[-2].check} / {rows[-1].check}")
    return rows, skips


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))

"""Checkpoint save/load throughput, side by side in one run:

  local disk : torch FileSystemWriter/FileSystemReader  vs  shardstream StorageWriter/StorageReader
  local S3   : raw parallel PUT/GET (boto3, 16 threads; whole objects, and ranged GETs of one
               multipart object as a load does)  vs  shardstream  vs  s3torchconnector's
               DCP S3StorageWriter/S3StorageReader (when importable; pip install s3torchconnector)

against one moto S3 server on 127.0.0.1 started here. One process saves a state dict of
`--tensors` float32 tensors totalling `--size-mb` MiB (`dcp.save(no_dist=True)`), then loads it
into fresh tensors; each figure is the best of `--repeat` runs, in GB/s (1e9 bytes/s) of tensor
bytes. Also reports the bytes a partial load (every other tensor) fetched per byte it needed.

    .venv/bin/python benches/checkpoint_bench.py --size-mb 512 --repeat 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from shardstream.checkpoint import StorageReader, StorageWriter

GB = 1e9


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_exe() -> str:
    """The moto server of this venv (as the tests and benches/run.py use), not whatever
    `moto_server` comes first on PATH: a global moto 5.2.1 there answers multipart uploads
    without the ETag header that s3torchconnector's client requires, which made this script
    report s3torchconnector as failing while benches/run.py (venv moto) measured it."""
    for exe in (os.environ.get("SHARDSTREAM_MOTO_SERVER"), str(Path(sys.executable).parent / "moto_server")):
        if exe and Path(exe).exists():
            return exe
    return shutil.which("moto_server") or "moto_server"


def moto_version(exe: str) -> str:
    """The moto version the server runs (read by the server's own interpreter)."""
    try:
        first = Path(exe).read_text(errors="replace").splitlines()[0]
        python = first[2:].strip() if first.startswith("#!") else sys.executable
        r = subprocess.run([python, "-c", "import moto; print(moto.__version__)"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout.strip() or "?"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "?"


class Moto:
    def __init__(self) -> None:
        exe = self.exe = moto_exe()
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).read()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto did not start")
                time.sleep(0.1)
        env = {
            "AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
        }
        os.environ.update(env)
        import boto3
        from botocore.config import Config

        self.s3 = boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(max_pool_connections=64),
        )

    def bucket(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        self.s3.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def make_state(size_mb: int, tensors: int) -> dict:
    per = (size_mb << 20) // tensors // 4
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(tensors)}


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def empty_like(state: dict) -> dict:
    return {k: torch.empty_like(v) for k, v in state.items()}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best(repeat: int, fn) -> float:
    return min(fn(i) for i in range(repeat))


def check_equal(a: dict, b: dict) -> None:
    for k in a:
        if not torch.equal(a[k], b[k]):
            raise AssertionError(f"{k} differs after load")


def bench_dcp(state, repeat, make_writer, make_reader) -> tuple[float, float]:
    """Best save and load seconds; make_writer(i)/make_reader(i) name run i's checkpoint."""
    save = best(repeat, lambda i: timed(lambda: dcp.save(state, storage_writer=make_writer(i), no_dist=True)))
    loaded = empty_like(state)
    load = best(repeat, lambda i: timed(lambda: dcp.load(loaded, storage_reader=make_reader(i), no_dist=True)))
    check_equal(state, loaded)
    return save, load


def bench_raw_s3(moto: Moto, total: int, obj_mb: int, repeat: int, threads: int = 16) -> tuple[float, float]:
    """Raw parallel PUT then GET of `total` bytes in objects of obj_mb MiB."""
    bucket = moto.bucket()
    body = os.urandom(obj_mb << 20)
    n = max(1, total // len(body))

    def put_all(i):
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda k: moto.s3.put_object(Bucket=bucket, Key=f"r{i}/{k}", Body=body), range(n)))

    def get_all(i):
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda k: moto.s3.get_object(Bucket=bucket, Key=f"r{i}/{k}")["Body"].read(), range(n)))

    put = best(repeat, lambda i: timed(lambda: put_all(i)))
    get = best(repeat, lambda i: timed(lambda: get_all(i)))
    return put * total / (n * len(body)), get * total / (n * len(body))


def bench_raw_ranged_get(moto: Moto, total: int, range_mb: int, repeat: int, threads: int = 16) -> float:
    """Parallel ranged GETs of range_mb MiB over one object of `total` bytes uploaded in
    range_mb MiB parts: the access pattern of a checkpoint load."""
    bucket = moto.bucket()
    step = range_mb << 20
    up = moto.s3.create_multipart_upload(Bucket=bucket, Key="big")
    parts = []
    chunk = os.urandom(step)
    n = max(1, total // step)
    for k in range(n):
        r = moto.s3.upload_part(Bucket=bucket, Key="big", UploadId=up["UploadId"], PartNumber=k + 1, Body=chunk)
        parts.append({"PartNumber": k + 1, "ETag": r["ETag"]})
    moto.s3.complete_multipart_upload(Bucket=bucket, Key="big", UploadId=up["UploadId"],
                                      MultipartUpload={"Parts": parts})

    def get_all(_):
        with cf.ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda k: moto.s3.get_object(
                Bucket=bucket, Key="big", Range=f"bytes={k * step}-{(k + 1) * step - 1}")["Body"].read(), range(n)))

    return best(repeat, lambda i: timed(lambda: get_all(i))) * total / (n * step)


def s3c_factories(moto: Moto, bucket: str):
    """s3torchconnector's DCP writer/reader pointed at moto, or None when not importable."""
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter
    except Exception as e:  # not installed
        return None, f"s3torchconnector not importable ({e.__class__.__name__}: {e})"
    config = S3ClientConfig(force_path_style=True)

    def fs():
        client = S3Client("us-east-1", endpoint=moto.endpoint, s3client_config=config)
        return S3FileSystem("us-east-1", s3_client=client)

    def writer(i):
        w = S3StorageWriter("us-east-1", f"s3://{bucket}/s3c/step_{i}", s3client_config=config)
        w.fs = fs()
        return w

    def reader(i):
        r = S3StorageReader("us-east-1", f"s3://{bucket}/s3c/step_{i}", s3client_config=config)
        r.fs = fs()
        return r

    return (writer, reader), None


def read_amplification(url: str, state: dict) -> float:
    """Loads every other tensor; bytes fetched / tensor bytes asked for."""
    part = {k: torch.empty_like(v) for i, (k, v) in enumerate(state.items()) if i % 2 == 0}
    reader = StorageReader(url)
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
    dcp.load(part, storage_reader=reader, no_dist=True)
    return fetched[0] / nbytes(part)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="local directory for the disk runs (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    state = make_state(args.size_mb, args.tensors)
    total = nbytes(state)
    rows: list[tuple[str, str, float | None, float | None]] = []
    notes: list[str] = []
    gbps = lambda secs: total / secs / GB  # noqa: E731

    work = Path(args.dir or tempfile.mkdtemp(prefix="ckpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        # Local disk.
        s, l = bench_dcp(state, args.repeat,
                         lambda i: FileSystemWriter(work / f"torch/step_{i}"),
                         lambda i: FileSystemReader(work / f"torch/step_{i}"))
        rows.append(("local disk", "torch FileSystemWriter/Reader", gbps(s), gbps(l)))
        s, l = bench_dcp(state, args.repeat,
                         lambda i: StorageWriter(work / f"ss/step_{i}"),
                         lambda i: StorageReader(work / f"ss/step_{i}"))
        rows.append(("local disk", "shardstream", gbps(s), gbps(l)))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    moto = Moto()
    try:
        put, get = bench_raw_s3(moto, total, 16, args.repeat)
        rows.append(("moto S3", "raw PUT/GET, 16 threads x 16 MiB objects", gbps(put), gbps(get)))
        ranged = bench_raw_ranged_get(moto, total, 16, args.repeat)
        rows.append(("moto S3", "raw ranged GET, 16 MiB ranges of one object", None, gbps(ranged)))
        bucket = moto.bucket()
        s, l = bench_dcp(state, args.repeat,
                         lambda i: StorageWriter(f"s3://{bucket}/ss/step_{i}", part_size=16 << 20),
                         lambda i: StorageReader(f"s3://{bucket}/ss/step_{i}"))
        rows.append(("moto S3", "shardstream (16 MiB parts)", gbps(s), gbps(l)))
        amp = read_amplification(f"s3://{bucket}/ss/step_0", state)
        notes.append(f"partial load (every other tensor) fetched {amp:.4f} bytes per byte needed")
        factories, why = s3c_factories(moto, bucket)
        if factories is None:
            notes.append(why)
        else:
            try:
                s, l = bench_dcp(state, args.repeat, *factories)
                rows.append(("moto S3", "s3torchconnector DCP writer/reader", gbps(s), gbps(l)))
            except (Exception, CheckpointException) as e:  # the latter is a BaseException
                notes.append(f"s3torchconnector failed against moto: {e.__class__.__name__}: {str(e).strip().splitlines()[-1][:300]}")
    finally:
        moto.stop()

    print(f"state: {args.tensors} float32 tensors, {total / GB:.3f} GB; best of {args.repeat}; "
          f"torch {torch.__version__}; {os.cpu_count()} CPUs; moto {moto_version(moto.exe)} ({moto.exe}); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'store':<12} {'what':<44} {'save GB/s':>10} {'load GB/s':>10}")
    for store, what, s, l in rows:
        cell = lambda v: f"{v:>10.3f}" if v is not None else f"{'-':>10}"  # noqa: E731
        print(f"{store:<12} {what:<44} {cell(s)} {cell(l)}")
    for n in notes:
        print("note:", n)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "bytes": total, "repeat": args.repeat,
            "rows": [{"store": a, "what": b, "save_gbps": c, "load_gbps": d} for a, b, c, d in rows],
            "notes": notes,
        }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

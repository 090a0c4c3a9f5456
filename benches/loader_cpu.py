"""Where a cold DataLoader epoch's CPU goes: the same epochs as `run.py`'s cold rows
(`StreamingDataset` from the counting moto server, `DataLoader(num_workers=2)`, shuffled, a fresh
cache per epoch), with the CPU time of every part measured separately.

    .venv/bin/python benches/loader_cpu.py [--profile 10KB] [--mode samples|batches|memory] [--epochs 8]

Per epoch it prints (medians at the end): the epoch's time from construction to the last sample,
the first batch's, the S3 requests, and CPU milliseconds of
  - the S3 server process (moto; from /proc/PID/stat, so in 10 ms ticks),
  - the training process (the consumer: unpickling and checking what the workers send),
  - each worker's Python thread and its engine's threads, by thread name (I/O = the tokio
    runtime, `shardstream-io`), and the CPU of its threads that ended before the count
    (`ended`: the stream's reader thread, from the process total).
`--mode memory` runs `run.py`'s in-memory ceiling instead (the same samples made in the worker,
no storage), for comparison. Needs the datasets of `run.py` (written under --work when missing)
and a release build of the binding (`maturin develop --release`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches" / "lib"))

import datasets  # noqa: E402
from s3server import S3Server  # noqa: E402

BATCH = 64


def process_cpu_ms(pid: int) -> float:
    """User + system CPU of a process (all its threads, ended ones too), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def threads_cpu_ms() -> dict[str, float]:
    """CPU of this process's live threads by name, in ms (schedstat: nanoseconds)."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + ns / 1e6
    return out


def keep(batch):
    """The DataLoader's collate_fn: batches are made in the worker already (run.py does the same
    for the batch path, so that numpy columns are not turned into tensors)."""
    return batch


class Report:
    """What a worker sends after its last sample: its id and CPU split."""

    def __init__(self, worker: int, process_cpu_ms: float) -> None:
        self.worker = worker
        self.threads = threads_cpu_ms()
        self.ended = max(0.0, process_cpu_ms - sum(self.threads.values()))


def build(mode: str, remote: str, local: str, n: int, size: int):
    """This epoch's DataLoader: batches of (ids, data) as `run.py`'s consumer gets them."""
    import torch.utils.data as tud

    if mode == "memory":
        order = list(range(n))
        random.Random(1).shuffle(order)
        pad = bytes(size - min(8, size))

        def produce(worker: int, workers: int):
            for start in range(worker * BATCH, n, workers * BATCH):
                ids = order[start:start + BATCH]
                yield ids, [i.to_bytes(8, "little")[: min(8, size)] + pad for i in ids]
    else:
        import shardstream

        ds = shardstream.StreamingDataset(remote=remote, local=local, shuffle=True, shuffle_seed=1,
                                          batch_size=BATCH)

        def produce(worker: int, workers: int):
            if mode == "batches":  # the columns cross as they are, as in run.py
                for b in ds.iter_batches(BATCH):
                    col = b["data"]
                    yield b["id"], (col.data, col.offsets)
            else:
                ids, data = [], []
                for s in ds:
                    ids.append(s["id"])
                    data.append(s["data"])
                    if len(ids) == BATCH:
                        yield ids, data
                        ids, data = [], []
                if ids:
                    yield ids, data

    class Epoch(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            yield from produce(info.id, info.num_workers)
            # The worker is a fresh process (forked for this epoch): its CPU clock starts at 0.
            yield Report(info.id, time.process_time() * 1000)

    return tud.DataLoader(Epoch(), batch_size=None, num_workers=2, multiprocessing_context="fork",
                          collate_fn=keep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="10KB", choices=["100B", "10KB", "1MB"])
    ap.add_argument("--mode", default="samples", choices=["samples", "batches", "memory"],
                    help="per-sample dicts, iter_batches columns, or the in-memory ceiling")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--work", default=str(REPO / ".bench-work" / "run"), help="run.py's work folder")
    args = ap.parse_args()
    work = Path(args.work)
    subprocess.run([sys.executable, str(REPO / "benches/lib/datasets.py"), str(work), "0"], check=True,
                   stdout=subprocess.DEVNULL)
    profile = next(p for p in datasets.profiles(False) if p.name == args.profile)
    scratch = Path(tempfile.mkdtemp(prefix="loader-cpu-"))
    rows = []
    with S3Server(sys.executable) as server:
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        datasets.upload(s3, "bench", work / "data" / "mds" / profile.name, f"mds/{profile.name}")
        os.environ.update(server.env)
        os.environ["SHARDSTREAM_RUN_ID"] = "loader-cpu"

        def requests() -> int:
            with urllib.request.urlopen(server.endpoint + "/_bench/counters", timeout=5) as r:
                return json.loads(r.read())["requests"]

        import torch  # noqa: F401  (imported before timing, as run.py's children do)

        for epoch in range(args.epochs + 1):  # the first, untimed, pays the lazy imports
            local = scratch / f"cache{epoch}"
            req0, moto0, own0 = requests(), process_cpu_ms(server.proc.pid), time.process_time()
            t0 = time.perf_counter()
            loader = build(args.mode, f"s3://bench/mds/{profile.name}", str(local), profile.samples,
                           profile.sample_bytes)
            first, n, reports = None, 0, []
            for item in loader:
                if isinstance(item, Report):
                    reports.append(item)
                    continue
                if first is None:
                    first = time.perf_counter() - t0
                ids, data = item
                if isinstance(data, tuple):  # iter_batches: one buffer and its offsets
                    buf, offsets = memoryview(data[0]), data[1].tolist()
                    ids = ids.tolist()
                    data = [buf[offsets[k]:offsets[k + 1]] for k in range(len(ids))]
                for i, d in zip(ids, data):  # every sample's length and id bytes
                    if len(d) != profile.sample_bytes or bytes(d[:8]) != i.to_bytes(8, "little")[:8]:
                        raise SystemExit(f"sample {i}: wrong bytes")
                n += len(ids)
            elapsed = time.perf_counter() - t0
            own = (time.process_time() - own0) * 1000
            moto = process_cpu_ms(server.proc.pid) - moto0
            req = requests() - req0
            del loader
            shutil.rmtree(local, ignore_errors=True)
            if n != profile.samples:
                raise SystemExit(f"epoch {epoch}: {n} samples, expected {profile.samples}")
            if epoch == 0:
                continue
            row = {"epoch ms": elapsed * 1000, "first batch ms": first * 1000, "requests": req,
                   "moto CPU ms": moto, "training process CPU ms": own}
            for r in sorted(reports, key=lambda r: r.worker):
                for name, ms in r.threads.items():
                    key = {"pt_data_worker": "Python thread"}.get(name, name)
                    row[f"worker {r.worker} {key} ms"] = row.get(f"worker {r.worker} {key} ms", 0) + ms
                row[f"worker {r.worker} ended threads ms"] = r.ended
            rows.append(row)
            print(json.dumps({k: round(v, 1) for k, v in row.items()}), flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{args.profile}, {args.mode}, cold, DataLoader(2), shuffled: medians of {len(rows)} epochs")
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        print(f"  {key:40} {statistics.median(values):8.1f}")


if __name__ == "__main__":
    main()

"""Where a cold `DataLoader(2)` epoch of shardstream's batch path spends its time.

Serves one of the streaming benchmark's MDS sets from the benchmark's moto server and runs cold
epochs of `iter_batches` through `DataLoader(num_workers=2)`, shuffled, each on an empty cache.
For each epoch it prints, in ms from just before the dataset is built (with `--setup S`, from
the start of the iteration, S seconds later): when each worker began
iterating, when each worker yielded its batches, when the training process received them, and
when the loop ended (after the DataLoader shut its workers down); with `--files`, also when each
shard's temp file appeared in the cache and when it was committed. It is a diagnostic, not a
benchmark (benches/run.py measures); docs/python-internals.md ("Prefetch at construction") quotes it.

    .venv/bin/python benches/cold_timeline.py --profile 10KB --epochs 6
    .venv/bin/python benches/cold_timeline.py --profile 10KB --epochs 6 --no-prefetch-on-init
    .venv/bin/python benches/cold_timeline.py --profile 10KB --epochs 6 --setup 1
    .venv/bin/python benches/cold_timeline.py --profile 10KB --epochs 8 --loader streaming
    .venv/bin/python benches/cold_timeline.py --profile 10KB --epochs 8 --loader streaming --no-early-first-batch

`--loader streaming` iterates through `shardstream.StreamingDataLoader` (batch groups, and the
first batch read in the training process) instead of a plain DataLoader; the workers' own
events are then not logged (the loader needs `iter_batches`' batches unwrapped).

The data sets are the ones `benches/run.py` writes under `.bench-work/run/data` (it writes them
if they are missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "lib"))

import datasets  # noqa: E402
from s3server import S3Server  # noqa: E402

BATCH = 64


def keep(batch):
    return batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="10KB", help="100B, 10KB or 1MB")
    ap.add_argument("--epochs", type=int, default=5, help="timed epochs (one untimed first)")
    ap.add_argument("--no-prefetch-on-init", action="store_true", help="StreamingDataset(prefetch_on_init=False)")
    ap.add_argument("--loader", choices=("torch", "streaming"), default="torch",
                    help="a plain torch DataLoader, or shardstream.StreamingDataLoader")
    ap.add_argument("--no-early-first-batch", action="store_true",
                    help="with --loader streaming: StreamingDataLoader(early_first_batch=False)")
    ap.add_argument("--files", action="store_true", help="also poll the cache folder (costs CPU)")
    ap.add_argument("--quiet", action="store_true", help="one line per epoch")
    ap.add_argument("--setup", type=float, default=0.0, metavar="S",
                    help="seconds between building the dataset and iterating (a script building its model); "
                         "times are then counted from the iteration's start")
    a = ap.parse_args()

    work = REPO / ".bench-work" / "run"
    profile = next(p for p in datasets.profiles(False) if p.name == a.profile)
    src = work / "data" / "mds" / profile.name
    if not (src / "index.json").exists():
        subprocess.run([sys.executable, str(HERE / "lib" / "datasets.py"), str(work), "0"], check=True,
                       stdout=subprocess.DEVNULL)

    import numpy as np  # noqa: F401  (imported before timing, as the benchmark's consumer does)
    import torch  # noqa: F401
    from torch.utils.data import DataLoader, IterableDataset

    import shardstream

    log_dir = Path(tempfile.mkdtemp(prefix="cold-timeline-"))

    class Batches(IterableDataset):
        def __init__(self, ds) -> None:
            self.ds = ds

        def __iter__(self):
            with open(log_dir / f"worker.{os.getpid()}", "w") as log:
                log.write(f"start {time.time()}\n")
                for b in self.ds.iter_batches(BATCH):
                    log.write(f"yield {time.time()}\n")
                    yield b

    with S3Server(sys.executable) as server:
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        datasets.upload(s3, "bench", src, f"mds/{profile.name}")
        os.environ.update({"AWS_ENDPOINT_URL": server.endpoint, "AWS_ACCESS_KEY_ID": "x",
                           "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1"})
        epochs, firsts = [], []
        for epoch in range(a.epochs + 1):
            for f in log_dir.glob("worker.*"):
                f.unlink()
            local = tempfile.mkdtemp(prefix="cold-cache-")
            seen: dict[str, float] = {}
            stop = threading.Event()

            def poll(local=local, seen=seen, stop=stop) -> None:
                while not stop.is_set():
                    for _, _, files in os.walk(local):
                        for f in files:
                            seen.setdefault(f, time.time())
                    time.sleep(0.002)

            poller = threading.Thread(target=poll, daemon=True)
            t0 = time.time()
            if a.files:
                poller.start()
            ds = shardstream.StreamingDataset(remote=f"s3://bench/mds/{profile.name}", local=local, shuffle=True,
                                              shuffle_seed=1, batch_size=BATCH,
                                              prefetch_on_init=not a.no_prefetch_on_init)
            if a.setup:
                time.sleep(a.setup)
                t0 = time.time()
            if a.loader == "streaming":
                loader = shardstream.StreamingDataLoader(ds.iter_batches(BATCH), batch_size=None, num_workers=2,
                                                         collate_fn=keep,
                                                         early_first_batch=not a.no_early_first_batch)
            else:
                loader = DataLoader(Batches(ds), batch_size=None, num_workers=2, collate_fn=keep)
            received, samples = [], 0
            for b in loader:
                received.append(time.time())
                samples += len(b["id"])
            t_end = time.time()
            stop.set()
            if poller.is_alive():
                poller.join()
            shutil.rmtree(local, ignore_errors=True)
            if samples != profile.samples:
                raise SystemExit(f"epoch {epoch}: {samples} samples, expected {profile.samples}")
            if epoch == 0:
                continue  # imports and first-use costs
            ms = lambda t: round(1000 * (t - t0))  # noqa: E731
            epochs.append(1000 * (t_end - t0))
            firsts.append(1000 * (received[0] - t0))
            print(f"epoch {epoch}: {ms(t_end)} ms ({samples / (t_end - t0):,.0f} samples/s), first batch {ms(received[0])}, "
                  f"last batch {ms(received[-1])}")
            if a.quiet:
                continue
            for f in sorted(log_dir.glob("worker.*")):
                events = [line.split() for line in f.read_text().splitlines()]
                start = next(float(t) for k, t in events if k == "start")
                yields = [ms(float(t)) for k, t in events if k == "yield"]
                print(f"  worker {f.suffix[1:]}: began {ms(start)}, yielded at {yields}")
            print(f"  received at {[ms(t) for t in received]}")
            if a.files:
                temp = sorted(ms(t) for f, t in seen.items() if f.rsplit(".", 1)[-1].isdigit())
                done = sorted(ms(t) for f, t in seen.items() if len(f) == 32 and "." not in f)
                print(f"  shard downloads began {temp}, committed {done}")
        print(f"median of {len(epochs)}: epoch {statistics.median(epochs):.0f} ms "
              f"({profile.samples / statistics.median(epochs) * 1000:,.0f} samples/s), "
              f"first batch {statistics.median(firsts):.0f} ms")
    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

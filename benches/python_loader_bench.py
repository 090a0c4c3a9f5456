"""shardstream vs mosaicml-streaming through a torch DataLoader: samples/s, time to first sample
and peak RSS of the process tree, on the same MDS data (written by Mosaic's MDSWriter).

samples/s counts the samples after the first batch over the time after it; time to first sample
runs from the dataset's construction (imports excluded) to the first batch.

    .venv/bin/python benches/python_loader_bench.py [--out DIR] [--json FILE] [--quick]

Every measurement runs in a fresh process (so RSS and caches start equal); the parent samples
the RSS of the child's whole tree (DataLoader workers included) every 10 ms. Datasets: 10 KB
samples and 100 B samples, read from a local folder (warm page cache; shardstream reads in
place, Mosaic reads its local copy). Configurations: DataLoader num_workers 0 and 2 with
per-sample dicts, plus shardstream's batch path (`iter_batches`, the same worker counts; with
workers it runs as `shardstream.StreamingDataLoader(ds.iter_batches(n), batch_size=None,
collate_fn=lambda b: b)`, which moves small batches from the workers in groups, with numpy
columns not turned into tensors one shared-memory segment each; and, as `batches-one-by-one`,
through a plain DataLoader). `--batch N` sets every set's batch size.
`--sets 1MB` adds 1 MB samples (not in the default run); `--modes iter,iter-zero-copy` measures
plain iteration without a DataLoader, with `bytes` values and with `zero_copy=True` buffers;
`--modes getitem,getitem-random` measures random access (`ds[i]` over every index, in order and
shuffled).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
lib, path, workers, batch, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
from torch.utils.data import DataLoader
if lib == "shardstream":
    import shardstream
else:
    import streaming
t0 = time.perf_counter()
if lib == "shardstream":
    import shardstream
    extra = {"zero_copy": True} if mode == "iter-zero-copy" else {}
    ds = shardstream.StreamingDataset(local=path, batch_size=batch, **extra)
else:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    ds = StreamingDataset(local=path, batch_size=batch, shuffle=False)
n, first, t1 = 0, None, None
if mode.startswith("batches"):
    # The batch path; the 100 B set reads its numeric columns, the others every column.
    cols = ["id", "x"] if os.path.basename(path) == "100B" else None
    batches = ds.iter_batches(batch, columns=cols)
    if workers:  # the batch path through DataLoader workers: batches cross as they are made
        # (`batches-one-by-one`: a plain DataLoader, which takes them one round trip each)
        loader = DataLoader if mode == "batches-one-by-one" else shardstream.StreamingDataLoader
        batches = loader(batches, batch_size=None, num_workers=workers,
                         multiprocessing_context="fork", collate_fn=lambda b: b)
elif mode.startswith("getitem"):
    # Random access, `ds[i]` over every index: in order, or in a shuffled order
    # (`getitem-random`), each sample counted as a batch of one.
    import random
    order = list(range(len(ds)))
    if mode == "getitem-random":
        random.Random(0).shuffle(order)
    batches = ([ds[i]["id"]] for i in order)
elif mode.startswith("iter"):
    # Plain iteration of the dataset (no DataLoader): each sample counts as a batch of one,
    # after a view of its `pad` column (what a consumer does first with bytes or a buffer).
    batches = ([s["id"]] if memoryview(s["pad"]).nbytes else [] for s in ds)
else:
    batches = DataLoader(ds, batch_size=batch, num_workers=workers,
                         multiprocessing_context="fork" if workers else None)
for b in batches:
    ids = b if mode.startswith(("iter", "getitem")) else b["id"]
    if first is None:
        t1 = time.perf_counter()
        first = t1 - t0
    else:
        n += len(ids)
elapsed = time.perf_counter() - t1
print(json.dumps({"samples": n, "seconds": elapsed, "first": first}))
"""


def tree_rss(root: int) -> int:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except OSError:
            pass
        todo.extend(children.get(pid, []))
    return total


def measure(lib: str, path: Path, workers: int, batch: int, mode: str, env: dict) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, lib, str(path), str(workers), str(batch), mode],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    peak, done = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{lib} {mode} workers={workers} failed:\n{err[-3000:]}")
    r = json.loads(out.strip().splitlines()[-1])
    r.update(lib=lib, workers=workers, mode=mode, batch=batch, peak_rss_mib=round(peak / 2**20, 1),
             samples_per_s=round(r["samples"] / r["seconds"]))
    return r


def write(path: Path, n: int, size: int, shard_bytes: int) -> None:
    import numpy as np
    from streaming import MDSWriter

    with MDSWriter(out=str(path), columns={"id": "int", "x": "uint32", "pad": "bytes"},
                   size_limit=shard_bytes) as w:
        for i in range(n):
            w.write({"id": i, "x": np.uint32(i), "pad": bytes([i % 251]) * size})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="where to write the datasets")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="smaller datasets")
    ap.add_argument("--sets", default="10KB,100B",
                    help="comma-separated datasets to measure (of 10KB, 100B, 1MB)")
    ap.add_argument("--libs", default="mosaicml-streaming,shardstream",
                    help="comma-separated libraries to measure")
    ap.add_argument("--workers", default="0,2", help="comma-separated DataLoader num_workers")
    ap.add_argument("--no-batches", action="store_true", help="skip the batch path")
    ap.add_argument("--batch", type=int, default=None, help="batch size of every set (default: 64, 256, 8)")
    ap.add_argument("--shard-bytes", type=int, default=1 << 26,
                    help="the datasets' shard size limit (default 64 MiB; smaller gives more shards, "
                         "as random access over many shards needs)")
    ap.add_argument("--modes", default="samples",
                    help="comma-separated per-sample modes: samples (DataLoader), iter, iter-zero-copy, "
                         "getitem, getitem-random")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ss-bench-"))
    scale = 4 if args.quick else 1
    # name: (samples, bytes of the `pad` column, batch size)
    all_sets = {"10KB": (20_000 // scale, 10_000, 64), "100B": (400_000 // scale, 100, 256),
                "1MB": (2_000 // scale, 1_000_000, 8)}
    sets = {name: all_sets[name] for name in args.sets.split(",")}
    if args.batch:
        sets = {name: (n, size, args.batch) for name, (n, size, _) in sets.items()}
    libs = args.libs.split(",")
    worker_counts = [int(w) for w in args.workers.split(",")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("SHARDSTREAM_RUN_ID", f"bench-{os.getpid()}")
    env.setdefault("SHARDSTREAM_CACHE_ROOT", str(out / "cache"))
    results = []
    for name, (n, size, batch) in sets.items():
        path = out / (name if args.shard_bytes == 1 << 26 else f"{name}-{args.shard_bytes}")
        if not (path / "index.json").exists():
            write(path, n, size, args.shard_bytes)
        for mode in args.modes.split(","):
            for lib in libs:
                if mode == "iter-zero-copy" and lib != "shardstream":
                    continue
                for workers in worker_counts if mode == "samples" else [0]:
                    r = measure(lib, path, workers, batch, mode, env)
                    r["dataset"] = name
                    results.append(r)
                    print(json.dumps(r), flush=True)
        if "shardstream" in libs and not args.no_batches:
            for workers in worker_counts:
                for mode in ("batches", "batches-one-by-one") if workers else ("batches",):
                    r = measure("shardstream", path, workers, batch, mode, env)
                    r["dataset"] = name
                    results.append(r)
                    print(json.dumps(r), flush=True)
    print()
    print(f"{'dataset':8} {'library':20} {'mode':18} {'workers':>7} {'samples/s':>10} {'first (s)':>9} {'peak RSS MiB':>12}")
    for r in results:
        print(f"{r['dataset']:8} {r['lib']:20} {r['mode']:18} {r['workers']:>7} {r['samples_per_s']:>10} "
              f"{r['first']:>9.2f} {r['peak_rss_mib']:>12}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

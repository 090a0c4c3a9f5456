"""shardstream vs mosaicml-streaming through a torch DataLoader: samples/s, time to first sample
and peak RSS of the process tree, on the same MDS data (written by Mosaic's MDSWriter).

samples/s counts the samples after the first batch over the time after it; time to first sample
runs from the dataset's construction (imports excluded) to the first batch.

    .venv/bin/python benches/python_loader_bench.py [--out DIR] [--json FILE] [--quick]

Every measurement runs in a fresh process (so RSS and caches start equal); the parent samples
the RSS of the child's whole tree (DataLoader workers included) every 10 ms. Datasets: 10 KB
samples and 100 B samples, read from a local folder (warm page cache; shardstream reads in
place, Mosaic reads its local copy). Configurations: DataLoader num_workers 0 and 2 with
per-sample dicts, plus shardstream's batch path (`iter_batches`) for the 100 B set.
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
    ds = shardstream.StreamingDataset(local=path, batch_size=batch)
else:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    clean_stale_shared_memory()
    ds = StreamingDataset(local=path, batch_size=batch, shuffle=False)
n, first, t1 = 0, None, None
batches = (ds.iter_batches(batch, columns=["id", "x"]) if mode == "batches" else
           DataLoader(ds, batch_size=batch, num_workers=workers,
                      multiprocessing_context="fork" if workers else None))
for b in batches:
    if first is None:
        t1 = time.perf_counter()
        first = t1 - t0
    else:
        n += len(b["id"])
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


def write(path: Path, n: int, size: int) -> None:
    import numpy as np
    from streaming import MDSWriter

    with MDSWriter(out=str(path), columns={"id": "int", "x": "uint32", "pad": "bytes"},
                   size_limit=1 << 26) as w:
        for i in range(n):
            w.write({"id": i, "x": np.uint32(i), "pad": bytes([i % 251]) * size})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="where to write the datasets")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--quick", action="store_true", help="smaller datasets")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="ss-bench-"))
    scale = 4 if args.quick else 1
    sets = {"10KB": (20_000 // scale, 10_000, 64), "100B": (400_000 // scale, 100, 256)}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("SHARDSTREAM_RUN_ID", f"bench-{os.getpid()}")
    env.setdefault("SHARDSTREAM_CACHE_ROOT", str(out / "cache"))
    results = []
    for name, (n, size, batch) in sets.items():
        path = out / name
        if not (path / "index.json").exists():
            write(path, n, size)
        for lib in ("mosaicml-streaming", "shardstream"):
            for workers in (0, 2):
                r = measure(lib, path, workers, batch, "samples", env)
                r["dataset"] = name
                results.append(r)
                print(json.dumps(r), flush=True)
        if name == "100B":
            r = measure("shardstream", path, 0, batch, "batches", env)
            r["dataset"] = name
            results.append(r)
            print(json.dumps(r), flush=True)
    print()
    print(f"{'dataset':8} {'library':20} {'mode':8} {'workers':>7} {'samples/s':>10} {'first (s)':>9} {'peak RSS MiB':>12}")
    for r in results:
        print(f"{r['dataset']:8} {r['lib']:20} {r['mode']:8} {r['workers']:>7} {r['samples_per_s']:>10} "
              f"{r['first']:>9.2f} {r['peak_rss_mib']:>12}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

"""The worker -> training-process transport of a plain `DataLoader(ds, batch_size=64,
num_workers=2)` with the default collate, for samples `{"id": i, "x": <bytes>}` made in memory in
the worker: plain `bytes` through the pipe against `shardstream._transport.SharedBytes` through
the worker's shared ring (docs/python.md, "Large sample values from workers").

    .venv/bin/python benches/loader_transport.py [--sizes 1MB,10KB] [--reps 3] [--modes ...]
    .venv/bin/python benches/loader_transport.py --mds DIR --modes pipe,ring   # a real dataset

Modes (each sample's bytes are made from a per-worker template, half random and half zeros, with
the sample's id in its first 8 bytes):
  plain          `bytes(template)`: one copy, as a loader that reads into a new `bytes`
  shared         `_transport.share({"id": i, "x": bytes(template)})`: what `StreamingDataset` does in
                 a worker (its values come from Rust as `bytes`): a value of at least 64 KiB
                 becomes a `SharedBytes`, one more copy
  shared-direct  `SharedBytes(template)` at 64 KiB and more: one copy (what a subclass made in
                 Rust would cost)
  shared-map     `shared`, the training process keeping each ring mapped (the alternative
                 to a `pread` per value; see `_transport`)
  arena-off      `shared` with SHARDSTREAM_WORKER_SAMPLE_ARENA=0 (the wrap's cost alone)
  MODE@SIZE      MODE with SHARDSTREAM_WORKER_SAMPLE_ARENA=SIZE (e.g. `shared@64MiB`)
With `--mds DIR`, `pipe` and `ring` read a local MDS dataset of the same samples (written into
DIR/<size> if missing) with `StreamingDataset(local=..., batch_size=64)`: the ring off
(SHARDSTREAM_WORKER_SAMPLE_ARENA=0, the path before it) and on.

The training process checks every batch (length and id head of every sample) and counts MB/s and
samples/s after the first batch; the modes alternate, each rep runs every mode once, and the
median of the reps is printed. Each measurement is a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, sys, time
import numpy as np
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from shardstream._transport import MIN_SHARED, SharedBytes, share

mode, size, n, batch, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])

class Samples(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        w, ws = (info.id, info.num_workers) if info else (0, 1)
        tmpl = bytearray(os.urandom(size // 2)) + bytearray(size - size // 2)
        for start in range(w * batch, n, ws * batch):
            for i in range(start, min(start + batch, n)):
                tmpl[:8] = i.to_bytes(8, "little")
                if mode == "plain":
                    yield {"id": i, "x": bytes(tmpl)}
                elif mode == "shared-direct":
                    yield {"id": i, "x": SharedBytes(tmpl) if size >= MIN_SHARED else bytes(tmpl)}
                else:
                    yield share({"id": i, "x": bytes(tmpl)})

import shardstream._transport as transport
ring = [0]
read = transport._read
def counting(*a):
    ring[0] += 1
    return read(*a)
transport._read = counting  # counts the values that came through a ring

if mode.startswith("mds:"):  # a local MDS dataset through StreamingDataset (see --mds)
    import shardstream
    data = shardstream.StreamingDataset(local=mode[4:], batch_size=batch)
    key = "data"
else:
    data, key = Samples(), "x"
loader = DataLoader(data, batch_size=batch, num_workers=workers)
t1, count, nbytes, bad, kinds = None, 0, 0, 0, set()
for b in loader:
    ids, xs = b["id"].numpy(), b[key]
    kinds.add(type(xs[0]).__name__)
    heads = np.frombuffer(b"".join([x[:8] for x in xs]), dtype="<i8")
    bad += int(np.count_nonzero(heads != ids)) + sum(len(x) != size for x in xs)
    if t1 is None:
        t1 = time.perf_counter()
    else:
        count += len(xs)
        nbytes += sum(map(len, xs))
dt = time.perf_counter() - t1
assert bad == 0, bad
print(json.dumps({"samples": count, "seconds": dt, "mb_s": nbytes / dt / 1e6, "samples_s": count / dt,
                  "kinds": sorted(kinds), "ring": ring[0] / (count + batch)}))
"""

SIZES = {"1MB": (1_000_000, 1536), "10KB": (10_000, 64 * 1500)}
MDS_SAMPLES = {"1MB": 960, "10KB": 64_000}  # about 1 GB and 640 MB: read warm, from the page cache


def label(mode: str) -> str:
    if "mds:" in mode:
        return "pipe (mds)" if mode.startswith("arena-off") else "ring (mds)"
    return mode


def write_mds(path: str, size: int, n: int) -> None:
    """`n` samples `{"id": i, "data": <size bytes>}` (the id, then half random, half zeros), in
    64 MiB shards, written by shardstream's MDS writer unless `path` already holds them."""
    if os.path.exists(os.path.join(path, "index.json")):
        return
    import shardstream

    half = os.urandom(size // 2)
    with shardstream.ShardWriter(path, {"id": "int", "data": "bytes"}, size_limit=1 << 26) as w:
        for i in range(n):
            w.write({"id": i, "data": i.to_bytes(8, "little") + half[8:] + bytes(size - size // 2)})


def run(mode: str, size: int, n: int, batch: int, workers: int) -> dict:
    env = dict(os.environ)
    if "@" in mode:  # `shared@128MiB`: that ring size
        mode, env["SHARDSTREAM_WORKER_SAMPLE_ARENA"] = mode.split("@")
    if mode.startswith("arena-off"):
        env["SHARDSTREAM_WORKER_SAMPLE_ARENA"] = "0"
        mode = mode[len("arena-off"):] or mode
    elif mode.endswith("-map"):
        env["_SHARDSTREAM_RING_READ"] = "map"
        mode = mode[:-4]
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(size), str(n), str(batch), str(workers)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1MB,10KB")
    ap.add_argument("--modes", default="plain,shared,shared-direct")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mds", help="a folder for a local MDS dataset of --sizes' samples (written if "
                    "missing): modes `pipe` and `ring` read it with StreamingDataset")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name in args.sizes.split(","):
        size, n = SIZES[name]
        modes = args.modes.split(",")
        if args.mds:
            path = os.path.join(args.mds, name)
            n = MDS_SAMPLES[name]
            write_mds(path, size, n)
            # `pipe`: the ring off (StreamingDataset then wraps nothing: the path before it).
            modes = [("arena-off" if m == "pipe" else "") + f"mds:{path}" if m in ("pipe", "ring") else m
                     for m in modes]
        res: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.reps):
            for m in res:  # alternating: A, B, C, A, B, C, ...
                res[m].append(run(m, size, n, args.batch, args.workers))
        base = statistics.median(r["mb_s"] for r in res[next(iter(res))])
        for m, rs in res.items():
            mb = statistics.median(r["mb_s"] for r in rs)
            row = {"size": name, "mode": label(m), "mb_s": round(mb, 1),
                   "samples_s": round(statistics.median(r["samples_s"] for r in rs)),
                   "all_mb_s": [round(r["mb_s"], 1) for r in rs], "vs_first": round(mb / base, 2),
                   "kinds": rs[0]["kinds"], "ring": round(statistics.median(r["ring"] for r in rs), 2)}
            rows.append(row)
            print(f"{name:>5} {label(m):<14} {row['mb_s']:8.1f} MB/s {row['samples_s']:8d} samples/s "
                  f"x{row['vs_first']:.2f}  ring {row['ring']:.2f}  runs {row['all_mb_s']}  main gets {row['kinds']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Each peer's own format against that peer, small and quick (seconds): WebDataset tars written by
`webdataset.ShardWriter`, read by `webdataset.WebDataset(...).decode()` and by
`shardstream.StreamingDataset`; a LitData dataset written by litdata's `BinaryWriter`, read by
`litdata.StreamingDataset` and by `shardstream.StreamingDataset`. Local files, warm page cache,
one process and a DataLoader with 2 workers, samples per second over a whole epoch (median of
`--runs`). Every sample is touched (its fields' lengths summed) so no reader is lazily skipped.

    python benches/formats_bench.py [--samples 4000] [--bytes 10000] [--runs 3] [--work DIR]

Prints a Markdown table. Figures from a debug build of the binding say nothing about speed:
build it with `maturin develop --release` first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def touch(sample: dict) -> int:
    n = 0
    for v in sample.values():
        if isinstance(v, (bytes, bytearray, memoryview, str)):
            n += len(v)
        elif isinstance(v, np.ndarray):
            n += v.nbytes
        else:
            n += 1
    return n


def write_wds(root: str, n: int, size: int) -> str:
    import webdataset as wds

    os.makedirs(root)
    rng = np.random.default_rng(0)
    with wds.ShardWriter(os.path.join(root, "shard-%06d.tar"), maxcount=500, verbose=0) as w:
        for i in range(n):
            w.write({"__key__": f"s{i:07d}", "cls": i % 10, "bin": rng.bytes(size), "txt": f"t{i}"})
    tars = sorted(os.listdir(root))
    return os.path.join(root, "shard-{%06d..%06d}.tar" % (0, len(tars) - 1))


def write_litdata(root: str, n: int, size: int) -> str:
    from litdata.streaming.writer import BinaryWriter

    os.makedirs(root)
    rng = np.random.default_rng(0)
    w = BinaryWriter(root, chunk_bytes=1 << 22)
    for i in range(n):
        w[i] = {"i": i, "raw": rng.bytes(size), "s": f"t{i}"}
    w.done()
    w.merge()
    return root


def epoch(ds, workers: int) -> tuple[int, float]:
    from torch.utils.data import DataLoader

    start = time.perf_counter()
    count = 0
    if workers == 0:
        for s in ds:
            touch(s)
            count += 1
    else:
        loader = DataLoader(ds, batch_size=32, num_workers=workers, multiprocessing_context="fork",
                            collate_fn=lambda b: [touch(s) for s in b])
        for batch in loader:
            count += len(batch)
    return count, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--bytes", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="formats-bench-")
    os.environ.setdefault("SHARDSTREAM_RUN_ID", "formats-bench")
    os.environ.setdefault("SHARDSTREAM_CACHE_ROOT", os.path.join(work, "cache"))
    import litdata
    import webdataset as wds

    import shardstream

    try:
        pattern = write_wds(os.path.join(work, "wds"), args.samples, args.bytes)
        lit = write_litdata(os.path.join(work, "lit"), args.samples, args.bytes)
        systems = {
            "webdataset": lambda: wds.WebDataset(pattern, shardshuffle=False).decode(),
            "shardstream (wds)": lambda: shardstream.StreamingDataset(remote=pattern, batch_size=32),
            "litdata": lambda: litdata.StreamingDataset(lit),
            "shardstream (litdata)": lambda: shardstream.StreamingDataset(local=lit, batch_size=32),
        }
        print(f"{args.samples} samples of {args.bytes} B, local, warm; median of {args.runs} runs\n")
        print("| system | workers | samples/s |")
        print("| --- | --- | --- |")
        for name, make in systems.items():
            for workers in (0, 2):
                rates = []
                for _ in range(args.runs + 1):  # the first run warms the page cache
                    count, secs = epoch(make(), workers)
                    assert count == args.samples, (name, workers, count)
                    rates.append(count / secs)
                print(f"| {name} | {workers} | {statistics.median(rates[1:]):,.0f} |")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

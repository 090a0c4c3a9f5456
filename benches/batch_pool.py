"""`iter_batches` of large samples with a new dataset per epoch: samples/s and page faults per
epoch, by batch size, for the two ways a script ends an epoch: keeping its last batch until the
next epoch's first arrives (`for b in ...` at module level), or dropping it when the epoch ends
(an epoch in a function, as the benchmark's consumer runs it).

    .venv/bin/python benches/batch_pool.py [--dataset DIR] [--epochs 15] [--batch-sizes 8,32,64]

Reads a local MDS dataset in place (by default `run.py`'s 1 MB set, 100 samples of 1 MB, from
the page cache after one warm-up epoch). Each column batch is gathered into a buffer from the
binding's batch pool (docs/python.md, Memory); the figures show when the pool hands a batch
memory that is already mapped and when it faults in fresh pages. Needs a release build of the
binding (`maturin develop --release`).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _epoch(shardstream, dataset: str, batch_size: int, held: list) -> tuple[int, float, int]:
    """One epoch of a new dataset. Its last batch stays in `held` (a list the caller keeps or
    not) until the next epoch's first batch replaces it."""
    ds = shardstream.StreamingDataset(local=dataset, batch_size=batch_size)
    f0, t0, n = _faults(), time.perf_counter(), 0
    for batch in ds.iter_batches(batch_size):
        held[:] = [batch]  # lets go of the batch before, the last epoch's last one included
        n += len(batch["id"])
    return n, time.perf_counter() - t0, _faults() - f0


def run(dataset: str, epochs: int, batch_size: int, keep_last: bool) -> tuple[float, float]:
    import shardstream

    rates, faults = [], []
    kept: list = []
    for _ in range(epochs + 1):
        # A fresh list each epoch drops the last batch when the epoch ends.
        n, wall, fault = _epoch(shardstream, dataset, batch_size, kept if keep_last else [])
        rates.append(n / wall)
        faults.append(fault)
    return statistics.median(rates[1:]), statistics.median(faults[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default=str(REPO / ".bench-work/run/data/mds/1MB"))
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--batch-sizes", default="8,32,64")
    args = ap.parse_args()
    print(f"{'batch':>5}  {'last batch':<22} {'samples/s':>10} {'faults/epoch':>13}")
    for bs in (int(b) for b in args.batch_sizes.split(",")):
        for keep_last in (True, False):
            rate, faults = run(args.dataset, args.epochs, bs, keep_last)
            how = "kept into next epoch" if keep_last else "dropped at epoch end"
            print(f"{bs:>5}  {how:<22} {rate:>10.0f} {faults:>13.0f}")


if __name__ == "__main__":
    main()

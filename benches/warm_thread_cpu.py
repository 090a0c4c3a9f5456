"""Where a warm single-process epoch's CPU goes, by thread: the training process's Python thread
against the engine's threads, with `bytes` values and with `zero_copy=True` buffers.

    .venv/bin/python benches/warm_thread_cpu.py [--dataset DIR] [--epochs 100]

It iterates a local MDS dataset (by default `run.py`'s 1 MB set, read in place from the page
cache) once to warm it, then `--epochs` times in each mode, and prints the wall time per sample
and the CPU per sample of each thread name, from `/proc/self/task/*/stat` read before and after
each epoch's loop (the engine's reader thread of an epoch ends with it and is counted as
`ended`, from the process total). With 1 MB samples it shows the `bytes` copy: the Python thread
copies each sample out of the engine's read buffer into a new `bytes` object, about as much CPU
as the reader's `pread`, while with `zero_copy=True` it only wraps the read.
Needs a release build of the binding (`maturin develop --release`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def _threads() -> dict[str, float]:
    """CPU seconds per thread name of this process (threads of one name summed)."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def run(dataset: str, epochs: int, zero_copy: bool) -> dict:
    import shardstream

    walls: list[float] = []
    per_thread: dict[str, float] = {}
    samples = 0
    for epoch in range(epochs + 1):
        ds = shardstream.StreamingDataset(local=dataset, batch_size=8, zero_copy=zero_copy)
        it = iter(ds)
        next(it)  # the first sample (open, first read) is not the steady state
        before, cpu0, t0 = _threads(), _process_cpu(), time.perf_counter()
        n = sum(1 for _ in it)
        wall, after, cpu1 = time.perf_counter() - t0, _threads(), _process_cpu()
        if epoch == 0:  # the warm-up epoch
            continue
        samples += n
        walls.append(wall / n)
        counted = 0.0
        for name, v in after.items():
            d = v - before.get(name, 0.0)
            per_thread[name] = per_thread.get(name, 0.0) + d
            counted += d
        per_thread["ended"] = per_thread.get("ended", 0.0) + max(0.0, (cpu1 - cpu0) - counted)
    return {
        "wall_us_per_sample": statistics.median(walls) * 1e6,
        "cpu_us_per_sample": {k: v / samples * 1e6 for k, v in sorted(per_thread.items()) if v > 0},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default=str(REPO / ".bench-work/run/data/mds/1MB"))
    ap.add_argument("--epochs", type=int, default=100)
    args = ap.parse_args()
    os.environ.setdefault("SHARDSTREAM_RUN_ID", "warm-thread-cpu")
    for zero_copy in (False, True):
        r = run(args.dataset, args.epochs, zero_copy)
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_sample"].items())
        print(f"{'zero_copy' if zero_copy else 'bytes':9}  wall {r['wall_us_per_sample']:.0f} us/sample  "
              f"CPU us/sample: {cpu}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What node-metrics publishing costs: the streaming benchmark's 10 KB profile, cold,
`DataLoader(2)`, shuffled, `iter_batches` (the benchmark's own child, consume.py, with its checked
epochs, against the counting moto server) with `SHARDSTREAM_NODE_METRICS` on and off, in turn
(A/B/A/B...), since the machine's load moves more between minutes than the figure measured.

    .venv/bin/python benches/node_metrics_ab.py --pairs 4 --runs 3

Each child process runs one untimed epoch, then `--runs` timed epochs (and as many untimed
memory epochs, as consume.py always does). Prints every timed epoch's samples/s, the median of
each setting and how far apart they are, and the median of each pair's on/off ratio (the two
children of a pair ran within the same half minute, so the ratio is less moved by the load).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIB = Path(__file__).resolve().parent / "lib"
sys.path.insert(0, str(LIB))

import datasets  # noqa: E402
from s3server import S3Server  # noqa: E402

SYSTEM = "shardstream (python, iter_batches)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="children per setting, run in turn (default 4)")
    ap.add_argument("--runs", type=int, default=3, help="timed epochs per child (default 3)")
    ap.add_argument("--work", default=str(REPO / ".bench-work" / "node-metrics"), help="dataset and scratch space")
    ap.add_argument("--timeout", type=float, default=300, help="bound on one child, seconds")
    args = ap.parse_args()

    work = Path(args.work)
    profile = next(p for p in datasets.profiles(False) if p.name == "10KB")
    local = datasets.build(work, profile)["mds"]
    rates: dict[str, list[float]] = {"on": [], "off": []}
    ratios: list[float] = []  # each pair's on ÷ off medians: the two ran within the same half minute
    with S3Server(sys.executable) as server:
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        datasets.upload(s3, "bench", local, f"mds/{profile.name}")
        job = {"system": SYSTEM, "profile": profile.name, "samples": profile.samples,
               "sample_bytes": profile.sample_bytes, "remote": f"s3://bench/mds/{profile.name}",
               "temperature": "cold", "urls": [], "local_files": [],
               "configs": [{"workers": 2, "shuffle": True}]}
        for i in range(args.pairs):
            pair: dict[str, float] = {}
            for setting in ("on", "off") if i % 2 == 0 else ("off", "on"):
                scratch = work / "scratch" / f"{i}-{setting}"
                shutil.rmtree(scratch, ignore_errors=True)
                spec = {"endpoint": server.endpoint, "batch_size": 64, "runs": args.runs,
                        "scratch": str(scratch), "jobs": [job]}
                env = dict(os.environ, **server.env, SHARDSTREAM_RUN_ID="bench",
                           SHARDSTREAM_NODE_METRICS="1" if setting == "on" else "0")
                t = time.time()
                out = subprocess.run([sys.executable, str(LIB / "consume.py"), json.dumps(spec)], env=env,
                                     capture_output=True, text=True, timeout=args.timeout)
                if out.returncode != 0:
                    sys.exit(f"child failed ({setting}): {out.stderr[-2000:]}")
                got = []
                for line in out.stdout.splitlines():
                    r = json.loads(line)
                    if "rep" not in r:
                        continue
                    if r["check"] != "ok":
                        sys.exit(f"epoch failed its check ({setting}): {r['check']}")
                    got.append(r["samples"] / r["epoch_s"])
                rates[setting] += got
                pair[setting] = statistics.median(got)
                shutil.rmtree(scratch, ignore_errors=True)
                print(f"pair {i} {setting:3}: " + ", ".join(f"{g:,.0f}" for g in got)
                      + f" samples/s ({time.time() - t:.0f} s)", flush=True)
            ratios.append(pair["on"] / pair["off"])
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"median samples/s: publishing on {on:,.0f} ({len(rates['on'])} epochs), "
          f"off {off:,.0f} ({len(rates['off'])} epochs); on is {100 * (on - off) / off:+.1f}% of off")
    print(f"median of the pairs' on/off ratios: {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} pairs)")


if __name__ == "__main__":
    main()

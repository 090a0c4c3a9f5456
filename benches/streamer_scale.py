#!/usr/bin/env python3
"""Streamer at scale (issue 3, "Numbers"): download amplification on several nodes, and start-up
cost from 10^4 to 10^8 samples.

1. Download amplification. An MDS dataset (mosaicml-streaming's own MDSWriter; sample sizes vary,
   so shards hold different sample counts and lane edges fall inside shards) is uploaded to the
   counting local S3 server (lib/s3server.py). N "nodes" run at once as separate processes:
   `shardstream stream s3://... --shuffle --num-nodes N --json`, each with its own cache root (a
   node's disk) and its node rank from SHARDSTREAM_NODE_RANK, the run id from SHARDSTREAM_RUN_ID,
   as a pod gets them (docs/cache.md). Amplification = bytes fetched by all nodes ÷ the dataset's
   shard bytes, from the streamer's own counter (`fetch_bytes`) and, independently, from the
   bytes the server sent (less each node's one `index.json` GET). Steps, on the same caches:
   epoch 0 on N nodes (cold), epoch 1 on N nodes (caches kept), epoch 2 after a resize to M
   nodes (the first M nodes keep their caches). Each step checks that the nodes together yielded
   every sample once (sum of samples = dataset samples + fewer than `nodes` padding repeats).
   Run once per `--lanes` value: lanes = N (the default: lanes = nodes at start) and a multiple
   of both N and M (what docs/sample-order.md recommends for a run that may resize).

2. Start-up. Synthetic MDS `index.json` files (no shard files: nothing is fetched) with 10^4 ..
   10^8 samples, in two sweeps: 1,000 samples per shard (shards grow with samples: 10 .. 100,000
   shards), and a fixed 1,000 shards (10 .. 100,000 samples per shard). For each, in a fresh
   process (`streamer/examples/scale_open.rs`): open the dataset (read, parse and check
   index.json), build the shuffled epoch order, get node 0's first sample and its prefetch plan;
   and the process's peak RSS. A second child times only the JSON parse. Open and parse are
   given as wall time and as CPU time: on a shared machine the wall time includes waits for a
   core, the CPU time does not. mosaicml-streaming's StreamingDataset opens the same indexes
   (wall time, and the RSS its open adds) unless --no-mosaic.

Figures are medians of --runs runs (min and max shown). Results: tables on stdout, JSON in
--json-out. The machine may be shared: say so next to any figure you quote.

Usage:
  .venv/bin/python benches/streamer_scale.py [--only amplification,startup] [--shards 96]
      [--nodes 4] [--resize 3] [--lanes 4,12] [--sizes 1e4,1e6,1e8] [--runs 3] [--no-build]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benches"))

from lib import datasets  # noqa: E402
from lib.s3server import S3Server  # noqa: E402

PY = Path(sys.executable)
BUCKET = "scale"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(timeout: float) -> None:
    for cmd in (
        ["cargo", "build", "--release", "-q", "-p", "shardstream-cli"],
        ["cargo", "build", "--release", "-q", "-p", "shardstream-streamer", "--example", "scale_open"],
    ):
        log("$ " + " ".join(cmd))
        subprocess.run(cmd, cwd=REPO, check=True, timeout=timeout)


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# --- 1. download amplification -------------------------------------------------------------------


def sample_size(i: int, mean: int) -> int:
    """Sizes from mean/2 to 3·mean/2, deterministic: shards cut by bytes hold unequal counts."""
    return mean // 2 + (i * 7919) % mean


def write_mds(out: Path, samples: int, mean: int, shard_bytes: int) -> None:
    stamp = out / ".bench-complete"
    want = json.dumps({"samples": samples, "mean": mean, "shard": shard_bytes, "v": 1})
    if stamp.exists() and stamp.read_text() == want:
        return
    from streaming import MDSWriter

    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with MDSWriter(out=str(out), columns={"id": "int", "data": "bytes"}, size_limit=shard_bytes) as w:
        for i in range(samples):
            w.write({"id": i, "data": datasets.sample_bytes(i, sample_size(i, mean))})
    stamp.write_text(want)


def run_nodes(ss: Path, url: str, env: dict, caches: list[Path], run_id: str, nodes: int, lanes: int,
              epoch: int, seed: int, timeout: float) -> list[dict]:
    """Streams one shuffled epoch on `nodes` nodes at once; returns each node's --json report."""

    def one(node: int) -> dict:
        node_env = dict(os.environ)
        node_env.update(env)
        node_env.update(SHARDSTREAM_RUN_ID=run_id, SHARDSTREAM_NODE_RANK=str(node), RUST_LOG="warn")
        cmd = [str(ss), "stream", url, "--cache-root", str(caches[node]), "--num-nodes", str(nodes),
               "--lanes", str(lanes), "--shuffle", "--seed", str(seed), "--epoch", str(epoch), "--json"]
        p = subprocess.run(cmd, env=node_env, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"node {node}: {' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])

    with cf.ThreadPoolExecutor(nodes) as ex:
        return list(ex.map(one, range(nodes)))


def amplification(args, work: Path, ss: Path) -> dict:
    data = work / "amp-data"
    write_mds(data, args.samples, args.sample_bytes, args.shard_bytes)
    index = json.loads((data / "index.json").read_text())
    shards = index["shards"]
    n_samples = sum(s["samples"] for s in shards)
    shard_bytes = sum(s["raw_data"]["bytes"] for s in shards)
    index_bytes = (data / "index.json").stat().st_size
    counts = [s["samples"] for s in shards]
    log(f"amplification dataset: {len(shards)} shards, {n_samples} samples, {shard_bytes / 1e6:.1f} MB "
        f"(samples per shard {min(counts)}..{max(counts)})")
    out = {"shards": len(shards), "samples": n_samples, "shard_bytes": shard_bytes, "index_bytes": index_bytes,
           "nodes": args.nodes, "resize": args.resize, "runs": []}
    with S3Server(python=str(PY)) as server:
        s3 = server.client()
        s3.create_bucket(Bucket=BUCKET)
        datasets.upload(s3, BUCKET, data, "mds")
        url = f"s3://{BUCKET}/mds"
        for lanes in args.lanes:
            steps = [("epoch 0 (cold)", args.nodes, 0), ("epoch 1 (caches kept)", args.nodes, 1)]
            if args.resize:
                steps.append((f"epoch 2, resized {args.nodes}->{args.resize}", args.resize, 2))
            for run in range(args.runs):
                run_id = f"amp-l{lanes}-r{run}"
                caches = [work / "amp-cache" / f"node{i}" for i in range(max(args.nodes, args.resize or 0))]
                for c in caches:
                    shutil.rmtree(c, ignore_errors=True)
                for name, nodes, epoch in steps:
                    server.reset()
                    t0 = time.perf_counter()
                    reports = run_nodes(ss, url, server.env, caches, run_id, nodes, lanes, epoch, args.seed,
                                        args.timeout)
                    seconds = time.perf_counter() - t0
                    sent = server.counters()["bytes_sent"]
                    fetched = sum(r["fetch_bytes"] for r in reports)
                    yielded = sum(r["samples"] for r in reports)
                    padding = yielded - n_samples
                    check = "ok" if 0 <= padding < nodes else f"WRONG: {yielded} samples for {n_samples}"
                    row = {
                        "lanes": lanes, "step": name, "nodes": nodes, "epoch": epoch, "run": run,
                        "fetch_bytes": fetched, "server_bytes": sent,
                        "amplification": fetched / shard_bytes,
                        "server_amplification": (sent - nodes * index_bytes) / shard_bytes,
                        "per_node_fetch_bytes": [r["fetch_bytes"] for r in reports],
                        "shards_fetched": sum(r["shards_fetched"] for r in reports),
                        "samples": yielded, "check": check, "seconds": seconds,
                    }
                    out["runs"].append(row)
                    log(f"  lanes {lanes:3} run {run} {name:28} amplification {row['amplification']:.3f} "
                        f"(server {row['server_amplification']:.3f}), {row['shards_fetched']} shard fetches, "
                        f"{seconds:.1f} s, {check}")
    return out


def print_amplification(res: dict) -> None:
    print(f"\n## Download amplification: {res['shards']} shards, {res['samples']} samples, "
          f"{res['shard_bytes'] / 1e6:.1f} MB; bytes fetched by all nodes ÷ dataset bytes "
          f"(median of runs, min–max)\n")
    print("| lanes | step | nodes | amplification (streamer counter) | amplification (server bytes) | shard fetches | check |")
    print("|---:|---|---:|---:|---:|---:|---|")
    keys = []
    for r in res["runs"]:
        k = (r["lanes"], r["step"])
        if k not in keys:
            keys.append(k)
    for lanes, step in keys:
        rows = [r for r in res["runs"] if (r["lanes"], r["step"]) == (lanes, step)]
        a = spread([r["amplification"] for r in rows])
        s = spread([r["server_amplification"] for r in rows])
        f = spread([r["shards_fetched"] for r in rows])
        checks = sorted({r["check"] for r in rows})
        print(f"| {lanes} | {step} | {rows[0]['nodes']} | {a['median']:.3f} ({a['min']:.3f}–{a['max']:.3f}) "
              f"| {s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}) | {f['median']:.0f} | {', '.join(checks)} |")


# --- 2. start-up from 10^4 to 10^8 samples -------------------------------------------------------


def write_index(out: Path, shards: int, per_shard: int) -> Path:
    """A valid MDS index.json (Mosaic's layout, sorted keys) for shards that are not written."""
    path = out / "index.json"
    if path.exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    raw = 4 + 4 * (per_shard + 1) + per_shard * 100
    entries = []
    for i in range(shards):
        entries.append({
            "column_encodings": ["bytes", "int"], "column_names": ["data", "id"], "column_sizes": [None, 8],
            "compression": None, "format": "mds", "hashes": [],
            "raw_data": {"basename": f"shard.{i:05d}.mds", "bytes": raw, "hashes": {}},
            "samples": per_shard, "size_limit": 1 << 26, "version": 2, "zip_data": None,
        })
    tmp = out / "index.json.tmp"
    tmp.write_text(json.dumps({"shards": entries, "version": 2}, sort_keys=True))
    tmp.rename(path)
    return out


def run_json(cmd: list[str], timeout: float) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# Mosaic's StreamingDataset over the same index.json, in a child: open time, and the RSS the open
# adds to the process after `import streaming` (which imports torch).
MOSAIC_OPEN = """
import json, resource, sys, time
from streaming import StreamingDataset
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t = time.perf_counter()
ds = StreamingDataset(local=sys.argv[1], shuffle=True, batch_size=1)
open_s = time.perf_counter() - t
print(json.dumps({"open_s": open_s, "samples": ds.num_samples, "rss_after_import_bytes": base,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def startup(args, work: Path, example: Path) -> dict:
    rows = []
    sweeps = [("1000 samples/shard", lambda n: (max(1, n // 1000), min(n, 1000))),
              ("1000 shards", lambda n: (1000, max(1, n // 1000)))]
    for sweep, shape in sweeps:
        for n in args.sizes:
            shards, per_shard = shape(n)
            d = write_index(work / "scale-index" / f"{shards}x{per_shard}", shards, per_shard)
            opened, parsed = [], []
            for _ in range(args.runs):
                opened.append(run_json([str(example), str(d), "--nodes", str(args.nodes), "--lanes",
                                        str(args.nodes)], args.timeout))
                parsed.append(run_json([str(example), str(d), "--parse-only"], args.timeout))
            row = {
                "sweep": sweep, "samples": shards * per_shard, "shards": shards,
                "index_bytes": parsed[0]["index_bytes"],
                "open_s": spread([o["open_s"] for o in opened]),
                "open_cpu_s": spread([o["open_cpu_s"] for o in opened]),
                "parse_s": spread([p["parse_s"] for p in parsed]),
                "parse_cpu_s": spread([p["parse_cpu_s"] for p in parsed]),
                "order_s": spread([o["order_s"] for o in opened]),
                "first_s": spread([o["first_s"] for o in opened]),
                "peak_rss_bytes": max(o["peak_rss_bytes"] for o in opened),
                "parse_peak_rss_bytes": max(p["peak_rss_bytes"] for p in parsed),
                "order_heap_bytes": opened[0]["order_heap_bytes"],
            }
            if args.mosaic:
                try:
                    m = [run_json([str(PY), "-c", MOSAIC_OPEN, str(d)], args.timeout) for _ in range(args.runs)]
                    row["mosaic_open_s"] = spread([x["open_s"] for x in m])
                    row["mosaic_rss_added_bytes"] = max(x["peak_rss_bytes"] - x["rss_after_import_bytes"] for x in m)
                except Exception as e:  # reported, not fatal: the peer is a comparison, not the subject
                    row["mosaic_error"] = str(e)[-300:]
            rows.append(row)
            log(f"  {sweep:20} {row['samples']:>11} samples {shards:>7} shards: open {row['open_s']['median'] * 1e3:.1f} ms "
                f"(CPU {row['open_cpu_s']['median'] * 1e3:.1f} ms, parse CPU {row['parse_cpu_s']['median'] * 1e3:.1f} ms), order {row['order_s']['median'] * 1e3:.2f} ms, "
                f"first {row['first_s']['median'] * 1e3:.3f} ms, peak RSS {row['peak_rss_bytes'] / 2**20:.1f} MiB")
    return {"rows": rows}


def print_startup(res: dict) -> None:
    print("\n## Start-up: open index.json, build the shuffled epoch order, first sample of node 0 "
          "(median of runs, min–max; each size in a fresh process)\n")
    print("| sweep | samples | shards | index.json | open (wall) | open (CPU) | JSON parse (CPU) | epoch order | first sample + plan | peak RSS | order heap |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ms(s: dict) -> str:
        if s["max"] < 1e-3:
            return f"{s['median'] * 1e6:.0f} µs ({s['min'] * 1e6:.0f}–{s['max'] * 1e6:.0f})"
        return f"{s['median'] * 1e3:.1f} ms ({s['min'] * 1e3:.1f}–{s['max'] * 1e3:.1f})"

    for r in res["rows"]:
        print(f"| {r['sweep']} | {r['samples']:,} | {r['shards']:,} | {r['index_bytes'] / 1e6:.1f} MB | {ms(r['open_s'])} "
              f"| {ms(r['open_cpu_s'])} | {ms(r['parse_cpu_s'])} | {ms(r['order_s'])} | {ms(r['first_s'])} | {r['peak_rss_bytes'] / 2**20:.1f} MiB "
              f"| {r['order_heap_bytes'] / 1e6:.2f} MB |")
    mosaic = [r for r in res["rows"] if "mosaic_open_s" in r or "mosaic_error" in r]
    if mosaic:
        print("\nThe same index.json opened by mosaicml-streaming's StreamingDataset(local=..., shuffle=True) "
              "(wall time; how much the open raises the peak RSS above its value after `import streaming`):\n")
        print("| sweep | samples | shards | open (wall) | peak RSS added by open |")
        print("|---|---:|---:|---:|---:|")
        for r in mosaic:
            if "mosaic_error" in r:
                print(f"| {r['sweep']} | {r['samples']:,} | {r['shards']:,} | failed: {r['mosaic_error']} | |")
            else:
                print(f"| {r['sweep']} | {r['samples']:,} | {r['shards']:,} | {ms(r['mosaic_open_s'])} "
                      f"| {r['mosaic_rss_added_bytes'] / 2**20:.1f} MiB |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="amplification,startup", help="comma-separated sections")
    ap.add_argument("--samples", type=int, default=9_600, help="samples of the amplification dataset")
    ap.add_argument("--sample-bytes", type=int, default=10_000, help="mean sample size")
    ap.add_argument("--shard-bytes", type=int, default=768 << 10, help="MDSWriter size_limit (about 128 shards)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--resize", type=int, default=3, help="nodes after the resize (0: no resize step)")
    ap.add_argument("--lanes", default="4,12", help="comma-separated lanes settings to run")
    ap.add_argument("--seed", type=int, default=9176)
    ap.add_argument("--sizes", default="1e4,1e6,1e8", help="sample counts of the start-up indexes")
    ap.add_argument("--no-mosaic", dest="mosaic", action="store_false",
                    help="skip opening the start-up indexes with mosaicml-streaming")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600, help="bound on one child process, seconds")
    ap.add_argument("--work", default=str(REPO / ".bench-work" / "streamer-scale"))
    ap.add_argument("--json-out", default=str(REPO / ".bench-work" / "streamer_scale.json"))
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--quick", action="store_true", help="small sizes, one run (smoke)")
    args = ap.parse_args()
    args.lanes = [int(x) for x in args.lanes.split(",") if x]
    args.sizes = [int(float(x)) for x in args.sizes.split(",") if x]
    if args.quick:
        args.samples, args.runs, args.sizes = 1_200, 1, [10_000, 1_000_000]
        args.shard_bytes = 128 << 10
    only = set(args.only.split(","))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if not args.no_build:
        build(args.timeout)
    ss = REPO / "target" / "release" / "shardstream"
    example = REPO / "target" / "release" / "examples" / "scale_open"

    results: dict = {"machine": {"cores": os.cpu_count(), "platform": platform.platform(),
                                 "loadavg": os.getloadavg()}, "args": {k: v for k, v in vars(args).items()}}
    if "amplification" in only:
        results["amplification"] = amplification(args, work, ss)
    if "startup" in only:
        results["startup"] = startup(args, work, example)
    results["machine"]["loadavg_end"] = os.getloadavg()
    if "amplification" in results:
        print_amplification(results["amplification"])
    if "startup" in results:
        print_startup(results["startup"])
    print(f"\nload average at start {results['machine']['loadavg'][0]:.1f}, at end {results['machine']['loadavg_end'][0]:.1f}")
    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(results, indent=1))
    bad = [r for r in results.get("amplification", {}).get("runs", []) if r["check"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""End-to-end benchmark of `shardstream shard`, `verify`, `upload` and `download` against the peers.

Measured side by side in one run, on the same input, on this machine:
  - the ceiling: zstd (same level) over the same bytes on all cores (the `zstd` CLI, `-T0`);
  - mosaicml-streaming's MDSWriter (zstd, xxh64) in one process, as its docs show it used;
  - litdata's optimize() (zstd) with one worker per core;
  - `shardstream shard --workers <cores>` (zstd, xxh64);
  - `verify` against reading the shard files (page cache) with `cat`;
  - `upload` / `download` against a local S3 server (moto) and the raw parallel PUT/GET
    throughput of boto3 against the same server (the server's ceiling as a client sees it).

Every figure is the median of --runs runs (min and max shown); each run is bounded by --timeout
seconds, and each output is checked (sample count equals the input's) so a fast wrong answer
cannot win. Results: a Markdown table on stdout and JSON in --json-out.

Usage:
  benches/shard_bench.py [--files 100000] [--file-kb 10] [--jsonl-mb 2048] [--runs 3] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = Path(sys.executable)


def sh(cmd: list[str], timeout: float, env: dict | None = None) -> None:
    full = dict(os.environ)
    full.update(env or {})
    subprocess.run(cmd, check=True, timeout=timeout, env=full, stdout=subprocess.DEVNULL)


def timed(fn, runs: int) -> dict:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def gen_files(root: Path, n: int, size: int) -> int:
    if root.exists() and len(list(root.glob("*/*"))) == n:
        return n * size
    shutil.rmtree(root, ignore_errors=True)
    rnd = os.urandom(1 << 20)
    for i in range(n):
        d = root / f"{i // 1000:04}"
        if i % 1000 == 0:
            d.mkdir(parents=True, exist_ok=True)
        # Half random, half repeated text: compressible like real data, not trivially so.
        off = (i * 7919) % ((1 << 20) - size)
        body = rnd[off : off + size // 2] + (b"sample %d " % i) * (size // 2 // 10 + 1)
        (d / f"{i:07}.bin").write_bytes(body[:size])
    return n * size


def transfer_dataset(work: Path, ss: Path, mb: int, timeout: float) -> Path:
    """An MDS dataset of `mb` MiB of random bytes (1 MiB samples), uncompressed, 64 MiB shards."""
    out = work / f"transfer-{mb}mb"
    if (out / "index.json").exists():
        return out
    src = work / f"transfer-src-{mb}mb"
    shutil.rmtree(src, ignore_errors=True)
    (src / "0000").mkdir(parents=True)
    for i in range(mb):
        (src / "0000" / f"{i:07}.bin").write_bytes(os.urandom(1 << 20))
    tmp = work / f"transfer-{mb}mb.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    sh([str(ss), "shard", str(src), str(tmp), "--compression", "none", "--shard-size", "64MiB",
        "--hashes", "xxh64", "--input-format", "files"], timeout)
    shutil.rmtree(src, ignore_errors=True)
    tmp.rename(out)
    return out


def gen_jsonl(path: Path, mb: int) -> tuple[int, int]:
    target = mb << 20
    if path.exists() and path.stat().st_size >= target:
        with open(path, "rb") as f:
            return sum(1 for _ in f), path.stat().st_size
    words = [w.encode() for w in "the quick brown fox jumps over lazy dog data model train token".split()]
    n = 0
    with open(path, "wb") as f:
        written = 0
        while written < target:
            text = b" ".join(words[(n * 31 + k * 7) % len(words)] for k in range(150))
            line = b'{"id": %d, "text": "%s", "score": %d.5}\n' % (n, text, n % 100)
            f.write(line)
            written += len(line)
            n += 1
    return n, path.stat().st_size


def count_mds(out: Path) -> int:
    index = json.loads((out / "index.json").read_text())
    return sum(s["samples"] for s in index["shards"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--file-kb", type=int, default=10)
    ap.add_argument("--jsonl-mb", type=int, default=2048)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--work", default=str(REPO / ".bench-work"))
    ap.add_argument("--json-out", default=str(REPO / ".bench-work" / "shard_bench.json"))
    ap.add_argument("--transfer-mb", type=int, default=1024,
                    help="size of the incompressible dataset that verify/upload/download are measured on")
    ap.add_argument("--skip-shard", action="store_true",
                    help="measure only verify/upload/download (skip the sharding comparison)")
    ap.add_argument("--no-build", action="store_true", help="use target/release/shardstream as it is")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run (CI smoke)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.jsonl_mb, args.transfer_mb, args.runs = 2000, 8, 16, 1
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    ss = REPO / "target" / "release" / "shardstream"
    if not args.no_build:
        sh(["cargo", "build", "--release", "-q", "-p", "shardstream-cli"], args.timeout)

    results: dict = {"machine": {"cores": cores, "platform": platform.platform()}, "rows": []}

    def row(name: str, system: str, stats: dict, nbytes: int, n_items: int, check: str = "ok") -> None:
        stats = dict(stats)
        stats.update(
            name=name,
            system=system,
            mb_per_s=nbytes / stats["median_s"] / 1e6,
            items_per_s=n_items / stats["median_s"],
            check=check,
        )
        results["rows"].append(stats)
        print(f"{name:28} {system:22} {stats['mb_per_s']:9.1f} MB/s {stats['items_per_s']:11.0f} items/s "
              f"(median {stats['median_s']:.2f}s, min {stats['min_s']:.2f}, max {stats['max_s']:.2f}) {check}", flush=True)

    inputs = {}
    if args.skip_shard:
        args.files = args.jsonl_mb = 0
    if args.files:
        files_dir = work / f"files-{args.files}x{args.file_kb}k"
        inputs["files"] = (files_dir, gen_files(files_dir, args.files, args.file_kb * 1024), args.files)
    if args.jsonl_mb:
        jsonl = work / f"data-{args.jsonl_mb}mb.jsonl"
        n_lines, jsonl_bytes = gen_jsonl(jsonl, args.jsonl_mb)
        inputs["jsonl"] = (jsonl, jsonl_bytes, n_lines)

    for kind, (src, nbytes, n_items) in inputs.items():
        name = f"shard {kind}"
        # Ceiling: zstd -3 over the same bytes on all cores.
        blob = work / f"{kind}.concat"
        if kind == "files":
            with open(blob, "wb") as out:
                for p in sorted(src.glob("*/*")):
                    out.write(p.read_bytes())
        else:
            shutil.copyfile(src, blob)
        row(name, "ceiling: zstd -3 -T0",
            timed(lambda: sh(["zstd", "-q", "-f", "-3", f"-T{cores}", str(blob), "-o", str(blob) + ".zst"], args.timeout), args.runs),
            nbytes, n_items)

        out = work / f"ss-{kind}"
        def run_ss():
            shutil.rmtree(out, ignore_errors=True)
            sh([str(ss), "shard", str(src), str(out), "--workers", str(cores), "--compression", "zstd:3", "--hashes", "xxh64",
                "--input-format", "files" if kind == "files" else "jsonl"], args.timeout)
        st = timed(run_ss, args.runs)
        row(name, "shardstream", st, nbytes, n_items, "ok" if count_mds(out) == n_items else "WRONG COUNT")

        mosaic_out = work / f"mosaic-{kind}"
        code = MOSAIC_FILES if kind == "files" else MOSAIC_JSONL
        def run_mosaic():
            shutil.rmtree(mosaic_out, ignore_errors=True)
            sh([str(PY), "-c", code, str(src), str(mosaic_out)], args.timeout)
        st = timed(run_mosaic, args.runs)
        row(name, "mosaicml-streaming", st, nbytes, n_items, "ok" if count_mds(mosaic_out) == n_items else "WRONG COUNT")

        lit_out = work / f"litdata-{kind}"
        code = LITDATA_FILES if kind == "files" else LITDATA_JSONL
        # litdata's workers are spawned and re-import `__main__` by path to find `fn`, which a
        # `python -c` program does not have: run the program from a file.
        lit_script = work / f"litdata_{kind}.py"
        lit_script.write_text(code)
        def run_lit():
            shutil.rmtree(lit_out, ignore_errors=True)
            sh([str(PY), str(lit_script), str(src), str(lit_out), str(cores)], args.timeout)
        st = timed(run_lit, args.runs)
        lit_index = json.loads((lit_out / "index.json").read_text())
        lit_n = sum(c["chunk_size"] for c in lit_index["chunks"])
        row(name, "litdata", st, nbytes, n_items, "ok" if lit_n == n_items else f"WRONG COUNT {lit_n}")

    # verify / upload / download are measured on incompressible data in uncompressed 64 MiB shards:
    # a compressed text dataset would be a handful of small objects (fixed costs dominate) and
    # `verify` would mostly measure decompression.
    ds = transfer_dataset(work, ss, args.transfer_mb, args.timeout)
    ds_bytes = sum(p.stat().st_size for p in ds.iterdir())
    shard_files = [str(p) for p in ds.iterdir()]
    print(f"\ntransfer dataset: {ds_bytes / 1e6:.0f} MB in {len(shard_files)} files ({ds})", flush=True)
    row("verify (warm)", "ceiling: cat > /dev/null", timed(lambda: sh(["cat", *shard_files], args.timeout), args.runs), ds_bytes, 1)
    row("verify (warm)", "shardstream", timed(lambda: sh([str(ss), "verify", str(ds)], args.timeout), args.runs), ds_bytes, 1)

    # upload / download against moto vs boto3's raw parallel PUT/GET on the same server.
    port = free_port()
    moto = subprocess.Popen([str(PY.parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/", timeout=1).read()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
        import boto3
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        files = sorted(p for p in ds.iterdir())
        def raw_put():
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda p: s3.upload_file(str(p), "bench", f"raw/{p.name}"), files))
        def raw_get():
            dst = work / "raw-get"
            dst.mkdir(exist_ok=True)
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda p: s3.download_file("bench", f"raw/{p.name}", str(dst / p.name)), files))
        row("upload", "ceiling: boto3 8 threads", timed(raw_put, args.runs), ds_bytes, len(files))
        row("upload", "shardstream", timed(lambda: sh([str(ss), "upload", "--force", str(ds), "s3://bench/ss"], args.timeout, env), args.runs), ds_bytes, len(files))
        row("download", "ceiling: boto3 8 threads", timed(raw_get, args.runs), ds_bytes, len(files))
        def ss_down():
            shutil.rmtree(work / "ss-down", ignore_errors=True)
            sh([str(ss), "download", "s3://bench/ss", str(work / "ss-down")], args.timeout, env)
        row("download", "shardstream", timed(ss_down, args.runs), ds_bytes, len(files))
    finally:
        moto.terminate()
        moto.wait(timeout=10)

    Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json_out).write_text(json.dumps(results, indent=2))
    print(f"\nresults written to {args.json_out}")


MOSAIC_FILES = r"""
import sys, os
from pathlib import Path
from streaming import MDSWriter
src, out = Path(sys.argv[1]), sys.argv[2]
with MDSWriter(out=out, columns={"path": "str", "data": "bytes"}, compression="zstd:3", hashes=["xxh64"]) as w:
    for p in sorted(src.glob("*/*")):
        w.write({"path": str(p.relative_to(src)), "data": p.read_bytes()})
"""

MOSAIC_JSONL = r"""
import sys, json
from streaming import MDSWriter
src, out = sys.argv[1], sys.argv[2]
with MDSWriter(out=out, columns={"id": "int", "text": "str", "score": "float64"}, compression="zstd:3", hashes=["xxh64"]) as w:
    with open(src) as f:
        for line in f:
            r = json.loads(line)
            w.write(r)
"""

LITDATA_FILES = r"""
import sys
from pathlib import Path
from litdata import optimize
def fn(p):
    return {"path": str(p), "data": Path(p).read_bytes()}
if __name__ == "__main__":
    src, out, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    inputs = [str(p) for p in sorted(src.glob("*/*"))]
    optimize(fn=fn, inputs=inputs, output_dir=out, chunk_bytes="64MB", compression="zstd", num_workers=workers, verbose=False, reorder_files=False)
"""

LITDATA_JSONL = r"""
import sys, json
from litdata import optimize
def fn(rng):
    src, start, end = rng
    with open(src, "rb") as f:
        # Start one byte early so a line that begins exactly at `start` is kept here.
        f.seek(max(start - 1, 0))
        if start:
            f.readline()
        while f.tell() <= end:
            line = f.readline()
            if not line:
                break
            yield json.loads(line)
if __name__ == "__main__":
    import os
    src, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    size = os.path.getsize(src)
    parts = 64
    inputs = [(src, size * i // parts, size * (i + 1) // parts - 1) for i in range(parts)]
    optimize(fn=fn, inputs=inputs, output_dir=out, chunk_bytes="64MB", compression="zstd", num_workers=workers, verbose=False)
"""

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""FUSE benchmark: `shardstream mount` against the bytes it serves and against its peers.

    .venv/bin/python benches/fuse_bench.py [--bin target/release/shardstream] [--shards 4]
        [--shard-mib 64] [--meta-samples 100000] [--peers] [--json OUT]

One run, one local S3 server (moto, counting bytes, on a free 127.0.0.1 port; benches/lib/s3server.py):
  1. throughput dataset: `--shards` uncompressed MDS shards of `--shard-mib` MiB of random bytes,
     written with `shardstream shard ... --compression none` straight to S3;
  2. raw GET ceiling: boto3, every shard object in order, 8 parallel 8 MiB ranged GETs each;
  3. shardstream mount, cold (empty cache): sequential 1 MiB reads of every file under `shards/`;
     warm (same mount again: kernel page cache kept by FOPEN_KEEP_CACHE); warm after a remount (the
     kernel's cache of the mount is gone, the node cache on disk is not); and the same files read
     directly from the node cache folder (the ceiling the warm figures are compared with). By
     default cached shards are read by the kernel itself (FUSE passthrough); the same warm figures
     with `--no-passthrough` (every read through the daemon) follow;
  4. with --peers (needs `rclone` and `s3fs`): rclone mount (--vfs-cache-mode full) and s3fs
     (use_cache) on the same raw shard objects, cold and warm;
  5. metadata: a JSONL dataset of `--meta-samples` records mounted, `ls -lR samples/` (readdir +
     stat of every sample file), cold (first listing) and warm (second); the number of files seen
     must equal the index's samples x columns.
Prints a table and, with --json, writes the figures. Every figure is measured here; none is assumed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benches" / "lib"))
from s3server import S3Server  # noqa: E402

MIB = 1 << 20


def sh(cmd, env=None, **kw):
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, **kw)


def read_files(paths) -> tuple[int, float]:
    """Sequential 1 MiB reads of every file; returns (bytes, seconds)."""
    buf = bytearray(MIB)
    total, t0 = 0, time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(buf)
                if not k:
                    break
                total += k
    return total, time.perf_counter() - t0


def raw_get(client, bucket: str, keys: list[str]) -> tuple[int, float]:
    """Every object in order, each as 8 parallel 8 MiB ranged GETs."""
    total, t0 = 0, time.perf_counter()
    with cf.ThreadPoolExecutor(8) as pool:
        for key in keys:
            size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
            ranges = [(o, min(o + 8 * MIB, size) - 1) for o in range(0, size, 8 * MIB)]
            parts = pool.map(
                lambda r: client.get_object(Bucket=bucket, Key=key, Range=f"bytes={r[0]}-{r[1]}")["Body"].read(),
                ranges,
            )
            total += sum(len(p) for p in parts)
    return total, time.perf_counter() - t0


class Mounted:
    """A foreground mount process (shardstream, rclone or s3fs), unmounted on exit."""

    def __init__(self, cmd: list[str], env: dict, mnt: Path, ready: Path | None = None) -> None:
        self.mnt = mnt
        mnt.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        deadline = time.monotonic() + 120
        while not (ready.exists() if ready else os.path.ismount(mnt)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.proc.stderr.read() if self.proc.poll() is not None else "not mounted in 120 s"
                self.close()
                raise RuntimeError(f"{cmd[0]} mount failed: {err.strip()[-500:]}")
            time.sleep(0.02)

    def close(self) -> None:
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)
        try:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ls_lr(root: Path) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(["ls", "-lR", str(root)], capture_output=True, text=True, check=True)
    s = time.perf_counter() - t0
    return {"s": s, "files": sum(1 for line in out.stdout.splitlines() if line.startswith("-"))}


def walk_stat(root: Path) -> dict:
    t0, files = time.perf_counter(), 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            os.stat(os.path.join(dirpath, n))
            files += 1
    return {"s": time.perf_counter() - t0, "files": files}


def cached_shards(cache: Path, count: int, min_size: int) -> list[Path]:
    """The node cache's shard files, once all `count` are committed (a shard's temp file under
    `tmp/` is renamed into place when its download ends, which may trail the last read a little)."""
    deadline = time.monotonic() + 60
    while True:
        found = sorted(p for p in cache.rglob("*")
                       if p.is_file() and "tmp" not in p.relative_to(cache).parts and p.stat().st_size >= min_size)
        if len(found) == count:
            return found
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(found)} committed shard files in {cache}, expected {count}")
        time.sleep(0.1)


def median(runs: list[tuple[int, float]]) -> dict:
    runs = sorted(runs, key=lambda r: r[1])
    n, s = runs[len(runs) // 2]
    return {"bytes": n, "s": s, "runs": len(runs)}


def mbps(n: int, s: float) -> float:
    return n / s / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "shardstream"))
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--meta-samples", type=int, default=100_000)
    ap.add_argument("--peers", action="store_true", help="also rclone mount and s3fs")
    ap.add_argument("--runs", type=int, default=5, help="repetitions of the warm reads (median)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    results: dict[str, dict] = {}
    work = Path(tempfile.mkdtemp(prefix="fuse-bench-"))
    server = S3Server(python=sys.executable)
    try:
        env = {**os.environ, **server.env, "SHARDSTREAM_RUN_ID": "bench", "SHARDSTREAM_NODE_RANK": "0"}
        client = server.client()
        client.create_bucket(Bucket="fusebench")

        # 1. The throughput dataset: files of about one shard each, so the writer closes a shard per file.
        src = work / "src"
        src.mkdir()
        for i in range(args.shards):
            (src / f"{i:03}.bin").write_bytes(os.urandom(args.shard_mib * MIB - 64 * 1024))
        sh([args.bin, "--no-progress", "shard", str(src), "s3://fusebench/big", "--compression", "none",
            "--shard-size", f"{args.shard_mib}MiB"], env=env)
        shutil.rmtree(src)
        # The shard objects, as the dataset's index names them (uncompressed: raw_data is the object).
        index = json.loads(client.get_object(Bucket="fusebench", Key="big/index.json")["Body"].read())
        keys = [f"big/{s['raw_data']['basename']}" for s in index["shards"]]

        # 2. Raw GET ceiling.
        n, s = raw_get(client, "fusebench", keys)
        results["raw GET (boto3, 8 x 8 MiB ranges)"] = {"bytes": n, "s": s}

        # 3. shardstream mount: cold, warm, warm after remount, and the cached files directly.
        cache, mnt, ready = work / "cache", work / "mnt", work / "ready"
        cmd = [args.bin, "--no-progress", "mount", "s3://fusebench/big", str(mnt), "--foreground",
               "--cache-root", str(cache), "--ready-file", str(ready)]
        files = [mnt / "shards" / Path(k).name for k in keys]
        with Mounted(cmd, env, mnt, ready):
            c0 = server.counters()["bytes_sent"]
            n, s = read_files(files)
            sent = server.counters()["bytes_sent"] - c0
            results["shardstream mount, cold"] = {"bytes": n, "s": s, "server_bytes": sent}
            cached = cached_shards(cache, len(keys), (args.shard_mib - 1) * MIB)
            read_files(cached)  # in the page cache, as the mount's pages are after the cold read
            # Warm figures: median of --runs, the mount and the cache files read in turn, so that
            # load from other processes hits both alike.
            mount_runs, direct_runs = [], []
            for _ in range(args.runs):
                mount_runs.append(read_files(files))
                direct_runs.append(read_files(cached))
            results["shardstream mount, warm (page cache kept)"] = median(mount_runs)
            results["cached files read directly (ceiling for warm)"] = median(direct_runs)
        ready.unlink(missing_ok=True)
        with Mounted(cmd, env, mnt, ready):
            n, s = read_files(files)
            results["shardstream mount, warm after remount (node cache)"] = {"bytes": n, "s": s}
        ready.unlink(missing_ok=True)
        # The fallback path (no FUSE passthrough: every read through the daemon, the mount's own
        # page cache kept across opens), on the same node cache.
        with Mounted(cmd + ["--no-passthrough"], env, mnt, ready):
            n, s = read_files(files)
            results["shardstream mount --no-passthrough, after remount (node cache)"] = {"bytes": n, "s": s}
            mount_runs, direct_runs = [], []
            for _ in range(args.runs):
                mount_runs.append(read_files(files))
                direct_runs.append(read_files(cached))
            results["shardstream mount --no-passthrough, warm (page cache kept)"] = median(mount_runs)
            results["cached files read directly (ceiling, beside --no-passthrough)"] = median(direct_runs)
        ready.unlink(missing_ok=True)

        # 4. Peers on the same objects.
        if args.peers:
            for name, make in (("rclone mount", rclone_cmd), ("s3fs", s3fs_cmd)):
                if shutil.which(name.split()[0]) is None:
                    results[f"{name}: not installed"] = {}
                    continue
                pmnt, pcache = work / f"mnt-{name.split()[0]}", work / f"cache-{name.split()[0]}"
                pcmd, penv = make(server, pmnt, pcache)
                # AWS_CA_BUNDLE (set on some machines) makes rclone refuse a plain-HTTP endpoint.
                penv = {k: v for k, v in {**env, **penv}.items() if k != "AWS_CA_BUNDLE"}
                with Mounted(pcmd, penv, pmnt):
                    pfiles = [pmnt / Path(k).name for k in keys]
                    n, s = read_files(pfiles)
                    results[f"{name}, cold"] = {"bytes": n, "s": s}
                    n, s = read_files(pfiles)
                    results[f"{name}, warm"] = {"bytes": n, "s": s}

        # 5. Metadata: ls -lR over many sample files.
        jsonl = work / "meta.jsonl"
        with open(jsonl, "w") as f:
            for i in range(args.meta_samples):
                f.write(json.dumps({"text": f"record {i}"}) + "\n")
        sh([args.bin, "--no-progress", "shard", str(jsonl), "s3://fusebench/meta", "--input-format", "jsonl"], env=env)
        mmnt, mready = work / "mnt-meta", work / "ready-meta"
        mcmd = [args.bin, "--no-progress", "mount", "s3://fusebench/meta", str(mmnt), "--foreground",
                "--cache-root", str(work / "cache-meta"), "--ready-file", str(mready)]
        meta_index = json.loads(client.get_object(Bucket="fusebench", Key="meta/index.json")["Body"].read())
        # One file per sample and column, as the index counts them.
        meta_files = sum(s["samples"] * len(s["column_names"]) for s in meta_index["shards"])
        with Mounted(mcmd, env, mmnt, mready):
            for temp in ("cold", "warm"):
                for name, fn in (("ls -lR samples/", ls_lr), ("os.walk + stat samples/", walk_stat)):
                    r = fn(mmnt / "samples")
                    if r["files"] != meta_files:
                        raise RuntimeError(f"{name} saw {r['files']} files, the index lists {meta_files}")
                    results[f"{name}, {temp}"] = r
        # The same listing of a local folder of as many files: what `ls` itself costs here.
        local = work / "local-files"
        local.mkdir()
        for i in range(args.meta_samples):
            (local / f"{i:06}.text.txt").write_bytes(b"x")
        ls_lr(local)
        results["ls -lR of a local folder, same count"] = ls_lr(local)
        results["os.walk + stat of that local folder"] = walk_stat(local)
    finally:
        server.stop()
        for m in work.glob("mnt*"):
            subprocess.run(["fusermount3", "-u", "-z", str(m)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    width = max(len(k) for k in results)
    for k, v in results.items():
        if "bytes" in v and v.get("s"):
            extra = f"  (server sent {v['server_bytes'] / v['bytes']:.2f} x)" if "server_bytes" in v else ""
            print(f"{k:<{width}}  {mbps(v['bytes'], v['s']):9.1f} MB/s  {v['bytes'] / MIB:8.0f} MiB in {v['s']:.2f} s{extra}")
        elif "s" in v:
            print(f"{k:<{width}}  {v['s']:9.3f} s  ({v.get('files', '?')} files)")
        else:
            print(k)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def rclone_cmd(server, mnt: Path, cache: Path):
    env = {
        "RCLONE_CONFIG_FB_TYPE": "s3", "RCLONE_CONFIG_FB_PROVIDER": "Other",
        "RCLONE_CONFIG_FB_ENDPOINT": server.endpoint, "RCLONE_CONFIG_FB_ACCESS_KEY_ID": "bench",
        "RCLONE_CONFIG_FB_SECRET_ACCESS_KEY": "bench", "RCLONE_CONFIG_FB_REGION": "us-east-1",
        "RCLONE_CONFIG_FB_FORCE_PATH_STYLE": "true",
    }
    return ["rclone", "mount", "fb:fusebench/big", str(mnt), "--read-only", "--vfs-cache-mode", "full",
            "--cache-dir", str(cache), "--dir-cache-time", "1h"], env


def s3fs_cmd(server, mnt: Path, cache: Path):
    cache.mkdir(parents=True, exist_ok=True)
    pw = cache / "passwd"
    pw.write_text("bench:bench\n")
    pw.chmod(0o600)
    return ["s3fs", "fusebench:/big", str(mnt), "-f", "-o", f"url={server.endpoint}", "-o", "use_path_request_style",
            "-o", f"passwd_file={pw}", "-o", "ro", "-o", f"use_cache={cache / 'data'}"], {}


if __name__ == "__main__":
    main()

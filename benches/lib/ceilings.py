"""The ceilings of this machine, measured the same way as the systems (median of runs, bounded):
page-cache read of the shard files, raw parallel GET from the same S3 server (boto3, and
object_store in Rust), the cold ceiling (the same GETs written into files with the node cache's
discipline: temp file, fsync, rename), zstd decompression.

The cold ceiling is what a cold epoch must at least do on this machine: a cold epoch at 0.85 of it
is at 0.85 of what the store and the disk allow together, whatever raw GET alone reaches."""

from __future__ import annotations

import concurrent.futures as cf
import shutil
import subprocess
import time
from pathlib import Path

import datasets
from measure import cat_to_null, run_child
from results import Row, aggregate

THREADS = 8
# Profiles whose samples are at least this large also get the Python read() ceiling.
PY_READ_MIN_SAMPLE = 64 << 10

# The Python read() ceiling's child: reads every file in reads of one sample each (a new `bytes`
# object per read, as a loader that yields `bytes` makes one per sample) and prints its loop time
# (imports and process start excluded).
PY_READ = """
import json, sys, time
size, files = int(sys.argv[1]), sys.argv[2:]
t = time.perf_counter()
n = 0
for f in files:
    with open(f, "rb", buffering=0) as fh:
        while True:
            b = fh.read(size)
            if not b:
                break
            n += len(b)
print(json.dumps({"s": time.perf_counter() - t, "bytes": n}))
"""


# In flight for the Rust ceilings: the streamer's default fetch concurrency is of this order, and
# more does not help a server on the same two cores.
RUST_CONCURRENCY = 16
REPO = Path(__file__).resolve().parents[2]


def get_ceiling_binary() -> Path | None:
    """`get_ceiling` (storage/examples/get_ceiling.rs), release build preferred."""
    for build in ("release", "debug"):
        p = REPO / "target" / build / "examples" / "get_ceiling"
        if p.exists():
            return p
    return None


def _timed_runs(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def run_all(ctx, log) -> list[Row]:
    rows = []
    s3 = ctx.server.client()
    for p in ctx.profiles:
        mds = ctx.dirs[p.name]["mds"]
        files = datasets.files_of(mds)
        stored = sum(f.stat().st_size for f in files)

        def as_runs(times, nbytes, amp=None):
            return [{"samples": p.samples, "bytes": nbytes, "epoch_s": t, "check": "ok", "amp": amp} for t in times]

        # Page cache: the files were just written and read; `cat` them to /dev/null (one warm-up).
        cmd = ["cat", *map(str, files)]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, timeout=ctx.timeout)
        times = []
        for _ in range(ctx.runs):
            res = cat_to_null(files, ctx.timeout)
            times.append(res.wall_s)
        rows.append(aggregate("ceiling", "page-cache read (cat)", p.name, "warm · MDS shard files", "ceiling",
                              as_runs(times, stored), temperature="warm"))

        # What Python itself gets when it makes one `bytes` object per sample from the page cache
        # (the first run is a warm-up).
        if p.sample_bytes >= PY_READ_MIN_SAMPLE:
            cmd = [ctx.python, "-c", PY_READ, str(p.sample_bytes), *map(str, files)]
            times = []
            for _ in range(ctx.runs + 1):
                res = run_child(cmd, ctx.timeout)
                if res.rc == 0 and res.lines and res.lines[-1].get("bytes") == stored:
                    times.append(res.lines[-1]["s"])
            rows.append(aggregate("ceiling", "Python read() into bytes", p.name,
                                  "warm · MDS shard files, one read per sample", "ceiling",
                                  as_runs(times[1:], stored), temperature="warm",
                                  notes="a new bytes object per read, as a loader yielding bytes makes; loop time"))

        # Raw parallel GET of the same objects from the same server (boto3, 8 threads).
        keys = [f"mds/{p.name}/{f.relative_to(mds).as_posix()}" for f in files]

        def get_all():
            with cf.ThreadPoolExecutor(THREADS) as ex:
                list(ex.map(lambda k: s3.get_object(Bucket="bench", Key=k)["Body"].read(), keys))

        get_all()
        times = _timed_runs(get_all, ctx.runs)
        rows.append(aggregate("ceiling", f"raw parallel GET (boto3, {THREADS} threads)", p.name,
                              "cold · MDS shard objects", "ceiling", as_runs(times, stored, stored / p.data_bytes),
                              temperature="cold"))

        # The same objects with object_store (no shardstream transfer code), then the cold ceiling:
        # each body written to a temp file in the work folder, fsynced and renamed, as the cache does.
        exe = get_ceiling_binary()
        if exe is not None:
            url = f"s3://bench/mds/{p.name}"
            for label, extra in ((f"raw parallel GET (object_store, {RUST_CONCURRENCY} in flight)", []),
                                 ("cold ceiling: GET → cache files (write, fsync, rename)", ["--to"])):
                times = []
                for k in range(ctx.runs + 1):
                    dest = ctx.work / "scratch" / f"ceiling-{p.name}"
                    shutil.rmtree(dest, ignore_errors=True)
                    cmd = [str(exe), url, "--concurrency", str(RUST_CONCURRENCY)] + (extra + [str(dest)] if extra else [])
                    res = run_child(cmd, ctx.timeout, env=ctx.server.env)
                    shutil.rmtree(dest, ignore_errors=True)
                    if res.rc == 0 and res.lines and res.lines[-1].get("bytes") == stored and k > 0:
                        times.append(res.lines[-1]["seconds"])
                rows.append(aggregate("ceiling", label, p.name, "cold · MDS shard objects", "ceiling",
                                      as_runs(times, stored, stored / p.data_bytes), temperature="cold",
                                      notes=f"{exe.parent.parent.name} build of storage/examples/get_ceiling.rs; first run a warm-up"))

        # zstd: decompression of the same shard bytes (compressed once at level 3), one thread.
        blob = ctx.work / "scratch" / f"zstd-{p.name}.zst"
        blob.parent.mkdir(parents=True, exist_ok=True)
        with open(blob, "wb") as out:
            subprocess.run(["zstd", "-q", "-3", "-c", *map(str, files)], stdout=out, check=True, timeout=ctx.timeout)
        times = []
        for _ in range(ctx.runs):
            res = run_child(["sh", "-c", 'exec zstd -q -d -c "$1" > /dev/null', "zstd", str(blob)], ctx.timeout)
            times.append(res.wall_s)
        ratio = stored / blob.stat().st_size
        rows.append(aggregate("ceiling", "zstd -d (1 thread)", p.name, "warm · shard bytes, level 3", "ceiling",
                              as_runs(times, stored), temperature="warm",
                              notes=f"compression ratio {ratio:.2f}; MB/s of decompressed output"))
        blob.unlink()
        log(f"ceilings: {p.name} done")
    return rows

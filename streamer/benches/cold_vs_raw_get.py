"""Cold throughput of `shardstream stream` against the raw parallel GET of the same objects
(issue 3: >= 85% of the local S3 server's raw parallel-GET throughput for 1 MB samples).

Writes an MDS dataset of SAMPLES x 1 MiB incompressible samples in 64 MiB shards (mosaicml-streaming's
writer), serves it from the benches' counting moto server, then RUNS times each: a raw parallel GET
of every shard object (boto3, 8 threads, as benches/lib/ceilings.py does) and a cold
`shardstream stream --json` (fresh cache folder each run). Prints every run and the medians.

    .venv/bin/python streamer/benches/cold_vs_raw_get.py target/release/shardstream 512 5

Run it on an idle machine if you can; on a shared one, the two sides of a run are seconds apart,
so load moves both.
"""
import concurrent.futures as cf, json, os, shutil, subprocess, sys, tempfile, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benches", "lib"))
from s3server import S3Server
import numpy as np
from streaming import MDSWriter

bin_, samples, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
extra = sys.argv[4:]
work = tempfile.mkdtemp(prefix="coldbench-")
ds = os.path.join(work, "mds")
rng = np.random.default_rng(0)
with MDSWriter(out=ds, columns={"id": "int", "data": "bytes"}, size_limit=64 << 20) as w:
    for i in range(samples):
        w.write({"id": i, "data": rng.bytes(1 << 20)})
files = sorted(f for f in os.listdir(ds))
total = sum(os.path.getsize(os.path.join(ds, f)) for f in files)
srv = S3Server()
try:
    s3 = srv.client()
    s3.create_bucket(Bucket="bench")
    for f in files:
        s3.upload_file(os.path.join(ds, f), "bench", f"mds/{f}")
    keys = [f"mds/{f}" for f in files if f.endswith(".mds")]
    shard_bytes = sum(os.path.getsize(os.path.join(ds, k[4:])) for k in keys)
    def get_all():
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(lambda k: s3.get_object(Bucket="bench", Key=k)["Body"].read(), keys))
    get_all()
    raw = []
    for _ in range(runs):
        t = time.perf_counter(); get_all(); raw.append(time.perf_counter() - t)
    env = dict(os.environ, **srv.env)
    cli = []
    for r in range(runs):
        cache = os.path.join(work, f"cache{r}")
        t = time.perf_counter()
        out = subprocess.run([bin_, "--no-progress", "stream", "s3://bench/mds", "--cache-root", cache,
                              "--run-id", "bench", "--json", *extra], env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t
        if out.returncode != 0:
            print(out.stderr[-2000:]); sys.exit(1)
        j = json.loads(out.stdout.strip().splitlines()[-1])
        cli.append((wall, j))
        shutil.rmtree(cache)
    mb = shard_bytes / 1e6
    print(f"dataset: {samples} x 1 MiB samples, {len(keys)} shards, {mb:.1f} MB of shard objects")
    print("raw parallel GET (boto3, 8 threads): " + ", ".join(f"{mb/t:.0f} MB/s ({t:.2f} s)" for t in raw))
    for wall, j in cli:
        keys_of = {k: j[k] for k in j if any(s in k for s in ("first", "mb", "MB", "seconds", "fetch", "samples"))}
        print(f"shardstream stream cold: wall {wall:.2f} s = {mb/wall:.0f} MB/s; {json.dumps(keys_of)}")
    med_raw = sorted(raw)[len(raw)//2]; med_cli = sorted(w for w, _ in cli)[len(cli)//2]
    print(f"median: raw {mb/med_raw:.0f} MB/s, stream {mb/med_cli:.0f} MB/s wall, ratio {med_raw/med_cli:.2f}")
finally:
    srv.stop()
    shutil.rmtree(work, ignore_errors=True)

"""Where a checkpoint's CPU goes, across ranks: `dcp.save` and `dcp.load` of one state dict per
rank through shardstream's StorageWriter/Reader, then the raw parallel PUT/GET of the same bytes
(boto3, 8 threads per rank), each timed from a barrier before to a barrier after, with the CPU
seconds of every rank (user and system, summed, from getrusage), their minor page faults and the
S3 server's CPU seconds over the same interval (from /proc/<pid>/stat).

    .venv/bin/python benches/ckpt_cpu.py --ranks 4 --mb 1024 --reps 2 [--server moto] [--binding DIR]

One JSON line per operation. `--binding DIR` puts DIR first on the ranks' PYTHONPATH: a staged copy
of the package with another build's native module, for an A/B of two builds in one sitting
(docs/checkpoints.md has the huge-page change measured this way). s3s-fs is found as
benches/run.py finds it (SHARDSTREAM_S3S_FS or PATH).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benches" / "lib"))


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rank_main(spec: dict) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from shardstream.checkpoint import StorageReader, StorageWriter

    rank, ranks = spec["rank"], spec["ranks"]
    dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=ranks,
                            timeout=datetime.timedelta(seconds=600))
    per = spec["mb"] * (1 << 20) // 8 // 4
    gen = torch.Generator().manual_seed(rank)
    state = {f"rank{rank}.layer{i}.weight": torch.randn(per, generator=gen) for i in range(8)}

    def timed(op: str, fn) -> None:
        dist.barrier()
        server0 = proc_cpu_s(spec["server_pid"]) if rank == 0 else 0.0
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.time()
        fn()
        dist.barrier()
        t1, r1 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
        mine = (r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt)
        every = [None] * ranks
        dist.all_gather_object(every, mine)
        if rank == 0:
            print(json.dumps({
                "op": op, "rep": spec["rep_now"], "wall_s": round(t1 - t0, 2),
                "MB_per_s": round(ranks * spec["mb"] * (1 << 20) / 1e6 / (t1 - t0)),
                "client_user_s": round(sum(u for u, _, _ in every), 2),
                "client_sys_s": round(sum(s for _, s, _ in every), 2),
                "minor_faults": sum(f for _, _, f in every),
                "server_cpu_s": round(proc_cpu_s(spec["server_pid"]) - server0, 2),
            }), flush=True)

    for rep in range(spec["reps"]):
        spec["rep_now"] = rep
        url = f"s3://bench/ckpt/ss{rep}"
        timed("shardstream save", lambda: dcp.save(state, storage_writer=StorageWriter(url)))
        loaded = {k: torch.zeros_like(v) for k, v in state.items()}
        timed("shardstream load", lambda: dcp.load(loaded, storage_reader=StorageReader(url)))
        bad = [k for k in state if not torch.equal(loaded[k], state[k])]
        if bad:
            raise SystemExit(f"rank {rank}: {len(bad)} tensors differ after load")
        del loaded

    import boto3
    from botocore.config import Config

    s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id="bench", aws_secret_access_key="bench",
                      region_name="us-east-1", config=Config(max_pool_connections=16))
    blobs = {k: v.numpy().tobytes() for k, v in state.items()}
    for rep in range(spec["reps"]):
        spec["rep_now"] = rep

        def put():
            with cf.ThreadPoolExecutor(8) as ex:
                list(ex.map(lambda kv: s3.put_object(Bucket="bench", Key=f"ckpt/raw{rep}/{kv[0]}", Body=kv[1]),
                            blobs.items()))

        def get():
            with cf.ThreadPoolExecutor(8) as ex:
                got = dict(ex.map(lambda k: (k, s3.get_object(Bucket="bench", Key=f"ckpt/raw{rep}/{k}")["Body"].read()),
                                  blobs))
            if got != blobs:
                raise SystemExit(f"rank {rank}: raw GET bytes differ")

        timed("raw PUT", put)
        timed("raw GET", get)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--mb", type=int, default=1024, help="MiB of state dict per rank (8 float32 tensors)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--server", choices=("s3s-fs", "moto"), default="s3s-fs")
    ap.add_argument("--binding", help="a folder holding a staged `shardstream` package, first on the ranks' PYTHONPATH")
    ap.add_argument("--work", default=str(REPO / ".bench-work" / "ckpt-cpu"), help="the server's folder")
    args = ap.parse_args()

    import s3server

    with s3server.start(args.server, Path(args.work), sys.executable) as server:
        server.client().create_bucket(Bucket="bench")
        env = {**os.environ, **server.env}
        if args.binding:
            env["PYTHONPATH"] = os.pathsep.join(x for x in (args.binding, env.get("PYTHONPATH")) if x)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        spec = {"ranks": args.ranks, "mb": args.mb, "reps": args.reps, "init": f"tcp://127.0.0.1:{port}",
                "endpoint": server.endpoint, "server_pid": server.proc.pid}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank-spec", json.dumps({**spec, "rank": r})], env=env)
                 for r in range(args.ranks)]
        codes = [p.wait() for p in procs]
    if any(codes):
        print(f"rank exit codes {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank-spec":
        rank_main(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())

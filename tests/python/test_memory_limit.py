"""`memory_limit` is a hard limit on what the data path holds: a DataLoader with 2 workers
streaming a dataset of 32 KiB samples from a real S3 server (moto) with `memory_limit=8MiB` keeps
the peak RSS of its whole process tree within the documented base plus the limit.

The base is measured, not assumed: the same script, the same imports, workers and code path, over
a dataset of the same columns whose samples are empty. On top of it docs/python.md allows, per
worker, `memory_limit`, the engine's pool of recycled read buffers (`read_pool`) and the whole
small shards that samples in flight may still hold (`whole_shards`), plus the DataLoader's own
queue (`prefetch_factor x workers` collated
batches, held once by the worker and once by the main process), plus an allocator margin of
ALLOCATOR_MARGIN per process (freed memory glibc keeps)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import boto3

from conftest import write_ids

SAMPLE = 32 << 10
N = 2400
LIMIT = 8 << 20
WORKERS = 2
BATCH = 8
PREFETCH = 2
ALLOCATOR_MARGIN = 4 << 20  # docs/python.md, "Memory"


def read_pool(limit: int) -> int:
    """The engine's pool of recycled read buffers (docs/python.md, "Memory"): a sixteenth of the
    engine's 3/4 of the limit, at least 1 MiB and at most 16 MiB."""
    return max(1 << 20, min(limit * 3 // 64, 16 << 20))


def whole_shards(limit: int) -> int:
    """Small shards a shuffled stream read whole, let go of while samples handed over still use
    them (docs/python.md, "Memory"): an eighth of the engine's 3/4, at most 16 MiB."""
    return min(limit * 3 // 32, 16 << 20)

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from torch.utils.data import DataLoader
    import shardstream
    remote, limit = sys.argv[1], int(sys.argv[2])
    ds = shardstream.StreamingDataset(remote=remote, memory_limit=limit, batch_size={batch},
                                      shuffle=True, shuffle_window=2)
    loader = DataLoader(ds, batch_size={batch}, num_workers={workers}, prefetch_factor={prefetch},
                        multiprocessing_context="fork", persistent_workers=True)
    n = 0
    for batch in loader:
        n += len(batch["id"])
    time.sleep(0.5)
    print(n)
    """
).format(batch=BATCH, workers=WORKERS, prefetch=PREFETCH)


def _tree_rss(root: int) -> int:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except OSError:
            pass
        todo.extend(children.get(pid, []))
    return total


def _peak(cmd: list[str], env: dict) -> tuple[int, str]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.01)

    t = threading.Thread(target=sample)
    t.start()
    out, err = proc.communicate(timeout=300)
    done.set()
    t.join()
    assert proc.returncode == 0, err[-3000:]
    return peak, out


def _upload(moto, local: Path, bucket: str) -> str:
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    url = moto.create_bucket(bucket)
    for f in local.iterdir():
        s3.upload_file(str(f), bucket, f"ds/{f.name}")
    return f"{url}/ds"


def test_peak_rss_within_memory_limit(tmp_path, moto, stream_env):
    write_ids(tmp_path / "big", N, size_limit=1 << 20, extra=SAMPLE)
    write_ids(tmp_path / "empty", N, size_limit=1 << 20, extra=0)
    big = _upload(moto, tmp_path / "big", "memory-big")
    empty = _upload(moto, tmp_path / "empty", "memory-empty")
    script = tmp_path / "stream.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1", **moto.env)
    base, out = _peak([sys.executable, str(script), empty, str(LIMIT)], env)
    assert int(out) >= N
    env["SHARDSTREAM_RUN_ID"] += "-big"
    peak, out = _peak([sys.executable, str(script), big, str(LIMIT)], env)
    assert int(out) >= N
    batch_bytes = BATCH * SAMPLE
    queue = PREFETCH * WORKERS * batch_bytes * 2
    allowed = (base + WORKERS * (LIMIT + read_pool(LIMIT) + whole_shards(LIMIT)) + queue
               + (WORKERS + 1) * ALLOCATOR_MARGIN)
    dataset_bytes = N * SAMPLE
    print(f"base {base >> 20} MiB, peak {peak >> 20} MiB, allowed {allowed >> 20} MiB, "
          f"dataset {dataset_bytes >> 20} MiB")
    assert peak <= allowed, (
        f"peak RSS {peak >> 20} MiB > base {base >> 20} MiB + {WORKERS} x (memory_limit "
        f"{LIMIT >> 20} MiB + read pool) + queue {queue >> 20} MiB + margins"
    )
    # The bound means something: the data streamed is far larger than what was allowed on top.
    assert dataset_bytes > 2 * (allowed - base)

"""The node's metrics as a cluster scrapes them: `shardstream run` serves, at
`SHARDSTREAM_METRICS_ADDR`, the sum of the counters of every process of the node that streams.
A real Prometheus (Debian's package) scrapes it while a 2-rank torchrun job, each rank with
DataLoader(num_workers=2), streams an epoch from the local S3 server; its HTTP API then says the
node fetched exactly the dataset's shard bytes (each shard once per node), and the counter never
went backwards although the DataLoader workers exited after the epoch; `ds.metrics(node=True)`
in a rank says the same from Python. A checkpoint saved and loaded with
`shardstream.checkpoint` under `shardstream run` adds its bytes, commit and reads to the node's
sum that `run` serves."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import write_ids

JOB = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    import shardstream

    remote, done, expected, seen = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo")
    ds = shardstream.StreamingDataset(remote=remote, shuffle=True, batch_size=8)
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    for _ in loader:
        pass
    # The epoch is over and the DataLoader workers have exited: stay up (so `run` keeps
    # serving) until the test has read what Prometheus scraped.
    dist.barrier()
    if dist.get_rank() == 0:
        # The node's sum from Python, as Prometheus sees it (published within a second).
        deadline = time.monotonic() + 30
        while ds.metrics(node=True)["fetch_bytes"] != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        with open(seen, "w") as f:
            f.write(str(ds.metrics(node=True)["fetch_bytes"]))
    while not os.path.exists(done):
        time.sleep(0.2)
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(prom: str, promql: str) -> list:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def scalar(prom: str, promql: str) -> float | None:
    result = query(prom, promql)
    return float(result[0]["value"][1]) if result else None


@pytest.fixture()
def prometheus(tmp_path):
    exe = shutil.which("prometheus")
    assert exe, "prometheus is not installed (scripts/setup-system.sh installs Debian's package)"
    target_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(textwrap.dedent(f"""
        global:
          scrape_interval: 1s
          scrape_timeout: 1s
        scrape_configs:
          - job_name: shardstream
            static_configs:
              - targets: ["127.0.0.1:{target_port}"]
        """))
    proc = subprocess.Popen(
        [exe, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    web = f"http://127.0.0.1:{web_port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(web + "/-/ready", timeout=1).read()
            break
        except Exception:
            assert proc.poll() is None and time.monotonic() < deadline, "prometheus did not start"
            time.sleep(0.2)
    yield web, target_port
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def test_prometheus_sees_the_node_sum_of_every_rank_and_worker(tmp_path, moto, prometheus,
                                                               shardstream_bin):
    web, target_port = prometheus
    local = tmp_path / "mds"
    write_ids(local, 600, size_limit=1 << 14, extra=200)
    index = json.loads((local / "index.json").read_text())
    shard_bytes = sum(s["raw_data"]["bytes"] for s in index["shards"])
    remote = moto.upload_dataset(local, f"metrics-{tmp_path.name.lower().replace('_', '-')[-40:]}")

    script = tmp_path / "job.py"
    script.write_text(JOB)
    done = tmp_path / "done"
    env = dict(os.environ)
    env.update(moto.env)
    for var in ("SHARDSTREAM_RUN_ID", "SHARDSTREAM_CACHE_DIR", "TORCHELASTIC_RUN_ID", "RANK",
                "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(var, None)
    env["SHARDSTREAM_METRICS_ADDR"] = f"127.0.0.1:{target_port}"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    job = subprocess.Popen(
        [str(shardstream_bin), "run", "--run-id", "metrics", "--cache-root",
         str(tmp_path / "cache"), "--", torchrun, "--standalone", "--nproc-per-node=2",
         str(script), remote, str(done), str(shard_bytes), str(tmp_path / "seen")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # Every shard reaches the node once: the node's sum is the dataset's shard bytes.
        deadline = time.monotonic() + 240
        seen = None
        while time.monotonic() < deadline:
            assert job.poll() is None, f"the job ended early:\n{job.stdout.read()}"
            seen = scalar(web, "shardstream_fetch_bytes_total")
            if seen == shard_bytes:
                break
            time.sleep(0.5)
        assert seen == shard_bytes, (f"prometheus saw {seen} fetched bytes, the shards are {shard_bytes}; "
                                     f"targets: {query(web, 'up')}")
        samples = scalar(web, "shardstream_samples_total")
        assert samples is not None and samples >= 600, samples
        # Scraped again after the workers exited (two scrapes later): still the whole sum, and
        # never lower before.
        first = scalar(web, "timestamp(shardstream_fetch_bytes_total)")
        deadline = time.monotonic() + 30
        while scalar(web, "timestamp(shardstream_fetch_bytes_total)") < first + 2:
            assert time.monotonic() < deadline, "prometheus stopped scraping"
            time.sleep(0.2)
        assert scalar(web, "shardstream_fetch_bytes_total") == shard_bytes
        assert scalar(web, "resets(shardstream_fetch_bytes_total[5m])") == 0
        assert scalar(web, "resets(shardstream_samples_total[5m])") == 0
        assert scalar(web, 'up{job="shardstream"}') == 1
    finally:
        done.write_text("")
        try:
            out, _ = job.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            job.kill()
            out, _ = job.communicate()
    assert job.returncode == 0, out
    assert int((tmp_path / "seen").read_text()) == shard_bytes


CKPT_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    import torch.distributed.checkpoint as dcp
    from shardstream.checkpoint import StorageReader, StorageWriter, list_checkpoints

    root, done, out = sys.argv[1], sys.argv[2], sys.argv[3]
    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "b": torch.ones(100)}
    dcp.save(state, storage_writer=StorageWriter(root + "/step_1"), no_dist=True)
    back = {"w": torch.zeros(1 << 16), "b": torch.zeros(100)}
    dcp.load(back, storage_reader=StorageReader(root + "/step_1"), no_dist=True)
    assert torch.equal(back["w"], state["w"])
    [info] = list_checkpoints(root)
    with open(out, "w") as f:
        json.dump(info, f)
    # Stay up so that `run` keeps serving until the test has read it.
    while not os.path.exists(done):
        time.sleep(0.1)
    """
)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_checkpoint_saved_under_run_adds_its_bytes_to_the_node_sum(tmp_path, shardstream_bin):
    script = tmp_path / "ckpt_job.py"
    script.write_text(CKPT_JOB)
    done, info_file = tmp_path / "done", tmp_path / "info.json"
    port = free_port()
    env = dict(os.environ)
    for var in ("SHARDSTREAM_RUN_ID", "SHARDSTREAM_CACHE_DIR", "TORCHELASTIC_RUN_ID",
                "SHARDSTREAM_METRICS_ADDR", "SHARDSTREAM_NODE_METRICS"):
        env.pop(var, None)
    job = subprocess.Popen(
        [str(shardstream_bin), "run", "--run-id", "ckpt-metrics", "--cache-root",
         str(tmp_path / "cache"), "--metrics-addr", f"127.0.0.1:{port}", "--",
         sys.executable, str(script), str(tmp_path / "ckpt"), str(done), str(info_file)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not info_file.exists():
            assert job.poll() is None, f"the job ended early:\n{job.stdout.read()}"
            assert time.monotonic() < deadline, "the checkpoint job did not finish"
            time.sleep(0.2)
        time.sleep(0.2)  # the file is written whole, but read it once it is closed
        info = json.loads(info_file.read_text())
        # Published when each call returns: no waiting for a period.
        seen = scrape(port)
        assert seen["shardstream_checkpoint_bytes_total"] == info["total_bytes"], (seen, info)
        assert seen["shardstream_checkpoint_files_total"] == info["files"]
        assert seen["shardstream_checkpoint_commits_total"] == 1
        assert seen["shardstream_checkpoint_commit_seconds_total"] > 0
        # The load read the tensors back (and the metadata): at least the data's bytes.
        assert seen["shardstream_checkpoint_read_bytes_total"] >= 4 * (1 << 16)
        # The dataset's counters are served beside them, at zero (nothing streamed).
        assert seen["shardstream_fetch_bytes_total"] == 0
        published = list((tmp_path / "cache" / "ckpt-metrics" / "0" / "metrics").iterdir())
        assert len(published) == 1, published
    finally:
        done.write_text("")
        try:
            out, _ = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            out, _ = job.communicate()
    assert job.returncode == 0, out

"""A DataLoader that forks its workers right after the main process read a sample itself (a
script that peeks at its data before training), from a shard server that holds every shard GET
for a second, with shards stored raw and zstd-compressed.

The main process's stream had started the next shards when it was dropped, and their downloads
go on in the background. A forked worker inherits the parent's memory, not its threads: before
the fix, the cache's lock table said "held" for the parent's fetch locks, the memory budget
counted the parent's download buffers, and the worker's copies of the parent's lock descriptors
kept the parent's `flock`s alive; workers waited forever (about 1 run in 2). Now each worker
waits for, or joins, the parent's downloads, and the epoch comes out complete: every sample
exactly once, with its bytes.
"""

from __future__ import annotations

import http.client
import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest

from conftest import pad_bytes

N = 600
EXTRA = 2000
SHARD_DELAY_S = 1.0

SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from torch.utils.data import DataLoader
    import shardstream
    remote = sys.argv[1]
    ds = shardstream.StreamingDataset(remote=remote, batch_size=8, shuffle=True,
                                      memory_limit="4MiB")
    it = iter(ds)
    next(it)
    del it
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork")
    seen = []
    for batch in loader:
        for i, pad in zip(batch["id"].tolist(), batch["pad"]):
            if pad != bytes([i % 251]) * {extra}:
                raise SystemExit(f"sample {{i}} has the wrong bytes")
            seen.append(i)
    print(json.dumps({{"seen": seen, "metrics": ds.metrics()}}))
    """
).format(extra=EXTRA)


class _SlowShards(http.server.BaseHTTPRequestHandler):
    """Forwards every request to the S3 server; holds the answer to a shard GET for a while."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)
    delay_s = SHARD_DELAY_S
    held = 0

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        if self.command == "GET" and ".mds" in self.path:
            type(self).held += 1
            time.sleep(self.delay_s)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_HEAD = _forward

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture()
def slow_proxy(moto):
    u = urlsplit(moto.endpoint)
    handler = type("Handler", (_SlowShards,), {"upstream": (u.hostname, u.port), "held": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def _write(out: Path, compression: str | None) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "pad": "bytes"}, compression=compression,
                   size_limit=64 << 10) as w:
        for i in range(N):
            w.write({"id": i, "pad": pad_bytes(i, EXTRA)})


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_workers_forked_after_the_parent_read_finish_the_epoch(
    tmp_path, moto, slow_proxy, stream_env, compression
):
    data = tmp_path / "data"
    _write(data, compression)
    bucket = f"fork-after-read-{compression or 'raw'}"
    moto.create_bucket(bucket)
    s3 = boto3.client("s3", **{"endpoint_url": moto.endpoint, "region_name": "us-east-1",
                               "aws_access_key_id": "testing", "aws_secret_access_key": "testing"})
    for f in data.iterdir():
        s3.upload_file(str(f), bucket, f"ds/{f.name}")
    shards = len([f for f in data.iterdir() if f.suffix != ".json"])
    assert shards >= 8, "enough shards that the parent's stream had several to start"

    endpoint, handler = slow_proxy
    env = {**os.environ, **moto.env, **stream_env, "AWS_ENDPOINT_URL": endpoint}
    started = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"s3://{bucket}/ds"],
        env=env, capture_output=True, text=True, timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    import json

    out = json.loads(res.stdout.strip().splitlines()[-1])
    seen = out["seen"]
    assert sorted(seen) == list(range(N)), "every sample exactly once"
    assert handler.held >= 1, "shard GETs went through the slow proxy"
    assert out["metrics"]["fetch_requests"] >= 1, "the main process downloaded shards itself"
    assert time.monotonic() - started < 200

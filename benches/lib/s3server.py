"""A local S3 server for the benchmarks: moto's own WSGI app, served on 127.0.0.1, with a thin
middleware that counts the requests and the response bytes it serves.

Two servers, chosen with `benches/run.py --server`:
- moto (default): already in the test venv; its Python server (~1 GB/s, whole-object range reads)
  bounds every client, and the report shows that ceiling next to each figure;
- s3s-fs (a Rust S3 server from crates.io, objects as files; `cargo install s3s-fs`): several times
  faster, so the clients' own limits show. Its binary is found through `SHARDSTREAM_S3S_FS` or PATH.
The counters give the download amplification of every system the same way (bytes the server sent /
bytes of the dataset), without trusting each client's own accounting: moto counts in a WSGI
middleware; for s3s-fs a side server reports the bytes the server process wrote (`wchar` of
/proc/PID/io: its sockets, as nothing is uploaded while an epoch is measured), so no proxy slows it.

Run as a script: `python s3server.py PORT`. `GET /_bench/counters` returns the counters as JSON;
`POST /_bench/reset` zeroes them. Every other request goes to moto untouched.
"""

from __future__ import annotations

import json
import os
import socket
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path


class CountingMiddleware:
    """WSGI middleware: counts requests by method and the bytes of every response body."""

    def __init__(self, app) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.counters = {"requests": 0, "get_requests": 0, "put_requests": 0, "bytes_sent": 0, "bytes_received": 0}

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/_bench/counters":
            with self.lock:
                body = json.dumps(self.counters).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path == "/_bench/reset":
            self.reset()
            start_response("200 OK", [("Content-Length", "0")])
            return [b""]
        method = environ.get("REQUEST_METHOD", "")
        received = int(environ.get("CONTENT_LENGTH") or 0)
        with self.lock:
            self.counters["requests"] += 1
            self.counters["bytes_received"] += received
            if method == "GET":
                self.counters["get_requests"] += 1
            elif method == "PUT":
                self.counters["put_requests"] += 1
        return self._count(self.app(environ, start_response))

    def _count(self, body):
        try:
            for chunk in body:
                with self.lock:
                    self.counters["bytes_sent"] += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


def _serve(port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", port, CountingMiddleware(app), threaded=True, request_handler=MotoRequestHandler)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(ok, proc, deadline_s: float, what: str, stop) -> None:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            ok()
            return
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop()
                raise RuntimeError(f"{what} did not start")
            time.sleep(0.1)


class S3Server:
    """The counting moto server as a child process on a free 127.0.0.1 port (a context manager)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.counters()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto server did not start on {self.endpoint}")
                time.sleep(0.1)

    @property
    def env(self) -> dict[str, str]:
        """The environment every client reads: boto3, Mosaic (S3_ENDPOINT_URL), object_store, rclone."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "S3_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
            config=Config(max_pool_connections=32, retries={"max_attempts": 3}),
        )

    name = "moto"

    @property
    def counters_url(self) -> str:
        return self.endpoint + "/_bench/counters"

    def counters(self) -> dict:
        return read_counters(self.counters_url)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.endpoint + "/_bench/reset", method="POST"), timeout=5).read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> "S3Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class S3sFsServer(S3Server):
    """s3s-fs on a free 127.0.0.1 port over a folder of `root`, plus a side HTTP server on another
    port whose `/_bench/counters` reports the bytes the s3s-fs process wrote since the last reset."""

    name = "s3s-fs"

    def __init__(self, root: Path, binary: str | None = None) -> None:
        import http.server

        exe = binary or os.environ.get("SHARDSTREAM_S3S_FS") or shutil_which("s3s-fs")
        if not exe:
            raise RuntimeError("s3s-fs not found: `cargo install s3s-fs --locked` or set SHARDSTREAM_S3S_FS")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.root = Path(root)
        # A fresh store each run, as moto's in-memory one is: the last run's bucket would make
        # CreateBucket fail, and its objects would be served instead of this run's uploads.
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [exe, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", "bench", "--secret-key", "bench",
             str(self.root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._base = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                body = json.dumps(server._counters()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                server._base = server._wchar()
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._side = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._side_url = f"http://127.0.0.1:{self._side.server_address[1]}"
        threading.Thread(target=self._side.serve_forever, daemon=True).start()
        _wait_until(lambda: self.client().list_buckets(), self.proc, 30, f"s3s-fs on {self.endpoint}", self.stop)

    def _wchar(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
        return 0

    def _counters(self) -> dict:
        return {"bytes_sent": self._wchar() - self._base, "requests": None, "get_requests": None,
                "put_requests": None, "bytes_received": None}

    @property
    def counters_url(self) -> str:
        return self._side_url + "/_bench/counters"

    def counters(self) -> dict:
        return self._counters()

    def reset(self) -> None:
        self._base = self._wchar()

    def stop(self) -> None:
        side = getattr(self, "_side", None)
        if side is not None:
            side.shutdown()
        super().stop()


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)


def read_counters(url: str) -> dict:
    """A server's counters (`bytes_sent`, ...) from their URL (`S3Server.counters_url`): what a child
    process that has only the URL reads."""
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def delete_prefix(s3, bucket: str, prefix: str = "") -> None:
    """Deletes every object under `prefix` (all of them with ""), a page of keys at a time."""
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def start(kind: str, work: Path, python: str = sys.executable) -> S3Server:
    """The benchmark's S3 server: `moto` or `s3s-fs` (its objects under work/s3s-fs)."""
    if kind == "moto":
        return S3Server(python)
    if kind == "s3s-fs":
        return S3sFsServer(work / "s3s-fs")
    raise ValueError(f"unknown S3 server {kind!r}: moto or s3s-fs")


if __name__ == "__main__":
    _serve(int(sys.argv[1]))

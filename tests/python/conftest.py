"""Shared fixtures for the Python-level tests: the built `shardstream` binary, a real moto S3
server on 127.0.0.1 (started on a free port, stopped after the session), and helpers that turn
values from the peer libraries into the canonical form `shardstream cat --json` prints."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def shardstream_bin() -> Path:
    """The CLI binary built by `cargo build` (SHARDSTREAM_BIN overrides)."""
    path = Path(os.environ.get("SHARDSTREAM_BIN", REPO / "target" / "debug" / "shardstream"))
    if not path.exists():
        subprocess.run(["cargo", "build", "-p", "shardstream-cli"], cwd=REPO, check=True)
    assert path.exists(), f"shardstream binary not found at {path}"
    return path


def run_cli(bin_path: Path, *args: str, env: dict | None = None, check: bool = True):
    """Runs the CLI and returns the CompletedProcess (text mode)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [str(bin_path), *map(str, args)], capture_output=True, text=True, env=full_env, timeout=600
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"shardstream {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}"
        )
    return proc


def cat_json(bin_path: Path, dataset: str, *extra: str, env: dict | None = None) -> list[dict]:
    """All samples of `dataset` as canonical JSON objects, in dataset order."""
    out = run_cli(bin_path, "cat", dataset, "--json", *extra, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """A real moto S3 server process on 127.0.0.1."""

    def __init__(self) -> None:
        exe = os.environ.get("SHARDSTREAM_MOTO_SERVER") or shutil.which("moto_server")
        if exe is None:
            exe = str(Path(sys.executable).parent / "moto_server")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=1).read()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {self.endpoint}")
                time.sleep(0.1)

    @property
    def env(self) -> dict:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def create_bucket(self, name: str) -> str:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload_dataset(self, local, name: str) -> str:
        """A new bucket `name` holding the files of the dataset folder `local` under `ds/`;
        returns the dataset's URL."""
        import boto3

        bucket = self.create_bucket(name)
        s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        for f in Path(local).iterdir():
            s3.upload_file(str(f), name, f"ds/{f.name}")
        return f"{bucket}/ds"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def moto():
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture()
def ctrl_c():
    """Python's own SIGINT handler for the test's duration. A test run started in the background
    (`cmd &` in a script, nohup, some CI runners) inherits SIGINT ignored, and Python then
    installs no handler: a test of Ctrl-C would see nothing happen."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture()
def stream_env(tmp_path, monkeypatch):
    """A run id and a cache root of the test's own for `shardstream.StreamingDataset` (docs/cache.md;
    with one set, the dataset uses it instead of deriving one). Returns the environment it set."""
    env = {
        "SHARDSTREAM_RUN_ID": f"test-{os.getpid()}-{tmp_path.name}",
        "SHARDSTREAM_CACHE_ROOT": str(tmp_path / "cache-root"),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(k, raising=False)
    return env


def pad_bytes(i: int, extra: int) -> bytes:
    """The `pad` column of sample `i` in a dataset from `write_ids(..., extra=extra)`."""
    return bytes([i % 251]) * extra


def write_ids(out: Path, n: int, size_limit: int = 1 << 12, extra: int = 0) -> None:
    """A Mosaic-written dataset of `n` samples: `id` (int), `x` (uint32 = 3*id) and `pad`
    (`extra` bytes), small shards so that orders and caches have something to do."""
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out),
        columns={"id": "int", "x": "uint32", "pad": "bytes"},
        size_limit=size_limit,
    ) as w:
        for i in range(n):
            w.write({"id": i, "x": __import__("numpy").uint32(3 * i), "pad": pad_bytes(i, extra)})

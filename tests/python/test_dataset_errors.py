"""Opening a remote dataset off-cluster, as a plain script or a notebook does: no run id is
needed (one is derived from the dataset's URL and the user, so the next run of the script reuses
the cache), and errors are worded for Python: a bad run id names the `run_id=` argument, not the
CLI's `--run-id`. (The dataset is on the local S3 server: a local one read in place never needed
a run id.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import shardstream
from conftest import write_ids

RUN_ID_SOURCES = ("SHARDSTREAM_RUN_ID", "SHARDSTREAM_JOBSET_NAME", "SHARDSTREAM_PYTORCHJOB_NAME",
                  "SHARDSTREAM_JOB_NAME", "TORCHELASTIC_RUN_ID", "SHARDSTREAM_CACHE_DIR")


@pytest.fixture()
def no_run_id(tmp_path, monkeypatch, moto):
    import boto3

    for var in RUN_ID_SOURCES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SHARDSTREAM_CACHE_ROOT", str(tmp_path / "cache-root"))
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    root = tmp_path / "mds"
    write_ids(root, 5)
    bucket = moto.create_bucket(f"runid-{tmp_path.name.lower().replace('_', '-')[-40:]}")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in root.iterdir():
        s3.upload_file(str(f), bucket[len("s3://"):], f"ds/{f.name}")
    return f"{bucket}/ds"


PLAIN_SCRIPT = """
import json, sys
import shardstream
ds = shardstream.StreamingDataset(remote=sys.argv[1], batch_size=2)
ids = sorted(int(s["id"]) for s in ds)
print(json.dumps({"ids": ids, "cache_dir": ds.cache_dir, "fetched": ds.metrics()["fetch_bytes"]}))
"""


def run_plain_script(remote: str) -> dict:
    """Runs the script in a process of its own, with no launcher variable set (the fixture
    cleared them), as a user runs `python train.py` twice."""
    out = subprocess.run([sys.executable, "-c", PLAIN_SCRIPT, remote], check=True,
                         capture_output=True, text=True, env=dict(os.environ), timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_plain_script_needs_no_run_id_and_its_second_run_downloads_nothing(no_run_id):
    first = run_plain_script(no_run_id)
    assert first["ids"] == list(range(5))
    assert first["fetched"] > 0
    assert "/auto-" in first["cache_dir"], first["cache_dir"]
    second = run_plain_script(no_run_id)
    assert second["ids"] == list(range(5))
    assert second["cache_dir"] == first["cache_dir"]
    assert second["fetched"] == 0, second
    # A run id given on purpose still keys its own folder.
    named = shardstream.StreamingDataset(remote=no_run_id, run_id="r1")
    assert named.num_samples == 5 and "/r1/" in named.cache_dir


def test_bad_run_id_names_the_python_argument(no_run_id):
    with pytest.raises(ValueError) as err:
        shardstream.StreamingDataset(remote=no_run_id, run_id="../escape")
    msg = str(err.value)
    assert "run_id=" in msg and "--run-id" not in msg, msg


def test_a_streams_local_is_its_cache_folder(no_run_id, tmp_path):
    """Mosaic's `Stream(remote=..., local=...)`: the shards are cached in `local`, with no run
    id and no cache root needed."""
    local = tmp_path / "my-local"
    ds = shardstream.StreamingDataset(streams=[shardstream.Stream(remote=no_run_id, local=str(local))],
                                      batch_size=2)
    assert ds.cache_dir == str(local)
    assert sorted(int(s["id"]) for s in ds) == list(range(5))
    assert ds.metrics()["fetch_bytes"] > 0
    assert any((local / "data").iterdir()), "the shards are in local"

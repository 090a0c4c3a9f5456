"""Errors a Python user meets when opening a dataset are worded for Python: a missing or bad run
id names the `run_id=` argument and `SHARDSTREAM_RUN_ID`, not only the CLI's `--run-id`. (A run
id keys the cache of a remote dataset; a local one read in place needs none, so the dataset is
on the local S3 server.)"""

from __future__ import annotations

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


def test_missing_run_id_names_the_python_argument(no_run_id):
    with pytest.raises(ValueError) as err:
        shardstream.StreamingDataset(remote=no_run_id)
    msg = str(err.value)
    assert "run_id=" in msg and "SHARDSTREAM_RUN_ID" in msg, msg
    # Given as the message says, it opens.
    assert shardstream.StreamingDataset(remote=no_run_id, run_id="r1").num_samples == 5


def test_bad_run_id_names_the_python_argument(no_run_id):
    with pytest.raises(ValueError) as err:
        shardstream.StreamingDataset(remote=no_run_id, run_id="../escape")
    msg = str(err.value)
    assert "run_id=" in msg and "--run-id" not in msg, msg

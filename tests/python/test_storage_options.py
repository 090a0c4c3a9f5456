"""`storage_options={...}`: endpoint, region and credentials per call, against a real moto
server, in a process whose environment holds no AWS credentials at all (no keys, no profile
files, instance metadata switched off), so only the options can make a request succeed.

Covered: `ShardWriter` to S3, `StreamingDataset` (plain and through `Stream`), DCP
`StorageWriter`/`StorageReader`, the error without options (it says no credentials were
found, and names what was looked at), and unknown option names.
"""

from __future__ import annotations

import os
import socket

import pytest

import shardstream
from shardstream import ShardWriter, Stream, StreamingDataset

N = 40


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def no_credentials(monkeypatch, tmp_path, stream_env):
    """An environment without AWS credentials: every `AWS_*` variable removed, profile files
    that do not exist, instance metadata off, and every metadata endpoint on a closed loopback
    port."""
    for name in list(os.environ):
        if name.startswith("AWS_") or name == "S3_ENDPOINT_URL":
            monkeypatch.delenv(name)
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", closed)
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", closed)
    return stream_env


def _options(moto, **extra) -> dict:
    """s3fs-style options for moto: fsspec users write exactly this."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": moto.endpoint, "region_name": "us-east-1"},
        **extra,
    }


def _write_dataset(moto, bucket: str) -> str:
    url = moto.create_bucket(bucket) + "/ds"
    with ShardWriter(out=url, columns={"id": "int"}, size_limit=1 << 10,
                     storage_options=_options(moto)) as w:
        for i in range(N):
            w.write({"id": i})
    return url


def test_dataset_and_shard_writer_take_credentials_per_call(moto, no_credentials):
    url = _write_dataset(moto, "opts-ds")
    ds = StreamingDataset(remote=url, storage_options=_options(moto), batch_size=4)
    assert sorted(int(s["id"]) for s in ds) == list(range(N))

    # boto3/object_store spellings of the same settings, given on the Stream.
    stream = Stream(remote=url, storage_options={
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "endpoint_url": moto.endpoint,
        "region": "us-east-1",
    })
    mixed = StreamingDataset(streams=[stream], batch_size=4)
    assert sorted(int(s["id"]) for s in mixed) == list(range(N))


def test_without_options_the_error_says_no_credentials_were_found(moto, no_credentials):
    url = _write_dataset(moto, "opts-none")
    with pytest.raises(Exception) as err:
        ds = StreamingDataset(remote=url, storage_options={"endpoint_url": moto.endpoint},
                              batch_size=4)
        list(ds)
    text = str(err.value)
    assert "no AWS credentials found" in text, text
    for looked_at in ("AWS_ACCESS_KEY_ID", "no-credentials", "AWS_WEB_IDENTITY_TOKEN_FILE",
                      "disabled by AWS_EC2_METADATA_DISABLED"):
        assert looked_at in text, text
    assert "cannot reach" not in text


def test_checkpoint_writer_and_reader_take_credentials_per_call(moto, no_credentials):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp
    from shardstream.checkpoint import StorageReader, StorageWriter

    root = moto.create_bucket("opts-ckpt") + "/run"
    state = {"w": torch.arange(1000, dtype=torch.float32)}
    dcp.save(state, storage_writer=StorageWriter(f"{root}/step_1", storage_options=_options(moto)),
             no_dist=True)
    loaded = {"w": torch.zeros(1000)}
    dcp.load(loaded, storage_reader=StorageReader(f"{root}/step_1", storage_options=_options(moto)),
             no_dist=True)
    assert torch.equal(loaded["w"], state["w"])

    # Without the keys, the reader's first request fails naming the missing credentials (dcp.load
    # would go on to try rank-local metadata and raise about that instead).
    reader = StorageReader(f"{root}/step_1", storage_options={"endpoint_url": moto.endpoint})
    with pytest.raises(shardstream.StorageError, match="no AWS credentials found"):
        reader.read_metadata()


def test_unknown_option_names_are_refused_with_the_accepted_ones(moto, no_credentials, tmp_path):
    with pytest.raises(ValueError) as err:
        ShardWriter(out="s3://b/ds", columns={"id": "int"},
                    storage_options={"endpoint": moto.endpoint, "secrett": "hunter2"})
    text = str(err.value)
    assert "secrett" in text and "endpoint_url" in text and "anon" in text, text
    assert "hunter2" not in text
    with pytest.raises(TypeError):
        ShardWriter(out=str(tmp_path / "x"), columns={"id": "int"},
                    storage_options={"key": object()})


def test_anonymous_access_reads_a_public_dataset(moto, no_credentials):
    import boto3

    url = _write_dataset(moto, "opts-anon")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for obj in s3.list_objects_v2(Bucket="opts-anon")["Contents"]:
        s3.put_object_acl(Bucket="opts-anon", Key=obj["Key"], ACL="public-read")
    ds = StreamingDataset(remote=url, batch_size=4,
                          storage_options={"anon": True, "endpoint_url": moto.endpoint})
    assert sorted(int(s["id"]) for s in ds) == list(range(N))

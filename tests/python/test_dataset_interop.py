"""`shardstream.StreamingDataset` against the real mosaicml-streaming: datasets written by
Mosaic's MDSWriter with every column encoding (and compressions, hashes) yield, through Python,
the same objects Mosaic's own StreamingDataset yields, both by iteration and by index; the batch
path gives the same values as numpy arrays and buffers; damaged data raises the exception of its
kind, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardstream
from canonical import from_peer
from test_mds_interop import COLUMNS, mosaic_samples, write_mosaic


def _same(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs) > 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert set(a) == set(COLUMNS), f"sample {i}: columns {sorted(a)}"
        for name, enc in COLUMNS.items():
            assert type(a[name]) is type(b[name]) or (
                isinstance(a[name], Image.Image) and isinstance(b[name], Image.Image)
            ), f"sample {i} column {name}: {type(a[name])} vs {type(b[name])}"
            got, want = from_peer(a[name], enc), from_peer(b[name], enc)
            assert got == want, f"sample {i} column {name} ({enc}): {got!r} != {want!r}"


@pytest.mark.parametrize(
    "compression,hashes", [(None, None), ("zstd", ["sha1", "xxh64"]), ("gz:1", ["md5"])]
)
def test_every_encoding_equals_mosaic(tmp_path, stream_env, compression, hashes):
    data = tmp_path / "mds"
    write_mosaic(data, 37, compression=compression, hashes=hashes)
    theirs = mosaic_samples(data)
    ds = shardstream.StreamingDataset(local=str(data), batch_size=4)
    assert ds.num_samples == len(theirs) == 37
    _same(list(ds), theirs)
    _same([ds[i] for i in range(len(theirs))], theirs)
    assert from_peer(ds[-1]["int"], "int") == from_peer(theirs[-1]["int"], "int")


def test_remote_through_cache_equals_mosaic(tmp_path, stream_env, moto, monkeypatch):
    """The same dataset uploaded to a real S3 server (moto) and streamed through the cache."""
    import boto3

    data = tmp_path / "mds"
    write_mosaic(data, 23, compression="zstd", hashes=["xxh64"])
    theirs = mosaic_samples(data)
    bucket = moto.create_bucket("interop")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in data.iterdir():
        s3.upload_file(str(f), "interop", f"ds/{f.name}")
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    ds = shardstream.StreamingDataset(remote=f"{bucket}/ds", validate_hash="xxh64")
    _same(list(ds), theirs)
    assert ds.metrics()["fetch_bytes"] > 0


def test_iter_batches_matches_samples(tmp_path, stream_env):
    data = tmp_path / "mds"
    write_mosaic(data, 29)
    ds = shardstream.StreamingDataset(local=str(data))
    want = list(ds)
    cols = ["int", "u8", "f16", "nd_fixed", "str", "bytes", "js"]
    got = list(ds.iter_batches(8, columns=cols))
    assert [len(b["u8"]) for b in got] == [8, 8, 8, 5]
    ints = np.concatenate([b["int"] for b in got])
    assert ints.dtype == np.int64 and ints.tolist() == [s["int"] for s in want]
    assert np.concatenate([b["u8"] for b in got]).tolist() == [int(s["u8"]) for s in want]
    f16 = np.concatenate([b["f16"] for b in got])
    assert f16.dtype == np.float16 and f16.tolist() == [float(s["f16"]) for s in want]
    nd = np.concatenate([b["nd_fixed"] for b in got])
    assert nd.shape == (29, 2, 3) and np.array_equal(nd, np.stack([s["nd_fixed"] for s in want]))
    strs = [v for b in got for v in b["str"].tolist()]
    assert strs == [s["str"] for s in want]
    raw = [bytes(b["bytes"][i]) for b in got for i in range(len(b["bytes"]))]
    assert raw == [s["bytes"] for s in want]
    assert isinstance(got[0]["bytes"][0], memoryview)
    js = [json.loads(bytes(b["js"][i])) for b in got for i in range(len(b["js"]))]
    assert js == [s["js"] for s in want]


def test_open_random_access(tmp_path, stream_env):
    data = tmp_path / "mds"
    write_mosaic(data, 11)
    theirs = mosaic_samples(data)
    ds = shardstream.open(str(data))
    assert ds.num_samples == 11
    for i in (0, 5, 10, -1):
        assert from_peer(ds[i]["nd"], "ndarray") == from_peer(theirs[i]["nd"], "ndarray")
    with pytest.raises(IndexError, match="out of range"):
        ds[11]


def test_errors_name_the_file(tmp_path, stream_env, moto, monkeypatch):
    import boto3

    with pytest.raises(shardstream.NotFoundError, match="index.json"):
        shardstream.StreamingDataset(local=str(tmp_path / "missing"))
    data = tmp_path / "mds"
    write_mosaic(data, 9, hashes=["sha1"])
    shard = sorted(data.glob("shard.*.mds"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    bucket = moto.create_bucket("damaged")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in data.iterdir():
        s3.upload_file(str(f), "damaged", f"ds/{f.name}")
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    ds = shardstream.StreamingDataset(remote=f"{bucket}/ds", validate_hash="sha1")
    with pytest.raises(shardstream.HashMismatchError, match=shard.name):
        list(ds)
    assert issubclass(shardstream.HashMismatchError, shardstream.CorruptDataError)
    assert issubclass(shardstream.CorruptDataError, shardstream.ShardstreamError)
    (data / "index.json").write_text("{not json")
    with pytest.raises(shardstream.CorruptDataError, match="index.json"):
        shardstream.StreamingDataset(local=str(data))


def test_errors_are_also_the_builtin_python_code_catches(tmp_path, stream_env):
    """A missing dataset is also a FileNotFoundError and corrupt data also a ValueError (what
    Mosaic raises for a checksum failure), so `except FileNotFoundError:` around a load works;
    both still are ShardstreamErrors, and pickle (DataLoader workers send them) keeps the class."""
    import pickle

    with pytest.raises(FileNotFoundError, match="index.json") as missing:
        shardstream.StreamingDataset(local=str(tmp_path / "missing"))
    assert isinstance(missing.value, shardstream.NotFoundError)
    data = tmp_path / "mds"
    write_mosaic(data, 9)
    (data / "index.json").write_text("{not json")
    with pytest.raises(ValueError, match="index.json") as corrupt:
        shardstream.StreamingDataset(local=str(data))
    assert isinstance(corrupt.value, shardstream.CorruptDataError)
    assert issubclass(shardstream.HashMismatchError, ValueError)
    for err in (missing.value, corrupt.value, shardstream.HashMismatchError("shard.00000.mds: sha1 differs")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
        assert isinstance(back, shardstream.ShardstreamError)


def test_undecodable_column_names_shard_and_column(tmp_path, stream_env):
    from streaming import MDSWriter

    data = tmp_path / "mds"
    with MDSWriter(out=str(data), columns={"id": "int", "t": "str"}) as w:
        for i in range(5):
            w.write({"id": i, "t": "marker-" + "A" * 16 if i == 3 else f"text {i}"})
    shard = data / "shard.00000.mds"
    raw = shard.read_bytes()
    assert raw.count(b"A" * 16) == 1
    shard.write_bytes(raw.replace(b"A" * 16, b"\xff" * 16))  # same size, not UTF-8
    ds = shardstream.StreamingDataset(local=str(data))
    assert ds[2]["t"] == "text 2"
    with pytest.raises(shardstream.CorruptDataError, match=r"shard\.00000\.mds.*sample 3.*'t'|shard\.00000\.mds.*sample 3.*\"t\""):
        ds[3]
    with pytest.raises(shardstream.CorruptDataError, match=r"shard\.00000\.mds"):
        list(ds)

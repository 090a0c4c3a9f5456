"""LitData datasets written by litdata's own writer (`BinaryWriter`, what `optimize` uses),
streamed by shardstream where they lie: plain chunks, whole-file zstd chunks
(`compression_level="chunk"`), per-item zstd (`"sample"`) and framed zstd chunks (`"batch"`,
litdata's default for `compression="zstd"`, turned into the classic layout in the cache);
through a DataLoader with 2 workers every sample equals what litdata's own `StreamingDataset`
gives for it, and a state_dict taken mid-epoch resumes exactly. The same from an S3 server.
Last, MDS + WebDataset + LitData streams mixed in one dataset, each sample decoded by its own
stream's schema."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardstream

litdata = pytest.importorskip("litdata")

N = 29
BATCH = 4


def _item(i: int) -> dict:
    return {"i": i, "f": i / 3, "b": i % 2 == 0, "s": f"sample {i} é", "raw": bytes([i % 256]) * (i + 1),
            "arr": np.arange(i % 4, dtype=np.float32).reshape(-1, 1),
            "t": torch.arange(i % 5, dtype=torch.int64)}


def _write(out, **kw) -> str:
    from litdata.streaming.writer import BinaryWriter

    os.makedirs(out, exist_ok=True)
    w = BinaryWriter(str(out), chunk_size=6, **kw)
    for i in range(N):
        w[i] = _item(i)
    w.done()
    w.merge()
    return str(out)


def _plain(v):
    if isinstance(v, memoryview):  # litdata's bytes leaves
        return bytes(v)
    return v


def _same(a, b) -> bool:
    a, b = _plain(a), _plain(b)
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _peer(root: str) -> dict[int, dict]:
    return {s["i"]: s for s in litdata.StreamingDataset(root)}


def _epoch(ds) -> list[dict]:
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda batch: batch)
    return [s for batch in loader for s in batch]


def _check(samples: list[dict], peer: dict[int, dict]) -> None:
    assert sorted(s["i"] for s in samples) == sorted(peer), "not every sample exactly once"
    for s in samples:
        assert _same(s, peer[s["i"]]), f"{s} != litdata's {peer[s['i']]}"


def _framed(root: str) -> bool:
    first = sorted(f for f in os.listdir(root) if f.endswith(".bin"))[0]
    with open(os.path.join(root, first), "rb") as f:
        return f.read(8) == b"LDFZ01\0\0"


@pytest.mark.parametrize("kw", [{}, {"compression": "zstd", "compression_level": "chunk"},
                                {"compression": "zstd", "compression_level": "sample"},
                                {"compression": "zstd"}],
                         ids=["plain", "zstd-chunk", "zstd-sample", "zstd-batch-default"])
def test_litdata_streams_what_litdata_reads_and_resumes_exactly(kw, stream_env, tmp_path):
    root = _write(tmp_path / "lit", **kw)
    # litdata's default level for zstd writes framed chunks.
    assert _framed(root) == (kw == {"compression": "zstd"})
    # Ours first: litdata inflates whole-file zstd chunks in place when it reads them.
    ds = shardstream.StreamingDataset(local=root, shuffle=True, shuffle_seed=4, batch_size=BATCH)
    assert len(ds) == N
    straight = _epoch(ds)
    state = ds.state_dict(2 * BATCH, True)
    again = shardstream.StreamingDataset(local=root, shuffle=True, shuffle_seed=4, batch_size=BATCH)
    again.load_state_dict(state)
    rest = _epoch(again)
    assert [s["i"] for s in rest] == [s["i"] for s in straight[2 * BATCH:]]
    assert [s["i"] for s in straight] != list(range(N)), "shuffle had no effect"

    peer = _peer(root)
    _check(straight, peer)
    # And after litdata's read (which replaced `.zstd.bin` chunks by their inflated copies).
    _check(list(shardstream.StreamingDataset(local=root, batch_size=BATCH)), peer)


def test_mds_wds_and_litdata_streams_mix(stream_env, tmp_path):
    import webdataset as wds
    from streaming import MDSWriter

    lit = _write(tmp_path / "lit")
    mds = tmp_path / "mds"
    with MDSWriter(out=str(mds), columns={"id": "int", "src": "str"}, size_limit=300) as w:
        for i in range(15):
            w.write({"id": i, "src": "mds"})
    tars = tmp_path / "wds"
    tars.mkdir()
    with wds.ShardWriter(str(tars / "shard-%06d.tar"), maxcount=5, verbose=0) as w:
        for i in range(12):
            w.write({"__key__": f"k{i:03d}", "cls": i, "txt": f"t{i}"})
    streams = [shardstream.Stream(local=str(mds)), shardstream.Stream(local=str(tars)),
               shardstream.Stream(local=lit)]
    ds = shardstream.StreamingDataset(streams=streams, shuffle=True, shuffle_seed=2,
                                      batch_size=BATCH)
    assert len(ds) == 15 + 12 + N
    got = _epoch(ds)
    from_mds = [s for s in got if "src" in s]
    from_wds = [s for s in got if "__key__" in s]
    from_lit = [s for s in got if "raw" in s]
    assert len(from_mds) + len(from_wds) + len(from_lit) == len(got)
    assert sorted(s["id"] for s in from_mds) == list(range(15))
    assert sorted(s["cls"] for s in from_wds) == list(range(12))
    assert all(s["txt"] == f"t{s['cls']}" for s in from_wds)
    _check(from_lit, _peer(lit))


@pytest.mark.parametrize("level", ["chunk", None], ids=["zstd-chunk", "zstd-batch-default"])
def test_litdata_on_the_s3_server(level, stream_env, moto, monkeypatch, tmp_path):
    import boto3

    kw = {"compression_level": level} if level else {}
    root = _write(tmp_path / "lit", compression="zstd", **kw)
    files = sorted(os.listdir(root))
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto.create_bucket(f"lit-chunks-{level or 'batch'}")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in files:
        s3.upload_file(os.path.join(root, f), bucket[len("s3://"):], f"d/{f}")
    ds = shardstream.StreamingDataset(remote=f"{bucket}/d", shuffle=True, batch_size=BATCH)
    got = _epoch(ds)
    _check(got, _peer(root))

"""WebDataset tar sets written by `webdataset` itself (ShardWriter), streamed by shardstream where
they lie: through a DataLoader with 2 workers every sample equals what `webdataset`'s own
`WebDataset(...).decode()` gives for it (the member dict, `__key__` and `__url__`); a
state_dict taken mid-epoch resumes exactly; `.tar.gz` shards, a folder of tars and tars on the
S3 server stream alike; an MDS stream and a WebDataset stream mix, each sample decoded by its
own stream's schema."""

from __future__ import annotations

import gzip
import os
import shutil

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardstream

wds = pytest.importorskip("webdataset")

N = 37
BATCH = 4
PER_TAR = 10
TARS = (N + PER_TAR - 1) // PER_TAR


def _write(root, n: int = N) -> str:
    """Tars `shard-000000.tar`... in `root`, written by webdataset; returns their brace pattern."""
    os.makedirs(root, exist_ok=True)
    with wds.ShardWriter(os.path.join(root, "shard-%06d.tar"), maxcount=PER_TAR, verbose=0) as w:
        for i in range(n):
            w.write({
                "__key__": f"s{i:05d}",
                "cls": i % 7,
                "txt": f"sample {i} é",
                "json": {"i": i, "tags": ["a", "b"][: i % 3]},
                "npy": np.arange(i % 5, dtype=np.int16),
                "jpg": bytes([i % 256]) * (i + 1),
                "seg.png": b"png-ish" + bytes([i % 256]),
                # A member webdataset inflates before decoding, keeping the field's name.
                "meta.txt.gz": f"gz {i}",  # the writer gzips it
            })
    return os.path.join(root, "shard-{%06d..%06d}.tar" % (0, TARS - 1))


def _peer(pattern: str) -> dict[str, dict]:
    got = {}
    for s in wds.WebDataset(pattern, shardshuffle=False).decode():
        s.pop("__local_path__", None)  # webdataset's cache bookkeeping, not the sample's data
        got[s["__key__"]] = s
    return got


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _loader(ds) -> DataLoader:
    return DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork",
                      collate_fn=lambda batch: batch)


def _epoch(ds) -> list[dict]:
    return [s for batch in _loader(ds) for s in batch]


def _check(samples: list[dict], peer: dict[str, dict]) -> None:
    keys = [s["__key__"] for s in samples]
    assert sorted(keys) == sorted(peer), "not every sample exactly once"
    for s in samples:
        want = peer[s["__key__"]]
        assert _same(s, want), f"{s['__key__']}: {s} != webdataset's {want}"


@pytest.fixture(scope="module")
def tars(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds") / "tars"
    pattern = _write(str(root))
    return root, pattern, _peer(pattern)


def test_pattern_streams_what_webdataset_reads_and_resumes_exactly(tars, stream_env):
    _root, pattern, peer = tars
    ds = shardstream.StreamingDataset(remote=pattern, shuffle=True, shuffle_seed=3,
                                      batch_size=BATCH)
    assert len(ds) == N and ds.num_shards == TARS
    straight = _epoch(ds)
    _check(straight, peer)
    assert [s["__key__"] for s in straight] != sorted(peer), "shuffle had no effect"

    # Mid-epoch: the whole job consumed 3 batches (12 samples).
    state = ds.state_dict(3 * BATCH, True)
    again = shardstream.StreamingDataset(remote=pattern, shuffle=True, shuffle_seed=3,
                                         batch_size=BATCH)
    again.load_state_dict(state)
    rest = _epoch(again)
    assert [s["__key__"] for s in rest] == [s["__key__"] for s in straight[3 * BATCH:]]
    _check(straight[: 3 * BATCH] + rest, peer)


def test_random_access_and_a_folder_of_tars(tars, stream_env):
    root, _pattern, peer = tars
    ds = shardstream.StreamingDataset(local=str(root), batch_size=BATCH)
    assert len(ds) == N
    assert _same(ds[12], peer["s00012"])
    _check(list(ds), peer)


def test_gzipped_tars_stream_alike(tars, stream_env, tmp_path):
    root, _pattern, peer = tars
    gz = tmp_path / "gz"
    gz.mkdir()
    for f in sorted(os.listdir(root)):
        with open(root / f, "rb") as src, gzip.open(gz / (f + ".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    pattern = str(gz / ("shard-{%06d..%06d}.tar.gz" % (0, TARS - 1)))
    gz_peer = _peer(pattern)
    ds = shardstream.StreamingDataset(remote=pattern, shuffle=True, batch_size=BATCH)
    _check(_epoch(ds), gz_peer)
    # The same samples as the plain tars, but for the shard each came from.
    assert gz_peer.keys() == peer.keys()
    assert all(_same({**gz_peer[k], "__url__": ""}, {**peer[k], "__url__": ""}) for k in peer)


def test_pickles_need_the_unsafe_opt_in(stream_env, tmp_path):
    with wds.TarWriter(str(tmp_path / "p.tar")) as w:
        w.write({"__key__": "k", "pyd": {"a": 1}})
    with pytest.raises(Exception, match="allow_unsafe_types"):
        shardstream.StreamingDataset(local=str(tmp_path))[0]
    ds = shardstream.StreamingDataset(local=str(tmp_path), allow_unsafe_types=True)
    assert ds[0]["pyd"] == {"a": 1}


def test_mds_and_wds_streams_mix(tars, stream_env, tmp_path):
    from streaming import MDSWriter

    root, _pattern, peer = tars
    mds = tmp_path / "mds"
    with MDSWriter(out=str(mds), columns={"id": "int", "src": "str"}, size_limit=300) as w:
        for i in range(20):
            w.write({"id": i, "src": "mds"})
    streams = [shardstream.Stream(local=str(mds)), shardstream.Stream(local=str(root))]
    ds = shardstream.StreamingDataset(streams=streams, shuffle=True, shuffle_seed=1,
                                      batch_size=BATCH)
    assert len(ds) == 20 + N
    got = _epoch(ds)
    from_mds = [s for s in got if "src" in s]
    assert sorted(s["id"] for s in from_mds) == list(range(20))
    assert all(set(s) == {"id", "src"} for s in from_mds)
    _check([s for s in got if "__key__" in s], peer)


def test_tars_on_the_s3_server(tars, stream_env, moto, monkeypatch):
    import boto3

    root, _pattern, peer = tars
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto.create_bucket("wds-tars")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in sorted(os.listdir(root)):
        s3.upload_file(str(root / f), bucket[len("s3://"):], f"t/{f}")
    pattern = f"{bucket}/t/shard-{{000000..{TARS - 1:06d}}}.tar"
    ds = shardstream.StreamingDataset(remote=pattern, shuffle=True, batch_size=BATCH)
    got = _epoch(ds)
    # webdataset names a sample's tar by the URL it was given.
    _check(got, {k: {**v, "__url__": f"{bucket}/t/{os.path.basename(v['__url__'])}"}
                 for k, v in peer.items()})

"""Mosaic parity beyond iteration: the attributes and methods mosaicml-streaming's users touch
(`shards`, `streams`, `cache_limit`, `cache_usage`, `next_epoch`, `prepare_shard`,
`evict_shard`, `evict_coldest_shard`, `resample_streams`), compared with the real
mosaicml-streaming on the same MDSWriter-written data; the cache methods against the real moto
S3 server (they must fetch into and delete from the node's cache); Mosaic's own
`StreamingDataLoader` saving and loading a shardstream dataset's state; and a Mosaic state
refused mid-epoch (shardstream's order is not py1e) but resumed at an epoch boundary."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

import shardstream

N = 120
BATCH = 4


def _write(out, n: int = N, src: str = "a", compression: str | None = None) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "src": "str", "pad": "bytes"},
                   size_limit=1200, compression=compression) as w:
        for i in range(n):
            w.write({"id": i, "src": src, "pad": bytes(20)})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mosaic-parity")
    _write(root / "a")
    _write(root / "b", n=40, src="b")
    _write(root / "z", compression="zstd")
    return root


def _mosaic(**kw):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(batch_size=BATCH, num_canonical_nodes=1, **kw)


def test_shards_have_mosaic_reader_fields(data, stream_env):
    for name in ("a", "z"):
        ours = shardstream.StreamingDataset(local=str(data / name), batch_size=BATCH)
        theirs = _mosaic(local=str(data / name))
        assert len(ours.shards) == len(theirs.shards) == ours.num_shards
        for i, (a, b) in enumerate(zip(ours.shards, theirs.shards)):
            assert a.index == i
            assert (a.samples, a.size, len(a)) == (b.samples, b.size, len(b))
            assert a.compression == b.compression
            assert a.raw_data.basename == b.raw_data.basename
            assert a.raw_data.bytes == b.raw_data.bytes
            assert (a.zip_data is None) == (b.zip_data is None)
            if b.zip_data is not None:
                assert (a.zip_data.basename, a.zip_data.bytes) == (b.zip_data.basename, b.zip_data.bytes)
            assert a.get_raw_size() == b.get_raw_size()
            assert a.get_zip_size() == b.get_zip_size()
            assert a.get_max_size() == b.get_max_size()
            assert sorted(a.column_names) == sorted(b.column_names)
            assert dict(zip(a.column_names, a.column_encodings)) == dict(zip(b.column_names, b.column_encodings))
        assert sum(s.samples for s in ours.shards) == ours.size == theirs.size


def test_streams_is_a_list_as_in_mosaic(data, stream_env):
    ours = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH)
    theirs = _mosaic(local=str(data / "a"))
    assert isinstance(theirs.streams, list) and len(theirs.streams) == 1
    assert isinstance(ours.streams, list) and len(ours.streams) == 1
    assert ours.streams[0].local == str(data / "a") and ours.streams[0].remote is None
    assert ours.num_streams == theirs.num_streams == 1

    mix = [shardstream.Stream(local=str(data / "a"), repeat=0.5), shardstream.Stream(local=str(data / "b"))]
    ds = shardstream.StreamingDataset(streams=mix, batch_size=BATCH)
    assert ds.streams == mix
    assert [s.stream for s in ds.shards] == list(ds.stream_per_shard)


def test_len_size_epoch_size_and_layout_as_mosaic(data, stream_env):
    from streaming import Stream

    kw = dict(shuffle=True, shuffle_seed=3)
    ours = shardstream.StreamingDataset(
        streams=[shardstream.Stream(local=str(data / "a"), repeat=1.5), shardstream.Stream(local=str(data / "b"))],
        batch_size=BATCH, **kw)
    theirs = _mosaic(streams=[Stream(local=str(data / "a"), repeat=1.5), Stream(local=str(data / "b"))], **kw)
    assert (ours.size, ours.num_samples, ours.epoch_size) == (theirs.size, theirs.num_samples, theirs.epoch_size)
    assert len(ours) == len(theirs)
    for name in ("samples_per_shard", "sample_offset_per_shard", "shards_per_stream",
                 "shard_offset_per_stream", "sample_offset_per_stream", "stream_per_shard"):
        assert np.array_equal(getattr(ours, name), getattr(theirs, name)), name


def test_resample_streams_has_mosaic_shape(data, stream_env):
    """Mosaic's shape and totals per stream; how a partial pass is spread over the shards and
    which samples fill it is each library's own draw (ours: in proportion to the shards' sizes),
    and ours is exactly what the epoch streams."""
    from streaming import Stream

    ours = shardstream.StreamingDataset(
        streams=[shardstream.Stream(local=str(data / "a"), repeat=1.5), shardstream.Stream(local=str(data / "b"))],
        batch_size=BATCH, shuffle=True, shuffle_seed=3)
    theirs = _mosaic(streams=[Stream(local=str(data / "a"), repeat=1.5), Stream(local=str(data / "b"))],
                     shuffle=True, shuffle_seed=3)
    for stream_id in (None, 0, 1):
        u_ours, ids_ours = ours.resample_streams(2, stream_id)
        u_theirs, ids_theirs = theirs.resample_streams(2, stream_id)
        assert ids_ours.dtype == u_ours.dtype == np.int64
        assert len(ids_ours) == len(ids_theirs) == u_ours.sum() == u_theirs.sum()
        if stream_id == 1:  # every sample once: one whole pass per shard in both
            assert u_ours.tolist() == u_theirs.tolist()
            assert ids_ours.tolist() == ids_theirs.tolist()
    # What the epoch streams is exactly what resample_streams says.
    ours.set_epoch(2)
    streamed = Counter()
    offsets = {"a": 0, "b": N}
    for s in ours:
        streamed[offsets[s["src"]] + int(s["id"])] += 1
    _, ids = ours.resample_streams(2)
    assert streamed == Counter(ids.tolist())


def test_next_epoch_follows_iterations_and_sets_the_epoch(data, stream_env):
    ds = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH, shuffle=True)
    theirs = _mosaic(local=str(data / "a"), shuffle=True)
    assert ds.next_epoch == theirs.next_epoch == 0
    first = [int(s["id"]) for s in ds]
    for _ in theirs:
        pass
    assert ds.next_epoch == theirs.next_epoch == 1
    for s in ds:  # left after one sample: the epoch was started
        break
    assert ds.next_epoch == 2
    ds.next_epoch = 0
    assert ds.next_epoch == 0 and ds.epoch == 0
    assert [int(s["id"]) for s in ds] == first


def test_cache_limit_is_the_given_bytes(data, stream_env):
    assert shardstream.StreamingDataset(local=str(data / "a")).cache_limit is None
    assert shardstream.StreamingDataset(local=str(data / "a"), cache_limit="1mb").cache_limit == 1 << 20
    assert _mosaic(local=str(data / "a"), cache_limit="1mb").cache_limit == 1 << 20


@pytest.fixture()
def remote_ds(data, moto, stream_env, monkeypatch, tmp_path):
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    url = moto.upload_dataset(data / "a", f"parity-{os.getpid()}-{tmp_path.name[-12:].lower().replace('_', '-')}")
    return url


def _cached_files(ds) -> list[str]:
    data_dir = os.path.join(ds.cache_dir, "data")
    return os.listdir(data_dir) if os.path.isdir(data_dir) else []


def test_prepare_and_evict_act_on_the_node_cache(remote_ds, tmp_path):
    ds = shardstream.StreamingDataset(remote=remote_ds, local=str(tmp_path / "cache"), batch_size=BATCH,
                                      prefetch_on_init=False)
    assert ds.cache_usage == 0 and _cached_files(ds) == []
    sizes = [s.get_raw_size() for s in ds.shards]

    ds.prepare_shard(0)
    assert ds.cache_usage == sizes[0]
    fetched = ds.metrics()["shards_fetched"]
    ds.prepare_shard(0)  # cached: nothing fetched again
    assert ds.metrics()["shards_fetched"] == fetched

    ds.prepare_shard(2, blocking=False)
    ds.prepare_shard(1)
    for p in ds._preparing or []:
        assert p.wait(30)
    assert ds.cache_usage == sizes[0] + sizes[1] + sizes[2]
    assert len(_cached_files(ds)) == 3

    ds.evict_shard(1)
    assert ds.cache_usage == sizes[0] + sizes[2]
    ds.evict_shard(1)  # not cached: nothing to do
    # The coldest: shard 0 (prepared first), then shard 2.
    os.utime(os.path.join(ds.cache_dir, "data", sorted(_cached_files(ds))[0]))  # touch one
    ds.evict_coldest_shard()
    ds.evict_coldest_shard()
    assert ds.cache_usage == 0
    with pytest.raises(ValueError, match="no shards present"):
        ds.evict_coldest_shard()
    with pytest.raises(IndexError):
        ds.prepare_shard(ds.num_shards)

    # Every sample is still there: evicted shards are fetched again.
    assert sorted(int(s["id"]) for s in ds) == list(range(N))


def test_a_shard_in_use_is_not_evicted(remote_ds, tmp_path):
    """Another dataset object on the same cache folder (another rank of the node, say) holds
    shard 0 open for random access: it is not deleted under it."""
    kw = dict(remote=remote_ds, local=str(tmp_path / "cache"), batch_size=BATCH, prefetch_on_init=False)
    ds, other = shardstream.StreamingDataset(**kw), shardstream.StreamingDataset(**kw)
    ds.prepare_shard(0)
    assert int(other[0]["id"]) == 0  # opens the cached shard 0 and keeps it open, pinned
    with pytest.raises(RuntimeError, match="in use"):
        ds.evict_shard(0)
    assert ds.cache_usage == ds.shards[0].get_raw_size()
    other.evict_shard(0)  # its own kept shard is let go first
    assert ds.cache_usage == 0


def test_mosaic_streaming_dataloader_saves_and_loads_our_state(data, stream_env):
    from streaming import StreamingDataLoader

    ds = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH, shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)
    seen = []
    for i, batch in enumerate(loader):
        seen += batch["id"].tolist()
        if i == 4:
            break
    state = loader.state_dict()
    assert state is not None and state["sample_in_epoch"] == 5 * BATCH and "shardstream" in state

    ds2 = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH, shuffle=True)
    loader2 = StreamingDataLoader(ds2, batch_size=BATCH, num_workers=0)
    loader2.load_state_dict(state)
    rest = [i for batch in loader2 for i in batch["id"].tolist()]
    assert sorted(seen + rest) == list(range(N))


def test_a_mosaic_state_mid_epoch_is_refused(data, stream_env):
    theirs = _mosaic(local=str(data / "a"), shuffle=True)
    mosaic_state = theirs.state_dict(num_samples=20, from_beginning=True)
    assert set(mosaic_state) == {"epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed",
                                 "initial_physical_nodes"}
    ds = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH, shuffle=True)
    before = [int(s["id"]) for s in ds]
    ds.set_epoch(0)
    with pytest.raises(ValueError, match="py1e") as e:
        ds.load_state_dict(mosaic_state)
    assert "set_epoch(0)" in str(e.value) and "set_epoch(1)" in str(e.value)
    # Nothing changed: the next iteration is the epoch chosen before.
    assert [int(s["id"]) for s in ds] == before


def test_a_mosaic_state_at_an_epoch_boundary_resumes(data, stream_env):
    theirs = _mosaic(local=str(data / "a"), shuffle=True)
    ds = shardstream.StreamingDataset(local=str(data / "a"), batch_size=BATCH, shuffle=True)
    start = theirs.state_dict(num_samples=0, from_beginning=True) | {"epoch": 3}
    ds.load_state_dict(start)
    assert ds.next_epoch == 3
    assert sorted(int(s["id"]) for s in ds) == list(range(N))
    done = start | {"sample_in_epoch": N}
    ds.load_state_dict(done)
    assert ds.next_epoch == 4

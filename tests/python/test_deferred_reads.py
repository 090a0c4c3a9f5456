"""Large samples read on the consumer's thread: when the Python thread runs out of samples it
asks the reader thread to leave the next large one (512 KiB or more) unread and reads it itself,
with the GIL released, so that the two threads share the reading. Whichever thread reads a
sample, every path must yield exactly the samples the stream would have read itself: `bytes`,
`zero_copy=True`, `iter_batches`, shuffled, resumed from a mid-epoch state and under DataLoader
workers, from a Mosaic-written dataset read in place and cold from a real moto S3 server."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import pad_bytes, write_ids

N = 30
EXTRA = 600_000  # bytes of the `pad` column: above the 512 KiB the Python thread reads itself


def pad_of(i: int) -> bytes:
    return pad_bytes(i, EXTRA)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    root = tmp_path_factory.mktemp("deferred") / "mds"
    write_ids(root, N, size_limit=2_000_000, extra=EXTRA)  # three samples a shard
    return root


def check(samples) -> list[int]:
    ids = [s["id"] for s in samples]
    for s in samples:
        assert s["x"] == 3 * s["id"]
        assert bytes(s["pad"]) == pad_of(s["id"]), s["id"]
    return ids


@pytest.mark.parametrize("zero_copy", [False, True])
def test_consumer_reads_some_samples_itself_and_gets_the_same_samples(large, stream_env, zero_copy):
    ds = shardstream.StreamingDataset(local=str(large), zero_copy=zero_copy)
    ids = check(list(ds))
    assert ids == list(range(N))
    m = ds.metrics()
    # `list(ds)` does nothing between samples, so it waits for the reader thread and asks for
    # samples to read; each such read is counted once among the stream's reads.
    assert 0 < m["deferred_reads"] <= m["sample_reads"], m
    assert m["samples"] == N


def test_shuffled_epochs_and_column_batches(large, stream_env):
    ds = shardstream.StreamingDataset(local=str(large), shuffle=True, shuffle_seed=3, batch_size=4)
    first = check(list(ds))
    assert sorted(first) == list(range(N)) and first != list(range(N))
    ids: list[int] = []
    for batch in ds.iter_batches(4):
        got = [int(i) for i in batch["id"]]
        assert batch["pad"].tolist() == [pad_of(i) for i in got]
        assert [int(v) for v in batch["x"]] == [3 * i for i in got]
        ids += got
    assert sorted(ids) == list(range(N))
    assert ds.metrics()["deferred_reads"] > 0


def test_mid_epoch_state_resumes_exactly(large, stream_env):
    ds = shardstream.StreamingDataset(local=str(large), shuffle=True, shuffle_seed=9)
    full = check(list(ds))
    ds = shardstream.StreamingDataset(local=str(large), shuffle=True, shuffle_seed=9)
    it = iter(ds)
    head = [next(it)["id"] for _ in range(11)]
    state = ds.state_dict(11, from_beginning=False)
    del it
    resumed = shardstream.StreamingDataset(local=str(large), shuffle=True, shuffle_seed=9)
    resumed.load_state_dict(state)
    assert head + check(list(resumed)) == full


@pytest.mark.parametrize("zero_copy", [False, True])
def test_dataloader_workers_see_every_sample_once(large, stream_env, zero_copy):
    ds = shardstream.StreamingDataset(local=str(large), zero_copy=zero_copy, batch_size=2)
    loader = DataLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda b: b)
    ids = [i for batch in loader for i in check(batch)]
    assert sorted(ids) == list(range(N))


def test_cold_from_s3_while_shards_arrive(large, moto, stream_env, monkeypatch):
    remote = moto.upload_dataset(large, "deferred")
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    ds = shardstream.StreamingDataset(remote=remote, shuffle=True, shuffle_seed=1)
    ids = check(list(ds))
    assert sorted(ids) == list(range(N))
    m = ds.metrics()
    assert m["fetch_bytes"] > 0 and m["deferred_reads"] > 0, m

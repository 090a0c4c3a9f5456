"""`StreamingDataset` through a real torch DataLoader with 0, 2 and 4 workers under `fork` and
`spawn`: every sample exactly once per epoch, two shuffled epochs differ and are each complete,
and the sequence a process consumes is the same whatever the number of workers (the global
order does not depend on the world)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import shardstream
from conftest import write_ids

N = 203  # not a multiple of the batch size: the last batch is short
BATCH = 8


@pytest.fixture(scope="module")
def ids_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("ids") / "mds"
    write_ids(root, N, size_limit=600)  # ~20 samples per shard, ~10 shards
    return root


def _epoch(ds, workers: int, ctx: str | None) -> list[int]:
    loader = DataLoader(
        ds,
        batch_size=BATCH,
        num_workers=workers,
        multiprocessing_context=ctx if workers else None,
    )
    out: list[int] = []
    for batch in loader:
        assert torch.equal(batch["x"].to(torch.int64), batch["id"] * 3)
        out.extend(batch["id"].tolist())
    return out


@pytest.mark.parametrize("workers,ctx", [(0, None), (2, "fork"), (4, "fork"), (2, "spawn"), (4, "spawn")])
def test_each_sample_once_per_epoch(ids_dataset, stream_env, workers, ctx):
    ds = shardstream.StreamingDataset(
        local=str(ids_dataset), shuffle=True, shuffle_seed=17, batch_size=BATCH, shuffle_window=3
    )
    assert len(ds) == N
    ds.set_epoch(0)
    first = _epoch(ds, workers, ctx)
    ds.set_epoch(1)
    second = _epoch(ds, workers, ctx)
    assert sorted(first) == list(range(N)), "epoch 0 is not every sample exactly once"
    assert sorted(second) == list(range(N)), "epoch 1 is not every sample exactly once"
    assert first != second, "two shuffled epochs gave the same order"
    assert first != list(range(N)), "shuffle=True gave the dataset order"
    # The same sequence as a plain single-process iteration of the same epoch.
    ref = shardstream.StreamingDataset(
        local=str(ids_dataset), shuffle=True, shuffle_seed=17, batch_size=BATCH, shuffle_window=3
    )
    ref.set_epoch(1)
    assert second == [s["id"] for s in ref]


def test_unshuffled_is_dataset_order_and_epochs_advance(ids_dataset, stream_env):
    ds = shardstream.StreamingDataset(local=str(ids_dataset))
    assert [s["id"] for s in ds] == list(range(N))
    assert ds.epoch == 1  # a finished single-process iteration moves to the next epoch


def test_shuffled_epoch_reads_each_small_shard_whole_once(ids_dataset, stream_env):
    """A shuffled epoch over small shards reads each shard with one `pread` (counted by
    `metrics()["sample_reads"]`) after its first batch (read sample by sample), not one per
    sample, and still yields every sample once with its own bytes."""
    shards = len(list(ids_dataset.glob("*.mds")))
    ds = shardstream.StreamingDataset(local=str(ids_dataset), shuffle=True, shuffle_seed=5, batch_size=BATCH)
    samples = list(ds)
    assert sorted(s["id"] for s in samples) == list(range(N))
    assert all(int(s["x"]) == 3 * s["id"] for s in samples)
    reads = ds.metrics()["sample_reads"]
    assert 0 < reads <= shards + BATCH < N, f"{reads} reads for {shards} shards of {N} samples"

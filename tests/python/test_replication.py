"""Mosaic's `replication`: each `replication` consecutive ranks (a tensor- or sequence-parallel
group) see the same samples, and the epoch is split over the groups as it would be over a world of
`world // replication` ranks. Ranks are simulated with torchrun's environment, one at a time
(`tests/python/test_torchrun.py` runs the real launcher)."""

from __future__ import annotations

import pytest

import shardstream
from conftest import write_ids

N, BATCH = 101, 4


@pytest.fixture()
def root(tmp_path, stream_env):
    out = tmp_path / "mds"
    write_ids(out, N, size_limit=256)
    return out


def _rank_env(monkeypatch, rank: int, world: int) -> None:
    for k, v in (("RANK", rank), ("WORLD_SIZE", world), ("LOCAL_RANK", rank), ("LOCAL_WORLD_SIZE", world)):
        monkeypatch.setenv(k, str(v))


def _epoch(root, monkeypatch, rank, world, workers=0, **kw):
    from torch.utils.data import DataLoader

    _rank_env(monkeypatch, rank, world)
    ds = shardstream.StreamingDataset(local=str(root), batch_size=BATCH, shuffle=True, shuffle_seed=9, **kw)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    return len(ds), [int(i) for b in loader for i in b["id"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_group_sees_the_same_samples_and_groups_split_the_epoch(root, monkeypatch, workers):
    ranks = [_epoch(root, monkeypatch, r, 4, workers, replication=2) for r in range(4)]
    groups = [_epoch(root, monkeypatch, g, 2, workers) for g in range(2)]
    assert [n for n, _ in ranks] == [-(-N // 2)] * 4
    assert ranks[0][1] == ranks[1][1] == groups[0][1]
    assert ranks[2][1] == ranks[3][1] == groups[1][1]
    seen = ranks[0][1] + ranks[2][1]
    assert set(seen) == set(range(N)) and len(seen) == 2 * -(-N // 2), "complete, padded as a world of 2"


def test_replication_is_checked_and_counted_once_in_the_loaders_state(root, monkeypatch):
    from shardstream import StreamingDataLoader

    _rank_env(monkeypatch, 1, 4)
    with pytest.raises(ValueError, match="replication=3"):
        shardstream.StreamingDataset(local=str(root), batch_size=BATCH, replication=3)
    ds = shardstream.StreamingDataset(local=str(root), batch_size=BATCH, replication=2)
    loader = StreamingDataLoader(ds, batch_size=BATCH)
    it = iter(loader)
    for _ in range(3):
        next(it)
    # 3 batches on each of 2 groups (the group's 2 ranks yield the same ones).
    assert loader.state_dict()["sample_in_epoch"] == 2 * 3 * BATCH

"""Prefetch at construction (docs/python.md, "Prefetch at construction"), against the real moto
server: a `StreamingDataset` starts downloading the first shards of this process's part of the
next epoch as soon as it is built, without being iterated; `set_epoch` and `load_state_dict`
move it to the epoch and position the next iteration starts at; DataLoader workers forked or
spawned while it runs stream a complete epoch from what it downloaded; `prefetch_on_init=False`
downloads nothing until the first iteration."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import pad_bytes, write_ids

N = 400
EXTRA = 600
BATCH = 8
WINDOW = 4


@pytest.fixture()
def remote(tmp_path, moto, stream_env, monkeypatch):
    data = tmp_path / "mds"
    write_ids(data, N, size_limit=8 << 10, extra=EXTRA)  # about 40 shards of 10 samples
    remote = moto.upload_dataset(data, f"prefetch-{tmp_path.name}".lower().replace("_", "-")[:60])
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    return remote


def open_dataset(remote: str, **kw) -> shardstream.StreamingDataset:
    return shardstream.StreamingDataset(remote=remote, shuffle=True, shuffle_seed=7, batch_size=BATCH,
                                        shuffle_window=WINDOW, **kw)


def cached_shards(ds: shardstream.StreamingDataset) -> int:
    data = Path(ds.cache_dir) / "data"
    return len(list(data.iterdir())) if data.is_dir() else 0


def shard_of(ds: shardstream.StreamingDataset) -> list[int]:
    """Sample id -> shard, from the index's sample counts."""
    out: list[int] = []
    for shard, n in enumerate(ds._native().shard_sizes()):
        out.extend([shard] * n)
    return out


def first_shards(ds: shardstream.StreamingDataset, ids: list[int], k: int) -> list[int]:
    owner, seen = shard_of(ds), []
    for i in ids:
        if owner[i] not in seen:
            seen.append(owner[i])
    return seen[:k]


def test_a_new_dataset_downloads_its_first_window_before_any_iteration(remote):
    ds = open_dataset(remote)
    prefetch = ds._prefetch
    assert prefetch is not None
    assert prefetch.wait(timeout=60)
    report = prefetch.report()
    assert report == {"planned": WINDOW, "ready": WINDOW, "failed": 0}, report
    assert cached_shards(ds) == WINDOW
    assert ds.metrics()["samples"] == 0

    # They are the shards the epoch reads first (one process, no workers: the whole order).
    ids = [int(s["id"]) for s in ds]
    assert sorted(ids) == list(range(N))
    # The order's first blocks hold 1, 2, then 4 shards (the ramp): the first block's shard
    # comes first, then the second block's two, then some of the third, whose shards are all
    # needed from its start on (its samples are shuffled together).
    assert prefetch.shards[0] == first_shards(ds, ids, 1)[0]
    assert set(first_shards(ds, ids, 3)) <= set(prefetch.shards) <= set(first_shards(ds, ids, 7))


def saved_at_200_of_epoch_5(remote):
    """A state shardstream saved 200 samples into epoch 5 (a hand-written dict of Mosaic's keys
    alone would be a Mosaic state, which is refused mid-epoch)."""
    ds = open_dataset(remote)
    ds.set_epoch(5)
    return ds.state_dict(200, True)


def test_set_epoch_and_load_state_dict_move_the_prefetch_to_where_the_next_iteration_starts(remote):
    ds = open_dataset(remote)
    assert ds._prefetch.wait(timeout=60)
    ds.set_epoch(3)
    assert ds._prefetch.wait(timeout=60)
    epoch3 = ds._prefetch.shards
    ids = [int(s["id"]) for s in ds]
    assert epoch3[0] == first_shards(ds, ids, 1)[0]
    assert set(first_shards(ds, ids, 3)) <= set(epoch3) <= set(first_shards(ds, ids, 7))
    assert ds._prefetch is None, "the iteration took over from the prefetch"

    # A state saved 200 samples into epoch 5: the prefetch starts at sample 200 of that epoch.
    ds5 = open_dataset(remote, prefetch_on_init=False)
    ds5.set_epoch(5)
    order5 = [int(s["id"]) for s in ds5]
    resumed = open_dataset(remote)
    resumed.load_state_dict(saved_at_200_of_epoch_5(remote))
    assert resumed._prefetch.wait(timeout=60)
    rest = [int(s["id"]) for s in resumed]
    assert rest == order5[200:]
    assert resumed._prefetch is None
    # The moved prefetch holds the shards the resumed iteration reads first: those of the
    # block position 200 falls in (read in shuffled order), then the next block's.
    again = open_dataset(remote)
    again.load_state_dict(saved_at_200_of_epoch_5(remote))
    moved = again._prefetch.shards
    assert len(moved) == WINDOW
    assert first_shards(again, rest, 1)[0] in moved
    assert set(moved) <= set(first_shards(again, rest, 2 * WINDOW))
    only_consumed = set(first_shards(again, order5[:200], 40)) - set(first_shards(again, rest, 40))
    assert not set(moved) & only_consumed, "a shard only the consumed samples come from was prefetched"


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_stream_a_complete_epoch_while_the_prefetch_runs(remote, context):
    ds = open_dataset(remote, memory_limit="16MiB")
    # No wait: the workers start while the main process is still downloading.
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context=context)
    ids, pads = [], 0
    for batch in loader:
        for i, pad in zip(batch["id"].tolist(), batch["pad"]):
            ids.append(i)
            pads += pad == pad_bytes(i, EXTRA)
    assert sorted(ids) == list(range(N))
    assert pads == N
    # The main process downloaded its window; the workers fetched the rest, each shard once.
    assert ds._prefetch.wait(timeout=60)
    report = ds._prefetch.report()
    assert report["failed"] == 0 and report["ready"] == WINDOW, report
    assert cached_shards(ds) == len(ds._native().shard_sizes())
    ds.set_epoch(1)
    ids = sorted(i for batch in loader for i in batch["id"].tolist())
    assert ids == list(range(N))


def test_prefetch_on_init_false_downloads_nothing_until_the_first_iteration(remote, tmp_path):
    ds = open_dataset(remote, prefetch_on_init=False, local=str(tmp_path / "off"))
    assert ds._prefetch is None
    # A dataset built just after it, with the prefetch, finishes its whole window in the
    # meantime; the first one's own folder stays empty.
    other = open_dataset(remote, local=str(tmp_path / "on"))
    assert other._prefetch.wait(timeout=60)
    assert cached_shards(other) == WINDOW
    assert cached_shards(ds) == 0
    ds.set_epoch(2)  # does not start one either
    assert ds._prefetch is None
    assert sorted(int(s["id"]) for s in ds) == list(range(N))
    assert cached_shards(ds) == len(ds._native().shard_sizes())

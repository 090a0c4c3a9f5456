"""`shardstream.StreamingDataLoader`, mosaicml-streaming's loader for shardstream datasets: a script
that imports both names from `shardstream` instead of `streaming` checkpoints and resumes as before.
Mosaic's own loader saves `None` for any dataset but Mosaic's class (checked here, so that the docs'
advice stays true)."""

from __future__ import annotations

import pytest

import shardstream
from conftest import write_ids

N, BATCH = 200, 4


@pytest.fixture()
def ds_factory(tmp_path, stream_env):
    root = tmp_path / "mds"
    write_ids(root, N, size_limit=256)

    def make(**kw):
        return shardstream.StreamingDataset(local=str(root), batch_size=BATCH, shuffle=True, shuffle_seed=3, **kw)

    return make


def _ids(batch) -> list[int]:
    return [int(i) for i in batch["id"]]


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_resumes_a_new_loader_exactly(ds_factory, workers):
    from shardstream import StreamingDataLoader

    kw = dict(batch_size=BATCH, num_workers=workers, multiprocessing_context="fork" if workers else None)
    full = [i for b in StreamingDataLoader(ds_factory(), **kw) for i in _ids(b)]
    assert sorted(full) == list(range(N))
    loader = StreamingDataLoader(ds_factory(), **kw)
    head = []
    for n, batch in enumerate(loader):
        head += _ids(batch)
        if n == 9:
            break
    state = loader.state_dict()
    assert loader.num_samples_yielded == 10 * BATCH
    assert state["epoch"] == 0 and state["sample_in_epoch"] == 10 * BATCH
    resumed = StreamingDataLoader(ds_factory(), **kw)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in _ids(b)] == full


def test_iter_batches_through_the_loader(ds_factory):
    from shardstream import StreamingDataLoader

    full = [i for b in StreamingDataLoader(ds_factory().iter_batches(BATCH), batch_size=None) for i in _ids(b)]
    loader = StreamingDataLoader(ds_factory().iter_batches(BATCH), batch_size=None)
    it = iter(loader)
    head = [i for _ in range(5) for i in _ids(next(it))]
    state = loader.state_dict()
    assert state["sample_in_epoch"] == 5 * BATCH
    resumed = StreamingDataLoader(ds_factory().iter_batches(BATCH), batch_size=None)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in _ids(b)] == full


def test_the_count_is_the_whole_jobs(ds_factory, monkeypatch):
    """Rank 0 of 2 (from the environment, as torchrun sets it) saves twice what it yielded."""
    from shardstream import StreamingDataLoader

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = StreamingDataLoader(ds_factory(), batch_size=BATCH)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert loader.state_dict()["sample_in_epoch"] == 2 * 3 * BATCH


def test_other_datasets_save_none_and_mosaics_own_loader_saves_ours(ds_factory):
    from streaming import StreamingDataLoader as MosaicLoader
    from torch.utils.data import TensorDataset

    import torch
    from shardstream import StreamingDataLoader

    assert StreamingDataLoader(TensorDataset(torch.arange(4)), batch_size=2).state_dict() is None
    # Mosaic's own loader returned None for any dataset not Mosaic's; shardstream makes it save
    # a shardstream dataset's state (test_mosaic_parity.py resumes from it).
    state = MosaicLoader(ds_factory(), batch_size=BATCH).state_dict()
    assert state is not None and "shardstream" in state

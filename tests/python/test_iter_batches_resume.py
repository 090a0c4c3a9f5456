"""`iter_batches` keeps the dataset's epoch and resume contracts, as `__iter__` does: a
single-process iteration that runs to its end moves to the next epoch; `state_dict()` without an
argument counts the samples of the batches this process took, so a new dataset loaded with it
continues with exactly the next sample; and torchdata's StatefulDataLoader, which holds only the
`ColumnBatches` object, resumes it exactly with 0 and 2 workers."""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import shardstream
from conftest import write_ids

N = 157
BATCH = 4


def dataset(root, **kwargs) -> shardstream.StreamingDataset:
    return shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=11, shuffle_window=2, **kwargs)


def streamer_states(obj):
    """The shardstream dataset states anywhere inside a StatefulDataLoader's state."""
    if isinstance(obj, dict):
        if "shardstream" in obj:
            yield obj
        else:
            for value in obj.values():
                yield from streamer_states(value)


def ids_of(batches) -> list[list[int]]:
    return [b["id"].tolist() for b in batches]


def test_a_full_iteration_moves_to_the_next_epoch(tmp_path, stream_env):
    write_ids(tmp_path / "mds", N, size_limit=500)
    ds = dataset(tmp_path / "mds")
    first = [i for b in ids_of(ds.iter_batches(BATCH)) for i in b]
    assert ds.epoch == 1
    second = [i for b in ids_of(ds.iter_batches(BATCH)) for i in b]
    assert ds.epoch == 2
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second, "each epoch has its own shuffle"
    ds.set_epoch(1)
    assert [i for b in ids_of(ds.iter_batches(BATCH)) for i in b] == second


@pytest.mark.parametrize("stop", [1, 9, 39])
def test_state_dict_without_argument_resumes_at_the_next_sample(tmp_path, stream_env, stop):
    write_ids(tmp_path / "mds", N, size_limit=500)
    ds = dataset(tmp_path / "mds")
    it = iter(ds.iter_batches(BATCH))
    head = ids_of(next(it) for _ in range(stop))
    state = ds.state_dict()
    assert state["sample_in_epoch"] == stop * BATCH
    straight = head + ids_of(it)
    assert sorted(i for b in straight for i in b) == list(range(N))

    again = dataset(tmp_path / "mds")
    again.load_state_dict(state)
    assert head + ids_of(again.iter_batches(BATCH)) == straight


@pytest.mark.parametrize("dataset_batch", [None, BATCH])
@pytest.mark.parametrize("workers,stop", [(0, 9), (2, 9), (2, 10), (2, 38)])
def test_stateful_dataloader_resumes_iter_batches_exactly(tmp_path, stream_env, workers, stop, dataset_batch):
    """The loader asks the `ColumnBatches` object (in each worker, that worker's copy) for its
    state; the batch size that counts is `iter_batches`', whatever the dataset's `batch_size`."""
    write_ids(tmp_path / "mds", N, size_limit=500)

    def loader():
        ds = dataset(tmp_path / "mds", batch_size=dataset_batch)
        return StatefulDataLoader(ds.iter_batches(BATCH), batch_size=None, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    first = loader()
    it = iter(first)
    head = ids_of(next(it) for _ in range(stop))
    state = first.state_dict()
    # The dataset's own state is in it (without one, the loader would replay the epoch's first
    # batches and drop them): one per worker, or the main process's.
    assert len(list(streamer_states(state))) == max(workers, 1)
    straight = head + ids_of(it)
    assert sorted(i for b in straight for i in b) == list(range(N))

    second = loader()
    second.load_state_dict(state)
    assert head + ids_of(second) == straight

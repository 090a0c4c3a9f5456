"""Column batches cross from DataLoader workers through shared memory (pyo3-bindings/src/arena.rs).

In a worker, `iter_batches` lays each variable column of at least 64 KiB into a slot of the
worker's arena, and the DataLoader's queue carries the slot's address instead of its bytes. The
main process gets a `shardstream.Buffer` over the same pages. These tests check what a user
relies on: every sample arrives intact, under fork, spawn and forkserver (with `pin_memory`);
batches the training process keeps never change, however many it keeps, after the workers have
exited, and when a forked child drops its copies; slots come back when batches are dropped (a
persistent worker keeps sharing, epoch after epoch); plain `pickle` still copies; a message
unpickled twice is refused; the main process unmaps an arena with its last batch;
`SHARDSTREAM_WORKER_SHM=0` turns it off; and an address that cannot be mapped is an error that
says so."""

from __future__ import annotations

import gc
import os
import pickle

import pytest
from torch.utils.data import DataLoader, IterableDataset

import shardstream
from conftest import pad_bytes, write_ids

N = 240
EXTRA = 4000  # 32 samples a batch: 128 KB of `pad`, above the 64 KiB sharing threshold
BATCH = 32


def pad_of(i: int) -> bytes:
    return pad_bytes(i, EXTRA)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("shm") / "mds"
    write_ids(root, N, size_limit=1 << 17, extra=EXTRA)
    return root


def check_batch(batch) -> list[int]:
    got = [int(i) for i in batch["id"]]
    assert batch["pad"].tolist() == [pad_of(i) for i in got]
    assert [int(v) for v in batch["x"]] == [3 * i for i in got]
    return got


def loader(ds, ctx="fork", **kw):
    return DataLoader(ds.iter_batches(BATCH), batch_size=None, num_workers=2,
                      multiprocessing_context=ctx, **kw)


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_batches_arrive_as_shared_buffers_and_intact(wide, stream_env, ctx):
    ds = shardstream.StreamingDataset(local=str(wide), shuffle=True, shuffle_seed=3, batch_size=BATCH)
    ids, kinds = [], set()
    # pin_memory: the main process's pinning thread receives the batches (and leaves the
    # Buffers as they are).
    for batch in loader(ds, ctx, pin_memory=True):
        kinds.add(type(batch["pad"].data))
        ids.extend(check_batch(batch))
    assert sorted(ids) == list(range(N))
    assert kinds == {shardstream.Buffer}


def test_turned_off_the_batches_travel_as_bytes(wide, stream_env, monkeypatch):
    monkeypatch.setenv("SHARDSTREAM_WORKER_SHM", "0")
    ds = shardstream.StreamingDataset(local=str(wide), batch_size=BATCH)
    ids, kinds = [], set()
    for batch in loader(ds):
        kinds.add(type(batch["pad"].data))
        ids.extend(check_batch(batch))
    assert sorted(ids) == list(range(N))
    assert kinds == {bytes}


def test_kept_batches_never_change_and_outlive_the_workers(wide, stream_env):
    """The training process keeps every batch: more than a worker's arena has slots, so later
    batches fall back to `bytes`; none of the kept ones may change while the workers go on
    gathering, nor after they exit."""
    ds = shardstream.StreamingDataset(local=str(wide), shuffle=True, shuffle_seed=5, batch_size=BATCH)
    kept = []
    for batch in loader(ds):
        check_batch(batch)
        kept.append(batch)
    gc.collect()  # the loader and its workers are gone
    ids = [i for batch in kept for i in check_batch(batch)]
    assert sorted(ids) == list(range(N))
    kinds = [type(b["pad"].data) for b in kept]
    assert shardstream.Buffer in kinds


def test_dropped_batches_give_their_slots_back(wide, stream_env):
    """A persistent worker keeps one arena for all epochs: if a dropped batch did not free its
    slot, the slots would run out and later batches would come as `bytes`."""
    ds = shardstream.StreamingDataset(local=str(wide), shuffle=True, shuffle_seed=7, batch_size=BATCH)
    dl = loader(ds, persistent_workers=True)
    for epoch in range(6):
        ids = []
        for batch in dl:
            assert type(batch["pad"].data) is shardstream.Buffer, epoch
            ids.extend(check_batch(batch))
            del batch
        assert sorted(ids) == list(range(N)), epoch


class PickledInWorker(IterableDataset):
    """Pickles each batch's shared column with plain `pickle` inside the worker."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self):
        for batch in self.batches:
            data = batch["pad"].data
            again = pickle.loads(pickle.dumps(data))
            yield type(data).__name__, type(again).__name__, again == bytes(data)


def test_plain_pickle_in_a_worker_copies(wide, stream_env):
    ds = shardstream.StreamingDataset(local=str(wide), batch_size=BATCH)
    dl = DataLoader(PickledInWorker(ds.iter_batches(BATCH)), batch_size=None, num_workers=2,
                    multiprocessing_context="fork")
    seen = list(dl)
    assert seen and all(tuple(s) == ("Buffer", "bytes", True) for s in seen)


def test_an_address_that_cannot_be_mapped_is_a_clear_error():
    with pytest.raises(shardstream.ShardstreamError, match=r"/proc/\d+/fd/\d+.*SHARDSTREAM_WORKER_SHM=0"):
        shardstream._native._attach_buffer((os.getpid(), 987654, 1, 2, 0, 1, 16))


def test_a_forked_child_dropping_inherited_batches_frees_nothing(wide, stream_env):
    """The main process forks (the next epoch's workers, or anything else) while it holds
    batches: a child that drops its inherited copies must not give the parent's holds back, or
    the persistent workers would reuse the slots under the parent's kept batches."""
    ds = shardstream.StreamingDataset(local=str(wide), shuffle=True, shuffle_seed=9, batch_size=BATCH)
    dl = loader(ds, persistent_workers=True)
    kept = []
    for batch in dl:
        if type(batch["pad"].data) is shardstream.Buffer and len(kept) < 3:
            kept.append(batch)
    assert kept
    pid = os.fork()
    if pid == 0:  # the child drops every inherited batch, then leaves without cleanup
        kept.clear()
        gc.collect()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    for _ in range(3):  # the workers gather again, into whatever slots are free
        for batch in dl:
            check_batch(batch)
    for batch in kept:
        check_batch(batch)


class Payloads(IterableDataset):
    """Yields, from the worker, the very bytes a DataLoader queue would carry for each batch's
    shared column (ForkingPickler with the worker's reducer), and what they must unpickle to."""

    def __init__(self, batches) -> None:
        self.batches = batches

    def __iter__(self):
        from multiprocessing.reduction import ForkingPickler

        for batch in self.batches:
            data = batch["pad"].data
            yield bytes(ForkingPickler.dumps(data)), bytes(data)


def test_a_message_unpickled_twice_is_refused_not_released_twice(wide, stream_env):
    ds = shardstream.StreamingDataset(local=str(wide), batch_size=BATCH)
    dl = DataLoader(Payloads(ds.iter_batches(BATCH)), batch_size=None, num_workers=1,
                    multiprocessing_context="fork", persistent_workers=True)
    got = []
    for payload, expected in dl:
        first = pickle.loads(payload)
        assert type(first) is shardstream.Buffer and first == expected
        with pytest.raises(shardstream.ShardstreamError, match="already received"):
            pickle.loads(payload)
        got.append((first, expected))
    # Kept while the worker gathers the rest: none changed under a second release.
    assert got and all(buf == expected for buf, expected in got)


def _arena_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("shardstream-batches" in line for line in f)


def test_the_main_process_unmaps_an_arena_once_its_batches_are_dropped(wide, stream_env):
    ds = shardstream.StreamingDataset(local=str(wide), batch_size=BATCH)
    kept = [batch for batch in loader(ds)]
    assert _arena_mappings() >= 1  # the kept batches' arenas (the workers have exited)
    del kept
    gc.collect()
    assert _arena_mappings() == 0

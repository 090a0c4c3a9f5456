"""`StreamingDataLoader` moves `iter_batches`' batches from its workers in groups (many batches per
trip through the DataLoader's queues) and hands them out one by one. What the training loop sees
must be exactly a plain DataLoader's: the same batches (every column, variable-size values and
their offsets included), in the same order, each through `collate_fn` in a worker, with the same
resume state, also when the workers' shares are uneven, one worker has nothing, the workers are
spawned or persist across epochs."""

from __future__ import annotations

import os

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardstream
from shardstream._groups import BatchGroup, interleave

BATCH = 8


def keep(batch):
    """A module-level identity collate (spawned workers unpickle it by name)."""
    return batch


def tag_with_pid(batch):
    """A collate that records the process it ran in."""
    batch["pid"] = np.array([os.getpid()])
    return batch


def write_mixed(out, n: int) -> None:
    """Mosaic-written samples with fixed and variable-size columns (values of 0..36 bytes)."""
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "x": "uint32", "pad": "bytes", "name": "str"},
                   size_limit=1 << 11) as w:
        for i in range(n):
            w.write({"id": i, "x": np.uint32(3 * i), "pad": bytes([i % 251]) * (i % 37), "name": f"s{i}" * (i % 5)})


@pytest.fixture()
def dataset(tmp_path, stream_env):
    def make(n: int = 1003, **kw):
        root = tmp_path / f"mds-{n}"
        if not root.exists():
            write_mixed(root, n)
        return shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=5, batch_size=BATCH, **kw)

    return make


def as_plain(batch) -> tuple:
    """Every column of a batch as plain values: arrays as lists, VarColumns as their values
    and offsets (offsets start at 0 in a batch of its own)."""
    out = []
    for name in sorted(batch):
        v = batch[name]
        if isinstance(v, shardstream.VarColumn):
            out.append((name, bytes(v.data), np.asarray(v.offsets).tolist(), v.tolist()))
        elif name == "pid":
            continue
        else:
            out.append((name, np.asarray(v).tolist()))
    return tuple(out)


def column(plain: tuple, name: str) -> list:
    return next(entry[1] for entry in plain if entry[0] == name)


def loaders(make, workers: int, ctx: str = "fork", early_first_batch: bool | None = None, **kw):
    """A plain DataLoader and a grouped StreamingDataLoader over equal datasets."""
    args = dict(batch_size=None, num_workers=workers, multiprocessing_context=ctx, **kw)
    return DataLoader(make().iter_batches(BATCH), **args), shardstream.StreamingDataLoader(
        make().iter_batches(BATCH), early_first_batch=early_first_batch, **args)


@pytest.mark.parametrize("workers,ctx", [(1, "fork"), (2, "fork"), (3, "fork"), (2, "spawn")])
def test_the_same_batches_in_the_same_order(dataset, workers, ctx):
    plain, grouped = loaders(dataset, workers, ctx, collate_fn=keep)
    want = [as_plain(b) for b in plain]
    got = [as_plain(b) for b in grouped]
    assert got == want
    ids = [column(b, "id") for b in got]
    assert sorted(i for b in ids for i in b) == list(range(1003))
    # 1003 samples: 125 full batches and one of 3, over workers whose shares differ.
    assert sorted(map(len, ids)) == [3] + [BATCH] * 125


def test_the_batches_cross_in_groups(dataset):
    """The trips through the DataLoader's queues: far fewer groups than batches, and the
    first group of each worker holds one batch (the first sample is not held back)."""
    _, grouped = loaders(dataset, 2, collate_fn=keep)
    groups = list(DataLoader.__iter__(grouped))
    assert all(type(g) is BatchGroup for g in groups)
    batches = sum(len(g.batches) for g in groups)
    assert batches == 126
    assert len(groups) <= 6  # 1 + one group of up to 32 batches per ~63, per worker, and the ends
    assert [len(g.batches) for g in groups[:2]] == [1, 1]
    assert {g.worker for g in groups} == {0, 1}
    assert sum(g.last for g in groups) == 2


def test_group_batches_false_sends_them_one_by_one(dataset):
    loader = shardstream.StreamingDataLoader(dataset().iter_batches(BATCH), batch_size=None, num_workers=2,
                                             collate_fn=keep, group_batches=False)
    items = list(DataLoader.__iter__(loader))
    assert len(items) == 126 and not any(type(i) is BatchGroup for i in items)


@pytest.mark.parametrize("early", [True, False])
def test_collate_runs_in_the_workers_once_per_batch(dataset, early):
    """Each batch is collated once: in a worker, but for the first one, which the loader reads
    and collates in this process before the workers start (`early_first_batch`)."""
    plain, grouped = loaders(dataset, 2, collate_fn=tag_with_pid, early_first_batch=early)
    got = list(grouped)
    assert [as_plain(b) for b in got] == [as_plain(b) for b in plain]
    pids = [int(b["pid"][0]) for b in got]
    workers = set(pids[1:]) if early else set(pids)
    assert len(workers) == 2 and os.getpid() not in workers
    assert (pids[0] == os.getpid()) == early


def test_default_conversion_as_a_plain_loader(dataset):
    """Without a collate_fn, torch's default conversion (numpy columns to tensors) runs on
    each batch in the worker, as without groups."""
    import torch

    plain, grouped = loaders(dataset, 2)
    want, got = list(plain), list(grouped)
    assert len(got) == len(want) == 126
    for a, b in zip(want, got):
        assert isinstance(b["id"], torch.Tensor) and torch.equal(a["id"], b["id"]) and torch.equal(a["x"], b["x"])
        assert a["pad"].tolist() == b["pad"].tolist() and a["name"].tolist() == b["name"].tolist()


def test_a_worker_with_nothing(dataset):
    """10 samples in batches of 8 over 3 workers: worker 2 has no batch at all."""
    plain = DataLoader(dataset(10).iter_batches(BATCH), batch_size=None, num_workers=3, collate_fn=keep)
    grouped = shardstream.StreamingDataLoader(dataset(10).iter_batches(BATCH), batch_size=None, num_workers=3,
                                              collate_fn=keep)
    want = [as_plain(b) for b in plain]
    assert [as_plain(b) for b in grouped] == want and len(want) == 2


def test_persistent_workers_two_epochs(dataset):
    plain, grouped = loaders(dataset, 2, collate_fn=keep, persistent_workers=True)
    want = [[as_plain(b) for b in plain] for _ in range(2)]
    got = [[as_plain(b) for b in grouped] for _ in range(2)]
    assert got == want
    assert got[0] != got[1]  # the second epoch has its own order


def test_resume_mid_epoch(dataset):
    """A grouped loader stopped after 37 batches saves the samples it handed out (not the ones
    it holds in received groups); a new loader resumes with the next batch of the epoch."""
    full = [i for b in shardstream.StreamingDataLoader(dataset().iter_batches(BATCH), batch_size=None, num_workers=2,
                                                       collate_fn=keep) for i in b["id"].tolist()]
    loader = shardstream.StreamingDataLoader(dataset().iter_batches(BATCH), batch_size=None, num_workers=2,
                                             collate_fn=keep)
    it = iter(loader)
    head = [i for _ in range(37) for i in next(it)["id"].tolist()]
    state = loader.state_dict()
    assert state["sample_in_epoch"] == 37 * BATCH
    del it
    resumed = shardstream.StreamingDataLoader(dataset().iter_batches(BATCH), batch_size=None, num_workers=2,
                                              collate_fn=keep)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in b["id"].tolist()] == full


def test_interleave_is_a_plain_loaders_round_robin():
    """The order logic alone: workers whose batches run out at different points, a last group
    with no batch, and a worker whose end is only known when the loader's items end."""
    groups = [
        BatchGroup(0, ["a0"], False), BatchGroup(1, ["b0"], False), BatchGroup(2, [], True),
        BatchGroup(0, ["a1", "a2", "a3"], False), BatchGroup(1, ["b1"], True),
        BatchGroup(0, ["a4"], False),
    ]
    assert list(interleave(groups, 3)) == ["a0", "b0", "a1", "b1", "a2", "a3", "a4"]
    with pytest.raises(RuntimeError, match="batch group was expected"):
        list(interleave([{"id": [1]}], 2))


# --- a StreamingDataset's samples, batched by the loader ---------------------------------------

def as_plain_collated(batch) -> dict:
    """A default-collated batch (tensors and lists) as plain values."""
    return {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in batch.items()}


@pytest.mark.parametrize("workers,ctx,drop_last", [(1, "fork", False), (2, "fork", False), (2, "fork", True),
                                                   (3, "fork", True), (2, "spawn", False)])
def test_per_sample_batches_are_a_plain_loaders(dataset, workers, ctx, drop_last):
    args = dict(batch_size=BATCH, num_workers=workers, multiprocessing_context=ctx, drop_last=drop_last)
    want = [as_plain_collated(b) for b in DataLoader(dataset(), **args)]
    loader = shardstream.StreamingDataLoader(dataset(), **args)
    got = [as_plain_collated(b) for b in loader]
    assert got == want
    assert loader.batch_size == BATCH and loader.collate_fn is not None  # the loader's own, as given
    ids = sorted(i for b in got for i in b["id"])
    assert ids == list(range(1003)) or (drop_last and len(ids) > 1003 - BATCH * workers)


def test_per_sample_batches_cross_in_groups(dataset):
    loader = shardstream.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=2)
    groups = list(loader._sample_groups)
    assert all(type(g) is BatchGroup for g in groups)
    assert sum(len(g.batches) for g in groups) == 126 and len(groups) <= 8
    assert [len(g.batches) for g in groups[:2]] == [1, 1]
    assert shardstream.StreamingDataLoader(dataset(), batch_size=BATCH, num_workers=2,
                                           group_batches=False)._sample_groups is None


def test_per_sample_persistent_workers_and_a_user_collate(dataset):
    def ids_only(samples):
        return {"id": [int(s["id"]) for s in samples], "pid": os.getpid()}

    args = dict(batch_size=BATCH, num_workers=2, persistent_workers=True, collate_fn=ids_only)
    plain, grouped = DataLoader(dataset(), **args), shardstream.StreamingDataLoader(dataset(), **args)
    want = [[b["id"] for b in plain] for _ in range(2)]
    got_batches = [list(grouped) for _ in range(2)]
    assert [[b["id"] for b in epoch] for epoch in got_batches] == want and want[0] != want[1]
    # The first iteration's first batch is read here before the workers start (early_first_batch);
    # every other batch, the second iteration's first included, comes from the persistent workers.
    pids = [b["pid"] for epoch in got_batches for b in epoch]
    assert pids[0] == os.getpid() and os.getpid() not in pids[1:]


def test_per_sample_resume_mid_epoch(dataset):
    kw = dict(batch_size=BATCH, num_workers=2)
    full = [i for b in shardstream.StreamingDataLoader(dataset(), **kw) for i in b["id"].tolist()]
    loader = shardstream.StreamingDataLoader(dataset(), **kw)
    it = iter(loader)
    head = [i for _ in range(41) for i in next(it)["id"].tolist()]
    state = loader.state_dict()
    assert state["sample_in_epoch"] == 41 * BATCH
    del it
    resumed = shardstream.StreamingDataLoader(dataset(), **kw)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in b["id"].tolist()] == full

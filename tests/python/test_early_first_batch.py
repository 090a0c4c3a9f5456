"""`StreamingDataLoader` reads each iteration's first batch in the training process, before the
DataLoader starts its workers, and the workers stream the rest (docs/python.md, "The first
batch before the workers"). What the training loop sees must be a plain DataLoader's: the same
batches in the same order, epoch after epoch, the same resume state, also cold from S3, for
`iter_batches` and for per-sample batches, under fork and spawn, for every rank; and random
transforms and the training process's generators must give a plain DataLoader's values."""

from __future__ import annotations

import multiprocessing
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardstream
from conftest import write_ids

N = 203
BATCH = 8


def keep(batch):
    """A module-level identity collate (spawned workers unpickle it by name)."""
    return batch


def ids_of(batch) -> list[int]:
    return [int(i) for i in np.asarray(batch["id"])]


@pytest.fixture()
def root(tmp_path, stream_env):
    out = tmp_path / "mds"
    write_ids(out, N, size_limit=1 << 10, extra=5)
    return out


def dataset(root, **kw) -> shardstream.StreamingDataset:
    return shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH, **kw)


def column_loaders(root, workers=2, ctx="fork", **kw):
    """A plain DataLoader and a StreamingDataLoader of `iter_batches` over equal datasets."""
    args = dict(batch_size=None, num_workers=workers, multiprocessing_context=ctx, collate_fn=keep)
    return (DataLoader(dataset(root).iter_batches(BATCH), **args),
            shardstream.StreamingDataLoader(dataset(root).iter_batches(BATCH), **args, **kw))


def sample_loaders(root, workers=2, ctx="fork", **kw):
    """The same for per-sample batches (torch's default collate)."""
    args = dict(batch_size=BATCH, num_workers=workers, multiprocessing_context=ctx)
    return DataLoader(dataset(root), **args), shardstream.StreamingDataLoader(dataset(root), **args, **kw)


def epochs_with_workers_seen(loader, epochs: int = 2) -> tuple[list[list[int]], list[int]]:
    """Each epoch's batches (their ids), and how many worker processes were alive when each
    epoch's first batch arrived."""
    out, alive = [], []
    for _ in range(epochs):
        batches = []
        for batch in loader:
            if not batches:
                alive.append(len(multiprocessing.active_children()))
            batches.append(ids_of(batch))
        out.append(batches)
    return out, alive


@pytest.mark.parametrize("kind", ["columns", "samples"])
@pytest.mark.parametrize("workers,ctx", [(1, "fork"), (2, "fork"), (3, "fork"), (2, "spawn")])
def test_the_same_batches_as_a_plain_loader_epoch_after_epoch(root, kind, workers, ctx):
    make = column_loaders if kind == "columns" else sample_loaders
    plain, loader = make(root, workers, ctx)
    want, _ = epochs_with_workers_seen(plain)
    got, alive = epochs_with_workers_seen(loader)
    assert got == want
    assert alive == [0, 0]  # each epoch's first batch came before any worker existed
    for epoch in got:
        assert sorted(i for b in epoch for i in b) == list(range(N))
    assert got[0] != got[1]  # the second iteration streamed the next epoch


def test_off_it_is_a_plain_loaders_start(root):
    plain, loader = column_loaders(root, early_first_batch=False)
    got, alive = epochs_with_workers_seen(loader)
    assert got == epochs_with_workers_seen(plain)[0]
    assert alive == [2, 2]


def test_not_with_a_worker_init_fn_or_another_batch_size(root):
    """Where the first batch would not be what a worker makes of it, the workers read it."""
    plain, loader = column_loaders(root, worker_init_fn=keep)
    got, alive = epochs_with_workers_seen(loader)
    assert got == epochs_with_workers_seen(plain)[0] and alive == [2, 2]
    # A per-sample dataset batched by the loader in batches of another size than its own.
    plain = DataLoader(dataset(root), batch_size=2 * BATCH, num_workers=2)
    loader = shardstream.StreamingDataLoader(dataset(root), batch_size=2 * BATCH, num_workers=2)
    got, alive = epochs_with_workers_seen(loader, 1)
    assert got == epochs_with_workers_seen(plain, 1)[0] and alive == [2]


@pytest.mark.parametrize("kind", ["columns", "samples"])
def test_persistent_workers_only_the_first_iteration(root, kind):
    """Persistent workers start once: the first iteration's first batch is read here before
    them, the later iterations' come from the running workers, all as a plain loader's."""
    make = column_loaders if kind == "columns" else sample_loaders
    plain, loader = make(root, persistent_workers=True)
    got, alive = epochs_with_workers_seen(loader, 3)
    assert got == epochs_with_workers_seen(plain, 3)[0]
    assert alive == [0, 2, 2]
    assert len({tuple(i for b in epoch for i in b) for epoch in got}) == 3


def test_a_break_after_the_first_batch_moves_to_the_next_epoch(root):
    """As with a plain loader (and Mosaic), every new iteration streams the next epoch, also one
    that ended before its workers started."""
    plain, loader = column_loaders(root)
    for one in (plain, loader):
        it = iter(one)
        next(it)
        del it
    want = [ids_of(b) for b in plain]
    got = [ids_of(b) for b in loader]
    assert got == want
    # The second iteration is epoch 1, not a replay of epoch 0.
    epoch1 = dataset(root)
    epoch1.set_epoch(1)
    assert got == [ids_of(b) for b in DataLoader(epoch1.iter_batches(BATCH), batch_size=None, collate_fn=keep)]


@pytest.mark.parametrize("kind", ["columns", "samples"])
@pytest.mark.parametrize("stop", [1, 2, 7, 23])
def test_resume_from_a_state_taken_at_any_batch(root, kind, stop):
    """A state saved after the first batch (before the workers exist), just after they start,
    or later resumes a new loader at exactly the next sample."""
    make = column_loaders if kind == "columns" else sample_loaders
    _, whole = make(root)
    want = [i for b in whole for i in ids_of(b)]
    _, first = make(root)
    seen = []
    for k, batch in enumerate(first, 1):
        seen.extend(ids_of(batch))
        if k == stop:
            state = first.state_dict()
            break
    _, second = make(root)
    second.load_state_dict(state)
    rest = [i for b in second for i in ids_of(b)]
    assert seen + rest == want


def test_a_state_loaded_after_a_peek_at_the_first_batch(root):
    """An iteration left after its first batch (its workers never started), then a state
    loaded and a new iteration: the new one resumes the loaded position exactly."""
    _, whole = column_loaders(root)
    epochs = [[i for b in whole for i in ids_of(b)] for _ in range(2)]
    saved = dataset(root)
    saved.set_epoch(1)
    state = saved.state_dict(num_samples=3 * BATCH)
    _, loader = column_loaders(root)
    it = iter(loader)
    next(it)
    loader.load_state_dict(state)
    it = iter(loader)  # the first generator is dropped here
    assert [i for b in it for i in ids_of(b)] == epochs[1][3 * BATCH:]


class Noisy(shardstream.StreamingDataset):
    """A transform that draws from every random generator the training process has."""

    def __getitem__(self, index):
        sample = dict(super().__getitem__(index))
        sample["noise"] = random.random() + float(np.random.rand()) + float(torch.rand(1))
        return sample


def noisy_collate(batch):
    """`iter_batches`' batch with a column drawn from every random generator (per batch)."""
    n = len(batch["id"])
    batch["noise"] = np.array([random.random() for _ in range(n)]) + np.random.rand(n) + torch.rand(n).numpy()
    return batch


@pytest.mark.parametrize("kind", ["samples", "columns"])
@pytest.mark.parametrize("persistent", [False, True])
def test_random_transforms_and_generators_as_a_plain_loader(root, kind, persistent):
    """Random transforms give the very values a plain DataLoader's workers give (the first
    batch is drawn under worker 0's seeds, and worker 0 goes on from there), and the training
    process's generators go as with a plain DataLoader (its base-seed draw included), over two
    epochs."""

    def run(cls):
        random.seed(1), np.random.seed(1), torch.manual_seed(1)
        if kind == "samples":
            loader = cls(Noisy(local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH), batch_size=BATCH,
                         num_workers=2, persistent_workers=persistent)
        else:
            loader = cls(dataset(root).iter_batches(BATCH), batch_size=None, num_workers=2,
                         persistent_workers=persistent, collate_fn=noisy_collate)
        out, alive = [], []
        for _ in range(2):
            for k, batch in enumerate(loader):
                out.append((ids_of(batch), [float(x) for x in batch["noise"]]))
                if k == 0:
                    alive.append(len(multiprocessing.active_children()))
                    out.append((random.random(), float(np.random.rand()), float(torch.rand(1))))
        return out, alive

    got, alive = run(shardstream.StreamingDataLoader)
    want, _ = run(DataLoader)
    assert got == want
    assert alive == ([0, 2] if persistent else [0, 0])


def test_every_rank(root, monkeypatch):
    """Two ranks (of one node), each through its own loader: each yields a plain loader's
    batches for its rank, and together every sample once."""
    seen = []
    for rank in (0, 1):
        for k, v in (("RANK", rank), ("WORLD_SIZE", 2), ("LOCAL_RANK", rank), ("LOCAL_WORLD_SIZE", 2)):
            monkeypatch.setenv(k, str(v))
        plain, loader = column_loaders(root)
        got, alive = epochs_with_workers_seen(loader, 1)
        assert got == epochs_with_workers_seen(plain, 1)[0] and alive == [0]
        seen.extend(i for b in got[0] for i in b)
    # remainder="pad" gives the ranks equal shares: at most one sample repeated per rank.
    assert set(seen) == set(range(N)) and len(seen) <= N + 1


def test_cold_from_s3(tmp_path, moto, stream_env, monkeypatch):
    """From the real S3 server into an empty cache: the first batch is read here (joining the
    prefetch at construction's download), the workers stream the rest, each sample once."""
    data = tmp_path / "s3-mds"
    write_ids(data, N, size_limit=2 << 10, extra=300)
    remote = moto.upload_dataset(data, f"early-{tmp_path.name}".lower().replace("_", "-")[:60])
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    for kind in ("columns", "samples"):
        ds = shardstream.StreamingDataset(remote=remote, local=str(tmp_path / f"cache-{kind}"), shuffle=True,
                                          shuffle_seed=3, batch_size=BATCH)
        if kind == "columns":
            loader = shardstream.StreamingDataLoader(ds.iter_batches(BATCH), batch_size=None, num_workers=2,
                                                     collate_fn=keep)
        else:
            loader = shardstream.StreamingDataLoader(ds, batch_size=BATCH, num_workers=2)
        got, alive = epochs_with_workers_seen(loader, 1)
        assert alive == [0]
        assert sorted(i for b in got[0] for i in b) == list(range(N))
        local = dataset(data)
        assert got[0] == [ids_of(b) for b in DataLoader(local.iter_batches(BATCH), batch_size=None, num_workers=2,
                                                        collate_fn=keep)]

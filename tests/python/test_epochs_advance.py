"""Through DataLoader workers, each iteration streams the next epoch by itself, as Mosaic's
StreamingDataset does: with fresh workers each epoch and with `persistent_workers=True` (whose
copies are made once; the training process's `set_epoch` and `load_state_dict` reach them through
the markers), with or without `set_epoch`, and after an
iteration left with `break` too. Each epoch
is complete and is the same sequence as that epoch streamed by a single process; the training
process's `epoch` and `state_dict` follow the workers, so a resume lands in the right epoch."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import write_ids
from shardstream import _epochs

N, BATCH, EPOCHS = 64, 4, 3


@pytest.fixture()
def root(tmp_path, stream_env):
    out = tmp_path / "mds"
    write_ids(out, N, size_limit=256)
    return out


def _dataset(root):
    return shardstream.StreamingDataset(local=str(root), batch_size=BATCH, shuffle=True, shuffle_seed=1)


def _reference(root) -> list[list[int]]:
    ds = _dataset(root)  # a single process moves to the next epoch after each iteration
    return [[int(s["id"]) for s in ds] for _ in range(EPOCHS)]


def _ids(batch) -> list[int]:
    return [int(i) for i in batch["id"]]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("set_epoch", [False, True])
def test_each_iteration_is_the_next_epoch(root, persistent, set_epoch):
    want = _reference(root)
    assert len({tuple(e) for e in want}) == EPOCHS
    ds = _dataset(root)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=persistent,
                        multiprocessing_context="fork")
    for epoch in range(EPOCHS):
        if set_epoch:
            ds.set_epoch(epoch)
        assert [i for b in loader for i in _ids(b)] == want[epoch], f"epoch {epoch}"
        assert ds.epoch == epoch, "the training process follows its workers"


def test_spawned_workers_advance_too(root):
    want = _reference(root)
    loader = DataLoader(_dataset(root), batch_size=BATCH, num_workers=2, multiprocessing_context="spawn")
    assert [[i for b in loader for i in _ids(b)] for _ in range(2)] == want[:2]


def test_a_mid_epoch_state_names_the_workers_epoch(root):
    from shardstream import StreamingDataLoader

    want = _reference(root)
    loader = StreamingDataLoader(_dataset(root), batch_size=BATCH, num_workers=2)
    assert [i for b in loader for i in _ids(b)] == want[0]
    head = []
    for n, batch in enumerate(loader):
        head += _ids(batch)
        if n == 2:
            break
    state = loader.state_dict()
    assert (state["epoch"], state["sample_in_epoch"]) == (1, 3 * BATCH)
    resumed = StreamingDataLoader(_dataset(root), batch_size=BATCH, num_workers=2)
    resumed.load_state_dict(state)
    assert head + [i for b in resumed for i in _ids(b)] == want[1]
    # An explicit choice still wins: set_epoch(0) streams epoch 0 again.
    resumed.dataset.set_epoch(0)
    assert [i for b in resumed for i in _ids(b)] == want[0]


@pytest.mark.parametrize("persistent", [False, True])
def test_an_abandoned_iteration_is_followed_by_the_next_epoch_and_markers_go_with_the_dataset(root, persistent):
    """As Mosaic: every new iteration starts the next epoch, also after one left with `break`
    (a loop over a fixed number of batches per epoch sees new samples each time)."""
    want = _reference(root)
    ds = _dataset(root)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=persistent)
    it = iter(loader)
    assert _ids(next(it)) == want[0][:BATCH]
    del it  # the workers stop before their shares end
    assert [i for b in loader for i in _ids(b)] == want[1]
    assert ds.epoch == 1
    assert [i for b in loader for i in _ids(b)] == want[2]
    folders = [r.folder for r in ds._lineages]
    assert any(os.path.isdir(f) for f in folders)
    del loader, ds
    import gc

    gc.collect()
    assert not any(os.path.exists(f) for f in folders), "the markers are removed with the dataset"


def test_a_single_process_break_is_followed_by_the_next_epoch(root):
    want = _reference(root)
    ds = _dataset(root)
    for n, sample in enumerate(ds):
        if n == 5:
            break
    assert ds.state_dict()["epoch"] == 0  # the abandoned epoch is the one a checkpoint names
    assert [int(s["id"]) for s in ds] == want[1]
    assert ds.epoch == 2


def test_a_generator_seeded_afresh_each_epoch(root):
    """A DataLoader built each epoch with the same seeded generator draws the same base seed,
    so its workers' iterations share a name: a finished epoch still moves them on."""
    import torch

    want = _reference(root)
    ds = _dataset(root)
    for epoch in range(2):
        loader = DataLoader(ds, batch_size=BATCH, num_workers=2, generator=torch.Generator().manual_seed(7))
        assert [i for b in loader for i in _ids(b)] == want[epoch]


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_set_epoch_and_load_state_dict_reach_persistent_workers(root, persistent, ctx):
    """The training process's `set_epoch` (a jump) and `load_state_dict` between iterations
    reach workers that were started before them and persist: they stream the chosen epoch (from
    the chosen position), and the iteration after it the epoch after that."""
    single = _dataset(root)
    want = [[int(s["id"]) for s in single] for _ in range(5)]
    ds = _dataset(root)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, persistent_workers=persistent,
                        multiprocessing_context=ctx)

    def epoch() -> list[int]:
        return [i for b in loader for i in _ids(b)]

    assert epoch() == want[0]
    ds.set_epoch(3)
    assert epoch() == want[3]
    assert ds.epoch == 3
    assert epoch() == want[4]
    saved = _dataset(root)
    saved.set_epoch(1)
    ds.load_state_dict(saved.state_dict(num_samples=2 * BATCH * 3))
    assert epoch() == want[1][2 * BATCH * 3:]
    assert epoch() == want[2]


_KILLED_CHILD = """
import os, signal, sys
import shardstream
ds = shardstream.StreamingDataset(local=sys.argv[1], batch_size=4, prefetch_on_init=False)
next(iter(ds))  # the iteration's start marker makes the lineage's folder
print(ds._lineages[-1].folder, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no finalizer runs: the folder is left behind
"""

_NEW_DATASET = """
import sys
import shardstream
shardstream.StreamingDataset(local=sys.argv[1], batch_size=4, prefetch_on_init=False)
"""


def _aged(folder: str) -> None:
    old = time.time() - _epochs.SWEEP_AFTER_S - 60
    os.utime(folder, (old, old))


def test_a_killed_process_markers_are_removed_by_the_next_process(root):
    """A process killed with SIGKILL cannot remove its lineage's folder; the next process that
    makes a dataset removes it, once it has been left for a minute. Folders whose maker lives,
    of another PID namespace, of an older version, or just left, stay."""
    run = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(root)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr
    left = run.stdout.strip()
    assert os.path.isdir(left), "a killed process leaves its folder"
    namespace = _epochs._pid_namespace()
    dead_pid = int(os.path.basename(left).split("-")[1])
    keep = {
        "live maker": os.path.join(_epochs._ROOT, f"{namespace}-{os.getpid()}-{'a' * 32}"),
        "other namespace": os.path.join(_epochs._ROOT, f"{namespace + 1}-{dead_pid}-{'b' * 32}"),
        "older version": os.path.join(_epochs._ROOT, "c" * 32),
    }
    for folder in keep.values():
        os.makedirs(folder, exist_ok=True)
        _aged(folder)
    try:
        new = subprocess.run([sys.executable, "-c", _NEW_DATASET, str(root)], capture_output=True, text=True,
                             timeout=120)
        assert new.returncode == 0, new.stderr
        assert os.path.isdir(left), "a folder left less than a minute ago stays"
        _aged(left)
        new = subprocess.run([sys.executable, "-c", _NEW_DATASET, str(root)], capture_output=True, text=True,
                             timeout=120)
        assert new.returncode == 0, new.stderr
        assert not os.path.exists(left), "the next process removed the killed one's folder"
        for why, folder in keep.items():
            assert os.path.isdir(folder), f"kept: {why}"
    finally:
        for folder in keep.values():
            shutil.rmtree(folder, ignore_errors=True)

"""Mosaic's way to transform samples is a subclass that overrides `__getitem__` (or `get_item`)
and calls `super().__getitem__(idx)`: Mosaic's iteration yields `self[index]` for every sample.
A script that switches the base class's import to shardstream must get the same transformed
samples when it iterates (not the stored ones), in one process and in DataLoader workers, with
`idx` the sample's global index, as Mosaic passes it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import write_ids

N = 120


class Doubled(shardstream.StreamingDataset):
    """Mosaic's documented pattern: transform what `super().__getitem__` returns."""

    def __getitem__(self, idx):
        obj = super().__getitem__(idx)
        return {"idx": idx, "twice": int(obj["id"]) * 2, "x": int(obj["x"]), "pid": os.getpid()}


class ThroughGetItem(shardstream.StreamingDataset):
    """Overrides `get_item` only, and reads through `self.get_item` (no recursion)."""

    def get_item(self, idx):
        obj = super().get_item(idx)
        return (idx, int(obj["id"]) + 1000)


class CallsGetItemFromGetitem(shardstream.StreamingDataset):
    def __getitem__(self, idx):
        return ("item", int(self.get_item(idx)["id"]))


@pytest.fixture()
def root(tmp_path, stream_env):
    out = tmp_path / "mds"
    write_ids(out, N, size_limit=300)
    return out


def test_iteration_yields_the_subclass_transform(root):
    ds = Doubled(local=str(root), shuffle=True, shuffle_seed=2, batch_size=4)
    got = list(ds)
    assert sorted(g["twice"] for g in got) == [2 * i for i in range(N)]
    # idx is the sample's global index (the dataset's ids equal their index), x = 3 * id.
    assert all(g["idx"] == g["twice"] // 2 and g["x"] == 3 * g["idx"] for g in got)
    plain = [int(s["id"]) for s in shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=2,
                                                                 batch_size=4)]
    assert [g["idx"] for g in got] == plain, "the order is the plain dataset's"
    assert ds[7]["twice"] == 14 and ds.get_item(7)["id"] == 7


def test_the_same_samples_as_mosaics_subclass(root, tmp_path):
    from streaming import StreamingDataset as MosaicDataset

    class MosaicDoubled(MosaicDataset):
        def __getitem__(self, idx):
            obj = super().__getitem__(idx)
            return {"idx": idx, "twice": int(obj["id"]) * 2, "x": int(obj["x"])}

    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    mosaic = MosaicDoubled(local=str(root), shuffle=False, batch_size=4)
    ours = Doubled(local=str(root), shuffle=False, batch_size=4)
    strip = [{k: v for k, v in g.items() if k != "pid"} for g in ours]
    assert sorted(strip, key=lambda g: g["idx"]) == sorted(mosaic, key=lambda g: g["idx"])


def test_get_item_override_and_get_item_from_getitem(root):
    got = list(ThroughGetItem(local=str(root), batch_size=4))
    assert sorted(got) == [(i, i + 1000) for i in range(N)]
    assert ThroughGetItem(local=str(root))[5] == (5, 1005)
    assert sorted(CallsGetItemFromGetitem(local=str(root), batch_size=4)) == [("item", i) for i in range(N)]


@pytest.mark.parametrize("loader", ["DataLoader", "StreamingDataLoader"])
def test_the_transform_runs_in_the_workers(root, loader):
    ds = Doubled(local=str(root), shuffle=True, shuffle_seed=2, batch_size=4)
    cls = DataLoader if loader == "DataLoader" else shardstream.StreamingDataLoader
    batches = list(cls(ds, batch_size=4, num_workers=2))
    twice = sorted(int(t) for b in batches for t in b["twice"])
    assert twice == [2 * i for i in range(N)]
    if loader == "StreamingDataLoader":
        # Its first batch is read (and transformed) in this process before the workers start.
        assert {int(p) for p in batches[0]["pid"]} == {os.getpid()}
        batches = batches[1:]
    pids = {int(p) for b in batches for p in b["pid"]}
    assert len(pids) == 2 and os.getpid() not in pids


def test_mixed_streams_pass_global_indices(tmp_path, stream_env):
    a, b = tmp_path / "a", tmp_path / "b"
    write_ids(a, 30, size_limit=300)
    write_ids(b, 50, size_limit=300, extra=3)

    class Indexed(shardstream.StreamingDataset):
        def __getitem__(self, idx):
            return idx, dict(super().__getitem__(idx))

    streams = [shardstream.Stream(local=str(a)), shardstream.Stream(local=str(b))]
    ds = Indexed(streams=streams, shuffle=True, shuffle_seed=4, batch_size=4)
    plain = shardstream.StreamingDataset(streams=[shardstream.Stream(local=str(a)), shardstream.Stream(local=str(b))],
                                         batch_size=4)
    got = list(ds)
    assert sorted(i for i, _ in got) == list(range(80))
    for idx, sample in got:
        want = plain.get_item(idx)
        assert sample.keys() == want.keys()
        assert all(np.array_equal(sample[k], want[k]) if k != "pad" else sample[k] == want[k] for k in sample)


def test_iter_batches_warns_that_it_reads_the_stored_columns(root):
    with pytest.warns(UserWarning, match="Doubled's __getitem__/get_item is not applied"):
        batches = list(Doubled(local=str(root), batch_size=4).iter_batches(10))
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(N))

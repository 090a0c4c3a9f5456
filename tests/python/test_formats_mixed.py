"""Streams whose MDS columns differ mix as in Mosaic: each sample is decoded by its own stream's
columns (it used to be decoded by the first stream's, and failed mid-epoch with `CorruptDataError
... 2 columns, the index declares 6`). Through a DataLoader with 2 workers, every sample of each
stream comes once, equal to what Mosaic's own StreamingDataset reads from that stream."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

import shardstream

BATCH = 4


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    from streaming import MDSWriter

    root = tmp_path_factory.mktemp("mixed")
    with MDSWriter(out=str(root / "a"), columns={"id": "int", "src": "str"}, size_limit=300) as w:
        for i in range(30):
            w.write({"id": i, "src": "a"})
    columns = {"key": "str", "x": "bytes", "y": "float64", "z": "json", "arr": "ndarray:int16:3",
               "n": "uint8"}
    with MDSWriter(out=str(root / "b"), columns=columns, size_limit=500, compression="zstd") as w:
        for i in range(25):
            w.write({"key": f"b{i}", "x": bytes([i]) * i, "y": i / 7, "z": {"i": [i]},
                     "arr": np.full(3, i, dtype=np.int16), "n": np.uint8(i)})
    return root


def _mosaic(path) -> dict:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return {str(s.get("key", s.get("id"))): s for s in StreamingDataset(local=str(path), batch_size=BATCH)}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_streams_with_different_columns_each_decode_their_own(two, stream_env):
    streams = [shardstream.Stream(local=str(two / "a")), shardstream.Stream(local=str(two / "b"))]
    ds = shardstream.StreamingDataset(streams=streams, shuffle=True, shuffle_seed=8, batch_size=BATCH)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda batch: batch)
    got = [s for batch in loader for s in batch]
    assert len(got) == 55
    want = {**_mosaic(two / "a"), **_mosaic(two / "b")}
    keys = [str(s.get("key", s.get("id"))) for s in got]
    assert sorted(keys) == sorted(want)
    for k, s in zip(keys, got):
        assert _same(s, want[k]), f"{s} != Mosaic's {want[k]}"

"""Zero-copy bytes: `shardstream.Buffer` exports Rust-owned sample bytes through the buffer
protocol. With `zero_copy=True` the `bytes` columns of `__iter__` and `__getitem__` are Buffers
over the engine's read; the variable-size columns of `iter_batches` are always Buffers. The
values equal Mosaic's `bytes`, and memoryview, numpy and torch read them in place (read-only)."""

from __future__ import annotations

import copy
import ctypes
import gc
import pickle
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import shardstream
from conftest import pad_bytes, write_ids

N = 40
EXTRA = 3000  # bytes of the `pad` column per sample


def pad_of(i: int) -> bytes:
    return pad_bytes(i, EXTRA)


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    root = tmp_path_factory.mktemp("zc") / "mds"
    write_ids(root, N, size_limit=1 << 15, extra=EXTRA)
    return root


def test_default_iter_keeps_bytes_as_mosaic(padded, stream_env):
    ds = shardstream.StreamingDataset(local=str(padded))
    samples = list(ds)
    assert [type(s["pad"]) for s in samples] == [bytes] * N
    assert [s["pad"] for s in samples] == [pad_of(i) for i in range(N)]


def test_zero_copy_iter_gives_buffers_equal_to_bytes(padded, stream_env):
    ds = shardstream.StreamingDataset(local=str(padded), zero_copy=True)
    samples = list(ds)
    assert [s["id"] for s in samples] == list(range(N))
    for i, s in enumerate(samples):
        buf = s["pad"]
        assert isinstance(buf, shardstream.Buffer)
        assert len(buf) == EXTRA
        assert bytes(buf) == pad_of(i)
        assert buf == pad_of(i)
        view = memoryview(buf)
        assert view.readonly and view.nbytes == EXTRA and view.format == "B"
        assert view.tobytes() == pad_of(i)
        arr = np.frombuffer(buf, dtype=np.uint8)
        assert not arr.flags.writeable
        assert int(arr.sum()) == (i % 251) * EXTRA
        with warnings.catch_warnings():  # torch warns (once) that the buffer is read-only
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(buf, dtype=torch.uint8)
        assert t.numel() == EXTRA and int(t[0]) == i % 251
        assert buf[0] == i % 251 and buf[-1] == i % 251
        assert bytes(buf[10:20]) == pad_of(i)[10:20]
        assert pickle.loads(pickle.dumps(buf)) == pad_of(i)
    # Random access follows the same setting.
    assert isinstance(ds[5]["pad"], shardstream.Buffer) and bytes(ds[5]["pad"]) == pad_of(5)


def test_buffer_is_read_only_and_outlives_its_stream(padded, stream_env):
    ds = shardstream.StreamingDataset(local=str(padded), zero_copy=True)
    it = iter(ds)
    first = next(it)["pad"]
    view = memoryview(first)
    with pytest.raises(TypeError):
        view[0] = 1
    with pytest.raises(ValueError):
        np.frombuffer(first, dtype=np.uint8).setflags(write=True)
    with pytest.raises(TypeError, match="not writable"):
        ctypes.c_char.from_buffer(first)
    # The rest of the epoch runs and the stream closes; the views still read the first sample.
    rest = list(it)
    del it, rest
    gc.collect()
    assert view.tobytes() == pad_of(0)
    assert bytes(first) == pad_of(0)
    view.release()


def test_zero_copy_survives_a_dataloader(padded, stream_env):
    """A DataLoader worker sends a Buffer to the main process as `bytes` (its pickle form)."""
    ds = shardstream.StreamingDataset(local=str(padded), zero_copy=True, batch_size=4)
    seen = {}
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda batch: batch)
    for batch in loader:
        for s in batch:
            seen[int(s["id"])] = s["pad"]
    assert sorted(seen) == list(range(N))
    assert all(bytes(seen[i]) == pad_of(i) for i in range(N))


def test_iter_batches_var_columns_are_buffers(padded, stream_env):
    ds = shardstream.StreamingDataset(local=str(padded))
    ids: list[int] = []
    for batch in ds.iter_batches(16):
        pad = batch["pad"]
        assert isinstance(pad, shardstream.VarColumn)
        assert isinstance(pad.data, shardstream.Buffer)
        assert len(pad.data) == EXTRA * len(pad)
        got = [int(i) for i in batch["id"]]
        assert pad.tolist() == [pad_of(i) for i in got]
        assert all(pad[k].tobytes() == pad_of(i) for k, i in enumerate(got))
        flat = np.frombuffer(pad.data, dtype=np.uint8).reshape(len(pad), EXTRA)
        assert [int(r[0]) for r in flat] == [i % 251 for i in got]
        # Fixed-size columns are writable numpy arrays over the batch's own buffer.
        assert batch["x"].dtype == np.uint32 and batch["x"].flags.writeable
        assert [int(v) for v in batch["x"]] == [3 * i for i in got]
        ids.extend(got)
    assert ids == list(range(N))


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
def test_iter_batches_through_a_dataloader_with_workers(padded, stream_env, ctx):
    """`iter_batches` is an IterableDataset: 2 workers split the epoch, every sample once, and
    the Buffers reach the main process intact."""
    ds = shardstream.StreamingDataset(local=str(padded), batch_size=8)
    batches = ds.iter_batches(8)
    assert isinstance(batches, torch.utils.data.IterableDataset)
    loader = DataLoader(batches, batch_size=None, num_workers=2, multiprocessing_context=ctx)
    ids: list[int] = []
    for batch in loader:
        got = [int(i) for i in batch["id"]]
        assert batch["pad"].tolist() == [pad_of(i) for i in got]
        ids.extend(got)
    assert sorted(ids) == list(range(N))


def test_numeric_columns_are_the_batchs_own_to_write(padded, stream_env):
    """The numeric arrays of a batch are writable and belong to that batch alone: writing to
    them changes neither the other batches nor what a later epoch reads, also after their
    memory has gone back to the pool and been reused."""
    ds = shardstream.StreamingDataset(local=str(padded))
    for _ in range(2):
        kept = []
        for batch in ds.iter_batches(8):
            ids, x = batch["id"], batch["x"]
            assert ids.flags.writeable and x.flags.writeable
            assert [int(v) for v in x] == [3 * int(i) for i in ids]
            x += 1  # in place, as a normalising transform would
            ids[:] = -ids
            owner = ids
            while isinstance(owner, np.ndarray):
                owner = owner.base
            assert isinstance(owner, memoryview) and isinstance(owner.obj, shardstream._native.ColumnBuffer)
            kept.append(batch)
        got = np.concatenate([-b["id"] for b in kept])
        assert sorted(got.tolist()) == list(range(N))
        assert all((b["x"] == 3 * -b["id"] + 1).all() for b in kept)
        del kept, batch, ids, x
        gc.collect()


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_default_conversion_gives_tensors_without_warnings(padded, stream_env, workers):
    """`DataLoader(ds.iter_batches(n), batch_size=None)` (the default `collate_fn` converts each
    numpy array to a tensor in place) warns about nothing, and the tensors hold the batch."""
    ds = shardstream.StreamingDataset(local=str(padded), batch_size=8)
    loader = DataLoader(ds.iter_batches(8), batch_size=None, num_workers=workers)
    ids: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "The given NumPy array is not writable" included
        for batch in loader:
            assert isinstance(batch["id"], torch.Tensor) and isinstance(batch["x"], torch.Tensor)
            got = batch["id"].tolist()
            assert batch["x"].tolist() == [3 * i for i in got]
            assert batch["pad"].tolist() == [pad_of(i) for i in got]
            batch["x"].mul_(2)  # the tensor is the batch's own
            ids.extend(got)
    assert sorted(ids) == list(range(N))


def test_recycled_buffers_never_change_what_python_still_holds(tmp_path, stream_env):
    """Read buffers and batch buffers go back to a pool when Python drops what uses them, and
    later reads and batches reuse that memory. Batches and Buffers still held must keep their
    bytes while every later read and gather runs: samples of 200 KB, large enough that each
    is its own read and each batch column its own pooled allocation."""
    n, extra = 48, 200_000
    root = tmp_path / "big"
    write_ids(root, n, size_limit=1 << 22, extra=extra)
    ds = shardstream.StreamingDataset(local=str(root), zero_copy=True)
    for epoch in range(2):  # the second epoch reuses the first one's pooled allocations
        kept_batches = []
        for k, batch in enumerate(ds.iter_batches(4)):
            got = [int(i) for i in batch["id"]]
            assert batch["pad"].tolist() == [pad_bytes(i, extra) for i in got]
            if k % 2 == 0:
                kept_batches.append((got, batch))  # the odd ones are dropped and recycled
        for got, batch in kept_batches:
            assert batch["pad"].tolist() == [pad_bytes(i, extra) for i in got], epoch
            assert [int(v) for v in batch["x"]] == [3 * i for i in got]
        kept_samples = []
        for s in ds:
            if int(s["id"]) % 3 == 0:
                kept_samples.append((int(s["id"]), s["pad"]))
        assert len(kept_samples) == n // 3
        for i, pad in kept_samples:
            assert bytes(pad) == pad_bytes(i, extra), (epoch, i)


def test_iter_batches_yields_column_batches_that_pickle_to_equal_batches(padded, stream_env):
    """What a DataLoader worker sends: a `ColumnBatch` pickles (numeric columns and offsets in
    one blob) and unpickles to the same columns (writable copies, as a plain dict's pickle
    gives), with a user's own entry kept."""
    ds = shardstream.StreamingDataset(local=str(padded))
    for batch in ds.iter_batches(16):
        assert isinstance(batch, shardstream.ColumnBatch) and isinstance(batch, dict)
        batch["note"] = ["kept", 1]
        again = pickle.loads(pickle.dumps(batch))
        assert type(again) is shardstream.ColumnBatch
        assert list(again) == list(batch) and list(batch)[-1] == "note"
        for name in ("id", "x"):
            assert again[name].dtype == batch[name].dtype and again[name].shape == batch[name].shape
            assert (again[name] == batch[name]).all()
            assert again[name].flags.writeable and batch[name].flags.writeable
        assert (again["pad"].offsets == batch["pad"].offsets).all()
        assert again["pad"].tolist() == batch["pad"].tolist() and again["pad"].encoding == "bytes"
        assert again["note"] == ["kept", 1]
        shallow = copy.copy(batch)
        assert type(shallow) is shardstream.ColumnBatch and shallow is not batch
        assert all(shallow[k] is batch[k] for k in batch)


def test_column_batch_pickles_odd_sizes_large_arrays_and_other_values():
    """Arrays of odd byte sizes keep the next array aligned; an array over the blob limit and
    values that are not the batch path's own pickle as themselves."""
    batch = shardstream.ColumnBatch(
        a=np.arange(3, dtype=np.uint8),
        b=np.arange(10, dtype=np.float64).reshape(5, 2),
        v=shardstream.VarColumn(b"abcdef", np.array([0, 1, 3, 6], dtype="<u8"), "str"),
        big=np.arange(20_000, dtype=np.int64),
        empty=np.zeros((0, 4), dtype=np.int32),
        t=torch.arange(4),
    )
    again = pickle.loads(pickle.dumps(batch))
    assert list(again) == ["a", "b", "v", "big", "empty", "t"]
    for name in ("a", "b", "big", "empty"):
        assert again[name].dtype == batch[name].dtype and again[name].shape == batch[name].shape
        assert (again[name] == batch[name]).all()
    assert again["b"].flags.aligned
    assert again["v"].tolist() == ["a", "bc", "def"]
    assert torch.equal(again["t"], batch["t"])

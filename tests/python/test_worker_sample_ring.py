"""Large `bytes` values of samples cross from DataLoader workers through the worker's shared ring
(pyo3-bindings/python/shardstream/_transport.py; docs/python.md, "Large sample values from
workers").

A plain `DataLoader(ds, batch_size=..., num_workers=2)` over a `StreamingDataset`: every sample
arrives byte-identical to the training process's own read, as plain `bytes`, under fork, spawn
and forkserver (with `pin_memory`), with the ring on, off, and so small that values fall back to
the pipe mid-epoch; persistent workers go on sharing epoch after epoch; plain `pickle` of a
`SharedBytes` gives `bytes`; a message read twice is refused; and nothing is left in /dev/shm or
mapped in the training process after the loader ends."""

from __future__ import annotations

import gc
import os
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import pad_bytes, write_ids
from shardstream import _transport

N = 96
EXTRA = 100_000  # above the 64 KiB sharing threshold


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("ring") / "mds"
    write_ids(root, N, size_limit=1 << 20, extra=EXTRA)
    return root


@pytest.fixture()
def received(monkeypatch):
    """Counts the values this process read out of a worker's ring."""
    count = [0]
    read = _transport._read

    def counting(*args):
        count[0] += 1
        return read(*args)

    # Messages name `_rebuild`, which calls `_read`: patched here, in the training process.
    monkeypatch.setattr(_transport, "_read", counting)
    return count


def check(ds, **kw) -> list[int]:
    ids, kinds = [], set()
    for batch in DataLoader(ds, batch_size=8, num_workers=2, **kw):
        for i, pad in zip(batch["id"].tolist(), batch["pad"]):
            kinds.add(type(pad))
            assert pad == pad_bytes(i, EXTRA), i
            ids.append(i)
    assert kinds == {bytes}
    assert sorted(ids) == list(range(N))
    return ids


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def ring_mappings() -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if "shardstream-samples" in line]


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_values_arrive_through_the_ring_as_plain_bytes(big, stream_env, received, ctx):
    before = shm_entries()
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=3, batch_size=8)
    mine = {s["id"]: s["pad"] for s in ds}  # the training process's own read, no workers
    assert all(v == pad_bytes(i, EXTRA) for i, v in mine.items())
    check(ds, multiprocessing_context=ctx, pin_memory=True)
    assert received[0] == N  # every `pad` through a ring, none through the pipe
    gc.collect()
    assert shm_entries() == before
    assert ring_mappings() == []


def test_out_of_order_delivery_stays_exact(big, stream_env, received):
    """`in_order=False`: the training process may hand batches out of order, but it unpickles
    each worker's messages in the order the worker sent them, which is all the ring needs."""
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=6, batch_size=8)
    check(ds, multiprocessing_context="fork", in_order=False)
    assert received[0] == N


@pytest.mark.parametrize("var, value", [("SHARDSTREAM_WORKER_SAMPLE_ARENA", "0"), ("SHARDSTREAM_WORKER_SHM", "0")])
def test_turned_off_the_values_travel_through_the_pipe(big, stream_env, received, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    ds = shardstream.StreamingDataset(local=str(big), batch_size=8)
    check(ds, multiprocessing_context="fork")
    assert received[0] == 0


def test_a_ring_too_small_falls_back_mid_epoch_and_stays_exact(big, stream_env, received, monkeypatch):
    # Room for two values: a batch of 8 sends some through the ring and the rest as bytes.
    monkeypatch.setenv("SHARDSTREAM_WORKER_SAMPLE_ARENA", str(2 * EXTRA + EXTRA // 2))
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=4, batch_size=8)
    check(ds, multiprocessing_context="fork")
    assert 0 < received[0] < N


def test_persistent_workers_keep_sharing(big, stream_env, received):
    """The ring's space comes back as the training process reads: epoch after epoch, every
    value goes through it, and the one ring per worker is all that is ever mapped."""
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=5, batch_size=8)
    dl = DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True, multiprocessing_context="fork")
    for epoch in range(4):
        ids = []
        for batch in dl:
            for i, pad in zip(batch["id"].tolist(), batch["pad"]):
                assert type(pad) is bytes and pad == pad_bytes(i, EXTRA)
                ids.append(i)
        assert sorted(ids) == list(range(N)), epoch
    assert received[0] == 4 * N
    del dl
    gc.collect()
    assert ring_mappings() == []


def test_small_values_and_the_main_process_are_untouched(big, stream_env):
    ds = shardstream.StreamingDataset(local=str(big), batch_size=8)
    # Without workers the samples are the stream's own `bytes`.
    assert {type(s["pad"]) for s in ds} == {bytes}
    assert type(_transport.share({"a": b"x" * 10})["a"]) is bytes
    assert type(_transport.share({"a": b"x" * 70_000})["a"]) is _transport.SharedBytes


def test_plain_pickle_gives_bytes_and_no_ring_outside_workers():
    value = _transport.SharedBytes(b"\x01" * 100_000)
    assert isinstance(value, bytes) and value == b"\x01" * 100_000
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        again = pickle.loads(pickle.dumps(value, protocol=protocol))
        assert type(again) is bytes and again == value
    # multiprocessing's pickler outside a DataLoader worker: no ring, the bytes themselves.
    again = pickle.loads(ForkingPickler.dumps(value))
    assert type(again) is bytes and again == value
    assert ring_mappings() == []


def test_a_message_read_twice_is_refused(monkeypatch):
    """A ring made in this process (as a worker would) and read back: the second read of the
    same message could see overwritten bytes, and raises instead."""
    monkeypatch.setattr("shardstream._world.in_dataloader_worker", lambda: True)
    monkeypatch.setattr(_transport, "_ring_pid", 0)
    monkeypatch.setattr(_transport, "_ring", None)
    value = _transport.SharedBytes(os.urandom(200_000))
    try:
        message = ForkingPickler.dumps(value)
        ring = _transport._ring
        assert ring is not None and ring.pid == os.getpid()
        assert pickle.loads(message) == value
        with pytest.raises(RuntimeError, match="read twice"):
            pickle.loads(message)
    finally:
        if _transport._ring is not None:
            _transport._ring.close()
        _transport._ring, _transport._ring_pid = None, 0

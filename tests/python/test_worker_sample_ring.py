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
    """shardstream's entries in /dev/shm (the rings are memfds: there should never be any; the
    DataLoader's own `sem.mp-*` come and go with its queues)."""
    return {name for name in os.listdir("/dev/shm") if "shardstream" in name}


def ring_mappings() -> list[str]:
    """This process's mappings and descriptors of a ring (it should keep none between values)."""
    with open("/proc/self/maps") as f:
        found = [line for line in f if "shardstream-samples" in line]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "shardstream-samples" in target:
            found.append(target)
    return found


@pytest.mark.parametrize("ctx", ["fork", "spawn", "forkserver"])
def test_values_arrive_through_the_ring_as_plain_bytes(big, stream_env, received, ctx):
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=3, batch_size=8)
    mine = {s["id"]: s["pad"] for s in ds}  # the training process's own read, no workers
    assert all(v == pad_bytes(i, EXTRA) for i, v in mine.items())
    check(ds, multiprocessing_context=ctx, pin_memory=True)
    assert received[0] == N  # every `pad` through a ring, none through the pipe
    gc.collect()
    assert shm_entries() == set()
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


def test_no_ring_where_it_cannot_be_made(big, stream_env, received, monkeypatch):
    """A worker whose ring cannot be made (here: memfd refused) sends every value through the
    pipe; nothing fails and nothing waits."""

    def refuse(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", refuse)  # inherited by the forked workers
    ds = shardstream.StreamingDataset(local=str(big), shuffle=True, shuffle_seed=8, batch_size=8)
    check(ds, multiprocessing_context="fork")
    assert received[0] == 0


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


def test_ring_values_in_flight_never_overlap():
    """The worker's placement, driven at random (values of 1 B to 3 MiB, the reader taking one
    or several at a time): no value laid over one not yet read, none past the ring, and every
    value read back as laid."""
    import random

    for seed in range(30):
        rng = random.Random(seed)
        cap = rng.choice([1 << 16, 1 << 20, 5 << 20, 64 << 20])
        ring = _transport._Ring(cap)
        unread: list[tuple[int, int, int, int]] = []  # (end, at, n, byte)
        try:
            for _ in range(300):
                if unread and rng.random() < 0.45:
                    for _ in range(rng.randint(1, len(unread)) if rng.random() < 0.3 else 1):
                        end, at, n, b = unread.pop(0)
                        assert ring.map[at : at + n] == bytes([b]) * n, seed
                        _transport._U64.pack_into(ring.map, 0, end)
                n = rng.choice([1, 100, 4096, 65536, 300_000, 1 << 20, 3 << 20])
                b = rng.randrange(256)
                message = ring.put(bytes([b]) * n)
                if message is None:
                    continue
                _, _, _, at, n, end = message
                assert at + n <= _transport._HEADER + cap
                assert all(at + n <= a or a + m <= at for _, a, m, _ in unread), seed
                unread.append((end, at, n, b))
        finally:
            ring.close()


def test_ring_grows_only_as_the_values_in_flight_need():
    ring = _transport._Ring(256 << 20)
    try:
        value = b"\x07" * 100_000
        for _ in range(500):  # two values in flight at a time: 200 KB
            message = ring.put(value)
            assert message is not None
            if len(ring.flight) == 2:
                _transport._U64.pack_into(ring.map, 0, ring.flight[0][0])
        assert ring.size == 8 << 20
        ends = [ring.put(b"\x01" * (1 << 20))[-1] for _ in range(40)]  # 40 MiB unread
        assert all(ends) and ring.size == 64 << 20
    finally:
        ring.close()

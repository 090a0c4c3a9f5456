"""Large `bytes` values of samples cross from DataLoader workers through a shared ring.

A sample a DataLoader worker yields is collated (`default_collate` leaves `bytes` as a list),
pickled by the worker queue's feeder thread, written through a pipe, read back and unpickled in
the training process: four copies of every byte and a pipe round trip per 64 KiB. For 1 MB
samples that transport, not the read, bounded a `DataLoader(ds, batch_size=64, num_workers=2)`.

In a worker, `StreamingDataset` hands out each `bytes` value of at least `MIN_SHARED` bytes as a
`SharedBytes`: a `bytes` subclass, the same value for transforms and collate. Pickled by
`multiprocessing`'s `ForkingPickler` (the DataLoader's queues), its bytes are copied into the
worker's *ring*, a `memfd` the worker maps once, and the message carries only the ring's
address and where the value lies. The training process opens the ring (through
`/proc/<worker pid>/fd/<fd>`), reads the value out as a plain `bytes` with one `pread`, and
publishes how far it has read in the ring's header; the worker reuses that space. Plain `pickle`
(and any other pickler) gives ordinary `bytes`.

The ring is first in, first out: one worker's messages are pickled by one feeder thread and
unpickled in that order by the one process that reads its queue, so "consumed up to" is one
monotonic counter. A value that does not fit in the ring's free space (messages not yet read),
is too small, or has no ring (it could not be made, or this is not a worker) is pickled as plain
`bytes`: nothing ever waits for space, so no deadlock is possible. A reader that finds, after
copying, that the ring was consumed past the value's end (the message unpickled twice, or read
by a second process) raises instead of returning bytes that may have been overwritten.

Memory: a worker that yields large values makes its ring on the first one; the ring starts at
8 MiB and grows (doubling) only as the values in flight need, up to
`SHARDSTREAM_WORKER_SAMPLE_ARENA` (default `DEFAULT_ARENA`): about the bytes of the batches the
worker has queued, which its queue held before as objects waiting to be pickled. docs/python.md
("Large sample values from DataLoader workers") has the figures.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import threading
from collections import deque
from multiprocessing.reduction import ForkingPickler
from typing import Any

# A value smaller than this goes through the pipe (a reducer call and opening the ring cost more
# than copying it), as for the batch arena (pyo3-bindings/src/arena.rs).
MIN_SHARED = 64 * 1024
# The most a worker's ring grows to, by default (docs/python.md, "Large sample values from
# DataLoader workers": 64 samples of up to 2 MB at `prefetch_factor=2`).
DEFAULT_ARENA = 256 * 1024 * 1024
# Header: consumed (u64, written by the reader), magic, token, capacity; data after a page.
_HEADER = 4096
# The ring's first size; it grows as the values in flight need (`_Ring`).
_FIRST_SIZE = 8 * 1024 * 1024
_MAGIC = 0x5353_5352_494E_4731  # "SSSRING1"
# Native-order u64: struct's native codes move the 8 bytes with one aligned load or store (the
# standard-size ones, `<Q`, go byte by byte and could be seen half written).
_U64 = struct.Struct("@Q")
_FIXED = struct.Struct("@QQQQ")


class SharedBytes(bytes):
    """A `bytes` value that `multiprocessing`'s pickler sends through this worker's ring; it is
    `bytes` in every other way, and other picklers give plain `bytes`."""

    __slots__ = ()

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return bytes, (bytes(self),)


class _Ring:
    """The worker's ring: a memfd mapped once, written by the pickling thread(s).

    Values lie whole (never split at the end) between `[0, size)`; `size` starts small and grows
    (doubling, up to the memfd's `capacity`) only when a value finds no room while the values in
    flight do not wrap, so the pages the ring touches stay about twice the bytes in flight, not
    `capacity`. The worker keeps where each value in flight lies; the reader publishes how many
    bytes of values it has read (`consumed`, the `end` of the last message it read), which
    frees every value up to it."""

    def __init__(self, capacity: int) -> None:
        fd = os.memfd_create("shardstream-samples", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, _HEADER + capacity)
            self.map = mmap.mmap(fd, _HEADER + capacity)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.pid, self.capacity = fd, os.getpid(), capacity
        self.token = secrets.randbits(63)
        _FIXED.pack_into(self.map, 0, 0, _MAGIC, self.token, capacity)
        self.size = min(capacity, _FIRST_SIZE)
        self.sent = 0  # bytes of values ever laid: a message's `end` is this after it
        self.flight: deque[tuple[int, int, int]] = deque()  # (end, first byte, past last byte)
        self.lock = threading.Lock()

    def _place(self, n: int) -> int | None:
        """Where `n` bytes fit beside the values in flight, or None."""
        flight = self.flight
        if not flight:
            if n > self.capacity:
                return None
            self.size = max(self.size, n)
            return 0
        oldest, newest = flight[0][1], flight[-1][2]
        if flight[-1][1] >= oldest:  # in flight: [oldest, newest), not wrapped
            if newest + n <= self.size:
                return newest
            if n <= oldest:  # wrap to the start
                return 0
            if newest + n <= self.capacity:  # grow
                self.size = min(self.capacity, max(2 * self.size, newest + n))
                return newest
            return None
        # Wrapped: in flight are [oldest, size) and [0, newest).
        return newest if newest + n <= oldest else None

    def put(self, value: bytes) -> tuple | None:
        """Lays `value` in the ring: the message that names it, or None where it does not fit."""
        n = len(value)
        with self.lock:
            (consumed,) = _U64.unpack_from(self.map, 0)
            flight = self.flight
            while flight and flight[0][0] <= consumed:
                flight.popleft()
            at = self._place(n)
            if at is None:
                return None
            self.map[_HEADER + at : _HEADER + at + n] = value
            self.sent += n
            flight.append((self.sent, at, at + n))
            return (self.pid, self.fd, self.token, _HEADER + at, n, self.sent)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


_ring: _Ring | None = None
_ring_pid = 0  # the process whose ring `_ring` is, or that found it could not make one
_ring_lock = threading.Lock()


def worker_shm_enabled() -> bool:
    """Whether DataLoader workers may hand data to the training process through shared memory
    (`SHARDSTREAM_WORKER_SHM`, on unless `0`/`false`/`no`/`off`): the batch arena's column
    batches and this module's ring."""
    return os.environ.get("SHARDSTREAM_WORKER_SHM", "1").strip().lower() not in ("0", "false", "no", "off")


def arena_size() -> int:
    """The ring size `SHARDSTREAM_WORKER_SAMPLE_ARENA` asks for (0: off; also off with
    `SHARDSTREAM_WORKER_SHM=0`)."""
    if not worker_shm_enabled():
        return 0
    text = os.environ.get("SHARDSTREAM_WORKER_SAMPLE_ARENA")
    if text is None or not text.strip():
        return DEFAULT_ARENA
    from ._units import parse_bytes

    return parse_bytes(text.strip(), "SHARDSTREAM_WORKER_SAMPLE_ARENA") or 0


def _worker_ring() -> _Ring | None:
    """This worker's ring, made on first use; None where it cannot be (and then never again)."""
    global _ring, _ring_pid
    pid = os.getpid()
    with _ring_lock:
        if _ring_pid == pid:
            return _ring
        _ring, _ring_pid = None, pid
        from ._world import in_dataloader_worker

        if in_dataloader_worker() and arena_size() >= MIN_SHARED:
            _ring = _Ring(arena_size())
        return _ring


def _reduce(value: SharedBytes) -> tuple:
    """How `ForkingPickler` sends a `SharedBytes`: through the ring where there is one and room,
    else as `bytes`. It never raises: it runs in the queue's feeder thread, where an exception
    would lose the batch (the DataLoader would wait for it forever)."""
    if len(value) >= MIN_SHARED:
        try:
            ring = _ring if _ring_pid == os.getpid() else _worker_ring()
            message = ring.put(value) if ring is not None else None
        except Exception:  # no ring (memfd refused, a bad size, ...): the pipe
            message = None
        if message is not None:
            return _rebuild, message
    return bytes, (bytes(value),)


ForkingPickler.register(SharedBytes, _reduce)


def _not_ours(path: str) -> RuntimeError:
    return RuntimeError(f"shardstream: {path} is not the DataLoader worker's sample ring (did the worker exit?)")


def _twice() -> RuntimeError:
    # Consumed past this value before or while it was copied: it may have been overwritten. One
    # DataLoader reads each message once, in order; this is a message read twice, or by a second
    # process.
    return RuntimeError(
        "shardstream: a sample value from a DataLoader worker's ring was read twice or out of "
        "order; set SHARDSTREAM_WORKER_SAMPLE_ARENA=0 where messages are relayed"
    )


def _rebuild(*message: int) -> bytes:
    """Unpickles a value sent through a worker's ring (a name pickles refer to)."""
    return _read(*message)


def _read(pid: int, fd: int, token: int, at: int, n: int, end: int) -> bytes:
    """The training process's side: the value's bytes, read out of the worker's ring.

    The ring is opened, read and closed per value, so this process holds nothing of a worker's
    ring between values (no mapping outlives the worker; nothing is inherited by a fork); that
    measured as fast as keeping it mapped (docs/python-internals.md). The value is read with
    `pread` and "consumed" stored after it: the kernel's read path ends with a fully ordered
    atomic (dropping its page reference), so the worker cannot see the new "consumed" before the
    value's bytes were read, on any architecture. The worker reads "consumed" before it writes
    (its writes depend on it), and writes only past it."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise RuntimeError(
            f"shardstream: cannot open the DataLoader worker's sample ring {path} ({e}); "
            "set SHARDSTREAM_WORKER_SAMPLE_ARENA=0 to send samples through the pipe"
        ) from e
    try:
        try:
            header = mmap.mmap(own, _HEADER)
        except (OSError, ValueError) as e:
            raise _not_ours(path) from e
        try:
            _, magic, got, _ = _FIXED.unpack_from(header, 0)
            if magic != _MAGIC or got != token:
                raise _not_ours(path)
            value = os.pread(own, n, at)
            (consumed,) = _U64.unpack_from(header, 0)
            if consumed >= end:
                raise _twice()
            if len(value) != n:
                raise _not_ours(path)
            _U64.pack_into(header, 0, end)
        finally:
            header.close()
    finally:
        os.close(own)
    return value


def _forget_after_fork() -> None:
    """A child forked in a worker drops the worker's ring (it makes its own if it needs one): the
    mapping and descriptor it inherited would keep the ring's memory after the worker exits."""
    global _ring, _ring_pid, _ring_lock
    if _ring is not None:
        _ring.close()
    _ring, _ring_pid = None, 0
    _ring_lock = threading.Lock()  # (the fork may have happened while a thread held it)


os.register_at_fork(after_in_child=_forget_after_fork)


def share(sample: Any) -> Any:
    """`sample` (a dict from the stream) with its large `bytes` values as `SharedBytes`."""
    if type(sample) is not dict:
        return sample
    for key, value in sample.items():
        if type(value) is bytes and len(value) >= MIN_SHARED:
            sample[key] = SharedBytes(value)
    return sample

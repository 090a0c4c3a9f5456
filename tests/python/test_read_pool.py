"""The read buffers a process keeps across datasets (docs/streaming.md, Memory): a script that
opens a new dataset each epoch reads into the allocations the previous one let go of. Samples
still held from an earlier dataset are never overwritten by the next one's reads, and a fork
(a DataLoader starting its workers) frees the kept buffers, so that neither the training process
nor the workers carry them through the epoch, while samples the parent holds at the fork are the
child's too."""

from __future__ import annotations

import gc
import os

import pytest

import shardstream
from conftest import pad_bytes, write_ids

N = 3000
EXTRA = 10_000  # bytes of the `pad` column per sample: 30 MB in all, read in runs of 1 MiB


def pad_of(i: int) -> bytes:
    return pad_bytes(i, EXTRA)


@pytest.fixture(scope="module")
def tenk(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool") / "mds"
    write_ids(root, N, size_limit=4 << 20, extra=EXTRA)
    return root


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_samples_held_from_a_dropped_dataset_keep_their_bytes(tenk, stream_env):
    first = shardstream.StreamingDataset(local=str(tenk), zero_copy=True)
    held = [s["pad"] for s in first if s["id"] % 7 == 0]
    del first
    gc.collect()
    # A new dataset of the same limit reads into the allocations the first one let go of.
    second = shardstream.StreamingDataset(local=str(tenk), zero_copy=True, shuffle=True)
    seen = sorted(s["id"] for s in second)
    assert seen == list(range(N))
    assert [bytes(b) for b in held] == [pad_of(i) for i in range(0, N, 7)]


def fork_and_run(child) -> None:
    """Runs `child()` in a forked process, which exits 0 when it returns True; waits for it."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child failed"


def test_a_fork_frees_the_kept_read_buffers(tenk, stream_env):
    for _ in range(2):  # the second dataset reads into the first one's kept buffers
        ds = shardstream.StreamingDataset(local=str(tenk))
        assert sum(1 for _ in ds) == N
        del ds
        gc.collect()
    rfd, wfd = os.pipe()

    def child() -> bool:
        os.write(wfd, f"{rss_mib()}".encode())
        return True

    before = rss_mib()
    fork_and_run(child)
    after = rss_mib()
    os.close(wfd)
    in_child = float(os.read(rfd, 64).decode())
    os.close(rfd)
    # The pool of the default 512 MiB limit keeps up to 16 MiB; these reads (1 MiB runs, each its
    # own mapping) leave 12-16 MiB in it. A DataLoader's workers make their own pools, and while
    # they read the training process does not: the fork unmaps them, in the parent and so in the
    # child.
    assert before - after >= 8, f"RSS {before:.1f} MiB before the fork, {after:.1f} after it"
    assert before - in_child >= 8, f"RSS {before:.1f} MiB in the parent, {in_child:.1f} in the child"
    ds = shardstream.StreamingDataset(local=str(tenk))
    assert sum(1 for _ in ds) == N, "the parent's next reads map new buffers"


def test_samples_held_across_a_fork_are_the_childs_too(tenk, stream_env):
    ds = shardstream.StreamingDataset(local=str(tenk), zero_copy=True)
    # Hold samples of the first runs only: the rest of the epoch's runs go back to the pool and
    # are unmapped at the fork; these stay mapped in both.
    held = [(s["id"], s["pad"]) for s in ds if s["id"] < 300 and s["id"] % 7 == 0]
    del ds
    gc.collect()

    def child() -> bool:
        if any(bytes(buf) != pad_of(i) for i, buf in held):
            return False
        # The child's own reads never get a buffer it did not inherit.
        mine = shardstream.StreamingDataset(local=str(tenk), zero_copy=True, shuffle=True)
        seen = []
        for s in mine:
            if bytes(s["pad"]) != pad_of(s["id"]):
                return False
            seen.append(s["id"])
        return sorted(seen) == list(range(N))

    for _ in range(3):
        fork_and_run(child)
        # The parent's next reads map new buffers (the fork unmapped the kept ones), and go
        # back to the pool: the next child must see the samples held from them too.
        again = shardstream.StreamingDataset(local=str(tenk), zero_copy=True)
        seen = []
        for s in again:
            assert s["pad"] == pad_of(s["id"])
            seen.append(s["id"])
            if s["id"] % 500 == 0:
                held.append((s["id"], s["pad"]))
        assert seen == list(range(N))
        del again, s
        gc.collect()
    assert all(bytes(buf) == pad_of(i) for i, buf in held)


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    root = tmp_path_factory.mktemp("large") / "mds"
    write_ids(root, 12, size_limit=8 << 20, extra=1_200_000)
    return root


def calls_of(ds) -> list[list[int]]:
    """The ids each `next_samples(64)` call of a whole stream of `ds` returned."""
    stream, _ = ds._stream(64, raw=False)
    calls = []
    try:
        while got := stream.next_samples(64):
            calls.append([s["id"] for s in got])
    finally:
        stream.close()
    return calls


def test_large_samples_are_turned_into_objects_a_mebibyte_at_a_time(large, tenk, stream_env):
    # With batch_size=64, each call into the engine used to make every sample that had arrived
    # into a `bytes` at once (a dozen 1.2 MB objects alive together), which malloc served by
    # growing and trimming its heap: fresh pages, faulted in, for every sample (docs/python.md).
    calls = calls_of(shardstream.StreamingDataset(local=str(large), batch_size=64))
    assert all(len(c) == 1 for c in calls), calls
    assert [c[0] for c in calls] == list(range(12))
    # Small samples still come a batch at a time once they have arrived, and the iterator
    # yields every sample exactly once whatever the calls returned.
    sizes = [len(c) for c in calls_of(shardstream.StreamingDataset(local=str(tenk), batch_size=64))]
    assert max(sizes) == 64 and sum(sizes) == N
    big = shardstream.StreamingDataset(local=str(large), batch_size=64, shuffle=True)
    seen = [(s["id"], s["pad"]) for s in big]
    assert sorted(i for i, _ in seen) == list(range(12))
    assert all(pad == pad_bytes(i, 1_200_000) for i, pad in seen)

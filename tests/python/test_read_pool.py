"""The read buffers a process keeps across datasets (docs/streaming.md, Memory): a script that
opens a new dataset each epoch reads into the allocations the previous one let go of. Samples
still held from an earlier dataset are never overwritten by the next one's reads, and a fork
(a DataLoader starting its workers) frees the kept buffers first, so that the workers do not
carry them."""

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


def test_a_fork_frees_the_kept_read_buffers(tenk, stream_env):
    for _ in range(2):  # the second dataset reads into the first one's kept buffers
        ds = shardstream.StreamingDataset(local=str(tenk))
        assert sum(1 for _ in ds) == N
        del ds
        gc.collect()
    before = rss_mib()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = rss_mib()
    # The pool of the default 512 MiB limit keeps up to 16 MiB; these reads leave 12-16 MiB in it,
    # and the hook hands them back to the kernel (malloc_trim), not only to malloc.
    assert before - after >= 8, f"RSS {before:.1f} MiB before the fork, {after:.1f} after"
    ds = shardstream.StreamingDataset(local=str(tenk))
    assert sum(1 for _ in ds) == N, "the pool fills again after the fork"

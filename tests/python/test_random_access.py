"""Random access (`ds[i]`) reads each sample right whatever the order, keeps few shards open, and
is safe across a fork.

`ds[i]` keeps the last shards it opened (pinned, a few, within a sixteenth of the cache limit)
and reads a sample of one of them, or of a shard it can open without the network, on the calling
thread. These tests check what that must not
change: every sample's bytes in a random order over more shards than are kept, the same for a
remote dataset whose shards are fetched on first access, a cache limit that random access must
not fill with pins, and DataLoader workers forked after the main process read a sample itself
(its kept shard, most likely still downloading, is not the workers').
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest

from conftest import pad_bytes, write_ids

N = 1200
EXTRA = 300


def check(sample: dict, i: int) -> None:
    assert int(sample["id"]) == i
    assert int(sample["x"]) == 3 * i
    assert sample["pad"] == pad_bytes(i, EXTRA)


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("random-access") / "ds"
    write_ids(out, N, size_limit=1 << 14, extra=EXTRA)  # about 50 shards
    return out


def test_every_sample_in_a_random_order_over_many_shards(local_ds, stream_env):
    import shardstream

    ds = shardstream.StreamingDataset(local=str(local_ds))
    assert ds.num_shards > 16  # more than random access keeps open
    order = list(range(N))
    random.Random(7).shuffle(order)
    for i in order:
        check(ds[i], i)
    # And again in order, then backwards (each shard reopened after the others).
    for i in list(range(N)) + list(reversed(range(N))):
        check(ds[i], i)
    with pytest.raises(IndexError):
        ds[N]


def test_a_remote_dataset_at_random_fetches_each_shard_once(moto, local_ds, stream_env, monkeypatch):
    import shardstream

    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    remote = moto.upload_dataset(local_ds, "random-access")
    ds = shardstream.StreamingDataset(remote=remote)
    order = list(range(N))
    random.Random(11).shuffle(order)
    for i in order:
        check(ds[i], i)
    m = ds.metrics()
    # Each shard came from the server once; the rest were cache hits or kept handles.
    assert m["shards_fetched"] == ds.num_shards, m


def test_random_access_pins_little_of_the_cache_limit(moto, local_ds, stream_env, monkeypatch):
    """Shards kept open for random access are pinned. With a cache limit of six shards, random
    access over every shard followed by a full epoch of the same dataset must find room: if
    random access kept its last eight shards pinned, the epoch could evict nothing and failed
    (checked by removing the bound)."""
    import shardstream

    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    remote = moto.upload_dataset(local_ds, "random-access-limit")
    shard_bytes = max(f.stat().st_size for f in local_ds.glob("shard.*.mds"))
    ds = shardstream.StreamingDataset(remote=remote, cache_limit=6 * shard_bytes, batch_size=4)
    for i in range(0, N, 7):
        check(ds[i], i)
    seen = set()
    for s in ds:
        check(s, int(s["id"]))
        seen.add(int(s["id"]))
    assert seen == set(range(N))


BIG = 30_000  # bytes of `pad` in the fork test's dataset: one shard of 30 MB, still
BIG_N = 1000  # downloading in the main process when its DataLoader forks

FORKED = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch.utils.data import DataLoader, Dataset
    import shardstream
    extra = int(sys.argv[2])
    ds = shardstream.StreamingDataset(remote=sys.argv[1])
    # The main process reads a sample first: its shard stays open in it, most likely still
    # downloading when the workers fork (a handle that would wait forever in a worker).
    ds[0]

    class ByIndex(Dataset):
        def __len__(self):
            return len(ds)
        def __getitem__(self, i):
            s = ds[i]
            return int(s["id"]), int(s["x"]), s["pad"]

    loader = DataLoader(ByIndex(), batch_size=16, num_workers=2, shuffle=True,
                        multiprocessing_context="fork", collate_fn=lambda b: b)
    out = []
    for batch in loader:
        for i, x, pad in batch:
            if x != 3 * i or pad != bytes([i % 251]) * extra:
                raise SystemExit(f"sample {i} has the wrong bytes")
            out.append(i)
    for i in (1, 500, 999):  # and the main process again, after the workers
        s = ds[i]
        if int(s["x"]) != 3 * i or s["pad"] != bytes([i % 251]) * extra:
            raise SystemExit(f"sample {i} has the wrong bytes in the main process")
    print(json.dumps(out))
    """
)


def test_forked_dataloader_workers_read_by_index_after_the_main_process_did(moto, tmp_path, stream_env):
    import json
    import os

    data = tmp_path / "big"
    write_ids(data, BIG_N, size_limit=32 << 20, extra=BIG)
    remote = moto.upload_dataset(data, "random-access-fork")
    env = dict(os.environ)
    env.update(moto.env)
    res = subprocess.run([sys.executable, "-c", FORKED, remote, str(BIG)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert sorted(seen) == list(range(BIG_N))

"""The shuffle's ramp (docs/sample-order.md, step 4): a shuffled epoch's first block is one shard,
so its first batch waits for one shard instead of a whole window, and that shard is shuffled in
parts that halve towards its start (the sample ramp), so that the first batch waits for the
shard's first few percent; `shuffle_ramp=False` keeps full-size blocks from the start; and a
state saved without a ramp (turned off, or written before the setting existed) resumes in the
order it was saved in."""

from __future__ import annotations

import bisect
import json

import shardstream
from conftest import write_ids

N = 400
BATCH = 8


def _dataset(tmp_path):
    root = tmp_path / "mds"
    write_ids(root, N, size_limit=600)  # ~20 samples per shard, ~20 shards
    index = json.loads((root / "index.json").read_text())
    starts = [0]
    for shard in index["shards"]:
        starts.append(starts[-1] + shard["samples"])
    assert starts[-1] == N and len(starts) > 17, "the test wants more shards than one window"
    return root, starts


def _shard_of(starts: list[int], sample_id: int) -> int:
    return bisect.bisect_right(starts, sample_id) - 1


def test_a_shuffled_epoch_starts_with_one_shard_then_two(tmp_path, stream_env):
    root, starts = _dataset(tmp_path)
    ds = shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH)
    ids = [s["id"] for s in ds]
    assert sorted(ids) == list(range(N))
    shards = [_shard_of(starts, i) for i in ids]
    first = shards[0]
    first_len = starts[first + 1] - starts[first]
    # The first block is one whole shard, shuffled within itself ...
    assert set(shards[:first_len]) == {first}
    assert ids[:first_len] != sorted(ids[:first_len]), "the first shard was not shuffled"
    # ... and the next block is two whole shards, mixed.
    seen: set[int] = set()
    for end in range(first_len, N):
        seen.add(shards[end])
        assert len(seen) <= 2, f"a third shard came before the second block's two were done: {seen}"
        if len(seen) == 2 and end + 1 - first_len == sum(starts[s + 1] - starts[s] for s in seen):
            break
    else:
        raise AssertionError("the second block never completed two shards")
    block = shards[first_len:end + 1]
    assert block != sorted(block) and block != sorted(block, reverse=True), "two shards, not mixed"


def test_without_the_ramp_the_first_batch_mixes_the_window(tmp_path, stream_env):
    root, starts = _dataset(tmp_path)
    ds = shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH, shuffle_ramp=False
    )
    ids = [s["id"] for s in ds]
    assert sorted(ids) == list(range(N))
    first_batches = {_shard_of(starts, i) for i in ids[: 4 * BATCH]}
    assert len(first_batches) >= 8, f"32 samples of a 16-shard block came from {first_batches}"


def test_a_state_without_the_ramp_resumes_without_it(tmp_path, stream_env):
    root, _ = _dataset(tmp_path)
    flat = shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH, shuffle_ramp=False
    )
    expected = [s["id"] for s in flat]
    ramped = [s["id"] for s in shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH
    )]
    assert ramped != expected, "the ramp did not change the order"
    flat.set_epoch(0)
    state = flat.state_dict(num_samples=120, from_beginning=True)
    assert state["shardstream"]["config"]["ramp"] is False
    # Version 1, which builds before the ramp read; a state with the ramps is version 3, which
    # they refuse instead of resuming it in their order.
    assert state["shardstream"]["version"] == 1
    assert shardstream.StreamingDataset(
        local=str(root), shuffle=True, batch_size=BATCH
    ).state_dict(num_samples=0)["shardstream"]["version"] == 3
    # A state written before the setting existed has no `ramp` at all.
    old = json.loads(json.dumps(state))
    del old["shardstream"]["config"]["ramp"]
    del old["shardstream"]["config"]["sample_ramp"]
    for saved in (state, old):
        resumed = shardstream.StreamingDataset(local=str(root), batch_size=BATCH)
        resumed.load_state_dict(saved)
        assert [s["id"] for s in resumed] == expected[120:]


def _one_big_shard(tmp_path):
    root = tmp_path / "big"
    write_ids(root, 1000, size_limit=1 << 20)  # one shard of 1000 samples
    assert len(json.loads((root / "index.json").read_text())["shards"]) == 1
    return root


def test_the_first_shard_is_shuffled_in_parts_that_halve_towards_its_start(tmp_path, stream_env):
    root = _one_big_shard(tmp_path)
    ids = [s["id"] for s in shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH
    )]
    # Parts of 1000 samples: 0-124, 125-249, 250-499, 500-999, each shuffled on its own.
    for lo, hi in ((0, 125), (125, 250), (250, 500), (500, 1000)):
        part = ids[lo:hi]
        assert sorted(part) == list(range(lo, hi)), f"part {lo}..{hi}"
        assert part != sorted(part), f"part {lo}..{hi} was not shuffled"
    flat = [s["id"] for s in shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH, shuffle_ramp=False
    )]
    assert sorted(flat) == list(range(1000))
    assert max(flat[:125]) > 500, "without the ramp the first samples span the shard"


def test_a_state_from_before_the_sample_ramp_resumes_without_it(tmp_path, stream_env):
    root = _one_big_shard(tmp_path)
    ds = shardstream.StreamingDataset(local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH)
    ramped = [s["id"] for s in ds]
    ds.set_epoch(0)
    state = ds.state_dict(num_samples=40, from_beginning=True)
    assert state["shardstream"]["version"] == 3
    assert state["shardstream"]["config"]["sample_ramp"] is True
    # What the build before the sample ramp wrote: version 2, a shard ramp, no `sample_ramp`.
    old = json.loads(json.dumps(state))
    old["shardstream"]["version"] = 2
    del old["shardstream"]["config"]["sample_ramp"]
    resumed = shardstream.StreamingDataset(local=str(root), batch_size=BATCH)
    resumed.load_state_dict(old)
    rest = [s["id"] for s in resumed]
    assert len(rest) == 960
    assert rest != ramped[40:], "a version 2 state resumed in the sample ramp's order"
    # One shard is one block with or without the shard ramp: that build's order is the flat one.
    flat = [s["id"] for s in shardstream.StreamingDataset(
        local=str(root), shuffle=True, shuffle_seed=3, batch_size=BATCH, shuffle_ramp=False
    )]
    assert rest == flat[40:]
    again = shardstream.StreamingDataset(local=str(root), batch_size=BATCH)
    again.load_state_dict(state)
    assert [s["id"] for s in again] == ramped[40:]

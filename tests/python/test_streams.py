"""`streams=`: several MDS datasets mixed as mosaicml-streaming's `Stream`s (`proportion`, `repeat`,
`choose`, `epoch_size`). Through a DataLoader with 2 workers the epoch is deterministic, holds the
number of samples Mosaic computes, and each stream contributes what Mosaic's own
`StreamingDataset` yields for the same arguments on the same (MDSWriter-written) data."""

from __future__ import annotations

from collections import Counter

import pytest
from torch.utils.data import DataLoader

import shardstream

A_N, B_N = 120, 40
BATCH = 4


def _write(out, src: str, n: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "src": "str"}, size_limit=400) as w:
        for i in range(n):
            w.write({"id": i, "src": src})


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    _write(root / "a", "a", A_N)
    _write(root / "b", "b", B_N)
    return root


def _ours(root, weights: list[dict], epoch: int = 0, workers: int = 2, **kw) -> list[tuple[str, int]]:
    streams = [shardstream.Stream(local=str(root / name), **w) for name, w in zip("ab", weights)]
    ds = shardstream.StreamingDataset(streams=streams, shuffle=True, shuffle_seed=5,
                                      batch_size=BATCH, **kw)
    ds.set_epoch(epoch)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers,
                        multiprocessing_context="fork" if workers else None,
                        collate_fn=lambda batch: batch)
    return [(s["src"], int(s["id"])) for batch in loader for s in batch]


def _mosaic(root, weights: list[dict], **kw) -> list[tuple[str, int]]:
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    streams = [Stream(local=str(root / name), **w) for name, w in zip("ab", weights)]
    ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=5, batch_size=BATCH,
                          num_canonical_nodes=1, **kw)
    return [(s["src"], int(s["id"])) for s in ds]


def _profile(samples: list[tuple[str, int]]) -> dict:
    """Per stream: how many samples, and how many distinct ids appear 1, 2, ... times."""
    out = {}
    for src in "ab":
        ids = Counter(i for s, i in samples if s == src)
        out[src] = (sum(ids.values()), sorted(Counter(ids.values()).items()))
    return out


CASES = {
    # Relative: the epoch (all samples, 160) split 1:1 -> 80 of A's 120, B's 40 twice each.
    "proportion": ([{"proportion": 1.0}, {"proportion": 1.0}], {}),
    # Relative with an epoch size: 100 split 3:1.
    "proportion+epoch_size": ([{"proportion": 3.0}, {"proportion": 1.0}], {"epoch_size": 100}),
    # Absolute: half of A, and 50 of B (each once plus 10 twice).
    "repeat+choose": ([{"repeat": 0.5}, {"choose": 50}], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_mix_matches_mosaic_per_stream(two, stream_env, case):
    weights, kw = CASES[case]
    ours = _ours(two, weights, **kw)
    theirs = _mosaic(two, weights, **kw)
    assert len(ours) == len(theirs), "epoch size differs from Mosaic's"
    assert _profile(ours) == _profile(theirs)
    ds = shardstream.StreamingDataset(
        streams=[shardstream.Stream(local=str(two / n), **w) for n, w in zip("ab", weights)], **kw
    )
    assert ds.samples_per_stream == [A_N, B_N]
    assert ds.epoch_size == len(theirs) and len(ds) == len(theirs)
    assert sum(ds.choose_per_stream) == len(theirs)


def test_mix_is_deterministic_and_epochs_differ(two, stream_env):
    weights = [{"proportion": 1.0}, {"proportion": 1.0}]
    first = _ours(two, weights, epoch=0)
    assert _ours(two, weights, epoch=0) == first, "same seed and epoch, another order"
    # The same sequence whatever the number of workers (the order does not depend on the world).
    assert _ours(two, weights, epoch=0, workers=0) == first
    second = _ours(two, weights, epoch=1)
    assert second != first
    assert _profile(second) == _profile(first) == {
        "a": (80, [(1, 80)]),
        "b": (80, [(2, 40)]),
    }
    # Balanced sampling: the 80 of A's 120 change from epoch to epoch.
    assert {i for s, i in first if s == "a"} != {i for s, i in second if s == "a"}


def test_fixed_sampling_keeps_the_subset_every_epoch(two, stream_env):
    """Mosaic's `sampling_method="fixed"`: a partial repeat keeps the same samples each epoch
    (in a new order), where "balanced" draws a fresh subset; the per-stream counts are Mosaic's."""
    weights = [{"proportion": 1.0}, {"proportion": 1.0}]  # 80 of A's 120 each epoch
    subsets = {}
    for method in ("fixed", "balanced"):
        epochs = [_ours(two, weights, epoch=e, sampling_method=method) for e in range(3)]
        subsets[method] = [frozenset(i for s, i in epoch if s == "a") for epoch in epochs]
        assert all(len(sub) == 80 for sub in subsets[method])
        assert epochs[0] != epochs[1]  # each epoch its own order either way
        assert _profile(epochs[0]) == _profile(_mosaic(two, weights, sampling_method=method))
    assert len(set(subsets["fixed"])) == 1
    assert len(set(subsets["balanced"])) == 3
    # Through DataLoader workers the same as in one process.
    assert _ours(two, weights, epoch=1, workers=0, sampling_method="fixed") == _ours(
        two, weights, epoch=1, sampling_method="fixed")
    with pytest.raises(ValueError, match="sampling_method"):
        shardstream.StreamingDataset(local=str(two / "a"), sampling_method="random")
    # A state names its sampling: it resumes only a dataset that samples the same way.
    fixed = shardstream.StreamingDataset(streams=[shardstream.Stream(local=str(two / n), **w)
                                                  for n, w in zip("ab", weights)], sampling_method="fixed")
    balanced = shardstream.StreamingDataset(streams=[shardstream.Stream(local=str(two / n), **w)
                                                     for n, w in zip("ab", weights)])
    with pytest.raises(ValueError, match="fingerprint"):
        balanced.load_state_dict(fixed.state_dict(10))


def test_stream_arguments_are_checked(two, stream_env):
    with pytest.raises(ValueError, match="At most one"):
        shardstream.Stream(local=str(two / "a"), proportion=1.0, choose=3)
    with pytest.raises(ValueError, match="non-negative"):
        shardstream.Stream(local=str(two / "a"), repeat=-1.0)
    with pytest.raises(ValueError, match="either streams or remote/local"):
        shardstream.StreamingDataset(local=str(two / "a"), streams=[shardstream.Stream(local=str(two / "b"))])
    # Relative and absolute weights cannot be mixed (the engine's check, as Mosaic's).
    with pytest.raises(ValueError, match="cannot be"):
        shardstream.StreamingDataset(streams=[
            shardstream.Stream(local=str(two / "a"), proportion=1.0),
            shardstream.Stream(local=str(two / "b"), choose=3),
        ])


@pytest.mark.parametrize("case", ["proportion", "repeat+choose"])
def test_mosaic_stream_objects_are_taken_as_they_are(two, stream_env, case):
    """A mix built with Mosaic's own `streaming.Stream` (the switch changes only the
    dataset's import) gives the same epoch as the same mix of `shardstream.Stream`s."""
    from streaming import Stream as MosaicStream

    weights, kw = CASES[case]
    theirs = [MosaicStream(local=str(two / n), **w) for n, w in zip("ab", weights)]
    ds = shardstream.StreamingDataset(streams=theirs, shuffle=True, shuffle_seed=5, batch_size=BATCH, **kw)
    got = [(s["src"], int(s["id"])) for s in ds]
    assert got == _ours(two, weights, workers=0, **kw)
    with pytest.raises(TypeError, match="streams must hold"):
        shardstream.StreamingDataset(streams=[str(two / "a")])


def test_layout_attributes_equal_mosaics(two, stream_env):
    """Mosaic's layout attributes (code that maps a sample index to its shard or stream reads
    them) hold the same values, as int64 arrays, for a two-stream mix."""
    import numpy as np
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    ours = shardstream.StreamingDataset(streams=[shardstream.Stream(local=str(two / n)) for n in "ab"],
                                        batch_size=BATCH)
    clean_stale_shared_memory()
    theirs = StreamingDataset(streams=[Stream(local=str(two / n)) for n in "ab"], batch_size=BATCH)
    for name in ("samples_per_shard", "sample_offset_per_shard", "shards_per_stream",
                 "shard_offset_per_stream", "sample_offset_per_stream", "stream_per_shard"):
        got, want = getattr(ours, name), getattr(theirs, name)
        assert isinstance(got, np.ndarray) and got.dtype == np.int64, name
        assert got.tolist() == np.asarray(want).tolist(), name
    for name in ("num_shards", "num_streams", "size", "length"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_item(A_N + 3) == {"id": 3, "src": "b"} == theirs.get_item(A_N + 3)


@pytest.mark.parametrize("epoch_size", [300, 50])
def test_epoch_size_resizes_a_lone_dataset_as_mosaic(two, stream_env, epoch_size):
    """`epoch_size` without `streams` (it was ignored: every epoch held the dataset once): the
    epoch has that many samples, each sample `f` times plus a fresh subset, as in Mosaic."""
    from streaming import StreamingDataset as MosaicDataset
    from streaming.base.util import clean_stale_shared_memory

    a = str(two / "a")
    ds = shardstream.StreamingDataset(local=a, epoch_size=epoch_size, shuffle=True, batch_size=BATCH)
    ours = Counter(int(s["id"]) for s in ds)
    clean_stale_shared_memory()
    ref = MosaicDataset(local=a, epoch_size=epoch_size, shuffle=True, batch_size=BATCH, num_canonical_nodes=1)
    theirs = Counter(int(s["id"]) for s in ref)
    assert len(ds) == ds.epoch_size == len(ref) == epoch_size
    assert sum(ours.values()) == sum(theirs.values()) == epoch_size
    assert sorted(Counter(ours.values()).items()) == sorted(Counter(theirs.values()).items())


def test_mosaic_stream_name_and_config(two, stream_env):
    """Mosaic 0.13's `stream_name`/`stream_config`: its MDS stream ('stream') with extra Stream
    arguments; a `repeat` sizes the epoch as Mosaic's does, and other stream kinds are refused."""
    from streaming import StreamingDataset as MosaicDataset
    from streaming.base.util import clean_stale_shared_memory

    a = str(two / "a")
    ds = shardstream.StreamingDataset(local=a, stream_name="stream", stream_config={"repeat": 2.0}, batch_size=BATCH)
    clean_stale_shared_memory()
    ref = MosaicDataset(local=a, stream_name="stream", stream_config={"repeat": 2.0}, batch_size=BATCH)
    assert len(ds) == len(ref) == 2 * A_N
    assert Counter(Counter(int(s["id"]) for s in ds).values()) == {2: A_N}
    plain = shardstream.StreamingDataset(local=a, stream_config={"download_retry": 3, "local": "/elsewhere"})
    assert plain.local == a and len(plain) == A_N
    with pytest.raises(ValueError, match="stream_name='delta_sql' is not supported"):
        shardstream.StreamingDataset(local=a, stream_name="delta_sql")


def test_remote_streams_through_the_cache(two, stream_env, moto, monkeypatch):
    """Streams on the local S3 server, cached in the run's node cache: DataLoader workers (which
    open their own storage clients) stream the same mix as local streams do."""
    import boto3

    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto.create_bucket("two-streams")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for name in "ab":
        for f in (two / name).iterdir():
            s3.upload_file(str(f), bucket[len("s3://"):], f"{name}/{f.name}")
    weights = [{"repeat": 0.5}, {"choose": 50}]
    streams = [shardstream.Stream(remote=f"{bucket}/{n}", **w) for n, w in zip("ab", weights)]
    ds = shardstream.StreamingDataset(streams=streams, shuffle=True, shuffle_seed=5, batch_size=BATCH)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2, multiprocessing_context="fork",
                        collate_fn=lambda batch: batch)
    remote = [(s["src"], int(s["id"])) for batch in loader for s in batch]
    assert remote == _ours(two, weights), "remote streams gave another mix than local ones"
    cached = [p for p in __import__("pathlib").Path(ds.cache_dir).rglob("*") if p.is_file()]
    assert cached, "the remote streams' shards were not cached in the run's node cache"


def test_paths_may_be_pathlib(two, stream_env, tmp_path):
    """`remote`, `local` and `cache_root` (of a dataset or a stream) may be `pathlib.Path`s."""
    ds = shardstream.StreamingDataset(local=two / "a", cache_root=tmp_path / "root")
    assert ds.local == str(two / "a") and len(list(ds)) == A_N
    ds = shardstream.StreamingDataset(remote=two / "b")
    assert sorted(int(s["id"]) for s in ds) == list(range(B_N))
    mix = shardstream.StreamingDataset(streams=[shardstream.Stream(local=two / n) for n in "ab"])
    assert mix.samples_per_stream == [A_N, B_N]

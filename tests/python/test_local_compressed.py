"""A compressed dataset in a local folder, opened as Mosaic users open one (`local=` without a
`remote`, no run id anywhere): it needs no run id, as a local dataset read in place needs none.
Its shards are decompressed into a folder of its own under the cache root, never into the
dataset's folder, and DataLoader workers share that folder."""

from __future__ import annotations

import os

import pytest

import shardstream

RUN_ID_SOURCES = ("SHARDSTREAM_RUN_ID", "SHARDSTREAM_JOBSET_NAME", "SHARDSTREAM_PYTORCHJOB_NAME",
                  "SHARDSTREAM_JOB_NAME", "TORCHELASTIC_RUN_ID", "SHARDSTREAM_CACHE_DIR")
SAMPLES = 120


def value(i: int) -> bytes:
    return i.to_bytes(4, "little") * (50 + i % 7)


@pytest.fixture()
def mosaic_zipped(tmp_path, monkeypatch):
    """A zstd-compressed MDS dataset written by mosaicml-streaming's MDSWriter, with the run id
    variables cleared and a cache root of the test's own."""
    from streaming import MDSWriter

    for var in RUN_ID_SOURCES:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SHARDSTREAM_CACHE_ROOT", str(tmp_path / "cache-root"))
    out = tmp_path / "zipped"
    with MDSWriter(out=str(out), columns={"id": "int", "data": "bytes"}, compression="zstd",
                   hashes=["sha1"], size_limit=1 << 12) as w:
        for i in range(SAMPLES):
            w.write({"id": i, "data": value(i)})
    assert not list(out.glob("*.mds")), "only compressed shards"
    return out


def listing(folder) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}


def test_compressed_local_dataset_opens_without_a_run_id(mosaic_zipped, tmp_path):
    before = listing(mosaic_zipped)
    ds = shardstream.StreamingDataset(local=str(mosaic_zipped), batch_size=4, validate_hash="sha1")
    cache = os.path.realpath(ds.cache_dir)
    assert cache.startswith(os.path.realpath(tmp_path / "cache-root")), cache
    assert os.path.basename(cache).startswith("in-place-"), cache
    got = {int(s["id"]): s["data"] for s in ds}
    assert got == {i: value(i) for i in range(SAMPLES)}
    assert listing(mosaic_zipped) == before, "nothing written into the dataset's folder"
    shards = [f for f in (tmp_path / "cache-root").glob("in-place-*/data/*") if f.is_file()]
    assert shards and all(os.path.realpath(f).startswith(cache) for f in shards), \
        "the decompressed shards are in the dataset's own cache folder"
    again = shardstream.StreamingDataset(local=str(mosaic_zipped), batch_size=4)
    assert os.path.realpath(again.cache_dir) == cache, "the same files, the same folder"


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_share_the_decompressed_folder(mosaic_zipped, workers):
    from torch.utils.data import DataLoader

    ds = shardstream.StreamingDataset(local=str(mosaic_zipped), batch_size=4, shuffle=True, shuffle_seed=5)
    ids = []
    for batch in DataLoader(ds, batch_size=4, num_workers=workers,
                            multiprocessing_context="fork" if workers else None):
        ids.extend(int(i) for i in batch["id"])
        for i, data in zip(batch["id"], batch["data"]):
            assert data == value(int(i))
    assert sorted(ids) == list(range(SAMPLES))
    assert ids != list(range(SAMPLES)), "shuffled"

"""The cache folder's copy of a remote `index.json`, through the Python binding (docs/streaming.md,
What `open` does). Once an epoch has streamed from the real moto server, a new `StreamingDataset`
on the same folder, and DataLoader workers started with `spawn` (each opens the dataset again from
its pickled arguments), read the copy: with the object deleted from the server they still give
every sample exactly once, while the folder of a new run is told that the index is missing."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from torch.utils.data import DataLoader

import shardstream
from conftest import write_ids

N = 157
BATCH = 8


def _copies(cache_dir: str) -> list[str]:
    folder = Path(cache_dir) / "indexes"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_new_objects_and_spawned_workers_read_the_index_copy(tmp_path, moto, stream_env, monkeypatch):
    data = tmp_path / "mds"
    write_ids(data, N, size_limit=600)
    bucket = moto.create_bucket("index-copy")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for f in data.iterdir():
        s3.upload_file(str(f), "index-copy", f"ds/{f.name}")
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)

    def open_dataset():
        return shardstream.StreamingDataset(remote=f"{bucket}/ds", shuffle=True, shuffle_seed=5,
                                            batch_size=BATCH, shuffle_window=3)

    first = open_dataset()
    assert sorted(s["id"] for s in first) == list(range(N))
    # The copy is written in the background of the first stream, whose end waits for it.
    assert len(_copies(first.cache_dir)) == 1 and _copies(first.cache_dir)[0].endswith(".json"), \
        _copies(first.cache_dir)
    assert (Path(first.cache_dir) / "indexes" / _copies(first.cache_dir)[0]).read_bytes() == \
        (data / "index.json").read_bytes()

    s3.delete_object(Bucket="index-copy", Key="ds/index.json")
    again = open_dataset()
    assert len(again) == N
    loader = DataLoader(again, batch_size=BATCH, num_workers=2, multiprocessing_context="spawn")
    ids = [i for batch in loader for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(N)), "spawned workers did not stream the epoch from the copy"

    monkeypatch.setenv("SHARDSTREAM_RUN_ID", stream_env["SHARDSTREAM_RUN_ID"] + "-next")
    with pytest.raises(shardstream.NotFoundError, match="index.json"):
        open_dataset()

"""`shardstream.ShardWriter` takes MDSWriter's arguments and writes what Mosaic reads: the real
mosaicml-streaming StreamingDataset yields the samples that were written (every encoding), and
the files equal, byte for byte, what Mosaic's own MDSWriter writes from the same samples."""

from __future__ import annotations

import pytest

import shardstream
from canonical import from_peer
from test_mds_interop import COLUMNS, make_sample, mosaic_samples, write_mosaic


@pytest.mark.parametrize("compression,hashes", [(None, None), ("zstd:5", ["sha1", "xxh64"])])
def test_written_dataset_reads_in_mosaic(tmp_path, compression, hashes):
    ours = tmp_path / "ours"
    n = 31
    with shardstream.ShardWriter(
        out=str(ours), columns=COLUMNS, compression=compression, hashes=hashes, size_limit=1 << 14
    ) as w:
        for i in range(n):
            w.write(make_sample(i))
        assert w.samples_written == n
    # Mosaic's MDSWriter from the same samples writes the same bytes (JPEG included).
    theirs = tmp_path / "theirs"
    write_mosaic(theirs, n, compression=compression, hashes=hashes)
    names = sorted(p.name for p in theirs.iterdir())
    assert sorted(p.name for p in ours.iterdir()) == names
    for name in names:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    got = mosaic_samples(ours)
    assert len(got) == n
    for i, s in enumerate(got):
        want = make_sample(i)
        for name, enc in COLUMNS.items():
            if enc in ("jpeg", "list[jpeg]", "jpeg_array"):
                continue  # lossy: compared against Mosaic's own encoding below
            assert from_peer(s[name], enc) == from_peer(want[name], enc), (i, name)


def test_writer_to_s3_reads_back(tmp_path, moto, monkeypatch, stream_env):
    for k, v in moto.env.items():
        monkeypatch.setenv(k, v)
    bucket = moto.create_bucket("writer")
    with shardstream.ShardWriter(f"{bucket}/ds", {"id": "int", "t": "str"}, size_limit=256) as w:
        for i in range(50):
            w.write({"id": i, "t": f"text {i}"})
    ds = shardstream.StreamingDataset(remote=f"{bucket}/ds")
    assert [s["id"] for s in ds] == list(range(50))


def test_writer_rejects_bad_values(tmp_path):
    w = shardstream.ShardWriter(str(tmp_path / "x"), {"a": "uint8", "b": "str"})
    with pytest.raises(KeyError, match="b"):
        w.write({"a": 1})
    with pytest.raises(TypeError, match=r'column "b" \(str\)'):
        w.write({"a": 1, "b": 3})
    with pytest.raises(ValueError, match='column "c"'):
        shardstream.ShardWriter(str(tmp_path / "y"), {"c": "nope"})


def test_writer_refuses_a_folder_that_is_not_empty_unless_exist_ok(tmp_path):
    """As Mosaic's MDSWriter: writing into a folder that holds something is a FileExistsError
    naming it, and the dataset already there is untouched; `exist_ok=True` replaces its contents
    (no shard of the old dataset is left beside the new one). `retry` is accepted too."""
    from streaming import StreamingDataset

    out = tmp_path / "ds"
    with shardstream.ShardWriter(out=str(out), columns={"i": "int"}, size_limit=64, retry=3) as w:
        for i in range(40):
            w.write({"i": i})
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert len(before) > 3
    for target in (str(out), f"file://{out}"):
        with pytest.raises(FileExistsError, match=f"Directory is not empty: {out}"):
            shardstream.ShardWriter(out=target, columns={"i": "int"})
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before, "nothing already written is lost"

    with pytest.warns(UserWarning, match="exist_ok=True"):
        w = shardstream.ShardWriter(out=str(out), columns={"i": "int"}, exist_ok=True)
    with w:
        for i in range(3):
            w.write({"i": 100 + i})
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "shard.00000.mds"]
    got = sorted(int(s["i"]) for s in StreamingDataset(local=str(out), batch_size=1))
    assert got == [100, 101, 102]


def test_mosaics_writer_name_is_the_writer():
    assert shardstream.MDSWriter is shardstream.ShardWriter

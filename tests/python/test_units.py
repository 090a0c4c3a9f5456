"""Sizes and counts given as text mean what they mean in Mosaic. Byte sizes: every unit a power
of 1024 (`bytes_to_int`), so a `size_limit="16kb"` writes the shards (and the index's
`size_limit`) that Mosaic's `MDSWriter` writes, and a `cache_limit="10gb"` is the same limit after
the switch; the binary spellings (`GiB`) and bare prefixes (`g`) that the CLI takes are accepted
too. Sample counts (`epoch_size`): decimal suffixes (`number_abbrev_to_int`), `"100k"`, `"2b"`."""

from __future__ import annotations

import json

import pytest

import shardstream
from shardstream._units import parse_bytes, parse_count


@pytest.mark.parametrize("text", ["300b", "64kb", "100mb", "1.5gb", "10GB", "1 tb", "2pb", 4096, 3.7])
def test_mosaic_spellings_parse_as_mosaic_parses_them(text):
    from streaming.base.util import bytes_to_int

    assert parse_bytes(text, "x") == bytes_to_int(text)


@pytest.mark.parametrize("text,want", [("20GiB", 20 << 30), ("2MiB", 2 << 20), ("1g", 1 << 30),
                                       ("1k", 1024), (".5k", 512), (" 3 MB ", 3 << 20)])
def test_cli_spellings(text, want):
    assert parse_bytes(text, "x") == want


@pytest.mark.parametrize("bad", ["ib", "5ib", "1xb", "1kk", "mb", "-1kb", "1e3"])
def test_bad_sizes_name_the_argument(bad):
    with pytest.raises(ValueError, match="size_limit"):
        parse_bytes(bad, "size_limit")


def test_writer_size_limit_text_writes_mosaics_shards(tmp_path):
    from streaming import MDSWriter

    samples = [{"i": i, "x": bytes([i % 251]) * (100 + i)} for i in range(300)]
    for writer, out in ((shardstream.ShardWriter, tmp_path / "ours"), (MDSWriter, tmp_path / "theirs")):
        with writer(out=str(out), columns={"i": "int", "x": "bytes"}, size_limit="16kb") as w:
            for s in samples:
                w.write(s)
    index = json.loads((tmp_path / "ours" / "index.json").read_text())
    assert {s["size_limit"] for s in index["shards"]} == {16384}
    names = sorted(p.name for p in (tmp_path / "theirs").iterdir())
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == names and len(names) > 2
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "theirs" / name).read_bytes(), name


@pytest.mark.parametrize("text", ["100k", "1.5m", "2b", "1t", "300", 77, 12.9, " 4K "])
def test_sample_counts_parse_as_mosaic_parses_them(text):
    from streaming.base.util import number_abbrev_to_int

    assert parse_count(text, "epoch_size") == number_abbrev_to_int(text)


@pytest.mark.parametrize("bad", ["1kb", "k", "-5", "1e3", "many"])
def test_bad_counts_name_the_argument(bad):
    with pytest.raises(ValueError, match="epoch_size"):
        parse_count(bad, "epoch_size")


def test_epoch_size_text(tmp_path, stream_env):
    from conftest import write_ids

    write_ids(tmp_path / "mds", 30)
    ds = shardstream.StreamingDataset(local=str(tmp_path / "mds"), epoch_size="0.05k")
    assert ds.epoch_size == len(ds) == 50
    assert len(list(ds)) == 50

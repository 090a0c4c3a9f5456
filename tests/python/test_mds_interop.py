"""MDS interop with the real mosaicml-streaming, through the `shardstream` CLI.

Mosaic's MDSWriter writes datasets with every column encoding, every compression, several hashes,
many shards and merged subfolders; `shardstream cat --json` must yield, sample for sample, what
Mosaic's own StreamingDataset yields. The reverse: `shardstream shard` output read by Mosaic's
StreamingDataset equals the input."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from canonical import from_peer, from_shardstream
from conftest import cat_json, run_cli

COLUMNS = {
    "bytes": "bytes",
    "str": "str",
    "int": "int",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "f16": "float16",
    "f32": "float32",
    "f64": "float64",
    "sint": "str_int",
    "sfloat": "str_float",
    "sdec": "str_decimal",
    "js": "json",
    "pil": "pil",
    "jpg": "jpeg",
    "png": "png",
    "jarr": "jpeg_array",
    "lpil": "list[pil]",
    "ljpg": "list[jpeg]",
    "lpng": "list[png]",
    "nd": "ndarray",
    "nd_dt": "ndarray:int16",
    "nd_fixed": "ndarray:float32:2,3",
}


def _image(i: int, mode: str = "RGB", size=(5, 4)) -> Image.Image:
    rng = np.random.default_rng(i)
    channels = {"RGB": 3, "L": 1}[mode]
    arr = rng.integers(0, 255, size=(size[1], size[0], channels), dtype=np.uint8)
    return Image.fromarray(arr.squeeze() if channels == 1 else arr, mode)


def _jpeg_bytes(i: int) -> bytes:
    import io

    buf = io.BytesIO()
    _image(i).save(buf, format="JPEG")
    return buf.getvalue()


def make_sample(i: int) -> dict:
    rng = np.random.default_rng(1000 + i)
    dyn_dtype = [np.uint8, np.int32, np.float64, np.uint16, np.float16][i % 5]
    return {
        "bytes": bytes(rng.integers(0, 256, size=i % 37, dtype=np.uint8)),
        "str": f"sample {i} é ünïcode ✓" * (i % 3),
        "int": (-1) ** i * i * 1_000_003,
        "u8": np.uint8(i % 256),
        "u16": np.uint16(i * 7 % 65536),
        "u32": np.uint32(i * 100_003),
        "u64": np.uint64(2**63 + i),
        "i8": np.int8(-(i % 128)),
        "i16": np.int16(-i),
        "i32": np.int32(-i * 1000),
        "i64": np.int64(-(2**40) - i),
        "f16": np.float16(i / 8),
        "f32": np.float32(i / 3),
        "f64": np.float64(i / 7) if i % 11 else float("inf"),
        "sint": 10**30 + i,
        "sfloat": [0.1, 1e-05, 1e16, 2.5, -0.0][i % 5] * (i + 1),
        "sdec": Decimal(f"{i}.{i:03d}"),
        "js": {"i": i, "name": f"n{i}", "list": [1, 2.5, None, True], "ü": "é"},
        "pil": _image(i, "L" if i % 2 else "RGB"),
        "jpg": Image.open(__import__("io").BytesIO(_jpeg_bytes(i))),
        "png": _image(i + 1),
        "jarr": [_jpeg_bytes(i), _jpeg_bytes(i + 1)],
        "lpil": [_image(i), _image(i + 2, "L")],
        "ljpg": [Image.open(__import__("io").BytesIO(_jpeg_bytes(i + 3)))],
        "lpng": [_image(i + 4), _image(i + 5)],
        "nd": rng.normal(size=(i % 4 + 1, 3)).astype(dyn_dtype),
        "nd_dt": rng.integers(-300, 300, size=(2, i % 5 + 1)).astype(np.int16),
        "nd_fixed": rng.normal(size=(2, 3)).astype(np.float32),
    }


def write_mosaic(out: Path, n: int, compression=None, hashes=None, size_limit=1 << 14) -> None:
    from streaming import MDSWriter

    with MDSWriter(
        out=str(out), columns=COLUMNS, compression=compression, hashes=hashes, size_limit=size_limit
    ) as w:
        for i in range(n):
            w.write(make_sample(i))


def mosaic_samples(local: Path) -> list[dict]:
    """What Mosaic's own StreamingDataset yields, in order."""
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = StreamingDataset(local=str(local), shuffle=False, batch_size=1)
    out = [ds[i] for i in range(len(ds))]
    del ds
    clean_stale_shared_memory()
    return out


def assert_same(ours: list[dict], theirs: list[dict], columns: dict) -> None:
    assert len(ours) == len(theirs)
    for idx, (a, b) in enumerate(zip(ours, theirs)):
        assert set(a) == set(columns), f"sample {idx}: columns {sorted(a)}"
        for name, enc in columns.items():
            got = from_shardstream(a[name])
            want = from_peer(b[name], enc)
            assert got == want, f"sample {idx} column {name} ({enc}): {got!r} != {want!r}"


@pytest.mark.parametrize(
    "compression,hashes",
    [
        (None, None),
        ("zstd", ["sha1", "xxh64"]),
        ("zstd:7", ["md5"]),
        ("gz", ["sha256", "xxh3_64"]),
        ("bz2", ["xxh128"]),
        ("br", ["sha512", "xxh32"]),
        ("snappy", ["blake2b"]),
    ],
)
def test_mosaic_written_every_encoding(tmp_path, shardstream_bin, compression, hashes):
    ds = tmp_path / "ds"
    write_mosaic(ds, 40, compression, hashes)
    index = json.loads((ds / "index.json").read_text())
    assert len(index["shards"]) > 3, "want several shards"
    run_cli(shardstream_bin, "verify", str(ds))
    assert_same(cat_json(shardstream_bin, str(ds)), mosaic_samples(ds), COLUMNS)


def test_mosaic_merged_subfolders(tmp_path, shardstream_bin):
    from streaming.base.util import merge_index

    root = tmp_path / "root"
    for part in range(3):
        from streaming import MDSWriter

        with MDSWriter(out=str(root / str(part)), columns=COLUMNS, compression="zstd", hashes=["sha1"], size_limit=1 << 13) as w:
            for i in range(part * 10, part * 10 + 10):
                w.write(make_sample(i))
    merge_index(str(root), keep_local=True)
    index = json.loads((root / "index.json").read_text())
    assert index["shards"][0]["raw_data"]["basename"].startswith("0/")
    run_cli(shardstream_bin, "verify", str(root))
    assert_same(cat_json(shardstream_bin, str(root)), mosaic_samples(root), COLUMNS)


def test_shardstream_written_read_by_mosaic(tmp_path, shardstream_bin):
    rows = [
        {"id": i, "text": f"line {i} ✓", "score": i / 3, "meta": {"k": [i, None]}}
        for i in range(500)
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    run_cli(shardstream_bin, "shard", str(src), str(out), "--shard-size", "8KiB", "--hashes", "sha1,xxh64")
    index = json.loads((out / "index.json").read_text())
    assert len(index["shards"]) > 1
    enc = dict(zip(index["shards"][0]["column_names"], index["shards"][0]["column_encodings"]))
    got = mosaic_samples(out)
    assert len(got) == len(rows)
    for row, sample in zip(rows, got):
        for key, value in row.items():
            have = sample[key]
            if enc[key] == "json":
                assert have == value
            elif isinstance(value, float):
                assert float(have) == value
            else:
                assert have == value, (key, have, value)


def test_shardstream_s3_roundtrip(tmp_path, shardstream_bin, moto):
    bucket = moto.create_bucket(f"b-{uuid.uuid4().hex[:8]}")
    ds = tmp_path / "ds"
    write_mosaic(ds, 20, "zstd", ["xxh64"])
    remote = f"{bucket}/datasets/mosaic"
    run_cli(shardstream_bin, "upload", str(ds), remote, env=moto.env)
    run_cli(shardstream_bin, "verify", remote, env=moto.env)
    assert_same(cat_json(shardstream_bin, remote, env=moto.env), mosaic_samples(ds), COLUMNS)

"""A checkpoint load reads a saved tensor in place (`shardstream.checkpoint._stored_tensor`):
the bytes `torch.save` wrote, viewed where they lie with the dtype, shape, strides and offset
the archive records. Every layout it accepts must equal what `torch.load` returns, and every
layout it cannot read in place (several storages, compressed records, damaged archives) must be
refused (None) so that the load falls back to `torch.load`."""

from __future__ import annotations

import io
import zipfile

import pytest
import torch

from shardstream import checkpoint as ck


def saved(obj) -> memoryview:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return memoryview(buf.getvalue())


CASES = {
    "float32 vector": torch.randn(1000),
    "bfloat16 matrix": torch.randn(17, 33).to(torch.bfloat16),
    "int64 3-d": torch.arange(2 * 3 * 5).reshape(2, 3, 5),
    "bool": torch.rand(40) > 0.5,
    "complex64": torch.randn(8, dtype=torch.complex64),
    "float8": torch.randn(64).to(torch.float8_e4m3fn),
    "0-dim": torch.tensor(3.5),
    # A slice saves its whole storage with an offset; a transpose keeps its strides.
    "slice of a larger storage": torch.arange(100.0)[10:30],
    "transposed": torch.randn(6, 4).t(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_place_view_equals_torch_load(name):
    t = CASES[name]
    view = saved(t)
    got = ck._stored_tensor(view)
    assert got is not None, "a plain tensor must be read in place"
    want = torch.load(io.BytesIO(bytes(view)), weights_only=True)
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    # Compared as bytes: float8 and NaN-free equality of every dtype at once.
    assert torch.equal(got.contiguous().view(-1).view(torch.uint8), want.contiguous().view(-1).view(torch.uint8))


def test_layouts_it_cannot_read_in_place_are_refused():
    # Two storages in one item (not what DCP writes per tensor, but a valid torch.save).
    assert ck._stored_tensor(saved([torch.ones(3), torch.zeros(4)])) is None
    # An empty tensor has an empty record.
    assert ck._stored_tensor(saved(torch.empty(0))) is None
    # Not a zip archive at all, and an archive cut short.
    assert ck._stored_tensor(memoryview(b"not an archive" * 10)) is None
    whole = saved(torch.randn(256))
    assert ck._stored_tensor(whole[: len(whole) // 2]) is None


def test_a_compressed_record_is_refused():
    # Re-pack torch's archive with deflate: still a valid zip, but its bytes are not in place.
    src = zipfile.ZipFile(io.BytesIO(bytes(saved(torch.randn(128)))))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert ck._stored_tensor(memoryview(out.getvalue())) is None


def test_a_record_whose_size_disagrees_with_the_tensor_is_refused():
    # The pickle says 1000 float32s; a forged header would claim fewer bytes than that: the
    # bounds check of as_strided must refuse it rather than read past the record.
    t = torch.randn(1000)
    raw = bytearray(saved(t))
    src = zipfile.ZipFile(io.BytesIO(bytes(raw)))
    record = next(i for i in src.infolist() if i.filename.endswith("/data/0"))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data[:40] if info is record else data)
    assert ck._stored_tensor(memoryview(out.getvalue())) is None


def test_a_dcp_load_of_large_and_small_items_reads_them_equal(tmp_path, monkeypatch):
    """Through DCP itself: items at and above `_IN_PLACE_MIN_BYTES` are read in place, smaller
    ones through torch.load; both land equal in the target, a resharded (narrowed) read too."""
    import torch.distributed.checkpoint as dcp

    from shardstream.checkpoint import StorageReader, StorageWriter

    seen = []
    real = ck._stored_tensor
    monkeypatch.setattr(ck, "_stored_tensor", lambda view: seen.append(len(view)) or real(view))
    big = ck._IN_PLACE_MIN_BYTES
    state = {
        "big_bf16": torch.randn(big // 2 + 100).to(torch.bfloat16),
        "big_matrix": torch.randn(512, big // 2048 + 7),
        "small": torch.arange(10, dtype=torch.int32),
    }
    url = str(tmp_path / "step_1")
    dcp.save(state, storage_writer=StorageWriter(url), no_dist=True)
    loaded = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(loaded, storage_reader=StorageReader(url), no_dist=True)
    for k, v in state.items():
        assert torch.equal(loaded[k], v), k
    assert len(seen) == 2 and all(n >= big for n in seen), "the two large items, in place"

"""The benchmark consumer's check (benches/lib/consume.py): a loader that is fast and wrong
must be reported, whichever way its samples reach the consumer (lists from a DataLoader's
collate, one sample at a time, or shardstream's column batches). Each fault is fed to it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import shardstream

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benches" / "lib"))
import consume  # noqa: E402

N, SIZE = 1000, 100


def sample(i: int, size: int = SIZE) -> bytes:
    return (i.to_bytes(8, "little", signed=True) + bytes(size))[:size]


def duplicate(ids, datas):
    ids[5], datas[5] = 7, sample(7)


def wrong_head(ids, datas):
    datas[9] = sample(10)


def too_short(ids, datas):
    datas[11] = datas[11][:8]


def out_of_range(ids, datas):
    ids[3] = -1


def dropped(ids, datas):
    del ids[-1], datas[-1]


FAULTS = {
    None: "ok",
    duplicate: "1 missing; 1 duplicated",
    wrong_head: "1 with wrong bytes",
    too_short: "1 with wrong bytes",
    out_of_range: "1 missing; 1 with wrong bytes; 1 out of range",
    dropped: "1 missing",
}


def column_batch(ids, datas):
    lengths = [len(d) for d in datas]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype("<u8")
    return shardstream.ColumnBatch(id=np.array(ids, dtype=np.int64),
                                   data=shardstream.VarColumn(b"".join(datas), offsets, "bytes"))


@pytest.mark.parametrize("fault", list(FAULTS), ids=lambda f: "none" if f is None else f.__name__)
@pytest.mark.parametrize("shape", ["lists", "samples", "columns"])
def test_every_fault_is_reported(monkeypatch, shape, fault):
    ids = list(range(N))
    datas = [sample(i) for i in ids]
    if fault is not None:
        fault(ids, datas)
    spans = [(a, a + 64) for a in range(0, len(ids), 64)]
    if shape == "lists":
        it, batched = [(ids[a:b], datas[a:b]) for a, b in spans], True
    elif shape == "samples":
        it, batched = [{"id": i, "data": d} for i, d in zip(ids, datas)], False
    else:
        it, batched = [column_batch(ids[a:b], datas[a:b]) for a, b in spans], "columns"
    monkeypatch.setattr(consume, "counters", lambda: {})
    monkeypatch.setattr(consume, "build", lambda *args: (it, batched))
    consume.use_system("shardstream (python)")
    r = consume.epoch({"samples": N, "sample_bytes": SIZE}, "unused", False, 0)
    assert r["check"] == FAULTS[fault]
    if fault is None:
        assert r["samples"] == N and r["bytes"] == N * SIZE

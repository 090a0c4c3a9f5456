"""How a checkpoint load groups its reads (`shardstream.checkpoint._read_units`): the items of
one file together and in file order, so that touching items are one fetch (one GET per part
as it went up), cut between items at about `_READ_UNIT_BYTES`, never inside an item."""

from __future__ import annotations

from shardstream import checkpoint as ck

MIB = 1 << 20


def entry(path: str, offset: int, length: int, tag: str):
    return (tag, (path, offset, length))


def test_items_of_one_file_stay_together_in_file_order():
    pending = [
        entry("a.distcp", 20 * MIB, 10 * MIB, "a2"),
        entry("b.distcp", 0, 10 * MIB, "b0"),
        entry("a.distcp", 0, 10 * MIB, "a0"),
        entry("a.distcp", 10 * MIB, 10 * MIB, "a1"),
    ]
    units = list(ck._read_units(pending))
    assert [[tag for tag, _ in u] for u in units] == [["a0", "a1", "a2"], ["b0"]]
    assert [ck._unit_bytes(u) for u in units] == [30 * MIB, 10 * MIB]


def test_a_large_file_is_cut_between_items_and_a_large_item_stands_alone():
    unit = ck._READ_UNIT_BYTES
    pending = [entry("big.distcp", i * (unit // 2), unit // 2, f"h{i}") for i in range(5)]
    pending.append(entry("huge.distcp", 0, 3 * unit, "huge"))
    units = list(ck._read_units(pending))
    assert [[tag for tag, _ in u] for u in units] == [["h0", "h1"], ["h2", "h3"], ["h4"], ["huge"]]
    assert all(ck._unit_bytes(u) <= unit for u in units[:3])
    # Every item is read exactly once.
    assert sorted(tag for u in units for tag, _ in u) == sorted(tag for tag, _ in pending)

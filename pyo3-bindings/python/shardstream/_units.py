"""Byte sizes written the way Mosaic accepts them: an int, or text such as `"512mb"`, `"20GiB"`."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}


def parse_bytes(value: int | str | None, name: str) -> int | None:
    """`None` stays `None`; ints pass; `"100gb"` (decimal) and `"20GiB"` (binary) are parsed."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        raise ValueError(f"{name}: cannot read {value!r} as a byte size (e.g. 512mb, 20GiB)")
    raise TypeError(f"{name} must be an int or a string such as '512mb', got {type(value).__name__}")

"""Byte sizes written the way Mosaic accepts them: an int, or text such as `"512mb"`, `"20GiB"`.

Every unit is a power of 1024, as in Mosaic's `bytes_to_int` (`size_limit="64mb"` is 64 MiB, and
the index records 67108864) and the CLI's sizes: a limit or shard size must not change when a
script moves from Mosaic to shardstream or from the command line to Python.
"""

from __future__ import annotations

import math
import re
from typing import Any

_PREFIXES = "kmgtpe"  # 1024 ** (index + 1)
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


def _unit_power(unit: str) -> int | None:
    """`kb`, `KiB`, `k` -> 1, `mb` -> 2, ...; `b` or nothing -> 0; None for anything else."""
    unit = unit.lower()
    if unit in ("", "b"):
        return 0
    for suffix in ("ib", "b", ""):
        prefix = unit[: len(unit) - len(suffix)]
        if unit.endswith(suffix) and len(prefix) == 1 and prefix in _PREFIXES:
            return _PREFIXES.index(prefix) + 1
    return None


def _whole(value: Any, name: str, what: str) -> Any:
    """`None`, text and ints as given; a float truncated (as Mosaic's); a bool refused."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a {what}, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite {what}, got {value}")
        return int(value)
    return value


def parse_bytes(value: int | float | str | None, name: str) -> int | None:
    """`None` stays `None`; ints pass (floats are truncated, as Mosaic's); `"100gb"` and
    `"20GiB"` are parsed, both binary."""
    value = _whole(value, name, "byte count")
    if value is None:
        return None
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name} must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _SIZE.fullmatch(value)
        power = _unit_power(m.group(2)) if m else None
        if m and power is not None:
            return int(float(m.group(1)) * 1024**power)
        raise ValueError(f"{name}: cannot read {value!r} as a byte size (e.g. 512mb, 20GiB)")
    raise TypeError(f"{name} must be an int or a string such as '512mb', got {type(value).__name__}")


_COUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([kmbtKMBT]?)\s*")
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "t": 10**12}


def parse_count(value: int | float | str | None, name: str) -> int | None:
    """A number of samples as Mosaic's `number_abbrev_to_int` reads it: an int (floats are
    truncated), or text with a decimal suffix, `"100k"`, `"1.5m"`, `"2b"` (billions), `"1t"`."""
    value = _whole(value, name, "number of samples")
    if value is None:
        return None
    if isinstance(value, str):
        m = _COUNT.fullmatch(value)
        if not m:
            raise ValueError(f"{name}: cannot read {value!r} as a number of samples (e.g. 500000, 100k, 1.5m)")
        value = int(float(m.group(1)) * _COUNT_UNITS[m.group(2).lower()])
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value

"""`storage_options={...}` as the native layer takes it: `(name, value)` text pairs.

The names (`endpoint_url`, `region`, `key`/`secret`/`token`, `anon`, `profile`, s3fs'
`client_kwargs`, gcsfs' `token`, adlfs' `account_name`/`sas_token`, and every `object_store`
configuration key) are checked and mapped once, in Rust (`shardstream_storage::named_options`);
this only flattens nested dicts (`client_kwargs={"endpoint_url": ...}` becomes
`client_kwargs.endpoint_url`) and writes values as text. Values are never logged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def option_pairs(options: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """`options` flattened into `(name, value)` pairs; `None` values are left out."""
    if options is None:
        return []
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    pairs: list[tuple[str, str]] = []
    _flatten("", options, pairs)
    return pairs


def _flatten(prefix: str, options: Mapping[str, Any], out: list[tuple[str, str]]) -> None:
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError(f"storage_options keys must be strings, got {name!r}")
        key = f"{prefix}{name}"
        if value is None:
            continue
        if isinstance(value, Mapping):
            _flatten(f"{key}.", value, out)
        elif isinstance(value, bool):
            out.append((key, "true" if value else "false"))
        elif isinstance(value, (str, int, float, os.PathLike)):
            out.append((key, os.fspath(value) if isinstance(value, os.PathLike) else str(value)))
        else:
            raise TypeError(f"storage option {key!r} must be a string, number or bool, "
                            f"got {type(value).__name__}")

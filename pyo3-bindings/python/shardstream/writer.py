"""`ShardWriter`: writes MDS shards that mosaicml-streaming reads; `MDSWriter`'s arguments."""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

from shardstream import _native
from shardstream._storage_options import option_pairs
from shardstream._units import parse_bytes


class ShardWriter:
    """Writes samples (dicts of column values) as an MDS dataset at `out` (a folder or an
    `s3://`/`gs://`/`az://` URL). Values are encoded exactly as Mosaic's `MDSWriter` encodes
    them; shards are compressed, hashed and stored by native threads with the GIL released.

    Use it as a context manager, or call `finish()` to write `index.json`.
    """

    def __init__(
        self,
        out: str | tuple[str, str | None] | None = None,
        columns: Mapping[str, str] | None = None,
        compression: str | None = None,
        hashes: list[str] | None = None,
        size_limit: int | str | None = 1 << 26,
        *,
        keep_local: bool = False,
        allow_unsafe_types: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if out is None or columns is None:
            raise TypeError("ShardWriter needs out and columns")
        if isinstance(out, tuple):
            # Mosaic's (local, remote): shardstream writes straight to the remote when there is one.
            local, remote = out
            out = remote if remote else local
        if kwargs:
            unknown = set(kwargs) - {"progress_bar", "max_workers", "exist_ok", "retry"}
            if unknown:
                raise TypeError(f"ShardWriter got unexpected arguments: {sorted(unknown)}")
        self.out = str(out)
        _prepare_local_folder(self.out, bool(kwargs.get("exist_ok", False)))
        self.columns = dict(columns)
        self.keep_local = keep_local
        self._native = _native.NativeShardWriter(
            self.out,
            list(self.columns.items()),
            compression=compression,
            hashes=sorted(hashes) if hashes else None,
            size_limit=parse_bytes(size_limit, "size_limit") or None,
            allow_unsafe_types=allow_unsafe_types,
            storage_options=option_pairs(storage_options),
        )
        self._finished = False

    def write(self, sample: Mapping[str, Any]) -> None:
        """Encodes and adds one sample."""
        self._native.write(sample)

    @property
    def samples_written(self) -> int:
        return self._native.samples_written

    def finish(self) -> int:
        """Flushes the last shard and writes `index.json`; returns the number of shards."""
        self._finished = True
        return self._native.finish()

    # Mosaic's name for finish().
    def finalize(self) -> None:
        self.finish()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._finished:
            self.finish()


def _local_folder(out: str) -> str | None:
    """The folder `out` names on this machine (a path or a `file://` URL); None for a store."""
    if out.startswith("file://"):
        return unquote(urlparse(out).path)
    if "://" in out:
        return None
    return os.path.expanduser(out)


def _prepare_local_folder(out: str, exist_ok: bool) -> None:
    """As Mosaic's `MDSWriter`: a local folder that is not empty is refused
    (`FileExistsError`), so that a second conversion never overwrites a dataset by mistake;
    with `exist_ok=True` its contents are removed first, so that no shard of the old dataset
    is left beside the new one."""
    folder = _local_folder(out)
    if folder is None or not os.path.isdir(folder) or not os.listdir(folder):
        return
    if not exist_ok:
        raise FileExistsError(f"Directory is not empty: {folder} (pass exist_ok=True to replace "
                              "what it holds)")
    warnings.warn(f"{folder} is not empty; exist_ok=True: removing its contents", stacklevel=3)
    shutil.rmtree(folder)

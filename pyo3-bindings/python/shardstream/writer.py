"""`ShardWriter`: writes MDS shards that mosaicml-streaming reads; `MDSWriter`'s arguments."""

from __future__ import annotations

from typing import Any, Mapping

from shardstream import _native
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
        **kwargs: Any,
    ) -> None:
        if out is None or columns is None:
            raise TypeError("ShardWriter needs out and columns")
        if isinstance(out, tuple):
            # Mosaic's (local, remote): shardstream writes straight to the remote when there is one.
            local, remote = out
            out = remote if remote else local
        if kwargs:
            unknown = set(kwargs) - {"progress_bar", "max_workers", "exist_ok"}
            if unknown:
                raise TypeError(f"ShardWriter got unexpected arguments: {sorted(unknown)}")
        self.out = str(out)
        self.columns = dict(columns)
        self.keep_local = keep_local
        self._native = _native.NativeShardWriter(
            self.out,
            list(self.columns.items()),
            compression=compression,
            hashes=sorted(hashes) if hashes else None,
            size_limit=parse_bytes(size_limit, "size_limit") or None,
            allow_unsafe_types=allow_unsafe_types,
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

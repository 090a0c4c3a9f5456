"""`Stream`: one dataset of a mix, as mosaicml-streaming's `streaming.Stream`.

`StreamingDataset(streams=[Stream(...), ...])` mixes several MDS datasets into one epoch. The
weights mean what they mean in Mosaic (at most one per stream):

- `proportion`: relative; every stream then needs one. The epoch has `epoch_size` samples
  (default: all streams' samples together), split in proportion.
- `repeat`: `floor(repeat * samples)` samples of this stream per epoch (below 1 takes a subset).
- `choose`: exactly this many samples per epoch.
- none: every sample once (or, with `epoch_size` and no weights at all, a share proportional to
  the stream's size).

The mix itself (which samples, in which order) is computed by the Rust engine; it is
deterministic for a seed and resumable like a single dataset.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from shardstream._storage_options import option_pairs

# Mosaic `Stream` arguments accepted for a one-line switch and not needed here: the engine has
# its own retries, timeouts and hash checks (set on the dataset).
_IGNORED_STREAM_ARGS = {"download_retry", "download_timeout", "validate_hash", "keep_zip"}


def path_text(where: Any) -> Any:
    """A `pathlib.Path` (any `os.PathLike`) as the path text the engine takes; else as given."""
    return os.fspath(where) if isinstance(where, os.PathLike) else where


def as_stream(obj: Any) -> Stream:
    """`obj` as a `Stream`: one of ours as is, a mosaicml-streaming `Stream` converted."""
    if isinstance(obj, Stream):
        return obj
    # Mosaic's class (or a subclass), recognised without importing mosaicml-streaming.
    if any(c.__name__ == "Stream" and c.__module__.startswith("streaming.") for c in type(obj).__mro__):
        return Stream._from_mosaic(obj)
    raise TypeError(f"streams must hold shardstream.Stream (or streaming.Stream) objects, got {type(obj).__name__}")


class Stream:
    """One dataset of a mix: where it is (`remote`, `local`, `split`) and how much of each epoch
    it gives (`proportion`, `repeat` or `choose`).

    `remote` is the dataset (`s3://`, `gs://`, `az://`, a path). Without `remote`, `local` is the
    dataset itself. With both, `local` is where the shards are cached, as in Mosaic (a mix has one
    cache folder: the first Stream's `local`).
    """

    def __init__(
        self,
        *,
        remote: str | os.PathLike[str] | None = None,
        local: str | os.PathLike[str] | None = None,
        split: str | None = None,
        proportion: float | None = None,
        repeat: float | None = None,
        choose: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - _IGNORED_STREAM_ARGS
        if unknown:
            raise TypeError(f"Stream got unexpected arguments: {sorted(unknown)}")
        if remote is None and local is None:
            raise ValueError("Stream needs remote, local, or both")
        remote, local = path_text(remote), path_text(local)
        given = [(k, v) for k, v in (("proportion", proportion), ("repeat", repeat),
                                     ("choose", choose)) if v is not None]
        if len(given) > 1:
            raise ValueError("At most one of `proportion`, `repeat`, and `choose` may be given, "
                             f"got {[k for k, _ in given]}")
        for name, value in given:
            if value < 0:
                raise ValueError(f"`{name}` must be non-negative, got {value}")
        if choose is not None and int(choose) != choose:
            raise ValueError(f"`choose` must be a whole number of samples, got {choose}")
        self.remote = remote
        self.local = local
        self.split = split
        self.proportion = proportion
        self.repeat = repeat
        self.choose = choose
        # Applied after the dataset's own storage_options (this stream's win).
        self._storage_options = option_pairs(storage_options)

    @classmethod
    def _from_mosaic(cls, stream: Any) -> Stream:
        """The same stream from a mosaicml-streaming `streaming.Stream`, so that a mix built with
        Mosaic's class works unchanged: its remote, the `local` it was given (Mosaic fills in a
        temporary folder when none was), split and weight."""
        return cls(
            remote=stream.remote,
            local=getattr(stream, "_local", None),
            split=stream.split or None,
            proportion=getattr(stream, "_proportion", None),
            repeat=getattr(stream, "_repeat", None),
            choose=getattr(stream, "_choose", None),
        )

    def _native_spec(self) -> tuple[str, str | None, str, float, list[tuple[str, str]]]:
        """`(dataset, split, weight kind, weight value, storage options)`: one entry of
        `NativeDataset`'s `streams` setting."""
        where = self.remote if self.remote is not None else self.local
        assert where is not None  # checked in __init__
        options = getattr(self, "_storage_options", [])
        if self.proportion is not None:
            return (where, self.split, "proportion", float(self.proportion), options)
        if self.repeat is not None:
            return (where, self.split, "repeat", float(self.repeat), options)
        if self.choose is not None:
            return (where, self.split, "choose", float(self.choose), options)
        return (where, self.split, "natural", 0.0, options)

    def __repr__(self) -> str:
        weight = ", ".join(f"{k}={v!r}" for k, v in (("proportion", self.proportion),
                                                     ("repeat", self.repeat),
                                                     ("choose", self.choose)) if v is not None)
        where = f"remote={self.remote!r}" if self.remote is not None else f"local={self.local!r}"
        return f"Stream({where}{', ' + weight if weight else ''})"

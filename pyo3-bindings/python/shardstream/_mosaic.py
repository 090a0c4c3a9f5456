"""The parts of mosaicml-streaming's `StreamingDataset` that its users touch beyond iteration:
its shards (`shards`, Mosaic's `Reader` fields), the node's cache (`cache_limit`, `cache_usage`,
`prepare_shard`, `evict_shard`, `evict_coldest_shard`), `next_epoch`, `streams` and
`resample_streams`, each over shardstream's engine (the node's cache, its locks, its order);
plus what makes Mosaic's own `StreamingDataLoader` save and load a shardstream dataset's state,
and the check that refuses a Mosaic state that cannot be resumed in shardstream's order.

docs/mosaic-compat.md has the whole table.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, NamedTuple

import numpy as np

from shardstream.streams import Stream


class FileInfo(NamedTuple):
    """One file of a shard, as Mosaic's `streaming.base.format.base.reader.FileInfo`."""

    basename: str
    bytes: int
    hashes: dict


class Shard:
    """One shard of the dataset, with the fields of Mosaic's `Reader` (`MDSReader`) that code
    reads: `samples` (also `size` and `len`), `dirname`, `split`, `compression`, `hashes`,
    `raw_data` / `zip_data` (`FileInfo`s), `file_pairs`, `column_names`, `column_encodings`,
    `get_raw_size()`, `get_zip_size()`, `get_max_size()`, `get_persistent_size(keep_zip)`.
    shardstream's own: `index` (its global id), `stream`, `url` (its URL or local path),
    `first_sample`, `cache_bytes` (what it takes in the node's cache; 0 when read in place).
    It describes the shard; reading and caching go through the dataset (`ds[i]`,
    `ds.prepare_shard(i)`, `ds.evict_shard(i)`)."""

    __slots__ = ("index", "stream", "url", "dirname", "split", "compression", "hashes", "samples",
                 "size_limit", "raw_data", "zip_data", "file_pairs", "column_names", "column_encodings",
                 "first_sample", "cache_bytes")

    def __init__(self, index: int, info: tuple, dirname: str | None, split: str | None,
                 columns: Mapping[str, str]) -> None:
        (url, stream, file, file_bytes, compression, raw_bytes, samples, first_sample, cache_bytes) = info
        self.index = index
        self.stream = stream
        self.url = url
        self.dirname = dirname
        self.split = split or ""
        self.compression = compression
        self.hashes: list[str] = []
        self.samples = samples
        self.size_limit = None
        if compression:
            # Mosaic names a compressed shard `<raw name>.<algorithm>`.
            suffix = "." + compression
            raw_name = file[: -len(suffix)] if file.endswith(suffix) else file
            self.raw_data = FileInfo(raw_name, raw_bytes, {})
            self.zip_data: FileInfo | None = FileInfo(file, file_bytes, {})
        else:
            self.raw_data = FileInfo(file, raw_bytes, {})
            self.zip_data = None
        self.file_pairs = [(self.raw_data, self.zip_data)]
        self.column_names = list(columns)
        self.column_encodings = list(columns.values())
        self.first_sample = first_sample
        self.cache_bytes = cache_bytes

    @property
    def size(self) -> int:
        """Samples in the shard (Mosaic's `Reader.size`)."""
        return self.samples

    def __len__(self) -> int:
        return self.samples

    def get_raw_size(self) -> int:
        """Bytes of the decompressed shard."""
        return self.raw_data.bytes

    def get_zip_size(self) -> int | None:
        """Bytes of the compressed shard, or `None` when it is not compressed."""
        return None if self.zip_data is None else self.zip_data.bytes

    def get_max_size(self) -> int:
        """Most bytes the shard takes on disk (both forms while it is decompressed)."""
        return self.get_raw_size() + (self.get_zip_size() or 0)

    def get_persistent_size(self, keep_zip: bool) -> int:
        """Bytes it keeps on disk once ready (shardstream never keeps the compressed form)."""
        return self.get_raw_size()

    def __repr__(self) -> str:
        return f"Shard({self.index}, {self.raw_data.basename!r}, samples={self.samples})"


class MosaicParity:
    """Mosaic's `StreamingDataset` attributes and methods beyond iteration and resume. Mixed
    into `shardstream.StreamingDataset`; everything here reads or acts on the engine."""

    # Set by StreamingDataset.__init__ (`self.streams = streams`): the Streams given, or None.
    _streams_given: list[Stream] | None = None
    _shard_list: list[Shard] | None = None
    _preparing: list | None = None  # background prepare_shard(blocking=False) handles

    # -- streams ---------------------------------------------------------------------------

    @property
    def streams(self) -> list[Stream]:
        """The datasets of the mix as `Stream`s; for one dataset without `streams=`, a list of one
        `Stream` of its `remote`, `local` and `split`, as Mosaic's."""
        if self._streams_given is not None:
            return self._streams_given
        return [Stream(remote=self.remote, local=self.local, split=self.split)]  # type: ignore[attr-defined]

    @streams.setter
    def streams(self, value: Any) -> None:
        self._streams_given = None if value is None else list(value)

    # -- shards ----------------------------------------------------------------------------

    @property
    def shards(self) -> list[Shard]:
        """Every shard, in global id order (the streams' shards one stream after the other), as
        `Shard` descriptors with the fields of Mosaic's `Reader`s."""
        if self._shard_list is None:
            native = self._native()  # type: ignore[attr-defined]
            streams = self.streams
            columns = self.columns  # type: ignore[attr-defined]
            out = []
            for i, info in enumerate(native.shard_infos()):
                s = streams[info[1]] if info[1] < len(streams) else None
                dirname = None
                if s is not None:
                    dirname = s.local if s.local is not None else s.remote
                out.append(Shard(i, info, dirname, None if s is None else s.split, columns))
            self._shard_list = out
        return self._shard_list

    def _shard_id(self, shard_id: Any) -> int:
        n = self.num_shards  # type: ignore[attr-defined]
        i = int(shard_id)
        if not 0 <= i < n:
            raise IndexError(f"shard {shard_id} is out of range (the dataset has {n} shards)")
        return i

    # -- the node's cache ------------------------------------------------------------------

    @property
    def cache_limit(self) -> int | None:
        """The `cache_limit` given, in bytes (`None`: the default, docs/configuration.md)."""
        return self._open_args.get("cache_limit")  # type: ignore[attr-defined]

    @property
    def cache_usage(self) -> int:
        """Bytes of shard files in the node's cache folder now, every process of the node
        together (counted on the disk; Mosaic keeps a counter in shared memory)."""
        return int(self._native().cache_usage())  # type: ignore[attr-defined]

    def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
        """Downloads shard `shard_id` into the node's cache (or joins the download another
        process of the node has started), evicting unused shards when the cache limit needs
        room. With `blocking` (the default) it returns once the shard is complete in the cache;
        with `blocking=False` it starts the download in this process's background and returns
        at once. Nothing to do for a cached shard or one read in place."""
        i = self._shard_id(shard_id)
        native = self._native()  # type: ignore[attr-defined]
        if blocking:
            native.prepare_shard(i)
            return
        running = [p for p in (self._preparing or []) if not p.finished]
        running.append(native.prepare_shards([i]))
        self._preparing = running

    def evict_shard(self, shard_id: int) -> None:
        """Deletes shard `shard_id` from the node's cache. A shard that a process of the node is
        reading, downloading or checking is not deleted: `RuntimeError`. Nothing to do for a
        shard that is not cached or is read in place."""
        i = self._shard_id(shard_id)
        if self._native().evict_shard(i) is None:  # type: ignore[attr-defined]
            raise RuntimeError(f"shard {i} is in use by a process of this node (reading, downloading "
                               "or checking it); it was not evicted")

    def evict_coldest_shard(self) -> None:
        """Deletes the least recently used of this dataset's shards in the node's cache that no
        process uses. `ValueError` when there is none, as Mosaic's."""
        if self._native().evict_coldest_shard() is None:  # type: ignore[attr-defined]
            raise ValueError("Attempted shard eviction, but there are no shards present locally "
                             "(and unused) to evict. Your cache limit may be too low.")

    # -- epochs ----------------------------------------------------------------------------

    @property
    def next_epoch(self) -> int:
        """The epoch the next iteration streams (Mosaic's `next_epoch`): one past the latest
        epoch an iteration started, or the epoch `set_epoch` / `load_state_dict` chose."""
        latest = self._lineages[-1].latest_started()  # type: ignore[attr-defined]
        epoch = self._epoch  # type: ignore[attr-defined]
        return epoch if latest is None else max(epoch, latest + 1)

    @next_epoch.setter
    def next_epoch(self, epoch: int) -> None:
        self.set_epoch(int(epoch))  # type: ignore[attr-defined]

    def resample_streams(self, epoch: int, stream_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The samples `epoch` takes from each stream, as Mosaic's `resample_streams` returns
        them: `(shuffle_units, sample_ids)`, where `sample_ids` are the global sample ids the
        epoch takes (a sample repeated once per time; sorted per shard) and `shuffle_units` the
        sample counts taken from each shard, one entry per whole pass over the shard and one
        for a partial pass. They are shardstream's choice (its `sampling_method`, its seed), the
        ones this dataset streams, not the draw Mosaic's generator would make."""
        p = self._placement()  # type: ignore[attr-defined]
        order = self._order(p, fix=False)  # type: ignore[attr-defined]
        ids = np.frombuffer(self._native().epoch_samples(order, int(epoch)), dtype="<u8").astype(np.int64)  # type: ignore[attr-defined]
        samples_per_shard = self.samples_per_shard  # type: ignore[attr-defined]
        offsets = self.sample_offset_per_shard  # type: ignore[attr-defined]
        stream_per_shard = self.stream_per_shard  # type: ignore[attr-defined]
        shard_of = np.searchsorted(offsets, ids, side="right") - 1
        units: list[int] = []
        parts: list[np.ndarray] = []
        for shard in range(len(samples_per_shard)):
            if stream_id is not None and stream_per_shard[shard] != stream_id:
                continue
            taken = ids[shard_of == shard]
            n, k = int(samples_per_shard[shard]), len(taken)
            if n == 0:
                continue
            units += [n] * (k // n) + ([k % n] if k % n else [])
            # Whole passes first, then the partial pass sorted, as Mosaic lists them.
            values, counts = np.unique(taken, return_counts=True)
            full = int(counts.min()) if len(values) == n else 0
            rest = np.repeat(values, counts - full)
            parts += [offsets[shard] + np.arange(n, dtype=np.int64)] * full + [np.sort(rest)]
        sample_ids = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return np.asarray(units, dtype=np.int64), sample_ids

    # -- Mosaic checkpoints ------------------------------------------------------------------

    def _check_mosaic_state(self, obj: Mapping[str, Any]) -> tuple[int, int] | None:
        """For a state saved by mosaicml-streaming (its keys, no `shardstream` entry): the
        `(epoch, 0)` to start at when it can be resumed exactly here, which is at an epoch's
        boundary (nothing of the epoch consumed, or all of it). Mid-epoch it cannot: Mosaic's
        order (py1e shuffle over its canonical nodes) is not shardstream's, so which samples
        the saved job had consumed is unknown here; that is a `ValueError` saying so, never a
        resume into another order."""
        if "shardstream" in obj or "sample_in_epoch" not in obj or "epoch" not in obj:
            return None
        # Mosaic's state before its first iteration names epoch -1 (its `next_epoch - 1`).
        epoch, consumed = max(0, int(obj["epoch"])), int(obj["sample_in_epoch"])
        if consumed <= 0:
            return epoch, 0
        size = self.epoch_size  # type: ignore[attr-defined]
        if consumed >= size:
            return epoch + 1, 0
        raise ValueError(
            f"this is a mosaicml-streaming state (epoch {epoch}, {consumed} of {size} samples "
            "consumed). shardstream cannot resume it mid-epoch: its sample order is its own, not "
            "Mosaic's py1e shuffle, so the samples the saved job had consumed cannot be told "
            "apart here, and resuming at the same count would skip some samples and repeat "
            f"others. Choose: ds.set_epoch({epoch}) to replay this epoch from its start, or "
            f"ds.set_epoch({epoch + 1}) to go on with the next one; states saved by shardstream "
            "(ds.state_dict(...)) resume mid-epoch exactly. See docs/mosaic-compat.md."
        )


def patch_mosaic_loader() -> None:
    """Lets mosaicml-streaming's own `StreamingDataLoader` save and load the state of a
    shardstream dataset. Its `state_dict` checks `isinstance(dataset, streaming.StreamingDataset)`
    and returns `None` for any other class, so a script that kept Mosaic's loader would save no
    position and restart every epoch from the beginning. Once Mosaic's loader module is loaded,
    its two methods are wrapped: for a shardstream dataset they do what they do for Mosaic's
    (the samples this rank's loader yielded times the ranks, from where this run resumed);
    for anything else they run unchanged. Idempotent; does nothing without Mosaic."""
    module = sys.modules.get("streaming.base.dataloader")
    loader = getattr(module, "StreamingDataLoader", None)
    if loader is None or getattr(loader, "_shardstream_patched", False):
        return
    original_state, original_load = loader.state_dict, loader.load_state_dict

    def state_dict(self: Any) -> dict[str, Any] | None:
        from shardstream.dataset import ColumnBatches, StreamingDataset

        ds = self.dataset
        if isinstance(ds, ColumnBatches):
            ds = ds.dataset
        if not isinstance(ds, StreamingDataset):
            return original_state(self)
        # Ranks of one replication group yield the same samples, as in shardstream's loader.
        num_samples = self.num_samples_yielded * ds._placement().processes
        return ds.state_dict(num_samples, False)

    def load_state_dict(self: Any, obj: dict[str, Any]) -> None:
        from shardstream.dataset import ColumnBatches, StreamingDataset

        ds = self.dataset
        if isinstance(ds, ColumnBatches):
            ds = ds.dataset
        if not isinstance(ds, StreamingDataset):
            return original_load(self, obj)
        ds.load_state_dict(obj)

    state_dict.__doc__, load_state_dict.__doc__ = original_state.__doc__, original_load.__doc__
    loader.state_dict, loader.load_state_dict = state_dict, load_state_dict
    loader._shardstream_patched = True

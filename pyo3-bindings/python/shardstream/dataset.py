"""`StreamingDataset`: a drop-in for mosaicml-streaming's `StreamingDataset`, streaming through
the Rust engine (fetch under one memory budget, node cache, world-independent sample order).

The class is thin: it works out where the process sits (nodes, processes, DataLoader workers),
asks the native stream for its share of the epoch, and hands out what the native side decoded.
"""

from __future__ import annotations

import json
import os
import random
import uuid
import warnings
import weakref
from itertools import islice
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from shardstream import _native, _transport
from shardstream._epochs import EpochRecords
from shardstream._groups import BatchGroup, approx_bytes, batches_per_group, grouping_in_this_process
from shardstream._mosaic import MosaicParity, patch_mosaic_loader
from shardstream._native import Buffer
from shardstream._storage_options import option_pairs
from shardstream._units import parse_bytes, parse_count
from shardstream._world import Placement, in_dataloader_worker, iteration_seed, placement, worker_id
from shardstream.streams import Stream, as_stream, path_text

try:  # torch is optional: without it the dataset is a plain iterable.
    from torch.utils.data import IterableDataset as _Base
except ImportError:  # pragma: no cover - exercised only where torch is absent
    _Base = object  # type: ignore[assignment,misc]
else:
    # torch's DataLoader worker loop seeds `numpy.random` in every worker once numpy is loaded
    # (and this module loads it), importing `numpy.random` there if the parent had not: 12-15 ms
    # per worker, every epoch, before the worker's first sample. Imported once here, forked
    # workers inherit it. Only a speed-up: a numpy without it is torch's problem, not ours.
    try:
        import numpy.random  # noqa: F401
    except ImportError:  # pragma: no cover
        pass

# The engine keeps the read buffers of a finished dataset for the next one of the process
# (docs/streaming.md); a forked DataLoader worker makes its own and would only carry the
# parent's, unused, in its memory. Free them before every fork.
os.register_at_fork(before=_native.release_read_buffers)

DEFAULT_SEED = 9176
DEFAULT_WINDOW = 16

# Mosaic arguments that shardstream accepts for a one-line switch but does not need: the engine
# has its own download scheduling, sample order and partition.
_IGNORED_MOSAIC_ARGS = {
    "download_retry", "download_timeout", "keep_zip",
    "sampling_granularity", "partition_algo", "shuffle_algo",
    "batching_method", "allow_unsafe_types_in_streams",
}


def _starts(counts: Any) -> np.ndarray:
    """Where each of consecutive runs of `counts` items starts (int64, as Mosaic's offsets)."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.cumsum(counts) - counts


class VarColumn:
    """A variable-size column of a batch from `iter_batches`: all values' bytes end to end in
    one Rust-owned `Buffer` (`data`, read-only, no copy into Python) and `len + 1` offsets.
    Indexing gives a zero-copy `memoryview`; `np.frombuffer(col.data, ...)` reads it in place."""

    __slots__ = ("data", "offsets", "encoding")

    def __init__(self, data: Buffer | bytes, offsets: np.ndarray, encoding: str) -> None:
        self.data = data
        self.offsets = offsets
        self.encoding = encoding

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nbytes(self) -> int:
        """The bytes the column holds: its values and offsets (as numpy's `nbytes`)."""
        return len(self.data) + self.offsets.nbytes

    def __getitem__(self, i: int) -> memoryview:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for a column of {n} values")
        return memoryview(self.data)[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def tolist(self) -> list:
        """The values as `bytes` (or `str` for `str` columns)."""
        out = [bytes(self[i]) for i in range(len(self))]
        if self.encoding == "str":
            return [b.decode("utf-8") for b in out]
        return out

    def __repr__(self) -> str:
        return f"VarColumn({len(self)} values, {len(self.data)} bytes, {self.encoding})"


# Numeric columns up to this size cross a process boundary inside the batch's one small blob;
# larger ones pickle as arrays. A variable column's bytes never go in the blob: in a DataLoader
# worker they cross through the batch arena (`_reduce_buffer`).
_BLOB_MAX_BYTES = 64 * 1024
_OFFSETS = np.dtype("<u8")  # a VarColumn's offsets


class ColumnBatch(dict):
    """One batch from `iter_batches`: a `dict` of column name to numpy array or `VarColumn`.

    It pickles compactly, because a DataLoader worker pickles every batch it sends: the numeric
    columns and the variable columns' offsets go as one `bytes` blob with a small layout,
    instead of one numpy pickle each (about half the cost of pickling the plain dict). Values
    that are not the batch path's own (an entry a user added) pickle as they always do. As with
    a plain dict's pickle, the arrays it unpickles to are writable copies."""

    __slots__ = ()

    def __copy__(self) -> ColumnBatch:
        # A shallow copy (torch's default_convert copies a mapping before converting its values),
        # not a rebuild through `__reduce__`.
        return ColumnBatch(self)

    def __reduce__(self) -> tuple:
        layout: list[tuple] = []
        blob: list = []
        others: list = []
        size = 0
        for name, value in self.items():
            kind = type(value)
            if (kind is np.ndarray and value.nbytes <= _BLOB_MAX_BYTES and value.flags.c_contiguous
                    and not value.dtype.hasobject):
                layout.append((name, value.dtype.str, value.shape))
                blob.append(value)
                size += value.nbytes
                if size % 8:  # the next array starts 8-aligned
                    blob.append(bytes(8 - size % 8))
                    size += 8 - size % 8
            elif (kind is VarColumn and type(value.offsets) is np.ndarray and value.offsets.dtype == _OFFSETS
                    and value.offsets.flags.c_contiguous):
                layout.append((name, value.encoding, len(value.offsets)))
                blob.append(value.offsets)
                size += value.offsets.nbytes
                others.append(value.data)
            else:
                layout.append((name, None, None))
                others.append(value)
        return (_rebuild_column_batch, (tuple(layout), b"".join(blob), tuple(others)))


def _rebuild_column_batch(layout: tuple, blob: bytes, others: tuple) -> ColumnBatch:
    """Unpickles a `ColumnBatch`: its arrays are views of one writable copy of `blob`."""
    data = bytearray(blob)
    out = ColumnBatch()
    at = 0
    k = 0
    for name, spec, shape in layout:
        if spec is None:
            out[name] = others[k]
            k += 1
        elif type(shape) is tuple:
            dtype = np.dtype(spec)
            count = 1
            for d in shape:
                count *= d
            out[name] = np.frombuffer(data, dtype, count, at).reshape(shape)
            at += count * dtype.itemsize
            at += -at % 8
        else:
            out[name] = VarColumn(others[k], np.frombuffer(data, _OFFSETS, shape, at), spec)
            k += 1
            at += 8 * shape
    return out


def _cut(batch: ColumnBatch, size: int, count: int) -> list[ColumnBatch]:
    """`batch`'s `count` samples as consecutive batches of `size` (the last may be shorter), each
    a view of the same memory, with its variable columns' offsets starting at 0 as a batch read
    alone has them."""
    items = list(batch.items())
    parts = []
    for start in range(0, count, size):
        stop = min(start + size, count)
        part = ColumnBatch()
        for name, value in items:
            if type(value) is VarColumn:
                offsets = value.offsets[start : stop + 1]
                first = int(offsets[0])
                part[name] = VarColumn(value.data[first : int(offsets[-1])], offsets - np.uint64(first),
                                       value.encoding)
            else:
                part[name] = value[start:stop]
        parts.append(part)
    return parts


class StreamingDataset(MosaicParity, _Base):  # type: ignore[misc,valid-type]
    """Streams an MDS dataset into PyTorch; Mosaic's arguments, shardstream's engine.

    `remote` is the dataset (`s3://`, `gs://`, `az://`, a path); `local` is where its shards are
    cached (Mosaic's meaning) or, without `remote`, the dataset itself. `streams` (a list of
    `shardstream.Stream`) mixes several datasets instead, with `epoch_size` as in Mosaic. Samples
    are dicts decoded as Mosaic decodes them; with `zero_copy=True`, `bytes` columns come as
    read-only `shardstream.Buffer`s over the engine's read (no copy) instead of `bytes`. See
    docs/python.md for every argument and for resume.
    """

    _ramp = True  # instances pickled before `shuffle_ramp` existed have no attribute of their own
    _iter_batch: int | None = None  # the current iteration's batch size (set by `_stream`)
    # Instances pickled before the prefetch existed have neither.
    _prefetch: _native.NativePrefetch | None = None
    _prefetch_pid: int | None = None
    _iterations = 0  # iterations this object (or copy) has started
    _current: tuple[int, Any] | None = None  # (index, sample) being handed to a subclass's `self[index]`
    # Set on the training process's object only while `StreamingDataLoader` starts its workers
    # after reading worker 0's first batch itself (`_first_batch`), so that the copies get them:
    # the iteration's name (its start marker) and the random state worker 0 would have after that
    # batch. A copy uses them in its first `_stream`.
    _head_name: str | None = None
    _head_rng: tuple | None = None

    def __init__(
        self,
        remote: str | os.PathLike[str] | None = None,
        local: str | os.PathLike[str] | None = None,
        *,
        streams: Sequence[Stream] | None = None,
        epoch_size: int | str | None = None,
        split: str | None = None,
        shuffle: bool = False,
        shuffle_seed: int = DEFAULT_SEED,
        shuffle_block_size: int | None = None,
        batch_size: int | None = None,
        cache_limit: int | str | None = None,
        memory_limit: int | str | None = None,
        predownload: int | None = None,
        num_canonical_nodes: int | None = None,
        validate_hash: str | bool | None = None,
        allow_unsafe_types: bool = False,
        shuffle_window: int | None = None,
        shuffle_ramp: bool = True,
        remainder: str = "pad",
        cache_root: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        node_rank: int | None = None,
        zero_copy: bool = False,
        prefetch_on_init: bool = True,
        replication: int | None = None,
        sampling_method: str = "balanced",
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        remote, local, cache_root = path_text(remote), path_text(local), path_text(cache_root)
        stream_local = None
        # Mosaic 0.13 builds its one stream from a registry: "stream" (its MDS stream, and ours)
        # with `stream_config` as extra Stream arguments; other names are Databricks' Delta tables.
        stream_name = kwargs.pop("stream_name", "stream")
        stream_config = kwargs.pop("stream_config", None)
        if stream_name != "stream":
            raise ValueError(f"stream_name={stream_name!r} is not supported: shardstream reads MDS "
                             "datasets (Mosaic's stream_name='stream')")
        if stream_config and streams is None:
            # As Mosaic's, the dataset's own remote, local and split win over the config's.
            config = {k: v for k, v in stream_config.items() if k not in ("remote", "local", "split")}
            one = Stream(remote=remote, local=local, split=split, **config)  # checks the arguments
            if (one.proportion, one.repeat, one.choose) != (None, None, None):
                # A weight sizes the epoch as it would one stream of a mix.
                streams, remote, local, split = [one], None, None, None
        unknown = set(kwargs) - _IGNORED_MOSAIC_ARGS
        if unknown:
            raise TypeError(f"StreamingDataset got unexpected arguments: {sorted(unknown)}")
        if kwargs:
            warnings.warn(
                f"shardstream ignores the mosaicml-streaming arguments {sorted(kwargs)}",
                stacklevel=2,
            )
        if streams is not None:
            streams = list(streams)
            if not streams:
                raise ValueError("streams must hold at least one Stream")
            if remote is not None or local is not None:
                raise ValueError("give either streams or remote/local, not both")
            streams = [as_stream(s) for s in streams]
            # As in Mosaic, a remote Stream's `local` is where its shards are cached. The engine
            # keeps one cache folder per dataset: the first such `local` is the mix's.
            stream_locals = [s.local for s in streams if s.remote is not None and s.local is not None]
            if stream_locals:
                stream_local = stream_locals[0]
                if any(other != stream_local for other in stream_locals[1:]):
                    warnings.warn(
                        f"the Streams give several local folders; shardstream caches a mix in one "
                        f"folder, the first Stream's: {stream_local}",
                        stacklevel=2,
                    )
        elif remote is None and local is None:
            raise ValueError("StreamingDataset needs remote, local, or both")
        epoch_size = parse_count(epoch_size, "epoch_size")
        if remainder not in ("pad", "drop"):
            raise ValueError(f"remainder must be 'pad' or 'drop', got {remainder!r}")
        self.remote = remote
        self.local = local
        self.split = split
        self.shuffle = bool(shuffle)
        self.shuffle_seed = int(shuffle_seed)
        self.shuffle_block_size = shuffle_block_size
        self.batch_size = batch_size
        self.predownload = predownload
        self.num_canonical_nodes = num_canonical_nodes
        self.remainder = remainder
        self.streams = streams
        self.zero_copy = bool(zero_copy)
        self.sampling_method = sampling_method
        self.replication = None if replication is None else int(replication)
        if self.replication is not None:
            placement().replicated(self.replication)  # a factor that does not fit fails here
        specs = [s._native_spec() for s in streams] if streams is not None else None
        self._open_args = dict(
            remote=specs[0][0] if specs else (remote if remote is not None else local),
            streams=specs,
            epoch_size=epoch_size,
            zero_copy=self.zero_copy,
            sampling_method=sampling_method,
            split=split,
            local=local if remote is not None else stream_local,
            cache_root=cache_root,
            run_id=run_id,
            node_rank=node_rank,
            memory_limit=parse_bytes(memory_limit, "memory_limit"),
            cache_limit=parse_bytes(cache_limit, "cache_limit"),
            validate_hash=bool(validate_hash),
            allow_unsafe_types=bool(allow_unsafe_types),
            storage_options=option_pairs(storage_options),
        )
        self._native_ds: _native.NativeDataset | None = None
        self._native_pid: int | None = None
        self._shuffle_window = shuffle_window
        self._window: int | None = None
        self._ramp = self._sample_ramp = bool(shuffle_ramp)
        self._lanes: int | None = None if num_canonical_nodes is None else int(num_canonical_nodes)
        self._epoch = 0
        self._resume_start = 0  # positions of self._epoch consumed before this run
        self._yielded = 0  # samples this process (or worker) yielded in the current iteration
        self._worker_skip = 0  # batches this DataLoader worker had yielded (StatefulDataLoader)
        # Which epochs this object's DataLoader workers started and finished (shardstream._epochs);
        # a new lineage at each explicit choice of the epoch, all removed with this object.
        self._lineages = [EpochRecords()]
        weakref.finalize(self, _discard_lineages, self._lineages)
        self._native()  # open now: a bad URL or index fails here, not in a worker
        patch_mosaic_loader()  # Mosaic's own StreamingDataLoader saves this dataset's state too
        if prefetch_on_init:
            self._start_prefetch()

    # -- native handle --------------------------------------------------------------------

    def _native(self) -> _native.NativeDataset:
        if self._native_ds is None:
            self._native_ds = _native.NativeDataset(self._open_args)
        return self._native_ds

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_native_ds"] = None  # reopened in the child (spawn); the engine is per process
        state["_prefetch"] = None  # the parent's downloads; the child finds them in the cache
        state.pop("_preparing", None)  # prepare_shard(blocking=False) downloads, as the prefetch
        return state

    # -- prefetch at construction -----------------------------------------------------------

    def _start_prefetch(self) -> None:
        """Starts downloading, in this process's background, the first shards of this process's
        part of the next iteration (the first shuffle window of it), so that the DataLoader
        workers forked or spawned later find them in the node's cache or join them as they
        arrive (docs/python.md, "Prefetch at construction"). Replaces an earlier one."""
        self._stop_prefetch()
        p = self._placement()
        order = self._order(p, fix=False)  # lanes and window are fixed at the first iteration
        plan = _plan(order, self._epoch, p, self._resume_start)
        self._prefetch = self._native().prefetch(plan, max(1, order.window))
        self._prefetch_pid = os.getpid()

    def _stop_prefetch(self) -> None:
        """Starts no further prefetch download (those under way finish). In a forked DataLoader
        worker the handle is the parent's: dropping it there touches nothing."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and self._prefetch_pid == os.getpid():
            prefetch.cancel()

    def _retarget_prefetch(self) -> None:
        """After the epoch or the start position changed: prefetch for the new one instead, if
        this process was prefetching."""
        if self._prefetch is not None and self._prefetch_pid == os.getpid():
            self._start_prefetch()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # -- shape ----------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples in the dataset."""
        return self._native().num_samples

    @property
    def samples_per_stream(self) -> list[int]:
        """Samples in each stream (one entry without `streams`), as Mosaic's attribute."""
        return [n for n, _ in self._native().stream_sizes()]

    # Mosaic's names for the dataset's layout, as numpy int64 arrays like Mosaic's (code that
    # maps a sample index to its shard or stream reads them).
    @property
    def size(self) -> int:
        """Samples in the dataset (Mosaic's `size`, the same as `num_samples`)."""
        return self.num_samples

    @property
    def length(self) -> int:
        """Samples this process yields in an epoch (Mosaic's `length`, the same as `len`)."""
        return len(self)

    @property
    def num_shards(self) -> int:
        return self._native().num_shards

    @property
    def num_streams(self) -> int:
        return len(self._native().stream_shards())

    @property
    def samples_per_shard(self) -> np.ndarray:
        return np.asarray(self._native().shard_sizes(), dtype=np.int64)

    @property
    def sample_offset_per_shard(self) -> np.ndarray:
        return _starts(self.samples_per_shard)

    @property
    def shards_per_stream(self) -> np.ndarray:
        return np.asarray(self._native().stream_shards(), dtype=np.int64)

    @property
    def shard_offset_per_stream(self) -> np.ndarray:
        return _starts(self.shards_per_stream)

    @property
    def sample_offset_per_stream(self) -> np.ndarray:
        return _starts(self.samples_per_stream)

    @property
    def stream_per_shard(self) -> np.ndarray:
        shards = self.shards_per_stream
        return np.repeat(np.arange(len(shards), dtype=np.int64), shards)

    def get_item(self, index: int) -> Any:
        """Sample `index` (random access; fetches its shard through the cache). As in Mosaic,
        `ds[index]` calls it, and iteration calls `ds[index]` when a subclass overrides
        `__getitem__` or `get_item`; the sample being iterated is then served from the stream."""
        current = self._current
        if current is not None and current[0] == index:
            return current[1]
        return self._native().get(int(index))

    @property
    def choose_per_stream(self) -> list[int]:
        """Samples each stream gives an epoch: its weight resolved as Mosaic resolves it."""
        return [k for _, k in self._native().stream_sizes()]

    @property
    def epoch_size(self) -> int:
        """Samples in an epoch before padding (all streams' `choose` together), as Mosaic's."""
        return sum(self.choose_per_stream)

    @property
    def columns(self) -> dict[str, str]:
        """Column name to MDS encoding."""
        return dict(self._native().columns)

    @property
    def cache_dir(self) -> str:
        """This node's cache folder for the dataset."""
        return str(self._native().cache_dir)

    def metrics(self, node: bool = False) -> dict:
        """This process's engine counters (fetched bytes, cache hits, memory in use, ...). With
        `node=True`, the sum over every process of the node that streams into the same cache
        folder (each rank, each DataLoader worker, a mount), exited ones included, as
        `shardstream run` serves it to Prometheus; published by each process once a second and
        when its stream ends."""
        return self._native().metrics(node)

    def _placement(self) -> Placement:
        """This process's placement; with `replication`, its replication group's."""
        p = placement()
        return p.replicated(self.replication) if self.replication else p

    def _order(self, p: Placement, fix: bool = True) -> _native.Order:
        """The order's settings; with `fix`, lanes and window are kept for the rest of the run."""
        lanes = self._lanes
        if lanes is None:
            lanes = p.nodes  # Mosaic's default: the node count at the start of the run
        window = self._window
        if window is None:
            if self._shuffle_window is not None:
                window = int(self._shuffle_window)
            elif self.shuffle_block_size is not None:
                sizes = [s for s in self._native().shard_sizes() if s > 0]
                per_shard = sum(sizes) / max(len(sizes), 1)
                window = max(1, round(self.shuffle_block_size / max(per_shard, 1)))
            else:
                window = DEFAULT_WINDOW
        if fix:
            self._lanes, self._window = lanes, window
        return _native.Order(
            seed=self.shuffle_seed,
            shuffle=self.shuffle,
            window=window,
            lanes=lanes,
            remainder=self.remainder,
            ramp=self._ramp,
            # Instances pickled before the sample ramp existed follow their shard ramp.
            sample_ramp=getattr(self, "_sample_ramp", self._ramp),
        )

    def __len__(self) -> int:
        """Samples this process yields in an epoch (its DataLoader workers together)."""
        return self._process_len(self._placement(), self._epoch)

    def _process_len(self, p: Placement, epoch: int) -> int:
        """Samples process `p` yields in `epoch`."""
        n = self._native().epoch_len(self._order(p), epoch)
        if self.remainder == "pad":
            return -(-n // p.processes)
        return n // p.processes

    def __getitem__(self, index: int) -> Any:
        """Sample `index` (random access; fetches its shard through the cache): `get_item`."""
        return self.get_item(index)

    def _transforms_samples(self) -> bool:
        """Whether a subclass overrides `__getitem__` or `get_item` (Mosaic's way to transform
        samples: its iteration yields `self[index]`)."""
        cls = type(self)
        return cls.__getitem__ is not StreamingDataset.__getitem__ or cls.get_item is not StreamingDataset.get_item

    # -- epochs and resume ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch the next iteration streams (each epoch has its own shuffle). Without
        it, each iteration streams the next epoch, also through DataLoader workers."""
        self._lineages.append(EpochRecords())
        changed = epoch != self._epoch
        if changed:
            self._resume_start = 0
        self._epoch = int(epoch)
        self._yielded = 0
        self._announce_choice()
        if changed:
            self._retarget_prefetch()

    @property
    def epoch(self) -> int:
        """The epoch the current iteration streams (the next one, between iterations of a
        single process)."""
        self._catch_up()
        return self._epoch

    def _catch_up(self) -> None:
        """Moves this object to the latest epoch its DataLoader workers started (they stream
        copies of it, which move to the next epoch by themselves)."""
        latest = self._lineages[-1].latest_started()
        if latest is not None and latest > self._epoch:
            self._start_epoch(latest)

    def _start_epoch(self, epoch: int) -> None:
        """Moves to the start of `epoch` (reached through the lineage's markers)."""
        self._epoch, self._resume_start, self._yielded, self._worker_skip = epoch, 0, 0, 0

    def state_dict(self, num_samples: int | None = None, from_beginning: bool = True) -> dict:
        """The position to resume from, as Mosaic's `state_dict`: `num_samples` is the number of
        samples the whole job consumed in this epoch (all ranks: steps x batch x world), counted
        from the epoch's start (`from_beginning`) or from where this run resumed. Without it,
        this process's own count is used (exact with `num_workers=0`)."""
        self._catch_up()
        p = self._placement()
        order = self._order(p)
        worker = None
        if num_samples is None and p.workers > 1:
            # Called inside a DataLoader worker (torchdata's StatefulDataLoader does): this
            # worker's progress, relative to the iteration's common start.
            consumed = self._resume_start
            batch = int(self._iter_batch or self.batch_size or 1)
            worker = {
                "id": p.worker,
                "workers": p.workers,
                "batches": self._worker_skip + -(-self._yielded // batch),
            }
        elif num_samples is None:
            consumed = self._resume_start + self._yielded * p.processes
        elif from_beginning:
            consumed = int(num_samples)
        else:
            consumed = self._resume_start + int(num_samples)
        state = json.loads(self._native().state(order, self._epoch, consumed).to_json())
        out = {
            "epoch": self._epoch,
            "sample_in_epoch": state["consumed"],
            "num_canonical_nodes": order.lanes,
            "shuffle_seed": self.shuffle_seed,
            "initial_physical_nodes": p.nodes,
            "shardstream": state,
        }
        if worker is not None:
            out["worker"] = worker
        return out

    def load_state_dict(self, obj: Mapping[str, Any]) -> None:
        """Continues from a `state_dict` (also one saved by a job of another size): the next
        iteration starts at the first sample the saved job had not consumed."""
        mosaic_start = self._check_mosaic_state(obj)  # refuses before anything changes
        self._lineages.append(EpochRecords())
        if "shardstream" in obj:
            state = self._native().parse_state(json.dumps(obj["shardstream"]))
            order = state.order
            self.shuffle_seed, self.shuffle = order.seed, order.shuffle
            self._ramp, self._sample_ramp = order.ramp, order.sample_ramp
            self._window, self._lanes, self.remainder = order.window, order.lanes, order.remainder
            epoch, consumed, epoch_len = state.epoch, state.consumed, state.epoch_len
        else:  # a Mosaic-style dict
            # Saved by mosaicml-streaming: resumable here at an epoch's boundary only (its
            # order is not shardstream's); mid-epoch it is refused, never loaded into another order.
            epoch, consumed = mosaic_start or (int(obj["epoch"]), int(obj["sample_in_epoch"]))
            self.shuffle_seed = int(obj.get("shuffle_seed", self.shuffle_seed))
            self._lanes = int(obj.get("num_canonical_nodes") or self._lanes or 1)
            epoch_len = self._native().epoch_len(self._order(self._placement()), epoch)
        self._worker_skip = 0
        worker = obj.get("worker")
        if worker is not None:
            p = self._placement()
            if (worker["id"], worker["workers"]) != (p.worker, p.workers):
                raise ValueError(
                    f"this state is DataLoader worker {worker['id']} of {worker['workers']}'s; "
                    f"it is loaded into worker {p.worker} of {p.workers} (keep num_workers when "
                    "resuming through StatefulDataLoader, or save state_dict(num_samples=...))"
                )
            self._worker_skip = int(worker["batches"])
        elif consumed >= epoch_len:
            epoch, consumed = epoch + 1, 0
        self._epoch = epoch
        self._resume_start = consumed
        self._yielded = 0
        if worker is None:
            self._announce_choice()
        self._retarget_prefetch()

    # What `set_epoch` and `load_state_dict` choose, as copies made earlier take it over.
    _CHOSEN = ("_epoch", "_resume_start", "shuffle_seed", "shuffle", "_window", "_lanes", "remainder",
               "_ramp", "_sample_ramp")

    def _announce_choice(self) -> None:
        """After `set_epoch` / `load_state_dict` in the training process: tells the copies of
        this dataset made before (persistent DataLoader workers) the new lineage and what was
        chosen (see `_epochs`)."""
        if not in_dataloader_worker() and len(self._lineages) > 1:
            self._lineages[-2].replaced_by(self._lineages[-1], {k: getattr(self, k) for k in self._CHOSEN})

    def _follow_choices(self) -> None:
        """In a copy made before the training process's latest `set_epoch` / `load_state_dict`
        (a persistent worker's): takes that choice over, as a copy made after it would have.
        Only in a DataLoader worker: copies of the object in other processes (a `deepcopy`, one
        object pickled to several ranks) share its keys and make their own choices."""
        if not in_dataloader_worker():
            return
        while True:
            found = self._lineages[-1].replacement()
            if found is None:
                return
            lineage, chosen = found
            self._lineages.append(lineage)
            for name in self._CHOSEN:
                if name in chosen:
                    setattr(self, name, chosen[name])
            self._yielded = self._worker_skip = 0

    # -- iteration ------------------------------------------------------------------------

    def _stream(self, batch_size: int, raw: bool):
        # The stream takes over: it joins the prefetch's downloads and fetches the rest.
        self._stop_prefetch()
        patch_mosaic_loader()  # a Mosaic StreamingDataLoader made after the dataset
        self._iter_batch = batch_size
        self._iterations += 1
        self._follow_choices()
        # What the training process read is this copy's first iteration's only (persistent
        # workers keep their copies for the later ones).
        name, rng = self._head_name, self._head_rng
        self._head_name, self._head_rng = None, None
        epoch = self._lineages[-1].start(self._epoch, name or self._iteration_name())
        if epoch != self._epoch:  # an earlier iteration started this copy's epoch
            self._start_epoch(epoch)
            name = rng = None
        p = self._placement()
        start, worker = self._resume_start, p.worker
        skip = self._worker_skip
        if name is not None and p.worker == 0:
            # The training process yielded this worker's first batch (`_first_batch`); the
            # worker goes on from the random state it would have had after it.
            skip = 1
            if rng is not None:
                set_random_states(rng)
        if skip:
            # This worker already yielded batches w, w + W, ... (k of them): start the stream at
            # its next batch, as worker 0 of a world whose start is that batch's first position.
            step = p.processes * batch_size
            start += (p.worker + skip * p.workers) * step
            worker = 0
        order = self._order(p)
        plan = _plan(order, self._epoch, p, start, workers=p.workers, batch_size=batch_size, worker=worker)
        return self._native().stream(plan, raw), p

    def _iteration_name(self) -> str:
        """What names the iteration starting now in every DataLoader worker of it (see
        `_epochs`): the DataLoader's base seed of this iterator and this copy's count of its
        iterations (persistent workers keep their copies, and their seeds); in a single process,
        a name of its own."""
        base = iteration_seed()
        if base is None:
            return uuid.uuid4().hex
        return f"{base}.{self._iterations}"

    def __iter__(self) -> Iterator[dict]:
        """This process's (or DataLoader worker's) samples of the epoch, in order."""
        batch = int(self.batch_size or 1)
        stream, p = self._stream(batch, raw=False)
        self._yielded = 0
        try:
            yield from self._samples_of(stream, batch)
        finally:
            stream.close()
        self._iteration_ended(p)

    def _samples_of(self, stream: Any, batch: int) -> Iterator[Any]:
        """The samples of `stream`, read `batch` at a time, counted in `_yielded`."""
        if self._transforms_samples():
            # As Mosaic's iteration: each sample through `self[index]`, which a subclass
            # overrides to transform it; its `super().__getitem__(index)` gets the sample
            # just streamed (`get_item`), not a second read.
            while True:
                samples = stream.next_samples(batch, True)
                if not samples:
                    break
                for current in samples:
                    self._yielded += 1
                    self._current = current
                    try:
                        item = self[current[0]]
                    finally:
                        self._current = None
                    yield item
        elif in_dataloader_worker() and _transport.arena_size():
            # In a DataLoader worker, large `bytes` values cross to the training process
            # through the worker's shared ring (`_transport`; docs/python.md).
            share = _transport.share
            while True:
                samples = stream.next_samples(batch)
                if not samples:
                    break
                for sample in samples:
                    self._yielded += 1
                    yield share(sample)
        else:
            while True:
                samples = stream.next_samples(batch)
                if not samples:
                    break
                for sample in samples:
                    self._yielded += 1
                    yield sample

    def _first_batch(
        self, batch_size: int, columns: list[str] | None, raw: bool, workers: int
    ) -> FirstBatch | None:
        """Reads, in this process, the batch its DataLoader worker 0 would yield first in the
        next iteration (`StreamingDataLoader`; docs/python.md, "The first batch before the
        workers"): the workers split this process's part by batch, round robin from worker 0,
        so the first `batch_size` samples of the part are worker 0's first batch. Worker 0 then
        starts at its second batch, the others as usual (`_stream`), and the loader takes
        their batches round robin from worker 1. `None` (nothing read or recorded) where the
        rest of the part would not give each of the `workers` a batch.

        The iteration starts as a worker's would: its start marker, under a name of its own
        that the workers are given, takes the epoch after the latest started (or the chosen
        one). The batch is a `ColumnBatch` with `raw`, else the list of samples (through a
        subclass's `self[index]`)."""
        p = self._placement()
        order = self._order(p)
        latest = self._lineages[-1].latest_started()
        epoch = self._epoch if latest is None else latest + 1
        start = self._resume_start if epoch == self._epoch else 0
        if self._process_len(p, epoch) - start // p.processes < batch_size * (workers + 1):
            return None
        name = f"first-{uuid.uuid4().hex}"
        epoch = self._lineages[-1].start(self._epoch, name)
        if epoch != self._epoch:
            self._stop_prefetch()  # it was downloading an earlier epoch's shards
            self._start_epoch(epoch)
        plan = _plan(order, self._epoch, p, self._resume_start, batch_size=batch_size)
        stream = self._native().stream(plan, raw)
        try:
            if raw:
                count, batch = self._next_column_batch(stream, batch_size, columns, self.columns, False)
            else:
                batch = list(islice(self._samples_of(stream, batch_size), batch_size))
                count = len(batch)
        finally:
            stream.close()
        self._yielded = 0
        return FirstBatch(count, batch, name, self._lineages[-1])

    def _iteration_ended(self, p: Placement) -> None:
        """An iteration ran to its end. It is recorded (see `_epochs`); in a single process the
        epoch is over for this object itself, so `epoch` and `state_dict` name the next one."""
        self._lineages[-1].finish(self._epoch, p.worker, p.workers)
        if p.workers == 1:
            self._epoch += 1
            self._resume_start = 0
            self._yielded = 0

    def iter_batches(
        self, batch_size: int, columns: Sequence[str] | None = None
    ) -> ColumnBatches:
        """Batches of columns without a Python object per sample: fixed-size numeric columns
        (`int`, `uint8`..`float64`, `ndarray:DTYPE:SHAPE`) as numpy arrays of shape
        `(n, *shape)`, every other column as a `VarColumn` (one buffer and offsets). Splits
        the epoch over ranks and DataLoader workers like `__iter__`. The result is itself an
        `IterableDataset`: `DataLoader(ds.iter_batches(64), batch_size=None, num_workers=2)`.
        The columns are the stored ones: a subclass's `__getitem__` is not applied (a warning
        says so)."""
        if self._transforms_samples():
            warnings.warn(
                f"iter_batches yields the stored columns; {type(self).__name__}'s __getitem__/get_item "
                "is not applied to them (iterate the dataset for transformed samples)",
                stacklevel=2,
            )
        return ColumnBatches(self, int(batch_size), list(columns) if columns else None)

    def _column_batches(
        self, batch_size: int, columns: list[str] | None
    ) -> Iterator[ColumnBatch | BatchGroup]:
        encodings = self.columns
        stream, p = self._stream(batch_size, raw=True)
        self._yielded = 0
        # In a DataLoader worker, variable columns cross to the main process through shared
        # memory (see `_reduce_buffer`).
        shared = in_dataloader_worker() and _transport.worker_shm_enabled()
        if shared:
            _share_buffers_in_this_worker()
        try:
            if grouping_in_this_process():  # set in StreamingDataLoader's workers only
                yield from self._batch_groups(stream, batch_size, columns, encodings, shared)
            else:
                while True:
                    count, batch = self._next_column_batch(stream, batch_size, columns, encodings, shared)
                    if count == 0:
                        break
                    yield batch
        finally:
            stream.close()
        self._iteration_ended(p)

    def _next_column_batch(
        self, stream: Any, n: int, columns: list[str] | None, encodings: dict[str, str], shared: bool
    ) -> tuple[int, ColumnBatch]:
        """The stream's next `n` samples as one batch and their count (fewer only at the end,
        0 after it)."""
        count, cols = stream.next_columns(n, columns, shared)
        out = ColumnBatch()
        if count == 0:
            return 0, out
        for name, (dtype, shape_or_offsets, data) in cols.items():
            if dtype is not None:
                out[name] = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(
                    (count, *shape_or_offsets)
                )
            else:
                offsets = np.frombuffer(shape_or_offsets, dtype=_OFFSETS)
                out[name] = VarColumn(data, offsets, encodings[name])
        self._yielded += count  # what `state_dict()` counts, as `__iter__` does
        return count, out

    def _batch_groups(
        self, stream: Any, batch_size: int, columns: list[str] | None, encodings: dict[str, str],
        shared: bool,
    ) -> Iterator[BatchGroup]:
        """This worker's batches in groups, for `StreamingDataLoader` (see `_groups`): the first
        group holds one batch (the first sample is not delayed), the next ones as many batches
        as fit in `GROUP_BYTES`, each group read in one native call and cut into batches of
        `batch_size`, the same batches `_column_batches` yields one by one."""
        worker = worker_id()
        per_group = 1
        while True:
            n = batch_size * per_group
            # A group of several batches is cut into slices, which cross as bytes: no arena slot.
            count, batch = self._next_column_batch(stream, n, columns, encodings, shared and per_group == 1)
            if count == 0:
                yield BatchGroup(worker, [], True)
                return
            last = count < n
            yield BatchGroup(worker, [batch] if per_group == 1 else _cut(batch, batch_size, count), last)
            if last:
                return
            per_group = batches_per_group(approx_bytes(batch) * batch_size // max(1, count))


class FirstBatch(NamedTuple):
    """What `StreamingDataset._first_batch` read: the samples' count, the batch, the
    iteration's name and the lineage it started in."""

    count: int
    batch: Any
    name: str
    lineage: EpochRecords


def random_states() -> tuple:
    """This process's `random`, numpy and torch CPU generator states."""
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def set_random_states(states: tuple) -> None:
    """Restores states taken by `random_states`."""
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _discard_lineages(lineages: list[EpochRecords]) -> None:
    for records in lineages:
        records.discard()


def _plan(
    order: _native.Order, epoch: int, p: Placement, start: int, workers: int = 1, batch_size: int = 1,
    worker: int = 0,
) -> _native.Plan:
    """What the native calls stream: `epoch` of `order` from global position `start`, read by
    DataLoader `worker` of `workers` of process `p` (a prefetch uses the process only)."""
    world = _native.World(nodes=p.nodes, processes_per_node=p.processes_per_node, workers=workers,
                          batch_size=batch_size)
    rank = _native.Rank(node=p.node, local_process=p.local_process, worker=worker)
    return _native.Plan(order=order, epoch=epoch, world=world, rank=rank, start=start)


def _reduce_buffer(buf: Buffer) -> tuple:
    """How a DataLoader worker pickles a `Buffer` for the main process: a buffer in the
    worker's batch arena by its slot's address (the main process maps the same pages), any
    other as `bytes`."""
    address = buf._share()
    if address is None:
        return (bytes, (bytes(buf),))
    return (_native._attach_buffer, (address,))


def _share_buffers_in_this_worker() -> None:
    """Registers `_reduce_buffer` with multiprocessing's pickler (what a DataLoader's queues
    use; registering again only sets the same entry); plain `pickle` still gives `bytes`."""
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(Buffer, _reduce_buffer)


class ColumnBatches(_Base):  # type: ignore[misc,valid-type]
    """What `StreamingDataset.iter_batches` returns: an iterable (and, with torch, an
    `IterableDataset`) of column batches. Each `iter()` streams this process's (or DataLoader
    worker's) share of the dataset's current epoch; give it to a DataLoader with
    `batch_size=None` so that the batches are not collated again."""

    def __init__(self, dataset: StreamingDataset, batch_size: int, columns: list[str] | None) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.columns = columns

    def __iter__(self) -> Iterator[ColumnBatch]:
        return self.dataset._column_batches(self.batch_size, self.columns)

    # The dataset's resume and epoch calls, so that what holds only this object (torchdata's
    # StatefulDataLoader asks its dataset, and in each worker that worker's copy) resumes exactly.
    def state_dict(self, num_samples: int | None = None, from_beginning: bool = True) -> dict:
        """The dataset's `state_dict`: with no argument, this process's (or DataLoader worker's)
        own count of the samples its batches held."""
        return self.dataset.state_dict(num_samples, from_beginning)

    def load_state_dict(self, obj: Mapping[str, Any]) -> None:
        """The dataset's `load_state_dict`: the next iteration starts where the state left off."""
        self.dataset.load_state_dict(obj)

    def set_epoch(self, epoch: int) -> None:
        """The dataset's `set_epoch`."""
        self.dataset.set_epoch(epoch)


def open(url: str, **kwargs: Any) -> StreamingDataset:  # noqa: A001 - mirrors builtins.open on purpose
    """Opens a dataset for random access (`len(ds)`, `ds[i]`, `ds.num_samples`) and plain
    iteration in dataset order; keyword arguments as for `StreamingDataset`."""
    return StreamingDataset(remote=url, **kwargs)

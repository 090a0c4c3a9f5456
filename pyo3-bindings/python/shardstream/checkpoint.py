"""torch.distributed.checkpoint (DCP) backends that save to and load from object storage.

    import torch.distributed.checkpoint as dcp
    from shardstream.checkpoint import StorageWriter, StorageReader, latest

    dcp.save(state, storage_writer=StorageWriter("s3://bucket/run/ckpt/step_100"))
    url = latest("s3://bucket/run/ckpt")            # ".../step_100", or None
    dcp.load(state, storage_reader=StorageReader(url))

A checkpoint URL is ``<root>/<checkpoint-id>``. Uploads, the commit, checksums and ranged reads
are done by the Rust core (``shardstream._native``) with the GIL released; this module only
adapts DCP's calls. The layout keeps DCP's own ``_StorageInfo`` records and ``.metadata``, so a
checkpoint saved here into a directory loads with torch's ``FileSystemReader``, and one saved by
torch's ``FileSystemWriter`` loads with :class:`StorageReader`. See docs/checkpoints.md.
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import logging
import os
import pickle
import sys
import uuid
import warnings
import zipfile
from collections.abc import Mapping
from typing import Any, Iterable

import torch
from torch.distributed.checkpoint import Metadata, StorageReader as _DcpReader
from torch.distributed.checkpoint import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from shardstream._native import CheckpointError, CheckpointStore
from shardstream._storage_options import option_pairs

__all__ = ["StorageWriter", "StorageReader", "latest", "list_checkpoints", "verify"]

log = logging.getLogger(__name__)

#: The write result a rank adds to its list to carry its file records and per-item CRC32Cs to
#: the coordinator (dropped from ``Metadata.storage_data`` in :meth:`StorageWriter.finish`).
_RECORDS_FQN = "__shardstream_rank_records__"
#: Manifest metadata key holding ``{relative path: [[offset, length, crc32c], ...]}``.
_ITEM_CRCS = "dcp_item_crc32c"
_METADATA = ".metadata"
#: Bytes a load keeps in flight (fetched or arriving) while it decodes what has arrived: the
#: save's default upload budget, so a load holds no more than a save. 512 rather than 256 MiB
#: took a 1 GiB load (8 x 128 MiB tensors) from ~950 to ~1,170 MB/s against s3s-fs (issue 41).
_READ_WINDOW_BYTES = 512 << 20
#: Smallest item a load reads in place (`_stored_tensor`) rather than through torch.load: below
#: it, the archive's second parse (~0.1 ms) costs more than the copy it saves.
_IN_PLACE_MIN_BYTES = 1 << 20
#: Bytes of one fetch unit of a load (the items of one file, cut between items): about the
#: default part size, so that a part that went up as one PUT comes back as one GET.
_READ_UNIT_BYTES = 64 << 20
#: Largest piece of ``torch.save`` output handed to the uploader in one call.
_SAVE_CHUNK = 16 << 20


class _ItemSink:
    """The file object ``torch.save`` writes an item into: its output goes to the native
    uploader in pieces of at most ``_SAVE_CHUNK`` bytes, so a tensor is never serialised into
    one big in-memory buffer, and is not copied on the Python side (memory stays within the
    upload budget)."""

    def __init__(self, file) -> None:
        self.file = file
        self.written = 0
        #: What a write raised: torch.save's zip writer turns it into its own RuntimeError
        #: ("unexpected pos") when it closes, which would hide a KeyboardInterrupt.
        self.error: BaseException | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            for start in range(0, len(view), _SAVE_CHUNK):
                # A view, not a copy: the native side copies it once into the part buffer.
                self.file.write(view[start : start + _SAVE_CHUNK])
        except BaseException as e:
            self.error = e
            raise
        self.written += len(view)
        return len(view)

    def save(self, tensor: torch.Tensor) -> None:
        """``torch.save(tensor)`` into the file, raising what the upload raised, if anything."""
        try:
            torch.save(tensor, self)
        except BaseException:
            if self.error is not None:
                raise self.error
            raise

    def flush(self) -> None:
        pass


def split_url(url: str | os.PathLike) -> tuple[str, str]:
    """``<root>/<id>`` -> ``(root, id)``."""
    text = os.fspath(url).rstrip("/")
    root, sep, cid = text.rpartition("/")
    if not sep or not cid or not root:
        raise CheckpointError(f"checkpoint URL {text!r}: expected <root>/<checkpoint-id>")
    if root.endswith(":/"):  # "s3://bucket" split as "s3:/" + "bucket"
        raise CheckpointError(f"checkpoint URL {text!r}: the checkpoint id needs a root above it")
    return root, cid


def _store(root: str, storage_options: list[tuple[str, str]] | None = None) -> CheckpointStore:
    return CheckpointStore(root, storage_options or [])


def _cpu_contiguous(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    # A view would drag its whole storage into torch.save; copy just the projection.
    if t.untyped_storage().size() != t.nbytes or t.storage_offset() != 0:
        t = t.clone()
    return t


#: Bytes ``torch.save`` adds around a tensor's data (zip headers, pickle), for packing and for
#: the size a file is planned with: an upper bound (about 1.5 KiB in practice).
_ITEM_OVERHEAD = 4096


def _item_nbytes(item: WriteItem) -> int:
    td = item.tensor_data
    if td is None:
        return _ITEM_OVERHEAD
    return td.chunk.sizes.numel() * torch._utils._element_size(td.properties.dtype) + _ITEM_OVERHEAD


def _pack_items(items: list[WriteItem], min_files: int, target: int) -> list[list[WriteItem]]:
    """Items into files of at most ``target`` bytes where they fit (first fit, largest first;
    an item larger than ``target`` gets a file of its own), at least ``min_files`` of them.
    Files no larger than a part go up in one PUT each, several at once, instead of one
    multipart upload per rank with a completion at the end; empty files are never made."""
    if not items:
        return []
    if min_files > 1 and len(items) >= min_files:
        by_count = [b for b in _split_items(items, min_files) if b]
        if max(sum(_item_nbytes(i) for i in b) for b in by_count) <= target:
            return by_count
    bins: list[list[WriteItem]] = []
    room: list[int] = []
    for item in sorted(items, key=_item_nbytes, reverse=True):
        n = _item_nbytes(item)
        for k, free in enumerate(room):
            if n <= free:
                bins[k].append(item)
                room[k] -= n
                break
        else:
            bins.append([item])
            room.append(target - n)
    return bins


def _split_items(items: list[WriteItem], n: int) -> list[list[WriteItem]]:
    """Byte items round-robin, tensors greedily by size (as FileSystemWriter does)."""
    n = max(1, min(n, len(items))) if items else 1
    buckets: list[list[WriteItem]] = [[] for _ in range(n)]
    sizes = [0] * n
    byte_items = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensors = [i for i in items if i.type != WriteItemType.BYTE_IO]
    for k, item in enumerate(byte_items):
        buckets[k % n].append(item)

    def nbytes(item: WriteItem) -> int:
        td = item.tensor_data
        if td is None:
            return 0
        return td.chunk.sizes.numel() * torch._utils._element_size(td.properties.dtype)

    for item in sorted(tensors, key=nbytes, reverse=True):
        k = sizes.index(min(sizes))
        buckets[k].append(item)
        sizes[k] += nbytes(item)
    return buckets


class StorageWriter(_DcpWriter):
    """Saves a DCP checkpoint to ``<root>/<checkpoint-id>`` (S3, GCS, Azure, or a directory).

    Every rank uploads its file(s) in parallel parts from a bounded buffer budget, with a
    CRC32C per part and per item; the coordinator's :meth:`finish` commits the checkpoint by
    creating its manifest with a create-if-absent put. A committed id is never overwritten:
    saving to it again raises :class:`shardstream.CheckpointError`.

    Args:
        url: ``<root>/<checkpoint-id>``; ``checkpoint_id=`` of ``dcp.save`` overrides it.
        files_per_rank: the fewest data files per rank (items are balanced over them by size).
        file_size: bytes of items per data file (default: the part size). A rank's items are
            packed into files of about this size, each uploaded in one PUT while the next one
            fills; an item larger than this gets a file of its own (one PUT up to
            ``single_put_max``, else a multipart upload in even parts).
        part_size / memory_budget / max_concurrent_requests: upload settings (bytes, bytes,
            requests); ``None`` keeps the core's defaults (64 MiB, 512 MiB, 16). Every file
            of a rank shares the one memory budget.
        single_put_max: bytes up to which a data file goes up in one PUT rather than as a
            multipart upload (``None``: the core's 136 MiB, within the memory budget; 0: only
            files no larger than a part).
        step: training step recorded in the manifest (default: the id's trailing digits).
        metadata: JSON-serialisable dict stored in the manifest.
        storage_options: endpoint, region, credentials and client options for this checkpoint
            (``endpoint_url``, ``region``, ``key``/``secret``/``token``, ``anon``, ``profile``,
            ``client_kwargs``...; see docs/python.md), over the environment.
    """

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        files_per_rank: int = 1,
        file_size: int | None = None,
        part_size: int | None = None,
        memory_budget: int | None = None,
        max_concurrent_requests: int | None = None,
        single_put_max: int | None = None,
        step: int | None = None,
        metadata: dict | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.url = "" if url is None else os.fspath(url)
        self._storage_options = option_pairs(storage_options)
        self.files_per_rank = files_per_rank
        self.file_size = file_size
        self.upload_options = {
            "part_size": part_size,
            "memory_budget": memory_budget,
            "max_concurrent_requests": max_concurrent_requests,
            "single_put_max": single_put_max,
        }
        self.step = step
        self.user_metadata = dict(metadata or {})
        self.is_coordinator = False
        self.save_id = str(uuid.uuid4())
        self.attempt: str | None = None

    # -- DCP interface -----------------------------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike | None = None, *args: Any, **kwargs: Any) -> None:
        if checkpoint_id is not None:
            self.url = os.fspath(checkpoint_id)
        self.save_id = str(uuid.uuid4())
        self.attempt = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise CheckpointError(
                f"checkpoint {self.url}: dcp.save(use_collectives=False) writes rank-local "
                "metadata without a coordinator; a shardstream checkpoint is committed by one "
                "coordinator, so save with collectives"
            )
        self.is_coordinator = is_coordinator
        split_url(self.url)  # fail early on a URL without an id

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.url, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        root, cid = split_url(self.url)
        self.attempt = _store(root, self._storage_options).begin_save(cid)
        return [
            dataclasses.replace(
                plan, storage_data={"attempt": self.attempt, "rank": i, "prefix": f"__{i}_"}
            )
            for i, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        info = plan.storage_data
        if not isinstance(info, dict) or "attempt" not in info:
            raise CheckpointError(
                f"checkpoint {self.url}: the save plan carries no shardstream attempt "
                f"(storage_data={info!r}); was prepare_global_plan skipped?"
            )
        root, cid = split_url(self.url)
        store = _store(root, self._storage_options)
        attempt, rank, prefix = info["attempt"], int(info["rank"]), info["prefix"]
        results: list[WriteResult] = []
        crcs: list[list] = []
        # One writer for all of this rank's files: they share its buffer budget and request cap.
        writer = store.rank_writer(cid, attempt, rank, **self.upload_options)
        target = self.file_size or writer.part_size
        pending: list[Any] = []
        f = None
        try:
            for k, items in enumerate(_pack_items(plan.items, self.files_per_rank, target)):
                name = f"{prefix}{k}.distcp"
                rel = f"{attempt}/{name}"
                # The file's size (an upper bound) plans its upload: a file of one large tensor
                # (128 MiB and its torch.save framing, by default) goes up in one PUT rather
                # than as a multipart upload, and a larger one in even parts, none tiny.
                f = writer.create(name, size=sum(_item_nbytes(i) for i in items))
                offset = 0
                # Byte items first, then tensors, as FileSystemWriter orders them.
                for item in sorted(items, key=lambda i: i.type != WriteItemType.BYTE_IO):
                    data = planner.resolve_data(item)
                    sink = _ItemSink(f)
                    if item.type == WriteItemType.BYTE_IO:
                        sink.write(data.getbuffer() if isinstance(data, io.BytesIO) else data)
                    else:
                        sink.save(_cpu_contiguous(data))
                    crc = f.take_item_crc()
                    n = sink.written
                    results.append(
                        WriteResult(
                            index=item.index,
                            size_in_bytes=n,
                            storage_data=_StorageInfo(relative_path=rel, offset=offset, length=n),
                        )
                    )
                    crcs.append([rel, offset, n, crc])
                    offset += n
                # The file goes up in the background while the next one fills.
                pending.append(f.start_finish())
                f = None
            records = [p.wait() for p in pending]
        except BaseException:
            if f is not None:
                f.abort()
            for p in pending:
                p.cancel()
            raise
        results.append(
            WriteResult(
                index=MetadataIndex(_RECORDS_FQN),
                size_in_bytes=0,
                storage_data={"records": records, "crcs": crcs},
            )
        )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self.attempt is None:
            raise CheckpointError(f"checkpoint {self.url}: finish() without prepare_global_plan()")
        root, cid = split_url(self.url)
        store = _store(root, self._storage_options)
        storage_md: dict[MetadataIndex, _StorageInfo] = {}
        records: list[str] = []
        crcs: dict[str, list] = {}
        for wr_list in results:
            for wr in wr_list:
                if wr.index.fqn == _RECORDS_FQN:
                    records.extend(wr.storage_data["records"])
                    for rel, off, n, crc in wr.storage_data["crcs"]:
                        crcs.setdefault(rel, []).append([off, n, crc])
                else:
                    storage_md[wr.index] = wr.storage_data
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        if hasattr(metadata, "version"):
            from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

            metadata.version = CURRENT_DCP_VERSION
        f = store.create_file(cid, self.attempt, 0, _METADATA)
        try:
            f.write(pickle.dumps(metadata))
            records.append(f.finish())
        except BaseException:
            f.abort()
            raise
        manifest_md = dict(self.user_metadata)
        manifest_md[_ITEM_CRCS] = crcs
        store.commit(
            cid,
            self.attempt,
            records,
            world_size=len(results),
            step=self.step,
            metadata_json=json.dumps(manifest_md),
            aliases=[(_METADATA, _METADATA)],
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            split_url(checkpoint_id)
            return True
        except Exception:
            return False


class StorageReader(_DcpReader):
    """Loads a DCP checkpoint from ``<root>/<checkpoint-id>``.

    A shardstream checkpoint is read only once committed (its manifest exists). Only the items
    asked for are fetched (touching items of one file as one span, in parallel ranged GETs, or
    ``pread``s for a local directory, straight into one native buffer that ``torch.load`` reads
    without a ``bytes`` copy; the next batch is fetched while the current one is decoded), and
    every byte is checked against a CRC32C, so a flipped byte raises
    :class:`shardstream.HashMismatchError` naming the object. A directory written by torch's
    ``FileSystemWriter`` (no manifest, a ``.metadata``) is read as it is, unchecked.
    ``storage_options`` are as :class:`StorageWriter`'s.
    """

    def __init__(
        self,
        url: str | os.PathLike | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.url = "" if url is None else os.fspath(url)
        self._storage_options = option_pairs(storage_options)
        self.load_id = str(uuid.uuid4())
        self.storage_data: dict[MetadataIndex, _StorageInfo] = {}
        self._files: Any = None
        self._crcs: dict[tuple[str, int, int], int] = {}

    def reset(self, checkpoint_id: str | os.PathLike | None = None, *args: Any, **kwargs: Any) -> None:
        if checkpoint_id is not None:
            self.url = os.fspath(checkpoint_id)
        self.load_id = str(uuid.uuid4())
        self.storage_data = {}
        self._files = None
        self._crcs = {}

    def _open(self):
        if self._files is None:
            root, cid = split_url(self.url)
            self._files = _store(root, self._storage_options).open(cid)
            self._crcs = {}
            manifest = self._files.manifest_json()
            if manifest is None:
                log.warning("checkpoint %s has no shardstream manifest: reading it unchecked", self.url)
            else:
                per_file = json.loads(manifest).get("metadata", {}).get(_ITEM_CRCS, {})
                for rel, entries in per_file.items():
                    for off, n, crc in entries:
                        self._crcs[(rel, off, n)] = crc
        return self._files

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise CheckpointError(
                f"checkpoint {self.url}: rank-local metadata (__<rank>.metadata) is not supported"
            )
        blob = self._open().read_file(_METADATA)
        try:
            metadata = pickle.loads(blob)
        except Exception as e:
            raise CheckpointError(f"checkpoint {self.url}: {_METADATA} does not unpickle: {e}") from e
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"checkpoint {self.url}: {_METADATA} holds {type(metadata).__name__}")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data
        if self.storage_data is None:
            raise CheckpointError(f"checkpoint {self.url}: {_METADATA} has no storage_data")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        from torch.distributed._shard._utils import narrow_tensor_by_index

        files = self._open()
        # One fetch per distinct item (several read requests may share a saved item).
        pending: list[tuple[Any, tuple[str, int, int]]] = []
        for req in plan.items:
            info: _StorageInfo = self.storage_data[req.storage_index]
            if getattr(info, "transform_descriptors", None):
                raise CheckpointError(
                    f"checkpoint {self.url}: {info.relative_path} uses stream transforms "
                    f"{list(info.transform_descriptors)}, which shardstream does not read"
                )
            pending.append((req, (info.relative_path, info.offset, info.length)))

        def start(unit):
            keys = list(dict.fromkeys(key for _, key in unit))
            reqs = [(p, o, n, self._crcs.get((p, o, n))) for p, o, n in keys]
            return keys, files.start_read(reqs)

        # Up to _READ_WINDOW_BYTES of units are fetched (GIL released) while this thread decodes
        # the oldest one as soon as it has arrived, so fetching and decoding overlap unit by
        # unit and the bytes held stay within the window plus the unit being decoded.
        units = list(_read_units(pending))
        in_flight: collections.deque = collections.deque()
        window = 0
        nxt = 0
        while nxt < len(units) or in_flight:
            while nxt < len(units) and (not in_flight or window + _unit_bytes(units[nxt]) <= _READ_WINDOW_BYTES):
                in_flight.append((units[nxt], start(units[nxt])))
                window += _unit_bytes(units[nxt])
                nxt += 1
            unit, (keys, read) = in_flight.popleft()
            got = dict(zip(keys, read.wait()))
            window -= _unit_bytes(unit)
            for req, key in unit:
                view = memoryview(got[key])
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(view))
                    continue
                # A large item's storage is used where it lies in the native buffer; torch.load
                # (an allocation and a copy of the item) for small items, where parsing the
                # archive twice costs more than the copy saves, and for layouts it refuses.
                tensor = _stored_tensor(view) if len(view) >= _IN_PLACE_MIN_BYTES else None
                if tensor is None:
                    tensor = torch.load(_ViewFile(view), map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                target = planner.resolve_tensor(req).detach()
                if target.size() != tensor.size():
                    raise CheckpointError(
                        f"checkpoint {self.url}: {key[0]} item {req.storage_index.fqn} has shape "
                        f"{tuple(tensor.size())}, the load asked for {tuple(target.size())}"
                    )
                target.copy_(tensor)
                planner.commit_tensor(req, target)
            del got
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @property
    def checkpoint_id(self) -> str:
        return self.url

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return StorageWriter.validate_checkpoint_id(checkpoint_id)


class _ViewFile(io.RawIOBase):
    """A seekable, read-only file over a memoryview, for ``torch.load``: its ``readinto``
    copies straight from the view into the storage torch allocates (``io.BytesIO`` would
    first copy the whole item)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B") if view.format != "B" else view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _stored_tensor(view: memoryview) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote into ``view``, as a view of its bytes in place: no
    allocation and no copy, so a load copies each byte once, into the target. ``None`` unless
    the item is the one layout this reads without torch: a zip archive with exactly one stored
    (uncompressed) storage record, little-endian like this machine; anything else goes through
    ``torch.load``. The tensor's dtype, shape, strides and offset come from ``torch.load`` with
    ``map_location="meta"``, which reads the pickle but not the storage."""
    f = _ViewFile(view)
    try:
        archive = zipfile.ZipFile(f)
        infos = archive.infolist()
        records = [i for i in infos if i.filename.split("/")[-2:-1] == ["data"]]
        order = [i for i in infos if i.filename.endswith("/byteorder")]
        if len(records) != 1 or records[0].compress_type != zipfile.ZIP_STORED or not records[0].file_size:
            return None
        if sys.byteorder != "little" or (order and archive.read(order[0]) != b"little"):
            return None
        f.seek(0)
        meta = torch.load(f, map_location="meta", weights_only=True)
    except (zipfile.BadZipFile, RuntimeError, ValueError, EOFError, pickle.UnpicklingError):
        return None
    if not isinstance(meta, torch.Tensor):
        return None
    data, record = f._view, records[0]
    # The record's bytes follow its local header: 30 fixed bytes, then its name and extra field.
    head = record.header_offset
    if data[head : head + 4] != b"PK\x03\x04" or len(data) < head + 30:
        return None
    start = head + 30 + int.from_bytes(data[head + 26 : head + 28], "little")
    start += int.from_bytes(data[head + 28 : head + 30], "little")
    end = start + record.file_size
    if end > len(data) or record.file_size % meta.element_size():
        return None
    with warnings.catch_warnings():
        # The native buffer is read-only and this tensor is only read (copied into the target).
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        raw = torch.frombuffer(data[start:end], dtype=torch.uint8)
    try:
        # as_strided checks the shape and strides against the storage's bounds.
        return raw.view(meta.dtype).as_strided(meta.size(), meta.stride(), meta.storage_offset())
    except RuntimeError:
        return None


def _read_units(pending: list) -> Iterable[list]:
    """Splits a load's reads into units fetched by one native call each: the items of one file
    in file order, cut between items at about ``_READ_UNIT_BYTES``. Touching items of a unit are
    one ranged fetch, so a file saved as one PUT (or a part of a multipart file) comes back as
    one GET, and a unit is decoded as soon as it has arrived."""
    by_file: dict[str, list] = {}
    for entry in pending:
        by_file.setdefault(entry[1][0], []).append(entry)
    for entries in by_file.values():
        entries.sort(key=lambda e: e[1][1])
        unit: list = []
        size = 0
        for entry in entries:
            n = entry[1][2]
            if unit and size + n > _READ_UNIT_BYTES:
                yield unit
                unit, size = [], 0
            unit.append(entry)
            size += n
        if unit:
            yield unit


def _unit_bytes(unit: list) -> int:
    return sum(entry[1][2] for entry in unit)


def latest(url: str | os.PathLike) -> str | None:
    """The URL (``<root>/<id>``) of the newest committed checkpoint under root ``url``, or None.

    Only checkpoints whose manifest exists count, so an interrupted save is never returned."""
    root = os.fspath(url).rstrip("/")
    info = _store(root).latest()
    return None if info is None else f"{root}/{info['id']}"


def list_checkpoints(url: str | os.PathLike) -> list[dict]:
    """The committed checkpoints under root ``url``, oldest first (id, step, sizes, …)."""
    return _store(os.fspath(url).rstrip("/")).list()


def verify(url: str | os.PathLike) -> dict:
    """Reads every byte of checkpoint ``<root>/<id>`` and checks it against its manifest.

    Returns ``{"files": n, "bytes": n, "failures": [message, ...]}``."""
    root, cid = split_url(url)
    files, nbytes, failures = _store(root).verify(cid)
    return {"files": files, "bytes": nbytes, "failures": failures}

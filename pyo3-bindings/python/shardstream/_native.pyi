"""Type stubs of the native module `shardstream._native` (the dataset, writer and exception
parts; the checkpoint classes are described in checkpoint.pyi's module and typed `Any` here)."""

import os
from typing import Any, Mapping, Sequence

__version__: str

class ShardstreamError(Exception): ...
class CorruptDataError(ShardstreamError, ValueError): ...
class HashMismatchError(CorruptDataError): ...
class NotFoundError(ShardstreamError, FileNotFoundError): ...
class BudgetExceededError(ShardstreamError): ...
class StorageError(ShardstreamError): ...
class CheckpointError(ShardstreamError): ...

class Buffer:
    """Read-only bytes owned by Rust, exported through the buffer protocol (`memoryview`,
    `numpy.frombuffer`, `torch.frombuffer`); `bytes(buf)` copies."""

    def __len__(self) -> int: ...
    def __bytes__(self) -> bytes: ...
    def __getitem__(self, key: int | slice) -> Any: ...
    def __eq__(self, other: object) -> bool: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    def _share(self) -> tuple[int, int, int, int, int, int, int] | None: ...

class ColumnBuffer:
    """One batch's fixed-size numeric column, owned by that batch and exported writable (the
    storage of `iter_batches`' numpy arrays)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

def _attach_buffer(address: tuple[int, int, int, int, int, int, int]) -> Buffer: ...

def release_read_buffers() -> None:
    """Frees the read buffers the process keeps for its next datasets (run before every fork)."""

class NativeDataset:
    def __init__(
        self,
        remote: str,
        *,
        split: str | None = ...,
        local: str | os.PathLike[str] | None = ...,
        cache_root: str | os.PathLike[str] | None = ...,
        run_id: str | None = ...,
        node_rank: int | None = ...,
        memory_limit: int | None = ...,
        cache_limit: int | None = ...,
        copy_local: bool = ...,
        validate_hash: bool = ...,
        allow_unsafe_types: bool = ...,
        streams: Sequence[tuple[str, str | None, str, float]] | None = ...,
        epoch_size: int | None = ...,
        zero_copy: bool = ...,
        sampling_method: str = ...,
    ) -> None: ...
    @property
    def num_samples(self) -> int: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def columns(self) -> list[tuple[str, str]]: ...
    @property
    def cache_dir(self) -> os.PathLike[str]: ...
    def shard_sizes(self) -> list[int]: ...
    def stream_sizes(self) -> list[tuple[int, int]]: ...
    def stream_shards(self) -> list[int]: ...
    def get(self, index: int) -> dict[str, Any]: ...
    def epoch_len(
        self,
        seed: int,
        shuffle: bool,
        window: int,
        lanes: int,
        remainder: str,
        epoch: int,
        ramp: bool = ...,
        sample_ramp: bool = ...,
    ) -> int: ...
    def state_json(
        self,
        seed: int,
        shuffle: bool,
        window: int,
        lanes: int,
        remainder: str,
        epoch: int,
        consumed: int,
        ramp: bool = ...,
        sample_ramp: bool = ...,
    ) -> str: ...
    def parse_state(
        self, text: str
    ) -> tuple[int, bool, int, int, str, int, int, int, bool, bool]: ...
    def metrics(self) -> dict[str, int | float]: ...
    def stream(
        self,
        *,
        seed: int,
        shuffle: bool,
        window: int,
        lanes: int,
        remainder: str,
        epoch: int,
        nodes: int,
        processes_per_node: int,
        workers: int,
        batch_size: int,
        node: int,
        local_process: int,
        worker: int,
        start: int,
        raw: bool = ...,
        ramp: bool = ...,
        sample_ramp: bool = ...,
    ) -> NativeStream: ...

    def prefetch(
        self,
        *,
        seed: int,
        shuffle: bool,
        window: int,
        lanes: int,
        remainder: str,
        epoch: int,
        nodes: int,
        processes_per_node: int,
        node: int,
        local_process: int,
        start: int,
        max_shards: int,
        ramp: bool = ...,
        sample_ramp: bool = ...,
    ) -> NativePrefetch: ...

class NativePrefetch:
    def cancel(self) -> None: ...
    @property
    def finished(self) -> bool: ...
    @property
    def shards(self) -> list[int]: ...
    def report(self) -> dict[str, int]: ...
    def wait(self, timeout: float | None = ...) -> bool: ...

class NativeStream:
    def next_samples(self, n: int, with_index: bool = False) -> list[Any]: ...
    def next_columns(
        self, n: int, columns: Sequence[str] | None = ..., shared: bool = ...
    ) -> tuple[int, dict[str, tuple[str | None, Any, Buffer | ColumnBuffer]]]: ...
    def close(self) -> None: ...

class NativeShardWriter:
    def __init__(
        self,
        out: str,
        columns: Sequence[tuple[str, str]],
        compression: str | None = ...,
        hashes: Sequence[str] | None = ...,
        size_limit: int | None = ...,
        allow_unsafe_types: bool = ...,
    ) -> None: ...
    def write(self, sample: Mapping[str, Any]) -> None: ...
    @property
    def samples_written(self) -> int: ...
    def finish(self) -> int: ...

CheckpointStore: Any
RankFileWriter: Any
CheckpointFiles: Any

"""shardstream: stream ML datasets from object storage into PyTorch, and keep checkpoints safe."""

from shardstream._native import (  # noqa: F401
    BudgetExceededError,
    CheckpointError,
    CorruptDataError,
    HashMismatchError,
    NotFoundError,
    ShardstreamError,
    StorageError,
    __version__,
)

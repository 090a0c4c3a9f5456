"""shardstream: stream ML datasets from object storage into PyTorch, and keep checkpoints safe."""

from shardstream._native import (  # noqa: F401
    Buffer,
    BudgetExceededError,
    CheckpointError,
    CorruptDataError,
    HashMismatchError,
    NotFoundError,
    ShardstreamError,
    StorageError,
    __version__,
    refresh_logging,
)
from shardstream.dataset import ColumnBatch, ColumnBatches, StreamingDataset, VarColumn, open  # noqa: F401
from shardstream.streams import Stream  # noqa: F401
from shardstream.writer import ShardWriter  # noqa: F401

from shardstream._mosaic import patch_mosaic_loader as _patch_mosaic_loader

_patch_mosaic_loader()  # Mosaic's own StreamingDataLoader, when it is loaded, saves our datasets' state

# Mosaic's name for the writer, so that `from streaming import MDSWriter` switches by its module.
MDSWriter = ShardWriter

__all__ = [
    "Buffer",
    "BudgetExceededError",
    "CheckpointError",
    "ColumnBatch",
    "ColumnBatches",
    "CorruptDataError",
    "HashMismatchError",
    "MDSWriter",
    "NotFoundError",
    "ShardWriter",
    "ShardstreamError",
    "StorageError",
    "Stream",
    "StreamingDataLoader",
    "StreamingDataset",
    "VarColumn",
    "open",
    "refresh_logging",
    "__version__",
]


def __getattr__(name: str):
    # Imported on first use: it needs torch, which the rest of the package does not.
    if name == "StreamingDataLoader":
        from shardstream.dataloader import StreamingDataLoader

        return StreamingDataLoader
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")

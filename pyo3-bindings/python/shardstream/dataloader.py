"""`StreamingDataLoader`: mosaicml-streaming's `StreamingDataLoader` for shardstream datasets.

Mosaic's loader counts the samples it yielded and saves the dataset's position through
`dataset.state_dict(num_samples, False)`, but only for Mosaic's own `StreamingDataset` class: for
any other dataset its `state_dict()` is `None`, so a script that switched only the dataset's import
would checkpoint nothing and restart every epoch from the beginning. This one is the same loader
for shardstream's `StreamingDataset` (and its `iter_batches`), importable from `shardstream` in the
same line as the dataset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from torch import Tensor
from torch.utils.data import DataLoader

from shardstream.dataset import ColumnBatches, StreamingDataset


class StreamingDataLoader(DataLoader):
    """A torch `DataLoader` that tracks the samples this rank has yielded in the current
    iteration, so that `state_dict()` saves where the whole job is in the epoch (this rank's
    count times the number of ranks, or of replication groups, as Mosaic's) and
    `load_state_dict()` resumes a new loader there, also at another world size."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_samples_yielded = 0

    @staticmethod
    def _get_batch_size(batch: Any) -> int:
        """The number of samples in a batch: the length of its first column (a dict), of the
        tensor, or of the first element (a tuple or list of columns), as Mosaic counts them."""
        if isinstance(batch, Mapping):
            for value in batch.values():
                return len(value)
            raise ValueError("the batch is empty: no column to count its samples by")
        if isinstance(batch, Tensor):
            return len(batch)
        return len(batch[0])

    def __iter__(self) -> Iterator[Any]:
        self.num_samples_yielded = 0
        for batch in super().__iter__():
            self.num_samples_yielded += self._get_batch_size(batch)
            yield batch

    def _streaming(self) -> StreamingDataset | ColumnBatches | None:
        return self.dataset if isinstance(self.dataset, (StreamingDataset, ColumnBatches)) else None

    def state_dict(self) -> dict[str, Any] | None:
        """The dataset's `state_dict` at the samples the job has consumed since this iteration
        began (`None` for a dataset that is not shardstream's, as Mosaic's loader)."""
        dataset = self._streaming()
        if dataset is None:
            return None
        # Ranks of one replication group yield the same samples: the job consumed this rank's
        # count times the number of groups (Mosaic divides by `replication` too).
        streaming = dataset.dataset if isinstance(dataset, ColumnBatches) else dataset
        return dataset.state_dict(self.num_samples_yielded * streaming._placement().processes, False)

    def load_state_dict(self, obj: Mapping[str, Any]) -> None:
        """Resumes the dataset from a `state_dict`: the next iteration starts where it was."""
        dataset = self._streaming()
        if dataset is not None:
            dataset.load_state_dict(obj)

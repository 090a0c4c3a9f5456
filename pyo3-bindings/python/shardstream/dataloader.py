"""`StreamingDataLoader`: mosaicml-streaming's `StreamingDataLoader` for shardstream datasets.

Mosaic's loader counts the samples it yielded and saves the dataset's position through
`dataset.state_dict(num_samples, False)`, but only for Mosaic's own `StreamingDataset` class: for
any other dataset its `state_dict()` is `None`, so a script that switched only the dataset's import
would checkpoint nothing and restart every epoch from the beginning. This one is the same loader
for shardstream's `StreamingDataset` (and its `iter_batches`), importable from `shardstream` in the
same line as the dataset.

With workers it also moves the batches in groups (`_groups`): many small batches per trip
through the DataLoader's queues, handed out in the plain order; `iter_batches`' batches are
grouped by the workers of this loader, a `StreamingDataset`'s samples by those of an internal
loader made from the same arguments (`SampleGroups`), so set `collate_fn`, `worker_init_fn` and
the rest when building the loader, not on it afterwards.

With workers it reads the first batch of each iteration in the training process, while the
workers do not exist yet, and starts them (the DataLoader forks or spawns them) when the second
batch is asked for; they stream the rest, in the same order (`StreamingDataset._first_batch`).
A torch DataLoader's first batch waits for its workers to start (two forks of a torch process
take 25-35 ms on the development VM) and then for a worker to read it; this one waits only for
the read, which the dataset's prefetch at construction has usually started.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Mapping
from itertools import islice
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from shardstream._groups import (
    BatchGroup,
    GroupCollate,
    GroupingWorkerInit,
    approx_bytes,
    batches_per_group,
    interleave,
    keep,
)
from shardstream._world import worker_id
from shardstream.dataset import (
    ColumnBatches,
    FirstBatch,
    StreamingDataset,
    random_states,
    set_random_states,
)


class StreamingDataLoader(DataLoader):
    """A torch `DataLoader` that tracks the samples this rank has yielded in the current
    iteration, so that `state_dict()` saves where the whole job is in the epoch (this rank's
    count times the number of ranks, or of replication groups, as Mosaic's) and
    `load_state_dict()` resumes a new loader there, also at another world size.

    With workers, each worker sends its batches to this process in groups of up to 256 KiB
    instead of one by one, and the loader yields them one by one in the order a plain
    `DataLoader` would: the same batches, each through `collate_fn` in its worker, at a fraction
    of the DataLoader's cost per batch. That holds for `iter_batches`' batches
    (`StreamingDataLoader(ds.iter_batches(64), batch_size=None, num_workers=2)`) and for a
    `StreamingDataset`'s samples batched by the loader (`StreamingDataLoader(ds, batch_size=64,
    num_workers=2)`, through an internal DataLoader with the same arguments).
    `group_batches=False` sends them one by one.

    With grouping, each iteration's first batch is read in this process before the workers
    start (`early_first_batch`, on by default unless a `worker_init_fn` is given, since the
    batch does not pass through it): the same batch, collated the same way, sooner. The workers
    start when the second batch is asked for. With `persistent_workers=True` only in the first
    iteration: later ones are served by the workers already running."""

    def __init__(self, *args: Any, group_batches: bool = True, early_first_batch: bool | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.num_samples_yielded = 0
        user_worker_init = self.worker_init_fn
        user_collate = self.collate_fn
        # Groups need what the interleaving assumes: worker processes, and items delivered in
        # the order the workers were asked.
        can_group = group_batches and self.num_workers > 0 and getattr(self, "in_order", True)
        # `iter_batches`' batches, already made: the workers group them (`_batch_groups`).
        self._grouped = can_group and isinstance(self.dataset, ColumnBatches) and self.batch_size is None
        if self._grouped:
            self.collate_fn = GroupCollate(self.collate_fn)
            self.worker_init_fn = GroupingWorkerInit(self.worker_init_fn)
        # A StreamingDataset's samples, batched by the loader: an internal loader whose workers
        # batch, collate and group them; this loader's own attributes stay as given.
        self._sample_groups: DataLoader | None = None
        if can_group and isinstance(self.dataset, StreamingDataset) and self.batch_size is not None:
            given = inspect.signature(DataLoader.__init__).bind(self, *args, **kwargs).arguments
            given.pop("self")
            for name in ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "collate_fn", "drop_last"):
                given.pop(name, None)
            self._sample_groups = DataLoader(
                SampleGroups(self.dataset, self.batch_size, self.drop_last, self.collate_fn),
                batch_size=None, collate_fn=keep, **given,
            )
        # The first batch read here gets what a worker would apply to it: the loader's
        # collate_fn and worker 0's seeds, but not a worker_init_fn (hence off with one).
        if early_first_batch is None:
            early_first_batch = user_worker_init is None
        self._early_first_batch = (
            early_first_batch and (self._grouped or self._sample_groups is not None)
        )
        self._first_collate = user_collate

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
        first = self._first_batch()
        if first is not None:
            self.num_samples_yielded += first.head.count
            yield first.batch
        if self._sample_groups is not None or self._grouped:
            batches = self._grouped_batches(first)
        else:
            batches = super().__iter__()
        for batch in batches:
            self.num_samples_yielded += self._get_batch_size(batch)
            yield batch

    def _first_batch(self) -> _First | None:
        """The iteration's first batch, read and collated in this process (`early_first_batch`);
        `None` where the workers read it: a dataset whose batches are not the loader's (a
        per-sample dataset with another `batch_size`), one resumed per worker, one whose rest
        would not give every worker a batch, or persistent workers already running.

        The random generators go as with a plain DataLoader: the base seed it draws for its
        workers is drawn now (where it would be), the batch is read and collated under the
        seeds worker 0 gets from it, and that state is handed to worker 0 for its next batch;
        the training process's own generators are left as the draw left them."""
        if not self._early_first_batch:
            return None
        workers = self._sample_groups if self._sample_groups is not None else self
        if self.persistent_workers and workers._iterator is not None:
            return None  # the workers run already: what was read could not reach their copies
        if self._grouped:
            dataset = self.dataset.dataset
            size, columns, raw = self.dataset.batch_size, self.dataset.columns, True
        else:
            dataset = self.dataset
            size, columns, raw = int(self.batch_size), None, False
            if int(dataset.batch_size or 1) != size:
                return None
        if dataset._worker_skip:
            return None
        before_seed = _generator_state(self.generator)
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        own = random_states()
        try:
            _seed_as_worker(base_seed, 0)
            head = dataset._first_batch(size, columns, raw, self.num_workers)
            if head is not None:
                batch = self._first_collate(head.batch)
                worker_rng = random_states()
        finally:
            set_random_states(own)
        if head is None:
            _set_generator_state(self.generator, before_seed)  # the DataLoader draws it itself
            return None
        device = _pin_device() if self.pin_memory else None
        if device is not None:
            from torch.utils.data._utils.pin_memory import pin_memory

            batch = pin_memory(batch, device)
        return _First(dataset, head, batch, worker_rng, before_seed)

    def _grouped_batches(self, first: _First | None) -> Iterator[Any]:
        """Starts the workers (the DataLoader forks or spawns them now) and returns their
        batches in order. After a `first` batch read here, worker 0's copy goes on after it."""
        # The internal loader's iterator, or this loader's own (torch's), which starts the workers.
        start = self._sample_groups.__iter__ if self._sample_groups is not None else super().__iter__
        if first is None:
            return interleave(start(), self.num_workers)
        dataset = first.dataset
        # A `set_epoch` or `load_state_dict` since the read chose another start: the workers
        # take that one as it is.
        moved = dataset._lineages[-1] is not first.head.lineage
        if not moved:
            dataset._head_name, dataset._head_rng = first.head.name, first.rng
        after_step = _generator_state(self.generator)
        # The DataLoader draws the base seed again: the same one, from the state it was drawn from.
        _set_generator_state(self.generator, first.before_seed)
        try:
            source = start()
        finally:
            _set_generator_state(self.generator, after_step)
            dataset._head_name, dataset._head_rng = None, None
        # Worker 0's first batch is out: batch 1 is worker 1's (as in a plain DataLoader).
        return interleave(source, self.num_workers, turn=0 if moved else 1 % self.num_workers)

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


class SampleGroups(IterableDataset):
    """A per-sample dataset's batches in groups, for `StreamingDataLoader`'s internal loader:
    in a DataLoader worker, the worker's samples cut into batches of `batch_size` and collated
    as torch's fetcher does (a last short batch kept unless `drop_last`), then sent as
    `BatchGroup`s (the first holding one batch, the next about `GROUP_BYTES` of batches)."""

    def __init__(self, dataset: Iterable, batch_size: int, drop_last: bool,
                 collate_fn: Callable[[list], Any]) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn

    def __iter__(self) -> Iterator[BatchGroup]:
        worker = worker_id()
        samples = iter(self.dataset)
        per_group = 1
        while True:
            batches: list = []
            last = False
            while len(batches) < per_group:
                chunk = list(islice(samples, self.batch_size))
                if len(chunk) < self.batch_size:
                    last = True
                    if chunk and not self.drop_last:
                        batches.append(self.collate_fn(chunk))
                    break
                batches.append(self.collate_fn(chunk))
            yield BatchGroup(worker, batches, last)
            if last:
                return
            per_group = batches_per_group(approx_bytes(batches[-1]))


class _First(NamedTuple):
    """An iteration's first batch, read here (`StreamingDataLoader._first_batch`)."""

    dataset: StreamingDataset
    head: FirstBatch
    batch: Any
    rng: tuple  # the random states worker 0 would have after the batch
    before_seed: Any  # the generator's state before the DataLoader's base-seed draw


def _generator_state(generator: torch.Generator | None) -> Any:
    return (generator if generator is not None else torch.random.default_generator).get_state()


def _set_generator_state(generator: torch.Generator | None, state: Any) -> None:
    (generator if generator is not None else torch.random.default_generator).set_state(state)


def _seed_as_worker(base_seed: int, worker: int) -> None:
    """Seeds `random`, numpy and torch's CPU generator as torch seeds DataLoader worker
    `worker` (torch.utils.data._utils.worker._worker_loop)."""
    seed = base_seed + worker
    random.seed(seed)
    torch.random.default_generator.manual_seed(seed)
    try:
        from torch.utils.data._utils.worker import _generate_state
    except ImportError:  # a torch without it: numpy's generator is left as it is
        return
    np.random.seed(_generate_state(base_seed, worker))


def _pin_device() -> str | None:
    """The device torch's DataLoader pins batches for (None: it does not pin)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None:
        return "cuda" if torch.cuda.is_available() else None
    if not accelerator.is_available():
        return None
    current = accelerator.current_accelerator()
    if current is None or current.type == "mps":
        return None
    return current.type

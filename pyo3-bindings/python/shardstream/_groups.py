"""Batch groups: how `StreamingDataLoader` moves small batches from DataLoader workers to the
training process (`iter_batches`' batches, and a `StreamingDataset`'s collated samples).

A torch DataLoader pays one round trip for every item a worker yields, whatever the item holds:
an index sent to the worker's queue, the item pickled by a feeder thread into a pipe, the main
process's poll, read and unpickle, with a thread woken at each step. On the 2-core VM that is
about 250 µs of CPU per item, so batches of 64 samples of 100 B could not cross faster than
about 250k samples/s even from a dataset that did no work at all. Through `StreamingDataLoader`,
a worker of `iter_batches` sends its next batches as one `BatchGroup` instead (about
`GROUP_BYTES` of them, read in one native call): one round trip for many batches. Each batch
still goes through the loader's `collate_fn` in the worker, and the loader hands the batches out
one at a time in the order a plain DataLoader yields them, round robin over the workers, one
batch each, leaving out a worker once it has run out. The batches, their order, the resume
state and `len` are those of a plain DataLoader; only the number of round trips changes.

Per-sample datasets (`StreamingDataLoader(ds, batch_size=64, num_workers=2)`) go the same way
through an internal DataLoader over `shardstream.dataloader.SampleGroups`, whose workers cut their samples into the
batches torch's fetcher would make, collate each with the loader's `collate_fn`, and group them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

# A group holds about this many bytes of column data (its batches are read in one call); batches
# larger than half of it travel alone, as without groups.
GROUP_BYTES = 256 * 1024
# At most this many batches per group: the main process holds up to two groups per worker.
MAX_GROUP_BATCHES = 32

# Set in a DataLoader worker by `GroupingWorkerInit`: `iter_batches` in this process sends groups.
_grouping_here = False


def grouping_in_this_process() -> bool:
    """Whether this process is a worker of a loader that takes batch groups."""
    return _grouping_here


def batches_per_group(batch_bytes: int) -> int:
    """How many batches of `batch_bytes` each go in one group."""
    return max(1, min(MAX_GROUP_BATCHES, GROUP_BYTES // max(1, batch_bytes)))


class BatchGroup:
    """Consecutive batches of one DataLoader worker, crossing to the main process as one item.
    `last` marks the worker's final group of the iteration (it may hold no batch)."""

    __slots__ = ("worker", "batches", "last")

    def __init__(self, worker: int, batches: list, last: bool) -> None:
        self.worker = worker
        self.batches = batches
        self.last = last

    def __reduce__(self) -> tuple:
        return (BatchGroup, (self.worker, self.batches, self.last))

    def pin_memory(self, device: Any = None) -> BatchGroup:
        """torch's `pin_memory=True` thread pins each batch, as it pins a plain item."""
        from torch.utils.data._utils.pin_memory import pin_memory

        self.batches = [pin_memory(b, device) for b in self.batches]
        return self

    def __repr__(self) -> str:
        return f"BatchGroup(worker={self.worker}, {len(self.batches)} batches, last={self.last})"


class GroupingWorkerInit:
    """The loader's `worker_init_fn`: marks the worker as sending groups, then runs the user's."""

    def __init__(self, inner: Callable[[int], None] | None) -> None:
        self.inner = inner

    def __call__(self, worker_id: int) -> None:
        global _grouping_here
        _grouping_here = True
        if self.inner is not None:
            self.inner(worker_id)


class GroupCollate:
    """The loader's `collate_fn`: applies the user's (or torch's default conversion) to each
    batch of a group, in the worker, where a plain DataLoader applies it to each batch."""

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, item: Any) -> Any:
        if type(item) is BatchGroup:
            item.batches = [self.inner(b) for b in item.batches]
            return item
        return self.inner(item)


def approx_bytes(obj: Any) -> int:
    """About how many bytes of data a batch holds: what has an `nbytes` (tensors, arrays,
    `VarColumn`s), bytes and str, and the dicts, lists and tuples around them; 8 for anything
    else."""
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(obj, (bytes, bytearray, str, memoryview)):
        return len(obj)
    if isinstance(obj, Mapping):
        return sum(approx_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(approx_bytes(v) for v in obj)
    return 8


def keep(item: Any) -> Any:
    """The internal loader's `collate_fn`: groups arrive made."""
    return item


def interleave(items: Iterable[Any], workers: int, turn: int = 0) -> Iterator[Any]:
    """The batches of the groups `items` (as a DataLoader yields them: round robin over the
    workers that still have groups) in the order a plain DataLoader yields the same batches:
    round robin over the workers that still have batches, one batch each, starting at worker
    `turn` (0; 1 after a first batch of worker 0's read elsewhere). Holds at most the groups
    that arrived before the one whose turn it is."""
    pending: list[deque] = [deque() for _ in range(workers)]
    finished = [False] * workers
    source = iter(items)
    while True:
        for step in range(workers):
            w = (turn + step) % workers
            if pending[w] or not finished[w]:
                break
        else:
            return
        while not pending[w] and not finished[w]:
            try:
                group = next(source)
            except StopIteration:
                finished = [True] * workers
                break
            if type(group) is not BatchGroup or not 0 <= group.worker < workers:
                raise RuntimeError(
                    f"a DataLoader worker sent {type(group).__name__} where a batch group was "
                    "expected: give StreamingDataLoader the ColumnBatches itself "
                    "(ds.iter_batches(n)), or pass group_batches=False"
                )
            pending[group.worker].extend(group.batches)
            if group.last:
                finished[group.worker] = True
        if pending[w]:
            yield pending[w].popleft()
            turn = (w + 1) % workers
        else:
            turn = (w + 1) % workers

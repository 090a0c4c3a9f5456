"""Which epochs the copies of one dataset object have started and finished, so that a DataLoader's
workers move to the next epoch by themselves, as Mosaic's do.

A DataLoader worker iterates a copy of the dataset: forked from (or pickled by) the training
process at each epoch, or kept for the whole run with `persistent_workers=True`. A copy cannot
tell the training process that its share of the epoch is done, so every epoch used to stream the
same order unless the training script called `set_epoch` (which persistent workers never see).
The copies instead leave small marker files in a folder named by their dataset object's lineage
(a random key made when the dataset is built and again at each `set_epoch` / `load_state_dict`,
which choose the epoch explicitly): `s<E>` when an iteration of epoch E starts, `e<E>-w<i>-of<W>`
when worker i of W finishes its share. A new iteration streams the first epoch, from the
lineage's own, that not every worker of some iteration has finished; the training process's
`state_dict` reports the latest one started. Every worker of an iteration sees the same files,
because the DataLoader starts an iteration's workers only after the previous one has ended.

The folder is under the system's temporary directory (each rank's processes run in one pod or
machine); the process that made a lineage removes its folder when its dataset object goes.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid

_ROOT = os.path.join(tempfile.gettempdir(), "shardstream-epochs")
_ENDED = re.compile(r"e(\d+)-w(\d+)-of(\d+)")


class EpochRecords:
    """The marker files of one lineage."""

    def __init__(self) -> None:
        self.key = uuid.uuid4().hex
        self.owner = os.getpid()

    @property
    def folder(self) -> str:
        return os.path.join(_ROOT, self.key)

    def _names(self) -> set[str]:
        try:
            return set(os.listdir(self.folder))
        except FileNotFoundError:
            return set()

    def _touch(self, name: str) -> None:
        try:
            os.makedirs(self.folder, exist_ok=True)
            with open(os.path.join(self.folder, name), "a"):
                pass
        except OSError:
            # Only the automatic epoch advance depends on it: without the marker the next
            # iteration streams this epoch again, as it did before markers existed.
            pass

    @staticmethod
    def _finished(names: set[str], epoch: int) -> bool:
        """Whether every worker of some iteration of `epoch` finished its share."""
        by_workers: dict[int, set[int]] = {}
        for name in names:
            m = _ENDED.fullmatch(name)
            if m and int(m.group(1)) == epoch:
                by_workers.setdefault(int(m.group(3)), set()).add(int(m.group(2)))
        return any(len(done) == workers for workers, done in by_workers.items())

    def start(self, epoch: int) -> int:
        """The epoch an iteration starting now streams (`epoch` or a later one) and records it."""
        names = self._names()
        while self._finished(names, epoch):
            epoch += 1
        self._touch(f"s{epoch}")
        return epoch

    def finish(self, epoch: int, worker: int, workers: int) -> None:
        """Records that `worker` of `workers` streamed its whole share of `epoch`."""
        self._touch(f"e{epoch}-w{worker}-of{workers}")

    def latest_started(self) -> int | None:
        started = [int(n[1:]) for n in self._names() if n.startswith("s") and n[1:].isdigit()]
        return max(started, default=None)

    def discard(self) -> None:
        """Removes the folder, in the process that made the lineage only."""
        if self.owner == os.getpid():
            shutil.rmtree(self.folder, ignore_errors=True)

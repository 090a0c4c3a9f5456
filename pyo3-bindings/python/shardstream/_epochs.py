"""Which epochs the copies of one dataset object have started and finished, so that every new
iteration streams the next epoch, as Mosaic's does, also through a DataLoader's workers.

A DataLoader worker iterates a copy of the dataset: forked from (or pickled by) the training
process at each epoch, or kept for the whole run with `persistent_workers=True`. A copy cannot
tell the training process which epoch it streamed, so every epoch used to stream the same order
unless the training script called `set_epoch` (which persistent workers never see). The copies
instead leave small marker files in a folder named by their dataset object's lineage (a random
key made when the dataset is built and again at each `set_epoch` / `load_state_dict`, which
choose the epoch explicitly): `s<E>-<iteration>` when an iteration starts epoch E, and
`e<E>-w<i>-of<W>` when worker i of W finishes its share of it.

Mosaic starts the next epoch at every new iteration, whether the previous one ran to its end or
was left with a `break`. Here the workers of one iteration agree on it through the iteration's
name: a DataLoader draws a random base seed for every iterator and gives worker i the seed
`base + i`, so `base` (with the copy's count of its own iterations, for persistent workers, which
keep theirs) names the iteration in every worker. The first worker of an iteration to start takes
the epoch after the latest one started (the lineage's own epoch, where it resumes, when none has
started) and records it; the others find its marker. A name met again after its epoch was
finished by every worker (a DataLoader whose generator is seeded afresh each epoch draws the same
base) starts the next epoch too. In a single process each iteration has a name of its own.

An explicit choice in the training process (`set_epoch`, `load_state_dict`) starts a new lineage
there, and leaves in the old one a `next` file naming the new lineage and the order's settings
and position it chose. Copies made before (the persistent workers of a DataLoader, which keep
theirs for the whole run) follow `next` files at the start of their next iteration, so they
stream the epoch the training process chose, not the one after their last.

The folder is under the system's temporary directory (each rank's processes run in one pod or
machine); the process that made a lineage removes its folder when its dataset object goes. A
process that cannot (killed with SIGKILL, by the OOM killer, by a preemption) leaves it behind, so
a key names its maker (`<pid namespace>-<pid>-<random>`), and the first lineage a process makes
removes the folders of makers that are gone: same PID namespace (a `/tmp` shared with another
container says nothing of its processes), no such process, and the folder untouched for a minute
(a maker's copies that outlive it for a moment may still be writing). Folders of other namespaces
and of older versions (a bare random key) are left alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from typing import Any

_ROOT = os.path.join(tempfile.gettempdir(), "shardstream-epochs")
_ENDED = re.compile(r"e(\d+)-w(\d+)-of(\d+)")
_STARTED = re.compile(r"s(\d+)-(.+)")
_KEY = re.compile(r"(\d+)-(\d+)-[0-9a-f]{32}")
# A folder whose maker is gone is removed only once it has been left this long (module doc).
SWEEP_AFTER_S = 60.0
# The process (pid) that swept the folder, so that each process sweeps once.
_swept_by: int | None = None


def _pid_namespace() -> int:
    """This process's PID namespace (the inode of `/proc/self/ns/pid`; 0 where there is none)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or a check we may not make: assume it lives
    return True


def sweep_abandoned() -> int:
    """Removes the folders of lineages whose maker is gone (module doc); returns how many."""
    namespace, removed = _pid_namespace(), 0
    if namespace == 0:
        return 0
    try:
        names = os.listdir(_ROOT)
    except OSError:
        return 0
    now = time.time()
    for name in names:
        m = _KEY.fullmatch(name)
        if not m or int(m.group(1)) != namespace or _process_exists(int(m.group(2))):
            continue
        folder = os.path.join(_ROOT, name)
        try:
            if now - os.stat(folder).st_mtime < SWEEP_AFTER_S:
                continue
        except OSError:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += not os.path.exists(folder)
    return removed


class EpochRecords:
    """The marker files of one lineage."""

    def __init__(self, key: str | None = None, owner: int | None = None) -> None:
        global _swept_by
        self.owner = os.getpid() if owner is None else owner
        if key is None:
            key = f"{_pid_namespace()}-{self.owner}-{uuid.uuid4().hex}"
            if _swept_by != os.getpid():
                _swept_by = os.getpid()
                sweep_abandoned()
        self.key = key

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

    @staticmethod
    def _starts(names: set[str]) -> list[tuple[int, str]]:
        """(epoch, iteration) of every start marker."""
        out = []
        for name in names:
            m = _STARTED.fullmatch(name)
            if m:
                out.append((int(m.group(1)), m.group(2)))
        return out

    def start(self, epoch: int, iteration: str) -> int:
        """The epoch that iteration `iteration` streams, recorded: the one another worker of the
        same iteration took, else the epoch after the latest started, else `epoch` (the
        lineage's first iteration)."""
        names = self._names()
        starts = self._starts(names)
        mine = [e for e, it in starts if it == iteration]
        if mine and not self._finished(names, max(mine)):
            return max(mine)
        if starts:
            epoch = max(e for e, _ in starts) + 1
        self._touch(f"s{epoch}-{iteration}")
        return epoch

    def finish(self, epoch: int, worker: int, workers: int) -> None:
        """Records that `worker` of `workers` streamed its whole share of `epoch`."""
        self._touch(f"e{epoch}-w{worker}-of{workers}")

    def replaced_by(self, new: EpochRecords, settings: dict[str, Any]) -> None:
        """Records that the training process replaced this lineage with `new`, choosing
        `settings` (the dataset's epoch, position and order), for copies that still use this
        one. Written whole (a temporary file renamed), so a reader never sees part of it."""
        try:
            body = json.dumps({"key": new.key, "owner": new.owner, "settings": settings})
            os.makedirs(self.folder, exist_ok=True)
            tmp = os.path.join(self.folder, f".next.{os.getpid()}")
            with open(tmp, "w") as f:
                f.write(body)
            os.replace(tmp, os.path.join(self.folder, "next"))
        except (OSError, TypeError, ValueError):
            # Only copies made before the choice need it: without it they stream the epoch
            # after their last, as they did before the file existed.
            pass

    def replacement(self) -> tuple[EpochRecords, dict[str, Any]] | None:
        """The lineage that replaced this one and the settings chosen with it, if any."""
        try:
            with open(os.path.join(self.folder, "next")) as f:
                found = json.load(f)
            return EpochRecords(str(found["key"]), int(found["owner"])), dict(found["settings"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def latest_started(self) -> int | None:
        return max((e for e, _ in self._starts(self._names())), default=None)

    def discard(self) -> None:
        """Removes the folder, in the process that made the lineage only."""
        if self.owner == os.getpid():
            shutil.rmtree(self.folder, ignore_errors=True)

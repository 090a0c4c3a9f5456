"""Where this process sits in the job: nodes x processes per node x DataLoader workers.

docs/sample-order.md: `torch.distributed` when it is initialized, else the `RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `LOCAL_WORLD_SIZE` environment that torchrun sets; a single process otherwise.
DataLoader workers come from `torch.utils.data.get_worker_info()`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shardstream")
_logged: set = set()


@dataclass(frozen=True)
class Placement:
    """This process's place: `node` of `nodes`, `local_process` of `processes_per_node`, and
    DataLoader `worker` of `workers`."""

    nodes: int
    processes_per_node: int
    node: int
    local_process: int
    workers: int
    worker: int

    @property
    def processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def global_rank(self) -> int:
        return self.node * self.processes_per_node + self.local_process

    def replicated(self, replication: int) -> Placement:
        """The placement of this process's replication group (Mosaic's `replication`): each
        `replication` consecutive ranks see the same samples, so the samples are split over
        `processes // replication` groups, laid out on nodes as Mosaic's `World.replicate` lays
        them (on one node when the groups do not fill whole nodes)."""
        if replication < 1:
            raise ValueError(f"replication must be a positive number of ranks, got {replication}")
        if self.processes % replication:
            raise ValueError(f"replication={replication} does not divide the world of {self.processes} processes")
        rank, ranks = self.global_rank // replication, self.processes // replication
        nodes = ranks // self.processes_per_node if ranks % self.processes_per_node == 0 else 1
        per_node = ranks // nodes
        return Placement(nodes=nodes, processes_per_node=per_node, node=rank // per_node,
                         local_process=rank % per_node, workers=self.workers, worker=self.worker)


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _process_rank() -> tuple[int, int, str]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), "torch.distributed"
    except ImportError:
        pass
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None or world is None:
        return 0, 1, "default (no torch.distributed, no RANK/WORLD_SIZE)"
    return rank, world, "RANK/WORLD_SIZE"


def _worker_info() -> Any:
    """torch's DataLoader worker info, or None outside a worker (or without torch)."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return None
    return get_worker_info()


def in_dataloader_worker() -> bool:
    return _worker_info() is not None


def iteration_seed() -> int | None:
    """In a DataLoader worker, the base seed its DataLoader drew for the current iterator (the
    same in every worker of it; a new one at each iterator); None elsewhere."""
    info = _worker_info()
    if info is None:
        return None
    return int(info.seed) - int(info.id)


def worker_id() -> int:
    """This DataLoader worker's id (0 outside a worker)."""
    return _worker()[1]


def _worker() -> tuple[int, int]:
    info = _worker_info()
    if info is None:
        return 1, 0
    return info.num_workers, info.id


def placement() -> Placement:
    """Resolves this process's placement (logged once per process)."""
    rank, world, source = _process_rank()
    local_world = _env_int("LOCAL_WORLD_SIZE") or world
    if world % local_world != 0:
        raise ValueError(
            f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}; "
            "every node must run the same number of processes"
        )
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside the world of {world} processes")
    local_rank = _env_int("LOCAL_RANK")
    if local_rank is None:
        local_rank = rank % local_world
    workers, worker = _worker()
    p = Placement(
        nodes=world // local_world,
        processes_per_node=local_world,
        node=rank // local_world,
        local_process=local_rank,
        workers=workers,
        worker=worker,
    )
    key = (os.getpid(), p)
    if key not in _logged:
        _logged.add(key)
        log.info(
            "shardstream placement from %s: node %d/%d, process %d/%d, worker %d/%d",
            source, p.node, p.nodes, p.local_process, p.processes_per_node, p.worker, p.workers,
        )
    return p

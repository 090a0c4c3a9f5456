"""Child process of the streaming benchmark: iterates epochs of one system's dataset and prints one
JSON line per epoch (run as `python consume.py SPEC_JSON`).

Every epoch is checked: each sample id seen exactly once, and each sample's bytes start with its id
and have the profile's length. A run that is fast and wrong reports its failure in `check`.

Timing starts just before the dataset object is built (imports excluded: they are the same for a
training script whatever loader it uses) and ends after the last sample reached this process.
Time to first sample is from the same start to the first sample in this process.

Peak memory is not measured in the timed epochs: reading a process's smaps_rollup walks its page
tables (10-13 ms of CPU per process with torch imported, three processes with two DataLoader
workers), and a sampler doing that every 50 ms during a timed epoch took a quarter of the
fastest loaders' speed on a 2-core machine while barely slowing the slowest (which wait on I/O
more than they compute). After a configuration's timed epochs, one more epoch of it runs with
this process sampling the PSS of its process tree (itself and its DataLoader workers) at the start,
every 50 ms, and at the last sample; it reports only `peak_mem` and `mem_series`. There are as many
memory epochs per configuration as timed ones, and each timed run carries the peak of one of them,
so the peak is a median over runs with its range, as samples/s is.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from measure import tree_pss_bytes
from s3server import read_counters

T_START = time.time()
SPEC: dict = {}  # the run's spec (main() reads it from the command line)
SYSTEM = ""  # set per job: one child may run several systems (--smoke does, to import torch once)
# The consumer's own ceiling: the same samples, made in memory, through the same loop, collate
# and DataLoader. Whatever a loader costs beyond it is the loader's.
MEMORY = "in-memory samples (ceiling)"
MEMORY_DATA: dict = {}  # both orders and the sample size of the current job, set before timing
# The binding with `zero_copy=True` (1 MB samples only): bytes stay in the engine's read.
ZERO_COPY = "shardstream (python, zero_copy)"


# --- turning each system's sample into (id, data), in the worker that produced it -----------------

def _extract_dict(s):
    # A `bytes` value (or one of a subclass) is used as it is, as a training step would use it: a
    # copy here would replace what the loader hands out with a plain `bytes` of the benchmark's.
    data = s["data"]
    return int(s["id"]), data if isinstance(data, bytes) else bytes(data)


def _extract_wds(s):
    return int(s["__key__"]), s["bin"]


def _extract_in_place(s):
    """shardstream's `zero_copy=True`: the sample's bytes stay in the Buffer they arrived in (a
    read from the shard file), as `torch.frombuffer`/`np.frombuffer` would use them."""
    return int(s["id"]), s["data"]


EXTRACT = _extract_dict


def use_system(system: str) -> None:
    """Selects the system of the next epochs (DataLoader workers forked after this inherit it)."""
    global SYSTEM, EXTRACT
    SYSTEM = system
    EXTRACT = {"webdataset": _extract_wds, ZERO_COPY: _extract_in_place}.get(system, _extract_dict)


def collate(batch):
    """Used by every DataLoader: the ids and the sample bytes cross the worker boundary, as a
    training step's inputs would."""
    pairs = [EXTRACT(s) for s in batch]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def keep_batch(batch):
    """The batch path's collate_fn in a DataLoader, as docs/python.md prescribes: the batch is
    already made, so numpy columns stay numpy instead of each becoming a tensor in its own
    shared-memory segment (which costs more than a small batch itself)."""
    return batch


def _torch_iterable(obj):
    """Wraps `obj` in a torch IterableDataset (for a DataLoader)."""
    from torch.utils.data import IterableDataset

    class _It(IterableDataset):
        def __iter__(self):
            return iter(obj)

    return _It()


class TreeMemory:
    """Samples the PSS of this process and its descendants (DataLoader workers) in a thread: at
    `start`, every `interval` seconds, and once more at `stop`, so that an epoch shorter than the
    interval still has a sample taken while it ran."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        v = tree_pss_bytes(os.getpid())
        if v:
            self.series.append((time.time(), v))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# --- building each system's iterable ----------------------------------------------------------------

def prepare_memory(job: dict) -> None:
    """The in-memory ceiling's two orders, made once per job and outside the timed epochs. They
    are arrays of machine integers, not lists of Python ints: a forked DataLoader worker that
    walked a list would copy-on-write a page of the parent for every object it touched."""
    import array
    import random

    n = job["samples"]
    shuffled = list(range(n))
    random.Random(1).shuffle(shuffled)
    MEMORY_DATA["orders"] = {False: array.array("q", range(n)), True: array.array("q", shuffled)}
    MEMORY_DATA["size"] = job["sample_bytes"]


class MemorySamples:
    """The in-memory ceiling as an iterable: this process's (or DataLoader worker's) samples,
    split by whole batches over the workers as shardstream splits them. Each sample's bytes are
    made where they are yielded (its id, then zeros: one allocation and one copy, as a loader that
    reads into a new `bytes` makes); a list of samples built in the parent would instead cost a
    forked worker a copy-on-write fault per sample when it touched their reference counts."""

    def __init__(self, shuffle: bool, batch_size: int) -> None:
        self.shuffle, self.batch_size = shuffle, batch_size

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        order, bs, size = MEMORY_DATA["orders"][self.shuffle], self.batch_size, MEMORY_DATA["size"]
        head = min(8, size)
        pad = bytes(size - head)
        for start in range(worker * bs, len(order), workers * bs):
            for i in order[start:start + bs]:
                yield {"id": i, "data": i.to_bytes(8, "little")[:head] + pad}


def build(job: dict, local: str, shuffle: bool, workers: int):
    bs = SPEC["batch_size"]
    if SYSTEM == MEMORY:
        ds = _torch_iterable(MemorySamples(shuffle, bs))
    elif SYSTEM == "mosaicml-streaming":
        from streaming import StreamingDataset

        ds = StreamingDataset(remote=job["remote"], local=local, shuffle=shuffle, shuffle_seed=1, batch_size=bs)
    elif SYSTEM == "shardstream (python)":
        import shardstream

        ds = shardstream.StreamingDataset(remote=job["remote"], local=local, shuffle=shuffle, shuffle_seed=1, batch_size=bs)
    elif SYSTEM == ZERO_COPY:
        import shardstream

        ds = shardstream.StreamingDataset(remote=job["remote"], local=local, shuffle=shuffle, shuffle_seed=1, batch_size=bs,
                                          zero_copy=True)
    elif SYSTEM == "shardstream (python, iter_batches)":
        import shardstream

        ds = shardstream.StreamingDataset(remote=job["remote"], local=local, shuffle=shuffle, shuffle_seed=1, batch_size=bs)
        if workers:
            # As docs/python.md prescribes: the ColumnBatches itself through shardstream's
            # StreamingDataLoader (a torch DataLoader), which moves the workers' small batches in
            # groups and yields them one by one in the plain DataLoader's order.
            return shardstream.StreamingDataLoader(ds.iter_batches(bs), batch_size=None, num_workers=workers,
                                                   collate_fn=keep_batch), "columns"
        # Without workers: `iter_batches`' own batches (a dict of an ids array and a `VarColumn`),
        # no Python object per sample; the consumer takes the columns apart.
        return ds.iter_batches(bs), "columns"
    elif SYSTEM == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming import downloader

        # litdata's obstore prefetch path passes fixed client options and so cannot reach a plain
        # http:// endpoint; the loopback server needs allow_http (https in production needs nothing).
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
        ds = StreamingDataset(
            input_dir=job["remote"], cache_dir=local, shuffle=shuffle, seed=1,
            storage_options={"endpoint_url": SPEC["endpoint"]},
        )
        if workers:
            return StreamingDataLoader(ds, batch_size=bs, num_workers=workers, collate_fn=collate), True
        return ds, False
    elif SYSTEM == "webdataset":
        import webdataset as wds

        urls = job["urls"] if job["temperature"] == "cold" else job["local_files"]
        ds = wds.WebDataset(
            urls, shardshuffle=(len(urls) if shuffle else False), seed=1,
            workersplitter=wds.split_by_worker, empty_check=False,
        )
        if shuffle:
            ds = ds.shuffle(1000)
    else:
        raise SystemExit(f"unknown system {SYSTEM}")
    if workers:
        if SYSTEM in ("shardstream (python)", ZERO_COPY):
            # As docs/python.md prescribes (and Mosaic's docs for theirs): shardstream's
            # StreamingDataLoader, a torch DataLoader that moves small batches in groups.
            import shardstream

            return shardstream.StreamingDataLoader(ds, batch_size=bs, num_workers=workers, collate_fn=collate), True
        from torch.utils.data import DataLoader

        return DataLoader(ds, batch_size=bs, num_workers=workers, collate_fn=collate), True
    return ds, False


def counters() -> dict:
    try:
        return read_counters(SPEC.get("counters_url") or SPEC["endpoint"] + "/_bench/counters")
    except Exception:
        return {}


def epoch(job: dict, local: str, shuffle: bool, workers: int, memory: TreeMemory | None = None) -> dict:
    """One checked epoch; with `memory`, sampled for peak memory (and then not for speed)."""
    import numpy as np

    n, size = job["samples"], job["sample_bytes"]
    head = min(8, size)
    id_chunks: list = []  # each batch's ids; counted after the epoch (a few bytes per sample)
    bad = count = nbytes = 0
    c0 = counters()
    if memory is not None:
        memory.start()
    t0 = time.time()
    it, batched = build(job, local, shuffle, workers)
    t_first = None

    def slow_heads(ids, datas, lengths) -> int:
        """Samples of a batch with a wrong length or a head that is not their id, one by one."""
        return sum(1 for i, d, length in zip(ids, datas, lengths)
                   if length != size or bytes(d[:head]) != int(i).to_bytes(8, "little", signed=True)[:head])

    def check_lists(ids, datas, lengths=None) -> None:
        """A batch of (ids, sample bytes) lists, checked with one numpy comparison when every
        sample has the profile's length (a wrong one falls back to one sample at a time). With
        `lengths` (each sample's length), `datas` holds only each sample's head."""
        nonlocal bad, count, nbytes
        k = len(ids)
        ids_np = np.fromiter(ids, dtype=np.int64, count=k)
        id_chunks.append(ids_np)
        count += k
        lengths_np = np.fromiter(map(len, datas) if lengths is None else lengths, dtype=np.int64, count=k)
        nbytes += int(lengths_np.sum())
        wrong_length = k - int(np.count_nonzero(lengths_np == size))
        if head == 8 and not wrong_length:
            heads = np.frombuffer(b"".join([d[:8] for d in datas]), dtype="<i8")
            bad += k - int(np.count_nonzero(heads == ids_np))
        else:
            bad += slow_heads(ids, datas, lengths_np)

    def check_columns(ids, buf, offsets) -> None:
        """A column batch: the heads are read as a strided view of the buffer when every sample
        has the profile's length (consecutive, as the batch path lays them out)."""
        nonlocal bad, count, nbytes
        ids_np = np.asarray(ids, dtype=np.int64)
        offsets = np.asarray(offsets, dtype=np.int64)
        k = len(ids_np)
        id_chunks.append(ids_np)
        count += k
        nbytes += int(offsets[-1] - offsets[0]) if len(offsets) else 0
        if k == 0:
            return
        if head == 8 and len(offsets) == k + 1 and (np.diff(offsets) == size).all():
            heads = np.ndarray((k,), dtype="<i8", buffer=memoryview(buf), offset=int(offsets[0]), strides=(size,))
            bad += k - int(np.count_nonzero(heads == ids_np))
        else:
            raw = memoryview(buf)
            datas = [raw[offsets[j]:offsets[j + 1]] for j in range(min(k, len(offsets) - 1))]
            bad += slow_heads(ids_np[: len(datas)], datas, [len(d) for d in datas]) + (k - len(datas))

    if batched == "columns":
        for b in it:
            if t_first is None:
                t_first = time.time()
            col = b["data"]
            check_columns(b["id"], col.data, col.offsets)
    elif batched:
        for ids, datas in it:
            if t_first is None:
                t_first = time.time()
            check_lists(ids, datas)
    else:
        # One sample at a time: keep only its id, length and head (not the sample, which a
        # per-sample loop drops as it goes), checked 64 at a time.
        ids, heads, lengths = [], [], []
        for s in it:
            if t_first is None:
                t_first = time.time()
            i, d = EXTRACT(s)
            ids.append(i)
            heads.append(bytes(d[:head]))  # a copy: a view would keep the sample's buffer alive
            lengths.append(len(d))
            if len(ids) == 64:
                check_lists(ids, heads, lengths)
                ids, heads, lengths = [], [], []
        if ids:
            check_lists(ids, heads, lengths)
    t_end = time.time()
    if memory is not None:
        memory.stop()  # before the iterator (and whatever it holds) is dropped
    c1 = counters()
    all_ids = np.concatenate(id_chunks) if id_chunks else np.zeros(0, dtype=np.int64)
    inside = (all_ids >= 0) & (all_ids < n)
    out_of_range = int(len(all_ids) - np.count_nonzero(inside))
    hits = np.bincount(all_ids[inside], minlength=n)
    missing = int(np.count_nonzero(hits == 0))
    dup = int(np.clip(hits - 1, 0, None).sum())
    problems = [f"{v} {k}" for k, v in (("missing", missing), ("duplicated", dup), ("with wrong bytes", bad),
                                         ("out of range", out_of_range)) if v]
    del it
    gc.collect()
    if memory is not None:
        return {
            "check": "ok" if not problems else "; ".join(problems),
            "peak_mem": max((v for _, v in memory.series), default=None),
            "mem_series": [(round(t - t0, 3), v) for t, v in memory.series],
        }
    return {
        "since_process_start_s": round(t0 - T_START, 2), "t0": t0, "t_first": t_first, "t_end": t_end, "samples": count, "bytes": nbytes,
        "epoch_s": t_end - t0, "ttfs_s": (t_first - t0) if t_first else None,
        "check": "ok" if not problems else "; ".join(problems),
        "server_bytes": (c1.get("bytes_sent", 0) - c0.get("bytes_sent", 0)) if c0 and c1 else None,
        "server_gets": (c1["get_requests"] - c0["get_requests"]) if c0.get("get_requests") is not None and c1.get("get_requests") is not None else None,
    }


def main() -> None:
    SPEC.update(json.loads(sys.argv[1]))
    first_of: dict = {}
    for j, job in enumerate(SPEC["jobs"]):
        use_system(job["system"])
        first_of.setdefault(SYSTEM, j)
        scratch = os.path.join(SPEC["scratch"], str(j))
        os.makedirs(scratch, exist_ok=True)
        # One untimed epoch first: it pays the lazy imports (boto3, numpy paths, torch's DataLoader)
        # that a training process pays once, and, for warm runs, fills the cache that each warm run
        # then gets a hard-linked copy of.
        warm_src = os.path.join(scratch, "prewarm")
        if SYSTEM == MEMORY:
            prepare_memory(job)
        if first_of[SYSTEM] == j or (job["temperature"] == "warm" and SYSTEM != "webdataset"):
            r = epoch(job, warm_src, False, 0)
            print(json.dumps({"job": j, "prewarm": True, **r}), flush=True)
        if job["temperature"] == "cold" or SYSTEM in ("webdataset", MEMORY):
            shutil.rmtree(warm_src, ignore_errors=True)
            warm_src = None
        k = 0
        # The timed epochs, then as many untimed epochs per configuration for its peak memory
        # (module doc): the peak is reported over runs like every other figure, because one
        # epoch's peak moves by 10-50 MiB between runs of the same configuration.
        plan = [(rep, cfg) for rep in range(SPEC["runs"]) for cfg in job["configs"]]
        plan += [(None, cfg) for _ in range(SPEC["runs"]) for cfg in job["configs"]]
        for rep, cfg in plan:
            local = os.path.join(scratch, f"run{k}")
            shutil.rmtree(local, ignore_errors=True)
            if warm_src is not None:
                subprocess.run(["cp", "-al", warm_src, local], check=True)
            if rep is None:
                r = epoch(job, local, cfg["shuffle"], cfg["workers"], memory=TreeMemory())
                print(json.dumps({"job": j, "memory_run": True, **cfg, **r}), flush=True)
            else:
                r = epoch(job, local, cfg["shuffle"], cfg["workers"])
                print(json.dumps({"job": j, "rep": rep, **cfg, **r}), flush=True)
            shutil.rmtree(local, ignore_errors=True)
            k += 1
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

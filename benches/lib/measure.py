"""Measuring child processes: a time bound, memory of the whole process tree over time, and the
median / min / max of repeated runs.

Memory is the sum of PSS (proportional set size, /proc/PID/smaps_rollup) over the child and all its
descendants, sampled every 50 ms from this process (the streaming benchmark's Python child samples
its own instead, in epochs it does not time: see consume.py). PSS, not RSS: DataLoader workers are forked and
share most pages with their parent, so summed RSS would count torch's libraries three times.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def tree_pss_bytes(root: int) -> int:
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _pss_kib(pid)
        stack.extend(_children(pid))
    return total * 1024


class MemorySampler:
    """Samples the PSS of a process tree in a thread: `series` is [(unix time, bytes)]."""

    def __init__(self, pid: int, interval: float = 0.05, enabled: bool = True) -> None:
        self.pid, self.interval = pid, interval
        self.series: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if enabled:
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            v = tree_pss_bytes(self.pid)
            if v:
                self.series.append((time.time(), v))
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def window(self, t0: float, t1: float) -> list[tuple[float, int]]:
        return [(t, v) for t, v in self.series if t0 <= t <= t1]

    def peak(self, t0: float, t1: float) -> int | None:
        """Highest sample in [t0, t1]; for a run shorter than the interval, the sample nearest before t1."""
        w = self.window(t0, t1)
        if w:
            return max(v for _, v in w)
        before = [v for t, v in self.series if t <= t1]
        return before[-1] if before else None

    def before(self, t0: float) -> int | None:
        w = [v for t, v in self.series if t <= t0]
        return w[-1] if w else None


@dataclass
class ChildResult:
    rc: int | None
    lines: list[dict]
    stderr_tail: str
    wall_s: float
    timed_out: bool
    sampler: MemorySampler
    t_start: float
    t_end: float = field(default=0.0)


def run_child(cmd: list[str], timeout: float, env: dict | None = None, cwd: str | None = None,
              sample_memory: bool = True) -> ChildResult:
    """Runs `cmd` (its own process group), killed after `timeout` s; JSON lines on stdout are parsed.
    `sample_memory=False` leaves the child's memory unsampled (a child that samples its own, in
    epochs it does not time: consume.py)."""
    full = dict(os.environ)
    full.update(env or {})
    t_start = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full, cwd=cwd, start_new_session=True, text=True
    )
    sampler = MemorySampler(proc.pid, enabled=sample_memory)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(proc)
        out, err = proc.communicate()
    finally:
        sampler.stop()
    t_end = time.time()
    lines = []
    for line in (out or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return ChildResult(proc.returncode, lines, (err or "")[-3000:], t_end - t_start, timed_out, sampler, t_start, t_end)


def kill_group(proc: subprocess.Popen) -> None:
    """Ends the process group this harness started for `proc` (and only that one)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def cat_to_null(files: list, timeout: float) -> ChildResult:
    """`cat` of `files` to /dev/null in a child: the page-cache read ceiling, and the same reader
    wherever a figure is compared with it (the mount's warm `cat`)."""
    return run_child(["sh", "-c", 'exec cat "$@" > /dev/null', "cat", *map(str, files)], timeout)


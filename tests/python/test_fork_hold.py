"""Forks taken while other threads of the process stream: no child may inherit one of the
engine's process-wide locks held by a thread it does not have.

The engine rebuilds its per-process state in a child of `fork`, through locks that are
process-wide: each dataset's per-process slot (held while a thread starts that dataset's engine),
the runtime slot and the cache's lock table. A child forked while another thread was inside one
of them would wait forever at its first sample. The binding's `pthread_atfork` handlers take
them all inside every `fork()` and release them just after, and a lock guard a child inherited
releases nothing. Here two threads keep opening datasets, fetching and pinning shards, while
the main thread forks children that each drop a stream they inherited and stream from the same
node cache, half of them through a dataset a parent thread was starting at the fork; every
child must finish, with the right samples. Without the handlers 5 and 6 of 120 children hung.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import boto3

from conftest import write_ids

N = 600
FORKS = 120

SCRIPT = textwrap.dedent(
    """
    import gc, json, os, select, shutil, subprocess, sys, threading
    import shardstream

    remote, forks = sys.argv[1], int(sys.argv[2])
    stop = threading.Event()
    errors = []
    latest = [None]  # the dataset a churn thread is starting right now

    def churn(seed):
        # New datasets, streams, shard fetches and pins, over and over: the engine's runtime
        # slot and lock table are in use all the time.
        k = 0
        while not stop.is_set():
            try:
                ds = shardstream.StreamingDataset(remote=remote, shuffle=True, shuffle_seed=seed + k,
                                                  batch_size=4, memory_limit="8MiB")
                latest[0] = ds
                for j, s in enumerate(ds):
                    if j == 20:
                        break
                del ds
            except Exception as e:  # reported below; the test fails on any
                errors.append(repr(e))
                return
            k += 1

    threads = [threading.Thread(target=churn, args=(s,), daemon=True) for s in (1, 1000)]
    for t in threads:
        t.start()
    # A stream the main thread holds at every fork: each child inherits its leases and drops them.
    held = iter(shardstream.StreamingDataset(remote=remote, batch_size=4))
    next(held)
    hung = failed = 0
    stacks = []  # each hung child's threads, as gdb sees them: where it waits

    def thread_stacks(pid):
        gdb = shutil.which("gdb")
        if gdb is None:
            return "gdb is not installed: no stacks"
        try:
            dump = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 40"],
                                  capture_output=True, text=True, timeout=60)
            return dump.stdout[-20000:]
        except (OSError, subprocess.SubprocessError) as e:
            return f"gdb failed: {e!r}"

    for k in range(forks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                del held  # closes the inherited stream: its leases and lock guards are the parent's
                gc.collect()
                # Half the children stream a dataset a parent thread was starting at the fork
                # (its engine for this process may have been half made), half a new one.
                ds = latest[0] if k % 2 and latest[0] is not None else shardstream.StreamingDataset(
                    remote=remote, shuffle=True, shuffle_seed=k, batch_size=4)
                it = iter(ds)
                ok = all(int(s["x"]) == 3 * int(s["id"]) for s, _ in zip(it, range(3)))
                code = 0 if ok else 2
            finally:
                os._exit(code)
        # The child's pidfd becomes readable when it exits: wait for that, at most 60 s.
        exited = os.pidfd_open(pid)
        ready, _, _ = select.select([exited], [], [], 60)
        os.close(exited)
        if not ready:
            hung += 1
            stacks.append(thread_stacks(pid))
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        if ready and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            failed += 1
    stop.set()
    for t in threads:
        t.join(timeout=60)
    print(json.dumps({"forks": forks, "hung": hung, "failed": failed, "errors": errors, "stacks": stacks}))
    """
)


def test_children_forked_while_threads_stream_never_hang(tmp_path, moto, stream_env):
    data = tmp_path / "data"
    write_ids(data, N, size_limit=1 << 12, extra=200)
    moto.create_bucket("fork-hold")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    for f in data.iterdir():
        s3.upload_file(str(f), "fork-hold", f"ds/{f.name}")
    shards = len([f for f in data.iterdir() if f.suffix != ".json"])
    assert shards >= 20, "many shards: the threads keep locking new ones"

    import os

    env = {**os.environ, **moto.env, **stream_env}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, "s3://fork-hold/ds", str(FORKS)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["errors"] == [], out["errors"]
    assert out["hung"] == 0, f"{out['hung']} of {FORKS} children hung; their threads:\n" + "\n".join(out["stacks"])
    assert out["failed"] == 0, f"{out['failed']} of {FORKS} children failed"

"""FUSE runners: shardstream mount, rclone mount and s3fs over the same prefix of the same server.

Each mount runs in the foreground in its own process group; a reader child reads every file under
the mount point (1 MiB reads, in path order) and reports files, bytes and time. Cold: a fresh mount
with an empty cache. Warm: the same mount read again (its page cache and disk cache filled).
Check: the files and sizes seen equal what the dataset's index.json lists (for shardstream's
`shards/`: index.json and every shard decompressed, `raw_data`; for the peers, which show the stored
objects: index.json and every stored shard, `zip_data` when compressed), and every byte was read.

Run as a script (`python fusebench.py MOUNTPOINT`) it is the reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from measure import MemorySampler, cat_to_null, kill_group, run_child
from results import Row, Skip, aggregate


def read_tree(root: str) -> dict:
    t0 = time.time()
    listing, total = {}, 0
    buf = bytearray(1 << 20)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            n = 0
            with open(path, "rb", buffering=0) as f:
                while True:
                    k = f.readinto(buf)
                    if not k:
                        break
                    n += k
            listing[os.path.relpath(path, root)] = n
            total += n
    return {"t0": t0, "t_end": time.time(), "files": len(listing), "bytes": total, "listing": listing}


class Mount:
    """One FUSE system: how to mount a prefix of the bench bucket and whether it can."""

    def __init__(self, name: str, kind: str, subdir: str = "") -> None:
        # subdir: where the mount shows the objects themselves (shardstream mount: `shards/`, next
        # to its `samples/` view).
        self.system, self.kind, self.subdir = name, kind, subdir

    def expected(self, index_json: bytes) -> dict:
        """Relative path -> size of every file this system should show, from the dataset's index."""
        index = json.loads(index_json)
        listing = {"index.json": len(index_json)}
        for shard in index["shards"]:
            # shardstream's shards/ serves every shard decompressed; the peers serve the objects.
            stored = shard["raw_data"] if self.kind == "shardstream" else (shard.get("zip_data") or shard["raw_data"])
            listing[stored["basename"]] = stored["bytes"]
        return listing

    def command(self, ctx, prefix: str, mnt: Path, cache: Path) -> tuple[list[str], dict]:
        # The caller's environment (PATH, HOME) with the server's; never AWS_CA_BUNDLE: set on
        # some machines, it makes rclone refuse the plain-HTTP endpoint of the local server.
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        env.update(ctx.server.env)
        if self.system == "shardstream mount":
            return [str(ctx.shardstream_bin), "--no-progress", "mount", f"s3://bench/{prefix}", str(mnt), "--cache-root",
                    str(cache), "--foreground"], {**env, "SHARDSTREAM_RUN_ID": "bench"}
        if self.system == "rclone mount":
            env.update({
                "RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
                "RCLONE_CONFIG_BENCH_ENDPOINT": ctx.server.endpoint, "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": "bench",
                "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": "bench", "RCLONE_CONFIG_BENCH_REGION": "us-east-1",
                "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true",
            })
            return ["rclone", "mount", f"bench:bench/{prefix}", str(mnt), "--read-only", "--vfs-cache-mode", "full",
                    "--cache-dir", str(cache), "--dir-cache-time", "1h"], env
        if self.system == "s3fs":
            cache.mkdir(parents=True, exist_ok=True)
            pw = cache / "passwd"
            pw.write_text("bench:bench\n")
            pw.chmod(0o600)
            return ["s3fs", f"bench:/{prefix}", str(mnt), "-f", "-o", f"url={ctx.server.endpoint}", "-o",
                    "use_path_request_style", "-o", f"passwd_file={pw}", "-o", "ro", "-o", f"use_cache={cache / 'data'}"], env
        raise ValueError(self.system)

    def unavailable(self, ctx) -> str | None:
        if self.system == "shardstream mount":
            if ctx.shardstream_bin is None:
                return "no shardstream binary in this checkout"
            return None  # a failed mount is reported by the probe in run()
        exe = self.system.split()[0]
        if shutil.which(exe) is None:
            return f"`{exe}` is not installed (apt-get install -y rclone s3fs)"
        return None

    def mount(self, ctx, prefix: str, mnt: Path, cache: Path):
        shutil.rmtree(cache, ignore_errors=True)
        mnt.mkdir(parents=True, exist_ok=True)
        cmd, env = self.command(ctx, prefix, mnt, cache)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read() if proc.poll() is not None else ""
                self.unmount(proc, mnt)
                last = (err.strip().splitlines() or ["no mount within 30 s"])[-1][:300]
                raise RuntimeError(last)
            time.sleep(0.05)
        return proc

    @staticmethod
    def unmount(proc, mnt: Path) -> None:
        subprocess.run(["fusermount", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(proc)


def _read(ctx, mnt: Path, daemon_pid: int, expected: dict, data_bytes: int) -> dict:
    sampler = MemorySampler(daemon_pid)
    res = run_child([ctx.python, str(Path(__file__).resolve()), str(mnt)], ctx.timeout)
    sampler.stop()
    if res.timed_out or not res.lines:
        msg = f"timed out after {ctx.timeout:.0f} s" if res.timed_out else (res.stderr_tail.strip().splitlines() or ["?"])[-1]
        return {"check": msg}
    r = res.lines[-1]
    if r["listing"] == expected:
        check = "ok"
    else:
        miss = set(expected) - set(r["listing"])
        check = f"saw {r['files']} files / {r['bytes']} bytes, expected {len(expected)} / {sum(expected.values())}"
        if miss:
            check += f" ({len(miss)} missing)"
    peak = sampler.peak(r["t0"], r["t_end"])
    return {"samples": None, "bytes": r["bytes"], "epoch_s": r["t_end"] - r["t0"], "ttfs_s": None, "check": check,
            "peak_mem": peak, "mem_series": [(round(t - r["t0"], 3), v) for t, v in sampler.window(r["t0"], r["t_end"])]}


def _cat(ctx, root: Path, daemon_pid: int, stored: int) -> dict:
    """`cat` of every file under `root` to /dev/null, as the page-cache ceiling reads the shard
    files: the same reader on both sides of "÷ceiling" (the Python reader's 1 MiB `readinto`
    gets ~6 GB/s from plain page-cached files where `cat` gets 8–12). Run after the Python
    passes, which check the listing and the bytes."""
    files = sorted(str(Path(d) / f) for d, _, names in os.walk(root) for f in names)
    sampler = MemorySampler(daemon_pid)
    res = cat_to_null(files, ctx.timeout)
    sampler.stop()
    check = "ok" if res.rc == 0 and not res.timed_out else f"cat exit {res.rc}"
    return {"samples": None, "bytes": stored, "epoch_s": res.wall_s, "ttfs_s": None, "check": check,
            "peak_mem": sampler.peak(res.t_start, res.t_end), "mem_series": []}


def run_all(ctx, log, profiles) -> tuple[list[Row], list[Skip]]:
    rows, skips = [], []
    for m in (Mount("shardstream mount", "shardstream", "shards"), Mount("rclone mount", "peer"), Mount("s3fs", "peer")):
        reason = m.unavailable(ctx)
        if reason:
            skips.append(Skip("fuse", m.system, reason))
            log(f"fuse: skip {m.system}: {reason}")
            continue
        for p in profiles:
            prefix = f"mds/{p.name}"
            s3 = ctx.server.client()
            index_json = s3.get_object(Bucket="bench", Key=f"{prefix}/index.json")["Body"].read()
            expected = m.expected(index_json)
            stored = sum(expected.values())
            base = ctx.work / "scratch" / f"fuse-{m.system.split()[0]}"
            mnt, cache = base / "mnt", base / "cache"
            cold, warm, warm_cat, failure = [], [], [], None
            for rep in range(ctx.runs):
                try:
                    proc = m.mount(ctx, prefix, mnt, cache)
                except RuntimeError as e:
                    failure = str(e)
                    break
                try:
                    c0 = ctx.server.counters()
                    r = _read(ctx, mnt / m.subdir, proc.pid, expected, stored)
                    r["amp"] = (ctx.server.counters()["bytes_sent"] - c0["bytes_sent"]) / stored
                    cold.append(r)
                    if rep == 0:
                        for _ in range(ctx.runs):
                            c0 = ctx.server.counters()
                            w = _read(ctx, mnt / m.subdir, proc.pid, expected, stored)
                            w["amp"] = (ctx.server.counters()["bytes_sent"] - c0["bytes_sent"]) / stored
                            warm.append(w)
                        for _ in range(ctx.runs):
                            c0 = ctx.server.counters()
                            w = _cat(ctx, mnt / m.subdir, proc.pid, stored)
                            w["amp"] = (ctx.server.counters()["bytes_sent"] - c0["bytes_sent"]) / stored
                            warm_cat.append(w)
                finally:
                    Mount.unmount(proc, mnt)
            shutil.rmtree(base, ignore_errors=True)
            if failure and not cold:
                skips.append(Skip("fuse", m.system, f"mount failed: {failure}"))
                log(f"fuse: skip {m.system}: mount failed: {failure}")
                break
            note = "amplification here: bytes the server sent / bytes of the files"
            cases = (("cold", "read every file once", cold), ("warm", "read every file once", warm),
                     ("warm", "`cat` every file", warm_cat))
            for temp, what, runs in cases:
                name = m.system + (f" ({m.subdir}/)" if m.subdir else "")
                rows.append(aggregate("fuse", name, p.name, f"{temp} · {what}", m.kind, runs,
                                      temperature=temp, notes=note))
            log(f"fuse: {m.system} {p.name} done ({rows[-3].check} / {rows[-2].check} / {rows[-1].check})")
    return rows, skips


if __name__ == "__main__":
    print(json.dumps(read_tree(sys.argv[1])), flush=True)

"""Streaming runners: each system reads every profile's dataset, cold from the S3 server and warm
from its own local cache, in one process and through a DataLoader with 2 workers, shuffled and not.

A runner says why it cannot run (`unavailable()` returns the reason) instead of being left out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
from measure import run_child
from results import Row, Skip, aggregate

LIB = Path(__file__).resolve().parent
# The consumer's ceiling (consume.py): the same samples made in memory, through the same loop and
# DataLoader; its rows are "memory · ..." and it is not a peer.
MEMORY = "in-memory samples (ceiling)"
# The binding with `zero_copy=True`: samples' bytes stay in the engine's read (consume.py).
ZERO_COPY = "shardstream (python, zero_copy)"

CONFIGS = [
    {"workers": 0, "shuffle": False},
    {"workers": 0, "shuffle": True},
    {"workers": 2, "shuffle": False},
    {"workers": 2, "shuffle": True},
]


# Which configurations run, by profile and temperature. A full run measures the whole matrix on the
# middle profile (10 KB) and the two ends of it (1 process in order; 2 workers shuffled) on the
# others, to stay within ~15 minutes on 2 cores. --smoke runs every code path once (workers on and
# off, shuffle on and off, cold and warm).
def configs_for(smoke: bool, profile: str, temperature: str) -> list[dict]:
    if smoke:
        return [CONFIGS[3]] if temperature == "cold" else [CONFIGS[0]]
    return CONFIGS if profile == "10KB" else [CONFIGS[0], CONFIGS[3]]


def config_name(temperature: str, workers: int, shuffle: bool) -> str:
    mode = "1 process" if not workers else f"DataLoader {workers} workers"
    return f"{temperature} · {mode} · {'shuffled' if shuffle else 'in order'}"


@dataclass
class Ctx:
    work: Path
    python: str
    server: object  # s3server.S3Server
    profiles: list
    dirs: dict  # profile name -> {fmt: local dir}
    runs: int
    timeout: float
    batch_size: int
    shardstream_bin: Path | None
    shardstream_bin_note: str
    smoke: bool

    def configs(self, profile: str, temperature: str) -> list[dict]:
        return configs_for(self.smoke, profile, temperature)


class PythonLoader:
    """mosaicml-streaming, litdata, webdataset or the shardstream Python binding, through
    consume.py: one child process per (profile, cold|warm) running every config `runs` times."""

    FORMATS = {"mosaicml-streaming": "mds", "litdata": "litdata", "webdataset": "wds", "shardstream (python)": "mds",
               "shardstream (python, iter_batches)": "mds", ZERO_COPY: "mds", MEMORY: "mds"}

    def __init__(self, system: str, kind: str, profiles: tuple[str, ...] | None = None) -> None:
        self.system, self.kind, self.fmt = system, kind, self.FORMATS[system]
        self.profiles = profiles  # None: every profile

    def runs_profile(self, name: str) -> bool:
        return self.profiles is None or name in self.profiles

    def unavailable(self, ctx: Ctx) -> str | None:
        module = {"mosaicml-streaming": "streaming", "litdata": "litdata", "webdataset": "webdataset",
                  "shardstream (python)": "shardstream", "shardstream (python, iter_batches)": "shardstream",
                  ZERO_COPY: "shardstream", MEMORY: "torch"}[self.system]
        probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        # A package that is there but cannot stream yet (the binding's native part landing later)
        # fails its first, untimed epoch and is skipped with that error as the reason.
        r = subprocess.run([ctx.python, "-c", probe], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            if self.system == "shardstream (python)":
                return ("the `shardstream` Python package is not installed; build it with "
                        "`cd pyo3-bindings && maturin develop --release`")
            return f"`{module}` is not installed in {ctx.python}"
        return None

class ShardstreamCli:
    """`shardstream stream DATASET --json`: the engine alone, without Python."""

    system, kind = "shardstream stream (CLI)", "shardstream"

    def unavailable(self, ctx: Ctx) -> str | None:
        if ctx.shardstream_bin is None:
            return "no shardstream binary (cargo build --release -p shardstream-cli)"
        p = ctx.profiles[0]
        r = self._once(ctx, p, ctx.work / "scratch" / "cli-probe", {"workers": 0, "shuffle": False})
        shutil.rmtree(ctx.work / "scratch" / "cli-probe", ignore_errors=True)
        if r.get("error"):
            return f"`shardstream stream` failed on the first profile: {r['error']}"
        return None

    def _once(self, ctx: Ctx, profile, cache_root: Path, cfg: dict) -> dict:
        """One epoch. With N workers: N processes at once (`--num-workers N --worker i`), sharing
        the node cache as a DataLoader's workers would; their sample counts must add up to the
        dataset (the CLI prints counts, not ids: the check is the count)."""
        import threading

        n_proc = max(1, cfg["workers"])
        cmds = []
        for w in range(n_proc):
            cmd = [str(ctx.shardstream_bin), "--no-progress", "stream", f"s3://bench/mds/{profile.name}", "--cache-root",
                   str(cache_root), "--run-id", "bench", "--json"]
            if cfg["shuffle"]:
                cmd += ["--shuffle", "--seed", "1"]
            if cfg["workers"]:
                cmd += ["--num-workers", str(cfg["workers"]), "--worker", str(w)]
            cmds.append(cmd)
        c0 = ctx.server.counters()
        results: list = [None] * n_proc

        def go(k):
            results[k] = run_child(cmds[k], ctx.timeout, env=ctx.server.env)

        threads = [threading.Thread(target=go, args=(k,)) for k in range(n_proc)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c1 = ctx.server.counters()
        for res in results:
            if res.timed_out:
                return {"error": f"timed out after {ctx.timeout:.0f} s", "check": f"timed out after {ctx.timeout:.0f} s"}
            if res.rc != 0 or not res.lines:
                msg = (res.stderr_tail.strip().splitlines() or [f"exit {res.rc}, no JSON"])[-1][:300]
                return {"error": msg, "check": msg}
        outs = [res.lines[-1] for res in results]
        counts = []
        for out in outs:
            n = _first(out, "samples", "num_samples", "samples_total", "total_samples", "samples_streamed")
            if n is None:
                n = next((v for k, v in out.items() if "sample" in k and "per" not in k and "first" not in k
                          and isinstance(v, int)), None)
            counts.append(n)
        ttfs = [t for t in (_seconds(out, "first") for out in outs) if t is not None]
        stream_s = [out.get("seconds") for out in outs]
        engine_sps = None
        if None not in counts and None not in stream_s and max(stream_s) > 0:
            engine_sps = sum(counts) / max(stream_s)
        t_start, t_end = min(r.t_start for r in results), max(r.t_end for r in results)
        n = None if None in counts else sum(counts)
        if n is None:
            check = "no sample count in the JSON output"
        elif n != profile.samples:
            check = f"{n} samples ({' + '.join(map(str, counts))}), expected {profile.samples}"
        else:
            check = "ok"
        sent = c1.get("bytes_sent", 0) - c0.get("bytes_sent", 0)
        # Memory: the processes' peaks added (an upper bound on their sum at any one time).
        peaks = [r.sampler.peak(r.t_start, r.t_end) or 0 for r in results]
        return {
            "samples": n, "bytes": (n or 0) * profile.sample_bytes, "epoch_s": t_end - t_start,
            "ttfs_s": min(ttfs) if ttfs else None, "check": check, "peak_mem": sum(peaks), "engine_sps": engine_sps,
            "amp": sent / profile.data_bytes,
            "mem_series": [(round(t - results[0].t_start, 3), v) for t, v in results[0].sampler.series],
        }

    def run(self, ctx: Ctx, profile) -> list[Row]:
        rows = []
        base = ctx.work / "scratch" / f"cli-{profile.name}"
        for temperature in ("cold", "warm"):
            results: dict = {}
            warm_root = base / "warm"
            if temperature == "warm":
                shutil.rmtree(warm_root, ignore_errors=True)
                self._once(ctx, profile, warm_root, {"workers": 0, "shuffle": False})
            for rep in range(ctx.runs):
                for cfg in ctx.configs(profile.name, temperature):
                    root = warm_root if temperature == "warm" else base / f"cold-{rep}-{cfg['workers']}-{cfg['shuffle']}"
                    r = self._once(ctx, profile, root, cfg)
                    if temperature == "cold":
                        shutil.rmtree(root, ignore_errors=True)
                    results.setdefault((cfg["workers"], cfg["shuffle"]), []).append(r)
            for cfg in ctx.configs(profile.name, temperature):
                name = config_name(temperature, **cfg).replace(
                    f"DataLoader {cfg['workers']} workers", f"{cfg['workers']} processes --num-workers {cfg['workers']}")
                note = "; ".join(x for x in (ctx.shardstream_bin_note, "the CLI prints counts, not ids: its check is "
                                             "the sample count; time includes process start and dataset open") if x)
                rows.append(aggregate("streaming", self.system, profile.name, name, self.kind,
                                      results[(cfg["workers"], cfg["shuffle"])], temperature=temperature, notes=note))
        shutil.rmtree(base, ignore_errors=True)
        return rows


def _seconds(d: dict, part: str) -> float | None:
    """The value of the first key containing `part`, in seconds (keys ending _ms/_us are scaled)."""
    for k, v in d.items():
        if part in k and isinstance(v, (int, float)):
            return v / 1e3 if k.endswith("_ms") else v / 1e6 if k.endswith("_us") else float(v)
    return None


def _first(d: dict, *keys):
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def run_python(loaders: list[PythonLoader], ctx: Ctx, profiles: list) -> tuple[list[Row], dict]:
    """One child process runs `loaders` over every profile, cold then warm (--smoke passes all of
    them to one child, to import torch once; a full run one loader per child, so that memory
    figures are the loader's own). Returns the rows and, per system that could not run at all
    (its very first, untimed epoch failed), the reason."""
    jobs = []
    s3 = ctx.server.client()
    for loader in loaders:
        for profile in profiles:
            if not loader.runs_profile(profile.name):
                continue
            local_files = [str(f) for f in datasets.files_of(ctx.dirs[profile.name]["wds"])]
            urls = []
            if loader.system == "webdataset":
                for f in local_files:
                    url = s3.generate_presigned_url(
                        "get_object", Params={"Bucket": "bench", "Key": f"wds/{profile.name}/{Path(f).name}"}, ExpiresIn=7200)
                    # WebDataset's documented way to read from an object store: a pipe from a downloader.
                    urls.append(f"pipe:curl -s -f -L '{url}'")
            for temperature in ("memory",) if loader.system == MEMORY else ("cold", "warm"):
                jobs.append({"system": loader.system, "profile": profile.name, "samples": profile.samples,
                             "sample_bytes": profile.sample_bytes, "remote": f"s3://bench/{loader.fmt}/{profile.name}",
                             "temperature": temperature, "urls": urls, "local_files": local_files,
                             "configs": ctx.configs(profile.name, "warm" if temperature == "memory" else temperature)})
    scratch = ctx.work / "scratch" / "consume"
    shutil.rmtree(scratch, ignore_errors=True)
    spec = {"endpoint": ctx.server.endpoint, "counters_url": ctx.server.counters_url, "batch_size": ctx.batch_size, "runs": ctx.runs, "scratch": str(scratch),
            "jobs": jobs}
    env = dict(ctx.server.env)
    env["SHARDSTREAM_RUN_ID"] = "bench"
    bound = ctx.timeout * len(jobs)
    # No sampling from here: consume.py samples its memory itself, in epochs it does not time.
    res = run_child([ctx.python, str(LIB / "consume.py"), json.dumps(spec)], bound, env=env, sample_memory=False)
    shutil.rmtree(scratch, ignore_errors=True)
    failure = None
    if res.timed_out:
        failure = f"timed out after {bound:.0f} s ({ctx.timeout:.0f} s per profile and temperature)"
    elif res.rc != 0:
        failure = "exit %s: %s" % (res.rc, (res.stderr_tail.strip().splitlines() or ["?"])[-1][:300])
    profile_by_name = {p.name: p for p in profiles}
    by_key: dict = {}
    memory_of: dict = {}
    started = {jobs[line["job"]]["system"] for line in res.lines}
    for line in res.lines:
        if line.get("prewarm"):
            continue
        key = (line["job"], line["workers"], line["shuffle"])
        if line.get("memory_run"):
            memory_of.setdefault(key, []).append(line)
            continue
        job = jobs[line["job"]]
        profile = profile_by_name[job["profile"]]
        sb = line.get("server_bytes")
        line["amp"] = sb / profile.data_bytes if sb is not None else None
        by_key.setdefault(key, []).append(line)
    # Each timed run carries the peak of one of its configuration's memory epochs (as many as
    # timed runs), so that the row's peak is a median over runs.
    for key, lines in by_key.items():
        mems = memory_of.get(key, [])
        for k, line in enumerate(lines):
            mem = mems[k] if k < len(mems) else (mems[-1] if mems else {})
            line["peak_mem"] = mem.get("peak_mem")
            line["mem_series"] = mem.get("mem_series", [])
            if mem.get("check", "ok") != "ok":
                own = "" if line.get("check") == "ok" else f"{line.get('check')}; "
                line["check"] = f"{own}memory epoch: {mem['check']}"
    rows, failed = [], {}
    kinds = {lo.system: lo.kind for lo in loaders}
    for j, job in enumerate(jobs):
        if job["system"] not in started:
            failed[job["system"]] = failure or "no output"
            continue
        for cfg in job["configs"]:
            runs = by_key.get((j, cfg["workers"], cfg["shuffle"]), [])
            row = aggregate("streaming", job["system"], job["profile"], config_name(job["temperature"], **cfg),
                            kinds[job["system"]], runs, temperature=job["temperature"])
            if failure and len(runs) < ctx.runs:
                row.check = (row.check + "; " if runs else "") + failure
            rows.append(row)
    return rows, failed


def run_all(ctx: Ctx, log) -> tuple[list[Row], list[Skip]]:
    runners = [
        ShardstreamCli(),
        PythonLoader("shardstream (python)", "shardstream"),
        PythonLoader("shardstream (python, iter_batches)", "shardstream"),
        # `zero_copy=True` is for large samples (docs/python.md): the 1 MB profile only.
        PythonLoader(ZERO_COPY, "shardstream", profiles=("1MB",)),
        PythonLoader("mosaicml-streaming", "peer"),
        PythonLoader("litdata", "peer"),
        PythonLoader("webdataset", "peer"),
        PythonLoader(MEMORY, "ceiling"),
    ]
    rows, skips, python = [], [], []
    for r in runners:
        reason = r.unavailable(ctx)
        if reason:
            log(f"streaming: skip {r.system}: {reason}")
            skips.append(Skip("streaming", r.system, reason))
            continue
        if isinstance(r, PythonLoader):
            python.append(r)
            continue
        t = time.monotonic()
        got = [row for p in ctx.profiles for row in r.run(ctx, p)]
        rows.extend(got)
        _log_rows(log, r.system, got, t)
    groups = [python] if ctx.smoke else [[lo] for lo in python]
    for group in groups:
        t = time.monotonic()
        got, failed = run_python(group, ctx, ctx.profiles)
        for system, reason in failed.items():
            reason = f"its first (untimed) epoch failed: {reason}"
            log(f"streaming: skip {system}: {reason}")
            skips.append(Skip("streaming", system, reason))
        rows.extend(got)
        _log_rows(log, " + ".join(lo.system for lo in group), got, t)
    return rows, skips


def _log_rows(log, name: str, got: list, t: float) -> None:
    bad = [x for x in got if x.check != "ok"]
    log(f"streaming: {name}: {len(got)} rows in {time.monotonic() - t:.0f} s"
        + (f", {len(bad)} not ok: {bad[0].check}" if bad else ""))

#!/usr/bin/env python3
"""The one benchmark command: shardstream against its peers on this machine, and the report.

    .venv/bin/python benches/run.py            # full run: writes docs/benchmarks.md and docs/benchmarks/*.png
    .venv/bin/python benches/run.py --smoke --out /tmp/bench   # tiny data, < 60 s (CI)
    .venv/bin/python benches/run.py --scale realistic --server s3s-fs --profiles 1MB   # 2 GB in 64 MB shards
    .venv/bin/python benches/run.py --render docs/realistic/10KB   # the report again from its results.json

What it does, in order (each system a runner that is skipped with a stated reason when it cannot
run on this checkout or machine):
  1. builds what it needs (`cargo build --release -p shardstream-cli`, `maturin build --release`;
     skipped with --no-build and in
     --smoke, which uses whatever binary is there);
  2. writes the datasets: three profiles (100 B, 10 KB, 1 MB samples) in MDS, LitData and WebDataset,
     at the chosen scale (`quick`: 5-100 MB; `realistic`: ~2 GB per profile in ~64 MB shards);
  3. starts a local S3 server (moto or s3s-fs, on 127.0.0.1, a free port) and uploads them;
  4. measures the ceilings (page-cache read, raw parallel GET, zstd), then streaming (shardstream CLI and
     Python binding, mosaicml-streaming, litdata, webdataset; cold and warm, 1 process and DataLoader
     with 2 workers, shuffled and not), FUSE (shardstream mount, rclone mount, s3fs; cold and warm) and
     checkpoints (torch FileSystemWriter, s3torchconnector, shardstream; save and load);
  5. writes the report (Markdown tables and PNG plots) and the raw results as JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))

import ceilings  # noqa: E402
import ckptbench  # noqa: E402
import datasets  # noqa: E402
import fusebench  # noqa: E402
import streambench  # noqa: E402
from report import Report  # noqa: E402
from results import Row, Skip  # noqa: E402
import s3server  # noqa: E402

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def sh_out(cmd: list[str], timeout: float = 30) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "?"
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e.__class__.__name__})"


def find_binary(args, skips: list) -> tuple[Path | None, str]:
    if os.environ.get("SHARDSTREAM_BIN"):
        p = Path(os.environ["SHARDSTREAM_BIN"])
        return (p, "" if "release" in str(p) else f"binary from SHARDSTREAM_BIN={p}") if p.exists() else (None, "")
    release, debug = REPO / "target/release/shardstream", REPO / "target/debug/shardstream"
    if not args.no_build and not args.smoke:
        log("building target/release/shardstream (cargo build --release -p shardstream-cli)")
        r = subprocess.run(["cargo", "build", "--release", "-q", "-p", "shardstream-cli"], cwd=REPO,
                           timeout=args.build_timeout, capture_output=True, text=True)
        if r.returncode != 0:
            skips.append(Skip("build", "cargo build --release", (r.stderr.strip().splitlines() or ["?"])[-1][:300]))
        log("building the object_store ceilings (storage/examples/get_ceiling.rs)")
        r = subprocess.run(["cargo", "build", "--release", "-q", "-p", "shardstream-storage", "--example", "get_ceiling"],
                           cwd=REPO, timeout=args.build_timeout, capture_output=True, text=True)
        if r.returncode != 0:
            skips.append(Skip("build", "get_ceiling", (r.stderr.strip().splitlines() or ["?"])[-1][:300]))
        maturin = Path(sys.executable).parent / "maturin"
        # `maturin build`, not `develop`: the release module is staged privately (stage_binding) and
        # the checkout's installed package is left as it is.
        log("building the Python binding in release (maturin build --release)")
        r = subprocess.run([str(maturin), "build", "--release", "--quiet", "-o", str(REPO / ".bench-work" / "wheels")],
                           cwd=REPO / "pyo3-bindings",
                           timeout=args.build_timeout, capture_output=True, text=True)
        if r.returncode != 0:
            skips.append(Skip("build", "maturin build --release", (r.stderr.strip().splitlines() or ["?"])[-1][:300]))
    if release.exists():
        return release, ""
    if debug.exists():
        return debug, "debug build (target/debug/shardstream): no release binary in this checkout; its figures understate a release build"
    return None, ""


def stage_binding(work: Path, smoke: bool) -> str:
    """Which build of the Python binding the children import. A full run imports a private copy of
    the package with the release native module (target/release/lib_native.so, from `maturin develop
    --release`), put first on PYTHONPATH, so that a `maturin develop --profile dev` run by someone else
    in the same checkout cannot swap the module mid-run. Returns a description for the report."""
    pkg = REPO / "pyo3-bindings" / "python" / "shardstream"
    installed = sorted(pkg.glob("_native*.so"))
    release, debug = REPO / "target/release/lib_native.so", REPO / "target/debug/lib_native.so"

    def built(p: Path) -> str:
        return dt.datetime.fromtimestamp(p.stat().st_mtime, dt.timezone.utc).strftime("%H:%M UTC")

    if not installed:
        return "not installed"
    if not smoke and release.exists():
        stage = work / "pybinding" / "shardstream"
        shutil.rmtree(stage.parent, ignore_errors=True)
        shutil.copytree(pkg, stage, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        shutil.copy2(release, stage / installed[0].name)
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(stage.parent), os.environ.get("PYTHONPATH")) if x)
        return f"release build (target/release/lib_native.so, built {built(release)}), imported from a private copy"
    so = installed[0]
    for name, p in (("release", release), ("dev", debug)):
        if p.exists() and p.stat().st_size == so.stat().st_size and p.read_bytes() == so.read_bytes():
            return f"{name} build (the installed module, built {built(so)})"
    return f"unknown build profile (the installed module, built {built(so)})"


def versions(bin_path: Path | None, python: str) -> dict:
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for p in ['torch', 'mosaicml-streaming', 'litdata', 'webdataset', 'moto', 'boto3', 's3torchconnector', 'matplotlib', 'numpy', 'shardstream']:\n"
            "    try: out[p] = m.version(p)\n"
            "    except Exception: out[p] = 'not installed'\n"
            "print(json.dumps(out))")
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    v = {"python": platform.python_version()}
    v.update(json.loads(r.stdout) if r.returncode == 0 else {})
    v["shardstream CLI"] = sh_out([str(bin_path), "--version"]) + f" ({bin_path.relative_to(REPO) if bin_path.is_relative_to(REPO) else bin_path})" if bin_path else "not built"
    v["rclone"] = sh_out(["rclone", "version"]) if shutil.which("rclone") else "not installed"
    v["s3fs"] = sh_out(["s3fs", "--version"]) if shutil.which("s3fs") else "not installed"
    v["zstd"] = sh_out(["zstd", "--version"])
    return v


def machine() -> dict:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    except OSError:
        pass
    return {"CPU": f"{cpu} × {os.cpu_count()} logical cores", "RAM": mem, "kernel": platform.release(),
            "OS": platform.platform(), "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny data, one run each, for CI (< 60 s)")
    ap.add_argument("--out", help="folder for the report (benchmarks.md, benchmarks/*.png, results.json); "
                    "default: docs/ for a full run, <work>/report for --smoke")
    ap.add_argument("--scale", choices=datasets.SCALES[1:], default="quick",
                    help="dataset sizes: quick (5-100 MB per profile) or realistic (~2 GB per profile in ~64 MB shards)")
    ap.add_argument("--profiles", default="", help="comma-separated profiles to run (100B,10KB,1MB; default all)")
    ap.add_argument("--server", choices=("moto", "s3s-fs"), default="moto",
                    help="the local S3 server (s3s-fs: `cargo install s3s-fs`, or SHARDSTREAM_S3S_FS)")
    ap.add_argument("--work", default=None, help="datasets and scratch space (default .bench-work/<scale>)")
    ap.add_argument("--runs", type=int, help="runs per figure (default 3; 1 with --smoke)")
    ap.add_argument("--timeout", type=float, help="bound on one child process, seconds (default 300; 60 with --smoke)")
    ap.add_argument("--build-timeout", type=float, default=1800)
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--only", default="ceilings,streaming,fuse,checkpoint", help="comma-separated sections")
    ap.add_argument("--note", default="", help="a sentence printed at the top of the report (e.g. machine load)")
    ap.add_argument("--render", metavar="FOLDER",
                    help="measure nothing: write FOLDER/benchmarks.md and its plots again from FOLDER/benchmarks/results.json "
                         "with this checkout's report code (for a column or goal added since that run)")
    args = ap.parse_args()
    if args.render:
        return render(Path(args.render))
    runs = args.runs or (1 if args.smoke else 3)
    timeout = args.timeout or (60 if args.smoke else 300)
    scale = "smoke" if args.smoke else args.scale
    work = Path(args.work) if args.work else REPO / ".bench-work" / {"quick": "run"}.get(scale, scale)
    out = Path(args.out) if args.out else (work / "report" if args.smoke else REPO / "docs")
    if args.smoke and out.resolve() == (REPO / "docs").resolve():
        ap.error("--smoke never writes docs/: give another --out")
    sections = set(args.only.split(","))
    work.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    skips: list = []
    start_date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    m = machine()
    bin_path, bin_note = find_binary(args, skips)
    log(f"shardstream binary: {bin_path or 'none'} {bin_note}")
    binding = stage_binding(work, args.smoke)
    log(f"shardstream Python binding: {binding}")

    profiles = datasets.selected(scale, args.profiles)
    log(f"writing datasets at scale {scale} (reused when already complete)")
    subprocess.run([python, str(REPO / "benches/lib/datasets.py"), str(work), scale, args.profiles], check=True,
                   timeout=7200, stdout=subprocess.DEVNULL)
    dirs = {p.name: {f: work / "data" / f / p.name for f in datasets.WRITERS} for p in profiles}
    ds_meta = []
    for p in profiles:
        d = {"profile": p.name, "samples": p.samples, "sample_bytes": p.sample_bytes, "payload": p.data_bytes}
        for f in datasets.WRITERS:
            files = datasets.files_of(dirs[p.name][f])
            d[f] = {"bytes": sum(x.stat().st_size for x in files), "files": len(files)}
        ds_meta.append(d)

    rows = []
    with s3server.start(args.server, work, python) as server:
        log(f"{server.name} S3 server on {server.endpoint}")
        s3 = server.client()
        s3.create_bucket(Bucket="bench")
        for p in profiles:
            for f in datasets.WRITERS:
                datasets.upload(s3, "bench", dirs[p.name][f], f"{f}/{p.name}")
        # The upload left the server's copy (s3s-fs's folder, moto's spooled objects) as dirty
        # pages: write them out now, so that their writeback does not fall into the first rows.
        t_sync = time.monotonic()
        os.sync()
        log(f"upload flushed to disk in {time.monotonic() - t_sync:.1f} s")
        ctx = streambench.Ctx(work=work, python=python, server=server, profiles=profiles, dirs=dirs, runs=runs,
                            timeout=timeout, batch_size=64 if not args.smoke else 16, shardstream_bin=bin_path,
                            shardstream_bin_note=bin_note, smoke=args.smoke)
        if "ceilings" in sections:
            rows += ceilings.run_all(ctx, log)
        if "streaming" in sections:
            r, s = streambench.run_all(ctx, log)
            rows += r
            skips += s
        fuse_profiles = profiles[1:2] if args.smoke else [p for p in profiles if p.name == "1MB"]
        if "fuse" in sections:
            r, s = fusebench.run_all(ctx, log, fuse_profiles)
            rows += r
            skips += s
        ckpt_mb = {"smoke": 8, "quick": 128, "realistic": 1024}[scale]
        # The same state dict per rank, once in one process and once in several ranks that
        # share the server (2 in the smoke run, to keep CI short).
        ckpt_shapes = [(ckpt_mb, 1), (ckpt_mb, 2 if args.smoke else 4)]
        if "checkpoint" in sections:
            # The datasets are not read again: off the server they go, so that moto (which holds
            # objects in memory) has room for 4 ranks' checkpoints beside the ranks themselves.
            s3server.delete_prefix(s3, "bench")
            for mb, ranks in ckpt_shapes:
                r, s = ckptbench.run_all(ctx, log, mb, ranks)
                rows += r
                skips += s

    m["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    m["wall time of this run"] = f"{time.monotonic() - T0:.0f} s"
    meta = {
        "command": " ".join(shlex.quote(a) for a in [Path(python).relative_to(REPO).as_posix() if Path(python).is_relative_to(REPO) else python,
                                                     "benches/run.py", *sys.argv[1:]]),
        "date": start_date,
        "commit": sh_out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]),
        "note": ("SMOKE RUN on tiny data (--smoke): it checks that every runner works and every epoch is complete; "
                 "its figures are not measurements. " if args.smoke else "") + args.note,
        "machine": m,
        "versions": {**versions(bin_path, python), "shardstream Python binding": binding},
        "datasets": ds_meta,
        "profiles": [p.name for p in profiles],
        "scale": scale,
        "server": args.server,
        "fuse_profiles": [p.name for p in fuse_profiles],
        "ckpt_profiles": [ckptbench.profile_name(mb, ranks) for mb, ranks in ckpt_shapes],
        "setup": [
            *([f"- **S3 server**: moto's server (moto[server], already a test dependency) on 127.0.0.1 and a free port, with a thin",
               "  counting middleware (benches/lib/s3server.py) so that every system's download amplification is measured the same",
               "  way, at the server. moto is slower than a production store, so the raw parallel GET/PUT ceilings below are",
               "  measured against the same server and every ratio uses them (`--server s3s-fs` runs a faster Rust server)."]
              if args.server == "moto" else
              ["- **S3 server**: s3s-fs (a Rust S3 server from crates.io, objects as files on this disk) on 127.0.0.1 and a free",
               "  port; amplification from the bytes its process wrote (/proc/PID/io), so no counting proxy slows it. The raw",
               "  parallel GET and the cold ceiling (GET → cache files with fsync) are measured against it."]),
            f"- **Scale**: {scale} ({', '.join(f'{p.name}: {p.samples:,} samples, {p.data_bytes / 1e9:.2f} GB in ≤{p.shard_bytes >> 20} MiB shards' for p in profiles)}).",
            "- **Datasets**: one sample stream (`{id, data}`, data = the id + half random, half repeated text) written by each",
            "  system's own writer: MDS by mosaicml-streaming's MDSWriter (read by Mosaic and shardstream), LitData chunks by",
            "  litdata's BinaryWriter (what `litdata.optimize` runs in each worker), WebDataset tars by `webdataset.TarWriter`; uncompressed (WebDataset has no shard compression).",
            "- **Cold**: an empty local cache, every shard from the server. **Warm**: one untimed epoch filled the system's own",
            "  cache; each warm run gets a hard-linked copy of it (WebDataset has no cache: warm = the local tar files).",
            "  Every Python child process first runs one untimed epoch so lazy imports are not counted.",
            f"- **Runs**: {runs} per figure; each child process bounded by {timeout:.0f} s; DataLoader batch size {ctx.batch_size}.",
            "  The peers are used as their docs show: Mosaic `StreamingDataset(remote, local, shuffle, batch_size)`, LitData",
            "  `StreamingDataset` + `StreamingDataLoader` (its obstore path gets `allow_http` for the http:// loopback server),",
            "  WebDataset `WebDataset(urls, shardshuffle)` + `.shuffle(1000)` reading `pipe:curl` of presigned URLs.",
        ],
    }
    rep = Report(rows, skips, meta)
    # The raw figures first: a report that fails to render must not lose the run behind it.
    (out / "benchmarks").mkdir(parents=True, exist_ok=True)
    (out / "benchmarks" / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": [r.to_dict() for r in rows], "skips": [s.__dict__ for s in skips]}, indent=1, default=str))
    plots = rep.plots(out / "benchmarks")
    (out / "benchmarks.md").write_text(rep.markdown(plots))
    log(f"report: {out / 'benchmarks.md'}")
    bad = [r for r in rows if r.check != "ok"]
    for r in bad:
        log(f"NOT OK: {r.section} {r.system} {r.profile} {r.config}: {r.check}")
    return 0


def render(folder: Path) -> int:
    """The report of an earlier run again, from its raw figures: the same measurements, this
    checkout's derived columns and goals; the header says when and by which commit it was redrawn."""
    raw = json.loads((folder / "benchmarks" / "results.json").read_text())
    meta = raw["meta"]
    meta["rendered"] = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                        "commit": sh_out(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])}
    rep = Report([Row(**r) for r in raw["rows"]], [Skip(**s) for s in raw["skips"]], meta)
    # The run's own plots stay: results.json keeps 40 points of each memory series, the run drew
    # its plot from all of them. Only a plot the run did not draw is added.
    with tempfile.TemporaryDirectory() as tmp:
        plots = rep.plots(Path(tmp))
        for name in plots:
            if not (folder / "benchmarks" / name).exists():
                shutil.copy(Path(tmp) / name, folder / "benchmarks" / name)
    (folder / "benchmarks.md").write_text(rep.markdown(plots))
    log(f"report: {folder / 'benchmarks.md'} (re-rendered from its results.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

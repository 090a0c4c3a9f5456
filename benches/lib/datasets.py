"""The benchmark datasets: one sample stream, three profiles, written in every system's own format.

Sample `i` is `{"id": i, "data": <size bytes>}` where `data` starts with `i` as 8 little-endian
bytes (so a consumer can check that each sample's bytes belong to its id), then half bytes from a
fixed random pool and half repeated text: compressible about 2x, like real data, not trivially so.

Formats, each written by the peer's own writer so that nobody reads a foreign layout:
  - MDS (mosaicml-streaming's `MDSWriter`) — read by Mosaic and by shardstream (byte-compatible);
  - LitData chunks (`litdata.optimize`);
  - WebDataset tars (`webdataset.TarWriter`), one `.bin` member per sample, key = zero-padded id.
All uncompressed: WebDataset has no per-shard compression, so compression would compare different
work; the zstd ceiling is reported on its own.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

POOL_SEED = 20261123
_POOL: bytes | None = None


def pool() -> bytes:
    global _POOL
    if _POOL is None:
        _POOL = random.Random(POOL_SEED).randbytes(2 << 20)
    return _POOL


def sample_bytes(i: int, size: int) -> bytes:
    head = i.to_bytes(8, "little")
    p = pool()
    half = size // 2
    off = (i * 7919) % (len(p) - half)
    text = (b"sample %d " % i) * (half // 8 + 1)
    return (head + p[off : off + half] + text)[:size]


@dataclass(frozen=True)
class Profile:
    name: str  # e.g. "100B"
    sample_bytes: int
    samples: int
    shard_bytes: int  # size limit of one shard

    @property
    def data_bytes(self) -> int:
        return self.sample_bytes * self.samples


# The dataset scales of the one command. "quick" (5 to 100 MB) is fast but hides per-epoch and
# cache effects; "realistic" is what users train on: about 2 GB per profile in ~64 MB shards
# (the 100 B profile is 100 MB: a million samples is what matters there, not the bytes).
SCALES = ("smoke", "quick", "realistic")


def profiles(scale: "str | bool") -> list[Profile]:
    if scale is True or scale == "smoke":
        return [
            Profile("100B", 100, 2_000, 64 << 10),
            Profile("10KB", 10_000, 120, 256 << 10),
            Profile("1MB", 1_000_000, 6, 2 << 20),
        ]
    if scale is False or scale == "quick":
        return [
            Profile("100B", 100, 50_000, 512 << 10),
            Profile("10KB", 10_000, 5_000, 4 << 20),
            Profile("1MB", 1_000_000, 100, 8 << 20),
        ]
    if scale == "realistic":
        return [
            Profile("100B", 100, 1_000_000, 64 << 20),
            Profile("10KB", 10_000, 200_000, 64 << 20),
            Profile("1MB", 1_000_000, 2_000, 64 << 20),
        ]
    raise ValueError(f"unknown dataset scale {scale!r}: one of {', '.join(SCALES)}")


def selected(scale: str, names: str = "") -> list[Profile]:
    """The scale's profiles, restricted to the comma-separated `names` when given."""
    ps = profiles(scale)
    if not names:
        return ps
    want = [n.strip() for n in names.split(",") if n.strip()]
    unknown = sorted(set(want) - {p.name for p in ps})
    if unknown:
        raise ValueError(f"unknown profile(s) {', '.join(unknown)}: one of {', '.join(p.name for p in ps)}")
    return [p for p in ps if p.name in want]


def _write_mds(p: Profile, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"id": "int", "data": "bytes"}, size_limit=p.shard_bytes) as w:
        for i in range(p.samples):
            w.write({"id": i, "data": sample_bytes(i, p.sample_bytes)})


def _write_litdata(p: Profile, out: Path) -> None:
    # litdata's BinaryWriter: the writer `litdata.optimize` runs in each of its workers, used here
    # in-process (optimize's spawned workers cost ~10 s of start-up on this machine).
    from litdata.streaming.writer import BinaryWriter

    out.mkdir(parents=True, exist_ok=True)
    w = BinaryWriter(str(out), chunk_bytes=p.shard_bytes)
    for i in range(p.samples):
        w[i] = {"id": i, "data": sample_bytes(i, p.sample_bytes)}
    w.done()
    w.merge()


def _write_wds(p: Profile, out: Path) -> None:
    import webdataset as wds

    out.mkdir(parents=True, exist_ok=True)
    shard, written, w = 0, 0, None
    for i in range(p.samples):
        if w is None or written >= p.shard_bytes:
            if w is not None:
                w.close()
            w = wds.TarWriter(str(out / f"shard-{shard:05d}.tar"))
            shard, written = shard + 1, 0
        w.write({"__key__": f"{i:010d}", "bin": sample_bytes(i, p.sample_bytes)})
        written += p.sample_bytes + 1024  # a tar member's header and padding
    if w is not None:
        w.close()


WRITERS = {"mds": _write_mds, "litdata": _write_litdata, "wds": _write_wds}


def count_samples(fmt: str, out: Path) -> int:
    """Samples recorded by a written dataset (read back from its index or its tar members)."""
    if fmt == "mds":
        return sum(s["samples"] for s in json.loads((out / "index.json").read_text())["shards"])
    if fmt == "litdata":
        return sum(c["chunk_size"] for c in json.loads((out / "index.json").read_text())["chunks"])
    import tarfile

    n = 0
    for f in files_of(out):
        with tarfile.open(f) as t:
            n += sum(1 for m in t.getmembers() if m.isfile())
    return n


def build(work: Path, p: Profile) -> dict[str, Path]:
    """Writes the profile in every format under work/data/<fmt>/<profile> (reused when complete)."""
    dirs = {}
    for fmt, write in WRITERS.items():
        out = work / "data" / fmt / p.name
        stamp = out / ".bench-complete"
        want = json.dumps({"samples": p.samples, "bytes": p.sample_bytes, "shard": p.shard_bytes, "v": 1})
        if not (stamp.exists() and stamp.read_text() == want):
            shutil.rmtree(out, ignore_errors=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            write(p, out)
            got = count_samples(fmt, out)
            if got != p.samples:
                raise RuntimeError(f"{fmt} writer produced {got} samples, expected {p.samples} ({out})")
            stamp.write_text(want)
        dirs[fmt] = out
    return dirs


def files_of(d: Path) -> list[Path]:
    return sorted(f for f in d.rglob("*") if f.is_file() and not f.name.startswith("."))


def upload(s3, bucket: str, local: Path, prefix: str) -> int:
    """Uploads a dataset folder with a thread pool; returns its bytes."""
    files = files_of(local)
    with cf.ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda f: s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(local).as_posix()}"), files))
    return sum(f.stat().st_size for f in files)


if __name__ == "__main__":
    # `python datasets.py WORK SCALE [PROFILES]`: builds every profile of the scale (a script, so
    # that litdata's spawned optimize workers can import their main module). SCALE may also be
    # "1" (smoke) or "0" (quick), as older callers pass it.
    import sys

    scale = {"1": "smoke", "0": "quick"}.get(sys.argv[2], sys.argv[2])
    for prof in selected(scale, sys.argv[3] if len(sys.argv) > 3 else ""):
        build(Path(sys.argv[1]), prof)

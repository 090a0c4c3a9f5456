"""Writes the fuzz seed corpus (fuzz/seeds/<target>/): tiny datasets written by the real peers
(Mosaic's MDSWriter, webdataset's TarWriter, litdata's BinaryWriter) and a checkpoint manifest
written by shardstream's DCP writer. Run with the project venv: `.venv/bin/python
fuzz/make_seeds.py` (the files are committed; rerun when a format gains a field)."""

import io
import shutil
import sys
import tempfile
from pathlib import Path

out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "seeds"
work = Path(tempfile.mkdtemp(prefix="fuzz-seeds-"))
for t in ["mds_index", "mds_shard", "wds_tar", "litdata_chunk", "litdata_index", "litdata_framed", "checkpoint_manifest"]:
    (out / t).mkdir(parents=True, exist_ok=True)
# MDS, written by Mosaic's own writer: plain and zstd, several encodings.
from streaming import MDSWriter
import numpy as np
for name, comp in [("plain", None), ("zstd", "zstd")]:
    d = work / f"mds-{name}"
    with MDSWriter(out=str(d), columns={"id": "int", "x": "uint32", "txt": "str", "raw": "bytes", "arr": "ndarray:float32:3", "js": "json"},
                   compression=comp, hashes=["xxh64"], size_limit=1 << 12) as w:
        for i in range(12):
            w.write({"id": i, "x": np.uint32(3 * i), "txt": f"s{i}", "raw": bytes([i]) * 7, "arr": np.arange(3, dtype=np.float32) + i, "js": {"k": i}})
    shutil.copy(d / "index.json", out / "mds_index" / f"{name}.json")
    shard = sorted(p for p in d.iterdir() if p.name.startswith("shard"))[0]
    shutil.copy(shard, out / "mds_shard" / f"{name}-{shard.name}")
# WebDataset tar, written by webdataset's own TarWriter.
import webdataset as wds
buf = io.BytesIO()
with wds.TarWriter(buf) as w:
    for i in range(3):
        w.write({"__key__": f"s{i:03d}", "txt": f"t{i}", "cls": str(i), "json": {"i": i}})
(out / "wds_tar" / "three.tar").write_bytes(buf.getvalue())
# LitData, written by litdata's own writer: plain and zstd chunks.
from litdata.streaming.writer import BinaryWriter
for name, comp in [("plain", None), ("zstd", "zstd")]:
    d = work / f"lit-{name}"
    d.mkdir(exist_ok=True)
    w = BinaryWriter(str(d), chunk_size=4, compression=comp)
    for i in range(6):
        w[i] = {"id": i, "txt": f"s{i}", "raw": bytes([i]) * 5}
    w.done()
    w.merge()
    shutil.copy(d / "index.json", out / "litdata_index" / f"{name}.json")
    chunk = sorted(p for p in d.iterdir() if p.name.startswith("chunk"))[0]
    shutil.copy(chunk, out / "litdata_chunk" / f"{name}-{chunk.name}")
# A framed zstd chunk (litdata's default level for zstd; it frames chunks with array leaves).
d = work / "lit-framed"
d.mkdir(exist_ok=True)
w = BinaryWriter(str(d), chunk_size=4, compression="zstd")
for i in range(6):
    w[i] = {"id": i, "arr": np.arange(3, dtype=np.float32) + i}
w.done()
w.merge()
chunk = sorted(p for p in d.iterdir() if p.name.startswith("chunk"))[0]
assert chunk.read_bytes().startswith(b"LDFZ01")
shutil.copy(chunk, out / "litdata_framed" / f"framed-{chunk.name}")
# A checkpoint manifest, written by shardstream's torch DCP writer.
import torch, torch.distributed.checkpoint as dcp
from shardstream.checkpoint import StorageWriter
root = work / "ckpt"
dcp.save({"w": torch.arange(8.0), "step": torch.tensor(3)}, storage_writer=StorageWriter(str(root / "step_3")), no_dist=True)
man = next(root.rglob("_shardstream_manifest.json"))
shutil.copy(man, out / "checkpoint_manifest" / "two_items.json")
for t in sorted(out.iterdir()):
    print(t.name, [(p.name, p.stat().st_size) for p in t.iterdir()])
shutil.rmtree(work)

#!/usr/bin/env python3
"""Generates the demo's built-in default dataset with the standard library only:
an ImageFolder tree (3 classes of small PNG images) and a JSONL file of text records.

Usage: demo_data.py OUT_DIR [--images N] [--records N]"""

import argparse
import json
import random
import struct
import zlib
from pathlib import Path


def png(width: int, height: int, rng: random.Random) -> bytes:
    """A valid RGB PNG of random pixels (no PIL needed)."""
    rows = b"".join(
        b"\x00" + bytes(rng.randrange(256) for _ in range(width * 3)) for _ in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--records", type=int, default=5000)
    args = ap.parse_args()
    out = Path(args.out)
    rng = random.Random(0)
    classes = ["cat", "dog", "fish"]
    for i in range(args.images):
        cls = classes[i % len(classes)]
        path = out / "images" / cls / f"{i:05}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png(16, 16, rng))
    with open(out / "records.jsonl", "w") as f:
        for i in range(args.records):
            rec = {"id": i, "text": " ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(12)), "label": i % 10}
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()

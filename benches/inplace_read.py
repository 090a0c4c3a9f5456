"""Issue 41 item 3, the in-place case: samples of a local MDS dataset read where they lie
(`StreamingDataset(local=DIR)`, no `remote`), one process, per sample, as `bytes` and with
`zero_copy=True`, against `cat` of the same shard files, all warm in the page cache. 3 runs each.

    PYTHONPATH=.bench-work/realistic/pybinding .venv/bin/python benches/inplace_read.py \
        .bench-work/realistic/data/mds/1MB

(`benches/run.py --scale realistic` writes that dataset and stages the release binding there.)
"""
import glob
import os
import subprocess
import sys
import time

import shardstream


def main() -> None:
    folder = sys.argv[1]
    files = sorted(glob.glob(os.path.join(folder, "*.mds")))
    total = sum(os.path.getsize(f) for f in files)
    for f in files:  # into the page cache
        with open(f, "rb") as h:
            while h.read(1 << 24):
                pass

    def cat_mb_s() -> float:
        start = time.perf_counter()
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
        return total / (time.perf_counter() - start) / 1e6

    for zero_copy in (False, True):
        rates = []
        for _ in range(3):
            ds = shardstream.StreamingDataset(local=folder, shuffle=False, batch_size=64, zero_copy=zero_copy)
            start, payload, samples = time.perf_counter(), 0, 0
            for sample in ds:
                payload += len(sample["data"])
                samples += 1
            rates.append(payload / (time.perf_counter() - start) / 1e6)
        print(f"in place, zero_copy={zero_copy}: {sorted(round(r) for r in rates)} MB/s ({samples} samples)")
    print(f"cat: {sorted(round(cat_mb_s()) for _ in range(3))} MB/s ({len(files)} files, {total} bytes)")


if __name__ == "__main__":
    main()

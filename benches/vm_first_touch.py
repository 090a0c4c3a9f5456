#!/usr/bin/env python3
"""What touching fresh memory costs on this machine, with and without transparent huge pages.

A checkpoint load writes into fresh read buffers, advised as huge pages (checkpoint/src/fetch.rs),
and its figure moved between 0.6x and 1.15x of the raw GET ceiling across sittings on the 2-core
development VM with no code changed. This probe separates the machine's part: it maps 1 GiB of
anonymous memory, optionally advises it `MADV_HUGEPAGE`, writes every byte once and reports the
wall time, the system CPU and the page faults; `--cold` first drops the page cache, so that the
memory handed out next is memory the guest has just freed (on a VM with free page reporting,
memory the host may have taken back), and waits for the report to happen.

    sudo .venv/bin/python benches/vm_first_touch.py [--cold] [--rounds 3]

On the development VM (Firecracker, virtio-balloon free page reporting at order 9, 2 MiB;
benches/README.md): recycled memory, huge pages 0.16-0.18 s per GiB against small pages
0.47-0.53 s; freshly reported memory, huge pages 2.3-2.8 s against small pages 0.57-0.60 s.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import time
from pathlib import Path

GIB = 1 << 30
CHUNK = b"\1" * (64 << 20)


def touch(huge: bool) -> tuple[float, float, int]:
    """Wall seconds, system CPU seconds and minor faults of writing 1 GiB of fresh memory once."""
    m = mmap.mmap(-1, GIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        if huge:
            m.madvise(mmap.MADV_HUGEPAGE)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        for off in range(0, GIB, len(CHUNK)):
            m[off:off + len(CHUNK)] = CHUNK
        t1, r1 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    finally:
        m.close()
    return t1 - t0, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt


def drop_page_cache(wait_s: float) -> None:
    """Frees the page cache (root only) and waits for free page reporting (a 2 s delay in Linux)."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    time.sleep(wait_s)


def setting(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return "absent"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cold", action="store_true", help="drop the page cache before each first touch (root)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=float, default=6.0, help="seconds to wait after dropping the page cache")
    args = ap.parse_args()
    print(f"THP enabled: {setting('/sys/kernel/mm/transparent_hugepage/enabled')}; "
          f"defrag: {setting('/sys/kernel/mm/transparent_hugepage/defrag')}; "
          f"free page reporting order: {setting('/sys/module/page_reporting/parameters/page_reporting_order')}")
    for rnd in range(args.rounds):
        for huge in (False, True):
            if args.cold:
                drop_page_cache(args.wait)
            first = touch(huge)
            again = touch(huge)
            label = "huge pages " if huge else "small pages"
            print(f"round {rnd} {label}: first touch {first[0]:.2f} s (sys {first[1]:.2f} s, {first[2]} faults); "
                  f"again {again[0]:.2f} s (sys {again[1]:.2f} s, {again[2]} faults)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

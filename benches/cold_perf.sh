#!/usr/bin/env bash
# Where the whole machine's CPU goes while cold `DataLoader(2)` epochs of the batch path run.
#
# Runs `benches/cold_timeline.py` (cold epochs of `iter_batches` through `DataLoader(2)` from the
# benchmark's moto server, a fresh cache each) and, once its epochs are under way, samples every
# CPU with `perf record -a`, then prints the CPU split by process (the training process, moto,
# the DataLoader workers, idle) and thread name, and the TLB flushes by reason and by thread. A
# diagnostic, not a benchmark (benches/run.py measures); benches/README.md quotes it.
#
#     bash benches/cold_perf.sh [PROFILE] [SECONDS] [WARMUP]      # 10KB 10 15 by default
#
# Needs `perf` (linux-perf) and the rights to sample every CPU (root, or perf_event_paranoid -1).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-10KB}
seconds=${2:-10}
warmup=${3:-15}
command -v perf >/dev/null || { echo "cold_perf.sh: needs perf (apt install linux-perf)" >&2; exit 2; }
out=$(mktemp -d /tmp/cold-perf.XXXXXX)
mkdir -p "$out/tmp"
# A session of its own, so that it and its DataLoader workers stop together; its caches go
# under $out/tmp, removed at the end.
TMPDIR="$out/tmp" setsid .venv/bin/python benches/cold_timeline.py --profile "$profile" --epochs 100000 \
    --quiet >"$out/timeline.log" 2>&1 &
training=$!
moto=""
stop() {  # the moto server runs in a session of its own too
    kill -KILL -- "-$training" 2>/dev/null || true
    wait "$training" 2>/dev/null || true
    [ -n "$moto" ] && kill "$moto" 2>/dev/null || true
    rm -rf "$out/tmp"
}
trap stop EXIT
sleep "$warmup"  # the data set uploaded and the first (untimed) epochs done
moto=$(pgrep -P "$training" -f s3server.py | head -n 1 || true)
perf record -q -a -F 2000 -o "$out/cpu.data" -- sleep "$seconds" 2>/dev/null
perf record -q -a -e tlb:tlb_flush -o "$out/tlb.data" -- sleep 3 2>/dev/null
stop
trap - EXIT
perf script -i "$out/cpu.data" -F comm,pid,tid 2>/dev/null >"$out/cpu.txt"
perf script -i "$out/tlb.data" -F comm,trace 2>/dev/null >"$out/tlb.txt"
.venv/bin/python - "$out" "$training" "${moto:-0}" "$profile" "$seconds" <<'EOF'
import collections
import re
import sys
from pathlib import Path

out, training, moto, profile, seconds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
by_role, by_thread = collections.Counter(), collections.Counter()
for line in (out / "cpu.txt").read_text().splitlines():
    m = re.match(r"\s*(.*?)\s+(\d+)/(\d+)\s*$", line)
    if not m:
        continue
    comm, pid = m.group(1), m.group(2)
    if pid == "0":
        role = "idle"
    elif pid == training:
        role = "training process"
    elif pid == moto:
        role = "moto"
    elif comm.startswith(("pt_data_worker", "shardstream")):
        role = "DataLoader workers"
    else:
        role = "other"
    by_role[role] += 1
    by_thread[(role, comm)] += 1
total = sum(by_role.values()) or 1
print(f"{profile}, cold DataLoader(2) batch path: CPU of the whole machine over {seconds} s "
      f"({total} samples at 2 kHz per CPU)")
for role, n in by_role.most_common():
    print(f"  {role:20} {100 * n / total:5.1f} %")
print("by thread name:")
for (role, comm), n in by_thread.most_common(12):
    print(f"  {role:20} {comm:18} {100 * n / total:5.1f} %")
tlb = collections.Counter()
for line in (out / "tlb.txt").read_text().splitlines():
    m = re.match(r"\s*(\S+)\s+.*reason:([^(]+)", line)
    if m:
        tlb[(m.group(1), m.group(2).strip())] += 1
print("TLB flushes in 3 s, by thread name and reason (`remote IPI send`: a shootdown this thread sent):")
for (comm, reason), n in tlb.most_common(8):
    print(f"  {comm:18} {reason:24} {n:7d}")
print(f"(raw data: {out}; the epochs' own timeline: {out}/timeline.log)")
EOF

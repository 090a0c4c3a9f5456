"""CI smoke run of the one benchmark command (benches/run.py --smoke) on tiny data, so it cannot rot.

It writes its report into a temporary folder (never docs/benchmarks.md) and checks that the report
has its tables, that every measured row passed its completeness check (every sample exactly once),
and that every system that did not run says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_smoke(tmp_path: Path) -> None:
    docs_report = REPO / "docs" / "benchmarks.md"
    before = docs_report.read_bytes() if docs_report.exists() else None
    out = tmp_path / "report"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(REPO / "benches" / "run.py"), "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    md = (out / "benchmarks.md").read_text()
    for heading in ("## Machine and versions", "## Not measured, and why", "## Goals set by the other issues",
                    "## Ceilings of this machine", "## Streaming", "### 100B samples", "### 10KB samples",
                    "### 1MB samples", "## Checkpoints", "## Reproduce"):
        assert heading in md, f"{heading!r} missing from the report"
    assert "| samples/s | MB/s | first sample s | peak MiB | amplif. | ÷ceiling | ÷best peer |" in md
    for png in ("throughput.png", "rss.png"):
        assert (out / "benchmarks" / png).stat().st_size > 1000

    results = json.loads((out / "benchmarks" / "results.json").read_text())
    rows, skips = results["rows"], results["skips"]
    bad = [(r["section"], r["system"], r["profile"], r["config"], r["check"]) for r in rows if r["check"] != "ok"]
    assert not bad, f"runs that failed their check: {bad}"
    streaming = [r for r in rows if r["section"] == "streaming"]
    # The peers exist in the test venv: each must have streamed every profile, completely.
    for peer in ("mosaicml-streaming", "litdata", "webdataset"):
        got = {r["profile"] for r in streaming if r["system"] == peer and r["runs"] >= 1}
        assert got == {"100B", "10KB", "1MB"}, f"{peer}: profiles measured {got}"
    # Every Python row carries a peak from its own memory epoch (torch alone is hundreds of MiB).
    python_rows = [r for r in streaming if "(CLI)" not in r["system"]]
    no_peak = [(r["system"], r["profile"], r["config"]) for r in python_rows
               if not r["peak_mem"] or r["peak_mem"]["median"] < 100 << 20]
    assert python_rows and not no_peak, f"rows without a memory epoch's peak: {no_peak}"
    # A partial checkpoint load (every other tensor) fetches what it asks for and no more, as
    # the server counts it, in one process and in ranks.
    partial = [r for r in rows if r["section"] == "checkpoint" and r["system"].startswith("shardstream")
               and r["config"].startswith("partial load")]
    assert len(partial) == 2 and all(r["amplification"] and r["amplification"]["median"] < 1.1 for r in partial), partial
    for s in skips:
        assert s["reason"].strip(), f"silent skip of {s['system']}"
        assert s["system"] in md and s["reason"][:40] in md

    # The report drawn again from results.json (`--render`): every table line as the run wrote
    # it, the run's own plots kept, and a line on top saying it was redrawn.
    pngs = {png: (out / "benchmarks" / png).read_bytes() for png in ("throughput.png", "rss.png")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benches" / "run.py"), "--render", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    redrawn = (out / "benchmarks.md").read_text()
    assert "Redrawn at " in redrawn and "Redrawn at " not in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert [line for line in redrawn.splitlines() if line.startswith("| ")] == table
    assert all((out / "benchmarks" / png).read_bytes() == data for png, data in pngs.items())

    # The smoke run never writes the committed report.
    after = docs_report.read_bytes() if docs_report.exists() else None
    assert before == after
    print(f"smoke run: {elapsed:.0f} s, {len(rows)} rows, {len(skips)} skipped")

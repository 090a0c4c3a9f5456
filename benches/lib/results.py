"""What every runner hands back: measured rows and stated skips (never a silent one)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from measure import stats


@dataclass
class Row:
    section: str  # "streaming", "ceiling", "fuse", "checkpoint"
    system: str
    profile: str  # "100B" / "10KB" / "1MB" / "ckpt 256MiB"
    config: str  # e.g. "cold · DataLoader 2 workers · shuffled"
    kind: str  # "shardstream", "peer" or "ceiling"
    samples_per_s: dict | None = None
    mb_per_s: dict | None = None
    ttfs_s: dict | None = None
    peak_mem: dict | None = None  # bytes, PSS of the process tree
    amplification: dict | None = None  # bytes the server sent / payload bytes
    check: str = "ok"
    runs: int = 0
    notes: str = ""
    temperature: str = ""  # "cold" / "warm" where it applies
    mem_series: list = field(default_factory=list)  # [(seconds since start, bytes)] of one run
    engine_samples_per_s: dict | None = None  # the CLI's own figure: stream time only (no process start / open)

    def to_dict(self) -> dict:
        d = asdict(self)
        series = d["mem_series"]
        if len(series) > 40:  # keep results.json small: 40 points are enough to redraw the curve
            step = len(series) / 40
            d["mem_series"] = [series[int(i * step)] for i in range(40)] + [series[-1]]
        return d


@dataclass
class Skip:
    section: str
    system: str
    reason: str


def aggregate(section, system, profile, config, kind, runs: list[dict], temperature="", notes="") -> Row:
    """Rows from per-run dicts with keys samples, bytes, epoch_s, ttfs_s, peak_mem, amp, check."""
    good = [r for r in runs if r.get("epoch_s")]
    checks = sorted({r["check"] for r in runs if r.get("check") != "ok"})
    return Row(
        section=section, system=system, profile=profile, config=config, kind=kind,
        samples_per_s=stats([r["samples"] / r["epoch_s"] for r in good if r.get("samples") is not None]),
        mb_per_s=stats([r["bytes"] / r["epoch_s"] / 1e6 for r in good if r.get("bytes") is not None]),
        ttfs_s=stats([r.get("ttfs_s") for r in good]),
        peak_mem=stats([r.get("peak_mem") for r in good]),
        amplification=stats([r.get("amp") for r in good]),
        check="ok" if not checks and good else ("; ".join(checks) or "no completed run"),
        runs=len(good), notes=notes, temperature=temperature,
        mem_series=next((r["mem_series"] for r in good if r.get("mem_series")), []),
        engine_samples_per_s=stats([r.get("engine_sps") for r in good]),
    )

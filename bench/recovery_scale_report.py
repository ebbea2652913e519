"""bench/recovery_scale.py's table lines and its SVG curve (recovery against world size)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench import plots
from bench.harness import pct

PHASES = ("detect", "replace", "reform", "restore", "DDP", "first step", "other")
TARGET_S = 3.0
"""Issue 26: recovery p50 <= 3 s up to 64 ranks."""


@dataclass
class Loss:
    world_size: int
    recovery: float
    lost: int
    phases: dict[str, float] = field(default_factory=dict)


def row_line(size: int, how: str, who: str, losses: list[Loss], step_s: float) -> str:
    recs = [x.recovery for x in losses]
    phases = "".join(
        f"{statistics.median(x.phases[p] for x in losses):>11.2f}s" if losses else f"{'-':>12}"
        for p in PHASES
    )
    return (
        f"{size:>5} {how:<8} {'rank 0' if who == 'zero' else 'rank>0':<7}{len(losses):>3}"
        f"{pct(recs, 0.5):>7.2f}s{pct(recs, 0.95):>7.2f}s{sum(x.lost for x in losses):>5}"
        f"{step_s:>7.3f}s{phases}"
    )


def each_line(losses: list[Loss]) -> str:
    """Every loss of a row in order, with its largest phase: where a p95 comes from."""
    parts = []
    for x in losses:
        top = max(PHASES, key=lambda p: x.phases[p])
        parts.append(f"{x.recovery:.2f}s ({top} {x.phases[top]:.2f}s)")
    return "      each: " + ", ".join(parts)


def write_curve(out: Path, curve: dict[tuple[str, int], list[float]]) -> Path:
    colors = {"replace": "steelblue", "shrink": "seagreen"}
    series = []
    for how in ("replace", "shrink"):
        sizes = sorted(s for h, s in curve if h == how)
        if not sizes:
            continue
        for q, dashed in ((0.5, False), (0.95, True)):
            pts = [(float(s), pct(curve[(how, s)], q)) for s in sizes]
            name = f"{how} p{round(q * 100)}"
            series.append(plots.Series(name, pts, colors[how], dashed=dashed, markers=True))
    ticks = sorted({s for _, s in curve})
    svg = plots.chart(
        "recovery after a SIGKILLed rank vs world size (local gloo ranks, log x)",
        series,
        hline=(TARGET_S, f"target p50 {TARGET_S:g} s"),
        log_x=True,
        x_ticks=ticks,
        x_unit=" ranks",
        y_unit=" s",
    )
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recovery_scale.svg"
    path.write_text(svg)
    return path

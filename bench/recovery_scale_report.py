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
    """One SIGKILL and what followed it."""

    world_size: int
    recovery: float | None
    """The kill -> the end of the next generation's first step (no step subtracted); None:
    no later generation ever stepped (the run failed, or ended first)."""
    lost: int
    phases: dict[str, float] = field(default_factory=dict)
    generations: int = 1
    """Generations from the one killed to the one that stepped: more than 1 means a
    re-formation failed on the way."""
    from_memory: bool = True
    """The generation that stepped resumed from the survivors' memory (else from storage)."""

    @property
    def failed(self) -> bool:
        """A failed re-formation: never recovered, or only after another re-formation, or
        only from storage (the in-place path did not hold)."""
        return self.recovery is None or self.generations > 1 or not self.from_memory


def _recovered(losses: list[Loss]) -> list[float]:
    return [x.recovery for x in losses if x.recovery is not None]


def row_line(size: int, how: str, who: str, losses: list[Loss], step_s: float) -> str:
    """A row: the losses, the failed re-formations among them (``n/failed``), the recovery
    percentiles over the recovered ones, steps redone, the median step and phases."""
    recs = _recovered(losses)
    timed = [x for x in losses if x.recovery is not None]
    phases = "".join(
        f"{statistics.median(x.phases[p] for x in timed):>11.2f}s" if timed else f"{'-':>12}"
        for p in PHASES
    )
    failed = sum(x.failed for x in losses)
    return (
        f"{size:>5} {how:<8} {'rank 0' if who == 'zero' else 'rank>0':<7}"
        f"{f'{len(losses)}/{failed}':>6}"
        f"{pct(recs, 0.5):>7.2f}s{pct(recs, 0.95):>7.2f}s{sum(x.lost for x in losses):>5}"
        f"{step_s:>7.3f}s{phases}"
    )


def each_line(losses: list[Loss]) -> str:
    """Every loss of a row in order, with its largest phase (where a p95 comes from), and
    each failed re-formation said as such."""
    parts = []
    for x in losses:
        if x.recovery is None:
            parts.append("NOT RECOVERED")
            continue
        top = max(PHASES, key=lambda p: x.phases[p])
        part = f"{x.recovery:.2f}s ({top} {x.phases[top]:.2f}s)"
        if x.failed:
            how = "from storage" if not x.from_memory else f"{x.generations} re-formations"
            part += f" FAILED RE-FORMATION ({how})"
        parts.append(part)
    return "      each: " + ", ".join(parts)


def write_curve(out: Path, curve: dict[tuple[str, int], list[float]]) -> Path:
    colors = {"replace": "steelblue", "shrink": "seagreen"}
    series = []
    for how in ("replace", "shrink"):
        sizes = sorted(s for h, s in curve if h == how and curve[(h, s)])
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

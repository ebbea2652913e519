"""bench/recovery_scale.py's table lines and its SVG curve (recovery against world size)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

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


class Marks(Protocol):
    """The driver's timestamps of a run (``recovery_scale.Probe``)."""

    def after(self, name: str, t: float, before: float = float("inf")) -> float | None: ...


def analyse(out: Path, probe: Marks, n_kills: int) -> tuple[list[Loss], float]:
    """The losses of one run (its rank 0 log, its kill files, the driver's marks) and its
    median step. A kill that no later generation stepped after is listed, not dropped."""
    rows = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["ev"] == "step"]
    firsts = {min(r["step"] for r in steps if r["gen"] == g) for g in {r["gen"] for r in steps}}
    normal = [r["t1"] - r["t0"] for r in steps if r["step"] not in firsts and r["step"] > 2]
    step_s = statistics.median(normal) if normal else float("nan")
    losses = []
    for i in range(n_kills):
        path = out / f"kill-{i}"
        if not path.exists():
            continue  # the run ended (or failed) before this kill was armed
        kill = json.loads(path.read_text())
        tk, gen = kill["t"], kill["gen"]
        after = [r for r in steps if r["gen"] > gen and r["t1"] > tk]
        before = [r for r in steps if r["gen"] == gen]
        if not after:
            losses.append(Loss(kill["ws"], None, 0, {}))
            continue
        first = after[0]
        g = first["gen"]
        ev = {r["ev"]: r for r in rows if r["gen"] == g and r["ev"] != "step"}
        recovery = first["t1"] - tk
        detected = probe.after("detected", tk, ev["enter"]["t"]) or tk
        heal0 = probe.after("heal0", detected, ev["enter"]["t"])
        heal1 = probe.after("heal1", detected, ev["enter"]["t"])
        reform0 = probe.after("reform0", detected, ev["enter"]["t"]) or detected
        reform1 = probe.after("reform1", detected, ev["enter"]["t"]) or reform0
        phases = {
            "detect": detected - tk,
            "replace": (heal1 - heal0) if heal0 and heal1 else 0.0,
            "reform": reform1 - reform0,
            "restore": ev["restored"]["t"] - reform1,
            "DDP": ev["model"]["t"] - ev["restored"]["t"],
            "first step": first["t1"] - ev["model"]["t"],
        }
        phases["other"] = recovery - sum(phases.values())
        lost = max(0, before[-1]["step"] - (first["step"] - 1)) if before else 0
        from_memory = bool(ev["restored"].get("memory"))
        losses.append(Loss(kill["ws"], recovery, lost, phases, g - gen, from_memory))
    return losses, step_s


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

"""Where a goodput row's time went, measured against its own quiet steps. Pure.

A row's goodput divides its samples by its baselines' rate, and this machine's speed drifts
between the baselines of one part by up to 27 % (bench/results/2026-12-06f). So the row is
also read against itself: the median step of its full-size stretches in which no pod of the
job was starting (created, not yet Ready) or leaving (deleted, its container still running)
is the yardstick, and the window's time is split into

* **between generations**: from a generation's last step to the next one's first (the
  re-formation, and the new generation's first step);
* **smaller world**: steps taken below the full size;
* **disturbed**: full-size steps while a pod started or left, and what they took beyond the
  yardstick (on this machine the real nodes share two CPUs, so a replacement importing torch
  on one node slows the members on the others, which a fleet's nodes, each with its own
  CPUs, would not);
* **quiet**: the yardstick's own steps.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Budget:
    window_s: float
    quiet_step_s: float
    quiet_s: float
    quiet_steps: int
    disturbed_s: float
    disturbed_steps: int
    smaller_s: float
    between_s: float
    reformations: int

    @property
    def disturbed_excess_s(self) -> float:
        """What the disturbed steps took beyond the yardstick."""
        return self.disturbed_s - self.disturbed_steps * self.quiet_step_s


LEAVING_FOR_S = 35.0
"""A deleted pod whose container still reads running this long after its deletion is on a
node that stopped reporting (the grace period is 30 s): it costs no CPU here."""


def _busy(
    pods: Mapping[str, Mapping[str, Any]],
    was_ready: set[str],
    deleted: Mapping[str, float],
    t: float,
) -> bool:
    """A pod of the job is starting (its containers created, never Ready yet: a pod no node
    took yet costs no CPU, nor does a member whose node stopped reporting, which reads
    unready) or leaving (deleted less than ``LEAVING_FOR_S`` ago, a container running)."""
    for uid, p in pods.items():
        containers = p.get("containers") or ()
        if uid in deleted:
            running = p.get("phase") == "Running" and "running" in containers
            if running and t - deleted[uid] <= LEAVING_FOR_S:
                return True
        elif containers and p.get("phase") in ("Pending", "Running") and uid not in was_ready:
            return True
    return False


def _busy_marks(trace: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[bool]]:
    """When the job had a pod starting or leaving: each trace line's time, and whether; a
    line every second (the ``cpu`` record, or none) lets a leaver's time run out."""
    pods: dict[str, Mapping[str, Any]] = {}
    was_ready: set[str] = set()
    deleted: dict[str, float] = {}
    times: list[float] = []
    busy: list[bool] = []
    for e in sorted(trace, key=lambda e: e["t"]):
        if e["what"] == "pod":
            uid = e["uid"]
            pods[uid] = e
            if e.get("ready"):
                was_ready.add(uid)
            if e.get("deleting"):
                deleted.setdefault(uid, e["t"])
        elif e["what"] == "pod-gone":
            pods.pop(e["uid"], None)
        times.append(e["t"])
        busy.append(_busy(pods, was_ready, deleted, e["t"]))
    return times, busy


def budget(
    events: Iterable[Mapping[str, Any]],
    trace: Iterable[Mapping[str, Any]],
    window: tuple[float, float],
    workers: int,
) -> Budget | None:
    """The row's time split as the module docstring says (rank 0's steps within ``window``);
    None without a quiet full-size step to measure against."""
    t0, t1 = window
    times, busy = _busy_marks(trace)

    def busy_at(t: float) -> bool:
        i = bisect.bisect_right(times, t) - 1
        return busy[i] if i >= 0 else False

    steps = sorted(
        (float(e["t"]), e["gen"], int(e["world"]))
        for e in events
        if e.get("ev") == "step" and e.get("rank", 0) == 0 and t0 <= float(e["t"]) <= t1
    )
    quiet: list[float] = []
    disturbed: list[float] = []
    smaller = between = 0.0
    reformations = 0
    for (a, gen_a, world), (b, gen_b, _) in itertools.pairwise(steps):
        if gen_a != gen_b:
            between += b - a
            reformations += 1
        elif world < workers:
            smaller += b - a
        elif busy_at(a) or busy_at(b):
            disturbed.append(b - a)
        else:
            quiet.append(b - a)
    if not quiet:
        return None
    return Budget(
        window_s=t1 - t0,
        quiet_step_s=statistics.median(quiet),
        quiet_s=sum(quiet),
        quiet_steps=len(quiet),
        disturbed_s=sum(disturbed),
        disturbed_steps=len(disturbed),
        smaller_s=smaller,
        between_s=between,
        reformations=reformations,
    )


def full_step_samples(events: Iterable[Mapping[str, Any]], workers: int) -> int | None:
    """The samples one full-size step trains: rank 0's per-worker step (two steps in a row of
    one generation) times ``workers``; None without such a pair."""
    steps = sorted(
        (e for e in events if e.get("ev") == "step" and e.get("rank", 0) == 0),
        key=lambda e: float(e["t"]),
    )
    per_worker = [
        (int(b["samples"]) - int(a["samples"])) // int(a["world"])
        for a, b in itertools.pairwise(steps)
        if a["gen"] == b["gen"] and int(b["step"]) == int(a["step"]) + 1
    ]
    return int(statistics.median(per_worker)) * workers if per_worker else None


def against_quiet(b: Budget, samples: int, step_samples: int) -> float:
    """The row's goodput against its own yardstick: the samples it kept, over what quiet
    full-size steps of ``step_samples`` each would have trained in its window. Free of the
    machine's drift between the row and its baselines, which the bench's own figure is not."""
    return samples / (b.window_s / b.quiet_step_s * step_samples)


def budget_line(b: Budget) -> str:
    w = b.window_s or 1.0
    return (
        f"the row's {b.window_s:.0f}s against its own quiet full-size step ({b.quiet_step_s:.2f}s): "
        f"between generations {b.between_s:.0f}s ({b.between_s / w:.1%}, {b.reformations} "
        f"re-formations, each with its first step), smaller world {b.smaller_s:.0f}s "
        f"({b.smaller_s / w:.1%}), full size with a pod starting or leaving "
        f"{b.disturbed_s:.0f}s ({b.disturbed_steps} steps, {b.disturbed_excess_s:.0f}s = "
        f"{b.disturbed_excess_s / w:.1%} beyond the quiet step), quiet {b.quiet_s:.0f}s "
        f"({b.quiet_steps} steps)"
    )


__all__ = ["Budget", "against_quiet", "budget", "budget_line", "full_step_samples"]

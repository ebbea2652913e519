"""The accounting of bench/goodput.py, as pure functions (unit-tested in
tests/unit/test_goodput_accounting.py; issue 26, item 1).

- ``committed_samples``: what a row committed is read from storage (the manifests' ``samples``
  metric of the latest committed checkpoint), so the final checkpoint counts (a stopped job's
  last ``report()`` may raise before the worker writes its ``commit`` event) and a report
  whose asynchronous commit never finished does not; ``commit`` events only without storage.
- ``ideal_rates``: each system (torchjob, Kubeflow) is divided by the rate of its own baseline
  row (mode ``none``) of the same run, never by another system's.
- ``per_pod_paid``: goodput times workers / (workers + standbys): a standby is paid for.
- ``pick_victim``: a preemption hits any running pod of the job, standbys included, each with
  the same probability (a spot reclaim does not know which pod trains).
- ``spread``: median, min and max over the repeats of a row.
- ``timeline`` / ``timeline_svg``: steps/s over time with the evictions marked (bench/plots.py,
  no plotting dependency).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

BASELINE_MODE = "none"
KUBEFLOW = "Kubeflow"


def system_of(policy: str, strategy: str = "ddp") -> str:
    """The system a row measures: Kubeflow's PyTorchJob, or torchjob (every other policy);
    a workload other than DDP (``fsdp``) is a system of its own, with its own baseline."""
    system = KUBEFLOW if policy == KUBEFLOW else "torchjob"
    return system if strategy == "ddp" else f"{system}/{strategy}"


def committed_samples(
    events: Iterable[Mapping[str, Any]], storage_metrics: Iterable[Mapping[str, Any]] = ()
) -> int:
    """The samples of the latest committed checkpoint. Storage decides when it lists any
    committed checkpoint (it includes the final one, whose ``commit`` event a stopped job may
    never write, and it excludes a report whose background commit never finished: torchjob
    commits asynchronously, so a ``commit`` event after ``report()`` only says "staged").
    The ``commit`` events count only where storage lists nothing (Kubeflow's torchrun worker
    writes its own ``state.pt``, and emits ``commit`` after its atomic rename)."""
    from_storage = [int(m["samples"]) for m in storage_metrics if "samples" in m]
    if from_storage:
        return max(from_storage)
    return max((int(e["samples"]) for e in events if e.get("ev") == "commit"), default=0)


@dataclass(frozen=True)
class RowFigures:
    policy: str
    mode: str
    committed: int
    wall: float
    workers: int
    standbys: int = 0
    strategy: str = "ddp"

    @property
    def system(self) -> str:
        return system_of(self.policy, self.strategy)

    @property
    def pods(self) -> int:
        return self.workers + self.standbys


def rate(committed: int, wall: float) -> float:
    if wall <= 0:
        raise ValueError(f"wall time must be positive, got {wall}")
    return committed / wall


def ideal_rates(rows: Iterable[RowFigures]) -> dict[str, float]:
    """Samples/s of each system's baseline row (mode ``none``); the median when repeated."""
    by_system: dict[str, list[float]] = {}
    for r in rows:
        if r.mode == BASELINE_MODE and r.wall > 0:
            by_system.setdefault(r.system, []).append(rate(r.committed, r.wall))
    return {s: statistics.median(v) for s, v in by_system.items()}


def goodput(row: RowFigures, ideal: Mapping[str, float]) -> float:
    """Committed samples over what the row's own system's baseline would have committed in the
    same wall time; NaN when that system has no baseline row."""
    base = ideal.get(row.system)
    if not base or row.wall <= 0:
        return float("nan")
    return row.committed / (base * row.wall)


def per_pod_paid(value: float, workers: int, standbys: int) -> float:
    """``value`` per pod paid for: the baseline pays ``workers`` pods, this row
    ``workers + standbys``."""
    if workers < 1 or standbys < 0:
        raise ValueError(f"workers must be >= 1 and standbys >= 0, got {workers}, {standbys}")
    return value * workers / (workers + standbys)


def pick_victim(pods: Sequence[T], rng: random.Random, name: Any = None) -> T:
    """One of the job's running pods (workers and standbys alike), uniformly: every pod is hit at
    the same rate. ``name`` (a key function) orders them so that a seed gives the same draw."""
    if not pods:
        raise ValueError("no running pod to preempt")
    ordered = sorted(pods, key=name) if name is not None else list(pods)
    return rng.choice(ordered)


def spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(median, min, max) of the finite values; NaNs when there are none."""
    xs = [v for v in values if v == v]
    if not xs:
        nan = float("nan")
        return nan, nan, nan
    return statistics.median(xs), min(xs), max(xs)


def format_spread(values: Iterable[float]) -> str:
    med, lo, hi = spread(values)
    if med != med:
        return "-"
    return f"{med:.3f} [{lo:.3f}-{hi:.3f}]"


def timeline(
    step_times: Iterable[float],
    t0: float,
    t_end: float,
    bucket: float = 5.0,
    weights: Iterable[float] | None = None,
) -> list[tuple[float, float]]:
    """Steps/s in buckets of ``bucket`` seconds from ``t0`` to ``t_end``: (bucket start - t0,
    rate) per bucket, empty buckets included (a recovery shows as a dip to 0). With
    ``weights`` (one per step: its samples, world size x batch) the rate is samples/s, so a
    job that goes on smaller shows as a lower line, not only a gap."""
    if bucket <= 0 or t_end <= t0:
        return []
    n = int((t_end - t0) // bucket) + (1 if (t_end - t0) % bucket else 0)
    counts = [0.0] * n
    times = list(step_times)
    ws = [1.0] * len(times) if weights is None else list(weights)
    if len(ws) != len(times):
        raise ValueError(f"{len(ws)} weights for {len(times)} steps")
    for t, w in zip(times, ws, strict=True):
        i = int((t - t0) // bucket)
        if 0 <= i < n:
            counts[i] += w
    return [(i * bucket, c / bucket) for i, c in enumerate(counts)]


def timeline_svg(
    title: str,
    points: Sequence[tuple[float, float]],
    evictions: Sequence[float],
    width: int = 640,
    height: int = 240,
    unit: str = "/s",
) -> str:
    """An SVG line of steps/s over time with a red vertical line at each eviction (seconds
    from the row's first step); drawn by bench/plots.py."""
    import plots

    line = plots.Series(unit.lstrip("/") or "rate", points)
    return plots.chart(
        title, [line], vlines=evictions, x_unit=" s", y_unit=unit, width=width, height=height
    )

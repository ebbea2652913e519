"""The accounting of bench/goodput.py, as pure functions (unit-tested in
tests/unit/test_goodput_accounting.py; issue 26, item 1).

- ``window_samples``: what a row trained in its window (its first step to its end), from
  rank 0's step events: the lineage's ``samples`` at the window's end less those at its start,
  less what the job threw away after it (a restore from fewer samples). The numerator of
  goodput, for the baselines and the rows alike: it stops at the window's end, where the wall
  time stops (an elastic pod drains, training on, for ~20 s after the bench deletes the job,
  and the final checkpoint holds that drain, or nothing when it fails to commit).
- ``committed_samples``: what storage holds after the row (the manifests' ``samples`` metric
  of the latest committed checkpoint; ``commit`` events only without storage): a check that
  the row's work was saved, not its goodput.
- ``ideal_rates``: each system (torchjob, Kubeflow) is divided by the rate of its own baseline
  row (mode ``none``) of the same run, never by another system's.
- ``per_pod_paid``: goodput times workers / (workers + standbys): a standby is paid for.
- ``pod_seconds`` / ``per_pod_second``: the pods actually paid for, measured from the row's
  trace (a pod taken away during its grace period and its replacement created ahead are both
  paid while they overlap), and goodput per pod-second paid.
- ``pick_victim``: a preemption hits any running pod of the job, standbys included, each with
  the same probability (a spot reclaim does not know which pod trains).
- ``spread``: median, min and max over the repeats of a row.
- ``timeline`` / ``timeline_svg``: steps/s over time with the evictions marked (bench/plots.py,
  no plotting dependency).
"""

from __future__ import annotations

import bisect
import itertools
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


def samples_at(events: Iterable[Mapping[str, Any]], t: float) -> int:
    """The lineage's samples at ``t``: those of rank 0's last step at or before ``t`` (0 before
    any). ``samples`` is kept in the state across generations, so steps redone after a
    rollback are counted once and a smaller world's steps count for what they trained."""
    steps = [e for e in events if e.get("ev") == "step" and float(e["t"]) <= t]
    return int(max(steps, key=lambda e: float(e["t"]))["samples"]) if steps else 0


def window_samples(
    events: Iterable[Mapping[str, Any]], t0: float, t1: float, saved: int | None = None
) -> int:
    """The samples a row trained and kept in its window [``t0``, ``t1``] (bench/goodput.py:
    its first step to its end, the wall time of its goodput): ``samples_at(t1)`` less
    ``samples_at(t0)`` (the first step trained before the window), capped by any restore after
    ``t1`` (a generation resumed from fewer samples threw the rest away).

    Not storage's count after the row: the bench deletes the job at ``t1``, and what comes
    after is no part of the row. An elastic pod given notice trains on for its drain (~20 s,
    ``TORCHJOB_DRAIN_S``) before it stops and commits, so the final checkpoint holds work
    done after ``t1``; and where that stop's commit fails, storage holds only an earlier
    checkpoint (a grow's). Either would move the row by the drain's share of it (2026-11-26l:
    +0.06 and -0.07 on 2-pod rows of ~340 s).

    ``saved``: the lineage's samples in storage after the row (``committed_samples``). Work
    trained in the window but never saved (the stop's final commit failed) then counts as
    lost: the conservative reading, which bench/goodput.py takes for every row but the
    baselines (for a baseline the larger count is the conservative one)."""
    events = list(events)
    end = samples_at(events, t1)
    after = [int(e["samples"]) for e in events if e.get("ev") == "restored" and float(e["t"]) > t1]
    caps = [end, *after, *([saved] if saved is not None else [])]
    return max(0, min(caps) - samples_at(events, t0))


def committed_samples(
    events: Iterable[Mapping[str, Any]], storage_metrics: Iterable[Mapping[str, Any]] = ()
) -> int:
    """The samples of the latest committed checkpoint: what storage holds after the row (a
    check that the row's work was saved; goodput counts ``window_samples``). Storage decides
    when it lists any committed checkpoint (it includes the final one, whose ``commit`` event
    a stopped job may never write, and it excludes a report whose background commit never
    finished: torchjob commits asynchronously, so a ``commit`` event after ``report()`` only
    says "staged"). The ``commit`` events count only where storage lists nothing (Kubeflow's
    torchrun worker writes its own ``state.pt``, and emits ``commit`` after its atomic
    rename)."""
    from_storage = [int(m["samples"]) for m in storage_metrics if "samples" in m]
    if from_storage:
        return max(from_storage)
    return max((int(e["samples"]) for e in events if e.get("ev") == "commit"), default=0)


@dataclass(frozen=True)
class RowFigures:
    policy: str
    mode: str
    samples: int
    """What the row trained in its window (``window_samples``)."""
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


def rate(samples: int, wall: float) -> float:
    if wall <= 0:
        raise ValueError(f"wall time must be positive, got {wall}")
    return samples / wall


def step_rate(events: Iterable[Mapping[str, Any]], t0: float, t1: float) -> float | None:
    """Samples/s from rank 0's first step in [``t0``, ``t1``] to its last: a baseline's rate at
    the resolution of its step times (None with fewer than two steps). ``window_samples`` /
    (``t1`` - ``t0``) counts whole steps, so one step more or fewer in a 150 s baseline (~90
    steps) moves it by ~1.1 %, about the restore point's overhead it is compared to; ending at
    the last step instead of at ``t1`` leaves out the part-step that rounding drops."""
    steps = sorted(
        (float(e["t"]), int(e["samples"]))
        for e in events
        if e.get("ev") == "step" and t0 <= float(e["t"]) <= t1
    )
    if len(steps) < 2 or steps[-1][0] <= steps[0][0]:
        return None
    return (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0])


def ideal_rates(rows: Iterable[RowFigures]) -> dict[str, float]:
    """Samples/s of each system's baseline row (mode ``none``); the median when repeated."""
    by_system: dict[str, list[float]] = {}
    for r in rows:
        if r.mode == BASELINE_MODE and r.wall > 0:
            by_system.setdefault(r.system, []).append(rate(r.samples, r.wall))
    return {s: statistics.median(v) for s, v in by_system.items()}


def bracket_line(system: str, samples_per_s: list[float]) -> str:
    """Each baseline of a system in the order it ran, and how far the last is from the
    first: rows between two baselines are divided by their median, and the drift says how
    much the machine's speed moved under them."""
    if len(samples_per_s) < 2:
        return f"  {system}: one baseline (not bracketed): the machine's drift is not known"
    drift = samples_per_s[-1] / samples_per_s[0] - 1 if samples_per_s[0] else float("nan")
    each = ", ".join(f"{r:.1f}" for r in samples_per_s)
    return f"  {system}: baselines in the order run {each} samples/s; last vs first {drift:+.1%}"


def overhead_line(with_rp: list[float], without: list[float]) -> str:
    """The restore point's overhead, 1 - rate(with) / rate(without), from torchjob's
    baselines (with restore points) and the same job's without, each list in the order run.
    A part runs them A B ... B A (with, without, the rows, without, with): each pair's figure
    moves with the machine's drift, and their means cancel a drift that is linear over the
    part, so the line gives both."""
    if not with_rp or not without:
        return "restore point's overhead: not measured (a baseline made no step)"
    a, b = statistics.mean(with_rp), statistics.mean(without)
    line = f"restore point's overhead: 1 - {a:.1f} / {b:.1f} samples/s = {1 - a / b:+.3f}"
    if len(with_rp) < 2 or len(without) < 2:
        return line + " (one baseline without restore points: not bracketed, the drift is in it)"
    pairs = [(with_rp[0], without[0]), (with_rp[-1], without[-1])]
    each = ", ".join(f"{1 - w / o:+.3f}" for w, o in pairs)
    return line + (
        f" (the means of {len(with_rp)} and {len(without)} bracketed baselines; the pair "
        f"before the rows and the pair after them alone: {each})"
    )


def goodput(row: RowFigures, ideal: Mapping[str, float]) -> float:
    """The samples the row trained in its window over what the row's own system's baseline
    trains in the same wall time; NaN when that system has no baseline row."""
    base = ideal.get(row.system)
    if not base or row.wall <= 0:
        return float("nan")
    return row.samples / (base * row.wall)


def per_pod_paid(value: float, workers: int, standbys: int) -> float:
    """``value`` per pod paid for: the baseline pays ``workers`` pods, this row
    ``workers + standbys``."""
    if workers < 1 or standbys < 0:
        raise ValueError(f"workers must be >= 1 and standbys >= 0, got {workers}, {standbys}")
    return value * workers / (workers + standbys)


ENDED_PHASES = ("Succeeded", "Failed")


def pod_seconds(trace: Iterable[Mapping[str, Any]], t0: float, t1: float) -> float:
    """Pod-seconds paid for in [t0, t1], from a row's trace (bench/goodput.py's ``PodWatch``:
    a ``pod`` line each time a pod's summary changes, a ``pod-gone`` line when the watch says
    DELETED; other lines are ignored). Every pod of a trace is the job's: each row runs in a
    namespace of its own. Pods are told apart by UID (a replacement takes its predecessor's
    name).

    A pod is paid from its first line on a node: phase ``Running``, or ``Pending`` with
    container statuses (the kubelet has it and is starting its containers). A pod that never
    gets that far (``Pending``, unscheduled) costs nothing. It stays paid until it is gone
    (``pod-gone``) or its phase ends (``Succeeded``/``Failed``: every container terminated),
    else until ``t1``: a pod being deleted keeps its share of the node through its grace period,
    and a replacement created before its predecessor is gone is paid from its start, so the two
    overlap. Traces written before ``pod-gone`` lines existed still work: a pod then stays paid
    until its phase ends or ``t1`` (a pod deleted while ``Running`` is overcharged)."""
    start: dict[str, float] = {}
    end: dict[str, float] = {}
    for e in sorted(trace, key=lambda e: float(e["t"])):
        uid = e.get("uid")
        if uid is None or uid in end:
            continue
        if e["what"] == "pod-gone" or (e["what"] == "pod" and e["phase"] in ENDED_PHASES):
            end[uid] = float(e["t"])
        elif e["what"] == "pod" and (e["phase"] == "Running" or e["containers"]):
            start.setdefault(uid, float(e["t"]))
    return sum(max(0.0, min(end.get(u, t1), t1) - max(s, t0)) for u, s in start.items())


def per_pod_second(value: float, workers: int, wall: float, paid: float) -> float:
    """``value`` per pod-second paid: the baseline pays ``workers`` pods for the ``wall`` time,
    this row ``paid`` pod-seconds (``pod_seconds`` over the same window); NaN without any."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if wall <= 0 or paid <= 0:
        return float("nan")
    return value * workers * wall / paid


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
    from bench import plots

    line = plots.Series(unit.lstrip("/") or "rate", points)
    return plots.chart(
        title, [line], vlines=evictions, x_unit=" s", y_unit=unit, width=width, height=height
    )


def steps_redone(steps: Iterable[int]) -> int:
    """How many of rank 0's completed steps were done again: each step number seen more than
    once (a generation resumed from before its predecessor's last step). Counted from the
    steps themselves, not per loss: a restore in a generation that no loss's recovery names
    (a storm's second notice, the job's own restart) is counted too."""
    numbers = list(steps)
    return len(numbers) - len(set(numbers))


def longest_pause(step_times: Iterable[float], t_from: float, t_to: float) -> float:
    """The longest stretch without a step between the last step at or before ``t_from`` (a
    preemption) and ``t_to`` (the new membership's first step): what the preemption stopped
    training for. A pod that trains on through its grace period while its replacement starts
    stops the job only for the re-formation at the end, so its recovery (``t_to - t_from``)
    can be long while its pause is short."""
    ts = sorted(t for t in step_times if t <= t_to)
    before = [t for t in ts if t <= t_from]
    start = before[-1] if before else t_from
    marks = [start, *(t for t in ts if t > start), t_to]
    return max(b - a for a, b in itertools.pairwise(marks))


@dataclass(frozen=True)
class PreemptionCost:
    """What one preemption cost, from rank 0's steps: from the preemption until the first
    step of the next membership at the size the job had before it (``until``)."""

    at: float
    until: float
    delivered: float
    """Samples trained in that stretch over what the ideal rate trains in it."""
    pause: float
    """The longest stretch without a step in it (``longest_pause``)."""

    @property
    def lost_s(self) -> float:
        """Seconds of ideal training the preemption cost."""
        return (self.until - self.at) * (1.0 - self.delivered)


def preemption_costs(
    steps: Sequence[Mapping[str, Any]], preempted_at: Iterable[float], ideal_rate: float
) -> list[PreemptionCost]:
    """Each preemption's cost (``PreemptionCost``), from rank 0's step events (``t``,
    ``world``, ``samples``, in time order). A preemption the job never got back to its size
    from is costed to the last step. Samples count across generations (they are kept in the
    checkpoint), so a smaller or slower stretch shows as ``delivered < 1``."""
    if ideal_rate <= 0:
        raise ValueError(f"ideal_rate must be > 0, got {ideal_rate}")
    ts = [float(s["t"]) for s in steps]
    out = []
    for at in sorted(preempted_at):
        i = bisect.bisect_right(ts, at) - 1
        if i < 0 or i + 1 >= len(ts):
            continue
        size = steps[i]["world"]
        back = next(
            (j for j in range(i + 1, len(ts)) if steps[j]["world"] >= size and _new(steps, i, j)),
            len(ts) - 1,
        )
        span = ts[back] - at
        done = steps[back]["samples"] - steps[i]["samples"]
        delivered = done / (ideal_rate * span) if span > 0 else 1.0
        pause = longest_pause(ts[: back + 1], at, ts[back])
        out.append(PreemptionCost(at=at, until=ts[back], delivered=delivered, pause=pause))
    return out


def _new(steps: Sequence[Mapping[str, Any]], i: int, j: int) -> bool:
    """Step ``j`` is of a later membership than step ``i`` (its generation moved on)."""
    return bool(steps[j].get("gen", 0) > steps[i].get("gen", 0))

"""When a goodput row's losses come, and which recovery each one had, as pure functions
(unit-tested in tests/unit/test_goodput_schedule.py; issue 39).

- ``poisson_times``: a fleet's losses are a Poisson process: the row draws them all before it
  starts, from its seeded random source (cumulative exponential gaps of mean ``mtbf``), and
  takes each one at its time whatever the job is doing, a recovery in progress included.
- ``gen_at``: the generation rank 0 was stepping in at an instant.
- ``attribute``: after the row, each loss's recovery from the workers' events: the first
  rank-0 step of a generation above the one running at the loss (overlapping losses: a loss
  during the previous one's recovery resolves to the first generation that formed after the
  step it interrupted, which may be the same step as the previous loss's).
- ``realised_rate``: losses per second of the row's window, beside the stated 1/mtbf.
- ``mean_interval``: a mode's stated mean (issue 39: a pod SIGKILL every 60 s, a node vanish
  or notice every 120 s, in one run).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SCHEDULES = ("poisson", "after-recovery")
POD_MODES = ("graceful", "hard")
NODE_MODES = ("vanish", "notice30", "notice120")
MODES = POD_MODES + NODE_MODES
HOLD_MEANS = 3.0
"""A loss that finds nothing to take is held at most this many mean intervals, then skipped
(``goodput_rows``; ``goodput_ceiling`` models the same)."""


def mean_interval(mode: str, mtbf: float, node_mtbf: float = 0.0) -> float:
    """The stated mean interval between ``mode``'s losses: ``node_mtbf`` for a node mode
    when it is set (> 0), ``mtbf`` otherwise."""
    return node_mtbf if mode in NODE_MODES and node_mtbf > 0 else mtbf


def poisson_times(rng: random.Random, mtbf: float, n: int) -> list[float]:
    """``n`` loss times (seconds after the row's first step) of a Poisson process of mean
    interval ``mtbf``: the cumulative sums of ``n`` exponential gaps, strictly increasing."""
    if mtbf <= 0:
        raise ValueError(f"mtbf must be positive, got {mtbf}")
    times: list[float] = []
    t = 0.0
    for _ in range(n):
        gap = 0.0
        while gap <= 0.0:  # expovariate can return 0.0 (once in 2**53): keep times increasing
            gap = rng.expovariate(1.0 / mtbf)
        t += gap
        times.append(t)
    return times


def default_min_replicas(replicas: int, modes: Iterable[str], job_nodes: int) -> int:
    """The elastic minimum a user planning for ``modes`` sets: ``replicas - 1`` for pod
    losses; with node losses over ``job_nodes`` nodes, ``replicas`` less one node's share of
    an even spread (``ceil(replicas / job_nodes)``), so that the survivors of a node loss go on
    at once instead of waiting below the minimum for replacements to start (issue 39)."""
    lose = 1
    if set(modes) & set(NODE_MODES) and job_nodes >= 1:
        lose = -(-replicas // job_nodes)
    return max(1, replicas - lose)


def notice_seconds(mode: str) -> int:
    """The notice a ``noticeN`` mode gives before its node vanishes (0 for the others)."""
    return int(mode[len("notice") :]) if mode.startswith("notice") else 0


def rank0_steps(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rank 0's step events in time order."""
    return sorted((e for e in events if e.get("ev") == "step"), key=lambda e: float(e["t"]))


def gen_at(steps: Sequence[Mapping[str, Any]], t: float) -> int:
    """The generation rank 0 was stepping in at ``t``: its last step at or before ``t``
    (-1 before any step)."""
    before = [int(e["gen"]) for e in steps if float(e["t"]) <= t]
    return before[-1] if before else -1


@dataclass(frozen=True)
class Attributed:
    """A loss's recovery: the first step of a later generation (None: none in the timeout)."""

    t_loss: float
    gen_before: int
    step: Mapping[str, Any] | None

    @property
    def seconds(self) -> float | None:
        return None if self.step is None else float(self.step["t"]) - self.t_loss


def attribute(
    loss_times: Sequence[float],
    events: Iterable[Mapping[str, Any]],
    timeout: float = float("inf"),
) -> list[Attributed]:
    """Each loss's recovery, resolved after the row: the first rank-0 step after the loss of a
    generation above the one running at the loss (``gen_at``); None when there is none within
    ``timeout`` seconds of the loss (a failed re-formation: listed, never dropped). The
    recovery is measured from the loss to that step's completion: no step is subtracted."""
    steps = rank0_steps(events)
    out = []
    for t in loss_times:
        gen = gen_at(steps, t)
        step = next(
            (e for e in steps if float(e["t"]) > t and int(e["gen"]) > gen),
            None,
        )
        if step is not None and float(step["t"]) - t > timeout:
            step = None
        out.append(Attributed(t, gen, step))
    return out


def members_at(trace: Iterable[Mapping[str, Any]], t: float, job: str) -> frozenset[str] | None:
    """The pods of the generation published last at or before ``t``: the members (pod
    indices) of the trace's last ``job`` line by then, as pod names; None when no line
    before ``t`` has members (Kubeflow's job, or before the first publication)."""
    last = None
    for e in trace:
        if e.get("what") == "job" and float(e["t"]) <= t and e.get("members") is not None:
            last = e["members"]
    return None if last is None else frozenset(f"{job}-worker-{i}" for i in last)


def realised_rate(losses: int, window: float) -> float:
    """Losses per second of a row's window (0 for an empty window)."""
    return losses / window if window > 0 else 0.0


def end_of_row(t_first: float, offsets: Sequence[float], mtbf: float, notice: int = 0) -> float:
    """When a Poisson row ends: ``mtbf`` after its last loss's node is gone (a notice's node
    goes ``notice`` seconds after the notice); ``t_first`` + ``mtbf`` without losses."""
    return t_first + (offsets[-1] + notice if offsets else 0.0) + mtbf


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    """Issue 39's options: the loss schedule, the node's return, the state's size, the
    baseline without restore points."""
    p.add_argument(
        "--schedule",
        choices=SCHEDULES,
        default="poisson",
        help="poisson: the row's loss times drawn before it starts (exponential gaps of mean "
        "--mtbf), each taken whatever the job is doing; after-recovery: each loss --mtbf "
        "(+-20%%) after the previous recovery (the schedule before issue 39)",
    )
    p.add_argument("--node-mtbf", type=float, default=0.0,
                   help="mean interval of the node modes' losses (default: --mtbf)")  # fmt: skip
    p.add_argument(
        "--node-return",
        type=float,
        default=60.0,
        help="seconds after a node is gone (vanish, noticeN) until it comes back (a new VM)",
    )
    p.add_argument(
        "--spares",
        type=int,
        default=0,
        help="spot nodes standing for VMs not yet provisioned (tainted): a notice launches its "
        "node's replacement, Ready --provision s later, and the noticed node comes back as a "
        "spare (Karpenter's interruption handling; bench/goodput_fleet.py); 0: a noticed node "
        "is its own replacement, --node-return s after it is gone",
    )
    p.add_argument("--provision", type=float, default=60.0,
                   help="--spares: seconds from a notice until its replacement node is Ready")  # fmt: skip
    p.add_argument(
        "--thaw",
        action="store_true",
        help="a node comes back with its frozen pods' processes, which resume (the same VM); "
        "by default they are SIGKILLed before the return (a new VM)",
    )
    p.add_argument(
        "--state-mib",
        type=int,
        default=0,
        help="MiB of model + Adam state per worker (bench/_goodput_state.py); 0: Linear(16, 1)",
    )
    p.add_argument(
        "--system-node",
        action="store_true",
        help="keep the job's pods off the operator's node (a taint for the run): a cloud "
        "cluster's system pool; the job spreads over the nodes a loss can take",
    )
    p.add_argument(
        "--no-bracket",
        action="store_true",
        help="run each system's baseline only before the loss rows; by default it runs again "
        "after them, and each row is divided by the median of its system's baselines (the "
        "machine's speed drifts over an hour: 97-120 samples/s in 2026-12-03c-e)",
    )
    p.add_argument(
        "--no-restore-point-baseline",
        action="store_true",
        help="with --restore-point, skip the extra baseline without restore points (the "
        "restore point's overhead)",
    )

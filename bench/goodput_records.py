"""What one goodput row records (bench/goodput_rows.py): each loss and its recovery
(``Recovery``), the row's figures (``Row``), and the reads of the workers' events file and the
checkpoint storage they come from."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import kube as k

from bench import goodput_accounting as acc
from bench.goodput_rates import GenRate
from bench.harness import read_jsonl

PHASES = ("reaction", "pod start", "imports", "group", "DDP", "restore", "first step")
EVENT_ORDER = ("start", "imported", "group", "model", "restored")


def read_events(path: Path) -> list[dict[str, Any]]:
    """The workers' events so far (a line being written is skipped)."""
    return read_jsonl(path, partial=True)


@dataclass
class Recovery:
    """One loss (a pod evicted or killed, or a node lost with every pod on it) and its
    recovery: the first completed step of a later generation (``goodput_schedule.attribute``)."""

    t_evict: float
    pod: str
    gen_before: int
    step_before: int = 0
    boundaries: dict[str, float] = field(default_factory=dict)
    first_step: float | None = None
    resumed_step: int | None = None
    pause: float | None = None
    """The longest stretch without a step from the preemption to ``first_step``
    (``acc.longest_pause``)."""
    node: str = ""
    """The node taken (node modes); empty for a pod mode."""
    pods: list[str] = field(default_factory=list)
    """Every pod of the job the loss took (one for a pod mode; all on the node for a node)."""
    new_gen: int | None = None
    members_lost: int | None = None
    """How many of ``pods`` were members of the generation published last before the loss
    (the trace's ``status.members``); None where the trace has none (Kubeflow). A loss of
    members 0 took only pods not in the group yet (joiners starting, a move's replacements):
    the job trained on, and the loss has no recovery to time (``trained_on``)."""

    held: float = 0.0
    """Seconds the loss waited past its drawn time for something to take (a running pod, a
    node that runs one): both systems of a row meet the same losses (``goodput_rows``)."""

    @property
    def trained_on(self) -> bool:
        return self.members_lost == 0

    @property
    def seconds(self) -> float | None:
        return None if self.first_step is None else self.first_step - self.t_evict

    def describe(self, t0: float) -> str:
        """The loss in a line: when (seconds after ``t0``), what it took."""
        what = f"node {self.node} ({len(self.pods)} pods)" if self.node else self.pod
        return f"+{self.t_evict - t0:.1f}s {what}, generation {self.gen_before} running"


@dataclass
class Row:
    policy: str
    mode: str
    strategy: str = "ddp"
    wall: float = 0.0
    samples: int = 0
    """What the row trained in its window (``acc.window_samples``): goodput's numerator."""
    committed: int = 0
    """What storage held after the row (``acc.committed_samples``): a check, not goodput."""
    recoveries: list[Recovery] = field(default_factory=list)
    redone: int = 0
    """Steps done again in the row's window (``acc.steps_redone``): every restore from an older
    step, whichever loss's recovery it belongs to."""
    restarts: int = 0
    """TorchJob: ``status.restarts``; Kubeflow: container restarts of the pods left at the end."""
    disruptions: int | None = 0
    note: str = ""
    workers: int = 0
    standbys: int = 0
    step_times: list[float] = field(default_factory=list)
    """Wall-clock times of rank 0's steps (the timeline)."""
    step_samples: list[float] = field(default_factory=list)
    """The samples of each of those steps (world size x batch)."""
    gen_rates: list[GenRate] = field(default_factory=list)
    """Rank 0's step rate in each full-size generation (``goodput_rates``)."""
    t_first: float = 0.0
    pod_seconds: float = 0.0
    """Pod-seconds paid over [t_first, t_first + wall], from the trace (``acc.pod_seconds``)."""
    restore_point: bool = False
    """Whether the workers handed their state to ``register_state`` (``--restore-point``)."""
    index: int = 0
    suffix: str = ""
    """``-norp`` for the baseline without restore points (file names)."""
    skipped: list[str] = field(default_factory=list)
    """Losses the schedule drew that found nothing to take (no running pod, no node)."""

    def pods_label(self) -> str:
        return str(self.workers + self.standbys)

    def figures(self) -> acc.RowFigures:
        return acc.RowFigures(
            self.policy,
            self.mode,
            self.samples,
            self.wall,
            self.workers,
            self.standbys,
            self.strategy,
        )


def storage_metrics(storage: Path) -> list[dict[str, Any]]:
    """The metrics of every committed checkpoint under ``storage`` (the checkpoint path or a
    run directory below it): the final checkpoint counts even when its ``commit`` event was
    never written (a stopped job's last ``report()`` raises after committing)."""
    from torchjob.checkpoint import CheckpointStorage

    found: list[dict[str, Any]] = []
    candidates = [storage, *(d for d in storage.rglob("*") if d.is_dir() and d.name[0] != ".")]
    for d in candidates:
        try:
            found.extend(dict(c.metrics) for c in CheckpointStorage(str(d)).list_committed())
        except Exception:  # not a checkpoint directory
            continue
    return found


def wait_step_after(events: Path, t: float, gen_above: int, timeout: float) -> dict[str, Any]:
    return k.wait_for(
        lambda: next(
            (
                e
                for e in read_events(events)
                if e["ev"] == "step" and e["t"] > t and e["gen"] > gen_above
            ),
            None,
        ),
        timeout,
        f"a step of a generation above {gen_above} in {events}",
        interval=0.2,
    )

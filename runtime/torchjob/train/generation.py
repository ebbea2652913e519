"""What the driver does while one generation's workers train (``Running`` in
``torchjob.train.controller``): it follows their events and ticks until they end.

The events: progress reports and checkpoints that landed (the run's record, the progress
view, experiment tracking and the TorchJob's ``status.progress`` on rank 0's pod), and the
restore points and silent peers that ``torchjob.train.recovery.survivors`` follows. The tick: tell
the notice a pod was given, kill this pod's workers when they hang past another pod's
silent rank, and stop every rank at its next report when a stop was requested or the mode
asks for it (a membership change). The controller forms the group, waits on it with
:meth:`GenerationRun.on_event` and :meth:`GenerationRun.on_tick`, and judges how it ended.
"""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from typing import Protocol

from torchjob.checkpoint import CheckpointStorage
from torchjob.launch import REGROUP_SIGNAL, WorkerGroup, WorkerGroupError
from torchjob.launch.policy import RunState
from torchjob.launch.protocol import CheckpointLanded, Dispatcher, Report, ignore
from torchjob.train.job_status import GenerationFacts, JobStatusReporter, progress_body
from torchjob.train.modes import FitMode
from torchjob.train.progress import ProgressView
from torchjob.train.record import RunRecord
from torchjob.train.recovery.notice import Notice
from torchjob.train.recovery.survivors import RestorePoints
from torchjob.train.steps import FitContext
from torchjob.train.tracking import RunTracking

STUCK_AFTER_SILENT_S = 5.0
"""KeepSurvivors: how long this pod's workers may stay in their task after their watchdog
found a rank of another pod silent (and broke their connections to the group) before the
driver kills them (``RestorePoints.stuck_for``): a broken collective fails in milliseconds."""
STUCK_AFTER_REGROUP_S = 1.0
"""The same, once the workers were also asked to re-form for a later generation: the silent
ranks left this generation for that one (they beat there), and the members forming it wait
for this pod. A member stuck in the old all-reduce for 5 s more held a formation of seven
pods for 13 s on the fleet bench (bench/results/2026-12-07zd, kills 8 and 9)."""
LOSS_GRACE_S = 30.0
"""How long the survivors of a lost rank get to answer while they hold a restore point."""


class Driver(FitContext, Protocol):
    """What a generation's run reads of the running ``fit`` (the controller)."""

    @property
    def record(self) -> RunRecord: ...

    @property
    def tracking(self) -> RunTracking: ...

    @property
    def notice(self) -> Notice: ...

    @property
    def mode(self) -> FitMode: ...

    @property
    def storage(self) -> CheckpointStorage | None:
        """The run's checkpoint storage on the pod that runs rank 0, else None."""

    @property
    def job_status(self) -> JobStatusReporter | None:
        """The TorchJob's progress reporter on the pod that runs rank 0, else None."""


class GenerationRun:
    """The driver's side of one generation while its workers train (see the module
    docstring). ``group`` is set once the workers are taken."""

    def __init__(
        self,
        fit: Driver,
        state: RunState,
        view: ProgressView,
        *,
        points: RestorePoints,
        generation: int,
    ) -> None:
        self.fit = fit
        self.view = view
        self.current = state
        """The generation's run state, counting the checkpoints taken in it."""
        self.points = points
        self.facts = GenerationFacts(generation)
        """The generation the operator published (a pod's), else this fit's own count."""
        self.group: WorkerGroup | None = None
        self.signalled: signal.Signals | None = None
        """What this pod's workers were asked to end at their next report for: a re-formation
        (REGROUP_SIGNAL), or a stop (SIGTERM; also after a REGROUP_SIGNAL, when due since)."""
        self.unstuck: WorkerGroupError | None = None
        """Set when this pod's workers were killed for hanging past a silent peer."""
        self._report_number = 0
        """The run's number of rank 0's last report (``Report.report``)."""
        self._follow = Dispatcher[None](
            {CheckpointLanded: self._landed, Report: self._reported}, otherwise=ignore
        )

    def loss_grace_s(self) -> float:
        """Wait for the survivors only when they hold a restore point worth keeping."""
        return LOSS_GRACE_S if self.points.held else 3.0

    def on_event(self, _rank: int, event: object) -> None:
        self.fit.tracking.event(event)
        if not self.points.on_event(event, self.group, self.view):
            self._follow(event)

    def _checkpointed(self) -> None:
        self.current = replace(
            self.current, checkpoints_in_generation=self.current.checkpoints_in_generation + 1
        )

    def _landed(self, e: CheckpointLanded) -> None:  # a background commit finished
        self._checkpointed()
        job_status, record = self.fit.job_status, self.fit.record
        if job_status is not None and (last := record.last_metrics) is not None:
            reports = self._report_number or len(record.history)
            body = progress_body(
                last, reports=reports, checkpoint=e.path, generation=self.facts.generation
            )
            job_status.report(self.facts.add(body, reports=reports, restored=None)[0])

    def _reported(self, e: Report) -> None:
        record = self.fit.record
        record.report(e.metrics)
        if e.checkpoint_index is not None:
            self._checkpointed()
        self.view.report(e.metrics, len(record.history))
        job_status = self.fit.job_status
        if job_status is not None:
            latest = None
            storage = self.fit.storage
            if e.checkpoint_index is not None and storage is not None:
                committed = storage.latest_committed()
                latest = committed.path if committed else None
            # The run's count, not this driver's: a pod that became rank 0 in a later
            # generation saw none of the earlier reports (its record began empty), and its
            # status said the job restored step 0 and redid 147 steps (2026-11-29i).
            reports = self._report_number = e.report
            body = progress_body(
                e.metrics, reports=reports, checkpoint=latest, generation=self.facts.generation
            )
            body, first = self.facts.add(body, reports=reports, restored=self.points.restored)
            job_status.report(body, urgent=first)

    def on_tick(self) -> None:
        self.view.tick()
        told = self.fit.notice.tell()
        if told is not None:
            self.view.message(f"[torchjob] {told}")
        if self.group is not None and self.unstuck is None:
            self._kill_if_stuck(self.group)
        if self.signalled == signal.SIGTERM or self.group is None:
            return
        if self.fit.stop_requested.is_set():
            reason: str | None = "SIGTERM: stopping all ranks at the next report"
            sig = signal.SIGTERM
        else:
            # A re-formation the state in memory carries (the loop writes no stop's
            # checkpoint), or a stop; a regroup asked for already becomes a stop (SIGTERM)
            # when one is due since (the job is being deleted).
            reason = self.fit.mode.interrupt(self.fit, self.current)
            sig = REGROUP_SIGNAL if self.fit.mode.regroups else signal.SIGTERM
            if self.signalled is not None and sig == REGROUP_SIGNAL:
                return
        if reason is not None:
            self.view.message(f"[torchjob] {reason}")
            self.group.signal(sig)
            self.signalled = sig

    def _kill_if_stuck(self, group: WorkerGroup) -> None:
        """Kill this pod's workers when they hang in a collective past another pod's silent
        rank, so that this pod joins the next generation with new processes."""
        moved_on = self.signalled == REGROUP_SIGNAL
        after = STUCK_AFTER_REGROUP_S if moved_on else STUCK_AFTER_SILENT_S
        waited = self.points.stuck_for(time.monotonic(), after)
        if waited is None:
            return
        assert self.points.remote_silent is not None
        self.unstuck = WorkerGroupError(
            0,
            "StuckCollective",
            f"this pod's workers were still in a collective {waited:.1f}s after rank "
            f"{self.points.remote_silent[1]} of another pod was found silent"
            f"{' (it left for the generation published since)' if moved_on else ''}; "
            "killed, so that this pod joins the next generation with new processes",
            peer_failure=True,
        )
        self.view.message(f"[torchjob] {self.unstuck.message}; their stacks follow")
        group.kill_with_stacks()  # what held them goes on record first

"""``TorchTrainer.fit()``'s controller: an explicit state machine with one strategy per mode.

Ray Train V2's split. The controller moves through *steps* (:data:`Step`)::

    Running ──(generation ends)──► Finished | Stopped | Errored        (terminal)
       ▲                     └───► Restarting | Resizing | Following | Reforming
       └──────────────────────────────────┘

``Running`` forms a worker group for one generation and runs the training function;
how it ended (:data:`GenerationEnd`) is handed to the *mode*, which returns the next
step. The decisions inside a mode are the pure policies of ``torchjob.launch.policy``
(over ``torchjob.rules``); the controller only carries steps out (waits, messages,
termination messages, the final :class:`Result` or exception).

Where the rest lives: the steps and shared protocols in ``torchjob.train.steps``; the three
modes (:class:`LocalMode`, :class:`PodMode`, :class:`KeepSurvivorsMode`, chosen once from
where ``fit()`` runs) in ``torchjob.train.modes``; the worker processes in
``torchjob.train.workers``; the run's record and ending in ``torchjob.train.record``; the
restore point and silent peers in ``torchjob.train.recovery.survivors``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import NoReturn, assert_never

from torchjob import contract
from torchjob.checkpoint import CheckpointStorage
from torchjob.contract import Member, PodEnv, Role, Standby
from torchjob.launch import LaunchError
from torchjob.launch.policy import RestartGroup, RunState, next_generation
from torchjob.launch.termination import with_oom_evidence
from torchjob.train import _session, record, teardown, workers
from torchjob.train._spec import WorkerSpec
from torchjob.train._worker_loop import run_training
from torchjob.train.generation import GenerationRun
from torchjob.train.job_status import JobEndpoint, JobStatusReporter
from torchjob.train.modes import KeepSurvivorsMode, choose_mode
from torchjob.train.progress import ProgressView
from torchjob.train.record import RunRecord, run_location, shares_result
from torchjob.train.recovery.formation import FormationWatch, absence_of, peer_addresses
from torchjob.train.recovery.membership import GenerationTimeout, Membership
from torchjob.train.recovery.notice import Notice
from torchjob.train.recovery.reports import SilentReports, early_sweep, silent_reporter
from torchjob.train.recovery.survivors import RestorePoints
from torchjob.train.result import Result
from torchjob.train.steps import (
    Completed,
    Crashed,
    Errored,
    Finished,
    Following,
    GenerationEnd,
    Interrupted,
    Reforming,
    Resizing,
    Restarting,
    Running,
    Step,
    Stopped,
    TrainerSettings,
)
from torchjob.train.tracking import RunTracking
from torchjob.train.workers import Workers

log = logging.getLogger(__name__)

REFORM_WAIT_S = 1.0
"""KeepSurvivors: pause before forming the same generation again when a peer is not up yet."""


# --- the controller ------------------------------------------------------------------------


class Controller:
    """One ``fit``: carries out the steps its mode decides."""

    def __init__(self, trainer: TrainerSettings, pod: PodEnv | None) -> None:
        self.t = trainer
        self.pod = pod
        self.name, self.run_url = run_location(trainer.run_config, pod)
        self.record = RunRecord(self.run_url, trainer.run_config.checkpoint_config)
        self.stop_requested = threading.Event()
        self.notice = Notice(self.stop_requested, pod.drain_s if pod is not None else 0)
        self._storage: CheckpointStorage | None = None
        self._endpoint = JobEndpoint.from_env(pod) if pod is not None else None
        self._job_status: JobStatusReporter | None = None
        self._silent = SilentReports.of(pod, self._endpoint)
        self.mode = choose_mode(trainer, pod, self._endpoint)
        if isinstance(self.mode, KeepSurvivorsMode):  # a job deletion ends the drain
            self.mode.watch.on_deleting(self.notice.final)
            if self._silent is not None:  # on_broken stays None without a status to write
                self.mode.on_broken = self._silent.broken
                self._silent.seen_after = self.mode.watch.seen_after  # reports it saw end
        self.tracking = RunTracking.of(trainer, self.name, self.run_url, pod, self._endpoint)
        self.workers = Workers(trainer, heals=pod is None)

    # --- what rank 0's pod does ------------------------------------------------------------
    def _leads(self) -> bool:
        """This pod runs rank 0 now (the laptop always does): it reads and lists checkpoints
        and reports progress. Under KeepSurvivors the role moves with ``status.members``."""
        role = self._role()
        match role:
            case None:
                return True
            case Member(node_rank=rank):
                return rank == 0
            case Standby():
                return False
            case _:
                assert_never(role)

    @property
    def storage(self) -> CheckpointStorage | None:
        """The run's checkpoint storage, on the pod that runs rank 0 (others never touch it)."""
        if not self._leads():
            return None
        if self._storage is None:
            self._storage = record.open_storage(self.run_url, in_pod=self.pod is not None)
        return self._storage

    @property
    def job_status(self) -> JobStatusReporter | None:
        """Rank 0's pod reports progress into the TorchJob's status (per-job ServiceAccount)."""
        if self._endpoint is None or not self._leads():
            return None
        if self._job_status is None:
            self._job_status = JobStatusReporter(self._endpoint)
        return self._job_status

    # --- what a generation needs ---------------------------------------------------------
    def _spec(self) -> WorkerSpec:
        return workers.worker_spec(
            self.t,
            self.name,
            self.run_url,
            share_result=shares_result(self._pod_now()),
            history=self.record.history,
            env=self.tracking.env,
        )

    def _published(self) -> Membership | None:
        """KeepSurvivors: the generation this pod follows (its env names the one it was
        created in); elsewhere the env says all."""
        return self.mode.membership if isinstance(self.mode, KeepSurvivorsMode) else None

    def _peers(self) -> dict[int, tuple[str, int]]:
        """KeepSurvivors: the other members' hosts, probed while a generation forms."""
        m = self._published()
        return {} if m is None or self.pod is None else peer_addresses(self.pod, m.ranked)

    def _pod_now(self) -> PodEnv | None:
        """This pod as of the current generation."""
        return None if self.pod is None else contract.pod_as_of(self.pod, self._published())

    def _role(self) -> Role | None:
        """This pod's role in the current generation; None on a laptop."""
        return None if self.pod is None else contract.pod_role(self.pod, self._published())

    def _follows(self) -> bool:
        """KeepSurvivors, no stop requested: a generation's processes serve the next one."""
        return isinstance(self.mode, KeepSurvivorsMode) and not self.stop_requested.is_set()

    def _keeps(self) -> bool:
        """A generation's live processes serve the next one (KeepSurvivors; on a laptop, the
        survivors of a lost rank and a resized group), unless a stop was requested."""
        return self._follows() or (self.pod is None and not self.stop_requested.is_set())

    def _prestart(self, state: RunState, view: ProgressView) -> None:
        """KeepSurvivors: start the worker processes ahead of the first generation; a standby
        has no rank in it, so its processes start unformed."""
        pod, role = self._pod_now(), self._role()
        match role:
            case Member() | None:
                placement, env = workers.placement(pod, state)
            case Standby(generation=generation):
                assert self.pod is not None
                placement, env = workers.unformed(self.pod, generation), {}
            case _:
                assert_never(role)
        self.workers.prestart(placement, env, pod, view)

    def _install_sigterm(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: self.notice.sigterm())

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore

    def result(self, error: BaseException | None = None) -> Result:
        return self.record.result(self.storage, error)

    # --- the state machine ---------------------------------------------------------------
    def run(self) -> Result:
        restore = self._install_sigterm()
        config = self.t.train_loop_config or {}
        total = config.get("epochs", config.get("num_epochs"))
        enabled = self.t.run_config.progress and self.pod is None
        failed = True
        try:
            with ProgressView(
                enabled=enabled, total_epochs=total if isinstance(total, int) else None
            ) as view:
                if self._silent is not None:  # a report says when it was written, how long it took
                    self._silent.say = view.message
                result, failed = self._loop(view), False
                return result
        finally:
            status = self._job_status
            teardown.run_steps(
                signals=restore,
                notice=self.notice.cancel,
                workers=self.workers.release,
                tracking=lambda: self.tracking.end(failed=failed),
                session=lambda: _session.set_fit_led(self._leads()),
                job_status=lambda: None if status is None else status.close(),
            )

    def _loop(self, view: ProgressView) -> Result:
        storage = self.storage
        first = self.pod is None or self.pod.generation == 0
        if storage is not None and storage.is_local and first:
            # Only at the run's very start: later, an earlier rank 0 may still be committing.
            storage.remove_incomplete()
        state = RunState(
            num_workers=self.t.scaling_config.max_workers,
            generation_started_s=time.monotonic(),
        )
        if isinstance(self.mode, KeepSurvivorsMode):
            self._prestart(state, view)
            try:
                self.mode.await_own_generation(self, view)
            except GenerationTimeout as timeout:
                if self.stop_requested.is_set() or self.mode.stops():  # stopped, or replaced
                    self._raise_stopped(None, view)
                ended = self.mode.watch.read()
                if ended is not None and ended.phase == "Succeeded":
                    # A standby (or joiner) the job never needed: the job is done, so is it.
                    view.message(f"[torchjob] {timeout}; this pod was not needed")
                    return self.result()
                self._raise_failed(timeout, str(timeout))
        step: Step = Running(replace(state, generation_started_s=time.monotonic()))
        while True:
            match step:
                case Running(state):
                    step = self._next(state, self._run_generation(state, view))
                case Restarting(state, decision):
                    step = Running(self._restart(state, decision, view))
                case Resizing(state, resize):
                    view.message(f"[torchjob] {resize.reason}")
                    step = Running(
                        next_generation(
                            state,
                            resize.num_workers,
                            state.counters.resized(),
                            now_s=time.monotonic(),
                        )
                    )
                case Following(state, why, err):
                    step = self._follow(state, why, err, view)
                case Reforming(state, why):
                    view.message(f"[torchjob] {why}")
                    self.stop_requested.wait(REFORM_WAIT_S)
                    step = Running(state)
                case Finished(outcomes):
                    return self.record.final_result(self.storage, outcomes)
                case Stopped(at_report):
                    self._raise_stopped(at_report, view)
                case Errored(err, message):
                    self._raise_failed(err, message)
                case _:
                    assert_never(step)

    def _next(self, state: RunState, end: GenerationEnd) -> Step:
        """The transition out of ``Running``: what is common, then the mode's call."""
        match end:
            case Completed(outcomes):
                return Finished(outcomes)
            case Interrupted(outcomes):
                at_report = outcomes[0].stopped_at_report
                if self.stop_requested.is_set():
                    return Stopped(at_report)
                return self.mode.after_interrupt(self, state, at_report)
            case Crashed(err, held):
                if self.stop_requested.is_set() and record.peers_only(err):
                    return Stopped(at_report=None)  # told to stop, and only its peers broke
                if self.stop_requested.is_set() or not record.retryable(err):
                    return Errored(err, str(err))
                return self.mode.after_failure(self, replace(state, survivors_hold_state=held), err)
            case _:
                assert_never(end)

    def _run_generation(self, state: RunState, view: ProgressView) -> GenerationEnd:
        pod = self._pod_now()
        self.record.world_sizes.append(state.num_workers if pod is None else pod.world_size)
        view.generation(state.generation, state.num_workers)
        if self._leads():
            self.tracking.start()  # experiment tracking: once, on the driver of rank 0
        placement, env = workers.placement(pod, state)
        oom_before = contract.oom_kills()  # the OOM killer's evidence, if a worker dies
        published = self._published()
        run = GenerationRun(
            self,
            state,
            view,
            points=RestorePoints(
                report_silent=silent_reporter(published, self._silent),
                sweep_early=early_sweep(published, self._silent),
            ),
            # The generation the operator published (a pod's), else this fit's own count.
            generation=pod.generation if pod is not None else state.generation,
        )
        try:
            forming = time.monotonic()
            # While the workers form: a silent store host is reported as rank 0, a silent
            # member's host or a member that never arrives as that member (the watchdog
            # runs only once they have formed); a later generation that leaves out a pod
            # this formation waits for gives it up.
            absence = absence_of(self.pod, placement, self._published(), run.facts.generation)
            peers = self._peers()
            with FormationWatch(
                placement, run.points.report_silent, peers=peers, absence=absence
            ) as watch:
                run.group = group = self.workers.take(
                    placement,
                    env,
                    pod,
                    abandon=lambda: watch.check(self.mode.superseded(time.monotonic() - forming)),
                )
            with self.notice.training():
                outcomes = group.submit(run_training, (self._spec(),)).wait(
                    on_event=run.on_event, on_tick=run.on_tick, loss_grace_s=run.loss_grace_s
                )
        except LaunchError as caught:
            err = with_oom_evidence(caught, oom_before)
            kept = False
            if run.group is not None:
                # Another pod's loss broke the group: under KeepSurvivors these processes stay;
                # on a laptop the survivors of a lost rank stay and re-form in place.
                kept = self.workers.settle(run.group, placement, keep=self._keeps(), timeout_s=0)
            # Workers killed for hanging past a silent peer failed for that peer's loss.
            return Crashed(run.unstuck or err, survivors_hold_state=kept and run.points.held)
        if any(o.stopped for o in outcomes):
            # Stopped for a membership change: the processes stay for the next generation.
            self.workers.settle(group, placement, keep=self._keeps(), timeout_s=10)
            return Interrupted(outcomes)
        group.shutdown(timeout_s=10)
        return Completed(outcomes)

    # --- carrying steps out ----------------------------------------------------------------
    def _restart(self, state: RunState, decision: RestartGroup, view: ProgressView) -> RunState:
        latest = self.storage.latest_committed() if self.storage is not None else None
        where = latest.path if latest else "the start (no checkpoint yet)"
        if decision.from_memory:
            where = "the survivors' memory (in place)"
        view.message(
            f"[torchjob] {decision.reason}; generation {state.generation + 1} with "
            f"{decision.num_workers} workers resumes from {where}"
        )
        if decision.backoff_s:
            view.message(f"[torchjob] restart backoff: {decision.backoff_s:g}s")
            self.stop_requested.wait(decision.backoff_s)
        return next_generation(
            state, decision.num_workers, decision.counters, now_s=time.monotonic()
        )

    def _follow(
        self, state: RunState, why: str, err: LaunchError | None, view: ProgressView
    ) -> Step:
        assert isinstance(self.mode, KeepSurvivorsMode)
        try:
            self.mode.follow(self, why, view)
            if self.mode.leaving:
                return Stopped(at_report=None)
        except GenerationTimeout as timeout:
            if self.stop_requested.is_set() or self.mode.stops():  # the job is being deleted
                return Stopped(at_report=None)
            if err is not None:
                return Errored(err, str(err))  # nothing came: end with what broke the group
            return Errored(timeout, str(timeout))
        return Running(state)

    def _raise_stopped(self, at_report: int | None, view: ProgressView) -> NoReturn:
        if (told := self.notice.tell()) is not None:  # the ticks may have ended before it
            view.message(f"[torchjob] {told}")
        raise record.stopped(self.result(), at_report, in_pod=self.pod is not None)

    def _raise_failed(self, err: BaseException, message: str) -> NoReturn:
        raise record.failed(err, message, self.result(err), in_pod=self.pod is not None) from err

"""``TorchTrainer.fit()``'s controller: an explicit state machine with one strategy per mode.

Ray Train V2's split. The controller moves through *steps* (:data:`Step`)::

    Running ──(generation ends)──► Finished | Stopped | Errored        (terminal)
       ▲                     └───► Restarting | Resizing | Following | Reforming
       └──────────────────────────────────┘

``Running`` forms a worker group for one generation and runs the training function;
how it ended (:data:`GenerationEnd`) is handed to the *mode*, which returns the next
step. The decisions inside a mode are the pure policies of ``torchjob.launch.policy``
(over ``torchjob.plan``); the controller only carries steps out (waits, messages,
termination messages, the final :class:`Result` or exception).

The steps and the protocols both sides share live in ``torchjob.train.steps``; the modes
in ``torchjob.train.modes``. Three modes, chosen once from where ``fit()`` runs:

* :class:`LocalMode`: a laptop or a plain machine. Failures restart (or shrink) the
  group within ``FailureConfig``; an elastic run grows back at a report.
* :class:`PodMode`: a TorchJob pod (``membershipPolicy: RestartAll``). The operator owns
  restarts: any failure ends ``fit`` with the root cause in the termination message.
* :class:`KeepSurvivorsMode`: a TorchJob pod with ``membershipPolicy: KeepSurvivors``.
  The pod outlives generations: a peer's loss or a new generation published in the
  job's status re-forms the group in this process instead of ending it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn, assert_never

from torchjob import contract
from torchjob.checkpoint import CheckpointStorage, rank_checkpoints
from torchjob.contract import Member, PodEnv, Role, Standby
from torchjob.launch import (
    LaunchError,
    Placement,
    WorkerGroup,
    WorkerGroupError,
)
from torchjob.launch.policy import RestartGroup, RunState, next_generation
from torchjob.launch.termination import failure_message, write_termination_message
from torchjob.train import _session, _shared_result
from torchjob.train._spec import WorkerOutcome, WorkerSpec
from torchjob.train._worker_loop import run_training
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import RunConfig
from torchjob.train.errors import TrainingFailedError, TrainingStoppedError
from torchjob.train.job_status import JobEndpoint, JobStatusReporter, progress_body
from torchjob.train.membership import GenerationTimeout, Membership
from torchjob.train.modes import KeepSurvivorsMode, choose_mode
from torchjob.train.progress import ProgressView
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

log = logging.getLogger(__name__)

DEFAULT_STORAGE = "~/torchjob_results"
"""Where runs go without ``RunConfig(storage_path=...)``, as Ray uses ``~/ray_results``."""

REFORM_WAIT_S = 1.0
"""KeepSurvivors: pause before forming the same generation again when a peer is not up yet."""


# --- pure helpers --------------------------------------------------------------------------


def run_location(run_config: RunConfig, pod: PodEnv | None) -> tuple[str, str]:
    """(experiment name, run directory URL)."""
    name = run_config.name
    if pod is not None and pod.checkpoint_path:
        return name or pod.job_name, pod.checkpoint_path.rstrip("/")
    if name is None:
        stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        name = f"TorchTrainer_{stamp}"
    root = run_config.storage_path or os.path.expanduser(DEFAULT_STORAGE)
    return name, f"{root.rstrip('/')}/{name}"


def backend(configured: str | None, pod: PodEnv | None) -> str:
    """The process-group backend: in a pod, the TorchJob's immutable ``spec.backend``
    (``TORCHJOB_BACKEND``) unless it is ``auto``; else ``TorchConfig.backend``, else auto."""
    wanted = pod.backend if pod is not None and pod.backend != "auto" else None
    if wanted and configured and configured != wanted:
        log.warning(
            "torchjob: TorchConfig(backend=%r) differs from the TorchJob's spec.backend %r; "
            "using spec.backend",
            configured,
            wanted,
        )
    return wanted or configured or "auto"


def shares_result(pod: PodEnv | None) -> bool:
    """Several pods: rank 0 shares the final Result with the others (``_shared_result``)."""
    return pod is not None and pod.replicas > 1


def retryable(err: LaunchError) -> bool:
    """A corrupt checkpoint fails the same way every time: stop at once, naming its path."""
    return not (isinstance(err, WorkerGroupError) and err.exc_type == "CheckpointError")


# --- the controller ------------------------------------------------------------------------


class Controller:
    """One ``fit``: carries out the steps its mode decides."""

    def __init__(self, trainer: TrainerSettings, pod: PodEnv | None) -> None:
        self.t = trainer
        self.pod = pod
        self.name, self.run_url = run_location(trainer.run_config, pod)
        self.history: list[dict[str, Any]] = []
        self.world_sizes: list[int] = []
        self.last_metrics: dict[str, Any] | None = None
        self.stop_requested = threading.Event()
        self._storage: CheckpointStorage | None = None
        self._endpoint = JobEndpoint.from_env(pod) if pod is not None else None
        self._job_status: JobStatusReporter | None = None
        self.mode = choose_mode(trainer, pod, self._endpoint)
        self._kept: WorkerGroup | None = None
        """KeepSurvivors: this pod's worker processes between generations (see ``_prestart``)."""

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
            self._storage = CheckpointStorage(self.run_url)
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
        cc = self.t.run_config.checkpoint_config
        resume = self.t.resume_from_checkpoint
        return WorkerSpec(
            train_func=self.t.train_loop_per_worker,
            config=self.t.train_loop_config,
            storage_url=self.run_url,
            experiment_name=self.name,
            run_path=self.run_url,
            num_to_keep=cc.num_to_keep,
            score_attribute=cc.checkpoint_score_attribute,
            score_order=cc.checkpoint_score_order,
            resume_from=resume._url if resume is not None else None,
            share_result=shares_result(self._pod_now()),
            history_before=tuple(self.history),
            async_commit=cc.async_commit,
        )

    def _published(self) -> Membership | None:
        """KeepSurvivors: the generation this pod follows (its env names the one it was
        created in); elsewhere the env says all."""
        return self.mode.membership if isinstance(self.mode, KeepSurvivorsMode) else None

    def _pod_now(self) -> PodEnv | None:
        """This pod as of the current generation."""
        return None if self.pod is None else contract.pod_as_of(self.pod, self._published())

    def _role(self) -> Role | None:
        """This pod's role in the current generation; None on a laptop."""
        return None if self.pod is None else contract.pod_role(self.pod, self._published())

    def _placement(self, state: RunState) -> tuple[Placement, dict[str, str]]:
        """Where this generation's local workers go, and the env they get besides torchrun's."""
        pod = self._pod_now()
        if pod is None:
            return Placement.local(state.num_workers, generation=state.generation), {}
        env = {contract.GENERATION: str(pod.generation), contract.REPLICAS: str(pod.replicas)}
        return Placement.from_pod_env(pod), env

    def _new_group(self, placement: Placement, env: dict[str, str]) -> WorkerGroup:
        tc = self.t.torch_config
        return WorkerGroup(
            placement.local_world_size,
            backend=backend(tc.backend, self._pod_now()),
            use_gpu=self.t.scaling_config.use_gpu,
            timeout_s=tc.timeout_s,
            placement=placement,
            env=env,
        )

    def _prestart(self, state: RunState, view: ProgressView) -> None:
        """KeepSurvivors: start this pod's worker processes unformed, before its first
        generation, so that they import torch while the pod waits (a joiner waits for the
        job to grow); every generation then forms its group in these same processes."""
        role = self._role()
        match role:
            case Member() | None:
                placement, env = self._placement(state)
            case Standby(generation=generation):
                # No rank in the generation its env names: its processes start unformed,
                # and any placement of their number will do until a generation names it.
                assert self.pod is not None
                placement = Placement.local(self.pod.nproc_per_node, generation=generation)
                env = {}
            case _:
                assert_never(role)
        group = self._new_group(placement, env)
        try:
            group.start(form=False)
        except LaunchError as err:
            view.message(f"[torchjob] could not start the workers ahead: {err}")
            return
        self._kept = group

    def _take_group(self, placement: Placement, env: dict[str, str]) -> WorkerGroup:
        """The workers for this generation: the kept processes, re-formed in place when they
        fit ``placement``, else a new group (both ready to run)."""
        kept, self._kept = self._kept, None
        if kept is not None and kept.can_reform(placement):
            try:
                kept.reform(placement, env)
                return kept
            except LaunchError:
                kept.shutdown(timeout_s=0)
                raise
        if kept is not None:
            kept.shutdown(timeout_s=0)
        group = self._new_group(placement, env)
        try:
            group.start()
        except LaunchError:
            group.shutdown(timeout_s=0)
            raise
        return group

    def _keeps(self, group: WorkerGroup, placement: Placement) -> bool:
        """KeepSurvivors: whether this generation's processes serve the next one."""
        return (
            isinstance(self.mode, KeepSurvivorsMode)
            and not self.stop_requested.is_set()
            and group.can_reform(placement)
        )

    def _release(self) -> None:
        if self._kept is not None:
            self._kept.shutdown(timeout_s=10)
            self._kept = None

    def _install_sigterm(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = signal.getsignal(signal.SIGTERM)

        def handler(_signum: int, _frame: object) -> None:
            self.stop_requested.set()

        signal.signal(signal.SIGTERM, handler)

        def restore() -> None:
            signal.signal(signal.SIGTERM, previous)

        return restore

    def result(self, error: BaseException | None = None) -> Result:
        latest = None
        best: list[tuple[Checkpoint, dict[str, Any]]] = []
        if self.storage is not None:
            try:
                committed = self.storage.list_committed()
            except Exception:  # storage may be unreachable; the result must still be built
                committed = []
            if committed:
                latest = Checkpoint(committed[-1].path)
            cc = self.t.run_config.checkpoint_config
            ranked = rank_checkpoints(
                committed, cc.checkpoint_score_attribute, cc.checkpoint_score_order
            )
            best = [(Checkpoint(c.path), c.metrics) for c in ranked]
        return Result(
            metrics=self.last_metrics,
            checkpoint=latest,
            path=self.run_url,
            error=error,
            metrics_history=list(self.history),
            best_checkpoints=best,
            world_sizes=list(self.world_sizes),
        )

    def _final_result(self, outcomes: list[WorkerOutcome]) -> Result:
        """This pod's Result; on a pod without rank 0, filled with what rank 0 shared."""
        result = self.result()
        shared = next((o.shared for o in outcomes if o.shared is not None), None)
        if self.storage is None and shared is not None:
            return _shared_result.apply(result, shared)
        return result

    # --- the state machine ---------------------------------------------------------------
    def run(self) -> Result:
        restore = self._install_sigterm()
        config = self.t.train_loop_config or {}
        total = config.get("epochs", config.get("num_epochs"))
        enabled = self.t.run_config.progress and self.pod is None
        try:
            with ProgressView(
                enabled=enabled, total_epochs=total if isinstance(total, int) else None
            ) as view:
                return self._loop(view)
        finally:
            restore()
            self._release()
            _session.set_fit_led(self._leads())
            if self._job_status is not None:
                self._job_status.close()

    def _loop(self, view: ProgressView) -> Result:
        storage = self.storage
        if (
            storage is not None
            and storage.is_local
            and (self.pod is None or self.pod.generation == 0)
        ):
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
                if self.stop_requested.is_set():
                    self._raise_stopped(None)
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
                            state, resize.num_workers, charged=False, now_s=time.monotonic()
                        )
                    )
                case Following(state, why, err):
                    step = self._follow(state, why, err, view)
                case Reforming(state, why):
                    view.message(f"[torchjob] {why}")
                    self.stop_requested.wait(REFORM_WAIT_S)
                    step = Running(state)
                case Finished(outcomes):
                    return self._final_result(outcomes)
                case Stopped(at_report):
                    self._raise_stopped(at_report)
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
            case Crashed(err):
                if self.stop_requested.is_set() or not retryable(err):
                    return Errored(err, str(err))
                return self.mode.after_failure(self, state, err)
            case _:
                assert_never(end)

    def _run_generation(self, state: RunState, view: ProgressView) -> GenerationEnd:
        pod = self._pod_now()
        self.world_sizes.append(state.num_workers if pod is None else pod.world_size)
        view.generation(state.generation, state.num_workers)
        placement, env = self._placement(state)
        current = state
        signalled = False
        group: WorkerGroup | None = None

        def on_event(_rank: int, event: dict[str, Any]) -> None:
            nonlocal current
            if event.get("type") == "checkpoint":  # a background commit finished
                current = replace(
                    current, checkpoints_in_generation=current.checkpoints_in_generation + 1
                )
                if self.job_status is not None and self.last_metrics is not None:
                    self.job_status.report(
                        progress_body(
                            self.last_metrics, reports=len(self.history), checkpoint=event["path"]
                        )
                    )
                return
            if event.get("type") != "report":
                return
            self.last_metrics = event["metrics"]
            self.history.append(event["metrics"])
            if event.get("checkpoint_index") is not None:
                current = replace(
                    current, checkpoints_in_generation=current.checkpoints_in_generation + 1
                )
            view.report(event["metrics"], len(self.history))
            if self.job_status is not None:
                latest = None
                if event.get("checkpoint_index") is not None and self.storage is not None:
                    committed = self.storage.latest_committed()
                    latest = committed.path if committed else None
                self.job_status.report(
                    progress_body(event["metrics"], reports=len(self.history), checkpoint=latest)
                )

        def on_tick() -> None:
            nonlocal signalled
            view.tick()
            if signalled or group is None:
                return
            if self.stop_requested.is_set():
                reason: str | None = "SIGTERM: stopping all ranks at the next report"
            else:
                reason = self.mode.interrupt(self, current)
            if reason is not None:
                view.message(f"[torchjob] {reason}")
                group.signal(signal.SIGTERM)
                signalled = True

        try:
            group = self._take_group(placement, env)
            outcomes = group.submit(run_training, (self._spec(),)).wait(
                on_event=on_event, on_tick=on_tick
            )
        except LaunchError as err:
            if group is not None and self._keeps(group, placement):
                self._kept = group  # another pod's loss broke the group: these processes stay
            elif group is not None:
                group.shutdown(timeout_s=0)
            return Crashed(err)
        if any(o.stopped for o in outcomes):
            if self._keeps(group, placement):
                # Stopped for a membership change: the processes stay for the next generation.
                self._kept = group
            else:
                group.shutdown(timeout_s=10)
            return Interrupted(outcomes)
        group.shutdown(timeout_s=10)
        return Completed(outcomes)

    # --- carrying steps out ----------------------------------------------------------------
    def _restart(self, state: RunState, decision: RestartGroup, view: ProgressView) -> RunState:
        latest = self.storage.latest_committed() if self.storage is not None else None
        where = latest.path if latest else "the start (no checkpoint yet)"
        view.message(
            f"[torchjob] {decision.reason}; generation {state.generation + 1} with "
            f"{decision.num_workers} workers resumes from {where}"
        )
        if decision.backoff_s:
            view.message(f"[torchjob] restart backoff: {decision.backoff_s:g}s")
            self.stop_requested.wait(decision.backoff_s)
        return next_generation(
            state, decision.num_workers, charged=decision.charged, now_s=time.monotonic()
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
            if err is not None:
                return Errored(err, str(err))  # nothing came: end with what broke the group
            if self.stop_requested.is_set():
                return Stopped(at_report=None)
            return Errored(timeout, str(timeout))
        return Running(state)

    def _raise_stopped(self, at_report: int | None) -> NoReturn:
        result = self.result()
        where = result.checkpoint.path if result.checkpoint else "no checkpoint"
        at = f" at report {at_report}" if at_report is not None else ""
        text = f"training stopped on request{at}; latest checkpoint: {where}"
        if self.pod is not None:
            write_termination_message(contract.termination_message(text))
        raise TrainingStoppedError(text, result=result)

    def _raise_failed(self, err: BaseException, message: str) -> NoReturn:
        if self.pod is not None:
            # The operator decides what happens next; tell it the root cause.
            text = (
                failure_message(err)
                if isinstance(err, LaunchError)
                else contract.termination_message(message)
            )
            write_termination_message(text)
        raise TrainingFailedError(message, cause=err, result=self.result(err)) from err

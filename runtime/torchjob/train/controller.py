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

Three modes, chosen once from where ``fit()`` runs:

* :class:`LocalMode`: a laptop or a plain machine. Failures restart (or shrink) the
  group within ``FailureConfig``; an elastic run grows back at a report.
* :class:`PodMode`: a TorchJob pod (``membershipPolicy: RestartAll``). The operator owns
  restarts: any failure ends ``fit`` with the root cause in the termination message.
* :class:`KeepSurvivorsMode`: a TorchJob pod with ``membershipPolicy: KeepSurvivors``.
  The pod outlives generations: a peer's loss or a new generation published in the
  job's status re-forms the group in this process instead of ending it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, assert_never

from torchjob import contract
from torchjob.api.models import TERMINAL_PHASES
from torchjob.checkpoint import CheckpointStorage, rank_checkpoints
from torchjob.contract import PodEnv
from torchjob.launch import (
    CollectiveTimeoutError,
    LaunchError,
    Placement,
    WorkerDiedError,
    WorkerGroup,
    WorkerGroupError,
    WorkerGroupStartError,
)
from torchjob.launch.policy import (
    Fail,
    FailureKind,
    FailurePolicy,
    Resize,
    RestartGroup,
    RunState,
    ScalingPolicy,
    WorkerFailure,
    next_generation,
)
from torchjob.launch.termination import failure_message, write_termination_message
from torchjob.train import _shared_result
from torchjob.train._worker_loop import WorkerOutcome, WorkerSpec, run_training
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.errors import TrainingFailedError, TrainingStoppedError
from torchjob.train.job_status import JobEndpoint, JobStatusReporter, progress_body
from torchjob.train.membership import GenerationTimeout, Membership, MembershipWatch
from torchjob.train.progress import ProgressView
from torchjob.train.result import Result

if TYPE_CHECKING:  # trainer.py imports this module
    from torchjob.train.trainer import TorchTrainer

log = logging.getLogger(__name__)

FOLLOW_TIMEOUT_S = 900.0
"""KeepSurvivors: how long a pod whose group broke waits for the operator's next generation
(restart backoff plus scheduling of the replacement pods)."""

REFORM_WAIT_S = 1.0
"""KeepSurvivors: pause before forming the same generation again when a peer is not up yet."""


# --- steps ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """Form a worker group for ``state``'s generation and run the training function."""

    state: RunState


@dataclass(frozen=True)
class Restarting:
    """Local: the failure policy starts the next generation (same size, or one smaller)."""

    state: RunState
    decision: RestartGroup


@dataclass(frozen=True)
class Resizing:
    """Local elastic: every rank stopped at a report so the group can change size."""

    state: RunState
    resize: Resize


@dataclass(frozen=True)
class Following:
    """KeepSurvivors: wait for the operator's next generation, then run it in this pod.

    ``err`` is what broke the group, when something did: if no generation comes, the run
    ends with it; without one (the group stopped at a report) it ends as stopped or failed.
    """

    state: RunState
    why: str
    err: LaunchError | None = None


@dataclass(frozen=True)
class Reforming:
    """KeepSurvivors: a member of this generation is not up yet (a replacement still
    scheduling): form the same generation again."""

    state: RunState
    why: str


@dataclass(frozen=True)
class Finished:
    """Every rank returned: ``fit`` returns the Result."""

    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Stopped:
    """This process was asked to stop (SIGTERM): every rank stopped at one report."""

    at_report: int | None


@dataclass(frozen=True)
class Errored:
    """The run ends with ``err`` (``message`` says why it was not retried)."""

    err: BaseException
    message: str


Step = Running | Restarting | Resizing | Following | Reforming | Finished | Stopped | Errored


# --- how a generation ended --------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Interrupted:
    """Every rank stopped at a report: this process's SIGTERM, a resize, a new generation
    published, or a peer pod stopping the group."""

    outcomes: list[WorkerOutcome]


@dataclass(frozen=True)
class Crashed:
    err: LaunchError


GenerationEnd = Completed | Interrupted | Crashed


# --- modes ---------------------------------------------------------------------------------


class Mode(Protocol):
    """What differs between a laptop, a pod, and a KeepSurvivors pod."""

    name: str

    def interrupt(self, c: Controller, state: RunState) -> str | None:
        """Polled while a generation runs: a reason to stop every rank at its next report."""

    def after_interrupt(self, c: Controller, state: RunState, at_report: int | None) -> Step:
        """Every rank stopped at a report, and not because this process got SIGTERM."""

    def after_failure(self, c: Controller, state: RunState, err: LaunchError) -> Step:
        """A retryable failure broke the group while no stop was requested."""


class LocalMode:
    """All ranks are this machine's processes; the controller owns restarts and resizes."""

    name = "local"

    def __init__(self, failure: FailurePolicy, scaling: ScalingPolicy, use_gpu: bool) -> None:
        self.failure = failure
        self.scaling = scaling
        self.use_gpu = use_gpu
        self.pending: Resize | None = None

    def interrupt(self, c: Controller, state: RunState) -> str | None:
        if self.scaling.min_workers >= self.scaling.max_workers:
            return None
        decision = self.scaling.decide_for(
            state,
            now_s=time.monotonic(),
            available_workers=available_workers(self.scaling.max_workers, self.use_gpu),
        )
        if isinstance(decision, Resize):
            self.pending = decision
            return decision.reason
        return None

    def after_interrupt(self, c: Controller, state: RunState, at_report: int | None) -> Step:
        resize, self.pending = self.pending, None
        if resize is None:
            # Only a resize interrupts a local group; anything else is a stop.
            return Stopped(at_report)
        return Resizing(state, resize)

    def after_failure(self, c: Controller, state: RunState, err: LaunchError) -> Step:
        self.pending = None  # a resize decided before the crash is moot now
        decision = self.failure.decide(state, as_failure(err))
        if isinstance(decision, Fail):
            return Errored(err, f"{err}\n(training gave up: {decision.reason})")
        return Restarting(state, decision)


class PodMode:
    """A TorchJob pod whose job restarts all pods on a failure: fail fast, tell the operator."""

    name = "pod"

    def interrupt(self, c: Controller, state: RunState) -> str | None:
        return None

    def after_interrupt(self, c: Controller, state: RunState, at_report: int | None) -> Step:
        # A peer pod stopped the group (it was preempted): this pod ends too.
        return Stopped(at_report)

    def after_failure(self, c: Controller, state: RunState, err: LaunchError) -> Step:
        return Errored(err, str(err))


class KeepSurvivorsMode:
    """A TorchJob pod that outlives generations: it follows the job's published membership."""

    name = "keep-survivors"

    def __init__(self, watch: MembershipWatch, membership: Membership) -> None:
        self.watch = watch
        self.membership = membership
        self.next: Membership | None = None
        self.entered_s = time.monotonic()

    def interrupt(self, c: Controller, state: RunState) -> str | None:
        moved = self.watch.changed(self.membership.generation)
        if moved is None:
            return None
        self.next = moved
        return (
            f"generation {moved.generation} published: stopping all ranks at the next report "
            "to re-form the group"
        )

    def after_interrupt(self, c: Controller, state: RunState, at_report: int | None) -> Step:
        # Not this pod's SIGTERM: a peer pod was preempted, or the generation moved.
        return Following(state, "the group stopped for a membership change")

    def after_failure(self, c: Controller, state: RunState, err: LaunchError) -> Step:
        moved = self.watch.read()
        generation = self.membership.generation
        if (
            isinstance(err, WorkerGroupStartError)
            and err.waiting_for_peers
            and (moved is None or moved.generation == generation)
            and (moved is None or moved.phase not in TERMINAL_PHASES)
            and time.monotonic() - self.entered_s < FOLLOW_TIMEOUT_S
        ):
            return Reforming(state, f"the group did not form ({err}); trying again")
        peer = isinstance(err, WorkerGroupError) and err.peer_failure
        if peer or (moved is not None and moved.generation > generation):
            # A peer's loss broke the group: survive it and follow the next generation.
            return Following(state, f"the group broke ({err})", err=err)
        return Errored(err, str(err))

    def follow(self, c: Controller, why: str, view: ProgressView) -> None:
        """Wait for the next generation (raises :class:`GenerationTimeout`), then its backoff."""
        view.message(
            f"[torchjob] {why}; this pod stays and waits for generation "
            f"{self.membership.generation + 1}"
        )
        m = self.next
        if m is None or m.generation <= self.membership.generation:
            m = self.watch.wait_beyond(
                self.membership.generation, timeout_s=FOLLOW_TIMEOUT_S, stop=c.stop_requested
            )
        self.membership, self.next = m, None
        self.entered_s = time.monotonic()
        wait = min(m.backoff_left_s(), FOLLOW_TIMEOUT_S)
        if wait > 0:
            # The replacements come after the operator's backoff: forming the group earlier
            # would only spend the rendezvous timeout waiting for them.
            view.message(f"[torchjob] restart backoff: the new pods come in {wait:.0f}s")
            c.stop_requested.wait(wait)
        index = c.pod.pod_index if c.pod else 0
        view.message(
            f"[torchjob] generation {m.generation}: {m.replicas} pods, this one is pod "
            f"{index}; resuming from the latest checkpoint"
        )


# --- pure helpers --------------------------------------------------------------------------


def as_failure(err: LaunchError) -> WorkerFailure:
    """A launch error reduced to its root cause, for the failure policy."""
    if isinstance(err, WorkerDiedError):
        return WorkerFailure(err.rank, FailureKind.DIED, str(err).split(": ", 1)[-1], err.signal)
    if isinstance(err, CollectiveTimeoutError):
        return WorkerFailure(err.rank, FailureKind.TIMEOUT, "hung in a collective")
    if isinstance(err, WorkerGroupError):
        return WorkerFailure(err.rank, FailureKind.ERROR, f"{err.exc_type}: {err.message}")
    return WorkerFailure(0, FailureKind.ERROR, str(err))


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


def available_workers(max_workers: int, use_gpu: bool) -> int:
    """Workers this machine can run now: one per visible GPU, or any number of CPU processes."""
    if not use_gpu:
        return max_workers
    import torch

    return min(max_workers, torch.cuda.device_count())


def shares_result(pod: PodEnv | None) -> bool:
    """Several pods: rank 0 shares the final Result with the others (``_shared_result``)."""
    return pod is not None and pod.replicas > 1


def retryable(err: LaunchError) -> bool:
    """A corrupt checkpoint fails the same way every time: stop at once, naming its path."""
    return not (isinstance(err, WorkerGroupError) and err.exc_type == "CheckpointError")


def choose_mode(trainer: TorchTrainer, pod: PodEnv | None, endpoint: JobEndpoint | None) -> Mode:
    """The mode for where ``fit()`` runs (see the module docstring)."""
    if pod is None:
        sc = trainer.scaling_config
        return LocalMode(
            FailurePolicy(
                max_failures=trainer.run_config.failure_config.budget,
                min_workers=sc.min_workers,
                max_workers=sc.max_workers,
            ),
            ScalingPolicy(
                min_workers=sc.min_workers,
                max_workers=sc.max_workers,
                grow_cooldown_s=sc.elastic_grow_cooldown_s,
            ),
            use_gpu=sc.use_gpu,
        )
    if pod.keeps_survivors:
        if endpoint is not None:
            return KeepSurvivorsMode(
                MembershipWatch(endpoint), Membership(pod.generation, pod.replicas)
            )
        log.warning(
            "torchjob: membershipPolicy KeepSurvivors needs the pod's ServiceAccount "
            "token to follow generations; a broken group ends this pod instead"
        )
    return PodMode()


# --- the controller ------------------------------------------------------------------------


class Controller:
    """One ``fit``: carries out the steps its mode decides."""

    def __init__(self, trainer: TorchTrainer, pod: PodEnv | None) -> None:
        self.t = trainer
        self.pod = pod
        self.name, self.run_url = trainer._run_location(pod)
        self.history: list[dict[str, Any]] = []
        self.world_sizes: list[int] = []
        self.last_metrics: dict[str, Any] | None = None
        self.stop_requested = threading.Event()
        self.storage = (
            CheckpointStorage(self.run_url) if pod is None or pod.pod_index == 0 else None
        )
        endpoint = JobEndpoint.from_env(pod) if pod is not None else None
        # Pod 0's agent reports progress into the TorchJob's status (per-job ServiceAccount).
        self.job_status = (
            JobStatusReporter(endpoint)
            if endpoint is not None and pod is not None and pod.pod_index == 0
            else None
        )
        self.mode = choose_mode(trainer, pod, endpoint)

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
        )

    def _pod_now(self) -> PodEnv | None:
        """This pod as of the current generation (its env names the one it was created in)."""
        if self.pod is None or not isinstance(self.mode, KeepSurvivorsMode):
            return self.pod
        m = self.mode.membership
        return replace(self.pod, generation=m.generation, replicas=m.replicas)

    def _group(self, state: RunState) -> WorkerGroup:
        tc = self.t.torch_config
        pod = self._pod_now()
        env: dict[str, str] = {}
        if pod is not None:
            placement = Placement.from_pod_env(pod)
            n = placement.local_world_size
            env = {contract.GENERATION: str(pod.generation), contract.REPLICAS: str(pod.replicas)}
        else:
            n = state.num_workers
            placement = Placement.local(n, generation=state.generation)
        return WorkerGroup(
            n,
            backend=backend(tc.backend, pod),
            use_gpu=self.t.scaling_config.use_gpu,
            timeout_s=tc.timeout_s,
            placement=placement,
            env=env,
        )

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
            if self.job_status is not None:
                self.job_status.close()

    def _loop(self, view: ProgressView) -> Result:
        if self.storage is not None and self.storage.is_local:
            self.storage.remove_incomplete()
        step: Step = Running(
            RunState(
                num_workers=self.t.scaling_config.max_workers,
                generation_started_s=time.monotonic(),
            )
        )
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
        group = self._group(state)
        current = state
        signalled = False

        def on_event(_rank: int, event: dict[str, Any]) -> None:
            nonlocal current
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
            if signalled:
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
            group.start()
            outcomes = group.submit(run_training, (self._spec(),)).wait(
                on_event=on_event, on_tick=on_tick
            )
        except LaunchError as err:
            group.shutdown(timeout_s=0)
            return Crashed(err)
        group.shutdown(timeout_s=10)
        if any(o.stopped for o in outcomes):
            return Interrupted(outcomes)
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

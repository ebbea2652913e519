"""``TorchTrainer``: Ray Train's trainer, run by torchjob's own launcher.

``fit()`` is the controller: it forms a worker group (all local processes on a
laptop; this pod's share of the ranks inside a TorchJob pod), runs the training
function, and on a failure asks the pure policies in ``torchjob.launch.policy``
(over the shared rules of ``torchjob.plan``) what to do: restart the group from the latest committed checkpoint, shrink an
elastic group, grow it back, or give up with the root cause. In a pod, restarts
are the operator's job: a failure ends ``fit`` with an error and the next
generation's pods resume from the checkpoint.
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
from typing import Any

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
    RunState,
    ScalingPolicy,
    WorkerFailure,
    next_generation,
)
from torchjob.launch.termination import failure_message, write_termination_message
from torchjob.train._worker_loop import WorkerOutcome, WorkerSpec, run_training
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import RunConfig, ScalingConfig, TorchConfig
from torchjob.train.errors import TrainingFailedError, TrainingStoppedError
from torchjob.train.job_status import JobEndpoint, JobStatusReporter, progress_body
from torchjob.train.membership import (
    GenerationTimeout,
    Membership,
    MembershipWatch,
)
from torchjob.train.progress import ProgressView
from torchjob.train.result import Result

DEFAULT_STORAGE = "~/torchjob_results"
"""Where runs go without ``RunConfig(storage_path=...)``, as Ray uses ``~/ray_results``."""


log = logging.getLogger(__name__)

FOLLOW_TIMEOUT_S = 900.0
"""KeepSurvivors: how long a pod whose group broke waits for the operator's next generation
(restart backoff plus scheduling of the replacement pods)."""


def _as_failure(err: LaunchError) -> WorkerFailure:
    if isinstance(err, WorkerDiedError):
        return WorkerFailure(err.rank, FailureKind.DIED, str(err).split(": ", 1)[-1], err.signal)
    if isinstance(err, CollectiveTimeoutError):
        return WorkerFailure(err.rank, FailureKind.TIMEOUT, "hung in a collective")
    if isinstance(err, WorkerGroupError):
        return WorkerFailure(err.rank, FailureKind.ERROR, f"{err.exc_type}: {err.message}")
    return WorkerFailure(0, FailureKind.ERROR, str(err))


def _backend(configured: str | None, pod: PodEnv | None) -> str:
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


def _available_workers(max_workers: int, use_gpu: bool) -> int:
    """Workers this machine can run now: one per visible GPU, or any number of CPU processes."""
    if not use_gpu:
        return max_workers
    import torch

    return min(max_workers, torch.cuda.device_count())


def _retryable(err: LaunchError) -> bool:
    """A corrupt checkpoint fails the same way every time: stop at once, naming its path."""
    return not (isinstance(err, WorkerGroupError) and err.exc_type == "CheckpointError")


class TorchTrainer:
    """Runs ``train_loop_per_worker(config)`` on every worker of a torch.distributed group."""

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        torch_backend: TorchConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        datasets: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if datasets:
            raise ValueError("datasets= (Ray Data) is not supported; use prepare_data_loader")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.torch_config = torch_config or torch_backend or TorchConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = metadata or {}

    # --- where things go ------------------------------------------------------------
    def _run_location(self, pod: PodEnv | None) -> tuple[str, str]:
        """(experiment name, run directory URL)."""
        name = self.run_config.name
        if pod is not None and pod.checkpoint_path:
            return name or pod.job_name, pod.checkpoint_path.rstrip("/")
        if name is None:
            stamp = _dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
            name = f"TorchTrainer_{stamp}"
        root = self.run_config.storage_path or os.path.expanduser(DEFAULT_STORAGE)
        return name, f"{root.rstrip('/')}/{name}"

    def fit(self) -> Result:
        """Train to completion and return the :class:`Result`.

        Raises :class:`TrainingFailedError` (root cause first) when the failure
        budget is spent, :class:`TrainingStoppedError` after a SIGTERM stop.
        """
        return _Controller(self, PodEnv.from_env()).run()


class _Controller:
    """One ``fit``: generations of worker groups, decided by the policies."""

    def __init__(self, trainer: TorchTrainer, pod: PodEnv | None) -> None:
        self.t = trainer
        self.pod = pod
        self.name, self.run_url = trainer._run_location(pod)
        sc = trainer.scaling_config
        fc = trainer.run_config.failure_config
        self.failure_policy = FailurePolicy(
            max_failures=fc.budget, min_workers=sc.min_workers, max_workers=sc.max_workers
        )
        self.scaling_policy = ScalingPolicy(
            min_workers=sc.min_workers,
            max_workers=sc.max_workers,
            grow_cooldown_s=sc.elastic_grow_cooldown_s,
        )
        self.history: list[dict[str, Any]] = []
        self.world_sizes: list[int] = []
        self.last_metrics: dict[str, Any] | None = None
        self.stop_requested = threading.Event()
        self.pending_resize: Resize | None = None
        self.storage = CheckpointStorage(self.run_url) if self._is_storage_owner() else None
        endpoint = JobEndpoint.from_env(pod) if pod is not None else None
        # Pod 0's agent reports progress into the TorchJob's status (per-job ServiceAccount).
        self.job_status = (
            JobStatusReporter(endpoint)
            if endpoint is not None and pod is not None and pod.pod_index == 0
            else None
        )
        # KeepSurvivors: this pod outlives generations; it follows the job's status.
        self.watch: MembershipWatch | None = None
        self.membership: Membership | None = None
        if pod is not None and pod.keeps_survivors:
            if endpoint is None:
                log.warning(
                    "torchjob: membershipPolicy KeepSurvivors needs the pod's ServiceAccount "
                    "token to follow generations; a broken group ends this pod instead"
                )
            else:
                self.watch = MembershipWatch(endpoint)
                self.membership = Membership(pod.generation, pod.replicas)
        self.next_membership: Membership | None = None
        self.generation_entered_s = time.monotonic()

    def _is_storage_owner(self) -> bool:
        return self.pod is None or self.pod.pod_index == 0

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
        )

    def _pod_now(self) -> PodEnv | None:
        """This pod as of the current generation (its env names the one it was created in)."""
        if self.pod is None or self.membership is None:
            return self.pod
        m = self.membership
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
            backend=_backend(tc.backend, pod),
            use_gpu=self.t.scaling_config.use_gpu,
            timeout_s=tc.timeout_s,
            placement=placement,
            env=env,
        )

    def _follow(self, view: ProgressView, why: str) -> None:
        """KeepSurvivors: wait for the operator's next generation, then go on with it."""
        assert self.watch is not None and self.membership is not None
        view.message(
            f"[torchjob] {why}; this pod stays and waits for generation "
            f"{self.membership.generation + 1}"
        )
        m = self.next_membership
        if m is None or m.generation <= self.membership.generation:
            m = self.watch.wait_beyond(
                self.membership.generation, timeout_s=FOLLOW_TIMEOUT_S, stop=self.stop_requested
            )
        self.membership, self.next_membership = m, None
        self.generation_entered_s = time.monotonic()
        wait = min(m.backoff_left_s(), FOLLOW_TIMEOUT_S)
        if wait > 0:
            # The replacements come after the operator's backoff: forming the group earlier
            # would only spend the rendezvous timeout waiting for them.
            view.message(f"[torchjob] restart backoff: the new pods come in {wait:.0f}s")
            self.stop_requested.wait(wait)
        view.message(
            f"[torchjob] generation {m.generation}: {m.replicas} pods, this one is pod "
            f"{self.pod.pod_index if self.pod else 0}; resuming from the latest checkpoint"
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
        state = RunState(
            num_workers=self.t.scaling_config.max_workers, generation_started_s=time.monotonic()
        )
        if self.storage is not None and self.storage.is_local:
            self.storage.remove_incomplete()
        while True:
            pod = self._pod_now()
            self.world_sizes.append(state.num_workers if pod is None else pod.world_size)
            view.generation(state.generation, state.num_workers)
            self.pending_resize = None
            group = self._group(state)
            try:
                outcomes = self._run_generation(group, state, view)
            except LaunchError as err:
                group.shutdown(timeout_s=0)
                state = self._after_failure(err, state, view)
                continue
            group.shutdown(timeout_s=10)
            stopped = any(o.stopped for o in outcomes)
            if stopped and self.watch is not None and not self.stop_requested.is_set():
                # Not this pod's SIGTERM: a peer pod was preempted, or the generation moved.
                try:
                    self._follow(view, "the group stopped for a membership change")
                except GenerationTimeout as e:
                    self._raise_stopped_or_failed(e)
                continue
            if stopped and self.pending_resize is not None:
                resize = self.pending_resize
                view.message(f"[torchjob] {resize.reason}")
                state = next_generation(
                    state, resize.num_workers, charged=False, now_s=time.monotonic()
                )
                continue
            if stopped:
                result = self.result()
                where = result.checkpoint.path if result.checkpoint else "no checkpoint"
                text = (
                    f"training stopped on request at report {outcomes[0].stopped_at_report}; "
                    f"latest checkpoint: {where}"
                )
                if self.pod is not None:
                    write_termination_message(contract.termination_message(text))
                raise TrainingStoppedError(text, result=result)
            return self.result()

    def _run_generation(
        self, group: WorkerGroup, state: RunState, view: ProgressView
    ) -> list[WorkerOutcome]:
        group.start()
        holder = {"state": state, "signalled": False}

        def on_event(_rank: int, event: dict[str, Any]) -> None:
            if event.get("type") != "report":
                return
            self.last_metrics = event["metrics"]
            self.history.append(event["metrics"])
            if event.get("checkpoint_index") is not None:
                s = holder["state"]
                assert isinstance(s, RunState)
                holder["state"] = replace(
                    s, checkpoints_in_generation=s.checkpoints_in_generation + 1
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
            if holder["signalled"]:
                return
            if self.stop_requested.is_set():
                view.message("[torchjob] SIGTERM: stopping all ranks at the next report")
                group.signal(signal.SIGTERM)
                holder["signalled"] = True
                return
            if self.watch is not None and self.membership is not None:
                moved = self.watch.changed(self.membership.generation)
                if moved is not None:
                    view.message(
                        f"[torchjob] generation {moved.generation} published: "
                        "stopping all ranks at the next report to re-form the group"
                    )
                    self.next_membership = moved
                    group.signal(signal.SIGTERM)
                    holder["signalled"] = True
                    return
            if (
                self.pod is None
                and self.scaling_policy.min_workers < self.scaling_policy.max_workers
            ):
                s = holder["state"]
                assert isinstance(s, RunState)
                decision = self.scaling_policy.decide_for(
                    s,
                    now_s=time.monotonic(),
                    available_workers=_available_workers(
                        self.scaling_policy.max_workers, self.t.scaling_config.use_gpu
                    ),
                )
                if isinstance(decision, Resize):
                    self.pending_resize = decision
                    group.signal(signal.SIGTERM)
                    holder["signalled"] = True

        execution = group.submit(run_training, (self._spec(),))
        return execution.wait(on_event=on_event, on_tick=on_tick)

    def _raise_stopped_or_failed(self, why: GenerationTimeout) -> None:
        result = self.result()
        if self.stop_requested.is_set():
            where = result.checkpoint.path if result.checkpoint else "no checkpoint"
            raise TrainingStoppedError(
                f"training stopped on request; latest checkpoint: {where}", result=result
            )
        write_termination_message(contract.termination_message(str(why)))
        raise TrainingFailedError(str(why), cause=why, result=result)

    def _survive(self, err: LaunchError, view: ProgressView) -> bool:
        """KeepSurvivors: True when this pod is not at fault and goes on with the job's
        generation (the same one re-formed, or the next); False to end the pod."""
        if self.watch is None or self.stop_requested.is_set() or not _retryable(err):
            return False
        moved = self.watch.read()
        generation = self.membership.generation if self.membership else 0
        if (
            isinstance(err, WorkerGroupStartError)
            and err.waiting_for_peers
            and (moved is None or moved.generation == generation)
            and (moved is None or moved.phase not in TERMINAL_PHASES)
            and time.monotonic() - self.generation_entered_s < FOLLOW_TIMEOUT_S
        ):
            # A member has not come up yet (a replacement still scheduling): form the same
            # generation again.
            view.message(f"[torchjob] the group did not form ({err}); trying again")
            self.stop_requested.wait(1.0)
            return True
        peer = isinstance(err, WorkerGroupError) and err.peer_failure
        if not (peer or (moved is not None and moved.generation > generation)):
            return False
        # A peer's loss broke the group: survive it and follow the next generation.
        try:
            self._follow(view, f"the group broke ({err})")
        except GenerationTimeout:
            return False  # nothing came: end this pod with the original error
        return True

    def _after_failure(self, err: LaunchError, state: RunState, view: ProgressView) -> RunState:
        if isinstance(err, WorkerGroupStartError):
            failure = WorkerFailure(0, FailureKind.ERROR, str(err))
        else:
            failure = _as_failure(err)
        if self._survive(err, view):
            return state
        if self.pod is not None or not _retryable(err) or self.stop_requested.is_set():
            if self.pod is not None:
                # The operator decides what happens next; tell it the root cause.
                write_termination_message(failure_message(err))
            raise TrainingFailedError(str(err), cause=err, result=self.result(err)) from err
        decision = self.failure_policy.decide(state, failure)
        if isinstance(decision, Fail):
            message = f"{err}\n(training gave up: {decision.reason})"
            raise TrainingFailedError(message, cause=err, result=self.result(err)) from err
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

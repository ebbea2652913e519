"""What one ``fit`` records, and how it ends (``torchjob.train.controller``): where the run
lives, its reports and the world size of each generation, the :class:`Result` built from them
and the run's committed checkpoints, and the errors ``fit`` raises when it stops or fails
(in a pod, after writing the termination message the operator reads).
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from torchjob import contract
from torchjob.checkpoint import CheckpointError, CheckpointStorage, rank_checkpoints
from torchjob.contract import PodEnv
from torchjob.launch import LaunchError, WorkerGroupError, WorkerGroupStartError
from torchjob.launch.termination import failure_message, write_termination_message
from torchjob.train import _shared_result, teardown
from torchjob.train._spec import WorkerOutcome
from torchjob.train.checkpoint import Checkpoint
from torchjob.train.config import CheckpointConfig, RunConfig
from torchjob.train.errors import TrainingFailedError, TrainingStoppedError
from torchjob.train.result import Result

DEFAULT_STORAGE = "~/torchjob_results"
"""Where runs go without ``RunConfig(storage_path=...)``, as Ray uses ``~/ray_results``."""


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


def open_storage(url: str, *, in_pod: bool) -> CheckpointStorage:
    """The run's checkpoint storage. On an object store the bucket is checked now; in a pod a
    failure (bad credentials, a missing bucket: the error names it) is written as the
    termination message, which the operator quotes in the job's status and Events."""
    try:
        return CheckpointStorage(url)
    except CheckpointError as err:
        if in_pod:
            write_termination_message(contract.termination_message(f"CheckpointError: {err}"))
        raise


def shares_result(pod: PodEnv | None) -> bool:
    """Several pods: rank 0 shares the final Result with the others (``_shared_result``)."""
    return pod is not None and pod.replicas > 1


@dataclass
class RunRecord:
    """The reports one ``fit`` has seen, and the world size of each generation it ran."""

    run_url: str
    checkpoint_config: CheckpointConfig
    history: list[dict[str, Any]] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)
    last_metrics: dict[str, Any] | None = None

    def report(self, metrics: dict[str, Any]) -> None:
        self.last_metrics = metrics
        self.history.append(metrics)

    def result(
        self, storage: CheckpointStorage | None, error: BaseException | None = None
    ) -> Result:
        """The Result; its checkpoints are read from ``storage`` (None: not this pod's)."""
        latest = None
        best: list[tuple[Checkpoint, dict[str, Any]]] = []
        if storage is not None:
            try:
                committed = storage.list_committed()
            except Exception:  # storage may be unreachable; the result must still be built
                committed = []
            if committed:
                latest = Checkpoint(committed[-1].path)
            cc = self.checkpoint_config
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

    def final_result(
        self, storage: CheckpointStorage | None, outcomes: list[WorkerOutcome]
    ) -> Result:
        """This pod's Result; on a pod without rank 0, filled with what rank 0 shared."""
        result = self.result(storage)
        shared = next((o.shared for o in outcomes if o.shared is not None), None)
        if storage is None and shared is not None:
            return _shared_result.apply(result, shared)
        return result


def stopped(result: Result, at_report: int | None, *, in_pod: bool) -> TrainingStoppedError:
    """The error a stopped ``fit`` raises; in a pod, its termination message is written."""
    where = result.checkpoint.path if result.checkpoint else "no checkpoint"
    at = f" at report {at_report}" if at_report is not None else ""
    text = f"training stopped on request{at}; latest checkpoint: {where}"
    if in_pod:
        write_termination_message(contract.termination_message(text))
        teardown.say_exit_after_stop()  # a leaver is paid until its container ends
    # The one line a stopped run prints: uncaught, the error ends the process with this code
    # and no traceback (TrainingStoppedError is a SystemExit).
    print(
        f"[torchjob] {text} (exit code {contract.STOPPED_EXIT_CODE}: stopped as asked)",
        file=sys.stderr,
        flush=True,
    )
    return TrainingStoppedError(text, result=result)


def retryable(err: LaunchError) -> bool:
    """A corrupt checkpoint fails the same way every time: stop at once, naming its path."""
    return not (isinstance(err, WorkerGroupError) and err.exc_type == "CheckpointError")


def peers_only(err: LaunchError) -> bool:
    """This host's workers were fine: a peer never came to the group, or its loss broke it."""
    if isinstance(err, WorkerGroupStartError):
        return err.waiting_for_peers
    return isinstance(err, WorkerGroupError) and err.peer_failure


def failed(
    err: BaseException, message: str, result: Result, *, in_pod: bool
) -> TrainingFailedError:
    """The error a failed ``fit`` raises; in a pod, the termination message tells the
    operator (which decides what happens next) the root cause."""
    if in_pod:
        text = (
            failure_message(err)
            if isinstance(err, LaunchError)
            else contract.termination_message(message)
        )
        write_termination_message(text)
    return TrainingFailedError(message, cause=err, result=result)

"""The kinds of trainables a :class:`torchjob.tune.Tuner` runs, each as a function of one trial.

* a ``torchjob.train.TorchTrainer``: every trial is a fresh distributed
  ``fit()`` with the trial's ``train_loop_config`` merged in;
* :func:`DistributedTrainableCreator` (seed 001): ``train_func(config)`` on N
  worker processes of one ``torch.distributed`` group per trial;
* a :class:`Trainable` subclass (``setup``/``step``/``cleanup``), e.g.
  :class:`torchjob.sgd.PyTorchTrainable`;
* a plain function ``fn(config)`` run in the driver, reporting with ``tune.report``.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchjob.launch import WorkerGroup
from torchjob.launch.protocol import Dispatcher, TrialCheckpointed, TrialReported, ignore
from torchjob.rules.trial import merged_loop_config
from torchjob.tune import session
from torchjob.tune.session import Reporter, TrialStopped


class Trainable:
    """Class API: ``setup(config)`` once, ``step()`` per iteration (returns metrics), ``cleanup()``."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        self.setup(self.config)

    def setup(self, config: dict[str, Any]) -> None:
        """Build what the trial needs (models, data, a trainer)."""

    def step(self) -> dict[str, Any]:
        raise NotImplementedError("a Trainable must implement step()")

    def cleanup(self) -> None:
        """Release what ``setup`` built."""


@dataclass
class DistributedTrainable:
    """``train_func(config)`` on ``num_workers`` processes per trial (made by the creator below)."""

    train_func: Callable[..., Any]
    num_workers: int = 2
    use_gpu: bool = False
    backend: str = "auto"
    timeout_s: float = 300.0

    def run_trial(self, config: dict[str, Any], reporter: Reporter) -> None:
        group = WorkerGroup(
            self.num_workers, backend=self.backend, use_gpu=self.use_gpu, timeout_s=self.timeout_s
        )
        group.start()
        clean = False
        try:
            group.execute(session._set_worker_trial, str(reporter.trial_dir))

            def checkpointed(e: TrialCheckpointed) -> None:
                reporter.checkpoint = e.path

            def reported(e: TrialReported) -> None:
                reporter.report(e.metrics)  # raises to stop or prune the trial

            follow = Dispatcher[None](
                {TrialCheckpointed: checkpointed, TrialReported: reported}, otherwise=ignore
            )
            group.submit(_call_train_func, (self.train_func, config)).wait(
                on_event=lambda _rank, event: follow(event)
            )
            clean = True
        finally:
            # A stopped or pruned trial leaves workers mid-function: kill them at once.
            group.shutdown(timeout_s=10 if clean and not group.is_broken else 0)


def DistributedTrainableCreator(
    train_func: Callable[..., Any],
    num_workers: int = 2,
    use_gpu: bool = False,
    backend: str = "auto",
    timeout_s: float = 300.0,
    num_cpus_per_worker: int | None = None,
) -> DistributedTrainable:
    """Seed 001: a trainable whose trials each run ``train_func`` on ``num_workers`` processes.

    ``train_func(config, checkpoint_dir=None)`` wraps its model in
    ``DistributedDataParallel`` when :func:`is_distributed_trainable` is true,
    reports with ``torchjob.tune.report`` (rank 0's reports count) and writes
    checkpoints in :func:`distributed_checkpoint_dir`. ``num_cpus_per_worker``
    is accepted for compatibility; local workers share this machine's CPUs.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    return DistributedTrainable(train_func, num_workers, use_gpu, backend, timeout_s)


def _call_train_func(fn: Callable[..., Any], config: dict[str, Any]) -> None:
    result = fn(config)
    if isinstance(result, Mapping) and result:
        session.report(result)


def run_function(fn: Callable[..., Any], config: dict[str, Any], reporter: Reporter) -> None:
    """A function trainable in the driver; a returned dict counts as its final report."""
    session._set_reporter(reporter)
    try:
        result = fn(config)
        if isinstance(result, Mapping) and result:
            reporter.report(result)
    finally:
        session._set_reporter(None)


def run_class(cls: type[Trainable], config: dict[str, Any], reporter: Reporter) -> None:
    """``step()`` until the stop criteria or the pruner end the trial."""
    trainable = cls(config)
    try:
        while True:
            reporter.report(trainable.step())
    finally:
        trainable.cleanup()


def is_torch_trainer(obj: Any) -> bool:
    return hasattr(obj, "train_loop_per_worker") and callable(getattr(obj, "fit", None))


def _workers(resources: Mapping[str, Any]) -> int | None:
    for key in ("num_workers", "workers", "replicas"):
        if key in resources:
            n = int(resources[key])
            if n < 1:
                raise ValueError(f"resources_per_trial[{key!r}] must be >= 1, got {n}")
            return n
    return None


def with_resources(trainable: Any, resources: Mapping[str, Any]) -> Any:
    """``resources_per_trial`` applied to a distributed trainable: ``num_workers`` (or
    ``workers``) sets its processes per trial, ``gpu`` > 0 puts them on GPUs. A function or
    class trainable runs in the driver: its resources are accepted and have no effect."""
    if not resources:
        return trainable
    known = {"num_workers", "workers", "replicas", "cpu", "gpu", "use_gpu"}
    unknown = sorted(set(resources) - known)
    if unknown:
        raise ValueError(
            f"resources_per_trial: unknown key(s) {unknown}; use num_workers (or workers), "
            "gpu and cpu"
        )
    n = _workers(resources)
    gpu = resources.get("use_gpu", resources.get("gpu"))
    if isinstance(trainable, DistributedTrainable):
        changes: dict[str, Any] = {}
        if n is not None:
            changes["num_workers"] = n
        if gpu is not None:
            changes["use_gpu"] = bool(gpu)
        return dataclasses.replace(trainable, **changes)
    if is_torch_trainer(trainable):
        update: dict[str, Any] = {}
        if n is not None:
            update["num_workers"] = n
        if gpu is not None:
            update["use_gpu"] = bool(gpu)
        clone = copy.copy(trainable)
        clone.scaling_config = trainable.scaling_config.model_copy(update=update)
        return clone
    return trainable


def run_torch_trainer(
    base: Any, config: dict[str, Any], reporter: Reporter, *, name: str, storage_path: str
) -> Any:
    """One distributed ``fit()`` with the trial's config; returns its ``Result``.

    ``config["train_loop_config"]`` (and any other top-level key but
    ``scaling_config``) is merged over the trainer's ``train_loop_config``; a
    ``scaling_config`` in the config replaces the trainer's. Metrics reach the
    Tuner when ``fit()`` returns (its ``metrics_history``), so such trials run
    to the end: the pruner learns from them but cannot stop them midway.
    """
    from torchjob.train import TorchTrainer

    loop_config = merged_loop_config(base.train_loop_config, config)
    run_config = base.run_config.model_copy(
        update={"name": name, "storage_path": storage_path, "progress": False}
    )
    trainer = TorchTrainer(
        base.train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=config.get("scaling_config", base.scaling_config),
        run_config=run_config,
        torch_config=base.torch_config,
        resume_from_checkpoint=base.resume_from_checkpoint,
        metadata=base.metadata,
    )
    result = trainer.fit()
    for metrics in result.metrics_history:
        try:
            reporter.report(metrics)
        except TrialStopped:
            break  # the run already finished; keep what it reported so far
    return result


def trial_kind(trainable: Any) -> str:
    if is_torch_trainer(trainable):
        return "torch_trainer"
    if isinstance(trainable, DistributedTrainable):
        return "distributed"
    if inspect.isclass(trainable) and issubclass(trainable, Trainable):
        return "class"
    if callable(trainable):
        return "function"
    raise TypeError(
        "Tuner needs a TorchTrainer, a DistributedTrainableCreator(...), a Trainable subclass "
        f"or a function; got {type(trainable).__name__}"
    )

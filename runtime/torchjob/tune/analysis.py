"""``tune.run(...)`` and its ``ExperimentAnalysis``: the seeds' front door to the ``Tuner`` engine.

Seeds 000, 001 and 002 call ``tune.run(trainable, config=..., num_samples=...,
stop=..., resources_per_trial=..., local_dir=...)`` and read the result through
``analysis.get_best_config(metric, mode)``, ``analysis.trials`` and
``analysis.best_checkpoint``. ``run`` builds a :class:`Tuner` from those
arguments and wraps its :class:`ResultGrid`: one engine (optuna), two doors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchjob.tune.result import ERROR, ExperimentAnalysis
from torchjob.tune.tuner import RunConfig, TuneConfig, Tuner


def _pruner(scheduler: Any) -> Any:
    """``scheduler=`` of Ray's ``tune.run``: ``None``, a name, a TorchTune ``spec.pruner`` dict
    (both checked by the backend that uses them) or an optuna pruner."""
    if scheduler is None or isinstance(scheduler, str | Mapping):
        return scheduler
    try:
        import optuna

        if isinstance(scheduler, optuna.pruners.BasePruner):
            return scheduler
    except ImportError:  # pragma: no cover - optuna is a dependency
        pass
    raise ValueError(
        "tune.run(scheduler=...) takes None, a name ('median'), a TorchTune spec.pruner dict "
        "(backend='cluster') or an optuna pruner "
        f"(Ray's trial schedulers are not available); got {type(scheduler).__name__}"
    )


def run(
    run_or_experiment: Any = None,
    *,
    config: Mapping[str, Any] | None = None,
    num_samples: int = 1,
    stop: Mapping[str, float] | Callable[[dict[str, Any]], bool] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    resources_per_trial: Mapping[str, Any] | None = None,
    local_dir: str | None = None,
    storage_path: str | None = None,
    name: str | None = None,
    search_alg: Any = None,
    scheduler: Any = None,
    max_concurrent_trials: int | None = None,
    seed: int | None = None,
    verbose: int = 1,
    raise_on_failed_trial: bool = True,
    tune_config: TuneConfig | None = None,
    callbacks: list[Any] | None = None,
    **unsupported: Any,
) -> ExperimentAnalysis:
    """Ray Tune's ``tune.run``: search ``config`` with ``run_or_experiment``; see docs/sgd.md.

    ``run_or_experiment`` is anything ``Tuner`` takes (a function of ``config``,
    a ``Trainable`` subclass such as ``torchjob.sgd.PyTorchTrainable``, a
    ``DistributedTrainableCreator(...)`` or a ``TorchTrainer``), or ``None`` with
    ``tune_config=TuneConfig(backend="cluster", template=...)`` (the search is then a
    TorchTune the operator runs). ``resources_per_trial={"num_workers": 4, "gpu": 1}`` sizes
    a distributed trial (``replicas``/``nproc_per_node`` for cluster trials); ``scheduler``
    is ``"median"`` or an optuna pruner (cluster: a name or a TorchTune ``spec.pruner``
    dict); ``local_dir`` is ``storage_path``; ``callbacks`` are Ray Tune's (``tune.Callback``,
    ``MLflowLoggerCallback``, ``TBXLoggerCallback`` ...).
    Raises ``TuneError`` when a trial failed, unless ``raise_on_failed_trial=False``.
    """
    ignored = {"checkpoint_freq", "checkpoint_at_end", "keep_checkpoints_num", "progress_reporter"}
    unknown = sorted(set(unsupported) - ignored)
    if unknown:
        raise TypeError(f"tune.run() got unsupported argument(s): {', '.join(unknown)}")
    base = tune_config or TuneConfig()
    tc = TuneConfig(
        **{
            **base.__dict__,
            "metric": metric if metric is not None else base.metric,
            "mode": mode if mode is not None else base.mode,
            "num_samples": num_samples,
            "search_alg": search_alg if search_alg is not None else base.search_alg,
            "pruner": _pruner(scheduler) if scheduler is not None else base.pruner,
            "max_concurrent_trials": max_concurrent_trials or base.max_concurrent_trials,
            "seed": seed if seed is not None else base.seed,
        }
    )
    rc = RunConfig(
        name=name,
        storage_path=storage_path or local_dir,
        stop=stop,
        verbose=verbose,
        callbacks=callbacks,
    )
    tuner = Tuner(
        run_or_experiment,
        param_space=config,
        tune_config=tc,
        run_config=rc,
        resources_per_trial=resources_per_trial,
    )
    grid = tuner.fit()
    failed = [r for r in grid if r.status == ERROR]
    if failed and raise_on_failed_trial:
        raise TuneError(
            f"{len(failed)} trial(s) failed: "
            + "; ".join(f"trial {r.trial_id}: {r.error}" for r in failed[:3]),
            analysis=ExperimentAnalysis(grid, tc.metric, tc.mode),
        )
    return ExperimentAnalysis(grid, tc.metric, tc.mode)


class TuneError(RuntimeError):
    """Some trials of ``tune.run`` failed; ``analysis`` holds every trial, failed or not."""

    def __init__(self, message: str, *, analysis: ExperimentAnalysis) -> None:
        super().__init__(message)
        self.analysis = analysis

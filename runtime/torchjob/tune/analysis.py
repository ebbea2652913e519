"""``tune.run(...)`` and its ``ExperimentAnalysis``: the seeds' front door to the ``Tuner`` engine.

Seeds 000, 001 and 002 call ``tune.run(trainable, config=..., num_samples=...,
stop=..., resources_per_trial=..., local_dir=...)`` and read the result through
``analysis.get_best_config(metric, mode)``, ``analysis.trials`` and
``analysis.best_checkpoint``. ``run`` builds a :class:`Tuner` from those
arguments and wraps its :class:`ResultGrid`: one engine (optuna), two doors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchjob.tune import search
from torchjob.tune.tuner import ERROR, Result, ResultGrid, RunConfig, TuneConfig, Tuner

if TYPE_CHECKING:
    import pandas


class Trial:
    """One trial as ``analysis.trials`` lists it (Ray Tune's attribute names)."""

    def __init__(self, result: Result) -> None:
        self.result = result

    @property
    def trial_id(self) -> str:
        return self.result.trial_id

    @property
    def config(self) -> dict[str, Any]:
        return self.result.config

    @property
    def last_result(self) -> dict[str, Any]:
        return self.result.metrics

    @property
    def metric_analysis(self) -> dict[str, dict[str, float]]:
        """Per metric: ``min``, ``max``, ``avg`` and ``last`` over the trial's reports."""
        out: dict[str, dict[str, float]] = {}
        keys = {k for m in self.result.metrics_history for k in m}
        for key in sorted(keys):
            values = [
                float(m[key])
                for m in self.result.metrics_history
                if isinstance(m.get(key), int | float) and not isinstance(m.get(key), bool)
            ]
            if values:
                out[key] = {
                    "min": min(values),
                    "max": max(values),
                    "avg": sum(values) / len(values),
                    "last": values[-1],
                }
        return out

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def error(self) -> BaseException | None:
        return self.result.error

    @property
    def logdir(self) -> str:
        return self.result.path

    local_path = logdir

    @property
    def checkpoint(self) -> Any:
        return self.result.checkpoint

    def __repr__(self) -> str:
        return f"Trial({self.trial_id}, {self.status})"


class ExperimentAnalysis:
    """What ``tune.run`` returns. ``metric``/``mode`` default to those given to ``run``."""

    def __init__(self, grid: ResultGrid, metric: str | None, mode: str | None) -> None:
        self.result_grid = grid
        self.default_metric = metric
        self.default_mode = mode
        self.trials = [Trial(r) for r in grid]

    def _mm(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        metric = metric or self.default_metric
        mode = mode or self.default_mode
        if metric is None or mode not in ("min", "max"):
            raise ValueError(
                "pass metric= and mode='min'|'max' here, or to tune.run(metric=..., mode=...)"
            )
        return metric, mode

    def get_best_trial(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last"
    ) -> Trial | None:
        """The trial with the best ``metric`` (its last value, or its best with ``scope="all"``);
        ``None`` when every trial that reported it failed. A metric no trial reported is a
        mistake (a typo, the wrong key): ``ValueError`` listing the metrics they reported."""
        metric, mode = self._mm(metric, mode)
        reported = sorted(
            {
                k
                for t in self.trials
                for m in (t.result.metrics_history or [t.result.metrics])
                for k in m
            }
        )
        if self.trials and metric not in reported:
            raise ValueError(
                f"no trial reported the metric {metric!r}; the trials reported: "
                f"{', '.join(reported) or 'nothing'}"
            )
        try:
            best = self.result_grid.get_best_result(metric, mode, scope)
        except RuntimeError:
            return None
        return next(t for t in self.trials if t.result is best)

    def get_best_config(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last"
    ) -> dict[str, Any] | None:
        trial = self.get_best_trial(metric, mode, scope)
        return trial.config if trial is not None else None

    def get_best_checkpoint(
        self, trial: Trial | None = None, metric: str | None = None, mode: str | None = None
    ) -> Any:
        """The latest checkpoint of ``trial`` (default: the best trial), or ``None``."""
        trial = trial or self.get_best_trial(metric, mode)
        return trial.checkpoint if trial is not None else None

    def get_best_logdir(self, metric: str | None = None, mode: str | None = None) -> str | None:
        trial = self.get_best_trial(metric, mode)
        return trial.logdir if trial is not None else None

    def get_all_configs(self) -> dict[str, dict[str, Any]]:
        return {t.logdir: t.config for t in self.trials}

    @property
    def best_trial(self) -> Trial | None:
        return self.get_best_trial()

    @property
    def best_config(self) -> dict[str, Any] | None:
        return self.get_best_config()

    @property
    def best_checkpoint(self) -> Any:
        """The best trial's latest ``torchjob.train.Checkpoint`` (``.path``, ``as_directory()``)."""
        return self.get_best_checkpoint()

    @property
    def best_logdir(self) -> str | None:
        return self.get_best_logdir()

    @property
    def best_result(self) -> dict[str, Any] | None:
        trial = self.get_best_trial()
        return trial.last_result if trial is not None else None

    @property
    def results(self) -> dict[str, dict[str, Any]]:
        return {t.trial_id: t.last_result for t in self.trials}

    @property
    def errors(self) -> list[BaseException]:
        return self.result_grid.errors

    def dataframe(self, metric: str | None = None, mode: str | None = None) -> pandas.DataFrame:
        """One row per trial: its last metrics (or, with ``metric`` and ``mode``, the report
        where that metric was best), ``config/...`` columns, status and logdir."""
        import pandas

        rows = []
        for t in self.trials:
            row = dict(t.last_result)
            if metric is not None and mode in ("min", "max"):
                best: float | None = None
                for m in t.result.metrics_history:
                    value = m.get(metric)
                    if isinstance(value, int | float) and search.is_better(
                        float(value), best, str(mode)
                    ):
                        best, row = float(value), dict(m)
            row.update(search.flatten(t.config))
            row.update({"trial_id": t.trial_id, "status": t.status, "logdir": t.logdir})
            rows.append(row)
        return pandas.DataFrame(rows)


def _pruner(scheduler: Any) -> Any:
    """``scheduler=`` of Ray's ``tune.run``: ``None``, ``"median"`` or an optuna pruner."""
    if scheduler is None or scheduler == "median":
        return scheduler
    try:
        import optuna

        if isinstance(scheduler, optuna.pruners.BasePruner):
            return scheduler
    except ImportError:  # pragma: no cover - optuna is a dependency
        pass
    raise ValueError(
        "tune.run(scheduler=...) takes None, 'median' or an optuna pruner "
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
    **unsupported: Any,
) -> ExperimentAnalysis:
    """Ray Tune's ``tune.run``: search ``config`` with ``run_or_experiment``; see docs/sgd.md.

    ``run_or_experiment`` is anything ``Tuner`` takes (a function of ``config``,
    a ``Trainable`` subclass such as ``torchjob.sgd.PyTorchTrainable``, a
    ``DistributedTrainableCreator(...)`` or a ``TorchTrainer``), or ``None`` with
    ``tune_config=TuneConfig(backend="cluster", template=...)``.
    ``resources_per_trial={"num_workers": 4, "gpu": 1}`` sizes a distributed
    trial (``replicas``/``nproc_per_node`` for cluster trials); ``scheduler``
    is ``"median"`` or an optuna pruner; ``local_dir`` is ``storage_path``.
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
    rc = RunConfig(name=name, storage_path=storage_path or local_dir, stop=stop, verbose=verbose)
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

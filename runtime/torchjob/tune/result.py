"""What a search returns: each trial's ``Result``, the ``ResultGrid`` of a ``Tuner``, and the
``ExperimentAnalysis`` of ``tune.run``.

The lowest layer of ``torchjob.tune``: the local engine (``tuner``), the cluster study
(``study``) and the seeds' front door (``analysis``) all build these, so none of them has to
import another to return one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchjob.search.domains import flatten
from torchjob.search.metrics import is_better, metric_key, metric_value

if TYPE_CHECKING:
    import pandas

TERMINATED, PRUNED, ERROR = "TERMINATED", "PRUNED", "ERROR"


@dataclass
class Result:
    """One trial: its config, last metrics, history, checkpoint and status."""

    trial_id: str
    config: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_history: list[dict[str, Any]] = field(default_factory=list)
    path: str = ""
    status: str = TERMINATED
    error: BaseException | None = None
    checkpoint: Any = None
    """The trial's latest ``torchjob.train.Checkpoint`` (a TorchTrainer trial's, the last
    ``tune.checkpoint_dir``, or a cluster trial's ``status.progress.lastCheckpoint``), else None."""
    job_name: str | None = None
    """Cluster backend: the trial's TorchJob."""

    @property
    def metrics_dataframe(self) -> pandas.DataFrame:
        import pandas

        return pandas.DataFrame(self.metrics_history)


class ResultGrid:
    """The trials of one ``Tuner.fit()``, in the order they were started."""

    def __init__(self, results: list[Result], metric: str | None, mode: str | None) -> None:
        self._results = results
        self._metric = metric
        self._mode = mode

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> Result:
        return self._results[index]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[BaseException]:
        return [r.error for r in self._results if r.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.status == TERMINATED)

    def get_best_result(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last"
    ) -> Result:
        """The trial with the best ``metric`` (its last value, or its best with ``scope="all"``).

        Trials that failed or never reported the metric are skipped.
        """
        metric = metric or self._metric
        mode = mode or self._mode
        if metric is None or mode not in ("min", "max"):
            raise ValueError(
                "get_best_result needs a metric and mode='min'|'max' (here or in TuneConfig)"
            )
        if scope not in ("last", "all"):
            raise ValueError(f"scope must be 'last' or 'all', got {scope!r}")
        best: Result | None = None
        best_value: float | None = None
        for r in self._results:
            if r.error is not None:
                continue
            if scope == "last":
                key = metric_key(metric, r.metrics)
                values = [r.metrics[key]] if key in r.metrics else []
            else:
                values = [m[k] for m in r.metrics_history if (k := metric_key(metric, m)) in m]
            for v in values:
                fv = float(v)
                if is_better(fv, best_value, mode):
                    best, best_value = r, fv
        if best is None:
            raise RuntimeError(f"no trial reported {metric!r} without failing")
        return best

    def get_dataframe(self) -> pandas.DataFrame:
        """One row per trial: its last metrics, ``config/...`` columns, status and path."""
        import pandas

        rows = []
        for r in self._results:
            row = dict(r.metrics)
            row.update(flatten(r.config))
            row.update({"trial_id": r.trial_id, "status": r.status, "logdir": r.path})
            rows.append(row)
        return pandas.DataFrame(rows)

    @property
    def dataframe(self) -> pandas.DataFrame:
        return self.get_dataframe()


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
        mistake (a typo, the wrong key): ``ValueError`` listing the metrics they reported.
        ``validation_loss`` and ``val_loss`` find each other (``torchjob.search.metrics``)."""
        metric, mode = self._mm(metric, mode)
        reported = sorted(
            {
                k
                for t in self.trials
                for m in (t.result.metrics_history or [t.result.metrics])
                for k in m
            }
        )
        if self.trials and metric_key(metric, reported) not in reported:
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
                    value = metric_value(m, metric)
                    if isinstance(value, int | float) and is_better(float(value), best, str(mode)):
                        best, row = float(value), dict(m)
            row.update(flatten(t.config))
            row.update({"trial_id": t.trial_id, "status": t.status, "logdir": t.logdir})
            rows.append(row)
        return pandas.DataFrame(rows)

"""``Tuner``: hyperparameter search where each trial is a distributed training run.

The search is optuna's (TPE by default, or its random sampler); grid_search
leaves are expanded outside optuna into a cartesian product, each point tried
``num_samples`` times. Every report a trial makes is passed to optuna
(``trial.report``) and, when a pruner is configured, trials whose intermediate
results are worse than the median of their peers are stopped early. Trials run
one at a time by default (``max_concurrent_trials``), each on its own worker
group, so a trial's failure never touches another.

``TuneConfig(backend="cluster")`` hands the whole search to the cluster instead: ``fit``
submits it as a TorchTune (``torchjob.tune.cluster``), which the operator runs with the same
optuna samplers and pruners, every trial a TorchJob, and follows it to the end; the study
survives this process (``tune.attach(name)`` follows it again).
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchjob.search import domains
from torchjob.search.metrics import metric_key, metric_value
from torchjob.search.strategy import LOCAL_PRUNERS, LOCAL_SAMPLER_NAMES, named
from torchjob.tracking.callback import Callbacks, TrialInfo
from torchjob.tune import cluster, trainables
from torchjob.tune.result import ERROR, PRUNED, TERMINATED, Result, ResultGrid
from torchjob.tune.session import CONTINUE, PRUNE, STOP, Reporter, TrialPruned, TrialStopped

log = logging.getLogger("torchjob.tune")

DEFAULT_STORAGE = str(Path.home() / "torchjob_results")


@dataclass
class TuneConfig:
    """How to search: the metric to optimize and its ``mode``, trials, sampler, pruner."""

    metric: str | None = None
    mode: str | None = None
    """``"min"`` or ``"max"``."""
    num_samples: int = 1
    """Trials per grid point (or in all, without grid_search)."""
    search_alg: Any = "optuna"
    """``"optuna"`` (TPE), ``"random"``, or an ``optuna.samplers.BaseSampler``. Cluster backend:
    a name (``"optuna"``/``"tpe"``, ``"random"``, ``"cmaes"``; grid_search uses the grid
    sampler), as the TorchTune's ``spec.sampler.type``."""
    max_concurrent_trials: int = 1
    pruner: Any = None
    """``None``, ``"median"`` (optuna's MedianPruner) or an ``optuna.pruners.BasePruner``.
    Cluster backend: ``None``, ``"median"``, ``"asha"``, ``"hyperband"``, or the TorchTune's
    ``spec.pruner`` as a dict (``{"type": "threshold", "upper": 5.0}``)."""
    seed: int | None = None
    backend: str = "local"
    """``"local"``: trials run on this machine. ``"cluster"``: the search is a TorchTune the
    operator runs, every trial a TorchJob made from ``template`` (see docs/sgd.md)."""
    template: Any = None
    """Cluster backend: the trials' TorchJob manifest (dict, YAML path or ``Manifest``)."""
    namespace: str | None = None
    """Cluster backend: where the TorchTune and its trials go (default: the kubeconfig's)."""
    kubeconfig: str | None = None
    context: str | None = None
    cluster_prune: str = "delete"
    """Cluster backend: what ends a pruned trial's TorchJob: ``"delete"`` or ``"suspend"``
    (the TorchTune's ``spec.pruneAction``)."""
    poll_interval_s: float = 2.0
    """Cluster backend: how often ``fit`` reads the TorchTune's status while it waits."""
    trial_timeout_s: float | None = None
    """Cluster backend: each trial TorchJob's ``runPolicy.activeDeadlineSeconds``: a trial
    not finished by then fails."""


@dataclass
class RunConfig:
    """Where trials write, and when a trial is done.

    ``stop`` is ``{"training_iteration": 10, "accuracy": 0.95}`` (a trial stops
    once any reported value reaches its bound; ``training_iteration`` counts
    reports) or a function ``stop(metrics) -> bool``.
    """

    name: str | None = None
    storage_path: str | None = None
    stop: Mapping[str, float] | Callable[[dict[str, Any]], bool] | None = None
    verbose: int = 1
    callbacks: list[Any] | None = None
    """Ray Tune's callbacks (``tune.Callback``: ``MLflowLoggerCallback``, ``TBXLoggerCallback``
    ...), called in this process for every trial; one that raises is logged and skipped."""


class Tuner:
    """Search ``param_space`` with ``trainable``; see the module docstring and docs/sgd.md.

    ``trainable`` is a ``torchjob.train.TorchTrainer`` (its ``train_loop_config``
    is searched through ``param_space["train_loop_config"]``), a
    :func:`DistributedTrainableCreator` trainable, a :class:`Trainable`
    subclass (e.g. ``torchjob.sgd.PyTorchTrainable``) or a function of ``config``; with
    ``TuneConfig(backend="cluster")`` it is ``None`` (the template holds the trial's code).
    """

    def __init__(
        self,
        trainable: Any,
        *,
        param_space: Mapping[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: Any = None,
        resources_per_trial: Mapping[str, Any] | None = None,
    ) -> None:
        self.trainable = trainable
        self.param_space = dict(param_space or {})
        self.tune_config = tune_config or TuneConfig()
        self.run_config = _as_run_config(run_config)
        self.resources_per_trial = dict(resources_per_trial or {})
        tc = self.tune_config
        if tc.backend == "cluster":
            self.kind = "cluster"
            if trainable is not None:
                raise ValueError(
                    "TuneConfig(backend='cluster') runs the code of its template's containers: "
                    f"pass None as the trainable, not {type(trainable).__name__}"
                )
        elif tc.backend == "local":
            self.kind = trainables.trial_kind(trainable)
            self.trainable = trainables.with_resources(trainable, self.resources_per_trial)
        else:
            raise ValueError(f"TuneConfig.backend must be 'local' or 'cluster', got {tc.backend!r}")
        if tc.mode is not None and tc.mode not in ("min", "max"):
            raise ValueError(f"TuneConfig.mode must be 'min' or 'max', got {tc.mode!r}")
        if (tc.metric is None) != (tc.mode is None):
            raise ValueError("TuneConfig.metric and TuneConfig.mode go together")
        if tc.num_samples < 1:
            raise ValueError(f"TuneConfig.num_samples must be >= 1, got {tc.num_samples}")
        if tc.max_concurrent_trials < 1:
            raise ValueError("TuneConfig.max_concurrent_trials must be >= 1")
        if tc.pruner is not None and tc.metric is None:
            raise ValueError("a pruner needs TuneConfig.metric and mode")
        if self.kind == "cluster":
            self._manifest = self._study_manifest()
        if self.kind == "class" and self.run_config.stop is None:
            raise ValueError(
                "a Trainable class steps until a stop criterion: pass "
                "run_config=RunConfig(stop={'training_iteration': N})"
            )

    def _study(self) -> Any:
        """The optuna study of a local search (the study core's sampler, pruner and study;
        optuna is imported here, when a search starts)."""
        import optuna

        from torchjob.search import sampling

        tc = self.tune_config
        alg = tc.search_alg
        sampler: Any
        if named(LOCAL_SAMPLER_NAMES, alg):
            sampler = sampling.make_sampler(LOCAL_SAMPLER_NAMES[alg], seed=tc.seed)
        elif isinstance(alg, optuna.samplers.BaseSampler):
            sampler = alg
        else:
            raise ValueError(
                f"TuneConfig.search_alg must be 'optuna', 'random' or an optuna sampler; got {alg!r}"
            )
        if named(LOCAL_PRUNERS, tc.pruner):
            pruner: Any = sampling.make_pruner(LOCAL_PRUNERS[tc.pruner])
        elif isinstance(tc.pruner, optuna.pruners.BasePruner):
            pruner = tc.pruner
        else:
            raise ValueError(
                "TuneConfig.pruner must be None, 'median' or an optuna pruner (a TorchTune "
                f"spec.pruner dict is for backend='cluster'); got {tc.pruner!r}"
            )
        return sampling.new_study(tc.mode, sampler, pruner)

    def fit(self) -> ResultGrid:
        """Run every trial; failures are recorded in their :class:`Result`, never raised.

        Cluster backend: submit the TorchTune and wait for it (interrupting the wait leaves the
        study running; ``tune.attach(name)`` follows it again)."""
        tc = self.tune_config
        if self.kind == "cluster":
            handle = cluster.submit(
                self._manifest, namespace=tc.namespace, kubeconfig=tc.kubeconfig, context=tc.context
            )
            log.info(
                "TorchTune %s submitted; the operator runs it (tune.attach(%r) follows it again)",
                handle.name,
                handle.name,
            )
            return handle.wait(poll_interval_s=tc.poll_interval_s)
        name = self.run_config.name or f"{self.kind}_tune_{uuid.uuid4().hex[:6]}"
        root = Path(self.run_config.storage_path or DEFAULT_STORAGE).expanduser() / name
        root.mkdir(parents=True, exist_ok=True)
        optuna_study = self._study()
        lock = threading.Lock()
        self._callbacks = Callbacks(self.run_config.callbacks)
        self._callbacks.setup(stop=self.run_config.stop, num_samples=tc.num_samples)
        plan = [point for point in domains.grid(self.param_space) for _ in range(tc.num_samples)]
        results: list[Result | None] = [None] * len(plan)

        def run(index: int) -> None:
            with lock:
                otrial = optuna_study.ask()
                config = domains.resolve(self.param_space, plan[index], otrial)
            trial_id = f"{index:05d}"
            result = self._run_trial(trial_id, config, otrial, root / f"trial_{trial_id}", lock)
            results[index] = result
            with lock:
                self._tell(optuna_study, otrial, result)
            if self.run_config.verbose:
                shown = metric_value(result.metrics, tc.metric) if tc.metric else result.metrics
                log.info("trial %s %s: %s=%s", trial_id, result.status, tc.metric, shown)

        if tc.max_concurrent_trials == 1:
            for i in range(len(plan)):
                run(i)
        else:
            with ThreadPoolExecutor(max_workers=tc.max_concurrent_trials) as pool:
                for f in [pool.submit(run, i) for i in range(len(plan))]:
                    f.result()
        self._callbacks.experiment_end()
        return ResultGrid([r for r in results if r is not None], tc.metric, tc.mode)

    def _tell(self, study: Any, otrial: Any, result: Result) -> None:
        from optuna.trial import TrialState

        metric = self.tune_config.metric
        if result.status == PRUNED:
            study.tell(otrial, state=TrialState.PRUNED)
            return
        value = metric_value(result.metrics, metric) if metric else None
        if result.error is not None or value is None or not math.isfinite(float(value)):
            study.tell(otrial, state=TrialState.FAIL)
            return
        study.tell(otrial, float(value))

    def _run_trial(
        self, trial_id: str, config: dict[str, Any], otrial: Any, path: Path, lock: threading.Lock
    ) -> Result:
        path.mkdir(parents=True, exist_ok=True)
        result = Result(trial_id=trial_id, config=config, path=str(path))
        trial = TrialInfo(trial_id, config=config, local_path=str(path), trial_name=path.name)
        self._callbacks.trial_start(trial)
        metric = self.tune_config.metric
        stop = self.run_config.stop

        def on_report(metrics: dict[str, Any]) -> str:
            metrics = dict(metrics)
            metrics["training_iteration"] = len(result.metrics_history) + 1
            metrics.setdefault("trial_id", trial_id)
            result.metrics_history.append(metrics)
            result.metrics = metrics
            self._callbacks.trial_result(trial, metrics)
            key = metric_key(metric, metrics) if metric is not None else None
            if key is not None and key in metrics:
                with lock:
                    step = metrics["training_iteration"]
                    otrial.report(float(metrics[key]), step)
                    if otrial.should_prune():
                        return PRUNE
            if _should_stop(stop, metrics):
                return STOP
            return CONTINUE

        reporter = Reporter(path, on_report)
        try:
            if self.kind == "torch_trainer":
                fit_result = trainables.run_torch_trainer(
                    self.trainable,
                    config,
                    reporter,
                    name=f"trial_{trial_id}",
                    storage_path=str(path.parent),
                )
                result.checkpoint = fit_result.checkpoint
            elif self.kind == "distributed":
                self.trainable.run_trial(config, reporter)
            elif self.kind == "class":
                trainables.run_class(self.trainable, config, reporter)
            else:
                trainables.run_function(self.trainable, config, reporter)
        except TrialPruned:
            result.status = PRUNED
        except TrialStopped:
            result.status = TERMINATED
        except Exception as e:
            log.warning("trial %s failed: %s", trial_id, str(e).splitlines()[0] if str(e) else e)
            result.status = ERROR
            result.error = e
        if result.checkpoint is None and reporter.checkpoint is not None:
            from torchjob.train.checkpoint import Checkpoint

            result.checkpoint = Checkpoint(reporter.checkpoint)
        if result.checkpoint is not None:
            self._callbacks.checkpoint(trial, result.checkpoint)
        self._callbacks.trial_end(trial, failed=result.status == ERROR)
        return result

    def _study_manifest(self) -> dict[str, Any]:
        """The TorchTune of this search (checked now, so a bad setting fails before ``fit``)."""
        tc = self.tune_config
        if tc.template is None:
            raise ValueError(
                "TuneConfig(backend='cluster') needs template=: the trials' TorchJob manifest"
            )
        if tc.cluster_prune not in ("delete", "suspend"):
            raise ValueError(
                f"TuneConfig.cluster_prune must be 'delete' or 'suspend', got {tc.cluster_prune!r}"
            )
        if tc.metric is None or tc.mode is None:
            raise ValueError(
                "TuneConfig(backend='cluster') needs metric= and mode=: the TorchTune's objective"
            )
        if self.run_config.callbacks:
            raise ValueError(
                "RunConfig.callbacks: a TorchTune's trials run in their own pods; set "
                "MLFLOW_TRACKING_URI in the template's env to track each trial (docs/platform.md)"
            )
        if self.run_config.stop is not None:
            raise ValueError(
                "RunConfig.stop: a TorchTune's trials run to the end of their own script "
                "(prune them with TuneConfig.pruner, bound them with trial_timeout_s)"
            )
        return cluster.study_manifest(
            self.run_config.name or f"tune-{uuid.uuid4().hex[:6]}",
            self.param_space,
            metric=tc.metric,
            mode=tc.mode,
            template=tc.template,
            num_samples=tc.num_samples,
            search_alg=tc.search_alg,
            pruner=tc.pruner,
            max_concurrent_trials=tc.max_concurrent_trials,
            seed=tc.seed,
            prune_action=tc.cluster_prune,
            namespace=tc.namespace,
            resources=self.resources_per_trial,
            trial_timeout_s=tc.trial_timeout_s,
        )


def _should_stop(
    stop: Mapping[str, float] | Callable[[dict[str, Any]], bool] | None, metrics: dict[str, Any]
) -> bool:
    if stop is None:
        return False
    if callable(stop):
        return bool(stop(metrics))
    for key, bound in stop.items():
        value = metrics.get(key)
        if isinstance(value, int | float) and value >= bound:
            return True
    return False


def _as_run_config(run_config: Any) -> RunConfig:
    """Accept tune's RunConfig or ``torchjob.train.RunConfig`` (its name and storage_path)."""
    if run_config is None:
        return RunConfig()
    if isinstance(run_config, RunConfig):
        return run_config
    return RunConfig(
        name=getattr(run_config, "name", None),
        storage_path=getattr(run_config, "storage_path", None),
        stop=getattr(run_config, "stop", None),
        callbacks=getattr(run_config, "callbacks", None),
    )

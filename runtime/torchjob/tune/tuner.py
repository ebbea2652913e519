"""``Tuner``: hyperparameter search where each trial is a distributed training run.

The search is optuna's (TPE by default, or its random sampler); grid_search
leaves are expanded outside optuna into a cartesian product, each point tried
``num_samples`` times. Every report a trial makes is passed to optuna
(``trial.report``) and, when a pruner is configured, trials whose intermediate
results are worse than the median of their peers are stopped early. Trials run
one at a time by default (``max_concurrent_trials``), each on its own worker
group, so a trial's failure never touches another.
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
from typing import TYPE_CHECKING, Any

from torchjob.tune import cluster, search, trainables
from torchjob.tune.result import ERROR, PRUNED, TERMINATED, Result, ResultGrid
from torchjob.tune.session import CONTINUE, PRUNE, STOP, Reporter, TrialPruned, TrialStopped

if TYPE_CHECKING:
    pass

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
    """``"optuna"`` (TPE), ``"random"``, or an ``optuna.samplers.BaseSampler``."""
    max_concurrent_trials: int = 1
    pruner: Any = None
    """``None``, ``"median"`` (optuna's MedianPruner) or an ``optuna.pruners.BasePruner``."""
    seed: int | None = None
    backend: str = "local"
    """``"local"``: trials run on this machine. ``"cluster"``: every trial is a TorchJob made
    from ``template`` (see ``torchjob.tune.cluster`` and docs/sgd.md)."""
    template: Any = None
    """Cluster backend: the trials' TorchJob manifest (dict, YAML path or ``Manifest``)."""
    namespace: str | None = None
    """Cluster backend: where the trials' TorchJobs go (default: the kubeconfig's namespace)."""
    kubeconfig: str | None = None
    context: str | None = None
    cluster_prune: str = "delete"
    """Cluster backend: what ends a pruned or stopped trial's TorchJob: ``"delete"`` or ``"suspend"``."""
    poll_interval_s: float = 1.0
    """Cluster backend: how often a trial's ``status.progress`` is read."""
    trial_timeout_s: float | None = None
    """Cluster backend: a trial whose TorchJob has not finished by then fails."""
    study: bool = False
    """Cluster backend: submit the search as a TorchTune that the operator runs (it survives
    this process: ``tune.attach(name)`` follows it again) instead of driving the trials from
    here. ``search_alg`` and ``pruner`` must then be names (``"optuna"``/``"random"``,
    ``"median"``/``"asha"``/``"hyperband"``), not optuna objects."""


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


class Tuner:
    """Search ``param_space`` with ``trainable``; see the module docstring and docs/sgd.md.

    ``trainable`` is a ``torchjob.train.TorchTrainer`` (its ``train_loop_config``
    is searched through ``param_space["train_loop_config"]``), a
    :func:`DistributedTrainableCreator` trainable, a :class:`Trainable`
    subclass (e.g. ``torchjob.sgd.PyTorchTrainable``) or a function of ``config``.
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
        self._template: dict[str, Any] | None = None
        if tc.backend == "cluster":
            self.kind = "cluster"
            if tc.template is None:
                raise ValueError(
                    "TuneConfig(backend='cluster') needs template=: the trials' TorchJob manifest"
                )
            if tc.cluster_prune not in cluster.PRUNE_ACTIONS:
                raise ValueError(
                    f"TuneConfig.cluster_prune must be 'delete' or 'suspend', got {tc.cluster_prune!r}"
                )
            self._template = cluster.template_dict(tc.template)
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
        if self.kind == "class" and self.run_config.stop is None:
            raise ValueError(
                "a Trainable class steps until a stop criterion: pass "
                "run_config=RunConfig(stop={'training_iteration': N})"
            )

    def _study(self) -> Any:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        tc = self.tune_config
        alg = tc.search_alg
        sampler: Any
        if alg == "optuna":
            sampler = optuna.samplers.TPESampler(seed=tc.seed)
        elif alg == "random":
            sampler = optuna.samplers.RandomSampler(seed=tc.seed)
        elif isinstance(alg, optuna.samplers.BaseSampler):
            sampler = alg
        else:
            raise ValueError(
                f"TuneConfig.search_alg must be 'optuna', 'random' or an optuna sampler; got {alg!r}"
            )
        if tc.pruner is None:
            pruner: Any = optuna.pruners.NopPruner()
        elif tc.pruner == "median":
            pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1)
        else:
            pruner = tc.pruner
        if tc.mode == "max":
            return optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
        return optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)

    def fit(self) -> ResultGrid:
        """Run every trial; failures are recorded in their :class:`Result`, never raised."""
        tc = self.tune_config
        if self.kind == "cluster" and tc.study:
            return self._fit_study()
        name = self.run_config.name or f"{self.kind}_tune_{uuid.uuid4().hex[:6]}"
        root = Path(self.run_config.storage_path or DEFAULT_STORAGE).expanduser() / name
        root.mkdir(parents=True, exist_ok=True)
        self._name = name
        self._client: Any = None
        if self.kind == "cluster":
            from torchjob.client import TorchJobClient

            self._client = TorchJobClient(
                kubeconfig=tc.kubeconfig, context=tc.context, namespace=tc.namespace
            )
        study = self._study()
        lock = threading.Lock()
        plan = [
            point for point in search.grid_points(self.param_space) for _ in range(tc.num_samples)
        ]
        results: list[Result | None] = [None] * len(plan)

        def run(index: int) -> None:
            with lock:
                otrial = study.ask()
                config = search.resolve(self.param_space, plan[index], otrial)
            trial_id = f"{index:05d}"
            result = self._run_trial(trial_id, config, otrial, root / f"trial_{trial_id}", lock)
            results[index] = result
            with lock:
                self._tell(study, otrial, result)
            if self.run_config.verbose:
                shown = result.metrics.get(tc.metric) if tc.metric else result.metrics
                log.info("trial %s %s: %s=%s", trial_id, result.status, tc.metric, shown)

        if tc.max_concurrent_trials == 1:
            for i in range(len(plan)):
                run(i)
        else:
            with ThreadPoolExecutor(max_workers=tc.max_concurrent_trials) as pool:
                for f in [pool.submit(run, i) for i in range(len(plan))]:
                    f.result()
        return ResultGrid([r for r in results if r is not None], tc.metric, tc.mode)

    def _tell(self, study: Any, otrial: Any, result: Result) -> None:
        from optuna.trial import TrialState

        metric = self.tune_config.metric
        if result.status == PRUNED:
            study.tell(otrial, state=TrialState.PRUNED)
            return
        value = result.metrics.get(metric) if metric else None
        if result.error is not None or value is None or not math.isfinite(float(value)):
            study.tell(otrial, state=TrialState.FAIL)
            return
        study.tell(otrial, float(value))

    def _run_trial(
        self, trial_id: str, config: dict[str, Any], otrial: Any, path: Path, lock: threading.Lock
    ) -> Result:
        path.mkdir(parents=True, exist_ok=True)
        result = Result(trial_id=trial_id, config=config, path=str(path))
        metric = self.tune_config.metric
        stop = self.run_config.stop

        def on_report(metrics: dict[str, Any]) -> str:
            metrics = dict(metrics)
            # A cluster trial's reports are numbered by its runtime (status.progress.step):
            # polling may skip one, and the pruner compares trials at the same step.
            step = metrics.pop(cluster.STEP_KEY, None)
            metrics["training_iteration"] = (
                int(step) if step is not None else len(result.metrics_history) + 1
            )
            metrics.setdefault("trial_id", trial_id)
            result.metrics_history.append(metrics)
            result.metrics = metrics
            if metric is not None and metric in metrics:
                with lock:
                    step = metrics["training_iteration"]
                    otrial.report(float(metrics[metric]), step)
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
            elif self.kind == "cluster":
                self._run_cluster_trial(trial_id, config, otrial, reporter, result, lock)
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
        return result

    def _fit_study(self) -> ResultGrid:
        """Submit the search as a TorchTune and follow it to the end."""
        from torchjob.tune import study as study_mod

        tc = self.tune_config
        if tc.metric is None or tc.mode not in ("min", "max"):
            raise ValueError("TuneConfig(study=True) needs metric= and mode='min'|'max'")
        name = self.run_config.name or f"tune-{uuid.uuid4().hex[:6]}"
        manifest = study_mod.study_manifest(
            name,
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
        )
        handle = study_mod.submit(
            manifest, namespace=tc.namespace, kubeconfig=tc.kubeconfig, context=tc.context
        )
        return handle.wait(poll_interval_s=tc.poll_interval_s)

    def _run_cluster_trial(
        self,
        trial_id: str,
        config: dict[str, Any],
        otrial: Any,
        reporter: Reporter,
        result: Result,
        lock: threading.Lock,
    ) -> None:
        tc = self.tune_config
        assert self._template is not None
        manifest = cluster.trial_manifest(
            self._template,
            study=self._name,
            trial_id=trial_id,
            config=config,
            namespace=tc.namespace,
            resources=self.resources_per_trial,
        )
        result.job_name = manifest["metadata"]["name"]
        ckpt = manifest["spec"].get("checkpoint")
        if isinstance(ckpt, dict) and ckpt.get("path"):
            result.path = str(ckpt["path"])

        def recheck() -> str:
            if tc.metric is None:
                return CONTINUE
            with lock:
                return PRUNE if otrial.should_prune() else CONTINUE

        cluster.run_trial(
            self._client,
            manifest,
            reporter,
            recheck,
            poll_interval_s=tc.poll_interval_s,
            timeout_s=tc.trial_timeout_s,
            prune_action=tc.cluster_prune,
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
    )

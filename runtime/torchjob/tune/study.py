"""A tuning study the operator runs: ``tune.submit`` creates a TorchTune, ``tune.attach``
follows one by name (a notebook can close and reattach; the study lives in the cluster).

``study_manifest`` turns a Tuner-style ``param_space`` (``tune.uniform``, ``loguniform``,
``randint``, ``choice``, ``grid_search``; nested dicts become ``a/b`` names) and the
search settings into a TorchTune; :class:`Study` reads its status back as the same
``ResultGrid`` / ``ExperimentAnalysis`` a local run returns. The trials' checkpoints are the
paths their TorchJobs reported (``status.progress.lastCheckpoint``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torchjob.plan.trial import nested_config
from torchjob.tune import search
from torchjob.tune.result import ERROR, PRUNED, TERMINATED, ExperimentAnalysis, Result, ResultGrid

_SAMPLERS = {"optuna": "tpe", "tpe": "tpe", "random": "random", "grid": "grid", "cmaes": "cmaes"}
_PRUNERS = {
    None: "none",
    "none": "none",
    "median": "median",
    "asha": "successiveHalving",
    "successive_halving": "successiveHalving",
    "hyperband": "hyperband",
}


def search_space(param_space: Mapping[str, Any], prefix: str = "") -> list[dict[str, Any]]:
    """The ``spec.searchSpace`` of a Tuner ``param_space`` (constants are not searched:
    put them in the template)."""
    out: list[dict[str, Any]] = []
    for key, leaf in param_space.items():
        name = f"{prefix}{key}"
        if isinstance(leaf, Mapping):
            out += search_space(leaf, f"{name}/")
        elif isinstance(leaf, search.LogUniform):
            out.append({"name": name, "type": "loguniform", "low": leaf.low, "high": leaf.high})
        elif isinstance(leaf, search.Uniform):
            out.append({"name": name, "type": "uniform", "low": leaf.low, "high": leaf.high})
        elif isinstance(leaf, search.RandInt):
            out.append({"name": name, "type": "int", "low": leaf.low, "high": leaf.high - 1})
        elif isinstance(leaf, search.Choice):
            out.append({"name": name, "type": "categorical", "values": list(leaf.categories)})
        elif isinstance(leaf, search.GridSearch):
            out.append({"name": name, "type": "grid", "values": list(leaf.values)})
        else:
            raise ValueError(
                f"param_space[{name!r}]: a TorchTune searches tune.uniform/loguniform/randint/"
                f"choice/grid_search; put the constant {leaf!r} in the trial template instead"
            )
    return out


def study_manifest(
    name: str,
    param_space: Mapping[str, Any],
    *,
    metric: str,
    mode: str,
    template: Any,
    num_samples: int = 1,
    search_alg: str = "optuna",
    pruner: str | None = None,
    max_concurrent_trials: int = 1,
    seed: int | None = None,
    prune_action: str = "delete",
    namespace: str | None = None,
) -> dict[str, Any]:
    """The TorchTune of one search. ``template`` is a TorchJob manifest (dict, YAML path or
    ``Manifest``); its spec becomes every trial's."""
    from torchjob.tune.cluster import template_dict

    space = search_space(param_space)
    grid = any(p["type"] == "grid" for p in space)
    if not isinstance(search_alg, str) or search_alg not in _SAMPLERS:
        raise ValueError(
            f"search_alg: a TorchTune takes one of {sorted(_SAMPLERS)}, got {search_alg!r}"
        )
    if not isinstance(pruner, str | None) or pruner not in _PRUNERS:
        raise ValueError(
            f"pruner: a TorchTune takes one of {sorted(map(str, _PRUNERS))}, got {pruner!r}"
        )
    sampler: dict[str, Any] = {"type": "grid" if grid else _SAMPLERS[search_alg]}
    if seed is not None:
        sampler["seed"] = seed
    if sampler["type"] == "grid":
        # The grid sampler enumerates categorical choices too.
        size = 1
        for p in space:
            size *= len(p["values"])
        max_trials = size * num_samples
    else:
        max_trials = num_samples
    job = template_dict(template)
    meta = {k: v for k, v in (job.get("metadata") or {}).items() if k in ("labels", "annotations")}
    body: dict[str, Any] = {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchTune",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "spec": {
            "searchSpace": space,
            "objective": {"metric": metric, "mode": mode},
            "sampler": sampler,
            "pruner": {"type": _PRUNERS[pruner]},
            "parallelism": max_concurrent_trials,
            "maxTrials": max_trials,
            "pruneAction": "Suspend" if prune_action == "suspend" else "Delete",
            "trialTemplate": {
                "spec": copy.deepcopy(job["spec"]),
                **({"metadata": meta} if meta else {}),
            },
        },
    }
    return body


class StudyTrialFailed(RuntimeError):
    """A trial of a TorchTune failed; the message is the study's record of why."""


def result_grid(obj: Mapping[str, Any]) -> ResultGrid:
    """The ``ResultGrid`` of a TorchTune's status (one ``Result`` per trial, by number)."""
    from torchjob.train.checkpoint import Checkpoint

    spec = obj.get("spec") or {}
    objective = spec.get("objective") or {}
    metric, mode = str(objective.get("metric")), str(objective.get("mode", "min"))
    results = []
    for t in sorted((obj.get("status") or {}).get("trials") or [], key=lambda t: t["number"]):
        history = [
            {metric: v, "training_iteration": int(step)}
            for step, v in sorted((t.get("intermediate") or {}).items(), key=lambda kv: int(kv[0]))
        ]
        state = t.get("state")
        status = {"Succeeded": TERMINATED, "Pruned": PRUNED}.get(str(state), ERROR)
        error = None
        if state == "Failed":
            error = StudyTrialFailed(t.get("message") or "failed")
        elif state in ("Pending", "Running"):
            status = "RUNNING"
        results.append(
            Result(
                trial_id=f"{t['number']:05d}",
                config=nested_config(t.get("params") or {}),
                metrics=dict(history[-1]) if history else {},
                metrics_history=history,
                path=str(t.get("checkpoint") or ""),
                status=status,
                error=error,
                checkpoint=Checkpoint(t["checkpoint"]) if t.get("checkpoint") else None,
                job_name=t.get("name"),
            )
        )
    return ResultGrid(results, metric, mode)


class Study:
    """A TorchTune on the cluster, by name: read it, wait for it, delete it."""

    def __init__(self, name: str, client: Any) -> None:
        self.name = name
        self.client = client

    def get(self) -> dict[str, Any]:
        obj: dict[str, Any] = self.client.get(self.name)
        return obj

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def wait(self, timeout_s: float | None = None, poll_interval_s: float = 2.0) -> ResultGrid:
        return result_grid(
            self.client.wait(self.name, timeout_s=timeout_s, poll_interval_s=poll_interval_s)
        )

    def results(self) -> ResultGrid:
        return result_grid(self.get())

    def analysis(self) -> Any:
        grid = self.results()
        return ExperimentAnalysis(grid, grid._metric, grid._mode)

    def delete(self) -> None:
        self.client.delete(self.name)


def _client(namespace: str | None, kubeconfig: str | None, context: str | None) -> Any:
    from torchjob.client.tune import TuneClient

    return TuneClient(kubeconfig=kubeconfig, context=context, namespace=namespace)


def submit(
    manifest: Mapping[str, Any],
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> Study:
    """Create a TorchTune (a manifest from :func:`study_manifest`, or a YAML dict)."""
    client = _client(namespace, kubeconfig, context)
    created = client.create(manifest)
    return Study(created["metadata"]["name"], client)


def attach(
    name: str,
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> Study:
    """Reattach to a TorchTune by name (after a notebook restart, from another machine)."""
    client = _client(namespace, kubeconfig, context)
    client.get(name)  # TorchJobNotFound now rather than at the first read
    return Study(name, client)

"""A tuning study the operator runs: ``tune.submit`` creates a TorchTune, ``tune.attach``
follows one by name (a notebook can close and reattach; the study lives in the cluster).

``study_manifest`` turns a Tuner-style ``param_space`` (``tune.uniform``, ``loguniform``,
``randint``, ``choice``, ``grid_search``; nested dicts become ``a/b`` names; a constant is a
one-value ``categorical``) and the search settings into a TorchTune; it is what
``Tuner(..., TuneConfig(backend="cluster"))`` and ``tune.run`` submit. :class:`Study` reads
its status back as the same
``ResultGrid`` / ``ExperimentAnalysis`` a local run returns. The trials' checkpoints are the
paths their TorchJobs reported (``status.progress.lastCheckpoint``).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any

from torchjob.api.torchtune import ParameterType
from torchjob.rules.trial import nested_config
from torchjob.search.domains import Domain, GridSearch, leaves
from torchjob.search.space import Dimension, grid_size
from torchjob.search.strategy import PRUNER_NAMES, SAMPLER_NAMES, named
from torchjob.tune.result import ERROR, PRUNED, TERMINATED, ExperimentAnalysis, Result, ResultGrid


def dimensions(param_space: Mapping[str, Any]) -> list[Dimension]:
    """The dimensions of a Tuner ``param_space`` as a TorchTune takes them. A constant becomes
    a one-value ``categorical``: the trial's config is what the operator writes into the pod,
    so the constant must travel in the study (raises ``ValueError`` naming one that is not
    JSON)."""
    out: list[Dimension] = []
    for name, leaf in leaves(param_space):
        if isinstance(leaf, Domain | GridSearch):
            out.append(leaf.dimension(name))
        else:
            try:
                json.dumps(leaf, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(
                    f"param_space[{name!r}]: a TorchTune's values are JSON; {leaf!r} is not "
                    f"({e}): put it in the trial's code or template instead"
                ) from None
            out.append(Dimension(name, ParameterType.CATEGORICAL, values=(leaf,)))
    return out


def search_space(param_space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``spec.searchSpace`` of a Tuner ``param_space`` (see :func:`dimensions`)."""
    return [d.wire() for d in dimensions(param_space)]


def _pruner_spec(pruner: Any) -> dict[str, Any]:
    if isinstance(pruner, Mapping):
        return dict(pruner)
    if named(PRUNER_NAMES, pruner):
        return {"type": PRUNER_NAMES[pruner].value}
    raise ValueError(
        f"pruner: a TorchTune takes one of {sorted(map(str, PRUNER_NAMES))} or its spec.pruner as a "
        f"dict (e.g. {{'type': 'threshold', 'upper': 5.0}}); got {pruner!r} (an optuna pruner "
        "object runs only in this process: backend='local')"
    )


def _sized(spec: dict[str, Any], resources: Mapping[str, Any]) -> None:
    """``resources_per_trial`` (``replicas``/``workers``/``num_workers``, ``nproc_per_node``)
    over the template's sizes; ``cpu``/``gpu`` come from the template's containers."""
    for key, value in resources.items():
        if key in ("replicas", "workers", "num_workers"):
            spec["replicas"] = int(value)
            spec.pop("elastic", None)  # a size asked for per trial is a fixed size
        elif key in ("nproc_per_node", "nprocPerNode"):
            spec["nprocPerNode"] = value
        elif key not in ("cpu", "gpu"):
            raise ValueError(
                f"resources_per_trial[{key!r}]: a TorchTune's trials take replicas (or workers, "
                "num_workers) and nproc_per_node; cpu/gpu come from the template"
            )


def study_manifest(
    name: str,
    param_space: Mapping[str, Any],
    *,
    metric: str,
    mode: str,
    template: Any,
    num_samples: int = 1,
    search_alg: str = "optuna",
    pruner: str | Mapping[str, Any] | None = None,
    max_concurrent_trials: int = 1,
    seed: int | None = None,
    prune_action: str = "delete",
    namespace: str | None = None,
    resources: Mapping[str, Any] | None = None,
    trial_timeout_s: float | None = None,
) -> dict[str, Any]:
    """The TorchTune of one search. ``template`` is a TorchJob manifest (dict, YAML path or
    ``Manifest``); its spec, sized by ``resources`` and bounded by ``trial_timeout_s``
    (``runPolicy.activeDeadlineSeconds``), becomes every trial's. ``pruner`` is a name or the
    TorchTune's ``spec.pruner`` as a dict."""
    dims = dimensions(param_space)
    grid = any(d.type is ParameterType.GRID for d in dims)
    if not isinstance(search_alg, str) or search_alg not in SAMPLER_NAMES:
        raise ValueError(
            f"search_alg: a TorchTune takes one of {sorted(SAMPLER_NAMES)}, got {search_alg!r}"
        )
    sampler: dict[str, Any] = {"type": "grid" if grid else SAMPLER_NAMES[search_alg].value}
    if seed is not None:
        sampler["seed"] = seed
    # The grid sampler enumerates categorical choices too.
    max_trials = (grid_size(dims) if sampler["type"] == "grid" else 1) * num_samples
    job = template_dict(template)
    job_spec = copy.deepcopy(job.get("spec") or {})
    _sized(job_spec, resources or {})
    if trial_timeout_s is not None:
        run_policy = job_spec.setdefault("runPolicy", {})
        run_policy["activeDeadlineSeconds"] = max(1, math.ceil(trial_timeout_s))
    meta = {k: v for k, v in (job.get("metadata") or {}).items() if k in ("labels", "annotations")}
    body: dict[str, Any] = {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchTune",
        "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
        "spec": {
            "searchSpace": [d.wire() for d in dims],
            "objective": {"metric": metric, "mode": mode},
            "sampler": sampler,
            "pruner": _pruner_spec(pruner),
            "parallelism": max_concurrent_trials,
            "maxTrials": max_trials,
            "pruneAction": "Suspend" if prune_action == "suspend" else "Delete",
            "trialTemplate": {"spec": job_spec, **({"metadata": meta} if meta else {})},
        },
    }
    return body


def template_dict(template: Any) -> dict[str, Any]:
    """The template as a plain manifest dict (a copy); a YAML path is loaded and validated
    (one that names a runtime blueprint is checked by the operator, merged over it, for
    every trial)."""
    from torchjob.client.manifest import Manifest, load_manifest, read_documents

    if isinstance(template, Manifest):
        return copy.deepcopy(template.raw)
    if isinstance(template, Mapping):
        return copy.deepcopy(dict(template))
    if isinstance(template, str) or hasattr(template, "__fspath__"):
        docs = read_documents(template)
        doc = docs[0][1] if len(docs) == 1 else None
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if isinstance(spec, dict) and spec.get("runtimeRef") is not None:
            return copy.deepcopy(dict(doc or {}))
        return copy.deepcopy(load_manifest(template).raw)
    raise TypeError(
        "TuneConfig.template must be a TorchJob manifest: a dict, a YAML path or a "
        f"torchjob.client.Manifest; got {type(template).__name__}"
    )


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
    from torchjob.client.studies import TuneClient

    return TuneClient(kubeconfig=kubeconfig, context=context, namespace=namespace)


def submit(
    manifest: Mapping[str, Any],
    *,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> Study:
    """Create a TorchTune (a manifest from :func:`study_manifest`, or a YAML dict)."""
    from torchjob.client.errors import TorchJobAlreadyExists

    client = _client(namespace, kubeconfig, context)
    try:
        created = client.create(manifest)
    except TorchJobAlreadyExists as e:
        name = (manifest.get("metadata") or {}).get("name")
        raise TorchJobAlreadyExists(
            f"{e}: tune.attach({name!r}) follows it; delete it (torchjob tune delete {name}) "
            "to run the search again"
        ) from e
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

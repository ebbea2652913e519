"""The cluster backend of ``Tuner``/``tune.run``: every trial is a TorchJob.

``TuneConfig(backend="cluster", template=..., namespace=...)`` turns each trial
into a TorchJob made from ``template`` (a TorchJob manifest: dict, YAML path or
``torchjob.client.Manifest``). The trial's config travels in the
``TORCHJOB_TUNE_CONFIG`` variable of every container (JSON); a
``TorchTrainer`` in the pod merges it into its ``train_loop_config`` (see
:func:`torchjob.tune.get_trial_config`). The trial runs with all the operator's
guarantees (restarts, preemption, elasticity); rank 0's reports reach the
TorchJob's ``status.progress``, which this module polls and hands to the same
engine that runs local trials (optuna's ``report`` / ``should_prune``, the
stop criteria). A pruned or stopped trial's TorchJob is deleted (or suspended,
``TuneConfig(cluster_prune="suspend")``); the trial's checkpoint is its last
``status.progress.lastCheckpoint``.

The pure parts (:func:`trial_manifest`, :func:`trial_job_name`,
:func:`progress_report`) are unit-tested; :func:`run_trial` is the loop.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchjob import contract
from torchjob.api.models import TorchJobStatus
from torchjob.tune.session import CONTINUE, Reporter

log = logging.getLogger("torchjob.tune")

STUDY_LABEL = "torchjob.io/tune-study"
TRIAL_LABEL = "torchjob.io/tune-trial"
PRUNE_ACTIONS = ("delete", "suspend")
STEP_KEY = "_torchjob_progress_step"


class TrialJobFailed(RuntimeError):
    """The trial's TorchJob reached phase Failed (or vanished); the message says why."""


def trial_job_name(study: str, trial_id: str) -> str:
    """A DNS-1123 name for one trial's TorchJob (room left for the operator's pod suffixes)."""
    base = re.sub(r"[^a-z0-9-]+", "-", study.lower()).strip("-")[:40].strip("-") or "tune"
    return f"{base}-t{trial_id}"


def study_label(study: str) -> str:
    """The study's name as a label value (what ``-l torchjob.io/tune-study=...`` selects)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", study)[:63].strip("-_.") or "tune"


def template_dict(template: Any) -> dict[str, Any]:
    """The template as a plain manifest dict (a copy); a YAML path is loaded and validated."""
    from torchjob.client.manifest import Manifest, load_manifest

    if isinstance(template, Manifest):
        return copy.deepcopy(template.raw)
    if isinstance(template, Mapping):
        return copy.deepcopy(dict(template))
    if isinstance(template, str) or hasattr(template, "__fspath__"):
        return copy.deepcopy(load_manifest(template).raw)
    raise TypeError(
        "TuneConfig.template must be a TorchJob manifest: a dict, a YAML path or a "
        f"torchjob.client.Manifest; got {type(template).__name__}"
    )


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = [e for e in container.get("env") or [] if e.get("name") != name]
    env.append({"name": name, "value": value})
    container["env"] = env


def trial_manifest(
    template: Mapping[str, Any],
    *,
    study: str,
    trial_id: str,
    config: Mapping[str, Any],
    namespace: str | None,
    resources: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The TorchJob of one trial: the template, named and labelled for the trial, its config in
    ``TORCHJOB_TUNE_CONFIG`` of every container, its own checkpoint directory (the template's
    ``spec.checkpoint`` location + ``/<job name>``), and ``resources`` (``replicas``/``workers``,
    ``nproc_per_node``) over the template's sizes."""
    body = copy.deepcopy(dict(template))
    name = trial_job_name(study, trial_id)
    meta = body.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta.pop("resourceVersion", None)
    meta["name"] = name
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {
        **(meta.get("labels") or {}),
        STUDY_LABEL: study_label(study),
        TRIAL_LABEL: trial_id,
    }
    body.pop("status", None)
    spec = body.setdefault("spec", {})
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    if not containers:
        raise ValueError("TuneConfig.template: spec.template.spec.containers is empty")
    encoded = json.dumps(dict(config), default=str, sort_keys=True)
    for c in containers:
        _set_env(c, contract.TUNE_CONFIG, encoded)
        _set_env(c, contract.TUNE_TRIAL, trial_id)
    ckpt = spec.get("checkpoint")
    if isinstance(ckpt, dict):
        base = ckpt.get("path") or (ckpt.get("pvc") or {}).get("mountPath") or "/checkpoints"
        ckpt["path"] = f"{str(base).rstrip('/')}/{name}"
    for key, value in (resources or {}).items():
        if key in ("replicas", "workers", "num_workers"):
            spec["replicas"] = int(value)
            for bound in ("minReplicas", "maxReplicas"):
                spec.pop(bound, None)
        elif key in ("nproc_per_node", "nprocPerNode"):
            spec["nprocPerNode"] = value
        elif key not in ("cpu", "gpu"):
            raise ValueError(
                f"resources_per_trial[{key!r}]: the cluster backend understands replicas "
                "(or workers, num_workers) and nproc_per_node; cpu/gpu come from the template"
            )
    return body


@dataclass(frozen=True)
class ProgressReport:
    step: int
    metrics: dict[str, Any]
    checkpoint: str | None


def _status(job: Mapping[str, Any]) -> TorchJobStatus:
    return TorchJobStatus.parse(job.get("status"))


def progress_report(job: Mapping[str, Any]) -> ProgressReport | None:
    """The report in a TorchJob's ``status.progress`` (``None`` before the first one)."""
    progress = _status(job).progress
    if progress is None or progress.step is None:
        return None
    metrics = dict(progress.metrics or {})
    if progress.epoch is not None:
        metrics.setdefault("epoch", progress.epoch)
    return ProgressReport(step=progress.step, metrics=metrics, checkpoint=progress.last_checkpoint)


def job_phase(job: Mapping[str, Any]) -> str | None:
    phase = _status(job).phase
    return phase.value if phase is not None else None


def failure_summary(job: Mapping[str, Any]) -> str:
    status = _status(job)
    last = status.last_failure
    conds = [c for c in status.conditions or [] if c.status == "True"]
    why = (last.message or last.reason) if last else ""
    why = why or (conds[-1].message if conds else "")
    return f"TorchJob {job.get('metadata', {}).get('name')} failed: {why or 'no reason recorded'}"


@dataclass
class ClusterTrialOutcome:
    job_name: str
    checkpoint: str | None
    verdict: str
    """``continue`` (the TorchJob succeeded), ``stop`` or ``prune`` (the tuner ended it)."""


def run_trial(
    client: Any,
    manifest: dict[str, Any],
    reporter: Reporter,
    recheck: Callable[[], str],
    *,
    poll_interval_s: float = 1.0,
    timeout_s: float | None = None,
    prune_action: str = "delete",
    cancelled: threading.Event | None = None,
) -> ClusterTrialOutcome:
    """Create the trial's TorchJob and follow it to the end.

    Each new ``status.progress.step`` is one report (``reporter.report`` raises
    ``TrialStopped``/``TrialPruned`` to end the trial); between reports
    ``recheck()`` asks the pruner again, as peers finishing move the median.
    Raises :class:`TrialJobFailed` when the TorchJob fails.
    """
    from torchjob.tune.session import PRUNE, TrialStopped

    meta = manifest["metadata"]
    name, ns = meta["name"], meta.get("namespace")
    client.create(manifest, namespace=ns)
    log.info("trial TorchJob %s/%s created", ns or client.namespace, name)
    last_step = 0
    checkpoint: str | None = None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    wait = cancelled or threading.Event()
    try:
        while True:
            job = client.get(name, namespace=ns)
            report = progress_report(job)
            phase = job_phase(job)
            if report is not None and report.checkpoint:
                checkpoint = reporter.checkpoint = report.checkpoint
            if report is not None and report.step > last_step:
                last_step = report.step
                metrics = dict(report.metrics)
                metrics[STEP_KEY] = report.step
                reporter.report(metrics)  # raises TrialStopped / TrialPruned
            if phase == "Succeeded":
                return ClusterTrialOutcome(name, checkpoint, CONTINUE)
            if phase == "Failed":
                raise TrialJobFailed(failure_summary(job))
            if last_step > 0 and recheck() == PRUNE:
                from torchjob.tune.session import TrialPruned

                raise TrialPruned(f"trial pruned at progress step {last_step}")
            if deadline is not None and time.monotonic() > deadline:
                raise TrialJobFailed(f"TorchJob {name} did not finish within {timeout_s:.0f}s")
            if wait.wait(poll_interval_s):
                raise TrialStopped("the study was cancelled")
    except TrialStopped:
        _end(client, name, ns, prune_action)
        raise
    except TrialJobFailed:
        raise
    except BaseException:
        _end(client, name, ns, "delete")
        raise


def _end(client: Any, name: str, namespace: str | None, action: str) -> None:
    """Stop a trial's TorchJob: delete it (pods go with it), or suspend it (pods deleted, the
    object and its status kept)."""
    try:
        if action == "suspend":
            _suspend(client, name, namespace)
        else:
            client.delete(name, namespace=namespace, propagation="Background")
    except Exception as e:  # already gone, or the API server is away: log, never raise
        log.warning("could not %s trial TorchJob %s: %s", action, name, e)


def _suspend(client: Any, name: str, namespace: str | None) -> None:
    from torchjob.api.models import GROUP, PLURAL, VERSION

    ns = namespace or client.namespace
    client.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"runPolicy": {"suspend": True}}}
    )

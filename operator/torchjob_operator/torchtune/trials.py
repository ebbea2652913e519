"""One trial of a TorchTune: its TorchJob (name, labels, manifest) and its record's next
state from what that TorchJob shows. Pure; ``torchtune.plan`` calls it."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from typing import Any

from torchjob import contract
from torchjob.api.models import TorchJobStatus
from torchjob.api.torchtune import (
    TERMINAL_TRIAL_STATES,
    TorchTuneSpec,
    TrialRecord,
    TrialState,
)
from torchjob.rules.trial import nested_config
from torchjob.search.metrics import metric_value

STUDY_LABEL = "torchjob.io/tune-study"
TRIAL_LABEL = "torchjob.io/tune-trial"


def trial_job_name(study: str, number: int) -> str:
    return f"{study}-t{number}"


def trial_manifest(
    tune: Mapping[str, Any], spec: TorchTuneSpec, record: TrialRecord
) -> dict[str, Any]:
    """The TorchJob of one trial: the template's spec, named ``<study>-t<n>``, owned by the
    TorchTune (deleted with it), its parameters in ``TORCHJOB_TUNE_CONFIG`` of every
    container (what ``torchjob.tune.get_trial_config`` reads), its own checkpoint directory."""
    meta = tune.get("metadata") or {}
    study = str(meta.get("name"))
    template_meta = spec.trial_template.metadata
    labels = dict((template_meta.labels if template_meta else None) or {})
    labels.update({STUDY_LABEL: study, TRIAL_LABEL: str(record.number)})
    job_meta: dict[str, Any] = {
        "name": record.name,
        "namespace": meta.get("namespace"),
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": tune.get("apiVersion", "torchjob.io/v1alpha1"),
                "kind": "TorchTune",
                "name": study,
                "uid": meta.get("uid"),
                "controller": True,
            }
        ],
    }
    if template_meta and template_meta.annotations:
        job_meta["annotations"] = dict(template_meta.annotations)
    written = spec.trial_template.spec
    # With a runtime blueprint only what the template sets is the trial's (a default written
    # out would override the blueprint's value); the operator merges the rest per trial.
    job_spec = copy.deepcopy(
        written.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
        if written.runtime_ref is not None
        else written.to_wire()
    )
    encoded = json.dumps(nested_config(record.params), sort_keys=True, default=str)
    for c in ((job_spec.get("template") or {}).get("spec") or {}).get("containers") or []:
        env = [
            e
            for e in c.get("env") or []
            if e.get("name") not in (contract.TUNE_CONFIG, contract.TUNE_TRIAL)
        ]
        env += [
            {"name": contract.TUNE_CONFIG, "value": encoded},
            {"name": contract.TUNE_TRIAL, "value": str(record.number)},
        ]
        c["env"] = env
    ckpt = job_spec.get("checkpoint")
    if isinstance(ckpt, dict):
        base = ckpt.get("path") or (ckpt.get("pvc") or {}).get("mountPath") or "/checkpoints"
        ckpt["path"] = f"{str(base).rstrip('/')}/{record.name}"
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchJob",
        "metadata": job_meta,
        "spec": job_spec,
    }


def ended(job: Mapping[str, Any]) -> bool:
    """The TorchJob is going or suspended: a prune already took effect."""
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    return bool(meta.get("deletionTimestamp")) or bool((spec.get("runPolicy") or {}).get("suspend"))


def live(job: Mapping[str, Any]) -> bool:
    """The TorchJob still runs (or waits to): neither finished nor ended by us."""
    phase = (job.get("status") or {}).get("phase")
    return not ended(job) and phase not in ("Succeeded", "Failed")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return None if math.isnan(v) else v


def observe_trial(
    record: TrialRecord, job: Mapping[str, Any] | None, metric: str, now: str
) -> TrialRecord:
    """The record after looking at its TorchJob (forward moves only). The objective is
    ``metric`` as reported, or its alias (``torchjob.search.metrics``)."""
    r = record.model_copy(deep=True)
    if r.state in TERMINAL_TRIAL_STATES:
        # A trial's last checkpoint can reach its TorchJob's status after the job ended (the
        # agent's final progress write races its pod's exit): a finished trial still takes it.
        if r.state is TrialState.SUCCEEDED and job is not None:
            late = TorchJobStatus.parse(job.get("status")).progress
            if late is not None and late.last_checkpoint:
                r.checkpoint = late.last_checkpoint
        return r
    if job is None:
        if r.state is TrialState.RUNNING:
            r.state, r.message, r.completion_time = (
                TrialState.FAILED,
                "its TorchJob was deleted",
                now,
            )
        return r
    if r.state is TrialState.PENDING:
        r.state = TrialState.RUNNING
    status = TorchJobStatus.parse(job.get("status"))
    if status.losses:
        r.losses = dict(status.losses)
    progress = status.progress
    if progress is not None and progress.step is not None and progress.step > (r.step or 0):
        metrics = dict(progress.metrics or {})
        r.step = progress.step
        value = _number(metric_value(metrics, metric))
        if value is not None:
            r.value = value
            r.intermediate = {**(r.intermediate or {}), str(progress.step): value}
    if progress is not None and progress.last_checkpoint:
        r.checkpoint = progress.last_checkpoint
    phase = status.phase.value if status.phase is not None else None
    if phase == "Succeeded":
        r.completion_time = now
        if r.value is None:
            reported = sorted((progress.metrics or {}) if progress else {})
            r.state = TrialState.FAILED
            r.message = (
                f"the trial succeeded without reporting the objective metric {metric!r}; "
                f"it reported: {', '.join(reported) or 'nothing'}"
            )
        else:
            r.state = TrialState.SUCCEEDED
    elif phase == "Failed":
        r.state, r.completion_time = TrialState.FAILED, now
        last = status.last_failure
        r.message = "its TorchJob failed" + (f": {last.message or last.reason}" if last else "")
    return r


__all__ = [
    "STUDY_LABEL",
    "TRIAL_LABEL",
    "ended",
    "live",
    "observe_trial",
    "trial_job_name",
    "trial_manifest",
]

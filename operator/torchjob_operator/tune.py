"""Reconcile one TorchTune: read it and its trial TorchJobs, ask the study planner, write.

The decisions are ``planner.study.plan_study``'s; this module does the I/O in the order that
makes them exactly-once: first the status (with the object's resourceVersion, so a stale
read loses with a 409 instead of overwriting a newer record), then the TorchJobs it records
(create is idempotent, AlreadyExists is success), then the prunes (delete or suspend, both
idempotent). A crash between any two steps is repaired by the next reconcile, which finds
the records and repeats the missing actions.

Trial TorchJobs are read from the operator's read cache (kopf's TorchJob watch keeps them
there, and their events poke the study: no polling). A recorded, unfinished trial whose
TorchJob the cache does not show is read live once before it is judged gone: right after a
restart the cache may not have listed it yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, cast
from urllib.parse import quote

from kubernetes.client.exceptions import ApiException

from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob.api.tune import PLURAL as TUNE_PLURAL
from torchjob.api.tune import TERMINAL_TRIAL_STATES, TrialState
from torchjob_operator.engine.cached import CachedKube
from torchjob_operator.engine.client import KubeClient
from torchjob_operator.engine.kube import KubeError

log = logging.getLogger("torchjob_operator.tune")

COMPONENT = "torchjob-operator"


@dataclass
class StudyOutcome:
    gone: bool = False
    requeue_after_s: float | None = None


def _tune_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{TUNE_PLURAL}/{quote(name)}{sub}"


def get_tune(live: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj = live.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, TUNE_PLURAL, name)
        return cast(dict[str, Any], obj)
    except ApiException as e:
        if e.status == 404:
            return None
        raise KubeError("get", f"torchtune {namespace}/{name}", e) from e


def list_tunes(live: KubeClient, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
    return live.list_keys(TUNE_PLURAL, namespaces)


def _write_status(live: KubeClient, tune: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Merge-patch the status, guarded by the resourceVersion read: False on a conflict."""
    meta = tune["metadata"]
    body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": dict(status)}
    try:
        live._send(
            "PATCH",
            _tune_path(meta["namespace"], meta["name"], "/status"),
            body,
            "application/merge-patch+json",
        )
        return True
    except ApiException as e:
        if e.status in (404, 409):
            return False
        raise KubeError(
            "patch status of", f"torchtune {meta['namespace']}/{meta['name']}", e
        ) from e


def _create_job(live: KubeClient, body: dict[str, Any]) -> None:
    ns = body["metadata"]["namespace"]
    try:
        live._send("POST", f"/apis/{GROUP}/{VERSION}/namespaces/{quote(ns)}/{PLURAL}", body)
    except ApiException as e:
        if e.status != 409:
            raise KubeError("create", f"torchjob {ns}/{body['metadata']['name']}", e) from e


def _suspend_job(live: KubeClient, namespace: str, name: str) -> None:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}"
    try:
        live._send(
            "PATCH",
            path,
            {"spec": {"runPolicy": {"suspend": True}}},
            "application/merge-patch+json",
        )
    except ApiException as e:
        if e.status != 404:
            raise KubeError("suspend", f"torchjob {namespace}/{name}", e) from e


def _trial_jobs(
    kube: CachedKube, namespace: str, tune: Mapping[str, Any]
) -> dict[str, dict[str, Any] | None]:
    jobs: dict[str, dict[str, Any] | None] = {}
    for record in (tune.get("status") or {}).get("trials") or []:
        name = str(record.get("name"))
        job = kube.store.job((namespace, name))
        if job is None and record.get("state") not in {s.value for s in TERMINAL_TRIAL_STATES}:
            job = kube.live.get_job(namespace, name)
        jobs[name] = job
    return jobs


def reconcile_study(
    kube: CachedKube, namespace: str, name: str, now: datetime | None = None
) -> StudyOutcome:
    # Lazily: optuna costs 15 MiB of RSS, which an operator without studies never pays.
    from torchjob_operator.planner.study import plan_study

    live = kube.live
    assert isinstance(live, KubeClient)
    tune = get_tune(live, namespace, name)
    if tune is None or (tune.get("metadata") or {}).get("deletionTimestamp"):
        return StudyOutcome(gone=True)
    plan = plan_study(tune, _trial_jobs(kube, namespace, tune), now or datetime.now(timezone.utc))
    if plan.status != (tune.get("status") or {}) and not _write_status(live, tune, plan.status):
        log.info("[%s/%s] status conflict: reading it again", namespace, name)
        return StudyOutcome(requeue_after_s=0.0)
    for body in plan.create:
        _create_job(live, body)
        log.info("[%s/%s] trial TorchJob %s created", namespace, name, body["metadata"]["name"])
    action = (tune.get("spec") or {}).get("pruneAction", "Delete")
    for job in plan.prune:
        if action == "Suspend":
            _suspend_job(live, namespace, job)
        else:
            live.delete_job(namespace, job)
        log.info("[%s/%s] trial TorchJob %s pruned (%s)", namespace, name, job, action.lower())
    for job in plan.stop:
        live.delete_job(namespace, job)
    for type_, reason, message in plan.events:
        live.post_event(tune, type_=type_, reason=reason, message=message, component=COMPONENT)
    return StudyOutcome(requeue_after_s=plan.requeue_after_s)


def study_of_job(job: Mapping[str, Any]) -> str | None:
    """The TorchTune that owns a trial TorchJob (its controller ownerReference)."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("kind") == "TorchTune"
            and ref.get("controller")
            and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/")
        ):
            return str(ref.get("name"))
    return None


__all__ = [
    "StudyOutcome",
    "TrialState",
    "get_tune",
    "list_tunes",
    "reconcile_study",
    "study_of_job",
]

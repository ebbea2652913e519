"""Read one TorchTune and its trial TorchJobs into one view (``StudyView``).

Trial TorchJobs are read from the operator's read cache (kopf's TorchJob watch keeps them
there, and their events poke the study: no polling). A recorded, unfinished trial whose
TorchJob the cache does not show is read live once before it is judged gone: right after a
restart the cache may not have listed it yet. The TorchTune itself is read live.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchjob.api.models import GROUP
from torchjob.api.torchtune import TERMINAL_TRIAL_STATES
from torchjob_operator.engine.cached import CachedKube

_TERMINAL = frozenset(s.value for s in TERMINAL_TRIAL_STATES)


@dataclass(frozen=True)
class StudyView:
    """What the study planner is given: the TorchTune, and each recorded trial's TorchJob
    (None: not there)."""

    tune: dict[str, Any]
    jobs: dict[str, dict[str, Any] | None]

    @property
    def namespace(self) -> str:
        return str(self.tune["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.tune["metadata"]["name"])


def observe(kube: CachedKube, namespace: str, name: str) -> StudyView | None:
    """The study as it is now; None when it is gone or being deleted (its trial TorchJobs
    go with it, by their ownerReferences)."""
    tune = kube.get_tune(namespace, name)
    if tune is None or (tune.get("metadata") or {}).get("deletionTimestamp"):
        return None
    return StudyView(tune=tune, jobs=_trial_jobs(kube, namespace, tune))


def _trial_jobs(
    kube: CachedKube, namespace: str, tune: Mapping[str, Any]
) -> dict[str, dict[str, Any] | None]:
    jobs: dict[str, dict[str, Any] | None] = {}
    for record in (tune.get("status") or {}).get("trials") or []:
        name = str(record.get("name"))
        job = kube.store.job((namespace, name))
        if job is None and record.get("state") not in _TERMINAL:
            job = kube.live.get_job(namespace, name)
        jobs[name] = job
    return jobs


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


__all__ = ["StudyView", "observe", "study_of_job"]

"""Fluent builders for planner tests: ``job("a").replicas(4).build()``, ``pod(0).running()``."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from torchjob.api.models import TorchJobSpec
from torchjob.contract import PodEnv
from torchjob_operator.torchjob.observed import JobState, PodPhase, PodView
from torchjob_operator.torchjob.plan import JobView

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class JobBuilder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.spec: dict[str, Any] = {
            "replicas": 2,
            "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
        }
        self.status: dict[str, Any] = {}

    def replicas(self, n: int) -> JobBuilder:
        self.spec["replicas"] = n
        return self

    def elastic(self, lo: int, hi: int) -> JobBuilder:
        self.spec["elastic"] = {"minReplicas": lo, "maxReplicas": hi}
        return self

    def max_restarts(self, n: int, **policy: Any) -> JobBuilder:
        self.spec["failurePolicy"] = {"maxRestarts": n, **policy}
        return self

    def keep_survivors(self) -> JobBuilder:
        self.spec["membershipPolicy"] = "KeepSurvivors"
        return self

    def run_policy(self, **policy: Any) -> JobBuilder:
        self.spec["runPolicy"] = policy
        return self

    def with_status(self, **status: Any) -> JobBuilder:
        self.status.update(status)
        return self

    def build(self) -> JobView:
        return JobView(
            name=self.name,
            namespace="ns",
            spec=TorchJobSpec.model_validate(self.spec),
            state=JobState.from_status(self.status),
            metadata_generation=1,
        )


def job(name: str = "tj") -> JobBuilder:
    return JobBuilder(name)


def pod(index: int, generation: int = 0, job_name: str = "tj") -> PodView:
    return PodView(name=f"{job_name}-worker-{index}", index=index, generation=generation)


def running(p: PodView) -> PodView:
    return replace(p, phase=PodPhase.RUNNING, ready=True, scheduled=True)


def succeeded(p: PodView) -> PodView:
    return replace(p, phase=PodPhase.SUCCEEDED, exit_code=0, scheduled=True)


def failed(p: PodView, code: int = 1, at_s: float = 0.0) -> PodView:
    return replace(
        p,
        phase=PodPhase.FAILED,
        exit_code=code,
        reason="Error",
        scheduled=True,
        finished_at=at(at_s),
    )


def preempted(p: PodView, reason: str = "PreemptionByScheduler") -> PodView:
    return replace(p, phase=PodPhase.FAILED, exit_code=137, disruption=reason, scheduled=True)


TRIAL_TEMPLATE: dict[str, Any] = {
    "spec": {
        "replicas": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "image": "t:1"}]}},
    }
}


def torchtune(
    search_space: list[dict[str, Any]], metadata: dict[str, Any], **spec: Any
) -> dict[str, Any]:
    """A TorchTune manifest minimizing ``loss`` over ``search_space``; ``spec`` overrides."""
    body: dict[str, Any] = {
        "searchSpace": search_space,
        "objective": {"metric": "loss", "mode": "min"},
        "trialTemplate": copy.deepcopy(TRIAL_TEMPLATE),
        **spec,
    }
    return {
        "apiVersion": "torchjob.io/v1alpha1",
        "kind": "TorchTune",
        "metadata": metadata,
        "spec": body,
    }


def pod_env(**kw: Any) -> PodEnv:
    """A worker pod's env contract (pod 1 of 2, generation 0), with ``kw`` changed."""
    fields: dict[str, Any] = dict(
        job_name="job",
        namespace="ns",
        pod_index=1,
        replicas=2,
        nproc_per_node=1,
        generation=0,
        rdzv_host="job-worker-0.job.ns.svc",
    )
    fields.update(kw)
    return PodEnv(**fields)

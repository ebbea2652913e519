"""Runtime blueprints: what a platform team sets once, for TorchJobs to start from.

Two kinds of the same shape, generated into ``crds/`` by ``make crds``:
``ClusterTorchRuntime`` (cluster-scoped, ``kubectl get ctjrt``) and ``TorchRuntime`` (in one
namespace, ``kubectl get tjrt``). Their names differ from Kubeflow Trainer's
``ClusterTrainingRuntime`` / ``TrainingRuntime`` so that both can be installed.

A blueprint's spec holds the parts of a TorchJob spec that a platform team owns: the pod
template (image, resources, tolerations, volumes, env), ``nprocPerNode``, the backend, the
elastic, failure, run and membership policies, checkpoint and scheduling defaults. Every field
has the TorchJob's own type; none has a default here, so that what a blueprint leaves out
stays the job's (or the TorchJob's default). A job names one with ``spec.runtimeRef``; the
merge and its precedence are ``torchjob.api.merge``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from torchjob.api.models import (
    MAX_NPROC_PER_NODE,
    Backend,
    CheckpointSpec,
    ElasticPolicy,
    FailurePolicy,
    MembershipPolicy,
    ObjectMeta,
    Placement,
    PodTemplateSpec,
    RunPolicy,
    SchedulingSpec,
    _Model,
)
from torchjob.api.models.runtime_ref import RuntimeKind

KIND = RuntimeKind.TORCH_RUNTIME.value
PLURAL = "torchruntimes"
SINGULAR = "torchruntime"
SHORT_NAMES = ["tjrt"]

CLUSTER_KIND = RuntimeKind.CLUSTER_TORCH_RUNTIME.value
CLUSTER_PLURAL = "clustertorchruntimes"
CLUSTER_SINGULAR = "clustertorchruntime"
CLUSTER_SHORT_NAMES = ["ctjrt"]

PLURALS = {RuntimeKind.TORCH_RUNTIME: PLURAL, RuntimeKind.CLUSTER_TORCH_RUNTIME: CLUSTER_PLURAL}


class TorchRuntimeSpec(_Model):
    """The blueprint: a TorchJob spec without the per-job parts (replicas, runtimeRef).
    Unset fields are left to the job."""

    template: PodTemplateSpec | None = Field(
        default=None,
        description=(
            "Pod template of every worker. A job's containers, env, volumes and volumeMounts "
            "are merged into it by name (mountPath for volumeMounts)."
        ),
    )
    nproc_per_node: (
        Annotated[int, Field(ge=1, le=MAX_NPROC_PER_NODE)] | Literal["gpu", "auto"] | None
    ) = Field(
        default=None,
        description="Training processes per pod: an integer, 'gpu' or 'auto'.",
    )
    backend: Backend | None = None
    membership_policy: MembershipPolicy | None = None
    elastic: ElasticPolicy | None = None
    failure_policy: FailurePolicy | None = None
    run_policy: RunPolicy | None = None
    checkpoint: CheckpointSpec | None = None
    scheduling: SchedulingSpec | None = None
    placement: Placement | None = None


class TorchRuntime(_Model):
    """A namespaced blueprint, for the TorchJobs of its namespace."""

    api_version: Literal["torchjob.io/v1alpha1"] = "torchjob.io/v1alpha1"
    kind: Literal["TorchRuntime"] = "TorchRuntime"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TorchRuntimeSpec


class ClusterTorchRuntime(_Model):
    """A cluster-scoped blueprint, for the TorchJobs of every namespace."""

    api_version: Literal["torchjob.io/v1alpha1"] = "torchjob.io/v1alpha1"
    kind: Literal["ClusterTorchRuntime"] = "ClusterTorchRuntime"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TorchRuntimeSpec


__all__ = [
    "CLUSTER_KIND",
    "CLUSTER_PLURAL",
    "CLUSTER_SHORT_NAMES",
    "CLUSTER_SINGULAR",
    "KIND",
    "PLURAL",
    "PLURALS",
    "SHORT_NAMES",
    "SINGULAR",
    "ClusterTorchRuntime",
    "RuntimeKind",
    "TorchRuntime",
    "TorchRuntimeSpec",
]

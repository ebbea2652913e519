"""The spec of a TorchJob: what the user asks for (its policies are ``policies``, its
choices and the defaults of its immutable fields ``choices``).

The CEL rules of each model and the Python checks of its validator come from one table,
``torchjob.api.models.rules``.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from torchjob.api.models import choices
from torchjob.api.models.base import CEL, _Model
from torchjob.api.models.choices import MANAGED_BY_PATTERN, Backend, MembershipPolicy
from torchjob.api.models.initializers import InitializersSpec
from torchjob.api.models.limits import (
    GPU_RESOURCE,
    MAX_NPROC_PER_NODE,
    MAX_PATH,
    MAX_REPLICAS,
    parse_quantity,
)
from torchjob.api.models.placement import Placement
from torchjob.api.models.policies import ElasticPolicy, FailurePolicy, RunPolicy
from torchjob.api.models.rules import cel_of, enforce
from torchjob.api.models.runtime_ref import RuntimeRef
from torchjob.api.models.template import PodTemplateSpec


class PvcSource(_Model):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        json_schema_extra={CEL: cel_of("PvcSource", "claimName")},
    )
    mount_path: str = Field(
        default=choices.CHECKPOINT_MOUNT_PATH,
        min_length=2,
        max_length=MAX_PATH,
        json_schema_extra={CEL: cel_of("PvcSource", "mountPath")},
    )

    @model_validator(mode="after")
    def _rules(self) -> PvcSource:
        enforce("PvcSource", self)
        return self


class CheckpointSpec(_Model):
    """Where rank 0 writes checkpoints. Only rank 0 needs access; others get state by broadcast."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("CheckpointSpec")})

    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH,
        description="Local path in the pod or fsspec URL (s3://, gs://).",
    )
    pvc: PvcSource | None = Field(
        default=None, description="A PersistentVolumeClaim mounted into every worker."
    )

    @model_validator(mode="after")
    def _rules(self) -> CheckpointSpec:
        enforce("CheckpointSpec", self)
        return self

    @property
    def location(self) -> str:
        """The path the runtime writes to: ``path``, or the PVC's mount path."""
        if self.path:
            return self.path
        return self.pvc.mount_path if self.pvc is not None else ""


class GangScheduler(str, Enum):
    """Which scheduler's PodGroup holds the job's pods until all of them fit."""

    COSCHEDULING = "Coscheduling"
    """scheduler-plugins' coscheduling plugin: scheduling.x-k8s.io/v1alpha1 PodGroup."""
    VOLCANO = "Volcano"
    """Volcano: scheduling.volcano.sh/v1beta1 PodGroup."""


class GangSpec(_Model):
    """Gang scheduling: the operator keeps a PodGroup named after the job whose minMember is
    the size of the generation it creates (all of its pods, or none, are scheduled)."""

    pod_group: GangScheduler = Field(
        description="Coscheduling (scheduler-plugins) or Volcano: whose PodGroup to create."
    )
    schedule_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="Coscheduling only: how long the scheduler waits for the whole group.",
    )
    queue: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="Volcano only: the Volcano Queue of the PodGroup (Volcano's default if unset).",
    )


class SchedulingSpec(_Model):
    scheduler_name: str | None = Field(
        default=None,
        min_length=1,
        description="e.g. volcano, or a custom scheduler (any string, as a Pod's schedulerName).",
    )
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        json_schema_extra={CEL: cel_of("SchedulingSpec", "priorityClassName")},
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description=(
            "Kueue LocalQueue (as the kueue.x-k8s.io/queue-name label of the TorchJob): the "
            "job's Workload queues there and no pod runs before it is admitted."
        ),
        json_schema_extra={CEL: cel_of("SchedulingSpec", "queueName")},
    )
    gang: GangSpec | None = Field(
        default=None,
        description=(
            "Gang scheduling through a PodGroup (docs/fits-your-cluster.md); set schedulerName "
            "to the scheduler that reads it."
        ),
    )

    @model_validator(mode="after")
    def _rules(self) -> SchedulingSpec:
        enforce("SchedulingSpec", self)
        return self


class TorchJobSpec(_Model):
    model_config = ConfigDict(json_schema_extra={CEL: cel_of("TorchJobSpec")})

    replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Desired number of worker pods.")
    elastic: ElasticPolicy | None = Field(
        default=None,
        description="Elastic bounds; without it the job runs exactly `replicas` workers.",
    )
    nproc_per_node: Annotated[int, Field(ge=1, le=MAX_NPROC_PER_NODE)] | Literal["gpu", "auto"] = (
        Field(
            default=choices.NPROC_PER_NODE,
            description="Training processes per pod: an integer, 'gpu' (GPUs requested per pod) or 'auto'.",
            json_schema_extra={CEL: cel_of("TorchJobSpec", "nprocPerNode")},
        )
    )
    backend: Backend = Field(
        default=choices.BACKEND,
        description="torch.distributed backend: auto (nccl with GPUs, else gloo), nccl or gloo.",
    )
    membership_policy: MembershipPolicy = Field(
        default=choices.MEMBERSHIP_POLICY,
        description=(
            "What a failure or disruption does to the pods that are still fine: RecreateGroup "
            "(any image) or KeepSurvivors (the torchjob runtime in the pods re-forms the group)."
        ),
    )
    template: PodTemplateSpec = Field(description="Pod template of every worker.")
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    checkpoint: CheckpointSpec | None = None
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    placement: Placement | None = None
    runtime_ref: RuntimeRef | None = Field(
        default=None,
        description=(
            "A runtime blueprint (TorchRuntime or ClusterTorchRuntime) this spec overrides: "
            "what the job leaves out comes from it (docs/platform.md, Runtime blueprints). "
            "Resolved once, when the job starts; status.runtime records which and its version."
        ),
    )
    managed_by: str = Field(
        default=choices.MANAGED_BY,
        max_length=63,
        pattern=MANAGED_BY_PATTERN,
        description=(
            "The controller that runs this job, as batch/v1 Job's managedBy: left out (or "
            f"{choices.MANAGED_BY}), the torchjob operator; any other value (e.g. "
            "kueue.x-k8s.io/multikueue, which mirrors the job to a worker cluster and copies "
            "its status back), another controller, and the operator creates no pod and writes "
            "no status for it. Immutable."
        ),
    )
    initializers: InitializersSpec | None = Field(
        default=None,
        description="A dataset and/or a model fetched once, on CPU pods, into a volume every "
        "worker mounts, before any worker starts (docs/platform.md, Initialisers).",
    )

    @model_validator(mode="after")
    def _rules(self) -> TorchJobSpec:
        enforce("TorchJobSpec", self)
        return self

    @property
    def min_replicas(self) -> int:
        return self.elastic.min_replicas if self.elastic else self.replicas

    @property
    def max_replicas(self) -> int:
        return self.elastic.max_replicas if self.elastic else self.replicas

    @property
    def standby_replicas(self) -> int:
        """Warm standby pods kept beside the workers (``elastic.standbyReplicas``, KeepSurvivors)."""
        if self.elastic is None or self.membership_policy != MembershipPolicy.KEEP_SURVIVORS:
            return 0
        return self.elastic.standby_replicas

    def gpus_per_pod(self) -> int:
        """GPUs the first container asks for (limits, else requests)."""
        resources = self.template.spec.containers[0].resources or {}
        for key in ("limits", "requests"):
            value = (resources.get(key) or {}).get(GPU_RESOURCE)
            if value is not None:
                return int(parse_quantity(value))
        return 0

    def resolved_nproc_per_node(self) -> int:
        """Processes per pod: 'gpu'/'auto' mean one per requested GPU (at least one)."""
        if isinstance(self.nproc_per_node, int):
            return self.nproc_per_node
        return max(1, self.gpus_per_pod())

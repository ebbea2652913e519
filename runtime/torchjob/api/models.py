"""Pydantic models of the TorchJob custom resource: the single source of truth.

The CRD in ``crds/`` is generated from these models (``make crds``, see
``torchjob.api.crd``); the operator parses every object with them, and the
runtime and CLI validate manifests with them. Python attribute names are
snake_case; the wire format (and the CRD) is camelCase, as Kubernetes expects.

Cross-field rules that the API server must enforce are written here as CEL
rules (``x-kubernetes-validations``) next to the fields they constrain, with
messages a person understands. The same rules are checked in Python by model
validators, so ``torchjob run -f job.yaml`` rejects what the cluster would.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from torchjob.contract import GROUP as GROUP  # one definition: the label prefix too

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TorchJob"
PLURAL = "torchjobs"
SINGULAR = "torchjob"
SHORT_NAMES = ["tj"]

CEL = "x-kubernetes-validations"


def _cel(rule: str, message: str, **extra: str) -> Any:
    """One CEL rule for ``x-kubernetes-validations`` (typed Any: pydantic wants JsonValue)."""
    return {"rule": rule, "message": message, **extra}


class _Model(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected (a typo is an error, not a no-op)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def to_wire(self) -> dict[str, Any]:
        """The camelCase dict a Kubernetes object carries (``None`` fields dropped)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class _Passthrough(BaseModel):
    """A Kubernetes type we validate only in part; unknown fields are kept as they are."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- the pod template ------------------------------------------------------------


class Container(_Passthrough):
    """A container of the worker pod (core/v1 Container; the fields torchjob reads are typed)."""

    name: str = Field(min_length=1, description="Container name (DNS label).")
    image: str | None = Field(default=None, description="Container image.")
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict[str, Any]] | None = None
    resources: dict[str, Any] | None = None


class PodSpec(_Passthrough):
    """core/v1 PodSpec: containers are required; everything else passes through to the pod."""

    containers: list[Container] = Field(
        min_length=1, description="Worker containers; the first one runs the training agent."
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Time a worker gets after SIGTERM to checkpoint (default set by the operator).",
    )


class ObjectMetaTemplate(_Passthrough):
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class PodTemplateSpec(_Passthrough):
    """core/v1 PodTemplateSpec of every worker pod."""

    metadata: ObjectMetaTemplate | None = None
    spec: PodSpec


# --- spec ------------------------------------------------------------------------


class Backend(str, Enum):
    AUTO = "auto"
    NCCL = "nccl"
    GLOO = "gloo"


class MembershipPolicy(str, Enum):
    RECREATE_GROUP = "RecreateGroup"
    """Every membership change recreates all worker pods (any image works: static mode)."""
    KEEP_SURVIVORS = "KeepSurvivors"
    """Only lost pods are replaced; surviving pods, and the GPUs they hold, are kept. Their
    torchjob runtime re-forms the process group for the new generation (needs torchjob in
    the image: ``TorchTrainer.fit`` is the in-pod agent)."""


class ElasticPolicy(_Model):
    """Bounds and pacing of elastic rescaling. Present means the job may run below ``replicas``."""

    model_config = ConfigDict(
        json_schema_extra={
            CEL: [
                _cel(
                    "self.minReplicas <= self.maxReplicas",
                    "spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas",
                )
            ]
        }
    )

    min_replicas: int = Field(ge=1, description="Fewest workers the job trains with.")
    max_replicas: int = Field(ge=1, description="Most workers the job grows to.")
    scale_down_after_seconds: int = Field(
        default=60,
        ge=0,
        description="Seconds a worker may stay unschedulable before the job continues without it.",
    )
    scale_up_cooldown_seconds: int = Field(
        default=120,
        ge=0,
        description="Seconds between a membership change and the next grow step.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ElasticPolicy:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas")
        return self


class Backoff(_Model):
    """Exponential backoff between group restarts: initial * factor^(n-1), capped at max."""

    initial_seconds: int = Field(default=10, ge=0, description="Delay before the first restart.")
    max_seconds: int = Field(default=300, ge=0, description="Cap on the delay.")
    factor: float = Field(default=2.0, ge=1.0, description="Growth per restart.")


class FailurePolicy(_Model):
    """What a worker failure (a non-zero exit that is not a disruption) means."""

    model_config = ConfigDict(
        json_schema_extra={
            CEL: [
                _cel(
                    "!has(self.retryableExitCodes) || !has(self.permanentExitCodes) || "
                    "self.retryableExitCodes.all(c, !(c in self.permanentExitCodes))",
                    "an exit code cannot be both retryable and permanent in spec.failurePolicy",
                )
            ]
        }
    )

    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Group restarts allowed for failures. Disruptions (preemption, eviction, node loss) never count.",
    )
    permanent_exit_codes: list[int] | None = Field(
        default=None,
        max_length=255,
        description="Exit codes that fail the job at once, without a restart.",
    )
    retryable_exit_codes: list[int] | None = Field(
        default=None,
        max_length=255,
        description="When set, only these exit codes restart the group; any other non-zero code is permanent.",
    )
    backoff: Backoff = Field(default_factory=Backoff)

    @model_validator(mode="after")
    def _disjoint(self) -> FailurePolicy:
        both = set(self.permanent_exit_codes or ()) & set(self.retryable_exit_codes or ())
        if both:
            raise ValueError(
                f"exit codes {sorted(both)} cannot be both retryable and permanent in spec.failurePolicy"
            )
        return self


class CleanPodPolicy(str, Enum):
    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


class RunPolicy(_Model):
    suspend: bool = Field(
        default=False, description="Delete the pods and keep the status; false resumes."
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job this many seconds after it first started."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the TorchJob this long after it succeeded or failed.",
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default=CleanPodPolicy.RUNNING,
        description="Pods deleted when the job finishes: None, Running (keep finished pods for logs), or All.",
    )


class PvcSource(_Model):
    claim_name: str = Field(min_length=1)
    mount_path: str = Field(default="/checkpoints", pattern=r"^/")


class CheckpointSpec(_Model):
    """Where rank 0 writes checkpoints. Only rank 0 needs access; others get state by broadcast."""

    model_config = ConfigDict(
        json_schema_extra={
            CEL: [
                _cel(
                    "has(self.path) || has(self.pvc)",
                    "spec.checkpoint needs a path (local path or fsspec URL such as s3://bucket/dir) or a pvc",
                )
            ]
        }
    )

    path: str | None = Field(
        default=None, description="Local path in the pod or fsspec URL (s3://, gs://)."
    )
    pvc: PvcSource | None = Field(
        default=None, description="A PersistentVolumeClaim mounted into every worker."
    )

    @model_validator(mode="after")
    def _some_storage(self) -> CheckpointSpec:
        if self.path is None and self.pvc is None:
            raise ValueError(
                "spec.checkpoint needs a path (local path or fsspec URL such as s3://bucket/dir) or a pvc"
            )
        return self

    @property
    def location(self) -> str:
        """The path the runtime writes to: ``path``, or the PVC's mount path."""
        if self.path:
            return self.path
        assert self.pvc is not None
        return self.pvc.mount_path


class SchedulingSpec(_Model):
    scheduler_name: str | None = Field(
        default=None, description="e.g. volcano, or a custom scheduler."
    )
    priority_class_name: str | None = None
    queue_name: str | None = Field(
        default=None, description="Kueue LocalQueue; set as the kueue.x-k8s.io/queue-name label."
    )


_NPROC_RULE = _cel(
    "type(self) == int ? self >= 1 : self in ['gpu', 'auto']",
    "spec.nprocPerNode must be a positive integer, 'gpu' (one process per requested GPU) or 'auto'",
)
_IMMUTABLE_MSG = "is immutable while the TorchJob exists; delete and recreate the job to change it"


class TorchJobSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra={
            CEL: [
                _cel(
                    "!has(self.elastic) || (self.replicas >= self.elastic.minReplicas && "
                    "self.replicas <= self.elastic.maxReplicas)",
                    "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas",
                ),
            ]
        }
    )

    replicas: int = Field(ge=1, description="Desired number of worker pods.")
    elastic: ElasticPolicy | None = Field(
        default=None,
        description="Elastic bounds; without it the job runs exactly `replicas` workers.",
    )
    nproc_per_node: int | Literal["gpu", "auto"] = Field(
        default=1,
        description="Training processes per pod: an integer, 'gpu' (GPUs requested per pod) or 'auto'.",
        json_schema_extra={
            CEL: [_NPROC_RULE, _cel("self == oldSelf", f"spec.nprocPerNode {_IMMUTABLE_MSG}")]
        },
    )
    backend: Backend = Field(
        default=Backend.AUTO,
        description="torch.distributed backend: auto (nccl with GPUs, else gloo), nccl or gloo.",
        json_schema_extra={CEL: [_cel("self == oldSelf", f"spec.backend {_IMMUTABLE_MSG}")]},
    )
    membership_policy: MembershipPolicy = Field(
        default=MembershipPolicy.RECREATE_GROUP,
        description=(
            "What a failure or disruption does to the pods that are still fine: RecreateGroup "
            "(any image) or KeepSurvivors (the torchjob runtime in the pods re-forms the group)."
        ),
        json_schema_extra={
            CEL: [_cel("self == oldSelf", f"spec.membershipPolicy {_IMMUTABLE_MSG}")]
        },
    )
    template: PodTemplateSpec = Field(description="Pod template of every worker.")
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        json_schema_extra={CEL: [_cel("self == oldSelf", f"spec.checkpoint {_IMMUTABLE_MSG}")]},
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)

    @model_validator(mode="after")
    def _replicas_in_bounds(self) -> TorchJobSpec:
        if self.elastic and not (
            self.elastic.min_replicas <= self.replicas <= self.elastic.max_replicas
        ):
            raise ValueError(
                "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas"
            )
        return self

    @property
    def min_replicas(self) -> int:
        return self.elastic.min_replicas if self.elastic else self.replicas

    @property
    def max_replicas(self) -> int:
        return self.elastic.max_replicas if self.elastic else self.replicas

    def gpus_per_pod(self) -> int:
        """GPUs the first container asks for (limits, else requests)."""
        resources = self.template.spec.containers[0].resources or {}
        for key in ("limits", "requests"):
            value = (resources.get(key) or {}).get("nvidia.com/gpu")
            if value is not None:
                return int(value)
        return 0

    def resolved_nproc_per_node(self) -> int:
        """Processes per pod: 'gpu'/'auto' mean one per requested GPU (at least one)."""
        if isinstance(self.nproc_per_node, int):
            return self.nproc_per_node
        return max(1, self.gpus_per_pod())


# --- status ----------------------------------------------------------------------


class Phase(str, Enum):
    """Lifecycle of a TorchJob. ``is_terminal`` phases never change again."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


TERMINAL_PHASES = frozenset(p.value for p in Phase if p.is_terminal)
"""The wire values of the phases after which a TorchJob never changes again."""


class Condition(_Model):
    """A metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class FailureRecord(_Model):
    pod: str
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    time: str | None = None


class Progress(_Model):
    """Training progress reported by rank 0."""

    model_config = ConfigDict(extra="allow")

    epoch: int | None = None
    step: int | None = None
    metrics: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    last_checkpoint: str | None = None
    update_time: str | None = None


class TorchJobStatus(_Model):
    model_config = ConfigDict(extra="allow")

    phase: Phase | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
    replicas: int | None = Field(default=None, description="Workers of the current generation.")
    ready_workers: int | None = None
    active_workers: int | None = None
    succeeded_workers: int | None = None
    failed_workers: int | None = None
    workers: str | None = Field(default=None, description="ready/desired, for kubectl get.")
    selector: str | None = Field(
        default=None, description="Label selector of the workers (scale subresource)."
    )
    current_generation: int | None = Field(
        default=None, description="Membership generation of the pods."
    )
    world_size: int | None = None
    restarts: int | None = Field(default=None, description="Group restarts caused by failures.")
    disruptions: int | None = Field(
        default=None, description="Membership changes caused by disruptions."
    )
    last_failure: FailureRecord | None = None
    restart_after: str | None = Field(
        default=None, description="Backoff: next generation not before this time."
    )
    spec_replicas: int | None = Field(
        default=None,
        description="spec.replicas the current size was decided from (tells a user's scale from a shrink).",
    )
    last_rescale_time: str | None = Field(default=None, description="Last elastic shrink or grow.")
    created_generation: int | None = Field(
        default=None,
        description="Latest generation whose pods were all created (a later loss is a disruption).",
    )
    start_time: str | None = None
    completion_time: str | None = None
    progress: Progress | None = None

    def to_patch(self) -> dict[str, Any]:
        """The operator's JSON merge patch of ``/status``: every field it owns, ``None`` as an
        explicit null (which clears it), and ``progress`` left out: the pod's agent owns it."""
        return self.model_dump(by_alias=True, mode="json", exclude={"progress"})

    @classmethod
    def parse(cls, status: Mapping[str, Any] | None) -> TorchJobStatus:
        """The status as the API server holds it, tolerating fields another writer left
        malformed: each such field reads as absent (the operator rewrites it)."""
        raw = dict(status or {})
        for _ in range(len(raw) + 1):
            try:
                return cls.model_validate(raw)
            except ValidationError as err:
                bad = {e["loc"][0] for e in err.errors() if e["loc"]}
                if not bad & raw.keys():
                    break
                for key in bad:
                    raw.pop(str(key), None)
        return cls()


class ObjectMeta(_Passthrough):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class TorchJob(_Model):
    """A whole TorchJob object, as ``kubectl apply -f job.yaml`` sends it."""

    api_version: Literal["torchjob.io/v1alpha1"] = "torchjob.io/v1alpha1"
    kind: Literal["TorchJob"] = "TorchJob"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TorchJobSpec
    status: TorchJobStatus | None = None

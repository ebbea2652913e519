"""The spec of a TorchJob: what the user asks for.

The CEL rules of each model and the Python checks of its validator come from one table,
``torchjob.api.models.rules``.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from torchjob.api.models.base import CEL, _Model
from torchjob.api.models.initializers import InitializersSpec
from torchjob.api.models.limits import (
    GPU_RESOURCE,
    MAX_BACKOFF_FACTOR,
    MAX_BACKOFF_SECONDS,
    MAX_DEADLINE_SECONDS,
    MAX_NPROC_PER_NODE,
    MAX_PATH,
    MAX_REPLICAS,
    MAX_RESTARTS,
    MAX_TTL_SECONDS,
    MAX_WAIT_SECONDS,
    parse_quantity,
)
from torchjob.api.models.placement import Placement
from torchjob.api.models.rules import cel_of, enforce
from torchjob.api.models.runtime_ref import RuntimeRef
from torchjob.api.models.template import PodTemplateSpec


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

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("ElasticPolicy")})

    min_replicas: int = Field(
        ge=1, le=MAX_REPLICAS, description="Fewest workers the job trains with."
    )
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Most workers the job grows to.")
    scale_down_after_seconds: int = Field(
        default=60,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Seconds a worker may stay unschedulable before the job continues without it.",
    )
    scale_up_cooldown_seconds: int = Field(
        default=120,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Seconds between a membership change and the next grow step.",
    )
    shrink_on_disruption: bool = Field(
        default=False,
        description=(
            "With membershipPolicy KeepSurvivors: when a worker is disrupted and no standby is"
            " ready, go on at once with the survivors (any of them, at least minReplicas; the"
            " first becomes rank 0, status.members) and let the replacement join the generation"
            " after; off: replace it at full size. Each such eviction costs two re-formations"
            " (shrink, grow); docs/runtime.md has the measurement."
        ),
    )
    replace_before_leaving: bool = Field(
        default=True,
        description=(
            "With membershipPolicy KeepSurvivors: a worker given notice (a graceful eviction,"
            " preemption or node drain, with at least 20 s of grace left) trains on through its"
            " grace period while its replacement starts under a new pod index; once that is"
            " Ready, one generation puts it in the leaving pod's place (one re-formation, at"
            " full size). The leaving pod stops 10 s before its grace period ends, or when"
            " replaced. Off: it stops at once (then shrinkOnDisruption, a standby or a"
            " full-size replacement applies)."
        ),
    )
    standby_replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            "With membershipPolicy KeepSurvivors: warm standby pods kept beside the workers,"
            " their runtime started and torch imported, waiting to join. A lost worker's place"
            " is taken by a ready standby in the next generation at once (no pod to start), and"
            " a new standby is created in its stead. Counted in status.standbyWorkers."
        ),
    )

    @model_validator(mode="after")
    def _rules(self) -> ElasticPolicy:
        enforce("ElasticPolicy", self)
        return self


class Backoff(_Model):
    """Exponential backoff between group restarts: initial * factor^(n-1), capped at max."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("Backoff")})

    initial_seconds: int = Field(
        default=10, ge=0, le=MAX_BACKOFF_SECONDS, description="Delay before the first restart."
    )
    max_seconds: int = Field(
        default=300, ge=0, le=MAX_BACKOFF_SECONDS, description="Cap on the delay."
    )
    factor: float = Field(
        default=2.0,
        ge=1.0,
        le=MAX_BACKOFF_FACTOR,
        allow_inf_nan=False,
        description="Growth per restart.",
    )

    @model_validator(mode="after")
    def _rules(self) -> Backoff:
        enforce("Backoff", self)
        return self


ExitCode = Annotated[
    int,
    Field(ge=1, le=255, description="A container exit code: 1-255 (0 is success, not a failure)."),
]


class FailurePolicy(_Model):
    """What a worker failure (a non-zero exit that is not a disruption) means."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("FailurePolicy")})

    max_restarts: int = Field(
        default=3,
        ge=0,
        le=MAX_RESTARTS,
        description="Group restarts allowed for failures. Disruptions (preemption, eviction, node loss) never count.",
    )
    permanent_exit_codes: list[ExitCode] | None = Field(
        default=None,
        max_length=255,
        description="Exit codes that fail the job at once, without a restart.",
    )
    retryable_exit_codes: list[ExitCode] | None = Field(
        default=None,
        max_length=255,
        description="When set, only these exit codes restart the group; any other non-zero code is permanent.",
    )
    backoff: Backoff = Field(default_factory=Backoff)

    @model_validator(mode="after")
    def _rules(self) -> FailurePolicy:
        enforce("FailurePolicy", self)
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
        default=None,
        ge=1,
        description="Fail the job this many seconds after it first started.",
        # int64 as on a Pod or Job: no `maximum` in the CRD (the API server reads a schema's
        # maximum as a float64, and 2^63-1 is not one); the JSON integer itself is the bound.
        json_schema_extra={"format": "int64"},
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description="Delete the TorchJob this long after it succeeded or failed.",
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default=CleanPodPolicy.RUNNING,
        description="Pods deleted when the job finishes: None, Running (keep finished pods for logs), or All.",
    )

    @model_validator(mode="after")
    def _int64_deadline(self) -> RunPolicy:
        d = self.active_deadline_seconds
        if d is not None and d > MAX_DEADLINE_SECONDS:
            raise ValueError(
                "spec.runPolicy.activeDeadlineSeconds must fit in int64 (at most 2^63-1), as on a Job"
            )
        return self


class PvcSource(_Model):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        json_schema_extra={CEL: cel_of("PvcSource", "claimName")},
    )
    mount_path: str = Field(
        default="/checkpoints",
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
            default=1,
            description="Training processes per pod: an integer, 'gpu' (GPUs requested per pod) or 'auto'.",
            json_schema_extra={CEL: cel_of("TorchJobSpec", "nprocPerNode")},
        )
    )
    backend: Backend = Field(
        default=Backend.AUTO,
        description="torch.distributed backend: auto (nccl with GPUs, else gloo), nccl or gloo.",
        json_schema_extra={CEL: cel_of("TorchJobSpec", "backend")},
    )
    membership_policy: MembershipPolicy = Field(
        default=MembershipPolicy.RECREATE_GROUP,
        description=(
            "What a failure or disruption does to the pods that are still fine: RecreateGroup "
            "(any image) or KeepSurvivors (the torchjob runtime in the pods re-forms the group)."
        ),
        json_schema_extra={CEL: cel_of("TorchJobSpec", "membershipPolicy")},
    )
    template: PodTemplateSpec = Field(description="Pod template of every worker.")
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        json_schema_extra={CEL: cel_of("TorchJobSpec", "checkpoint")},
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    placement: Placement | None = None
    runtime_ref: RuntimeRef | None = Field(
        default=None,
        description=(
            "A runtime blueprint (TorchRuntime or ClusterTorchRuntime) this spec overrides: "
            "what the job leaves out comes from it (docs/platform.md, Runtime blueprints). "
            "Resolved once, when the job starts; status.runtime records which and its version."
        ),
        json_schema_extra={CEL: cel_of("TorchJobSpec", "runtimeRef")},
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

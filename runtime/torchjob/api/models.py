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

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Annotated, Any, Literal

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


# --- bounds (docs/api.md "Bounds" lists each one and why) ----------------------------

MAX_REPLICAS = 10_000
"""Twice Kubernetes' tested 5,000-node scale; keeps ``-worker-9999`` to 12 characters."""
MAX_NPROC_PER_NODE = 1024
"""Processes per pod: the largest nodes have 8-16 GPUs or a few hundred CPU cores."""
MAX_WAIT_SECONDS = 7 * 86400
"""Elastic waits and cooldowns: beyond a week a job is better suspended."""
MAX_BACKOFF_SECONDS = 86400
"""Restart backoff: a day; a longer pause is a suspend, not a backoff."""
MAX_BACKOFF_FACTOR = 100.0
MAX_RESTARTS = 10_000
"""Group restarts: at the shortest backoff (0 s) still bounded; more is a crash loop."""
MAX_DEADLINE_SECONDS = 2**63 - 1
"""activeDeadlineSeconds: int64, as batch/v1 Job and core/v1 Pod (no bound of our own)."""
MAX_TTL_SECONDS = 2**31 - 1
"""ttlSecondsAfterFinished: int32, as batch/v1 Job (no bound of our own)."""
MAX_PATH = 4096
"""PATH_MAX on Linux."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
JOB_NAME = DNS_LABEL
"""metadata.name: a DNS-1123 label, as the Service it names (v1.37 accepts a leading digit)."""
WORKER_SUFFIX = "-worker-"
GPU_RESOURCE = "nvidia.com/gpu"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
RESERVED_LABELS = (
    "torchjob.io/job-name",
    "torchjob.io/role",
    "torchjob.io/pod-index",
    "torchjob.io/generation",
)
"""Labels the operator sets on every worker pod (torchjob.contract); a template may not."""

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    **{s: Decimal(1024 ** (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity (``8``, ``"500m"``, ``"4Gi"``, ``"1e3"``) as a Decimal.

    Raises ``ValueError`` naming the value when it is not a quantity."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (e.g. 8, 500m, 4Gi)")
    number, suffix = m.group(1), m.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, OverflowError) as e:
        raise ValueError(f"{value!r} is not a quantity") from e


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

_MSG_RESTART_POLICY = (
    "spec.template.spec.restartPolicy must be Never (or left out): the operator restarts whole "
    "groups, never single ranks"
)
_MSG_HOSTNAME = (
    "spec.template.spec.hostname and subdomain are set by the operator (<job>-worker-<i>, <job>); "
    "remove them"
)
_MSG_RESERVED_LABELS = (
    "spec.template.metadata.labels must not set torchjob.io/job-name, torchjob.io/role, "
    "torchjob.io/pod-index or torchjob.io/generation: the operator sets them on every worker"
)
_MSG_GPU_INTEGER = (
    "nvidia.com/gpu must be a whole number of GPUs (e.g. 1, 8), not a fraction such as 0.5 or 500m"
)
_MSG_GPU_EQUAL = (
    "resources.requests and resources.limits of nvidia.com/gpu must be equal when both are given "
    "(GPUs cannot be overcommitted); give only limits"
)
_MSG_REQUESTS_LE_LIMITS = "resources.requests must not exceed resources.limits for any resource"

_GPU_KEY = "'nvidia.com/gpu'"
_Q = "quantity(string({v}))"
_IS_Q = "isQuantity(string({v}))"


def _nonneg(m: str) -> str:
    v = f"{m}[k]"
    return f"{m}.all(k, !{_IS_Q.format(v=v)} || !{_Q.format(v=v)}.isLessThan(quantity('0')))"


TEMPLATE_RULES: dict[str, dict[str, Any]] = {
    # Keys are Kubernetes type names of the OpenAPI document (torchjob.api.kube_schema).
    "io.k8s.api.core.v1.PodSpec": {
        "x-kubernetes-validations": [
            _cel("!has(self.restartPolicy) || self.restartPolicy == 'Never'", _MSG_RESTART_POLICY),
            _cel("!has(self.hostname) && !has(self.subdomain)", _MSG_HOSTNAME),
        ],
        # Bounds that keep the CEL rules below within the API server's cost budget.
        "properties.containers": {"minItems": 1, "maxItems": 16},
        "properties.initContainers": {"maxItems": 16},
        "properties.volumes": {"maxItems": 64},
        "properties.restartPolicy": {"enum": ["Always", "OnFailure", "Never"]},
        "properties.priorityClassName": {"maxLength": 253},
    },
    "io.k8s.api.core.v1.Container": {
        "x-kubernetes-validations": [
            _cel(
                "size(self.name) <= 63 && self.name.matches(r'" + DNS_LABEL + "')",
                "container name must be a DNS label: lowercase letters, digits and '-', at most "
                "63 characters, starting and ending with a letter or digit",
                fieldPath=".name",
            ),
            _cel(
                "has(self.image) && size(self.image.trim()) > 0",
                "container image is required (e.g. image: ghcr.io/org/train:1.0)",
            ),
            _cel(
                "!has(self.resources) || ((!has(self.resources.limits) || "
                + _nonneg("self.resources.limits")
                + ") && (!has(self.resources.requests) || "
                + _nonneg("self.resources.requests")
                + "))",
                "resources.limits and resources.requests must not be negative",
            ),
            _cel(
                "!has(self.resources) || ("
                + " && ".join(
                    f"(!has(self.resources.{m}) || !('nvidia.com/gpu' in self.resources.{m}) || "
                    f"!{_IS_Q.format(v=f'self.resources.{m}[{_GPU_KEY}]')} || "
                    f"{_Q.format(v=f'self.resources.{m}[{_GPU_KEY}]')}.isInteger())"
                    for m in ("limits", "requests")
                )
                + ")",
                _MSG_GPU_INTEGER,
            ),
            _cel(
                "!has(self.resources) || !has(self.resources.limits) || "
                "!has(self.resources.requests) || !('nvidia.com/gpu' in self.resources.limits) || "
                "!('nvidia.com/gpu' in self.resources.requests) || "
                "string(self.resources.limits['nvidia.com/gpu']) == "
                "string(self.resources.requests['nvidia.com/gpu']) || ("
                + _IS_Q.format(v="self.resources.limits['nvidia.com/gpu']")
                + " && "
                + _IS_Q.format(v="self.resources.requests['nvidia.com/gpu']")
                + " && "
                + _Q.format(v="self.resources.limits['nvidia.com/gpu']")
                + ".compareTo("
                + _Q.format(v="self.resources.requests['nvidia.com/gpu']")
                + ") == 0)",
                _MSG_GPU_EQUAL,
            ),
            _cel(
                "!has(self.resources) || !has(self.resources.limits) || "
                "!has(self.resources.requests) || self.resources.requests.all(k, "
                "!(k in self.resources.limits) || !"
                + _IS_Q.format(v="self.resources.requests[k]")
                + " || !"
                + _IS_Q.format(v="self.resources.limits[k]")
                + " || "
                + _Q.format(v="self.resources.requests[k]")
                + ".compareTo("
                + _Q.format(v="self.resources.limits[k]")
                + ") <= 0)",
                _MSG_REQUESTS_LE_LIMITS,
            ),
        ],
        "properties.name": {"maxLength": 253},
        "properties.image": {"maxLength": 1024},
        # The env-name rule (EnvVar below) runs once per entry: at 2048 the API server refuses
        # the CRD (estimated cost 1.02x its per-rule budget), at 1024 it accepts it.
        "properties.env": {"maxItems": 1024},
        "properties.volumeMounts": {"maxItems": 64},
        "properties.imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        "properties.terminationMessagePolicy": {"enum": ["File", "FallbackToLogsOnError"]},
    },
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"maxLength": 64},
    "io.k8s.api.core.v1.ResourceRequirements": {
        "properties.limits": {"maxProperties": 32},
        "properties.requests": {"maxProperties": 32},
    },
    "io.k8s.api.core.v1.EnvVar": {
        "x-kubernetes-validations": [
            _cel(
                "self.name.matches(r'^[ -<>-~]+$')",
                "env name must be printable ASCII without '=' (e.g. BATCH_SIZE), and not empty",
                fieldPath=".name",
            ),
        ],
        "properties.name": {"maxLength": 256},
    },
    "io.k8s.api.core.v1.VolumeMount": {
        "properties.name": {"maxLength": 63},
    },
    "io.k8s.api.core.v1.Volume": {
        "properties.name": {"maxLength": 63},
    },
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
        "properties.labels": {
            "maxProperties": 64,
            "additionalProperties": {"type": "string", "maxLength": 63},
            "x-kubernetes-validations": [
                _cel(
                    "self.all(k, size(k) <= 317 && k.matches(r'" + LABEL_KEY + "') && "
                    "self[k].matches(r'" + LABEL_VALUE + "'))",
                    "labels must be valid label keys (an optional DNS prefix and '/', then at most "
                    "63 letters, digits, '-', '_' or '.') with values of at most 63 such "
                    "characters, beginning and ending with a letter or digit",
                ),
            ],
        },
        "properties.annotations": {
            "maxProperties": 256,
            "x-kubernetes-validations": [
                _cel(
                    "self.map(k, size(k) + size(self[k])).sum() <= 262144",
                    "annotations may total at most 256 KiB (keys and values), as on any pod",
                ),
            ],
        },
    },
}
"""CEL rules and bounds the CRD adds to Kubernetes' PodTemplateSpec schema (per type)."""


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
    """core/v1 PodTemplateSpec of every worker pod.

    In the CRD its schema is Kubernetes' own (``torchjob.api.kube_schema``) plus the
    ``TEMPLATE_RULES`` below; here only what the operator reads is typed and checked."""

    metadata: ObjectMetaTemplate | None = None
    spec: PodSpec

    @model_validator(mode="after")
    def _operator_fields(self) -> PodTemplateSpec:
        """Template values the operator would have to override are errors, not rewrites."""
        extra = self.spec.model_extra or {}
        if extra.get("restartPolicy", "Never") != "Never":
            raise ValueError(_MSG_RESTART_POLICY)
        for key in ("hostname", "subdomain"):
            if key in extra:
                raise ValueError(_MSG_HOSTNAME)
        labels = (self.metadata.labels if self.metadata else None) or {}
        if any(k in labels for k in RESERVED_LABELS):
            raise ValueError(_MSG_RESERVED_LABELS)
        for i, c in enumerate(self.spec.containers):
            _check_resources(f"spec.template.spec.containers[{i}].resources", c.resources)
        return self


def _check_resources(where: str, resources: dict[str, Any] | None) -> None:
    """Quantities parse and are not negative; GPUs are whole and requests equal limits."""
    resources = resources or {}
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("limits", "requests"):
        values = resources.get(kind) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{where}.{kind} must be a map of resource name to quantity")
        parsed[kind] = {}
        for name, value in values.items():
            try:
                q = parse_quantity(value)
            except ValueError as e:
                raise ValueError(f"{where}.{kind}[{name}]: {e}") from None
            if q < 0:
                raise ValueError(f"{where}.{kind}[{name}] must not be negative")
            if name == GPU_RESOURCE and q != q.to_integral_value():
                raise ValueError(_MSG_GPU_INTEGER)
            parsed[kind][name] = q
    limits, requests = parsed["limits"], parsed["requests"]
    gpu_l, gpu_r = limits.get(GPU_RESOURCE), requests.get(GPU_RESOURCE)
    if gpu_l is not None and gpu_r is not None and gpu_l != gpu_r:
        raise ValueError(_MSG_GPU_EQUAL)
    for name, q in requests.items():
        if name in limits and q > limits[name]:
            raise ValueError(_MSG_REQUESTS_LE_LIMITS)


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
    def _bounds(self) -> ElasticPolicy:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.elastic.minReplicas must not exceed spec.elastic.maxReplicas")
        return self


_MSG_BACKOFF = (
    "spec.failurePolicy.backoff.initialSeconds must not exceed maxSeconds (maxSeconds caps every "
    "delay; raise it or lower initialSeconds)"
)


class Backoff(_Model):
    """Exponential backoff between group restarts: initial * factor^(n-1), capped at max."""

    model_config = ConfigDict(
        json_schema_extra={
            CEL: [
                _cel(
                    "(has(self.initialSeconds) ? self.initialSeconds : 10) <= "
                    "(has(self.maxSeconds) ? self.maxSeconds : 300)",
                    _MSG_BACKOFF,
                )
            ]
        }
    )

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
    def _ordered(self) -> Backoff:
        if self.initial_seconds > self.max_seconds:
            raise ValueError(_MSG_BACKOFF)
        return self


ExitCode = Annotated[
    int,
    Field(ge=1, le=255, description="A container exit code: 1-255 (0 is success, not a failure)."),
]


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


_MSG_CLAIM = (
    "spec.checkpoint.pvc.claimName must be a PersistentVolumeClaim name: lowercase letters, "
    "digits, '-' and '.', at most 253 characters, starting and ending with a letter or digit"
)
_MSG_MOUNT = (
    "spec.checkpoint.pvc.mountPath must be an absolute path other than /dev/shm (the operator "
    "mounts shared memory there)"
)


class PvcSource(_Model):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        json_schema_extra={CEL: [_cel(f"self.matches(r'{DNS_SUBDOMAIN}')", _MSG_CLAIM)]},
    )
    mount_path: str = Field(
        default="/checkpoints",
        min_length=2,
        max_length=MAX_PATH,
        json_schema_extra={
            CEL: [
                _cel(
                    "self.startsWith('/') && self != '/dev/shm' && self != '/dev/shm/'", _MSG_MOUNT
                )
            ]
        },
    )

    @model_validator(mode="after")
    def _names(self) -> PvcSource:
        if not re.match(DNS_SUBDOMAIN, self.claim_name):
            raise ValueError(_MSG_CLAIM)
        if not self.mount_path.startswith("/") or self.mount_path.rstrip("/") == "/dev/shm":
            raise ValueError(_MSG_MOUNT)
        return self


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
        default=None,
        min_length=1,
        max_length=MAX_PATH,
        description="Local path in the pod or fsspec URL (s3://, gs://).",
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
        return self.pvc.mount_path if self.pvc is not None else ""


_MSG_PRIORITY = (
    "spec.scheduling.priorityClassName must be a PriorityClass name: lowercase letters, digits, "
    "'-' and '.', at most 253 characters, starting and ending with a letter or digit"
)
_MSG_QUEUE = (
    "spec.scheduling.queueName must be a valid label value (it becomes the "
    "kueue.x-k8s.io/queue-name label): at most 63 letters, digits, '-', '_' or '.', beginning "
    "and ending with a letter or digit"
)


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
        json_schema_extra={CEL: [_cel(f"self.matches(r'{DNS_SUBDOMAIN}')", _MSG_PRIORITY)]},
    )
    queue_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description=(
            "Kueue LocalQueue (as the kueue.x-k8s.io/queue-name label of the TorchJob): the "
            "job's Workload queues there and no pod runs before it is admitted."
        ),
        json_schema_extra={CEL: [_cel(f"self.matches(r'{LABEL_VALUE}')", _MSG_QUEUE)]},
    )
    gang: GangSpec | None = Field(
        default=None,
        description=(
            "Gang scheduling through a PodGroup (docs/fits-your-cluster.md); set schedulerName "
            "to the scheduler that reads it."
        ),
    )

    @model_validator(mode="after")
    def _names(self) -> SchedulingSpec:
        for value, pattern, msg in (
            (self.priority_class_name, DNS_SUBDOMAIN, _MSG_PRIORITY),
            (self.queue_name, LABEL_VALUE, _MSG_QUEUE),
        ):
            if value is not None and not re.match(pattern, value):
                raise ValueError(msg)
        return self


_NPROC_RULE = _cel(
    f"type(self) == int ? self >= 1 && self <= {MAX_NPROC_PER_NODE} : self in ['gpu', 'auto']",
    f"spec.nprocPerNode must be an integer from 1 to {MAX_NPROC_PER_NODE}, 'gpu' (one process per "
    "requested GPU) or 'auto'",
)
_IMMUTABLE_MSG = "is immutable while the TorchJob exists; delete and recreate the job to change it"
_MSG_CHECKPOINT_PRESENCE = (
    f"spec.checkpoint {_IMMUTABLE_MSG} (it cannot be added to or removed from an existing job)"
)
_MSG_SCHEDULER_CONFLICT = (
    "spec.scheduling.schedulerName and spec.template.spec.schedulerName differ; set one of them"
)
_MSG_PRIORITY_CONFLICT = (
    "spec.scheduling.priorityClassName and spec.template.spec.priorityClassName differ; set one "
    "of them"
)
_MSG_QUEUE_CONFLICT = (
    "spec.scheduling.queueName and the template's kueue.x-k8s.io/queue-name label differ; set one "
    "of them"
)
_MSG_MOUNT_UNKNOWN = (
    "every volumeMount in spec.template.spec.containers and initContainers must name a volume of "
    "spec.template.spec.volumes (dshm is the operator's /dev/shm; torchjob-checkpoint needs "
    "spec.checkpoint.pvc)"
)
_MSG_MOUNT_CLASH = (
    "spec.checkpoint.pvc.mountPath is already a mountPath in the template; pick another "
    "mountPath or remove that volumeMount"
)
_MOUNTS_KNOWN = (
    ".all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
    "m.name == 'dshm' || (m.name == 'torchjob-checkpoint' && has(self.checkpoint) && "
    "has(self.checkpoint.pvc)) || (has(self.template.spec.volumes) && "
    "self.template.spec.volumes.exists(v, v.name == m.name))))"
)
_TEMPLATE_LABELS = (
    "(has(self.template.metadata) && has(self.template.metadata.labels) ? "
    "self.template.metadata.labels : {})"
)
_MSG_STANDBY = (
    "spec.elastic.standbyReplicas needs spec.membershipPolicy KeepSurvivors (a standby joins the"
    " survivors' group; RecreateGroup recreates every pod)"
)
_SPEC_RULES = [
    _cel(
        "!has(self.elastic) || (self.replicas >= self.elastic.minReplicas && "
        "self.replicas <= self.elastic.maxReplicas)",
        "spec.replicas must lie between spec.elastic.minReplicas and spec.elastic.maxReplicas",
    ),
    _cel(
        "!has(self.elastic) || !has(self.elastic.standbyReplicas) || "
        "self.elastic.standbyReplicas == 0 || "
        "(has(self.membershipPolicy) && self.membershipPolicy == 'KeepSurvivors')",
        _MSG_STANDBY,
    ),
    _cel("has(self.checkpoint) == has(oldSelf.checkpoint)", _MSG_CHECKPOINT_PRESENCE),
    _cel(
        "!has(self.scheduling) || !has(self.scheduling.schedulerName) || "
        "!has(self.template.spec.schedulerName) || "
        "self.template.spec.schedulerName == self.scheduling.schedulerName",
        _MSG_SCHEDULER_CONFLICT,
    ),
    _cel(
        "!has(self.scheduling) || !has(self.scheduling.priorityClassName) || "
        "!has(self.template.spec.priorityClassName) || "
        "self.template.spec.priorityClassName == self.scheduling.priorityClassName",
        _MSG_PRIORITY_CONFLICT,
    ),
    _cel(
        "!has(self.scheduling) || !has(self.scheduling.queueName) || "
        f"!('kueue.x-k8s.io/queue-name' in {_TEMPLATE_LABELS}) || "
        f"{_TEMPLATE_LABELS}['kueue.x-k8s.io/queue-name'] == self.scheduling.queueName",
        _MSG_QUEUE_CONFLICT,
    ),
    _cel(
        f"!{list(RESERVED_LABELS)!r}.exists(k, k in {_TEMPLATE_LABELS})".replace('"', "'"),
        _MSG_RESERVED_LABELS,
    ),
    _cel(
        f"self.template.spec.containers{_MOUNTS_KNOWN} && "
        f"(!has(self.template.spec.initContainers) || "
        f"self.template.spec.initContainers{_MOUNTS_KNOWN})",
        _MSG_MOUNT_UNKNOWN,
    ),
    _cel(
        "!has(self.checkpoint) || !has(self.checkpoint.pvc) || "
        "self.template.spec.containers.all(c, !has(c.volumeMounts) || c.volumeMounts.all(m, "
        "m.mountPath != (has(self.checkpoint.pvc.mountPath) ? self.checkpoint.pvc.mountPath : "
        "'/checkpoints')))",
        _MSG_MOUNT_CLASH,
    ),
]


class TorchJobSpec(_Model):
    model_config = ConfigDict(json_schema_extra={CEL: _SPEC_RULES})

    replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Desired number of worker pods.")
    elastic: ElasticPolicy | None = Field(
        default=None,
        description="Elastic bounds; without it the job runs exactly `replicas` workers.",
    )
    nproc_per_node: Annotated[int, Field(ge=1, le=MAX_NPROC_PER_NODE)] | Literal["gpu", "auto"] = (
        Field(
            default=1,
            description="Training processes per pod: an integer, 'gpu' (GPUs requested per pod) or 'auto'.",
            json_schema_extra={
                CEL: [_NPROC_RULE, _cel("self == oldSelf", f"spec.nprocPerNode {_IMMUTABLE_MSG}")]
            },
        )
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
        if (
            self.elastic
            and self.elastic.standby_replicas
            and self.membership_policy != MembershipPolicy.KEEP_SURVIVORS
        ):
            raise ValueError(_MSG_STANDBY)
        extra = self.template.spec.model_extra or {}
        labels = (self.template.metadata.labels if self.template.metadata else None) or {}
        s = self.scheduling
        if s.scheduler_name and extra.get("schedulerName", s.scheduler_name) != s.scheduler_name:
            raise ValueError(_MSG_SCHEDULER_CONFLICT)
        if s.priority_class_name and (
            extra.get("priorityClassName", s.priority_class_name) != s.priority_class_name
        ):
            raise ValueError(_MSG_PRIORITY_CONFLICT)
        if s.queue_name and labels.get(KUEUE_QUEUE_LABEL, s.queue_name) != s.queue_name:
            raise ValueError(_MSG_QUEUE_CONFLICT)
        pvc = self.checkpoint.pvc if self.checkpoint else None
        if pvc and any(
            isinstance(m, dict) and m.get("mountPath") == pvc.mount_path
            for c in self.template.spec.containers
            for m in (c.model_extra or {}).get("volumeMounts") or []
        ):
            raise ValueError(_MSG_MOUNT_CLASH)
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
    members: list[int] | None = Field(
        default=None,
        description=(
            "KeepSurvivors: the pod indices of the current generation in rank order (pod"
            " members[i] runs ranks i*nprocPerNode and up; the rendezvous is on members[0])."
            " Absent: pods 0..replicas-1 in index order. A generation that lost pod 0 goes on"
            " with a survivor as rank 0."
        ),
    )
    standby_workers: int | None = Field(
        default=None,
        description=(
            "Pods waiting to join (spec.elastic.standbyReplicas, or an elastic job's"
            " replacements) that are ready to take a worker's place."
        ),
    )
    replaced_workers: list[str] | None = Field(
        default=None,
        description=(
            "KeepSurvivors: pods of an earlier generation, still present, that are not members"
            " of the current one (a new pod may take their name): their runtime stops instead"
            " of joining the current generation's group."
        ),
    )
    start_time: str | None = None
    completion_time: str | None = None
    progress: Progress | None = None

    def rank_order(self) -> tuple[int, ...] | None:
        """``members`` when it is a usable rank order (``replicas`` distinct, non-negative pod
        indices); None otherwise, which both readers take as ``0..replicas-1``."""
        m, n = self.members, self.replicas or 0
        if not m or len(m) != n or len(set(m)) != n or min(m) < 0:
            return None
        return tuple(m)

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

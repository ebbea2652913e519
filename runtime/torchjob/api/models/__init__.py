"""Pydantic models of the TorchJob custom resource: the single source of truth.

The CRD in ``crds/`` is generated from these models (``make crds``, see
``torchjob.api.crd``); the operator parses every object with them, and the
runtime and CLI validate manifests with them. Python attribute names are
snake_case; the wire format (and the CRD) is camelCase, as Kubernetes expects.

The package, by concern:

* ``limits``: bounds, name patterns and resource quantities;
* ``rule`` and ``rules``: the rule table. Each cross-field rule is one entry (its CEL for
  the CRD's ``x-kubernetes-validations``, its message, its Python check), so
  ``torchjob run -f job.yaml`` rejects what the cluster would, with the same words;
* ``pod_types``: what the CRD adds to Kubernetes' pod template types (bounds and their rules);
* ``transition``: the immutability rules, which compare a field's effective value (its
  default where it is left out, from ``choices``) in the old and the new object;
* ``template``, ``choices``, ``policies``, ``spec``, ``status``, ``job``: the models.

Import the names from here (``from torchjob.api.models import TorchJobSpec``).
"""

from torchjob.api.models.base import CEL
from torchjob.api.models.base import _cel as _cel
from torchjob.api.models.base import _Model as _Model
from torchjob.api.models.base import _Passthrough as _Passthrough
from torchjob.api.models.choices import Backend, MembershipPolicy
from torchjob.api.models.history import CAUSES, HISTORY_LIMIT, GenerationRecord
from torchjob.api.models.initializers import (
    INITIALIZER_KINDS,
    InitializerSource,
    InitializersSpec,
    InitializerStatus,
    InitializerVolume,
)
from torchjob.api.models.job import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ObjectMeta,
    TorchJob,
)
from torchjob.api.models.limits import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    GPU_RESOURCE,
    JOB_NAME,
    LABEL_KEY,
    LABEL_VALUE,
    MAX_BACKOFF_FACTOR,
    MAX_BACKOFF_SECONDS,
    MAX_DEADLINE_SECONDS,
    MAX_NPROC_PER_NODE,
    MAX_PATH,
    MAX_REPLICAS,
    MAX_RESTARTS,
    MAX_TTL_SECONDS,
    MAX_WAIT_SECONDS,
    RESERVED_LABELS,
    parse_quantity,
)
from torchjob.api.models.placement import PLACEMENT_RULES, Placement
from torchjob.api.models.pod_types import TEMPLATE_RULES
from torchjob.api.models.policies import (
    Backoff,
    CleanPodPolicy,
    ElasticPolicy,
    ExitCode,
    FailurePolicy,
    RunPolicy,
)
from torchjob.api.models.rule import Rule
from torchjob.api.models.rules import RULES
from torchjob.api.models.runtime_ref import RuntimeKind, RuntimeRef
from torchjob.api.models.spec import (
    CheckpointSpec,
    GangScheduler,
    GangSpec,
    PvcSource,
    SchedulingSpec,
    TorchJobSpec,
)
from torchjob.api.models.status import (
    TERMINAL_PHASES,
    Condition,
    FailureRecord,
    LeavingWorker,
    Phase,
    Progress,
    RuntimeStatus,
    SilentWorker,
    TorchJobStatus,
    Tracking,
    loop_step,
)
from torchjob.api.models.template import Container, ObjectMetaTemplate, PodSpec, PodTemplateSpec

__all__ = [
    "API_VERSION",
    "CAUSES",
    "CEL",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "GPU_RESOURCE",
    "GROUP",
    "HISTORY_LIMIT",
    "INITIALIZER_KINDS",
    "JOB_NAME",
    "KIND",
    "LABEL_KEY",
    "LABEL_VALUE",
    "MAX_BACKOFF_FACTOR",
    "MAX_BACKOFF_SECONDS",
    "MAX_DEADLINE_SECONDS",
    "MAX_NPROC_PER_NODE",
    "MAX_PATH",
    "MAX_REPLICAS",
    "MAX_RESTARTS",
    "MAX_TTL_SECONDS",
    "MAX_WAIT_SECONDS",
    "PLACEMENT_RULES",
    "PLURAL",
    "RESERVED_LABELS",
    "RULES",
    "SHORT_NAMES",
    "SINGULAR",
    "TEMPLATE_RULES",
    "TERMINAL_PHASES",
    "VERSION",
    "Backend",
    "Backoff",
    "CheckpointSpec",
    "CleanPodPolicy",
    "Condition",
    "Container",
    "ElasticPolicy",
    "ExitCode",
    "FailurePolicy",
    "FailureRecord",
    "GangScheduler",
    "GangSpec",
    "GenerationRecord",
    "InitializerSource",
    "InitializerStatus",
    "InitializerVolume",
    "InitializersSpec",
    "LeavingWorker",
    "MembershipPolicy",
    "ObjectMeta",
    "ObjectMetaTemplate",
    "Phase",
    "Placement",
    "PodSpec",
    "PodTemplateSpec",
    "Progress",
    "PvcSource",
    "Rule",
    "RunPolicy",
    "RuntimeKind",
    "RuntimeRef",
    "RuntimeStatus",
    "SchedulingSpec",
    "SilentWorker",
    "TorchJob",
    "TorchJobSpec",
    "TorchJobStatus",
    "Tracking",
    "loop_step",
    "parse_quantity",
]

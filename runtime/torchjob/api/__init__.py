"""The TorchJob API: pydantic models that are the single source of truth for the CRD.

Importing this package never imports torch (the operator image has none).
"""

from torchjob.api.models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Backend,
    CheckpointSpec,
    CleanPodPolicy,
    Condition,
    ElasticPolicy,
    FailurePolicy,
    FailureRecord,
    MembershipPolicy,
    Phase,
    PodTemplateSpec,
    Progress,
    RunPolicy,
    SchedulingSpec,
    TorchJob,
    TorchJobSpec,
    TorchJobStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Backend",
    "CheckpointSpec",
    "CleanPodPolicy",
    "Condition",
    "ElasticPolicy",
    "FailurePolicy",
    "FailureRecord",
    "MembershipPolicy",
    "Phase",
    "PodTemplateSpec",
    "Progress",
    "RunPolicy",
    "SchedulingSpec",
    "TorchJob",
    "TorchJobSpec",
    "TorchJobStatus",
]

"""The choices of a TorchJob's spec, and the defaults of its immutable fields.

Both the models (``spec``) and the rule table (``rules``) take a default from here: a field
left out of a job has its default, so the immutability rules compare the effective values
(``transition``) and must use the default the models apply.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


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


NPROC_PER_NODE: Final = 1
"""``spec.nprocPerNode`` left out."""
BACKEND: Final = Backend.AUTO
"""``spec.backend`` left out."""
MEMBERSHIP_POLICY: Final = MembershipPolicy.RECREATE_GROUP
"""``spec.membershipPolicy`` left out."""
MANAGED_BY: Final = "torchjob.io/operator"
"""``spec.managedBy`` left out: the torchjob operator runs the job."""
MANAGED_BY_PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9][-A-Za-z0-9_./]*$"
)
"""``spec.managedBy``: a domain-prefixed path, as batch/v1 Job's (``kueue.x-k8s.io/multikueue``)."""
CHECKPOINT_MOUNT_PATH: Final = "/checkpoints"
"""``spec.checkpoint.pvc.mountPath`` left out."""

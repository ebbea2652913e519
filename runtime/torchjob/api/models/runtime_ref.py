"""``spec.runtimeRef``: the runtime blueprint a TorchJob (or a TorchTune's trial template)
starts from. The blueprints themselves are ``torchjob.api.runtimes``; the merge is
``torchjob.api.merge``."""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from torchjob.api.models.base import _Model
from torchjob.api.models.limits import DNS_SUBDOMAIN


class RuntimeKind(str, Enum):
    TORCH_RUNTIME = "TorchRuntime"
    """A namespaced blueprint, in the job's namespace."""
    CLUSTER_TORCH_RUNTIME = "ClusterTorchRuntime"
    """A cluster-scoped blueprint, shared by every namespace."""


class RuntimeRef(_Model):
    """Which blueprint: its name and kind (a ClusterTorchRuntime unless told otherwise)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The blueprint's metadata.name.",
    )
    kind: RuntimeKind = Field(
        default=RuntimeKind.CLUSTER_TORCH_RUNTIME,
        description=(
            "ClusterTorchRuntime (cluster-wide, the default) or TorchRuntime (in the job's "
            "namespace)."
        ),
    )

    def describe(self) -> str:
        """``ClusterTorchRuntime gpu-8``: how errors and Events name the blueprint."""
        return f"{self.kind.value} {self.name}"

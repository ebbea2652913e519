"""The pod template of the workers: only what the operator reads is typed and checked.

In the CRD its schema is Kubernetes' own (``torchjob.api.kube_schema``) plus
``pod_types.TEMPLATE_RULES``; the rules of the table that have a Python check run here.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import Field, model_validator

from torchjob.api.models.base import _Passthrough
from torchjob.api.models.limits import parse_quantity
from torchjob.api.models.rule import Quantity, Resources
from torchjob.api.models.rules import enforce


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
    ``TEMPLATE_RULES`` of ``pod_types``; here only what the operator reads is typed and checked."""

    metadata: ObjectMetaTemplate | None = None
    spec: PodSpec

    @model_validator(mode="after")
    def _operator_fields(self) -> PodTemplateSpec:
        """Template values the operator would have to override are errors, not rewrites."""
        enforce("PodSpec", self.spec)
        enforce("PodTemplateSpec", self)
        for i, c in enumerate(self.spec.containers):
            _check_resources(f"spec.template.spec.containers[{i}].resources", c.resources)
        return self


def _check_resources(where: str, resources: dict[str, Any] | None) -> None:
    """Quantities parse, then the table's rules on each quantity and on the container's limits
    and requests together (not negative, whole GPUs, requests within limits)."""
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
            enforce("Quantity", Quantity(where, kind, name, q))
            parsed[kind][name] = q
    enforce("Resources", Resources(where, parsed["limits"], parsed["requests"]))

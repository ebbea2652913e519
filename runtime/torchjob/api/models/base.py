"""The base classes of every API model and the shape of one CEL rule.

Python attribute names are snake_case; the wire format (and the CRD) is camelCase, as
Kubernetes expects.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

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

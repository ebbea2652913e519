"""``spec.placement``: where in the cluster's network topology a TorchJob's workers go.

A topology level is a node label key (``cloud.provider.com/topology-block``, a rack label,
``kubernetes.io/hostname``); a domain is one value of it. With Kueue, the request becomes
the Workload pod set's ``topologyRequest`` (Kueue's Topology-Aware Scheduling); without it,
pod affinity that the default scheduler honours. docs/fits-your-cluster.md says how.

The rules (``PLACEMENT_RULES``) are part of the rule table ``torchjob.api.models.rules.RULES``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from torchjob.api.models.base import CEL, _Model
from torchjob.api.models.limits import LABEL_KEY, MAX_REPLICAS
from torchjob.api.models.rule import Rule, cel_on, enforce_rules

MAX_LEVEL = 63
"""Kueue keeps a topology level (``topologyRequest.required``) to 63 characters."""


def _label_ok(attr: str) -> Callable[[Any], object]:
    """The check that ``attr`` of a Placement is unset or a label key."""
    return lambda p: getattr(p, attr) is None or re.match(LABEL_KEY, getattr(p, attr))


PLACEMENT_RULES: tuple[Rule, ...] = (
    Rule(
        "placement-one-level",
        on="Placement",
        cel="has(self.required) != has(self.preferred)",
        message=(
            "spec.placement needs exactly one of required or preferred: the node label of the "
            "topology level (e.g. required: topology.example.com/rack)"
        ),
        check=lambda p: (p.required is None) != (p.preferred is None),
    ),
    Rule(
        "placement-slice-pair",
        on="Placement",
        cel="has(self.sliceLevel) == has(self.sliceSize)",
        message=(
            "spec.placement.sliceLevel and spec.placement.sliceSize go together: a slice is "
            "sliceSize workers in one domain of sliceLevel"
        ),
        check=lambda p: (p.slice_level is None) == (p.slice_size is None),
    ),
    *(
        Rule(
            f"placement-{field}-label",
            on="Placement",
            field=field,
            cel=f"self.matches(r'{LABEL_KEY}')",
            message=(
                f"spec.placement.{field} must be a node label key (e.g. "
                "topology.example.com/rack or kubernetes.io/hostname)"
            ),
            check=_label_ok(attr),
        )
        for field, attr in (
            ("required", "required"),
            ("preferred", "preferred"),
            ("sliceLevel", "slice_level"),
        )
    ),
    Rule(
        "placement-slice-fits",
        on="TorchJobSpec",
        cel=(
            "!has(self.placement) || !has(self.placement.sliceSize) || "
            "self.placement.sliceSize <= self.replicas"
        ),
        message="spec.placement.sliceSize must not exceed spec.replicas",
        check=lambda s: (
            s.placement is None
            or s.placement.slice_size is None
            or s.placement.slice_size <= s.replicas
        ),
    ),
)
"""The rules of ``spec.placement``, in the rule table's order."""


class Placement(_Model):
    """Topology request: every worker in one domain of a topology level (a node label such as
    a block, rack or host label), required or preferred, optionally in slices of sliceSize
    workers that each share a domain of sliceLevel. Through Kueue's Topology-Aware
    Scheduling, else pod affinity (docs/fits-your-cluster.md)."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_on(PLACEMENT_RULES, "Placement")})

    required: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LEVEL,
        description=(
            "Node label key of the topology level that must hold every worker (one block, one "
            "rack); the job waits until one domain has room for all of them."
        ),
        json_schema_extra={CEL: cel_on(PLACEMENT_RULES, "Placement", "required")},
    )
    preferred: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LEVEL,
        description=(
            "Node label key of the topology level the workers should share; when no domain "
            "has room, they spread over the fewest domains of the levels above."
        ),
        json_schema_extra={CEL: cel_on(PLACEMENT_RULES, "Placement", "preferred")},
    )
    slice_level: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_LEVEL,
        description=(
            "Node label key of the level each slice of sliceSize consecutive workers must share "
            "(Kueue's podSetSliceRequiredTopology)."
        ),
        json_schema_extra={CEL: cel_on(PLACEMENT_RULES, "Placement", "sliceLevel")},
    )
    slice_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REPLICAS,
        description="Workers per slice (Kueue's podSetSliceSize); needs sliceLevel.",
    )

    @model_validator(mode="after")
    def _rules(self) -> Placement:
        enforce_rules(PLACEMENT_RULES, "Placement", self)
        return self

    @property
    def level(self) -> str:
        """The level asked for, required or preferred."""
        return self.required or self.preferred or ""


class PlacementDomain(_Model):
    """One domain the job holds: its value at each level, and the workers admitted to it."""

    values: list[str] = Field(max_length=16, description="The domain's value at each level.")
    workers: int = Field(ge=0, description="Workers the admission put in it.")


class PlacementStatus(_Model):
    """The domains a job holds, from its Kueue admission (``spec.placement``)."""

    levels: list[str] = Field(
        max_length=16, description="Node label keys, from the highest level to the lowest."
    )
    domains: list[PlacementDomain] = Field(
        max_length=256, description="The domains, sorted (at most 256 are listed)."
    )

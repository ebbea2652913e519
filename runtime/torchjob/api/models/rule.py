"""One validation rule, written once: its CEL for the CRD and its Python check for pydantic.

``torchjob.api.models.rules.RULES`` lists every rule; the CRD's ``x-kubernetes-validations``
come from it (``cel_of``) and so do the model validators (``enforce``), so
``torchjob run -f job.yaml`` rejects what the cluster would, with the same message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from torchjob.api.models.base import _cel


class Quantity(NamedTuple):
    """One parsed quantity of a container's resources: the subject of per-value rules."""

    where: str
    """e.g. ``spec.template.spec.containers[0].resources``."""
    kind: str
    """``limits`` or ``requests``."""
    name: str
    value: Decimal


class Resources(NamedTuple):
    """A container's parsed resources: the subject of rules between limits and requests."""

    where: str
    limits: Mapping[str, Decimal]
    requests: Mapping[str, Decimal]


@dataclass(frozen=True)
class Rule:
    """A rule of the TorchJob API, for the API server (CEL) and for pydantic (``check``)."""

    name: str
    """A short id (tests and docs name the rule by it)."""
    on: str
    """The schema that carries the CEL: a model of this package (``TorchJobSpec``), a
    Kubernetes type of the pod template (``io.k8s.api.core.v1.Container``), or ``TorchJob``
    (the whole object)."""
    cel: str
    message: str
    field: str = ""
    """The wire name of the property of ``on`` whose schema carries the CEL (``""``: ``on``)."""
    field_path: str | None = None
    """``fieldPath`` of the CEL rule: where the API server reports it."""
    check: Callable[[Any], object] | None = None
    """The Python check on ``subject``: truthy when the object keeps the rule."""
    subject: str = ""
    """What ``check`` takes: a model's class name (default: ``on``), or ``Quantity`` /
    ``Resources`` (a container's resources, parsed). The model validators call
    ``enforce(subject, obj)``."""
    explain: Callable[[Any], str] | None = None
    """The Python error when it can name the offending values (the CEL message cannot)."""
    unchecked: str = ""
    """Why pydantic has no check of this rule (a rule has a check or a reason, never both)."""

    def __post_init__(self) -> None:
        if (self.check is None) == (not self.unchecked):
            raise ValueError(f"rule {self.name}: give either a check or why there is none")
        if not self.subject:
            object.__setattr__(self, "subject", self.on)

    def entry(self) -> Any:
        """The ``x-kubernetes-validations`` entry."""
        if self.field_path is None:
            return _cel(self.cel, self.message)
        return _cel(self.cel, self.message, fieldPath=self.field_path)


def cel_on(rules: Iterable[Rule], on: str, field: str = "") -> list[Any]:
    """The ``x-kubernetes-validations`` of one schema (``on``, or its property ``field``)."""
    return [r.entry() for r in rules if r.on == on and r.field == field]


def enforce_rules(rules: Iterable[Rule], subject: str, obj: object) -> None:
    """Raise ``ValueError`` with the message of the first rule on ``subject`` that ``obj``
    breaks (in the order of the table)."""
    for rule in rules:
        if rule.subject == subject and rule.check is not None and not rule.check(obj):
            raise ValueError(rule.explain(obj) if rule.explain else rule.message)

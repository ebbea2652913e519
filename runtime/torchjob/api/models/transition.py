"""Immutable fields: the transition rules of the rule table, which compare effective values.

A field left out of a job has its default (``choices``, the models' own), so a field that is
written with its default value and one that is left out are the same job: GitOps tools,
kustomize overlays and Helm charts add and drop such lines all the time. ``immutable`` makes
the rule of one field from its ``Shape``, what "unchanged" means for it; CEL compares the old
and the new object's effective values:

=====================  =============================================================
``Shape``              unchanged when
=====================  =============================================================
``REQUIRED``           the values are equal (the field is always there)
``OPTIONAL``           both leave it out, or both have it with equal values (no default:
                       adding or removing it is a change)
a default (``'auto'``)  the values are equal, the default standing in where it is left out
a mapping              both leave the object out, or both have it and each of its fields
                       is unchanged by its own shape
=====================  =============================================================

With ``spec.runtimeRef`` a field the job leaves out comes from the blueprint, whose value the
API server cannot see: there the rule of a field the blueprint may set (``from_blueprint``)
compares the fields as written, so adding or removing one stays a change.
``tests/unit/test_rule_table.py`` checks every shape against the models.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeAlias

from torchjob.api.models.rule import Rule
from torchjob.api.models.rule_parts import IMMUTABLE, TRANSITION


class Presence(Enum):
    """A field without a default: always present, or optional with no value standing in."""

    REQUIRED = "required"
    OPTIONAL = "optional"


REQUIRED = Presence.REQUIRED
OPTIONAL = Presence.OPTIONAL

Shape: TypeAlias = Presence | str | int | Mapping[str, "Shape"]
"""``REQUIRED``, ``OPTIONAL``, a default (an ``int``, a ``str`` or a ``str`` enum), or the
shapes of an optional object's fields by their wire names."""


def literal(value: str | int) -> str:
    """``value`` as a CEL literal (a ``str`` enum by its value)."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def same(new: str, old: str, shape: Shape) -> str:
    """CEL: the field at ``new`` (``self.backend``) and at ``old`` (``oldSelf.backend``) have
    the same effective value."""
    if shape is REQUIRED:
        return f"{new} == {old}"
    if shape is OPTIONAL:
        return f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))"
    if isinstance(shape, Mapping):
        inner = " && ".join(same(f"{new}.{k}", f"{old}.{k}", s) for k, s in shape.items())
        return f"(has({new}) == has({old}) && (!has({new}) || ({inner})))"
    assert isinstance(shape, str | int)
    value = literal(shape)
    return f"(has({new}) ? {new} : {value}) == (has({old}) ? {old} : {value})"


def immutable(field: str, shape: Shape, *, from_blueprint: bool) -> Rule:
    """The rule that ``spec.<field>`` keeps its effective value while the job exists."""
    new, old = f"self.{field}", f"oldSelf.{field}"
    cel, as_written = same(new, old, shape), same(new, old, OPTIONAL)
    if isinstance(shape, str | int):
        why = f"left out, it is {literal(shape)}"
        if from_blueprint:
            why += (
                "; with spec.runtimeRef it comes from the blueprint and cannot be added or removed"
            )
    else:
        why = "it cannot be added to or removed from an existing job"
    if from_blueprint and cel != as_written:
        cel = f"has(self.runtimeRef) ? {as_written} : {cel}"
    return Rule(
        f"{field}-immutable",
        on="TorchJobSpec",
        cel=cel,
        message=f"spec.{field} {IMMUTABLE} ({why})",
        field_path=f".{field}",
        unchecked=TRANSITION,
    )

"""A job's runtime blueprint (``spec.runtimeRef``): resolved once, then pinned. Pure.

``observe`` reads the pinned snapshot from ``status.runtime``, or, before the job has one,
the blueprint itself (``Kube.get_runtime``); ``resolve_runtime`` merges the job over it
(``torchjob.api.merge``) and checks the result as a full TorchJob. A job keeps the
blueprint it started with: once pinned, the snapshot is all that is read, so editing or
deleting the blueprint never changes a running job, nor the pods of a later generation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from torchjob.api.merge import MergeError
from torchjob.api.merge import resolve as merge_resolve
from torchjob.api.models import RuntimeRef, RuntimeStatus, TorchJobSpec, TorchJobStatus

RETRY_S = 10.0
"""How often a job waiting for its blueprint looks again (the blueprint is not watched)."""


@dataclass(frozen=True)
class Resolved:
    """The merged spec, or why there is none."""

    spec: TorchJobSpec | None
    pin: dict[str, Any] | None = None
    """``status.runtime`` to write before anything else (the first resolution only)."""
    reason: str = ""
    """``RuntimeNotFound`` (the job waits, ``retry_after_s``) or ``InvalidRuntimeMerge``."""
    detail: str = ""
    retry_after_s: float | None = None


def ref_of(spec: Mapping[str, Any]) -> RuntimeRef | None:
    """The job's ``spec.runtimeRef`` (None: the job is written in full). Raises
    ``ValidationError`` for a malformed one."""
    raw = spec.get("runtimeRef")
    return None if raw is None else RuntimeRef.model_validate(raw)


def pinned(job: Mapping[str, Any], ref: RuntimeRef) -> RuntimeStatus | None:
    """The snapshot this job pinned, if it did (and of this very blueprint)."""
    status = TorchJobStatus.parse(job.get("status")).runtime
    if status is None or (status.kind, status.name) != (ref.kind.value, ref.name):
        return None
    return status


def snapshot(ref: RuntimeRef, blueprint: Mapping[str, Any]) -> RuntimeStatus:
    """What a job pins of the blueprint it read."""
    meta = blueprint.get("metadata") or {}
    return RuntimeStatus(
        kind=ref.kind.value,
        name=ref.name,
        resource_version=meta.get("resourceVersion"),
        generation=meta.get("generation"),
        spec=dict(blueprint.get("spec") or {}),
    )


def resolve_runtime(
    job: Mapping[str, Any],
    ref: RuntimeRef,
    pin: RuntimeStatus | None,
    fetched: Mapping[str, Any] | None,
) -> Resolved:
    """The job's spec over its pinned snapshot (``pin``), else over the blueprint just read
    (``fetched``; None: it does not exist)."""
    meta = job.get("metadata") or {}
    who = f"TorchJob {meta.get('namespace')}/{meta.get('name')}"
    where = f" in namespace {meta.get('namespace')}" if ref.kind.value == "TorchRuntime" else ""
    if pin is None and fetched is None:
        return Resolved(
            None,
            reason="RuntimeNotFound",
            detail=(
                f"{who}: spec.runtimeRef names {ref.describe()}, which does not exist{where}; "
                f"the job starts once it does (checked every {RETRY_S:g}s)"
            ),
            retry_after_s=RETRY_S,
        )
    base = pin if pin is not None else snapshot(ref, fetched or {})
    try:
        merged = merge_resolve(base.spec, job.get("spec") or {}, source=ref.describe())
    except (MergeError, ValidationError) as err:
        return Resolved(
            None,
            reason="InvalidRuntimeMerge",
            detail=f"{who} over {ref.describe()} is not a valid TorchJob: {err}",
        )
    return Resolved(
        merged,
        pin=None if pin is not None else base.to_wire(),
    )


__all__ = ["RETRY_S", "Resolved", "pinned", "ref_of", "resolve_runtime", "snapshot"]

"""Who runs a TorchJob: ``spec.managedBy``, honoured like batch/v1 Job's. Pure; no I/O.

=================================  ========================================================
``spec.managedBy``                 what this operator does with the job
=================================  ========================================================
left out, ``torchjob.io/operator``  everything (``Role.RUN``)
``kueue.x-k8s.io/multikueue``       with a LocalQueue, only its Kueue Workload
                                   (``Role.QUEUE``): Kueue's jobframework makes the Workload of
                                   a batch Job MultiKueue dispatches, and for a TorchJob the
                                   operator is that jobframework. MultiKueue admits the
                                   Workload to a worker cluster, creates the job there without
                                   ``managedBy`` and copies the worker's status back here; no
                                   pod, no status write, no Workload status patch here.
                                   Without a queue: nothing (MultiKueue has nothing to admit)
anything else                      nothing (``Role.NONE``): another controller runs it
=================================  ========================================================

On a worker cluster the job MultiKueue creates carries ``kueue.x-k8s.io/prebuilt-workload-name``:
its Workload is the one MultiKueue made there (``prebuilt_workload``), which the operator uses
as it finds it instead of making its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, Final

from torchjob.api.models import choices

OURS: Final = choices.MANAGED_BY
MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
PREBUILT_LABEL: Final = "kueue.x-k8s.io/prebuilt-workload-name"


class Role(Enum):
    RUN = "run"
    """Ours: pods, status, the Workload and its status."""
    QUEUE = "queue"
    """MultiKueue's: the Workload is made (and replaced when stale), nothing else is written."""
    NONE = "none"
    """Another controller's: nothing is read or written."""


def managed_by(job: Mapping[str, Any]) -> str:
    """The job's ``spec.managedBy``, its default where it is left out (or not a string)."""
    value = (job.get("spec") or {}).get("managedBy")
    return value if isinstance(value, str) and value else OURS


def role_of(job: Mapping[str, Any], queued: bool) -> Role:
    """What the operator does with ``job``; ``queued``: it names a LocalQueue."""
    by = managed_by(job)
    if by == OURS:
        return Role.RUN
    if by == MULTIKUEUE and queued:
        return Role.QUEUE
    return Role.NONE


def prebuilt_workload(job: Mapping[str, Any]) -> str | None:
    """The Workload MultiKueue made for this job (a worker cluster's copy), if any."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    name = labels.get(PREBUILT_LABEL)
    return name if isinstance(name, str) and name else None


__all__ = [
    "MULTIKUEUE",
    "OURS",
    "PREBUILT_LABEL",
    "Role",
    "managed_by",
    "prebuilt_workload",
    "role_of",
]

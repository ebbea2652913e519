"""The decisions that depend on what a write answered, as pure functions of the plan and
the answers (``Created``): the status when a create failed or an earlier same-named job's
object is in the way, the Events of what was made, whether the status write is held back
(``defer_progress``), and when to look again. ``act`` makes the writes, ``controller``
calls ``amend`` between the creates and the status patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchjob import contract
from torchjob.api.models import TorchJobStatus
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.decision import JobView, Plan
from torchjob_operator.torchjob.plan import FOREIGN_RECHECK_S
from torchjob_operator.torchjob.status import progress_only, set_not_ready, status_changed


@dataclass(frozen=True)
class WriteFailure:
    """A create the API server refused, as plain values."""

    text: str
    permanent: bool
    """Retrying cannot help (a 4xx other than 409/429): the job is Stalled."""


@dataclass(frozen=True)
class Created:
    """What the creates of one pass answered (``act.create``)."""

    earlier: str | None = None
    """``<kind> <name>`` of an earlier same-named job's Service or account, still there."""
    service: bool = False
    accounts: tuple[str, ...] = ()
    """Kinds of the worker account's objects created now."""
    group: bool = False
    group_failure: WriteFailure | None = None
    pods: tuple[str, ...] = ()
    pod_failures: tuple[WriteFailure, ...] = ()
    probes: tuple[str, ...] = ()

    @property
    def failures(self) -> tuple[WriteFailure, ...]:
        """Why not every pod exists (no pod is created without its PodGroup)."""
        return (self.group_failure,) if self.group_failure is not None else self.pod_failures


@dataclass(frozen=True)
class Amended:
    status: dict[str, Any]
    events: tuple[Event, ...]
    """To post once the status landed (before the Event of the deletions)."""
    write_status: bool
    deferred: bool
    """A status write that only moved the worker counts is held back."""
    requeue_after_s: float | None
    stop: bool = False
    """Nothing more this pass: no pod may be created yet (an earlier job's object)."""


def amend(
    view: JobView,
    decided: Plan,
    events: tuple[Event, ...],
    created: Created,
    *,
    old_status: Mapping[str, Any],
    now: datetime,
    defer_progress: bool,
    progress_batch_s: float,
    workload_read: bool = False,
) -> Amended:
    """The pass once its creates answered. ``events``: the Workload's and the plan's;
    ``workload_read``: the job's Workload was read as it should be (not made or replaced now)."""
    if created.earlier is not None:
        # A same-named earlier job's account or Service is still there (the garbage
        # collector removes it soon): pods now would run under the account about to vanish.
        status = _not_ready(
            view,
            decided.status,
            "WaitingForEarlierJob",
            cond.message("WaitingForEarlierJob", what=created.earlier, name=view.name),
            stalled=False,
            now=now,
        )
        return Amended(
            status, (), status_changed(old_status, status), False, FOREIGN_RECHECK_S, stop=True
        )
    events = events + made_events(view.name, decided, created)
    failures = created.failures
    status = decided.status
    if failures:
        # Not all pods exist: the generation is not "created" yet, so a later pass retries.
        first = failures[0]
        reason = "FailedCreatePodGroup" if created.group_failure is not None else "FailedCreatePod"
        status = _not_ready(view, status, reason, first.text, stalled=first.permanent, now=now)
    deferred = holds_back(defer_progress, decided, events, created, old_status, status)
    changed = not deferred and status_changed(old_status, status)
    requeue = requeue_after(
        decided,
        events,
        created,
        deferred=deferred,
        batch_s=progress_batch_s,
        admitting=view.kueue is not None and not workload_read,
    )
    return Amended(status, events, changed, deferred, requeue)


def _not_ready(
    view: JobView,
    status: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    stalled: bool,
    now: datetime,
) -> dict[str, Any]:
    """The planned status with Ready=False for ``reason``, the generation not created (and
    the pods to place again as they were, for the generation they were of)."""
    planned = TorchJobStatus.parse(status)
    same = planned.current_generation == view.state.generation
    amended = set_not_ready(
        planned,
        reason=reason,
        message=message,
        stalled=stalled,
        now=format_time(now),
        observed_generation=view.metadata_generation,
    )
    return amended.model_copy(
        update={
            "created_generation": view.state.created_generation,
            "placing_again": (list(view.state.placing_again) or None) if same else None,
        }
    ).to_patch()


def made_events(name: str, decided: Plan, created: Created) -> tuple[Event, ...]:
    """One Event per kind of object made (an Event is a write too), failures as Warnings."""
    out: list[Event] = []
    if created.service:
        out.append(Event.of("CreatedService", name=name))
    if created.accounts:  # one Event for the three
        account = contract.worker_service_account(name)
        out.append(
            Event.of("CreatedWorkerAccount", kinds=", ".join(created.accounts), name=account)
        )
    if created.group and decided.create is not None:
        out.append(Event.of("CreatedPodGroup", name=name, min=decided.create.replicas))
    if created.group_failure is not None:
        out.append(
            Event.of("FailedCreatePodGroup", warning=True, detail=created.group_failure.text)
        )
    elif decided.create is not None:
        if created.pods:
            out.append(
                Event.of(
                    "CreatedPod", pods=pods_text(created.pods), generation=decided.create.generation
                )
            )
        out.extend(
            Event.of("FailedCreatePod", warning=True, detail=f.text)
            for f in created.pod_failures[:3]
        )
    out.extend(Event.of("CreatedProbe", name=probe) for probe in created.probes)
    return tuple(out)


def pods_text(names: tuple[str, ...] | list[str]) -> str:
    """The pods of one pass for its one Event, not one Event per pod: an Event is a write
    to the API server (and to etcd), and a 64-pod generation would post 64 of them."""
    if len(names) == 1:
        return f"pod {names[0]}"
    return f"{len(names)} pods: {', '.join(names)}"


def holds_back(
    defer_progress: bool,
    decided: Plan,
    events: tuple[Event, ...],
    created: Created,
    old_status: Mapping[str, Any],
    status: Mapping[str, Any],
) -> bool:
    """Whether the status write waits (``defer_progress``): only when this pass changes
    nothing but how many workers are where; no pod made or removed, nothing to announce."""
    return (
        defer_progress
        and not decided.create
        and not decided.delete
        and not decided.relabel
        and not events
        and not created.failures
        and progress_only(old_status, status)
    )


def requeue_after(
    decided: Plan,
    events: tuple[Event, ...],
    created: Created,
    *,
    deferred: bool,
    batch_s: float,
    admitting: bool,
) -> float | None:
    """When to run again with nothing happening: the plan's time, sooner while the Workload
    is being (re)made, after a failed create, or when a held-back status write is due."""
    requeue = decided.requeue_after_s
    if admitting or any(e.reason == "FailedWorkload" for e in events):
        # (FailedWorkload comes with a gate: Kueue manages the job)
        requeue = min(requeue or 5.0, 5.0)  # the Workload is being (re)made: look again soon
    failures = created.failures
    if failures:
        requeue = min(requeue or 30.0, 30.0 if failures[0].permanent else 5.0)
    if deferred:
        requeue = min(requeue or batch_s, batch_s)
    return requeue

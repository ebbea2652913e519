"""The Kueue Workload of one TorchJob, decided: what ``observe`` read (``WorkloadSeen``)
becomes the write to make before the pods (create or replace the Workload), the ``Gate``
the planner holds the job at, and, after the pods, the Workload's status patch (its quota
released after an eviction, or Finished). Pure: ``observe`` reads, ``act`` writes.

Order of one pass (``controller``): the Workload's write comes first, since the gate of a
job whose Workload was just (re)made is "waiting"; its answer amends the step
(``after_write``): the Event only for a write that happened, a failed write holds the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from torchjob.api.models import Phase, TorchJobSpec
from torchjob_operator.common.clock import format_time
from torchjob_operator.common.events import Event
from torchjob_operator.resources.pods import worker_pod
from torchjob_operator.torchjob import kueue
from torchjob_operator.torchjob.topology import Assignment, topology_request


@dataclass(frozen=True)
class Failure:
    """A read or a write that failed, as plain values: its text and HTTP status."""

    text: str
    status: int | None = None


@dataclass(frozen=True)
class WorkloadSeen:
    """What ``observe`` read of a job's Workload, in the order it reads it: the Workload;
    unless the job ended or the Workload is an earlier same-named job's, the priority
    class's value; when the Workload is as wanted, the ResourceFlavors it was admitted to."""

    job: str
    """The TorchJob's ``namespace/name``."""
    queue: str
    name: str
    existing: Mapping[str, Any] | None = None
    owned: bool = True
    terminal: bool = False
    priority_class: str | None = None
    missing_priority_class: bool = False
    desired: Mapping[str, Any] | None = None
    """The Workload the spec wants (None when not looked at: ended, or not ours)."""
    count: int = 0
    flavors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    failure: Failure | None = None
    """A read failed: nothing after it was read."""
    topology: Assignment | None = None
    """The admission's topology assignment with every level filled in (``observe``)."""
    prebuilt: bool = False
    """MultiKueue made the Workload (``managed.PREBUILT_LABEL``, on a worker cluster): it is
    used as found, never made, replaced or deleted by the operator."""


def owns(existing: Mapping[str, Any], uid: str, prebuilt: bool) -> bool:
    """The Workload is the job's: owned by it, or a prebuilt one that no one owns."""
    refs = (existing.get("metadata") or {}).get("ownerReferences")
    return kueue.owned_by(existing, uid) or (prebuilt and not refs)


def desired(
    job: Mapping[str, Any],
    spec: TorchJobSpec,
    queue: str,
    priority_class: str | None,
    priority: int | None,
) -> tuple[dict[str, Any], int]:
    """The Workload the spec wants, and its pod count."""
    meta = job["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    worker = worker_pod(
        name=name,
        namespace=namespace,
        uid=uid,
        spec=spec,
        index=0,
        generation=0,
        replicas=spec.replicas,
    )
    # Standbys run pods too: Kueue admits the quota for them with the workers.
    count = spec.replicas + spec.standby_replicas
    body = kueue.desired_workload(
        name=name,
        namespace=namespace,
        uid=uid,
        queue=queue,
        count=count,
        worker=worker,
        priority_class=priority_class,
        priority=priority,
        topology=None if spec.placement is None else topology_request(spec.placement),
    )
    return body, count


def wants_flavors(seen: WorkloadSeen) -> bool:
    """Whether the gate will be read off the Workload (so its flavors are needed)."""
    return seen.existing is not None and (
        seen.prebuilt or (seen.desired is not None and kueue.matches(seen.existing, seen.desired))
    )


@dataclass(frozen=True)
class WorkloadStep:
    """The Workload's part of one pass."""

    gate: kueue.Gate | None
    workload: Mapping[str, Any] | None = None
    """The Workload read, to settle after the pods; None when it is (re)made now."""
    create: Mapping[str, Any] | None = None
    delete: tuple[str, str, str] | None = None
    """(namespace, name, uid) of a Workload to delete: the job's pod set changed."""
    events: tuple[Event, ...] = ()
    warning: str | None = None
    """A line for the log (a failure)."""
    written_event: Event | None = None
    """The Event of the write above, posted only if it happened."""


def sync(seen: WorkloadSeen, phase: Phase | None) -> WorkloadStep:
    """Make the job's Workload exist as the spec wants it; its gate for the planner."""
    waiting = kueue.Gate(workload=seen.name, queue=seen.queue)
    if seen.failure is not None:
        return failed(seen, seen.failure, phase)
    if seen.terminal:
        return WorkloadStep(
            kueue.Gate(admitted=True, workload=seen.name, queue=seen.queue), seen.existing
        )
    if seen.existing is not None and not seen.owned:
        # An earlier same-named job's: the garbage collector removes it.
        return WorkloadStep(waiting)
    if seen.missing_priority_class:
        return failed(seen, Failure(_missing_class(seen)), phase)
    if seen.existing is None and seen.prebuilt:
        return WorkloadStep(waiting)  # MultiKueue makes it before the job; it may be gone
    if seen.existing is None:
        assert seen.desired is not None
        made = Event.of("CreatedWorkload", name=seen.name, queue=seen.queue, count=seen.count)
        return WorkloadStep(waiting, create=seen.desired, written_event=made)
    if not wants_flavors(seen):
        namespace = seen.job.partition("/")[0]
        gone = Event.of("DeletedWorkload", name=seen.name)
        return WorkloadStep(
            waiting,
            delete=(namespace, seen.name, seen.existing["metadata"]["uid"]),
            written_event=gone,
        )
    gate = kueue.gate_of(seen.existing, seen.flavors, queue=seen.queue)
    if seen.topology is not None:
        gate = replace(gate, topology=seen.topology)
    return WorkloadStep(gate, seen.existing)


def _missing_class(seen: WorkloadSeen) -> str:
    return (
        f"WorkloadPriorityClass {seen.priority_class} (label {kueue.PRIORITY_LABEL} of "
        f"TorchJob {seen.job}) does not exist"
    )


def failed(seen: WorkloadSeen, failure: Failure, phase: Phase | None) -> WorkloadStep:
    """A read or write failed. A 404 is the Workload API not being served: Kueue is not
    installed, its queue label is inert (as on a batch Job) and the job runs without an
    admission; anything else holds the job (no pods without an admission), says why with a
    Warning Event, and tries again soon."""
    if failure.status == 404:
        if phase is None:
            return WorkloadStep(
                None, events=(Event.of("KueueNotInstalled", warning=True, queue=seen.queue),)
            )
        return WorkloadStep(None)
    return WorkloadStep(
        kueue.Gate(workload=seen.name, queue=seen.queue),
        events=(Event.of("FailedWorkload", warning=True, detail=failure.text),),
        warning=failure.text,
    )


def after_write(
    step: WorkloadStep, seen: WorkloadSeen, written: bool | Failure, phase: Phase | None
) -> WorkloadStep:
    """The step once its write answered: its Event if the write happened (False: someone
    else's create or delete came first), a failed write as a failed read."""
    if isinstance(written, Failure):
        return failed(seen, written, phase)
    if written and step.written_event is not None:
        return replace(step, events=(*step.events, step.written_event))
    return step


def write_outcome(
    step: WorkloadStep, seen: WorkloadSeen, written: bool | Failure, phase: Phase | None
) -> WorkloadStep:
    """The Workload's create or delete (planned by ``sync``, made after the plan) once it
    answered: ``events`` holds only what the write adds (its Event if it happened, or the
    failure's). A failed write keeps the gate closed (the job is re-examined 5 s later:
    ``amend.requeue_after``), except a 404: Kueue is not installed, the gate is None, and the
    caller plans the pass again without it."""
    return after_write(replace(step, events=()), seen, written, phase)


def settle(
    workload: Mapping[str, Any], phase: Phase, pods_left: bool, now: datetime
) -> tuple[Mapping[str, Any], Event] | None:
    """After the pods: an evicted job's quota goes back once no pod is left; a finished
    job's Workload is marked Finished. The patch, and its Event once it is written."""
    meta = workload["metadata"]
    stamp = format_time(now)
    if phase.is_terminal:
        patch = kueue.finish_patch(
            workload,
            succeeded=phase == Phase.SUCCEEDED,
            message=f"TorchJob {phase.value}",
            now=stamp,
        )
        event = Event.of("FinishedWorkload", name=meta["name"], result=phase.value)
    elif not pods_left:
        patch = kueue.release_patch(workload, stamp)
        event = Event.of("ReleasedQuota", name=meta["name"])
    else:
        return None
    return None if patch is None else (patch, event)

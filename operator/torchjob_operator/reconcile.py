"""One reconcile of one TorchJob: read the world, ask the planner, carry the plan out.

Order of the writes (JobSet's order, so that a crash at any point replays the
same decision):

1. pod creations (concurrently). A crash after them and before the status is
   harmless: the next pass finds the pods of a generation the status has not
   marked created yet and adopts them.
2. one status merge-patch. It records the decision (new generation, restarts,
   disruptions, ``lastFailure``, ``restartAfter``) *before* any pod of an older
   generation is touched.
3. relabels (KeepSurvivors) and deletions of pods of older generations. A crash
   before them is harmless too: those pods carry an older generation label, so
   the next pass (or this one's successors) deletes or relabels them, and they
   are never judged again, so a recorded failure can never be re-read as a
   disruption.
4. Events, only once the status landed, so an Event never announces something
   the status does not show.

Runs in a worker thread; the kopf handlers in ``handlers.py`` decide *when* it runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from torchjob import contract
from torchjob.api.models import Phase, TorchJobSpec, TorchJobStatus
from torchjob_operator import metrics
from torchjob_operator.common.clock import format_time
from torchjob_operator.common.conditions import message
from torchjob_operator.common.events import Event
from torchjob_operator.kube import EarlierOwnerError, Kube, KubeError
from torchjob_operator.resources.pods import headless_service, pod_group, probe_pod, worker_pod
from torchjob_operator.resources.rbac import worker_rbac
from torchjob_operator.settings import OperatorSettings
from torchjob_operator.torchjob import kueue
from torchjob_operator.torchjob.observed import (
    JobState,
    PodView,
    pod_view,
    probe_view,
    split_by_owner,
)
from torchjob_operator.torchjob.plan import FOREIGN_RECHECK_S, JobView, Plan, plan
from torchjob_operator.torchjob.status import progress_only, set_not_ready

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds ``ns/name`` (and the generation when known) to every line."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        return f"[{extra.get('job')}] {msg}", kwargs


@dataclass(frozen=True)
class Outcome:
    requeue_after_s: float | None
    """Run again after this long even if nothing happens; None: wait for a change."""
    gone: bool = False
    """The TorchJob no longer exists: stop its loop."""
    deferred: bool = False
    """A status write that only moved the worker counts was held back (``defer_progress``)."""


def validation_message(err: ValidationError) -> str:
    """Pydantic errors as 'spec.a.b: message' lines, with the wire (camelCase) names."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{loc}: {e['msg']}" if loc else str(e["msg"]))
    return "; ".join(parts)


def _invalid_status(job: Mapping[str, Any], detail: str, now: datetime) -> dict[str, Any]:
    """The partial status patch of an invalid spec: the conditions, nothing else touched."""
    prior = TorchJobStatus.parse(job.get("status"))
    invalid = set_not_ready(
        TorchJobStatus(conditions=prior.conditions),
        reason="InvalidSpec",
        message=detail,
        stalled=True,
        now=format_time(now),
        observed_generation=(job.get("metadata") or {}).get("generation"),
    )
    return invalid.model_dump(by_alias=True, mode="json", exclude_none=True)


def _status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())


def reconcile_once(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    settings: OperatorSettings,
    clock: Clock = utcnow,
    defer_progress: bool = False,
) -> Outcome:
    """One pass over one job. With ``defer_progress`` a status write that would only move
    the worker counts (``planner.status.progress_only``) is held back and the outcome asks
    to run again within ``settings.progress_batch_s``: while 8 pods start one by one, their
    job's status is written when the phase changes, not 8 times (the caller decides when
    the wait is over)."""
    log = JobLogger(logging.getLogger("torchjob_operator"), {"job": f"{namespace}/{name}"})
    job = kube.get_job(namespace, name)
    if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(None, gone=True)
    meta = job["metadata"]
    old_status: dict[str, Any] = job.get("status") or {}
    now = clock()
    metrics.RECONCILES.inc()

    def invalid(detail: str) -> Outcome:
        status = _invalid_status(job, detail, now)
        if _status_changed(old_status, status):
            kube.patch_job_status(namespace, name, status)
            kube.post_event(
                job,
                type_="Warning",
                reason="InvalidSpec",
                message=detail,
                component=settings.component,
            )
            log.warning("%s", detail)
        return Outcome(None)  # wait for the user to fix it; an update wakes us up

    try:
        spec = TorchJobSpec.model_validate(job.get("spec") or {})
    except ValidationError as err:
        return invalid(
            f"TorchJob {namespace}/{name} has an invalid spec: {validation_message(err)}"
        )

    # Only this job's pods count: a same-named earlier job's (another controller uid) wait.
    raw_pods, foreign = split_by_owner(kube.list_worker_pods(namespace, name), meta["uid"])
    pods = [v for v in (pod_view(p) for p in raw_pods) if v is not None]
    probes = [v for v in (probe_view(p) for p in raw_pods) if v is not None]
    state = JobState.from_status(old_status)
    queue = kueue.queue_of(
        meta.get("labels") or {},
        spec.scheduling.queue_name,
        ((job.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels"),
    )
    workload: dict[str, Any] | None = None
    gate: kueue.Gate | None = None
    kueue_events: list[Event] = []
    if queue is not None:
        try:
            workload, gate = _sync_workload(kube, job, spec, queue, state, kueue_events)
        except KubeError as e:
            if e.status != 404:
                gate = _failed_workload(name, queue, e, kueue_events)
                log.warning("%s", e)
            elif state.phase is None:
                # The Workload API is not served: Kueue is not installed, and its queue label
                # is inert, as on a batch Job; the job runs without an admission (gate None).
                kueue_events.append(Event.of("KueueNotInstalled", warning=True, queue=queue))
        except KueueProblem as e:
            gate = _failed_workload(name, queue, e, kueue_events)
            log.warning("%s", e)
    view = JobView(
        name=name,
        namespace=namespace,
        spec=spec,
        state=state,
        metadata_generation=meta.get("generation"),
        foreign_pods=foreign,
        kueue=gate,
    )
    try:  # judging and building are pure: an error here is the spec's, and retrying cannot help
        decided = plan(view, pods, now, probes)
        worker_bodies = _worker_bodies(name, namespace, meta["uid"], spec, decided)
        if gate is not None:
            for body in worker_bodies:
                kueue.apply_admission(body, gate.assignment)
        probe_bodies = [
            probe_pod(name=name, namespace=namespace, uid=meta["uid"], spec=spec, index=index)
            for index in decided.create_probes
        ]
    except Exception as err:
        metrics.RECONCILE_ERRORS.inc()
        return invalid(
            f"TorchJob {namespace}/{name} cannot be run as specified: {type(err).__name__}: {err}"
        )
    events = kueue_events + list(decided.events)
    status = dict(decided.status)

    # The Service and the worker account, all at once (one round trip, not four), and before
    # the pods: the ServiceAccount admission plugin rejects pods whose account is missing.
    pool = _fan_out(settings)
    service = (
        pool.submit(
            kube.ensure_service, headless_service(name=name, namespace=namespace, uid=meta["uid"])
        )
        if decided.ensure_service
        else None
    )
    try:
        rbac = (
            list(
                pool.map(
                    lambda kind_body: (kind_body[0], kube.ensure_rbac_object(*kind_body)),
                    worker_rbac(name=name, namespace=namespace, uid=meta["uid"]),
                )
            )
            if decided.create is not None
            else []
        )
        created_service = service is not None and service.result()
    except EarlierOwnerError as earlier:
        # A same-named earlier job's account or Service is still there (the garbage collector
        # removes it soon): pods now would run under the account about to vanish. Wait.
        waiting = set_not_ready(
            TorchJobStatus.parse(status),
            reason="WaitingForEarlierJob",
            message=message(
                "WaitingForEarlierJob", what=f"{earlier.kind} {earlier.name}", name=name
            ),
            stalled=False,
            now=format_time(now),
            observed_generation=meta.get("generation"),
        )
        status = waiting.model_copy(
            update={"created_generation": view.state.created_generation}
        ).to_patch()
        if _status_changed(old_status, status):
            kube.patch_job_status(namespace, name, status)
        log.info("%s", earlier)
        return Outcome(FOREIGN_RECHECK_S)
    if created_service:
        events.append(Event.of("CreatedService", name=name))
    made = [kind for kind, created in rbac if created]
    if made:  # one Event for the three (each is one more write to the API server)
        account = contract.worker_service_account(name)
        events.append(Event.of("CreatedWorkerAccount", kinds=", ".join(made), name=account))

    # Gang scheduling: the PodGroup holds exactly this generation's pods, before they exist.
    gang = spec.scheduling.gang
    group_failure: KubeError | None = None
    if gang is not None and decided.create is not None:
        group = pod_group(
            name=name,
            namespace=namespace,
            uid=meta["uid"],
            gang=gang,
            min_member=decided.create.replicas,
        )
        try:
            if kube.apply_pod_group(group):
                events.append(Event.of("CreatedPodGroup", name=name, min=decided.create.replicas))
        except KubeError as e:
            # No pods without their group (they would be scheduled one by one): say why and
            # retry; a missing PodGroup CRD (404) is permanent, so the job is Stalled.
            group_failure = e
            events.append(Event.of("FailedCreatePodGroup", warning=True, detail=str(e)))

    failures = (
        [group_failure]
        if group_failure is not None
        else _create_pods(kube, namespace, worker_bodies, decided, settings, events)
    )
    dying = next((f for f in failures if f.namespace_terminating), None)
    if dying is not None:
        raise dying  # the namespace takes the job with it: no FailedCreatePod, no Stalled
    for body in probe_bodies:
        if kube.create_pod(body):
            probe = body["metadata"]["name"]
            events.append(Event.of("CreatedProbe", name=probe))
    if failures:
        # Not all pods exist: the generation is not "created" yet, so a later reconcile retries.
        first = failures[0]
        amended = set_not_ready(
            TorchJobStatus.parse(status),
            reason="FailedCreatePodGroup" if group_failure is not None else "FailedCreatePod",
            message=str(first),
            stalled=first.permanent,
            now=format_time(now),
            observed_generation=meta.get("generation"),
        )
        status = amended.model_copy(
            update={"created_generation": view.state.created_generation}
        ).to_patch()

    deferred = (
        defer_progress
        and not decided.create
        and not decided.delete
        and not decided.relabel
        and not events
        and not failures
        and progress_only(old_status, status)
    )
    if deferred:
        metrics.STATUS_DEFERRED.inc()
    elif _status_changed(old_status, status):
        kube.patch_job_status(namespace, name, status)
        metrics.STATUS_PATCHES.inc()
        if old_status.get("phase") != status.get("phase"):
            log.info(
                "phase %s -> %s (generation %s, restarts %s/%s, disruptions %s)",
                old_status.get("phase"),
                status.get("phase"),
                status.get("currentGeneration"),
                status.get("restarts"),
                spec.failure_policy.max_restarts,
                status.get("disruptions"),
            )
            metrics.TRANSITIONS.labels(phase=status["phase"]).inc()
    # Only now that the decision is recorded: older generations' pods go (or join, relabelled).
    _relabel_pods(kube, namespace, decided, settings)
    uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in raw_pods}
    events += _delete_pods(kube, namespace, decided, uids, settings)
    for ev in events:
        kube.post_event(
            job, type_=ev.type, reason=ev.reason, message=ev.message, component=settings.component
        )

    if workload is not None:
        _settle_workload(kube, job, workload, raw_pods, decided, now, settings.component, log)

    if decided.delete_job:
        log.info(
            "deleting finished job (ttlSecondsAfterFinished=%s)",
            spec.run_policy.ttl_seconds_after_finished,
        )
        kube.delete_job(namespace, name)
        return Outcome(None, gone=True)
    requeue = decided.requeue_after_s
    if gate is not None and (workload is None or any(e.reason == "FailedWorkload" for e in events)):
        requeue = min(requeue or 5.0, 5.0)  # the Workload is being (re)made: look again soon
    if failures:
        requeue = min(requeue or 30.0, 30.0 if failures[0].permanent else 5.0)
    if deferred:
        requeue = min(requeue or settings.progress_batch_s, settings.progress_batch_s)
    return Outcome(requeue, deferred=deferred)


def _failed_workload(name: str, queue: str, err: Exception, events: list[Event]) -> kueue.Gate:
    """No pods without an admission: say why (the Warning Event), and try again soon."""
    events.append(Event.of("FailedWorkload", warning=True, detail=str(err)))
    return kueue.Gate(workload=kueue.workload_name(name), queue=queue)


class KueueProblem(Exception):
    """The job's Workload cannot be made as asked (a missing WorkloadPriorityClass)."""


def _sync_workload(
    kube: Kube,
    job: Mapping[str, Any],
    spec: TorchJobSpec,
    queue: str,
    state: JobState,
    events: list[Event],
) -> tuple[dict[str, Any] | None, kueue.Gate]:
    """Make the job's Workload exist as the spec wants it; its gate for the planner.
    Returns (the Workload read, or None when it was just created or deleted; the gate)."""
    meta = job["metadata"]
    name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
    wl_name = kueue.workload_name(name)
    waiting = kueue.Gate(workload=wl_name, queue=queue)
    existing = kube.get_workload(namespace, wl_name)
    if state.phase is not None and state.phase.is_terminal:
        return existing, kueue.Gate(admitted=True, workload=wl_name, queue=queue)
    if existing is not None and not kueue.owned_by(existing, uid):
        return None, waiting  # an earlier same-named job's: the garbage collector removes it
    labels = meta.get("labels") or {}
    priority_class = labels.get(kueue.PRIORITY_LABEL)
    priority = None
    if priority_class:
        wpc = kube.get_kueue_object("workloadpriorityclasses", priority_class)
        if wpc is None:
            raise KueueProblem(
                f"WorkloadPriorityClass {priority_class} (label {kueue.PRIORITY_LABEL} of "
                f"TorchJob {namespace}/{name}) does not exist"
            )
        priority = int(wpc.get("value", 0))
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
    desired = kueue.desired_workload(
        name=name,
        namespace=namespace,
        uid=uid,
        queue=queue,
        count=count,
        worker=worker,
        priority_class=priority_class,
        priority=priority,
    )
    if existing is None:
        if kube.create_workload(desired):
            events.append(Event.of("CreatedWorkload", name=wl_name, queue=queue, count=count))
        return None, waiting
    if not kueue.matches(existing, desired):
        if kube.delete_workload(namespace, wl_name, existing["metadata"]["uid"]):
            events.append(Event.of("DeletedWorkload", name=wl_name))
        return None, waiting
    flavors: dict[str, Mapping[str, Any]] = {}
    for flavor in kueue.flavor_names(existing):
        rf = kube.get_kueue_object("resourceflavors", flavor)
        flavors[flavor] = (rf or {}).get("spec") or {}
    return existing, kueue.gate_of(existing, flavors, queue=queue)


def _settle_workload(
    kube: Kube,
    job: Mapping[str, Any],
    workload: Mapping[str, Any],
    raw_pods: list[dict[str, Any]],
    decided: Plan,
    now: datetime,
    component: str,
    log: logging.LoggerAdapter,  # type: ignore[type-arg]
) -> None:
    """After the pods: an evicted job's quota goes back once no pod is left; a finished
    job's Workload is marked Finished. Events go straight out (the status is written)."""
    meta = workload["metadata"]
    stamp = format_time(now)
    phase = decided.phase
    patch: Mapping[str, Any] | None = None
    reason = ""
    values: dict[str, Any] = {"name": meta["name"]}
    if phase.is_terminal:
        patch = kueue.finish_patch(
            workload,
            succeeded=phase == Phase.SUCCEEDED,
            message=f"TorchJob {phase.value}",
            now=stamp,
        )
        reason, values["result"] = "FinishedWorkload", phase.value
    elif not raw_pods:
        patch = kueue.release_patch(workload, stamp)
        reason = "ReleasedQuota"
    if patch is None:
        return
    if kube.patch_workload_status(meta["namespace"], meta["name"], patch):
        ev = Event.of(reason, **values)
        kube.post_event(
            job, type_=ev.type, reason=ev.reason, message=ev.message, component=component
        )
        log.info("%s", ev.message)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _fan_out(settings: OperatorSettings) -> ThreadPoolExecutor:
    """One long-lived pool for the concurrent pod writes of every job. A pool per reconcile
    started and ended up to 16 threads each time: CPU for nothing, and every new thread may
    take a fresh malloc arena that keeps its memory after the burst."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=2 * settings.create_concurrency, thread_name_prefix="torchjob-io"
            )
        return _POOL


def release_pool() -> None:
    """End the write pool's threads (their stacks go back to the kernel); the next reconcile
    that writes starts a new pool. Called when the operator has no job left."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.shutdown(wait=True)


def _relabel_pods(kube: Kube, namespace: str, decided: Plan, settings: OperatorSettings) -> None:
    """KeepSurvivors: kept pods join the new generation (their runtime follows the status).
    Concurrent like creates and deletes: a 64-pod job must not take 63 round trips in a row."""
    if not decided.relabel:
        return
    labels = {contract.LABEL_GENERATION: str(decided.status["currentGeneration"])}
    list(_fan_out(settings).map(lambda n: kube.label_pod(namespace, n, labels), decided.relabel))


def _delete_pods(
    kube: Kube,
    namespace: str,
    decided: Plan,
    uids: Mapping[str, str | None],
    settings: OperatorSettings,
) -> list[Event]:
    """Delete the plan's pods, each only as the pod the plan saw (its uid a precondition):
    a same-named pod created since (the next generation's) is never deleted by a stale plan."""
    if not decided.delete:
        return []
    pool = _fan_out(settings)
    deleted = list(
        pool.map(lambda n: (n, kube.delete_pod(namespace, n, uids.get(n))), decided.delete)
    )
    gone = [n for n, ok in deleted if ok]
    metrics.PODS_DELETED.inc(len(gone))
    return [Event.of("DeletedPod", pods=_pods(gone))] if gone else []


def _pods(names: list[str]) -> str:
    """The pods of one reconcile for its one Event, not one Event per pod: an Event is a
    write to the API server (and to etcd), and a 64-pod generation would post 64 of them."""
    if len(names) == 1:
        return f"pod {names[0]}"
    return f"{len(names)} pods: {', '.join(names)}"


def _worker_bodies(
    name: str, namespace: str, uid: str, spec: TorchJobSpec, decided: Plan
) -> list[dict[str, Any]]:
    if decided.create is None:
        return []
    c = decided.create
    return [
        worker_pod(
            name=name,
            namespace=namespace,
            uid=uid,
            spec=spec,
            index=i,
            generation=c.generation,
            replicas=c.replicas,
            joiner=c.joiners,
            members=c.members,
        )
        for i in c.indices
    ]


def _create_pods(
    kube: Kube,
    namespace: str,
    bodies: list[dict[str, Any]],
    decided: Plan,
    settings: OperatorSettings,
    events: list[Event],
) -> list[KubeError]:
    if decided.create is None:
        return []
    c = decided.create

    def create(body: dict[str, Any]) -> tuple[str, bool | KubeError]:
        try:
            return body["metadata"]["name"], kube.create_pod(body)
        except KubeError as e:
            return body["metadata"]["name"], e

    results = list(_fan_out(settings).map(create, bodies))
    failures = [r for _, r in results if isinstance(r, KubeError)]
    created = [n for n, r in results if r is True]
    metrics.PODS_CREATED.inc(len(created))
    if created:
        events.append(Event.of("CreatedPod", pods=_pods(created), generation=c.generation))
    events.extend(Event.of("FailedCreatePod", warning=True, detail=str(e)) for e in failures[:3])
    return failures


__all__ = ["Outcome", "PodView", "reconcile_once", "utcnow"]

"""Carry one pass out, in the documented order (JobSet's, so that a crash at any point
replays the same decision):

0. ``first``: the writes the plan puts before any pod (``writes.First``): the runtime
   blueprint the job keeps (``status.runtime``), the first time it is resolved; then the Kueue
   Workload's create or delete. The plan was made with the gate of a Workload being made
   (closed); ``first`` returns the write's outcome: its Events, for ``amend``, and the gate,
   which only a 404 (Kueue not installed) opens, and then the controller plans again.
1. ``create``: the Service and the worker account (concurrently), the gang's PodGroup,
   the pods (concurrently), the capacity probes. A crash after them and before the status is
   harmless: the next pass finds the pods of a generation the status has not marked created
   yet and adopts them.
2. ``write_status``: ONE status merge-patch. It records the decision (new generation,
   restarts, disruptions, ``lastFailure``, ``restartAfter``) *before* any pod of an older
   generation is touched.
3. ``remove``: relabels (KeepSurvivors) and deletions of pods of older generations. A crash
   before them is harmless too: those pods carry an older generation label, so the next pass
   deletes or relabels them, and they are never judged again, so a recorded failure can never
   be re-read as a disruption.
4. ``post``: Events, only once the status landed, so an Event never announces something the
   status does not show. Then ``settle_workload`` (the Workload's quota or Finished).

The concurrent writes go through the ``Executor`` the caller passes (the operator's one
long-lived pool); ``Inline`` runs them one after another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any, TypeAlias, TypeVar

from torchjob import contract
from torchjob_operator.common.events import Event
from torchjob_operator.engine import metrics
from torchjob_operator.engine.kube import EarlierOwnerError, Kube, KubeError
from torchjob_operator.torchjob import admission
from torchjob_operator.torchjob.admission import Failure, WorkloadStep
from torchjob_operator.torchjob.amend import Created, WriteFailure, pods_text
from torchjob_operator.torchjob.decision import Plan
from torchjob_operator.torchjob.writes import Around, Decided, First

T = TypeVar("T")
Log: TypeAlias = "logging.LoggerAdapter[logging.Logger]"


class JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Adds ``ns/name`` to every line."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = self.extra or {}
        return f"[{extra.get('job')}] {msg}", kwargs


def job_logger(namespace: str, name: str) -> Log:
    return JobLogger(logging.getLogger("torchjob_operator"), {"job": f"{namespace}/{name}"})


class Inline(Executor):
    """An executor that runs each call at once in the caller's thread (tests, one-off runs)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a pool's future would hold it
            done.set_exception(exc)
        return done


def first(
    kube: Kube, job: Mapping[str, Any], writes: First, component: str, log: Log
) -> WorkloadStep | None:
    """Step 0: the pin, then the Workload's write. Its outcome (``admission.write_outcome``:
    the write's Events, for ``amend``, and the gate after it), None without a Workload write."""
    if writes.pin is not None:
        pin_runtime(kube, job, writes.pin, component, log)
    step, seen = writes.workload, writes.seen
    if step is None or seen is None or not writes.writes_workload:
        return None
    done = admission.write_outcome(step, seen, write_workload(kube, step), writes.phase)
    if done.warning is not None:
        log.warning("%s", done.warning)
    return done


def write_workload(kube: Kube, step: WorkloadStep) -> bool | Failure:
    """The Workload's create or delete: whether it happened, or why it failed."""
    try:
        if step.create is not None:
            return kube.create_workload(dict(step.create))
        if step.delete is not None:
            return kube.delete_workload(*step.delete)
    except KubeError as e:
        return Failure(str(e), e.status)
    return False


def create(
    kube: Kube, pool: Executor, namespace: str, decided: Decided, around: Around, log: Log
) -> Created:
    """Step 1. Raises the refusal of a namespace being deleted (it takes the job with it)."""
    service = pool.submit(kube.ensure_service, around.service) if around.service else None
    # One after the other, in their order: the API server checks a RoleBinding's Role when
    # it is created, and refused a binding sent beside its Role with a 404 (every new job's
    # first pass failed and was retried a second later, with a traceback in the log).
    ordered = pool.submit(lambda: [(k, kube.ensure_rbac_object(k, b)) for k, b in around.rbac])
    try:
        rbac = ordered.result()
        made_service = service is not None and service.result()
    except EarlierOwnerError as earlier:
        log.info("%s", earlier)
        return Created(earlier=f"{earlier.kind} {earlier.name}")
    group, group_failure = False, None
    if around.group is not None:
        try:
            group = kube.apply_pod_group(around.group)
        except KubeError as e:
            # No pods without their group (they would be scheduled one by one): say why and
            # retry; a missing PodGroup CRD (404) is permanent, so the job is Stalled.
            group_failure = e
    pods: list[str] = []
    failures: list[KubeError] = [group_failure] if group_failure is not None else []
    if group_failure is None and decided.plan.create is not None:
        pods, failures = _create_pods(kube, pool, decided.workers)
        if pods:
            log.info("created pods %s", ", ".join(pods))
    dying = next((f for f in failures if f.namespace_terminating), None)
    if dying is not None:
        raise dying  # the namespace takes the job with it: no FailedCreatePod, no Stalled
    probes = [b["metadata"]["name"] for b in decided.probes if kube.create_pod(b)]
    for body in decided.initializers:  # spec.initializers: before any worker, never with one
        kube.create_pod(body)
    return Created(
        service=made_service,
        accounts=tuple(kind for kind, made in rbac if made),
        group=group,
        group_failure=None if group_failure is None else _failure(group_failure),
        pods=tuple(pods),
        pod_failures=() if group_failure is not None else tuple(_failure(f) for f in failures),
        probes=tuple(probes),
    )


def _failure(e: KubeError) -> WriteFailure:
    return WriteFailure(str(e), e.permanent)


def _create_pods(
    kube: Kube, pool: Executor, bodies: tuple[dict[str, Any], ...]
) -> tuple[list[str], list[KubeError]]:
    def one(body: dict[str, Any]) -> tuple[str, bool | KubeError]:
        try:
            return body["metadata"]["name"], kube.create_pod(body)
        except KubeError as e:
            return body["metadata"]["name"], e

    results = list(pool.map(one, bodies))
    created = [n for n, r in results if r is True]
    metrics.PODS_CREATED.inc(len(created))
    return created, [r for _, r in results if isinstance(r, KubeError)]


def write_status(
    kube: Kube,
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    old: Mapping[str, Any],
    max_restarts: int,
    log: Log,
) -> None:
    """Step 2: the one status patch (the caller decided that it changes something)."""
    kube.patch_job_status(namespace, name, dict(status))
    metrics.STATUS_PATCHES.inc()
    if old.get("phase") != status.get("phase"):
        log.info(
            "phase %s -> %s (generation %s, restarts %s/%s, disruptions %s)",
            old.get("phase"),
            status.get("phase"),
            status.get("currentGeneration"),
            status.get("restarts"),
            max_restarts,
            status.get("disruptions"),
        )
        metrics.TRANSITIONS.labels(phase=status["phase"]).inc()
    moved = old.get("currentGeneration") != status.get("currentGeneration")
    if moved or old.get("members") != status.get("members"):
        # What a post-mortem of an elastic job needs first: when each generation was
        # published and who was in it (the Events say why; they expire, this log does not).
        log.info(
            "generation %s: members %s (phase %s)",
            status.get("currentGeneration"),
            status.get("members"),
            status.get("phase"),
        )


def remove(
    kube: Kube, pool: Executor, namespace: str, decided: Plan, uids: Mapping[str, str | None]
) -> tuple[Event, ...]:
    """Step 3. KeepSurvivors: kept pods join the new generation (their runtime follows the
    status); then the plan's pods are deleted, each only as the pod the plan saw (its uid a
    precondition): a same-named pod created since is never deleted by a stale plan. Both
    concurrent: a 64-pod job must not take 63 round trips in a row."""
    if decided.relabel:
        labels = {contract.LABEL_GENERATION: str(decided.status["currentGeneration"])}
        list(pool.map(lambda n: kube.label_pod(namespace, n, labels), decided.relabel))
    if not decided.delete:
        return ()
    deleted = list(
        pool.map(lambda n: (n, kube.delete_pod(namespace, n, uids.get(n))), decided.delete)
    )
    gone = [n for n, ok in deleted if ok]
    metrics.PODS_DELETED.inc(len(gone))
    return (Event.of("DeletedPod", pods=pods_text(gone)),) if gone else ()


def post(kube: Kube, job: Mapping[str, Any], events: tuple[Event, ...], component: str) -> None:
    """Step 4: the Events, once the status that shows the same landed."""
    for ev in events:
        kube.post_event(
            job, type_=ev.type, reason=ev.reason, message=ev.message, component=component
        )


def settle_workload(
    kube: Kube,
    job: Mapping[str, Any],
    workload: Mapping[str, Any],
    settled: tuple[Mapping[str, Any], Event] | None,
    component: str,
    log: Log,
) -> None:
    """After the pods: the Workload's status patch (``admission.settle``), its Event if it
    was written (the job's status is written already)."""
    if settled is None:
        return
    patch, event = settled
    meta = workload["metadata"]
    if kube.patch_workload_status(meta["namespace"], meta["name"], patch):
        post(kube, job, (event,), component)
        log.info("%s", event.message)


def say_invalid(
    kube: Kube,
    job: Mapping[str, Any],
    status: dict[str, Any],
    detail: str,
    component: str,
    log: Log,
    reason: str = "InvalidSpec",
) -> None:
    """An invalid spec (or a missing or invalid runtime blueprint, ``reason``): its status
    (Ready=False, Stalled), then its Warning Event."""
    meta = job["metadata"]
    kube.patch_job_status(meta["namespace"], meta["name"], status)
    post(kube, job, (Event.of(reason, warning=True, detail=detail),), component)
    log.warning("%s", detail)


def pin_runtime(
    kube: Kube, job: Mapping[str, Any], pin: Mapping[str, Any], component: str, log: Log
) -> None:
    """Step 0: the runtime blueprint the job keeps (``status.runtime``), before any pod."""
    meta = job["metadata"]
    kube.patch_job_status(meta["namespace"], meta["name"], {"runtime": dict(pin)})
    runtime, version = f"{pin['kind']} {pin['name']}", pin.get("resourceVersion")
    post(kube, job, (Event.of("RuntimeResolved", runtime=runtime, version=version),), component)
    log.info("pinned %s (resourceVersion %s)", runtime, version)

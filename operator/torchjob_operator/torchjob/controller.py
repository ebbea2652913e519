"""The TorchJob controller: one pass over one job, wired as observe -> plan -> act -> amend.

Entry point::

    reconcile_once(kube, namespace, name, *, settings, clock=utcnow,
                   defer_progress=False, pool=None) -> ReconcileResult

* ``kube``: the ``Kube`` protocol (``torchjob_operator.engine.kube``; the operator passes its cache).
* ``settings``: ``OperatorSettings`` (``component`` for Events, ``progress_batch_s``).
* ``clock``: the time (``common.clock.utcnow``; tests pass a fake one).
* ``defer_progress``: hold back a status write that only moves the worker counts (the
  result asks to run again within ``settings.progress_batch_s``; the caller decides when
  the wait is over): while 8 pods start one by one, the status is written when the phase
  changes, not 8 times.
* ``pool``: the ``concurrent.futures.Executor`` of the concurrent pod writes (the operator's
  one long-lived pool); None runs them one after another in the caller's thread.

Runs in a worker thread; the caller decides *when*. Every write comes after the plan, in the
order ``act`` documents (the runtime pin and the Workload first, as the plan's ``First``).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from torchjob_operator.common.clock import Clock, utcnow
from torchjob_operator.common.events import Event
from torchjob_operator.common.nodes import NodeView
from torchjob_operator.engine import metrics
from torchjob_operator.engine.kube import Kube
from torchjob_operator.engine.settings import OperatorSettings
from torchjob_operator.torchjob import act, admission, managed
from torchjob_operator.torchjob.amend import amend
from torchjob_operator.torchjob.decision import JobView
from torchjob_operator.torchjob.observe import Observed, observe
from torchjob_operator.torchjob.status import invalid_status, status_changed
from torchjob_operator.torchjob.writes import Decided, First, around, decide


@dataclass(frozen=True)
class ReconcileResult:
    requeue_after_s: float | None
    """Run again after this long even if nothing happens; None: wait for a change."""
    gone: bool = False
    """The TorchJob no longer exists: stop its loop."""
    deferred: bool = False
    """A status write that only moved the worker counts was held back (``defer_progress``)."""


def reconcile_once(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    settings: OperatorSettings,
    clock: Clock = utcnow,
    defer_progress: bool = False,
    pool: Executor | None = None,
    nodes: Mapping[str, NodeView] | None = None,
    avoid: tuple[str, ...] = (),
) -> ReconcileResult:
    """One pass over one job (see the module docstring); ``nodes``, ``avoid``: NodeBook's."""
    log = act.job_logger(namespace, name)
    now = clock()
    seen = observe(kube, namespace, name, nodes=nodes, avoid=avoid, now=now)
    if seen is None:
        return ReconcileResult(None, gone=True)
    role = managed.role_of(seen.job, seen.workload is not None)
    if role is not managed.Role.RUN:
        return _managed_elsewhere(kube, seen, role, settings, log)
    metrics.RECONCILES.inc()
    if seen.spec is None:
        return _invalid(kube, seen, seen.invalid or "", now, settings, log)
    pool = act.Inline() if pool is None else pool
    job, spec, meta = seen.job, seen.spec, seen.job["metadata"]
    # The Workload as the spec wants it: planned here, written first by act (its gate is
    # closed while it is being made, whatever the write answers but a 404).
    step = _workload_step(seen, log)
    first = _first(kube, seen, step, now, settings, log)
    if isinstance(first, ReconcileResult):
        return first
    view, decided, written = first
    plan = decided.plan
    created = act.create(
        kube, pool, namespace, decided, around(name, namespace, meta["uid"], spec, plan), log
    )
    old_status: Mapping[str, Any] = job.get("status") or {}
    workload = None if step is None else step.workload
    amended = amend(
        view,
        plan,
        (*written, *decided.events),
        created,
        old_status=old_status,
        now=now,
        defer_progress=defer_progress,
        progress_batch_s=settings.progress_batch_s,
        workload_read=workload is not None,
    )
    if amended.stop:  # WaitingForEarlierJob: the status says so, nothing else is written
        if amended.write_status:
            kube.patch_job_status(namespace, name, amended.status)
        return ReconcileResult(amended.requeue_after_s)
    if amended.deferred:
        metrics.STATUS_DEFERRED.inc()
    elif amended.write_status:
        max_restarts = spec.failure_policy.max_restarts
        act.write_status(kube, namespace, name, amended.status, old_status, max_restarts, log)
        metrics.observe_history(namespace, name, old_status, amended.status)
    # Only now that the decision is recorded: older generations' pods go (or join, relabelled).
    uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in seen.raw_pods}
    deleted = act.remove(kube, pool, namespace, plan, uids)
    act.post(kube, job, amended.events + deleted, settings.component)
    if workload is not None:
        settled = admission.settle(workload, plan.phase, bool(seen.raw_pods), now)
        act.settle_workload(kube, job, workload, settled, settings.component, log)
    if plan.delete_job:
        ttl = spec.run_policy.ttl_seconds_after_finished
        log.info("deleting finished job (ttlSecondsAfterFinished=%s)", ttl)
        kube.delete_job(namespace, name)
        return ReconcileResult(None, gone=True)
    return ReconcileResult(amended.requeue_after_s, deferred=amended.deferred)


def _workload_step(seen: Observed, log: act.Log) -> admission.WorkloadStep | None:
    """The Workload as the spec wants it (``admission.sync``, pure); a failed read is logged."""
    if seen.workload is None:
        return None
    step = admission.sync(seen.workload, seen.state.phase)
    if step.warning is not None:
        log.warning("%s", step.warning)
    return step


def _first(
    kube: Kube,
    seen: Observed,
    step: admission.WorkloadStep | None,
    now: datetime,
    settings: OperatorSettings,
    log: act.Log,
) -> tuple[JobView, Decided, tuple[Event, ...]] | ReconcileResult:
    """The plan, then its first writes (the pin, the Workload): the view planned, the
    decision, and the Events of the Workload's write."""
    assert seen.spec is not None
    view = seen.view(seen.spec, None if step is None else step.gate)
    first = First(seen.pin, step, seen.workload, seen.state.phase)
    decided = _decide(kube, seen, view, now, settings, log, first)
    if isinstance(decided, ReconcileResult):
        return decided
    done = act.first(kube, seen.job, decided.first, settings.component, log)
    if done is None or step is None or done.gate == step.gate:
        return view, decided, () if done is None else done.events
    # Kueue is not installed (404): the queue label is inert; plan again without it.
    view = seen.view(seen.spec, done.gate)
    again = _decide(kube, seen, view, now, settings, log, First())
    return again if isinstance(again, ReconcileResult) else (view, again, done.events)


def _decide(
    kube: Kube,
    seen: Observed,
    view: JobView,
    now: datetime,
    settings: OperatorSettings,
    log: act.Log,
    first: First,
) -> Decided | ReconcileResult:
    """The plan and what it builds; judging and building are pure, so an error here is the
    spec's, and retrying cannot help: the job says so (``_invalid``)."""
    try:
        return decide(view, seen.job["metadata"]["uid"], seen.pods, seen.probes, now, first)
    except Exception as err:
        metrics.RECONCILE_ERRORS.inc()
        meta = seen.job["metadata"]
        detail = (
            f"TorchJob {meta['namespace']}/{meta['name']} cannot be run as specified: "
            f"{type(err).__name__}: {err}"
        )
        return _invalid(kube, seen, detail, now, settings, log)


def _managed_elsewhere(
    kube: Kube, seen: Observed, role: managed.Role, settings: OperatorSettings, log: act.Log
) -> ReconcileResult:
    """A job another controller runs (``spec.managedBy``): MultiKueue's gets its Workload, as
    Kueue's jobframework makes a batch Job's; no pod, no status, no Workload status patch."""
    if role is managed.Role.QUEUE and seen.spec is not None and seen.workload is not None:
        step = _workload_step(seen, log)
        assert step is not None
        first = First(workload=step, seen=seen.workload, phase=seen.state.phase)
        done = act.first(kube, seen.job, first, settings.component, log)
        events = (*step.events, *(() if done is None else done.events))
        if events:
            act.post(kube, seen.job, events, settings.component)
    return ReconcileResult(None)


def _invalid(
    kube: Kube, seen: Observed, detail: str, now: datetime, settings: OperatorSettings, log: act.Log
) -> ReconcileResult:
    """Say why the spec cannot run (once: no hot loop); an update wakes the job up again."""
    status = invalid_status(seen.job, detail, now, seen.reason)
    if status_changed(seen.job.get("status") or {}, status):
        act.say_invalid(kube, seen.job, status, detail, settings.component, log, seen.reason)
    return ReconcileResult(seen.retry_after_s)


__all__ = ["ReconcileResult", "reconcile_once"]

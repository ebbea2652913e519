"""Carry out one study plan, in the order that makes its decisions exactly-once.

1. The status, with the resourceVersion the study was read at: a stale read loses with a
   409 instead of overwriting a newer record (the plan is dropped, the study is read again).
2. The trial TorchJobs the status records (create is idempotent, AlreadyExists is success).
3. The prunes (``spec.pruneAction``: suspend or delete), then the stops of a finished
   study's running trials (delete); both idempotent.
4. The Events, once the status that shows the same thing landed.

A crash between any two steps is repaired by the next reconcile, which finds the records
and repeats the missing actions.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torchjob_operator.engine.kube import Kube
from torchjob_operator.engine.queue import Result
from torchjob_operator.torchtune.observe import StudyView

if TYPE_CHECKING:
    from torchjob_operator.torchtune.plan import StudyPlan

log = logging.getLogger("torchjob_operator.torchtune")


def act(kube: Kube, view: StudyView, plan: StudyPlan, *, component: str) -> Result:
    ns, name = view.namespace, view.name
    tune = view.tune
    if plan.status != (tune.get("status") or {}) and not kube.patch_tune_status(
        ns, name, str(tune["metadata"]["resourceVersion"]), plan.status
    ):
        log.info("[%s/%s] status conflict: reading it again", ns, name)
        return Result(requeue_after_s=0.0)
    for body in plan.create:
        kube.create_job(body)
        log.info("[%s/%s] trial TorchJob %s created", ns, name, body["metadata"]["name"])
    action = (tune.get("spec") or {}).get("pruneAction", "Delete")
    for job in plan.prune:
        if action == "Suspend":
            kube.suspend_job(ns, job)
        else:
            kube.delete_job(ns, job)
        log.info("[%s/%s] trial TorchJob %s pruned (%s)", ns, name, job, action.lower())
    for job in plan.stop:
        kube.delete_job(ns, job)
    for ev in plan.events:
        kube.post_event(
            tune, type_=ev.type, reason=ev.reason, message=ev.message, component=component
        )
    return Result(requeue_after_s=plan.requeue_after_s)


__all__ = ["act"]

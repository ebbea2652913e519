"""Rendering a decision into the TorchJob's status: phase, kstatus conditions, counters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from torchjob import contract
from torchjob.api.models import (
    Condition,
    GenerationRecord,
    LeavingWorker,
    Phase,
    TorchJobStatus,
)
from torchjob_operator.common import conditions as cond
from torchjob_operator.common.clock import format_time
from torchjob_operator.torchjob import topology
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.drain import REBALANCE
from torchjob_operator.torchjob.observed import JobState, PodPhase, PodView
from torchjob_operator.torchjob.spread import spread_condition


def _selector(name: str) -> str:
    return f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"


def render_status(
    d: Decision,
    current: Sequence[PodView],
    history: Sequence[GenerationRecord] = (),
    losses: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    assert d.phase is not None
    now = format_time(d.now)
    obs = d.job.metadata_generation
    conditions = [dict(c) for c in d.job.state.conditions]
    wanted = {
        cond.CREATED: d.start_time is not None or d.created_generation is not None,
        cond.RUNNING: d.phase == Phase.RUNNING,
        cond.RESTARTING: d.phase == Phase.RESTARTING,
        cond.SUSPENDED: d.phase == Phase.SUSPENDED,
        cond.SUCCEEDED: d.phase == Phase.SUCCEEDED,
        cond.FAILED: d.phase == Phase.FAILED,
        cond.READY: is_ready(d.phase),
        cond.STALLED: d.phase == Phase.FAILED,
    }
    present = {c.get("type") for c in conditions}
    for type_, value in wanted.items():
        if not value and type_ not in present and type_ != cond.READY:
            continue  # False conditions that never were True are noise in `kubectl describe`.
        if type_ == cond.CREATED and value:
            reason, msg = cond.say("WorkerPodsCreated", generation=d.created_generation)
        elif value or type_ == cond.READY:
            reason, msg = d.reason, d.message
            if type_ == cond.RESTARTING and d.waiting:
                msg = f"{msg}; {d.waiting}"
        else:
            reason, msg = d.reason, cond.message("PhaseIs", phase=d.phase.value)
        conditions, _ = cond.set_condition(
            conditions,
            type_=type_,
            status=value,
            reason=reason,
            message=msg,
            now=now,
            observed_generation=obs,
        )
    judged = ((cond.PLACED, _placed(d, current)), (cond.SPREAD, spread_condition(d, current)))
    for type_, said in judged:
        if said is not None:
            conditions, _ = cond.set_condition(
                conditions, type_=type_, now=now, observed_generation=obs, **said
            )
    ready = sum(1 for p in current if p.phase == PodPhase.RUNNING and p.ready and not p.deleting)
    return TorchJobStatus(
        phase=d.phase,
        conditions=[Condition.model_validate(c) for c in conditions],
        observed_generation=obs,
        replicas=d.replicas,
        workers=f"{ready}/{d.replicas}",
        selector=_selector(d.job.name),
        current_generation=d.generation,
        created_generation=d.created_generation,
        members=list(d.members) if d.members is not None else None,
        replaced_workers=list(d.replaced) or None,
        placing_again=list(d.placing_again) or None,
        leaving_workers=_leaving(d, current) or None,
        standby_workers=d.standby_ready,
        spec_replicas=d.spec_replicas,
        last_rescale_time=format_time(d.last_rescale) if d.last_rescale else None,
        world_size=d.replicas * d.job.spec.resolved_nproc_per_node(),
        restarts=d.restarts,
        disruptions=d.disruptions,
        last_failure=d.last_failure,
        restart_after=format_time(d.restart_after) if d.restart_after else None,
        start_time=format_time(d.start_time) if d.start_time else None,
        completion_time=format_time(d.completion_time) if d.completion_time else None,
        ready_workers=ready,
        active_workers=sum(1 for p in current if p.active),
        succeeded_workers=sum(1 for p in current if p.phase == PodPhase.SUCCEEDED),
        failed_workers=sum(1 for p in current if p.phase == PodPhase.FAILED),
        history=list(history) or None,
        losses=dict(losses) if losses else None,
    ).to_patch()


def _placed(d: Decision, current: Sequence[PodView]) -> dict[str, Any] | None:
    """The ``Placed`` condition of a job with ``spec.placement`` and a Kueue topology, once
    the Node watch knows the node of one of its workers: whether each runs in the job's
    domains at the requested level (``topology.spilled``); None: nothing to say."""
    placement, gate = d.job.spec.placement, d.job.kueue
    assigned = gate.topology if gate is not None else None
    if placement is None or assigned is None or not d.job.nodes:
        return None
    workers = [p for p in current if p.active and p.node and not p.deleting]
    spills, judged = topology.spilled(assigned, placement.level, workers, d.job.nodes)
    if not judged:
        return None
    if not spills:
        reason, msg = cond.say("InDomains", count=judged, level=placement.level)
        return {"status": True, "reason": reason, "message": msg}
    where = ", ".join(f"{s.pod} on node {s.node} ({s.value})" for s in spills[:8])
    more = f" and {len(spills) - 8} more" if len(spills) > 8 else ""
    reason, msg = cond.say("SpilledOver", pods=where + more, level=placement.level)
    return {"status": False, "reason": reason, "message": msg}


def _leaving(d: Decision, current: Sequence[PodView]) -> list[LeavingWorker]:
    """``status.leavingWorkers``: the members given notice that train on (``d.leaving``)."""
    out = []
    later = dict(d.replace_later)
    for p in current:
        if p.index not in d.leaving:
            continue
        deadline = p.deletion_at if p.deleting else p.notice_until
        if p.notice == REBALANCE:
            deadline = None  # a move has none: it is given up first
        out.append(
            LeavingWorker(
                pod=p.name,
                reason=p.notice or p.disruption or "Deleted",
                node=p.node or None,
                deadline=format_time(deadline) if deadline else None,
                replace_at=format_time(later[p.index]) if p.index in later else None,
            )
        )
    return out


def is_ready(phase: Phase) -> bool:
    """The ``Ready`` condition (kstatus: True is Current, False is InProgress): training,
    succeeded, or suspended. A suspended job is Current, as a suspended batch/v1 Job is for
    kstatus: it is where its spec asked it to be, so a Flux Kustomization or an Argo CD sync
    holding it does not wait for its timeout (issue 17)."""
    return phase in (Phase.RUNNING, Phase.SUCCEEDED, Phase.SUSPENDED)


PROGRESS_COUNTS = frozenset(
    {"workers", "readyWorkers", "activeWorkers", "succeededWorkers", "failedWorkers"}
)
"""Status fields that only count pods: they change with every pod that starts."""


def progress_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the status patch ``new`` changes nothing of ``old`` but how many workers are
    where (the counts, and the condition messages that quote them: "3/8 workers ready").
    Such a write may wait a moment and fold into the next one; a phase, a condition's
    status or reason, a generation or a counter of restarts never waits."""
    changed = [k for k, v in new.items() if old.get(k) != v]
    if not changed:
        return False
    for key in changed:
        if key == "conditions":
            before, after = old.get("conditions") or [], new.get("conditions") or []
            if len(before) != len(after) or any(
                (a.get("type"), a.get("status"), a.get("reason"))
                != (b.get("type"), b.get("status"), b.get("reason"))
                for a, b in zip(before, after, strict=True)
            ):
                return False
        elif key not in PROGRESS_COUNTS:
            return False
    return True


def set_not_ready(
    status: TorchJobStatus,
    *,
    reason: str,
    message: str,
    stalled: bool,
    now: str,
    observed_generation: int | None,
) -> TorchJobStatus:
    """``status`` with Ready=False and Stalled=``stalled`` for ``reason`` (an invalid spec, a
    pod that cannot be created), as of ``observed_generation``."""
    conditions = [c.to_wire() for c in status.conditions or ()]
    for type_, value in ((cond.READY, False), (cond.STALLED, stalled)):
        conditions, _ = cond.set_condition(
            conditions,
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            now=now,
            observed_generation=observed_generation,
        )
    return status.model_copy(
        update={
            "conditions": [Condition.model_validate(c) for c in conditions],
            "observed_generation": observed_generation,
        }
    )


def ready_reason(st: JobState) -> tuple[str, str]:
    """Reason and message of the last decision, kept in the Ready condition."""
    for c in st.conditions:
        if c.get("type") == cond.READY:
            return str(c.get("reason") or ""), str(c.get("message") or "")
    return "", ""


def validation_message(err: ValidationError) -> str:
    """Pydantic errors as 'spec.a.b: message' lines, with the wire (camelCase) names."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        parts.append(f"spec.{loc}: {e['msg']}" if loc else str(e["msg"]))
    return "; ".join(parts)


def invalid_status(
    job: Mapping[str, Any], detail: str, now: datetime, reason: str = "InvalidSpec"
) -> dict[str, Any]:
    """The partial status patch of an invalid spec: the conditions, nothing else touched.
    A missing runtime blueprint (``RuntimeNotFound``) is not Stalled: the job waits for it."""
    prior = TorchJobStatus.parse(job.get("status"))
    invalid = set_not_ready(
        TorchJobStatus(conditions=prior.conditions),
        reason=reason,
        message=detail,
        stalled=reason != "RuntimeNotFound",
        now=format_time(now),
        observed_generation=(job.get("metadata") or {}).get("generation"),
    )
    return invalid.model_dump(by_alias=True, mode="json", exclude_none=True)


def status_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing the patch ``new`` over the status ``old`` changes anything."""
    return any(old.get(k) != v for k, v in new.items())

"""How a TorchJob stops running: the end (Succeeded, Failed), the clean-up after it, the
TTL, and the hold while Kueue has not admitted it. Pure: each takes a ``Decision`` and
returns a new one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torchjob.api.models import CleanPodPolicy, MembershipPolicy, Phase
from torchjob.rules import Outcome
from torchjob_operator.common import conditions as cond
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.kueue import Gate
from torchjob_operator.torchjob.observed import PodPhase, PodView

MAX_REQUEUE_S = 86400.0
"""A far deadline is looked at again once a day (it may be int64's maximum: a "never")."""

STRANDED_GRACE = timedelta(seconds=10)
"""How long the other members may take to finish after one KeepSurvivors member succeeded."""


def finish(d: Decision, pods: Sequence[PodView], *, deadline: bool = False) -> Decision:
    """Pod clean-up after the end, and the TTL of the finished job."""
    policy = d.job.spec.run_policy.clean_pod_policy
    doomed = [
        p.name
        for p in pods
        if not p.deleting
        and (
            policy == CleanPodPolicy.ALL
            or ((policy == CleanPodPolicy.RUNNING or deadline) and p.active)
        )
    ]
    d = d.also(delete=doomed)
    ttl = d.job.spec.run_policy.ttl_seconds_after_finished
    if ttl is None:
        return d
    end = d.completion_time or d.now
    due = end + timedelta(seconds=ttl)
    if d.now >= due:
        return d.but(delete_job=True)
    return d.also(requeue=[min((due - d.now).total_seconds(), MAX_REQUEUE_S)])


def end(d: Decision, phase: Phase, reason: str, message: str) -> Decision:
    """The job is over (``phase`` is Succeeded or Failed): it completes now."""
    d = d.transition(phase, reason, message, warning=phase == Phase.FAILED)
    return d.but(completion_time=d.now, restart_after=None)


def succeed(d: Decision, pods: Sequence[PodView], stranded: Sequence[PodView] = ()) -> Decision:
    """Every worker exited 0 (or training ended on a member and ``stranded`` cannot finish)."""
    d = end(
        d,
        Phase.SUCCEEDED,
        "AllWorkersSucceeded",
        cond.message("AllWorkersSucceeded", replicas=d.replicas),
    )
    return finish(d.also(delete=[p.name for p in stranded]), pods)


def stranded_by_success(
    d: Decision, current: Sequence[PodView], outcome: Outcome
) -> tuple[Decision, list[PodView] | None]:
    """KeepSurvivors: the members still running ``STRANDED_GRACE`` after another member of
    the generation exited 0 (None while that is not the case; the decision then asks to look
    again when the grace ends).

    A pod exits 0 only once training ended (the last report is collective, rank 0 commits
    first). A generation published at the moment training ended (a grow to a joiner) can
    never form without that pod: its other members wait for a group that will not come.
    Healthy members finish within seconds of each other, so they never wait that long."""
    if outcome != Outcome.HEALTHY or d.job.spec.membership_policy != (
        MembershipPolicy.KEEP_SURVIVORS
    ):
        return d, None
    done = [p.finished_at for p in current if p.phase == PodPhase.SUCCEEDED]
    if not done or any(p.phase == PodPhase.FAILED for p in current):
        return d, None
    first = min((t for t in done if t is not None), default=d.now)
    due = first + STRANDED_GRACE
    if d.now < due:
        return d.also(requeue=[(due - d.now).total_seconds()]), None
    return d, [p for p in current if p.active]


def hold(d: Decision, pods: Sequence[PodView], gate: Gate) -> Decision:
    """Kueue has not admitted the job, or evicted it: no pod runs (deleted gracefully, so
    the workers checkpoint on SIGTERM) and the job waits suspended. An eviction of a job
    that had pods is a disruption, never a restart: it is counted once, when it happens."""
    d = d.also(delete=[p.name for p in pods if not p.deleting])
    d = d.but(start_time=None, restart_after=None)
    if gate.evicted is None:
        placement = d.job.spec.placement
        if placement is not None and "topology" in gate.pending:
            # Kueue's TAS found no domain with room for the request: say which.
            return d.transition(
                Phase.SUSPENDED,
                "TopologyUnsatisfiable",
                cond.message(
                    "TopologyUnsatisfiable",
                    workload=gate.workload,
                    how="required" if placement.required else "preferred",
                    level=placement.level,
                    detail=gate.pending,
                ),
                warning=True,
            )
        message = cond.message("WaitingForAdmission", workload=gate.workload, queue=gate.queue)
        if gate.pending:
            message = f"{message} (Kueue: {gate.pending})"
        return d.transition(Phase.SUSPENDED, "WaitingForAdmission", message)
    if d.phase not in (None, Phase.SUSPENDED) and d.created_generation is not None:
        d = d.but(disruptions=d.disruptions + 1)
    return d.transition(
        Phase.SUSPENDED,
        "AdmissionEvicted",
        cond.message("AdmissionEvicted", workload=gate.workload, detail=gate.evicted),
        warning=True,
    )


def suspend(d: Decision, pods: Sequence[PodView]) -> Decision:
    """``spec.runPolicy.suspend``: the pods go, the status stays, the deadline clock stops."""
    d = d.also(delete=[p.name for p in pods if not p.deleting])
    d = d.but(start_time=None, restart_after=None)
    return d.transition(Phase.SUSPENDED, "Suspended", cond.message("Suspended"))

"""The job's story in its status: one record per generation (``status.history``). Pure.

Each pass compares the decision with what the status said before: a newly published
generation gets a record saying why it began (the loss the plan just judged, or a resize),
which pods (and their nodes) left and joined, and when the loss was seen. Rank 0's progress
completes the record of its generation: where the state came from, when its first step
completed, and so how long the recovery took and how many steps were done again. The same
facts go out as Events (``GenerationStarted``, ``Recovered``). At most
``HISTORY_LIMIT`` records are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from torchjob import contract
from torchjob.api.models import HISTORY_LIMIT, GenerationRecord, MembershipPolicy, Progress
from torchjob.rules.loss import Disruption
from torchjob_operator.common.clock import parse_time_or_none
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob import broken
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.drain import REBALANCE
from torchjob_operator.torchjob.observed import JobState, PodPhase, PodView

_CAUSE_OF_REASON = {"OOMKilled": "OOM", "SilentPeer": "SilentPeer", "NodeLost": "NodeLost"}


def stamp(t: datetime) -> str:
    """RFC 3339 with milliseconds: recoveries take seconds, whole seconds would hide them."""
    text = t.astimezone(timezone.utc).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _members(generation_replicas: int, members: Sequence[int] | None) -> list[int]:
    return list(members) if members is not None else list(range(generation_replicas))


def _cause(before: JobState, d: Decision, grew: bool, shrank: bool) -> tuple[str, str]:
    """Why generation ``d.generation`` began, and the line that says so."""
    if any(e.reason == broken.CAUSE for e in d.events):  # this pass re-formed a broken group
        return broken.CAUSE, d.message  # no loss, charged or not
    failure = d.last_failure
    new_failure = failure is not None and failure != before.last_failure
    if d.restarts > before.restarts or (d.disruptions > before.disruptions and new_failure):
        assert failure is not None or d.restarts == before.restarts
        if failure is not None:
            cause = _CAUSE_OF_REASON.get(failure.reason, "")
            if not cause:
                cause = "Failure" if d.restarts > before.restarts else "Killed"
            return cause, failure.message or failure.reason
    if d.disruptions > before.disruptions:
        return "Disruption", d.message or d.reason
    if grew:
        return "ScaleUp", d.message or d.reason
    if shrank:
        return "ScaleDown", d.message or d.reason
    return "Restart", d.message or d.reason


def _named(indices: Sequence[int], job: str, nodes: dict[str, str]) -> list[str] | None:
    names = [contract.worker_pod_name(job, i) for i in indices]
    out = [f"{n}@{nodes[n]}" if nodes.get(n) else n for n in names]
    return out or None


def _placed(pods: Sequence[PodView], indices: Sequence[int]) -> dict[str, str]:
    """The node of each pod of ``indices`` that is already placed and is not on its way out
    (a joiner created ahead: it is Ready when a generation takes it in). A pod created with
    the generation has none yet: the record's ``joined`` names it without ``@node``, and a
    forming generation gives it the time to start (``torchjob.train.recovery.formation``)
    before it names it absent. ``indices`` leaves out the pods replaced under the same name
    (what is observed of those is the old pod, on its way out)."""
    wanted = set(indices)
    return {
        p.name: p.node
        for p in pods
        if p.index in wanted
        and p.node
        and p.active
        and not (p.killed or p.node_lost or p.silent is not None)
    }


def _silent(d: Decision, left: set[str], ended: Sequence[PodView] = ()) -> list[str]:
    """The pods that left and were reported silent in the generation that lost them (or,
    carried into it, in the one before: ``silent.silenced`` then marked them), by name."""
    state = d.job.state
    found = {p.name for p in ended if p.silent is not None}
    found |= {r.pod for r in state.silent if r.pod in left and r.generation == state.generation}
    return sorted(found)


def _loss_time(d: Decision, cause: str, left: set[str], ended: Sequence[PodView] = ()) -> datetime:
    """When the loss happened: a silent peer's when it went silent (its reporters say for
    how long, as of about now), a failure's or a kill's when its pod ended, else when it was
    seen."""
    if cause == "SilentPeer":
        silent = [p.silent.seconds for p in ended if p.silent is not None] + [
            r.seconds
            for r in d.job.state.silent
            if r.pod in left and r.generation == d.job.state.generation
        ]
        if silent:
            return d.now - timedelta(seconds=max(silent))
    if cause in ("Disruption", "Killed"):  # no failure record: an earlier one is not this
        times = [p.finished_at for p in ended if p.finished_at is not None]
        return min([d.now, *times])
    if cause not in ("Start", "ScaleUp") and d.last_failure is not None and d.last_failure.time:
        return min(d.now, parse_time_or_none(d.last_failure.time) or d.now)
    return d.now


def started(d: Decision, pods: Sequence[PodView]) -> GenerationRecord | None:
    """The record of the generation ``d`` publishes, if it is a new one; None otherwise."""
    before = d.job.state
    if d.generation is None or d.replicas is None:
        return None
    if before.history and d.generation <= before.history[-1].generation:
        return None  # recorded already
    if not before.history and d.generation > 0 and d.generation == before.generation:
        return None  # a job from before the history: it starts with its next generation
    first = not before.history and d.generation == 0
    old = _members(before.replicas, before.members) if not first else []
    new = _members(d.replicas, d.members)
    nodes = {p.name: p.node for p in pods if p.generation < d.generation}
    # A member lost and replaced under the same name (KeepSurvivors at full size): its old
    # pod left and a new one joins. RecreateGroup replaces every pod at a new generation,
    # the healthy ones too (one that has not failed yet included).
    if d.job.spec.membership_policy != MembershipPolicy.KEEP_SURVIVORS:
        replaced = set(old) & set(new)
    else:
        replaced = {
            p.index
            for p in pods
            if p.generation < d.generation
            and p.index in new
            and (p.phase == PodPhase.FAILED or p.deleting or p.killed)
        }
    job = d.job.name
    joined = [i for i in new if i not in old or i in replaced]
    if first:
        cause, detail = "Start", "the job's first generation"
    else:
        cause, detail = _cause(before, d, len(new) > len(old), len(new) < len(old))
    left = [i for i in old if i not in new or i in replaced]
    gone = {contract.worker_pod_name(d.job.name, i) for i in left}
    ended = [p for p in pods if p.generation < d.generation and p.name in gone]
    silent = _silent(d, gone, ended)
    if cause == "Disruption":
        # Losses that are not the job's leave no failure to name them (torchjob.rules.loss).
        if silent:
            cause = "SilentPeer"
        elif any(
            isinstance(p.loss, Disruption) and p.loss.reason.startswith("killed") for p in ended
        ):
            cause = "Killed"
        elif any(p.node_lost for p in ended):
            cause = "NodeLost"  # its node stopped reporting (torchjob/nodes.py)
        elif any(p.notice == REBALANCE for p in ended):
            cause = "Rebalance"  # moved off a crowded node (torchjob/spread.py)
        elif any(p.notice is not None for p in ended):
            cause = "Notice"  # its node's termination notice
    loss_time = _loss_time(d, cause, gone, ended)
    progress = before.progress
    return GenerationRecord(
        generation=d.generation,
        began=stamp(d.now),
        cause=cause,
        detail=detail[:300],
        world_size=d.replicas * d.job.spec.resolved_nproc_per_node(),
        left=_named(left, job, nodes),
        joined=_named(joined, job, _placed(pods, [i for i in joined if i not in replaced])),
        silent=silent or None,
        loss_time=stamp(loss_time) if not first else None,
        step_at_loss=progress.step if progress is not None and not first else None,
    )


def completed(record: GenerationRecord, progress: Progress | None) -> GenerationRecord:
    """``record`` completed from rank 0's report of the same generation, once it has one."""
    if (
        progress is None
        or progress.generation != record.generation
        or record.first_step_time is not None
        or progress.first_step_time is None
    ):
        return record
    first = parse_time_or_none(progress.first_step_time)
    since = parse_time_or_none(record.loss_time or record.began)
    lost = None
    if record.step_at_loss is not None and progress.restored_step is not None:
        lost = max(0, record.step_at_loss - progress.restored_step)
    return record.model_copy(
        update={
            "restored_from": progress.restored_from,
            "restored_step": progress.restored_step,
            "first_step_time": progress.first_step_time,
            "recovery_seconds": (
                round(max(0.0, (first - since).total_seconds()), 3) if first and since else None
            ),
            "steps_lost": lost,
        }
    )


def advance(
    d: Decision, pods: Sequence[PodView]
) -> tuple[list[GenerationRecord], dict[str, int], list[Event]]:
    """The history after this pass, the losses by cause, and the Events that tell what
    changed."""
    records = list(d.job.state.history)
    losses = dict(d.job.state.losses)
    events: list[Event] = []
    new = started(d, pods)
    if new is not None:
        records.append(new)
        if new.cause not in ("Start", "ScaleUp", "ScaleDown", "Restart"):
            losses[new.cause] = losses.get(new.cause, 0) + 1
        events.append(
            Event.of(
                "GenerationStarted",
                generation=new.generation,
                cause=new.cause,
                world=new.world_size,
                left=", ".join(new.left or ()) or "none",
                joined=", ".join(new.joined or ()) or "none",
            )
        )
    if records:
        last = completed(records[-1], d.job.state.progress)
        if last is not records[-1]:
            records[-1] = last
            if last.cause != "Start":
                events.append(
                    Event.of(
                        "Recovered",
                        generation=last.generation,
                        seconds=f"{last.recovery_seconds or 0:.1f}",
                        source=last.restored_from or "unknown",
                        lost=last.steps_lost if last.steps_lost is not None else "?",
                    )
                )
    return records[-HISTORY_LIMIT:], losses, events

"""What a pod's node says of it: given notice, or lost. Pure.

A spot or preemptible VM is taken back after a notice (AWS gives two minutes, GCP and Azure
about 30 s). Kubernetes learns of it from the cloud's termination handler, which taints the
Node and later drains it: AWS Node Termination Handler (``aws-node-termination-handler/*``),
Karpenter (``karpenter.sh/disrupted``; before v1 ``karpenter.sh/disruption=disrupting``),
GKE (``cloud.google.com/impending-node-termination``). A node that dies with no notice stops
renewing its lease, and the node controller sets its ``Ready`` condition ``Unknown`` about
40 s later, while its pods still show Running for minutes more (until their
``tolerationSeconds``, then Terminating until someone force-deletes them).

The operator watches Nodes (read-only) and reads each into a ``common.nodes.NodeView``;
:func:`with_nodes` then gives the pods on them what the planner needs:

* a pod on a noticed node is a member *given notice* (``PodView.notice_until``: the taint's
  time, else when the operator first saw it, plus the key's window): a ``KeepSurvivors`` job
  with ``replaceBeforeLeaving`` creates its replacement at once, on another node, and lets
  it train on until the replacement is Ready (``torchjob/drain.py``); any other job treats
  it as taken, as it would its eviction, while there is time to stop at a checkpoint;
* a pod being deleted on a noticed node carries the notice's deadline too: past it, its node
  is taken, and the pod holds its name only (:func:`held_only`);
* a pod on a node whose ``Ready`` is not ``True`` is lost (``disruption="NodeLost"``): the
  job goes on without it at once, without waiting for the node controller's evictions; once
  deleted it stays Terminating there (``PodView.stuck``) until the node returns or its Node
  is removed, and holds its name only: the next generation takes another index instead of
  waiting for it (``plan._create``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from torchjob import contract
from torchjob.api.models import GenerationRecord
from torchjob_operator.common.clock import parse_time_or_none
from torchjob_operator.common.events import Event
from torchjob_operator.common.nodes import NodeView, notice_deadline
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.observed import JobState, PodView
from torchjob_operator.torchjob.silent import believed, carried_over, pod_nodes, trusted_reports

NODE_LOST = "NodeLost"
"""``PodView.disruption`` of a pod whose node stopped reporting (``Ready`` not ``True``)."""
NODE_NOTICE = "NodeTerminationNotice"
"""``PodView.disruption`` of a pod on a noticed node, once it is judged taken."""


def with_nodes(
    pods: Iterable[PodView],
    nodes: Mapping[str, NodeView],
    now: datetime,
    seen: Mapping[str, datetime] | None = None,
) -> tuple[PodView, ...]:
    """``pods`` with what their nodes say: given notice (``notice_until``), or lost
    (``disruption=NODE_LOST``). ``seen`` maps a pod's name to the deadline an earlier pass
    gave it (``status.leavingWorkers``), so a notice without a taint time keeps its deadline
    across passes and operator restarts. A pod already being deleted or taken keeps what
    its own status says; a pod on a node the operator does not know is left as it is."""
    seen = seen or {}
    out = []
    for p in pods:
        node = nodes.get(p.node) if p.node else None
        if node is not None and not node.ready:
            lost = p.active and p.disruption is None
            out.append(replace(p, node_lost=True, disruption=NODE_LOST if lost else p.disruption))
        elif node is not None and node.notice is not None and p.deleting:
            # Going anyway: when its node goes, nothing it holds is left but its name.
            out.append(replace(p, notice_until=seen.get(p.name) or notice_deadline(node, now)))
        elif node is None or p.disruption is not None or not p.active:
            out.append(p)
        elif node.notice is not None:
            until = seen.get(p.name) or notice_deadline(node, now)
            out.append(replace(p, notice_until=until, notice=node.notice))
        else:
            out.append(p)
    return tuple(out)


SUSPECT_S = 90.0
"""How long a node whose pods a generation lost to silence stays suspect to later
generations: longer than the node controller takes to mark a vanished node unreachable
(``node-monitor-grace-period``, 40-50 s), after which its taint keeps new pods off anyway."""


def suspect_nodes(
    state: JobState,
    pods: Iterable[PodView],
    avoid: Sequence[str],
    job: str,
    now: datetime | None = None,
    nodes: Mapping[str, NodeView] | None = None,
) -> list[str]:
    """The nodes a new pod of ``job`` had rather not go to (``resources.pods.
    prefer_other_nodes``): those of its members that their peers reported silent, in
    reports the planner trusts (``silent.trusted_reports``: a pod that is itself reported,
    as each side of a partition is, does not count), while the pods are there; and, once they
    are gone, the nodes the current generation lost them on (``status.history``'s ``left``,
    ``pod@node``, of a generation begun for a silent peer), and those an earlier generation
    lost them on within :data:`SUSPECT_S` (:func:`recently_silent`). A node cut off from the
    job's other nodes (a partition) stays Ready and schedulable: once its silent pod is
    deleted it holds none of the job's pods, so the job's even spread would put the
    replacement right back where it cannot reach its peers. Nodes in ``avoid`` (kept off
    anyway) are left out; ``now``: reports naming rank 0's pod that wait (``silent.held``) do
    not count yet."""
    placed = list(pods)
    members = _members(state, job)
    carried = carried_over(state.history, state.generation, members)
    on = pod_nodes(placed)
    reports = believed(state.silent, state.broken, state.generation, state.history)
    silent = trusted_reports(reports, state.generation, members, carried, now, on)
    found = {p.node for p in placed if p.name in silent and p.node}
    found |= set(lost_silent(state).values())
    if now is not None:
        found |= recently_silent(state.history, now, nodes or {})
    return sorted(found - set(avoid) - {""})


def recently_silent(
    history: Sequence[GenerationRecord], now: datetime, nodes: Mapping[str, NodeView]
) -> set[str]:
    """The nodes of pods that a generation begun within :data:`SUSPECT_S` of ``now`` left
    behind as silent (its record's ``silent``, on ``left``'s nodes), but for a node Ready
    again since (its ``ready_since`` after that generation began: it went and came back).
    Seen in the fleet benchmark (bench/results/2026-12-05l): two nodes vanished 4 s apart;
    the generation begun for the second forgot the first, still shown Ready for 40 s and
    holding none of the job's pods, so the even spread put all three replacements there;
    they waited for its NodeLost and were made again, 44.5 s without a step."""
    out: set[str] = set()
    for record in history:
        began = parse_time_or_none(record.began)
        if not record.silent or began is None or (now - began).total_seconds() > SUSPECT_S:
            continue
        for name in record.silent_nodes().values():
            node = nodes.get(name)
            back = node is not None and node.ready and (node.ready_since or began) > began
            if name and not back:
                out.add(name)
    return out


def _members(state: JobState, job: str) -> list[str]:
    """The current generation's pod names in rank order."""
    return [contract.worker_pod_name(job, i) for i in state.members or range(state.replicas)]


def lost_silent(state: JobState) -> dict[str, str]:
    """The pods the current generation left behind because their peers found them silent
    (its ``status.history`` record's ``silent``: the planner's verdict, a partition's tie gone
    to rank 0's view), by name, with their nodes (``left``: pod@node)."""
    latest = state.history[-1] if state.history else None
    if latest is None or latest.generation != state.generation:
        return {}
    return latest.silent_nodes()


def unplaceable(pods: Iterable[PodView], avoid: Sequence[str]) -> list[PodView]:
    """Pods the scheduler could not place that were created to keep off a node that is
    avoided no more (``PodView.avoided`` beyond ``avoid``: its notice lifted, or Ready
    again, under the same name). A pod's affinity cannot change: it would stay Pending for
    good, where every node it may use was once noticed at the same time."""
    now = set(avoid)
    return [
        p
        for p in pods
        if p.active
        and not p.scheduled
        and p.unschedulable_since is not None
        and not set(p.avoided) <= now
    ]


def place_again(d: Decision, pods: Sequence[PodView]) -> Decision:
    """Delete the current generation's members and joiners that are :func:`unplaceable`;
    the members' places are created again in the same generation once they are gone
    (``Decision.placing_again``), the joiners' as any missing joiner is. Never scheduled,
    such a pod never ran: creating it again changes no membership and counts nothing."""
    ranked = set(d.ranked)
    mine = [
        p
        for p in unplaceable(pods, d.job.avoid_nodes)
        if p.joiner or (p.generation == d.generation and p.index in ranked)
    ]
    if not mine:
        return d
    members = {p.index for p in mine if not p.joiner}
    new = [p for p in mine if p.joiner or p.index not in d.placing_again]
    freed = sorted({n for p in mine for n in p.avoided} - set(d.job.avoid_nodes))
    said = Event.of("PlacingAgain", pods=", ".join(p.name for p in new), nodes=", ".join(freed))
    d = d.but(placing_again=tuple(sorted(members | set(d.placing_again))))
    return d.also(delete=[p.name for p in mine], events=[said] if new else [])


def placed_again(d: Decision, p: PodView) -> bool:
    """``p`` is a member :func:`place_again` deleted, seen going: the API server shows an
    unscheduled pod's deletion as an update that sets its deletionTimestamp, then its
    removal, and a pass between the two must not judge it taken by another client."""
    return p.deleting and not p.scheduled and not p.joiner and p.index in d.placing_again


OVERDUE_S = 15.0
"""A pod still shown this long after its deletion deadline is one no kubelet confirms."""


def held_only(p: PodView, now: datetime) -> bool:
    """``p`` holds its name and nothing else: stuck Terminating on a lost node; being deleted
    after its peers found it silent (``PodView.silent``, in this generation or an earlier
    one: ``silent.silenced``; its node may have vanished while the API server still shows it
    Ready, for ~40 s, and it would not go before); or still there :data:`OVERDUE_S` after its
    deletion deadline (``deletionTimestamp``, when a live kubelet kills it; a leaver deleted
    on a node that then vanished stayed until the node was known lost, 40-53 s, and held
    the restart that long: bench/results/2026-12-02i); or on a noticed node past its notice's
    deadline (the node is taken then: in bench/results/2026-12-03c a restart waited 30 s
    more for such a pod, until it was overdue). The next generation creates its place under
    another index instead of waiting for it."""
    overdue = p.deletion_at is not None and (now - p.deletion_at).total_seconds() >= OVERDUE_S
    gone = p.notice_until is not None and now >= p.notice_until
    return p.stuck or (p.deleting and (p.silent is not None or overdue or gone))


def overdue_in(pods: Iterable[PodView], now: datetime) -> list[float]:
    """Seconds until each pod being deleted would be overdue, or its noticed node due to go
    (:func:`held_only`)."""
    return [
        max(0.0, (at - now).total_seconds() + late)
        for p in pods
        if p.deleting
        for at, late in ((p.deletion_at, OVERDUE_S), (p.notice_until, 0.0))
        if at is not None
    ]


__all__ = [
    "NODE_LOST",
    "NODE_NOTICE",
    "OVERDUE_S",
    "held_only",
    "lost_silent",
    "overdue_in",
    "place_again",
    "recently_silent",
    "suspect_nodes",
    "unplaceable",
    "with_nodes",
]

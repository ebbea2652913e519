"""Spreading a job back over its nodes once a loss has crowded it. Pure.

A ``KeepSurvivors`` job replaces a lost pod at once, on the nodes that are up at that moment:
after a node vanishes, its pods' replacements crowd onto the nodes that are left, and when
the node returns nothing moves them back. The next loss of a crowded node then takes a
larger share of the job, often more than its elastic minimum allows it to go on without
(bench/results/2026-11-29g: 6 of 8 pods on one node, then all 8, where a node held 2-3).

:func:`spread_back` moves members with the drain's own means (``torchjob/drain.py``):
once the job has trained steadily at full size for :data:`SETTLE_S`, and a node it may use
(Ready, schedulable, no notice, its taints tolerated, its labels matching the pods'
``nodeSelector`` and required node affinity) holds at least two members fewer than the most
crowded node, the last-ranked members of the crowded nodes are given an open-ended notice
(``REBALANCE``), as many as it takes to even the counts out (:func:`_moves`: 4, 4, 0 moves
two, to 3, 3, 2). Their replacements are created at once as joiners kept off every node
that is no move's target (``CreatePods.avoid``); once all are Ready, they swap in one
generation: one re-formation from the survivors' memory, at full size (each costs a step or
two and the re-formation, so the moves of a spread go together), and a node's loss then
takes its share of the job instead of too many. A joiner that cannot be placed within
:data:`GIVE_UP_S` is given up, and no move starts again until the job's generation changes
or a target node becomes Ready again (a move starts only within :data:`WINDOW_S` after the
settle): capacity elsewhere in the cluster is not the operator's to see.

A move is made only where it pays for its re-formation (:func:`worth_moving`): evening the
counts out protects against a node lost *without* notice, when a crowded node takes more
members at once than an even spread would; a node lost *with* notice costs one re-formation
whatever it holds (its members' replacements start at once and swap in together). So a job
moves when one node holds more than half of its members, or once its history shows a loss
that came without notice (``NodeLost``, ``SilentPeer``); a job whose losses have all been
announced stays as it is until then. On the fleet bench's 120 s notice row, spread-back
moves were 5-6 of each part's 13-16 re-formations (bench/results/2026-12-01s), each as
costly as a notice's, and its replacements paid beside the members they replace.

Only an elastic ``KeepSurvivors`` job with ``replaceBeforeLeaving`` and no standbys moves
(the drain is what makes a move cost one re-formation; a ready standby would be swapped
in wherever it runs), and not one Kueue places by a topology assignment.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from torchjob.api.models import Phase
from torchjob_operator.common.clock import parse_time_or_none
from torchjob_operator.common.conditions import say
from torchjob_operator.common.nodes import NodeView
from torchjob_operator.torchjob.decision import Decision, Move
from torchjob_operator.torchjob.drain import REBALANCE, drains
from torchjob_operator.torchjob.elastic import target_replicas
from torchjob_operator.torchjob.observed import PodPhase, PodView

SETTLE_S = 15.0
"""How long the generation has trained, and the emptier node been Ready, before a move."""
WINDOW_S = 120.0
"""A move starts only this long after the settle (see the module docstring)."""
GIVE_UP_S = 60.0
"""A moving member's replacement unschedulable this long is given up."""
MOVE_NOTICE = timedelta(hours=1)
"""The notice a moving member gets: never its end (the move is given up first)."""
UNANNOUNCED = frozenset({"NodeLost", "SilentPeer"})
"""``status.history`` causes of a loss that came without notice: a node that stopped
reporting, a pod its peers found silent."""


def usable(node: NodeView, template: Mapping[str, Any]) -> bool:
    """A new pod of the job could go to ``node`` as far as the operator can tell: Ready,
    schedulable, no notice, its taints tolerated, its labels matching the template's
    ``nodeSelector`` and its required node affinity (``template``: the pod spec, as a
    mapping). Room is not known here: a move whose replacement cannot be placed is given up."""
    selector = template.get("nodeSelector") or {}
    labels = dict(node.labels)
    affinity = (template.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or ()
    return (
        not node.doomed
        and all(labels.get(k) == v for k, v in selector.items())
        and (not terms or any(_term(t, node.name, labels) for t in terms))
        and node.tolerates(template.get("tolerations") or ())
    )


def _term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """A node selector term (its requirements ANDed; an empty term matches nothing, as the
    scheduler reads it)."""
    exprs = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not exprs and not fields:
        return False
    return all(_requirement(r, labels.get(r.get("key", ""))) for r in exprs) and all(
        _requirement(r, name if r.get("key") == "metadata.name" else None) for r in fields
    )


def _requirement(r: Mapping[str, Any], value: str | None) -> bool:
    op, values = r.get("operator"), [str(v) for v in r.get("values") or ()]
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _steady(d: Decision, current: Sequence[PodView]) -> bool:
    return (
        drains(d)
        and d.phase == Phase.RUNNING
        and d.job.spec.standby_replicas == 0
        and (d.job.kueue is None or d.job.kueue.topology is None)
        and d.replicas == target_replicas(d)
        and len(current) == d.replicas
        and not d.leaving
        and all(
            p.phase == PodPhase.RUNNING
            and p.scheduled
            and p.node
            and not p.deleting
            and p.disruption is None
            and p.silent is None
            and p.notice_until is None
            for p in current
        )
    )


def _began(d: Decision) -> datetime | None:
    """When the current generation began to train: its first step (rank 0's report); for a
    job that reports no progress (no torchjob runtime in its image), when it was published.
    Counted from its publication, a restart's settle ran out while its pods still imported
    torch, and the move's replacements started beside them (bench/results/2026-12-05h,
    +484 s: five more imports during a 61 s restart on a returned node)."""
    got = d.job.state.progress
    if got is not None:
        first = got.first_step_time if got.generation == d.generation else None
        return parse_time_or_none(first)
    last = d.job.state.history[-1] if d.job.state.history else None
    return parse_time_or_none(last.began) if last and last.generation == d.generation else None


def _moves(
    d: Decision, current: Sequence[PodView], usable_nodes: Collection[str]
) -> tuple[tuple[int, str, str], ...]:
    """(member, from, to) for each member to move so that no node the job may use holds two
    members fewer than another node: the last-ranked members of the most crowded nodes, each
    toward the node with the fewest (ties by name)."""
    counts = Counter(p.node for p in current)
    node_of = {p.index: p.node for p in current}
    moves: list[tuple[int, str, str]] = []
    while True:
        crowded = min(counts, key=lambda n: (-counts[n], n))
        to = min(usable_nodes, key=lambda n: (counts[n], n))
        if counts[crowded] - counts[to] < 2:
            return tuple(moves)
        taken = {m[0] for m in moves}
        leaver = next(i for i in reversed(d.ranked) if node_of.get(i) == crowded and i not in taken)
        moves.append((leaver, crowded, to))
        counts[crowded] -= 1
        counts[to] += 1


def worth_moving(d: Decision, current: Sequence[PodView]) -> bool:
    """Whether evening the job's spread out pays for the re-formation a move costs (see the
    module docstring): one node holds more than half of the members, or the job has lost a
    member without notice (a cause of :data:`UNANNOUNCED` in its history)."""
    counts = Counter(p.node for p in current)
    if counts and 2 * max(counts.values()) > len(current):
        return True
    return any(r.cause in UNANNOUNCED for r in d.job.state.history)


def plan_move(d: Decision, current: Sequence[PodView], pods: Sequence[PodView]) -> Move | None:
    """The move this pass makes or goes on with (see the module docstring), if any."""
    if not _steady(d, current):
        return None
    template = d.job.spec.template.spec.model_dump(by_alias=True, exclude_none=True)
    usable_nodes = {n.name: n for n in d.job.nodes.values() if usable(n, template)}
    if not usable_nodes or not current:
        return None
    moves = _moves(d, current, usable_nodes)
    if not moves:
        return None
    ranked = set(d.ranked)
    moving = [p for p in pods if p.index not in ranked and p.joiner and p.active]
    if len(moving) > len(moves):
        return None
    if moving:
        stuck = [p.unschedulable_since for p in moving if p.unschedulable_since is not None]
        if stuck and (d.now - min(stuck)).total_seconds() >= GIVE_UP_S:
            return None
    elif not worth_moving(d, current):
        return None
    else:
        began = _began(d)
        if began is None:  # the generation has not stepped: nothing moves yet
            return None
        back = [usable_nodes[to].ready_since for _, _, to in moves]
        latest = max([began, *(t for t in back if t is not None)])
        if not SETTLE_S <= (d.now - latest).total_seconds() < SETTLE_S + WINDOW_S:
            return None
    targets = {to for _, _, to in moves}
    counts = Counter(p.node for p in current)
    return Move(
        leavers=tuple(m[0] for m in moves),
        moves=moves,
        keep_off=tuple(sorted(set(counts) - targets)),
        counts=tuple(sorted({**dict.fromkeys(targets, 0), **counts}.items())),
    )


def spread_condition(d: Decision, current: Sequence[PodView]) -> dict[str, Any] | None:
    """The ``Spread`` condition of a job that may move (see the module docstring), so that
    ``kubectl describe`` says how its members sit on the nodes and why they stay: True
    ``EvenlySpread``; False ``MovingMembers`` (a move is going on), ``Crowded`` (a move is due
    once the job has settled) or ``CrowdedKept`` (not worth a re-formation: every loss so far
    came with notice). None while the job is not steady (a loss or a move under way): the
    condition keeps what it said."""
    if not (drains(d) and d.job.spec.standby_replicas == 0) or not current:
        return None
    if d.job.kueue is not None and d.job.kueue.topology is not None:
        return None
    moving = [p for p in current if p.notice == REBALANCE]
    if d.move is not None or moving:
        count = len(d.move.leavers) if d.move is not None else len(moving)
        reason, msg = say("MovingMembers", count=count, counts=_per_node(current, {}))
        return {"status": False, "reason": reason, "message": msg}
    if not _steady(d, current):
        return None
    template = d.job.spec.template.spec.model_dump(by_alias=True, exclude_none=True)
    usable_nodes = {n.name: n for n in d.job.nodes.values() if usable(n, template)}
    if not usable_nodes:
        return None
    counts = _per_node(current, usable_nodes)
    if not _moves(d, current, usable_nodes):
        reason, msg = say("EvenlySpread", counts=counts)
        return {"status": True, "reason": reason, "message": msg}
    if worth_moving(d, current):
        reason, msg = say("Crowded", counts=counts, settle=f"{SETTLE_S:g}")
    else:
        reason, msg = say("CrowdedKept", counts=counts)
    return {"status": False, "reason": reason, "message": msg}


SHOWN_NODES = 12
"""The most nodes a ``Spread`` message names (a large cluster has many usable nodes)."""


def _per_node(current: Sequence[PodView], usable_nodes: Collection[str]) -> str:
    """``n0 4, n1 4; none on n2``: members per node, then the usable nodes without one (at
    most :data:`SHOWN_NODES` of each named, the rest counted)."""
    counts = Counter(p.node for p in current if p.node)
    held = [f"{n} {c}" for n, c in sorted(counts.items())]
    empty = sorted(set(usable_nodes) - set(counts))
    text = ", ".join(held[:SHOWN_NODES]) + _more(len(held), "nodes")
    if empty:
        text += f"; none on {', '.join(empty[:SHOWN_NODES])}" + _more(len(empty), "usable nodes")
    return text


def _more(count: int, what: str) -> str:
    return f" and {count - SHOWN_NODES} more {what}" if count > SHOWN_NODES else ""


def spread_back(
    d: Decision, current: Sequence[PodView], pods: Sequence[PodView]
) -> tuple[Decision, list[PodView]]:
    """(the decision with its ``move``, ``pods`` with the moving member given notice):
    what ``drain.draining`` then handles as any member given notice, its replacement kept
    off ``Move.keep_off``."""
    move = plan_move(d, current, pods)
    if move is None:
        return d, list(pods)
    until = d.now + MOVE_NOTICE
    names = {p.name for p in current if p.index in move.leavers}
    marked = [
        replace(p, notice=REBALANCE, notice_until=until) if p.name in names else p for p in pods
    ]
    return d.but(move=move), marked


__all__ = [
    "GIVE_UP_S",
    "REBALANCE",
    "SETTLE_S",
    "UNANNOUNCED",
    "WINDOW_S",
    "Move",
    "plan_move",
    "spread_back",
    "spread_condition",
    "worth_moving",
]

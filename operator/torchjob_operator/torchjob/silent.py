"""Silent peers reported by the survivors: a pod whose trainer went silent (a node that
vanished, a network partition) is lost, never charged (``torchjob.rules.loss.Silent``).

Every rank's watchdog declares a peer silent when its heartbeat in the generation's store
stopped for ``TORCHJOB_SILENT_PEER_S`` (``torchjob.launch.heartbeat``); the survivors break
their connections and wait for the next generation. Nothing in Kubernetes says the silent
pod is lost (it may still show Running: its kubelet, or the node's, has not noticed), so a
survivor's runtime writes it into the job's status (``status.silentWorkers``: the pod, the
generation, who saw it; a list map keyed by reporter and pod, each survivor applying its own
entries, so concurrent reports are all kept: ``torchjob.train.recovery.reports.SilentReports``).
The operator never writes that list (``TorchJobStatus.to_patch`` leaves it out) nor clears
it: a report of an earlier generation stays until its reporter writes again, and counts
for nothing here. :func:`silenced` turns such reports into what the planner judges:
the pod of the current generation is lost to a ``Silent`` loss, a disruption: the driver
beats for a live process whatever its GIL does, so silence means the machine or its network
is gone, not the job's fault. The generation goes on without it at once (shrunk, or replaced
at full size, uncharged), and the pod is deleted as any pod left out of a generation.

A report counts only when it names a member of the current generation and comes from
another member (and a report that a pod never arrived, only for a pod new in it:
:data:`ABSENT_HOW`). A report of the generation before counts too when both pods were carried
into this one (members of both, neither new in this one, ``status.history``), unless the pod
it names had moved on (:func:`moved_on`: it said its group broke, or its beats stopped after
this generation was published): a generation
published for another reason (a grow, a spread's swap) just as a node vanished made the
survivors' reports of the old generation count for nothing, and the new one lost 10-15 s
finding the same pods again while it formed (bench/results/2026-11-29h run 2, loss 4). Two pods that each report the other (a partition between them) cannot both
be right: a report from a pod that is itself reported does not count, and when every
reporter is reported, the view of the pod that runs rank 0 wins (it serves the store the
beats go through). Both sides find each other silent in the same seconds (the same
threshold, from the moment the link went), so which report reaches the API server first is
chance: a report that names the pod of rank 0 counts only :data:`RANK0_HOLD_S` after it was
made (its ``at``; every report its reporter made waits with it), time for rank 0's side to
report the other side if it is alive, and be believed. A vanished rank 0 cost those
seconds more (a third of the fleet bench's node losses took rank 0's pod); a partition no
longer leaves the job to the side cut off from its store (tests/cluster/test_real_node.py,
seen failing in CI when the operator acted on the first report). The wait ends early when
pods on two or more nodes besides rank 0's name it (:func:`seen_from_other_nodes`): a
partition between two nodes has one side that names rank 0, and a node beside both reaches
rank 0's store; two nodes that both lost it lost its node (or it was cut off from both, and
the side that reaches more of the job keeps it). A report without ``at`` (an older runtime)
counts at once.

While a generation forms, every member but rank 0's pod probes rank 0's store (``how:
store``, ``torchjob.train.recovery.formation``): when that host is gone, they all find it
silent in the same seconds. Such reports count only when more than half of the other
members that nobody reports make them (:func:`_cut_off_from_store`); else their makers are
the ones cut off from the store (a replacement whose route to it is broken, while the rest
of the generation arrived there), and none of their reports count. Without this rule such a
lone report took rank 0's pod, and its state, out of the job 3 s later (``RANK0_HOLD_S``),
before the others could name the replacement absent (30 s). Reports from the heartbeat
watchdog need no such majority: a survivor that leaves its broken group stops its watchdog,
so not every survivor of a vanished rank 0 names it (waiting for all of them stalled the
fleet bench 33-35 s, 2026-11-30c).

A joiner (a replacement created ahead, not yet a member) has no beat anyone watches: one on
the node of a member found silent is lost with it (how :data:`NODE_HOW`, the operator's
inference), in that pass and, from the generation's history record, the passes after, so no
generation takes it in to wait 30 s for it (:func:`_dark_joiner`). Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from torchjob import contract
from torchjob.api.models import GenerationRecord, SilentWorker
from torchjob.rules.loss import Silent
from torchjob_operator.common.clock import parse_time_or_none
from torchjob_operator.torchjob.observed import PodPhase, PodView

SILENT_REASON = "SilentPeer"
ABSENT_HOW = "absent"
"""``SilentWorker.how`` of a forming member's report that a pod never arrived
(``torchjob.train.recovery.formation.ABSENT``): it counts only for a pod new in the
generation (not :func:`carried_over`, and not generation 0, whose pods start as their
images come). A survivor arrives only at its next report, minutes away for a long step,
and its silence is the heartbeat watchdog's and the host sweep's to find."""
HEARTBEAT_HOW = "heartbeat"
"""``SilentWorker.how`` of a watchdog's report (also what a report without ``how`` means)."""
NODE_HOW = "node"
"""``Silent.how`` of a joiner lost with a silent member of its node (:func:`_dark_joiner`):
the operator's inference, never a runtime's report."""
STORE_HOW = "store"
"""``SilentWorker.how`` of a forming member's report that rank 0's store did not answer
(``torchjob.train.recovery.formation.STORE``)."""


def carried_over(
    history: Sequence[GenerationRecord], generation: int, members: Sequence[str]
) -> frozenset[str]:
    """The members of ``generation`` (pod names) that were members of the one before: none
    new in it (its ``status.history`` record's ``joined``, ``pod@node``). Without that
    record (generation 0, a history cut short), none."""
    record = next((h for h in reversed(history) if h.generation == generation), None)
    if record is None or generation == 0:
        return frozenset()
    joined = record.joined_pods()
    return frozenset(m for m in members if m not in joined)


RANK0_HOLD_S = 3.0
"""How long after it was made a report naming the pod of rank 0 waits before it counts
(see the module docstring): longer than the spread of the two sides' reports of a partition
(the beats' interval, 1 s, and a write to the API server), a small part of a vanish's
recovery (about 15 s on the fleet bench)."""


def _valid(
    reports: Sequence[SilentWorker],
    generation: int,
    members: Sequence[str],
    carried: Collection[str],
) -> list[SilentWorker]:
    """The reports that name a member, by another member, of this generation (or of the one
    before, both pods carried into this one)."""
    names = set(members)
    return [
        r
        for r in reports
        if r.pod in names
        and r.by in names
        and r.pod != r.by
        and (
            r.generation == generation
            or (r.generation == generation - 1 and r.pod in carried and r.by in carried)
        )
        and (r.how != ABSENT_HOW or (generation > 0 and r.pod not in carried))
    ]


def seen_from_other_nodes(
    valid: Sequence[SilentWorker], rank0: str, nodes: Mapping[str, str]
) -> bool:
    """Pods on two or more nodes other than the node of ``rank0`` (the pod of rank 0) report
    it silent (``nodes``: pod name -> node). Not a partition between two nodes, which has one
    side that names rank 0: its node is gone, or cut off from both, and no wait (:func:`held`)
    can bring its own report in time. bench/results/2026-12-06b: a vanish that took rank 0's
    pod re-formed 6.3-7.0 s after the vanish, one that did not 3.7-4.5 s."""
    home = nodes.get(rank0) or ""
    seen = {nodes.get(r.by) or "" for r in valid if r.pod == rank0}
    return len(seen - {home, ""}) >= 2


def held(
    reports: Sequence[SilentWorker],
    generation: int,
    members: Sequence[str],
    now: datetime,
    carried: Collection[str] = frozenset(),
    nodes: Mapping[str, str] | None = None,
) -> dict[str, datetime]:
    """The reporters whose reports wait (they named the pod of rank 0, ``members[0]``, less
    than :data:`RANK0_HOLD_S` before ``now``), with when they will count; none when pods on
    two other nodes name it (:func:`seen_from_other_nodes`; ``nodes``: pod name -> node)."""
    if not members:
        return {}
    valid = _valid(reports, generation, members, carried)
    if nodes and seen_from_other_nodes(valid, members[0], nodes):
        return {}
    out: dict[str, datetime] = {}
    for r in valid:
        made = parse_time_or_none(r.at) if r.pod == members[0] else None
        until = made + timedelta(seconds=RANK0_HOLD_S) if made is not None else None
        if until is not None and now < until:
            out[r.by] = max(out.get(r.by, until), until)
    return out


def trusted_reports(
    reports: Sequence[SilentWorker],
    generation: int,
    members: Sequence[str],
    carried: Collection[str] = frozenset(),
    now: datetime | None = None,
    nodes: Mapping[str, str] | None = None,
) -> dict[str, SilentWorker]:
    """The reports the planner acts on, by the silent pod's name (see the module docstring);
    ``members`` are the current generation's pod names in rank order; ``carried``, those of
    them that were members of the generation before (:func:`carried_over`), whose reports of
    each other in it still count; ``now``: the reporters that named rank 0's pod too lately
    wait (:func:`held`; without it, none); ``nodes``: each pod's node, for :func:`held`."""
    waiting = held(reports, generation, members, now, carried, nodes) if now is not None else {}
    valid = [r for r in _valid(reports, generation, members, carried) if r.by not in waiting]
    if cut_off := _cut_off_from_store(valid, members):
        valid = [r for r in valid if r.by not in cut_off]
    reported = {r.pod for r in valid}
    trusted = [r for r in valid if r.by not in reported]
    if not trusted and valid and members:
        trusted = [r for r in valid if r.by == members[0]]
    return {r.pod: r for r in trusted}


def _cut_off_from_store(valid: Sequence[SilentWorker], members: Sequence[str]) -> set[str]:
    """The makers of the formation's reports that rank 0's store did not answer (``how:
    store``), when they are no more than half of the other members that nobody reports: they
    are the ones cut off from it (see the module docstring)."""
    if not members:
        return set()
    reported = {r.pod for r in valid}
    others = {m for m in members[1:] if m not in reported}
    accusers = {
        r.by for r in valid if r.pod == members[0] and r.how == STORE_HOW and r.by in others
    }
    return set() if 2 * len(accusers) > len(others) else accusers


def left_silent(history: Sequence[GenerationRecord]) -> dict[str, int]:
    """The pods a generation left because their peers found them silent (its record's
    ``silent``), by name, with that generation (the latest that names it): a pod of that name
    labelled with an earlier generation is the one left; a later one is its successor."""
    out: dict[str, int] = {}
    for record in history:
        out.update(dict.fromkeys(record.silent or (), record.generation))
    return out


def moved_on(
    r: SilentWorker,
    broken: Sequence[SilentWorker],
    generation: int,
    history: Sequence[GenerationRecord],
) -> bool:
    """Whether ``r``, a heartbeat report of the generation before this one, names a pod that
    moved on rather than died: the pod said its own group of that generation broke with its
    workers alive (:attr:`SilentWorker.broken_group`), or its beats stopped after this
    generation was published (its ranks left at their next report, as asked). A rank still
    in the old generation (stuck in a step, its group not yet broken) watches beats that its
    peers have stopped writing there, and finds them all silent: seen on the fleet bench,
    one survivor of a SIGKILL named its 6 live peers 2.3-3.2 s after the new generation was
    published, and the operator replaced all 7 (bench/results/2026-12-06p, loss 5: 31 s
    without a step). A report without ``at`` (an older runtime) is judged as before.
    ``broken``: the members' reports that their own group broke (``JobState.broken``)."""
    if r.generation != generation - 1 or (r.how or HEARTBEAT_HOW) != HEARTBEAT_HOW:
        return False
    if any(o.broken_group and o.pod == r.pod and o.generation == r.generation for o in broken):
        return True
    record = next((h for h in reversed(history) if h.generation == generation), None)
    published = parse_time_or_none(record.began) if record is not None else None
    made = parse_time_or_none(r.at)
    if published is None or made is None:
        return False
    return made - timedelta(seconds=r.seconds) > published


def believed(
    reports: Sequence[SilentWorker],
    broken: Sequence[SilentWorker],
    generation: int,
    history: Sequence[GenerationRecord],
) -> list[SilentWorker]:
    """``reports`` but those naming a pod that had moved on (:func:`moved_on`)."""
    return [r for r in reports if not moved_on(r, broken, generation, history)]


def silenced(
    pods: Sequence[PodView],
    reports: Sequence[SilentWorker],
    generation: int,
    ranked: Sequence[int],
    job: str,
    history: Sequence[GenerationRecord] = (),
    now: datetime | None = None,
    broken: Sequence[SilentWorker] = (),
) -> list[PodView]:
    """``pods`` with each member of generation ``generation`` that its peers reported silent
    seen as lost to it (``PodView.silent``, reason ``SilentPeer``): the loss the planner then
    judges, and a pod no later generation keeps. A pod created for a later generation under
    the same name (the replacement) is not the one reported; a pod carried into this
    generation (``history``: :func:`carried_over`) is the one its peers reported in the
    generation before.

    A pod an earlier generation left for its silence (:func:`left_silent`) and still there
    (deleted, on a node that does not confirm it) keeps ``PodView.silent`` too: its name is
    held, never its place. Its reporters' later reports replace theirs of it, so only the
    history remembers it: a generation begun for another loss while a vanished node's pods
    still showed Running took them back as members and waited 37-39 s for the node
    controller (bench/results/2026-11-30a, losses 8 and 9). ``now``: reports naming rank 0's
    pod wait a moment (:func:`held`, :func:`recheck_after`). ``broken``: the members' reports
    that their own group broke, for :func:`moved_on`."""
    members, carried = _membership(ranked, job, history, generation)
    reports = believed(reports, broken, generation, history)
    on = pod_nodes(pods)
    trusted = trusted_reports(reports, generation, members, carried, now, on) if reports else {}
    earlier = left_silent(history)
    out = []
    dark = _dark_nodes(history, generation)
    for p in pods:
        r = trusted.get(p.name)
        if r is not None and p.active and (p.generation <= r.generation or p.name in carried):
            out.append(_lost(p, Silent(r.seconds, r.by, r.how or HEARTBEAT_HOW)))
            if p.node:
                dark.setdefault(p.node, (Silent(r.seconds, r.by, NODE_HOW), generation + 1))
        elif p.generation < earlier.get(p.name, -1) and p.silent is None:
            left = earlier[p.name]
            out.append(replace(p, silent=Silent(0.0, f"the survivors of generation {left - 1}")))
        else:
            out.append(p)
    ranked_now = frozenset(members)
    return [p if p.name in ranked_now else _dark_joiner(p, dark) for p in out]


def _dark_nodes(
    history: Sequence[GenerationRecord], generation: int
) -> dict[str, tuple[Silent, int]]:
    """The nodes on which generation ``generation`` lost members to their silence (its
    ``status.history`` record: ``silent``, on ``left``'s nodes), each with what its joiners
    are lost to and the newest generation label such a joiner can carry (created before)."""
    record = next((h for h in reversed(history) if h.generation == generation), None)
    if record is None or not record.silent:
        return {}
    said = Silent(0.0, f"the survivors of generation {generation - 1}", NODE_HOW)
    return {node: (said, generation) for node in record.silent_nodes().values() if node}


def _dark_joiner(p: PodView, dark: Mapping[str, tuple[Silent, int]]) -> PodView:
    """A joiner (not a member: a member is judged by its own beats) on a node where a member was found silent (``dark``: node -> its loss, and
    the newest generation label of a joiner created before it) is lost with it (how
    :data:`NODE_HOW`): no member beats with a joiner, so nothing else would say so before a
    generation took it in and it never arrived. Seen in the fleet benchmark
    (bench/results/2026-12-05n, +1289 s): a replacement placed on a node 4 s before the node
    vanished joined the next generation, which waited the 30 s of ``absent`` for it. Its
    name is held (``PodView.silent``), as any silent pod's, in the passes after the loss too
    (the generation's history record), so its deletion, never confirmed by a vanished node,
    holds up nothing (``nodes.held_only``)."""
    lost = dark.get(p.node or "")
    if lost is None or not p.joiner or p.silent is not None or p.generation > lost[1]:
        return p
    return _lost(p, lost[0]) if p.active else replace(p, silent=lost[0])


def recheck_after(
    reports: Sequence[SilentWorker],
    generation: int,
    ranked: Sequence[int],
    job: str,
    history: Sequence[GenerationRecord],
    now: datetime,
    nodes: Mapping[str, str] | None = None,
) -> float | None:
    """Seconds until the first waiting report counts (:func:`held`; ``nodes``: each pod's
    node); None when none waits."""
    members, carried = _membership(ranked, job, history, generation)
    waiting = held(reports, generation, members, now, carried, nodes)
    if not waiting:
        return None
    return max(0.1, (min(waiting.values()) - now).total_seconds())


def pod_nodes(pods: Sequence[PodView]) -> dict[str, str]:
    """Each placed pod's node, by pod name (:func:`held`'s ``nodes``)."""
    return {p.name: p.node for p in pods if p.node}


def _membership(
    ranked: Sequence[int], job: str, history: Sequence[GenerationRecord], generation: int
) -> tuple[list[str], frozenset[str]]:
    """The generation's pod names in rank order, and those carried over (:func:`carried_over`)."""
    members = [contract.worker_pod_name(job, i) for i in ranked]
    return members, carried_over(history, generation, members)


def _lost(p: PodView, silent: Silent) -> PodView:
    """``p`` failed as silent (``PodView.silent``, reason ``SilentPeer``)."""
    line = f"{p.name} {silent.why}"
    return replace(
        p, phase=PodPhase.FAILED, reason=SILENT_REASON, message=line, summary=line, silent=silent
    )

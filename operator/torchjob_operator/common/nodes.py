"""A Node as the operator reads it: a termination notice, a cordon, a node gone silent. Pure.

A spot or preemptible VM is taken back after a notice (AWS gives two minutes, GCP and Azure
about 30 s). Kubernetes learns of it from the cloud's termination handler, which taints the
Node and later drains it: AWS Node Termination Handler (``aws-node-termination-handler/*``),
Karpenter (``karpenter.sh/disrupted``; before v1 ``karpenter.sh/disruption=disrupting``),
GKE (``cloud.google.com/impending-node-termination``). Which taints count, and how long each
gives, is the operator's setting (``--notice-taints``); ``torchjob_operator.torchjob.nodes``
says what the pods on such nodes become.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from torchjob_operator.common.clock import parse_time_or_none


@dataclass(frozen=True)
class NoticeTaint:
    """A taint key that announces the node's end, and how long after it the node goes."""

    key: str
    window_s: float
    value: str | None = None
    """Only this value counts (Karpenter before v1 uses ``disruption=disrupting``); None: any."""

    def matches(self, taint: Mapping[str, Any]) -> bool:
        return taint.get("key") == self.key and (
            self.value is None or taint.get("value") == self.value
        )


DEFAULT_NOTICE_TAINTS: tuple[NoticeTaint, ...] = (
    # AWS Node Termination Handler: a spot interruption is two minutes' notice; the others
    # (scheduled maintenance, an ASG scale-in) come with at least as much.
    NoticeTaint("aws-node-termination-handler/spot-itn", 120.0),
    NoticeTaint("aws-node-termination-handler/scheduled-maintenance", 120.0),
    NoticeTaint("aws-node-termination-handler/asg-lifecycle-termination", 120.0),
    # Karpenter taints a node it is about to disrupt (consolidation, drift, an interruption
    # it received) before it drains it; an AWS spot interruption is again two minutes.
    NoticeTaint("karpenter.sh/disrupted", 120.0),
    NoticeTaint("karpenter.sh/disruption", 120.0, value="disrupting"),
    # GKE: a preemptible or spot VM's graceful shutdown, about 30 s.
    NoticeTaint("cloud.google.com/impending-node-termination", 30.0),
)
"""The notices recognised unless the operator is told otherwise (``--notice-taints``)."""


def parse_notice_taints(text: str) -> tuple[NoticeTaint, ...]:
    """``key[=value]:seconds`` entries, comma-separated (``--notice-taints``); ``default``
    stands for :data:`DEFAULT_NOTICE_TAINTS`, an empty string for none. Raises ValueError
    naming the entry that is wrong."""
    out: list[NoticeTaint] = []
    for raw in (e.strip() for e in text.split(",")):
        if not raw:
            continue
        if raw == "default":
            out.extend(DEFAULT_NOTICE_TAINTS)
            continue
        spec, sep, seconds = raw.rpartition(":")
        try:
            window = float(seconds)
        except ValueError:
            window = -1.0
        if not sep or not spec or window <= 0:
            raise ValueError(
                f"notice taint {raw!r}: expected key[=value]:seconds (seconds > 0),"
                " for example aws-node-termination-handler/spot-itn:120"
            )
        key, eq, value = spec.partition("=")
        out.append(NoticeTaint(key, window, value if eq else None))
    return tuple(out)


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool = True
    """Its ``Ready`` condition is ``True`` (a node with no conditions yet counts as ready)."""
    unschedulable: bool = False
    """Cordoned (``spec.unschedulable``)."""
    notice: str | None = None
    """The key of the notice taint it carries, if any."""
    noticed_at: datetime | None = None
    """The taint's ``timeAdded`` (the API server sets it only for NoExecute taints), else when
    the operator's Node watch first saw the notice (:func:`first_seen`)."""
    window_s: float = 0.0
    """The notice's window (``NoticeTaint.window_s``)."""
    labels: tuple[tuple[str, str], ...] = ()
    """Its labels, sorted (the topology levels a job's placement compares: ``label``)."""
    taints: tuple[tuple[str, str, str], ...] = ()
    """Its ``NoSchedule`` and ``NoExecute`` taints as (key, value, effect): those that keep
    off a pod that does not tolerate them (``tolerates``)."""
    ready_since: datetime | None = None
    """When its ``Ready`` condition last changed (``lastTransitionTime``): for a ready node,
    since when it is back."""

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)

    def tolerates(self, tolerations: Sequence[Mapping[str, Any]]) -> bool:
        """A pod with ``tolerations`` (core/v1 Toleration objects) may be placed here as far
        as the taints say."""
        return all(any(_tolerated(t, taint) for t in tolerations) for taint in self.taints)

    @property
    def doomed(self) -> bool:
        """No new pod of a job belongs here: noticed, cordoned or not reporting."""
        return self.notice is not None or self.unschedulable or not self.ready


def _tolerated(toleration: Mapping[str, Any], taint: tuple[str, str, str]) -> bool:
    """core/v1's rule: an empty key with ``Exists`` tolerates every taint; else the keys
    match, and the values (``Equal``, the default) unless ``Exists``; an empty effect
    matches every effect."""
    key, value, effect = taint
    if toleration.get("effect") and toleration.get("effect") != effect:
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration.get("key") == key
    return toleration.get("key") == key and (toleration.get("value") or "") == value


def node_view(node: Mapping[str, Any], notices: Sequence[NoticeTaint]) -> NodeView:
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    conditions = (node.get("status") or {}).get("conditions") or ()
    cond: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    view = NodeView(
        name=str(meta.get("name") or ""),
        ready=cond.get("status", "True") == "True",
        unschedulable=bool(spec.get("unschedulable")),
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        taints=tuple(
            (str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
            for t in spec.get("taints") or ()
            if t.get("effect") in ("NoSchedule", "NoExecute")
        ),
        ready_since=parse_time_or_none(cond.get("lastTransitionTime")),
    )
    for taint in spec.get("taints") or ():
        for notice in notices:
            if notice.matches(taint):
                return replace(
                    view,
                    notice=notice.key,
                    noticed_at=parse_time_or_none(taint.get("timeAdded")),
                    window_s=notice.window_s,
                )
    return view


def first_seen(view: NodeView, before: NodeView | None, now: datetime) -> NodeView:
    """``view`` with a notice that carries no time (``noticed_at``; GKE's and Karpenter's
    NoSchedule taints have none) dated when it was first seen: by ``before`` (the node's
    previous view, with the same notice), else ``now``. Undated, every pass counted the
    window from its own clock, so a pod being deleted on a noticed node, no longer listed in
    ``status.leavingWorkers``, was never past its node's deadline (``torchjob.nodes.
    held_only``) and a restart waited for it to be overdue: 45 s after the deletion, where
    the node had gone 10 s after it (bench/results/2026-12-05d, +170 s)."""
    if view.notice is None or view.noticed_at is not None:
        return view
    if before is not None and before.notice == view.notice and before.noticed_at is not None:
        return replace(view, noticed_at=before.noticed_at)
    return replace(view, noticed_at=now)


def notice_deadline(node: NodeView, first_seen: datetime) -> datetime | None:
    """When the noticed ``node`` goes: its taint's time (or ``first_seen``, when the operator
    first saw the notice) plus the notice's window; None for a node with no notice."""
    if node.notice is None:
        return None
    start = node.noticed_at or first_seen
    return start + timedelta(seconds=node.window_s)


AVOIDED_NODES = "torchjob.io/avoided-nodes"
"""The annotation on a worker pod naming the nodes :func:`avoided` gave it (comma-separated):
its required node affinity keeps it off them for good, so a pod the scheduler cannot place
is created again once one of them is avoided no more (``torchjob/nodes.py``)."""


def avoided(nodes: Mapping[str, NodeView]) -> tuple[str, ...]:
    """The nodes a new pod is kept off, sorted: noticed or not reporting. (A cordoned node
    needs nothing: the scheduler never places a pod there; and there may be many.)"""
    return tuple(sorted(n.name for n in nodes.values() if n.notice is not None or not n.ready))


def why_avoided(avoid: Sequence[str], nodes: Mapping[str, NodeView]) -> str:
    """Each node in ``avoid`` with why new pods keep off it, for the ``KeptOffNodes`` Event
    (``kubectl describe``): not reporting (``Ready`` not ``True``), a termination notice (its
    taint's key), or, neither of those, a Lease not seen renewed (:func:`quiet`, which the
    views do not show)."""

    def why(name: str) -> str:
        view = nodes.get(name)
        if view is not None and not view.ready:
            return "not Ready"
        if view is not None and view.notice is not None:
            return f"termination notice {view.notice}"
        return "its kubelet's Lease not renewed"

    return ", ".join(f"{name} ({why(name)})" for name in avoid)


LEASE_QUIET_S = 20.0
"""A node whose Lease (``kube-node-lease``) the operator has not seen renewed for this long,
two of the kubelet's renewals, gets no new pod (:func:`quiet`): its kubelet does not talk to
the API server, so it would not start one. It is half the Lease's ``leaseDurationSeconds``
(40 s by default; the kubelet renews every quarter of it); this, for a Lease that does not
say. The node controller waits 40 s (``node-monitor-grace-period``) before it marks such a
node ``Ready=Unknown``; until then a node that vanished, or one back within those 40 s whose
kubelet has not yet renewed, looks Ready and empty, and the job's spread put a whole
restart's pods there (bench/results/2026-12-05v, repeat 2: the node came back 31 s after it
vanished, was given generation 12's eight pods 6 s later, and was marked lost 9 s after
that)."""


class LeaseRead(NamedTuple):
    """What is kept of a node's Lease as read."""

    renew_time: str
    """Its ``spec.renewTime``."""
    duration_s: float | None = None
    """Its ``spec.leaseDurationSeconds``; the kubelet renews every quarter of it."""


@dataclass(frozen=True)
class Renewal:
    """A node's Lease as the operator saw it renewed."""

    renew_time: str
    """Its ``spec.renewTime``, as last read."""
    seen_at: datetime
    """When the operator first read that value, by its own clock (the node controller's
    rule: a kubelet's clock never counts)."""
    renewing: bool = False
    """Seen to change at least once. A Lease that nothing renews (a node already silent
    when the operator started, a Lease someone wrote by hand) is never judged."""
    quiet_s: float = LEASE_QUIET_S
    """Half its ``leaseDurationSeconds`` (:data:`LEASE_QUIET_S` when it gives none)."""

    def quiet_at(self, now: datetime) -> bool:
        """Renewing, and not seen renewed for more than :attr:`quiet_s`."""
        return self.renewing and (now - self.seen_at).total_seconds() > self.quiet_s


def renewal(before: Renewal | None, read: LeaseRead, now: datetime) -> Renewal:
    """The node's :class:`Renewal` once its Lease reads ``read`` at ``now``."""
    quiet_s = read.duration_s / 2 if read.duration_s and read.duration_s > 0 else LEASE_QUIET_S
    if before is not None and before.renew_time == read.renew_time:
        return before if before.quiet_s == quiet_s else replace(before, quiet_s=quiet_s)
    return Renewal(read.renew_time, now, renewing=before is not None, quiet_s=quiet_s)


def quiet(renewals: Mapping[str, Renewal], now: datetime) -> tuple[str, ...]:
    """The nodes, sorted, whose renewing Lease the operator has not seen renewed for more
    than half its duration (``Renewal.quiet_at``), while at least as many were: more quiet
    than not is the operator's watch, or the API server, or kwok stalling, not the nodes (the
    node controller, likewise, stops evicting in a zone where most nodes stopped)."""
    found = sorted(n for n, r in renewals.items() if r.quiet_at(now))
    alive = sum(1 for r in renewals.values() if r.renewing and not r.quiet_at(now))
    return tuple(found) if found and alive >= len(found) else ()


__all__ = [
    "AVOIDED_NODES",
    "DEFAULT_NOTICE_TAINTS",
    "LEASE_QUIET_S",
    "LeaseRead",
    "NodeView",
    "NoticeTaint",
    "Renewal",
    "avoided",
    "first_seen",
    "node_view",
    "notice_deadline",
    "parse_notice_taints",
    "quiet",
    "renewal",
    "why_avoided",
]

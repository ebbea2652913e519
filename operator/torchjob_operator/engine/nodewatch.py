"""The operator's Node watch (read-only): which nodes are noticed, cordoned or gone silent.

Every Node is read into a small ``torchjob.nodes.NodeView`` (its name, ``Ready``, cordon and
termination notice: nothing else is kept) in a :class:`NodeBook` that the reconciles read.
Only a change of a view matters; a Node's status moves every few seconds (its heartbeat),
which changes nothing here. When one changes, every job with a pod bound to that node, or
kept off it, plans again (``Store.jobs_on_nodes``): a notice starts its pods' replacements at
once, a node that stopped reporting loses its pods without waiting for the node controller's
evictions, and a node back under its name lets a pod kept off it be made again.

The nodes' Leases (``kube-node-lease``, read-only) say sooner that a kubelet stopped: the
:class:`LeaseWatch` notes when each was last seen renewed, and a node quiet for half its
duration (``common.nodes.LEASE_QUIET_S``: 20 s by default) gets no new pod
(``NodeBook.avoid``), 20 s or more before the node controller marks it ``Ready=Unknown``. A renewal pokes only the jobs kept off a node
that was quiet: their pods the scheduler could not place are made again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from kubernetes import client

from torchjob_operator.common.nodes import (
    LeaseRead,
    NodeView,
    NoticeTaint,
    Renewal,
    avoided,
    first_seen,
    node_view,
    quiet,
    renewal,
)
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.reflector import Reflector

OnJob = Callable[[str, str], None]
log = logging.getLogger("torchjob_operator.engine.nodewatch")


class NodeBook:
    """The nodes' views by name: written by the watch thread, read by the reconciles."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: Mapping[str, NodeView] = MappingProxyType({})
        self._avoid: tuple[str, ...] = ()
        self._lost: frozenset[str] = frozenset()
        self._renewals: dict[str, Renewal] = {}
        self._quiet: tuple[str, ...] = ()
        """The quiet nodes last said in the log."""

    def snapshot(self) -> Mapping[str, NodeView]:
        """Every known node's view (an immutable mapping a reader may keep)."""
        with self._lock:
            return self._views

    def avoid(self, now: datetime | None = None) -> tuple[str, ...]:
        """The nodes new pods are kept off: ``common.nodes.avoided`` of the views (computed
        when a view changes, not by every reconcile: a cluster may have thousands of nodes),
        and those whose Lease is quiet (``common.nodes.quiet``, which a renewal changes)."""
        at = now or datetime.now(timezone.utc)
        with self._lock:
            views, silent = self._avoid, quiet(self._renewals, at)
            said, self._quiet = self._quiet, silent
        if silent != said:
            log.info("nodes whose Lease is not renewed, kept off by new pods: %s", silent or "none")
        return tuple(sorted({*views, *silent})) if silent else views

    def lost(self) -> frozenset[str]:
        """The nodes that stopped reporting (``Ready`` not ``True``), computed when a view
        changes: a scrape reads it (``engine.job_metrics``)."""
        with self._lock:
            return self._lost

    def renewed(self, leases: Mapping[str, LeaseRead], now: datetime | None = None) -> set[str]:
        """Leases read, by node name; one whose ``renewTime`` changed was renewed. Returns
        the nodes renewed after they were quiet (``Renewal.quiet_at``)."""
        at = now or datetime.now(timezone.utc)
        back = set()
        with self._lock:
            for name, read in leases.items():
                old = self._renewals.get(name)
                new = renewal(old, read, at)
                if old is not None and new.seen_at != old.seen_at and old.quiet_at(at):
                    back.add(name)
                self._renewals[name] = new
        return back

    def renewals_listed(
        self, leases: Mapping[str, LeaseRead], now: datetime | None = None
    ) -> set[str]:
        """A LIST of the Leases: those it does not show are forgotten."""
        with self._lock:
            self._renewals = {n: r for n, r in self._renewals.items() if n in leases}
        return self.renewed(leases, now)

    def lease_gone(self, name: str) -> None:
        with self._lock:
            self._renewals.pop(name, None)

    def _set(self, views: dict[str, NodeView]) -> None:
        self._views = MappingProxyType(views)
        self._avoid = avoided(views)
        self._lost = frozenset(n for n, v in views.items() if not v.ready)

    def replace(self, views: Mapping[str, NodeView], now: datetime | None = None) -> set[str]:
        """A LIST's views replace the book (a notice without a time keeps when the book first
        saw it: ``common.nodes.first_seen``); returns the nodes whose view changed."""
        at = now or datetime.now(timezone.utc)
        with self._lock:
            old = self._views
            new = {n: first_seen(v, old.get(n), at) for n, v in views.items()}
            self._set(new)
        return {n for n in set(old) | set(new) if old.get(n) != new.get(n)}

    def put(self, view: NodeView, now: datetime | None = None) -> bool:
        """One node's view (dated as in :meth:`replace`); True when it changed."""
        with self._lock:
            view = first_seen(view, self._views.get(view.name), now or datetime.now(timezone.utc))
            if self._views.get(view.name) == view:
                return False
            self._set({**self._views, view.name: view})
        return True

    def drop(self, name: str) -> bool:
        with self._lock:
            if name not in self._views:
                return False
            self._set({k: v for k, v in self._views.items() if k != name})
        return True


class NodeWatch(Reflector):
    """Watches Nodes into ``book``; a node whose view changes pokes the jobs on it."""

    what = "nodes"

    def __init__(
        self,
        api: client.ApiClient,
        on_job: OnJob,
        store: Store,
        book: NodeBook,
        notices: Sequence[NoticeTaint],
        **kwargs: Any,
    ) -> None:
        super().__init__(namespaces=(), **kwargs)  # Nodes are cluster-scoped
        self.core = client.CoreV1Api(api)
        self.on_job = on_job
        self.store = store
        self.book = book
        self.notices = tuple(notices)

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        return self.core.list_node(**kwargs)

    def trim(self, obj: dict[str, Any]) -> dict[str, Any]:
        # The view is all that is kept: images, addresses and capacity are never held.
        return {"view": node_view(obj, self.notices)}

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        views = {v.name: v for v in (i["view"] for i in items)}
        self._poke(self.book.replace(views))

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        view = node_view(obj, self.notices)
        moved = self.book.drop(view.name) if kind == "DELETED" else self.book.put(view)
        if moved:
            self._poke({view.name})

    def _poke(self, nodes: set[str]) -> None:
        poke_jobs(self.store, self.on_job, nodes)


class LeaseWatch(Reflector):
    """Watches the nodes' Leases into ``book``; a quiet node renewing again pokes the jobs
    kept off it."""

    what = "node leases"

    def __init__(
        self, api: client.ApiClient, on_job: OnJob, store: Store, book: NodeBook, **kwargs: Any
    ) -> None:
        super().__init__(namespaces=(NODE_LEASES,), **kwargs)
        self.coordination = client.CoordinationV1Api(api)
        self.on_job = on_job
        self.store = store
        self.book = book

    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        return self.coordination.list_namespaced_lease(namespace or NODE_LEASES, **kwargs)

    def trim(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {"name": _lease_name(obj), "read": lease_read(obj)}

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        self._poke(self.book.renewals_listed({i["name"]: i["read"] for i in items}))

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.book.lease_gone(_lease_name(obj))
        else:
            self._poke(self.book.renewed({_lease_name(obj): lease_read(obj)}))

    def _poke(self, nodes: set[str]) -> None:
        poke_jobs(self.store, self.on_job, nodes)


def poke_jobs(store: Store, on_job: OnJob, nodes: set[str]) -> None:
    """Plan again every job with a pod bound to one of ``nodes`` or kept off one."""
    for key in store.jobs_on_nodes(nodes):
        on_job(*key)


NODE_LEASES = "kube-node-lease"
"""Where each kubelet renews its node's Lease (named after the node)."""


def _lease_name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def lease_read(obj: Mapping[str, Any]) -> LeaseRead:
    spec = obj.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return LeaseRead(
        str(spec.get("renewTime") or ""),
        float(duration) if isinstance(duration, int | float) else None,
    )


__all__ = ["LeaseWatch", "NodeBook", "NodeWatch", "lease_read"]

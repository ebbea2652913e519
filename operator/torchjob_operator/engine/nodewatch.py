"""The operator's Node watch (read-only): which nodes are noticed, cordoned or gone silent.

Every Node is read into a small ``torchjob.nodes.NodeView`` (its name, ``Ready``, cordon and
termination notice: nothing else is kept) in a :class:`NodeBook` that the reconciles read.
Only a change of a view matters; a Node's status moves every few seconds (its heartbeat),
which changes nothing here. When one changes, every job with a pod bound to that node, or
kept off it, plans again (``Store.jobs_on_nodes``): a notice starts its pods' replacements at
once, a node that stopped reporting loses its pods without waiting for the node controller's
evictions, and a node back under its name lets a pod kept off it be made again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from kubernetes import client

from torchjob_operator.common.nodes import NodeView, NoticeTaint, avoided, first_seen, node_view
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.reflector import Reflector

OnJob = Callable[[str, str], None]


class NodeBook:
    """The nodes' views by name: written by the watch thread, read by the reconciles."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: Mapping[str, NodeView] = MappingProxyType({})
        self._avoid: tuple[str, ...] = ()
        self._lost: frozenset[str] = frozenset()

    def snapshot(self) -> Mapping[str, NodeView]:
        """Every known node's view (an immutable mapping a reader may keep)."""
        with self._lock:
            return self._views

    def avoid(self) -> tuple[str, ...]:
        """``common.nodes.avoided`` of the book, computed when a view changes, not by every
        reconcile (a cluster may have thousands of nodes)."""
        with self._lock:
            return self._avoid

    def lost(self) -> frozenset[str]:
        """The nodes that stopped reporting (``Ready`` not ``True``), computed when a view
        changes: a scrape reads it (``engine.job_metrics``)."""
        with self._lock:
            return self._lost

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
        for key in self.store.jobs_on_nodes(nodes):
            self.on_job(*key)


__all__ = ["NodeBook", "NodeWatch"]

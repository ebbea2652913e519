"""client-go's reflector loop, on a thread per watched namespace: LIST (which hands the
whole scope to :meth:`Reflector.listed`), then WATCH from the list's resourceVersion
(bookmarks keep it fresh), LIST again on 410 Gone, back off on errors. Each event goes to
:meth:`Reflector.changed`. Events are read as raw JSON (orjson, no model objects).

A resource the API server does not serve (404: a CRD not installed, or uninstalled while
the operator runs, such as Kueue's Workloads), or one the operator's account may not read
(403: a chart older than the operator, without the Node watch's RBAC), is looked for again
every :data:`ABSENT_WAIT_S` seconds, said once in the log: the operator goes on without it.
(kopf's own watch of such a resource ends the operator with the 404.)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("torchjob_operator.engine.reflector")

LIST_PAGE = 500
"""Objects per page of the LIST that (re)fills the scope."""
ABSENT_WAIT_S = 30.0
"""How often a resource the API server does not serve is looked for again."""


def lines(response: Any) -> Iterator[bytes]:
    """The newline-separated JSON events of a watch response, as they arrive."""
    buf = b""
    for chunk in response.stream(65536, decode_content=True):
        buf += chunk
        *complete, buf = buf.split(b"\n")
        yield from complete
    if buf:
        yield buf


class Reflector:
    """LIST+WATCH of one resource in ``namespaces`` (empty: cluster-wide) on threads.

    A subclass says how to list (:meth:`list_call`, called with the list or watch keyword
    arguments of the kubernetes client) and what an event or a listing means."""

    what = "objects"
    """Named in the log."""

    def __init__(
        self,
        *,
        namespaces: tuple[str, ...] = (),
        server_timeout_s: int = 300,
        client_timeout_s: float = 330.0,
    ) -> None:
        self.namespaces = namespaces
        self.server_timeout_s = server_timeout_s
        self.client_timeout_s = client_timeout_s
        self._stop = threading.Event()
        self._responses: dict[str | None, Any] = {}
        self._threads: list[threading.Thread] = []

    # --- what a subclass says ----------------------------------------------------------
    def list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        raise NotImplementedError

    def listed(self, namespace: str | None, items: list[dict[str, Any]]) -> None:
        """The scope's objects as a LIST found them (after a start, a 410 or an error)."""

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""

    # --- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        for ns in self.namespaces or (None,):
            t = threading.Thread(
                target=self._run, args=(ns,), name=f"watch:{self.what}:{ns or '*'}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for response in list(self._responses.values()):
            with contextlib.suppress(Exception):  # a dead socket may raise anything
                # shutdown() unblocks the thread reading an idle watch; close() would wait
                # for the lock that thread holds (shutdown took the 5 s join timeout).
                response.shutdown()
        for t in self._threads:
            t.join(5)

    def _list(self, namespace: str | None) -> str:
        """LIST the scope in pages of ``LIST_PAGE``; returns the resourceVersion to watch
        from."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"_continue": token} if token else {}
            response = self.list_call(
                namespace,
                limit=LIST_PAGE,
                _preload_content=False,
                _request_timeout=(30, self.client_timeout_s),
                **kwargs,
            )
            page = orjson.loads(response.data)
            items.extend(self.trim(i) for i in page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        self.listed(namespace, items)
        return str(meta.get("resourceVersion") or "")

    def trim(self, obj: dict[str, Any]) -> dict[str, Any]:
        """What is kept of a listed object (all of it unless a subclass says less)."""
        return obj

    def _run(self, namespace: str | None) -> None:
        resource_version: str | None = None
        backoff = 0.5
        absent = False
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list(namespace)
                if absent:
                    log.info("%s are served again: watching them", self.what)
                    absent = False
                resource_version = self._follow(namespace, resource_version)
                backoff = 0.5
                continue
            except ApiException as e:
                if e.status == 410:
                    resource_version = None
                    continue
                if e.status in (403, 404):
                    if not absent:
                        why = (
                            "not served by the API server (CRD not installed?)"
                            if e.status == 404
                            else "not readable by the operator's account (RBAC: list, watch)"
                        )
                        log.info(
                            "%s are %s: looking again every %.0f s",
                            self.what,
                            why,
                            ABSENT_WAIT_S,
                        )
                    absent, resource_version = True, None
                    self._stop.wait(ABSENT_WAIT_S)
                    continue
                log.warning(
                    "%s watch (%s) failed: %s %s", self.what, namespace or "*", e.status, e.reason
                )
            except Exception as e:  # the watch must outlive any error
                if self._stop.is_set():
                    return
                log.warning("%s watch (%s) broke: %s", self.what, namespace or "*", e)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _follow(self, namespace: str | None, resource_version: str | None) -> str | None:
        """One watch request until the server ends it; returns where to resume."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self.server_timeout_s,
            "_preload_content": False,
            "_request_timeout": (30, self.client_timeout_s),
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        response = self.list_call(namespace, **kwargs)
        self._responses[namespace] = response
        try:
            for line in lines(response):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = orjson.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None  # too old: LIST again
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if kind != "BOOKMARK":
                    self.changed(str(kind), obj)
        finally:
            self._responses.pop(namespace, None)
            response.release_conn()
        return resource_version

"""The operator's pod watch: only the pods it owns, selected by the API server.

kopf filters pods by label on the client side, after receiving and parsing every
pod in the cluster: on a cluster shared with other workloads the operator paid
CPU for pods that were never its own. This watch asks the API server for pods
carrying the job-name label only (``labelSelector=torchjob.io/job-name``), reads
each event as raw JSON (orjson, no model objects: five times faster than ``json`` on
a pod event, and every pod brings several), keeps the pod in the operator's
``cache.Store`` and reports the job it belongs to.

One thread per watched namespace (one for the whole cluster by default) runs
client-go's reflector loop: LIST (which replaces the cache's pods of that scope),
then WATCH from the list's resourceVersion (bookmarks keep it fresh), LIST again on
410 Gone, back off on errors. Every pod event calls ``on_job(namespace, job)``; the
reconciler coalesces them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchjob import contract
from torchjob_operator.engine import metrics
from torchjob_operator.engine.cache import ALL_NAMESPACES, Store
from torchjob_operator.engine.objects import trim_pod

log = logging.getLogger("torchjob_operator.engine.podwatch")

OnJob = Callable[[str, str], None]

LIST_PAGE = 500
"""Pods per page of the LIST that (re)fills the cache."""


def job_of(event: dict[str, Any]) -> tuple[str, str] | None:
    """(namespace, job name) of a watch event's pod; None for bookmarks and foreign pods."""
    meta = (event.get("object") or {}).get("metadata") or {}
    job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    if event.get("type") == "BOOKMARK" or not job:
        return None
    return str(meta.get("namespace") or ""), str(job)


def _lines(response: Any) -> Iterator[bytes]:
    buf = b""
    for chunk in response.stream(65536, decode_content=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines
    if buf:
        yield buf


class PodWatch:
    """Watches the operator's pods in ``namespaces`` (empty: cluster-wide) on threads."""

    def __init__(
        self,
        api: client.ApiClient,
        on_job: OnJob,
        store: Store,
        *,
        namespaces: tuple[str, ...] = (),
        server_timeout_s: int = 300,
        client_timeout_s: float = 330.0,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.on_job = on_job
        self.store = store
        self.namespaces = namespaces
        self.server_timeout_s = server_timeout_s
        self.client_timeout_s = client_timeout_s
        self._stop = threading.Event()
        self._responses: dict[str | None, Any] = {}
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for ns in self.namespaces or (None,):
            t = threading.Thread(
                target=self._run, args=(ns,), name=f"podwatch:{ns or '*'}", daemon=True
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

    def _open(self, namespace: str | None, resource_version: str | None) -> Any:
        kwargs: dict[str, Any] = {
            "label_selector": contract.LABEL_JOB_NAME,
            "watch": True,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self.server_timeout_s,
            "_preload_content": False,
            "_request_timeout": (30, self.client_timeout_s),
        }
        if resource_version:
            kwargs["resource_version"] = resource_version
        return self._list_call(namespace, **kwargs)

    def _list_call(self, namespace: str | None, **kwargs: Any) -> Any:
        if namespace is None:
            return self.core.list_pod_for_all_namespaces(**kwargs)
        return self.core.list_namespaced_pod(namespace, **kwargs)

    def _list(self, namespace: str | None) -> str:
        """LIST the scope's pods into the cache, poke every job they (or the cache) had;
        returns the resourceVersion to watch from. Pages of ``LIST_PAGE`` pods, each trimmed
        as it comes: thousands of whole pods parsed at once would grow the heap for good."""
        pods: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"_continue": token} if token else {}
            response = self._list_call(
                namespace,
                label_selector=contract.LABEL_JOB_NAME,
                limit=LIST_PAGE,
                _preload_content=False,
                _request_timeout=(30, self.client_timeout_s),
                **kwargs,
            )
            page = orjson.loads(response.data)
            pods.extend(trim_pod(p) for p in page.get("items") or ())
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                break
        changed = self.store.replace_pods(ALL_NAMESPACES if namespace is None else namespace, pods)
        for key in changed:
            self.on_job(*key)
        return str(meta.get("resourceVersion") or "")

    def _run(self, namespace: str | None) -> None:
        resource_version: str | None = None
        backoff = 0.5
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list(namespace)
                resource_version = self._follow(namespace, resource_version)
                backoff = 0.5
                continue
            except ApiException as e:
                if e.status == 410:
                    resource_version = None
                    continue
                log.warning("pod watch (%s) failed: %s %s", namespace or "*", e.status, e.reason)
            except Exception as e:  # the watch must outlive any error
                if self._stop.is_set():
                    return
                log.warning("pod watch (%s) broke: %s", namespace or "*", e)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _follow(self, namespace: str | None, resource_version: str | None) -> str | None:
        """One watch request until the server ends it; returns where to resume."""
        response = self._open(namespace, resource_version)
        self._responses[namespace] = response
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    break
                if not line.strip():
                    continue
                event = orjson.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        return None  # too old: LIST again (which pokes every job)
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                key = job_of(event)
                if key is not None:
                    metrics.POD_EVENTS.inc()
                    if event.get("type") == "DELETED":
                        self.store.drop_pod(obj)
                    else:
                        self.store.put_pod(obj)
                    self.on_job(*key)
        finally:
            self._responses.pop(namespace, None)
            response.release_conn()
        return resource_version

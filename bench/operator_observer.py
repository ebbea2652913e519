"""What the operator benchmark sees: every pod and job of a namespace, through raw watches
that resume after a break (a loaded API server drops them)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.harness import log
from bench.operator_jobs import Flavor


def iter_watch(response: Any) -> Iterator[dict[str, Any]]:
    """Events of a raw watch response (urllib3, not preloaded), one JSON object a line."""
    buf = b""
    for chunk in response.stream(65536, decode_content=True):
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)


@dataclass
class PodRec:
    uid: str
    job: str
    seen: float
    running: float | None = None
    gone: bool = False
    phase: str = "Pending"


@dataclass
class Observer:
    """Every pod and job of one namespace, as a watch reports them (time first seen, Running)."""

    api: Any
    namespace: str
    flavor: Flavor
    pods: dict[str, PodRec] = field(default_factory=dict)
    jobs_running: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopped: bool = False

    def start(self) -> Observer:
        from kubernetes import client

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)

        def pods(rv: str | None) -> Any:
            return core.list_namespaced_pod(
                self.namespace, watch=True, timeout_seconds=3600, resource_version=rv,
                allow_watch_bookmarks=True, _preload_content=False,
            )  # fmt: skip

        def jobs(rv: str | None) -> Any:
            return custom.list_namespaced_custom_object(
                self.flavor.group, self.flavor.version, self.namespace, self.flavor.plural,
                watch=True, timeout_seconds=3600, resource_version=rv,
                allow_watch_bookmarks=True, _preload_content=False,
            )  # fmt: skip

        # The first responses are opened here, before any job exists: nothing can be missed.
        self._responses = [pods(None), jobs(None)]
        for i, (open_, on_event) in enumerate(((pods, self._pod), (jobs, self._job))):
            threading.Thread(target=self._follow, args=(i, open_, on_event), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopped = True
        for r in self._responses:
            with contextlib.suppress(Exception):
                # shutdown(), not close(): close() waits for the lock that the reading
                # thread holds while it blocks on an idle watch (it hung a 300-job run).
                r.shutdown()

    def _follow(
        self, i: int, open_: Callable[[str | None], Any], on_event: Callable[[dict[str, Any]], None]
    ) -> None:
        """Follow one watch; when the stream ends or breaks (a loaded API server drops
        watches), watch again from the last resourceVersion seen."""
        rv: str | None = None
        while not self.stopped:
            try:
                for ev in iter_watch(self._responses[i]):
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev.get("type") == "ERROR":
                        rv = None  # 410 Gone: start over from the current state
                        break
                    if ev.get("type") != "BOOKMARK":
                        on_event(ev)
            except Exception as e:  # report and watch again
                if not self.stopped:
                    log(f"{self.namespace}: watch broke ({type(e).__name__}: {e}); watching again")
            if self.stopped:
                return
            time.sleep(0.2)
            with contextlib.suppress(Exception):
                self._responses[i] = open_(rv)

    def _pod(self, ev: dict[str, Any]) -> None:
        now = time.monotonic()
        obj = ev.get("object") or {}
        meta = obj.get("metadata") or {}
        name, uid = meta.get("name"), meta.get("uid")
        job = (meta.get("labels") or {}).get(self.flavor.job_label)
        if not name or not job:
            return
        phase = (obj.get("status") or {}).get("phase") or "Pending"
        with self.lock:
            rec = self.pods.get(name)
            if rec is None or rec.uid != uid:
                rec = self.pods[name] = PodRec(uid, job, now)
            rec.phase = phase
            if ev.get("type") == "DELETED" or meta.get("deletionTimestamp"):
                rec.gone = True
            elif phase == "Running" and rec.running is None:
                rec.running = now

    def _job(self, ev: dict[str, Any]) -> None:
        obj = ev.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if name and ev.get("type") != "DELETED" and self.flavor.job_running(obj):
            with self.lock:
                self.jobs_running.setdefault(name, time.monotonic())

    # --- questions asked of what was seen ---
    def live_running(self, job: str, exclude: frozenset[str] = frozenset()) -> list[PodRec]:
        with self.lock:
            return [
                p
                for p in self.pods.values()
                if p.job == job and not p.gone and p.phase == "Running" and p.uid not in exclude
            ]

    def snapshot(self) -> list[PodRec]:
        with self.lock:
            return list(self.pods.values())

    def uid_of(self, pod: str) -> str:
        with self.lock:
            return self.pods[pod].uid

    def live_count(self) -> int:
        with self.lock:
            return sum(1 for p in self.pods.values() if not p.gone)

"""``torchjob dashboard``: a local, read-only web page of the TorchJobs and studies that the
user's kubeconfig can read (issue 41, item 4).

The server reads the API with the user's credentials and hands the page JSON only: no token
ever reaches the browser, and the page can change nothing (the server answers GET alone).
The page asks again every ``REFRESH_S``; each answer also feeds the server's memory of every
job's steps (``Samples``), from which steps/s and the timeline come. Pages: the jobs (phase,
world size, steps/s, goodput, age, last loss), one job (a timeline of world size and steps/s
with each loss and its cause marked, the generations, the conditions, the Events and the
last lines of rank 0's log), and the studies (trials, the objective by trial, the best).

The rate counts the training loop's own steps where its reports carry one (an integer
``step`` among the metrics, ``status.progress.metrics.step``), else the reports themselves
(``status.progress.step`` counts reports): a loop that reports once per checkpoint would
otherwise show reports per second labelled as steps. The page names the unit it shows.

Goodput on this page is the share of the last 10 minutes' samples in which the job trained
at its full size (Running, ``worldSize`` at the spec's, a step newer than the sample before):
what the server saw, not the operator's per-pod-paid series (``docs/operations.md``).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from datetime import datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from torchjob import contract
from torchjob.api.models import loop_step

REFRESH_S = 2.0
WINDOW_S = 600.0
"""The window of steps/s and goodput."""


def _age_s(stamp: str | None, now: float) -> float | None:
    if not stamp:
        return None
    try:
        return now - datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


STEPS = "steps"
REPORTS = "reports"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def progress_count(progress: Mapping[str, Any] | None) -> tuple[int | None, str]:
    """(the counter the rate is taken of, its unit) for one ``status.progress``: the loop's
    step (``metrics.step``, an integer) where the loop reports one, else the report count
    (``progress.step``)."""
    step = loop_step(progress)
    if step is not None:
        return step, STEPS
    return _int((progress or {}).get("step")), REPORTS


class Samples:
    """What the server saw of each job over time: (time, step, world size, desired, phase),
    the step in the unit of ``unit(key)`` (``progress_count``)."""

    def __init__(self, keep: int = 2000) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[tuple[str, str], deque[tuple[float, int | None, int, int, str]]] = {}
        self._unit: dict[tuple[str, str], str] = {}
        self.keep = keep

    def add(self, obj: Mapping[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        s = obj.get("status") or {}
        step, unit = progress_count(s.get("progress"))
        world = int(s.get("worldSize") or 0)
        per_pod = max(1, world // max(1, int(s.get("replicas") or 1)))
        desired = int((obj.get("spec") or {}).get("replicas") or 0) * per_pod
        sample = (now, step, world, desired, str(s.get("phase") or ""))
        with self._lock:
            if step is not None and self._unit.get(key, unit) != unit:
                # The loop's reports began (or stopped) carrying its step: the counts before
                # are of another unit, and a rate across them would mean nothing.
                self._by_job.pop(key, None)
            if step is not None:
                self._unit[key] = unit
            ring = self._by_job.setdefault(key, deque(maxlen=self.keep))
            if not ring or ring[-1][1:] != sample[1:] or now - ring[-1][0] >= REFRESH_S:
                ring.append(sample)

    def unit(self, key: tuple[str, str]) -> str:
        """What the job's samples count: ``STEPS`` (the loop's) or ``REPORTS``."""
        with self._lock:
            return self._unit.get(key, STEPS)

    def of(self, key: tuple[str, str]) -> list[tuple[float, int | None, int, int, str]]:
        with self._lock:
            return list(self._by_job.get(key, ()))

    def rates(self, key: tuple[str, str], now: float) -> tuple[float | None, float | None]:
        """(steps/s, or reports/s: ``unit``; goodput) over the window; None when too few
        samples."""
        recent = [x for x in self.of(key) if now - x[0] <= WINDOW_S]
        steps = [(t, st) for t, st, *_ in recent if st is not None]
        rate = None
        if len(steps) >= 2 and steps[-1][0] > steps[0][0]:
            rate = max(0.0, (steps[-1][1] - steps[0][1]) / (steps[-1][0] - steps[0][0]))
        if len(recent) < 2:
            return rate, None
        good = sum(
            1
            for a, b in itertools.pairwise(recent)
            if b[4] == "Running" and b[2] >= b[3] > 0 and (b[1] or 0) > (a[1] or 0)
        )
        return rate, good / (len(recent) - 1)


def last_loss(status: Mapping[str, Any]) -> dict[str, Any] | None:
    for r in reversed(status.get("history") or []):
        if r.get("cause") not in ("Start", None):
            return {
                "generation": r.get("generation"),
                "cause": r.get("cause"),
                "at": r.get("began"),
            }
    return None


def job_row(obj: Mapping[str, Any], samples: Samples, now: float) -> dict[str, Any]:
    """One row of the jobs page."""
    meta = obj.get("metadata") or {}
    s = obj.get("status") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    rate, goodput = samples.rates(key, now)
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "phase": s.get("phase") or "Pending",
        "worldSize": s.get("worldSize") or 0,
        "workers": s.get("workers") or "",
        "generation": s.get("currentGeneration") or 0,
        "stepsPerSecond": rate,
        "rateUnit": samples.unit(key),
        "goodput": goodput,
        "ageSeconds": _age_s(meta.get("creationTimestamp"), now),
        "lastLoss": last_loss(s),
        "restarts": s.get("restarts") or 0,
        "disruptions": s.get("disruptions") or 0,
    }


def job_detail(
    obj: Mapping[str, Any], events: list[Any], log_tail: list[str], samples: Samples, now: float
) -> dict[str, Any]:
    """The job page: its row, conditions, generations, Events, rank 0's log and timeline."""
    meta = obj.get("metadata") or {}
    s = obj.get("status") or {}
    key = (str(meta.get("namespace")), str(meta.get("name")))
    return {
        **job_row(obj, samples, now),
        "conditions": s.get("conditions") or [],
        "history": s.get("history") or [],
        "lastFailure": s.get("lastFailure"),
        "progress": s.get("progress") or {},
        "events": [
            {
                "type": e.type,
                "reason": e.reason,
                "message": e.message,
                "time": str(e.last_timestamp or e.event_time or ""),
            }
            for e in events[-30:]
        ],
        "log": log_tail,
        "timeline": [
            {"t": t, "step": st, "world": w, "phase": ph} for t, st, w, _, ph in samples.of(key)
        ],
        "now": now,
    }


def study_rows(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    s = obj.get("status") or {}
    spec = obj.get("spec") or {}
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "phase": s.get("phase") or "Pending",
        "metric": (spec.get("objective") or {}).get("metric"),
        "mode": (spec.get("objective") or {}).get("mode"),
        "progress": s.get("progress"),
        "best": s.get("bestTrial"),
        "trials": [
            {
                "number": t.get("number"),
                "name": t.get("name"),
                "state": t.get("state"),
                "value": t.get("value"),
                "params": t.get("params"),
            }
            for t in s.get("trials") or []
        ],
    }


class Source:
    """What the page shows, read through the user's kubeconfig (list, get: read only)."""

    def __init__(self, client: Any, all_namespaces: bool) -> None:
        self.client = client
        self.all_namespaces = all_namespaces
        self.samples = Samples()

    def _jobs(self) -> list[dict[str, Any]]:
        from torchjob.api.models import GROUP, PLURAL, VERSION

        custom = self.client.custom
        if self.all_namespaces:
            data = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        else:
            data = custom.list_namespaced_custom_object(
                GROUP, VERSION, self.client.namespace, PLURAL
            )
        return list(data.get("items") or [])

    def jobs(self) -> list[dict[str, Any]]:
        now = time.time()
        items = self._jobs()
        for obj in items:
            self.samples.add(obj, now)
        rows = [job_row(obj, self.samples, now) for obj in items]
        return sorted(rows, key=lambda r: (str(r["namespace"]), str(r["name"])))

    def job(self, namespace: str, name: str) -> dict[str, Any]:
        from torchjob.client.describe import job_events

        obj = self.client.get(name, namespace=namespace)
        now = time.time()
        self.samples.add(obj, now)
        return job_detail(
            obj,
            job_events(self.client, name, namespace),
            self._log_tail(namespace, obj),
            self.samples,
            now,
        )

    def _log_tail(self, namespace: str, obj: Mapping[str, Any], lines: int = 20) -> list[str]:
        """The last lines of the pod that runs rank 0 (the first member)."""
        s = obj.get("status") or {}
        members = s.get("members") or [0]
        pod = contract.worker_pod_name(
            str((obj.get("metadata") or {}).get("name")), int(members[0])
        )
        try:
            text = self.client.core.read_namespaced_pod_log(pod, namespace, tail_lines=lines)
        except Exception as e:  # no pod yet, a kwok pod without logs: say so on the page
            return [f"({pod}: no log: {getattr(e, 'reason', None) or type(e).__name__})"]
        return str(text).splitlines()[-lines:]

    def studies(self) -> list[dict[str, Any]]:
        from torchjob.api.models import GROUP, VERSION
        from torchjob.api.torchtune import PLURAL as TUNE_PLURAL

        custom = self.client.custom
        try:
            if self.all_namespaces:
                data = custom.list_cluster_custom_object(GROUP, VERSION, TUNE_PLURAL)
            else:
                data = custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.client.namespace, TUNE_PLURAL
                )
        except Exception:  # the TorchTune CRD is not installed: no studies
            return []
        return [study_rows(o) for o in data.get("items") or []]


def _handler(source: Source) -> type[BaseHTTPRequestHandler]:
    from torchjob.client.dashboard_page import PAGE

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: a request a second
            return

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            parts = [unquote(p) for p in path.strip("/").split("/") if p]
            try:
                if not parts:
                    return self._send(200, PAGE.encode(), "text/html; charset=utf-8")
                if parts == ["api", "jobs"]:
                    data: Any = source.jobs()
                elif len(parts) == 4 and parts[:2] == ["api", "job"]:
                    data = source.job(parts[2], parts[3])
                elif parts == ["api", "studies"]:
                    data = source.studies()
                else:
                    return self._send(404, b'{"error": "not found"}', "application/json")
            except Exception as e:
                body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
                return self._send(HTTPStatus.BAD_GATEWAY, body, "application/json")
            return self._send(200, json.dumps(data).encode(), "application/json")

    return Handler


def serve(client: Any, *, host: str, port: int, all_namespaces: bool) -> ThreadingHTTPServer:
    """A started dashboard server (``server.server_port`` is the port; ``shutdown()`` ends
    it)."""
    server = ThreadingHTTPServer((host, port), _handler(Source(client, all_namespaces)))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="torchjob-dashboard", daemon=True).start()
    return server


__all__ = ["REFRESH_S", "Samples", "Source", "job_detail", "job_row", "serve", "study_rows"]

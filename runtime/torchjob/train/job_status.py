"""Rank 0's training progress, written into its TorchJob's ``status.progress``.

In a TorchJob pod the operator gives the workers a per-job ServiceAccount whose
Role allows exactly one thing: get and patch the status of *this* TorchJob
(``resourceNames: [<job>]``). The agent of pod 0 uses it, through the API
server, so ``kubectl get tj -o wide`` shows the epoch and ``kubectl describe``
the latest metrics and checkpoint, with no extra service to run.

Writes happen on a background thread, at most once every ``min_interval_s``
(the last report is always flushed), so a fast training loop never waits on the
API server. A failed write is tried again (a newer report replaces it) and logged;
it never interrupts training. Only the
standard library is used: the training image needs no Kubernetes client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torchjob.api.models import GROUP, PLURAL, VERSION, Progress
from torchjob.contract import SERVICEACCOUNT_DIR, PodEnv
from torchjob.launch.protocol import RestoredFromMemory, RestoredFromMirror

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.5
"""The wait before a failed write is tried again; it doubles up to the reporter's interval."""
WARN_EVERY = 20
"""After the first, one failure in this many is logged (an API server down for minutes)."""
GONE_CODES = frozenset({401, 403, 404})
"""Answers to a status write that no retry changes: this pod's token no longer
authenticates (its ServiceAccount was deleted with the TorchJob), its Role is gone, or the
TorchJob is. Seen on a job's deletion: rank 0's last report retried for its whole grace
period, and the pod was SIGKILLed 30 s after its training stopped."""

DEFAULT_SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def progress_body(
    metrics: Mapping[str, Any],
    *,
    reports: int,
    checkpoint: str | None,
    generation: int | None = None,
) -> dict[str, Any]:
    """The ``status.progress`` object for one report (JSON scalars only); ``generation``: the
    membership generation that committed ``checkpoint``."""
    scalars = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, str | int | float | bool) and not k.startswith("_")
    }
    epoch = metrics.get("epoch")
    return Progress(
        step=reports,
        metrics=scalars,
        update_time=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        epoch=epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None,
        last_checkpoint=checkpoint or None,
        checkpoint_generation=generation if checkpoint else None,
    ).to_wire()


def now_ms() -> str:
    """Now, RFC 3339 with milliseconds (recoveries take seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class GenerationFacts:
    """What rank 0 tells the operator of its generation in every progress report: the
    generation, where its state came from, the step it resumed after and when its first step
    completed (``status.history`` is completed from them). The first report of a generation
    is sent at once, past the reporter's pause, so the recovery is timed to the step."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.facts: dict[str, Any] | None = None

    def add(
        self,
        body: dict[str, Any],
        *,
        reports: int,
        restored: RestoredFromMemory | RestoredFromMirror | None,
    ) -> tuple[dict[str, Any], bool]:
        """``body`` with the generation's facts, and whether it is the generation's first."""
        first = self.facts is None
        if self.facts is None:
            if restored is not None:
                source = "mirror" if isinstance(restored, RestoredFromMirror) else "memory"
            else:
                source = "storage" if reports > 1 else "start"
            self.facts = {
                "generation": self.generation,
                "restoredFrom": source,
                "restoredStep": max(0, reports - 1),
                "firstStepTime": now_ms(),
            }
        return {**body, **self.facts}, first


def newer_checkpoint(a: str, b: str) -> bool:
    """Whether checkpoint path ``a`` is later than ``b`` (``checkpoint_<index>``, zero-padded,
    in one run directory); a path of another directory counts as newer."""
    head_a, _, tail_a = a.rstrip("/").rpartition("/")
    head_b, _, tail_b = b.rstrip("/").rpartition("/")
    return head_a != head_b or tail_a > tail_b


class JobEndpoint:
    """This pod's TorchJob ``/status``, reached with the pod's ServiceAccount token."""

    def __init__(self, *, api_url: str, serviceaccount_dir: Path, namespace: str, name: str):
        self.collection_url = f"{api_url}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
        self.name = name
        self.url = f"{self.collection_url}/{name}/status"
        self.sa_dir = serviceaccount_dir
        ca = serviceaccount_dir / "ca.crt"
        self._ssl = ssl.create_default_context(cafile=str(ca)) if ca.exists() else None

    @classmethod
    def from_env(cls, pod: PodEnv, environ: Mapping[str, str] | None = None) -> JobEndpoint | None:
        """The endpoint when the pod has API credentials (in-cluster), else None."""
        env = os.environ if environ is None else environ
        sa_dir = Path(env.get(SERVICEACCOUNT_DIR) or DEFAULT_SERVICEACCOUNT_DIR)
        host = env.get("KUBERNETES_SERVICE_HOST")
        if not host or not (sa_dir / "token").exists():
            return None
        port = env.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        return cls(
            api_url=f"https://{host}:{port}",
            serviceaccount_dir=sa_dir,
            namespace=pod.namespace,
            name=pod.job_name,
        )

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request (a body is a JSON merge patch); raises OSError /
        urllib.error.URLError on failure."""
        # A GET with resourceVersion=0 is served from the API server's watch cache, not by a
        # quorum read of etcd (the fallback poll of an agent whose Role cannot watch).
        url = f"{self.url}?resourceVersion=0" if method == "GET" else self.url
        return self._send(method, url, body, "application/merge-patch+json")

    def apply(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
        """A server-side apply of the status (``body``: apiVersion, kind, metadata.name and
        the fields ``field_manager`` owns). The API server merges it with every other
        manager's fields by the schema, so two writers of one list map both keep their
        entries; it is the ``patch`` verb, which the worker's Role grants."""
        query = urllib.parse.urlencode({"fieldManager": field_manager, "force": "true"})
        return self._send("PATCH", f"{self.url}?{query}", body, "application/apply-patch+yaml")

    def _send(
        self, method: str, url: str, body: dict[str, Any] | None, content_type: str
    ) -> dict[str, Any]:
        token = (self.sa_dir / "token").read_text().strip()  # re-read: projected tokens rotate
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()  # JSON is YAML: an apply body too
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        with self.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read() or b"{}")
        return result

    def watch(self, resource_version: str | None, *, timeout_s: int) -> Any:
        """Open a watch of this one TorchJob (``fieldSelector=metadata.name``); the response
        yields one JSON event a line until the server ends it after ``timeout_s``. Without a
        ``resource_version`` the first event is the object as it is now (ADDED)."""
        query = {
            "fieldSelector": f"metadata.name={self.name}",
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        if resource_version:
            query["resourceVersion"] = resource_version
        token = (self.sa_dir / "token").read_text().strip()
        request = urllib.request.Request(
            f"{self.collection_url}?{urllib.parse.urlencode(query)}",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        # A silent connection is noticed a little after the server would have ended it.
        return self.urlopen(request, timeout=timeout_s + 30)

    def urlopen(self, request: urllib.request.Request, timeout: float) -> Any:
        """Every request of the agent goes through here (one place to count or trace them)."""
        return urllib.request.urlopen(request, timeout=timeout, context=self._ssl)


class JobStatusReporter:
    def __init__(self, endpoint: JobEndpoint, *, min_interval_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self.url = endpoint.url
        self.min_interval_s = min_interval_s
        self._latest: dict[str, Any] | None = None
        self._checkpoint: str | None = None
        self._checkpoint_time: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._closed = threading.Event()
        self._urgent = False
        self._deadline = float("inf")
        self.sent = 0
        self.failures = 0
        self.gone: int | None = None
        """The HTTP code (:data:`GONE_CODES`) that ended the reports, once one came."""
        self._thread = threading.Thread(target=self._run, name="torchjob-status", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(
        cls, pod: PodEnv, environ: Mapping[str, str] | None = None
    ) -> JobStatusReporter | None:
        """A reporter when the pod has API credentials (in-cluster), else None."""
        endpoint = JobEndpoint.from_env(pod, environ)
        return cls(endpoint) if endpoint is not None else None

    def report(self, progress: dict[str, Any], *, urgent: bool = False) -> None:
        """Queue ``progress`` (the newest replaces one not yet sent); ``urgent``: send it
        without waiting out the pause between writes. The last checkpoint is
        carried into every later body: a report's own body may not name it (its background
        commit lands after, or before, the report's event), and a body without it must not
        replace one with it before it is sent (a study's best trial points at it)."""
        with self._lock:
            said = progress.get("lastCheckpoint")
            if said and (self._checkpoint is None or newer_checkpoint(said, self._checkpoint)):
                self._checkpoint = said
                self._checkpoint_time = now_ms()
            if self._checkpoint is not None:
                progress = {
                    **progress,
                    "lastCheckpoint": self._checkpoint,
                    "lastCheckpointTime": self._checkpoint_time,
                }
            self._latest = progress
            self._urgent = self._urgent or urgent
        self._wake.set()

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush the last report and stop. It carries the run's last checkpoint, which a
        study's best trial points at: the pod waits up to ``timeout_s`` for a slow API server
        (5 s lost it under CI load), retrying a failed write until then."""
        self._deadline = time.monotonic() + timeout_s
        self._closing = True
        self._closed.set()  # a pause between reports ends now: the last one goes at once
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        # Never sent: the first write goes at once. (0.0 was "sent at boot": on a machine up
        # for less than min_interval_s, time.monotonic()'s uptime, the first report waited.)
        last_sent = -math.inf
        retry = RETRY_FIRST_S
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                urgent, self._urgent = self._urgent, False
            if not self._closing and not urgent:
                pause = self.min_interval_s - (time.monotonic() - last_sent)
                if pause > 0:
                    self._closed.wait(pause)
            with self._lock:
                body, self._latest = self._latest, None
            if body is not None:
                if self._send(body):
                    last_sent, retry = time.monotonic(), RETRY_FIRST_S
                elif self.gone is not None:
                    return  # nothing will land: close() does not wait out its deadline
                else:
                    self._again(body)
                    if not self._closing:
                        # The API server is busy or restarting: the body waits its turn again
                        # (a newer report replaces it), never dropped.
                        self._closed.wait(retry)
                        retry = min(retry * 2, max(self.min_interval_s, RETRY_FIRST_S))
                    elif time.monotonic() < self._deadline:
                        time.sleep(RETRY_FIRST_S)  # close() waits: keep trying until it stops
                        continue
            if self._closing and (self._latest is None or time.monotonic() >= self._deadline):
                return

    def _again(self, body: dict[str, Any]) -> None:
        """``body`` failed to land: queue it again unless a newer report came meanwhile."""
        with self._lock:
            if self._latest is None:
                self._latest = body
        self._wake.set()

    def _send(self, progress: dict[str, Any]) -> bool:
        """One write; False when it failed (logged: the first failure, then one every
        :data:`WARN_EVERY` failures, each with the API server's answer). An answer that no
        retry changes (:data:`GONE_CODES`: the TorchJob deleted, and with it this pod's
        ServiceAccount and Role) ends the reports: ``gone`` is set, said once."""
        try:
            self.endpoint.call("PATCH", {"status": {"progress": progress}})
        except urllib.error.HTTPError as exc:
            if exc.code not in GONE_CODES:
                return self._failed(exc)
            self.gone = exc.code
            log.warning(
                "torchjob: %s answered HTTP %d: the TorchJob or this pod's credentials are gone "
                "(the job was deleted), or its Role does not allow the write; progress "
                "reports stop",
                self.url, exc.code,
            )  # fmt: skip
            return False
        except Exception as exc:  # the writer thread must outlive any failure
            return self._failed(exc)
        self.sent += 1
        return True

    def _failed(self, exc: Exception) -> bool:
        """A write that failed and may land later: counted, logged now and then."""
        self.failures += 1
        if self.failures == 1 or self.failures % WARN_EVERY == 0:
            detail = ""
            if isinstance(exc, urllib.error.HTTPError):
                with contextlib.suppress(Exception):
                    detail = exc.read().decode(errors="replace")[:300]
            log.warning(
                "torchjob: cannot report progress to %s (failure %d, retried): %s: %s %s",
                self.url, self.failures, type(exc).__name__, exc, detail,
            )  # fmt: skip
        return False

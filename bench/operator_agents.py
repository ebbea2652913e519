"""torchjob's in-pod agents, run here for every pod of one job: their idle API requests."""

from __future__ import annotations

import shutil
import tempfile
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.operator_jobs import PODS_PER_JOB


class Agents:
    """torchjob's in-pod runtime following its job (``MembershipWatch``), one per pod of one
    job, with that job's ServiceAccount token: what a KeepSurvivors job's agents do all day."""

    def __init__(self, api: Any, core: Any, ns: str, job: str) -> None:
        self.api, self.core, self.ns, self.job = api, core, ns, job
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._restore: Callable[[], None] = lambda: None

    def sent(self) -> int:
        with self._lock:
            return self._count

    def start(self) -> None:
        from torchjob import contract
        from torchjob.train.job_status import JobEndpoint
        from torchjob.train.recovery.membership import MembershipWatch

        cfg = self.api.configuration
        sa_dir = Path(tempfile.mkdtemp(prefix="bench-agent-"))
        token = kubectl_token(self.api, self.ns, contract.worker_service_account(self.job))
        (sa_dir / "token").write_text(token)
        if cfg.ssl_ca_cert:
            shutil.copy(cfg.ssl_ca_cert, sa_dir / "ca.crt")
        # Count every request the agents send (any version of the runtime: they all go
        # through urllib.request.urlopen; this process's own client uses urllib3).
        counter, real_urlopen = self, urllib.request.urlopen

        def counting_urlopen(*a: Any, **kw: Any) -> Any:
            counter._add()
            return real_urlopen(*a, **kw)

        self._restore = lambda: setattr(urllib.request, "urlopen", real_urlopen)
        urllib.request.urlopen = counting_urlopen

        def agent() -> None:
            endpoint = JobEndpoint(
                api_url=cfg.host, serviceaccount_dir=sa_dir, namespace=self.ns, name=self.job
            )
            watch = MembershipWatch(endpoint)
            generation = (watch.read() or _NoMembership()).generation
            while not self._stop.wait(0.2):  # the training loop's on_tick
                watch.changed(generation)
            close = getattr(watch, "close", None)
            if close is not None:
                close()

        for _ in range(PODS_PER_JOB):
            t = threading.Thread(target=agent, daemon=True)
            t.start()
            self._threads.append(t)

    def _add(self) -> None:
        with self._lock:
            self._count += 1

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._restore()


@dataclass
class _NoMembership:
    generation: int = 0


def kubectl_token(api: Any, ns: str, account: str) -> str:
    from kubernetes import client

    req = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    resp = client.CoreV1Api(api).create_namespaced_service_account_token(account, ns, req)
    return str(resp.status.token)

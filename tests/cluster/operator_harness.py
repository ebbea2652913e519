"""The operator under test, run as a real process against the local control plane.

``OperatorProcess`` starts ``python -m torchjob_operator`` with the cluster's
kubeconfig and waits on its liveness endpoint, so tests can also SIGKILL it
mid-reconcile and start a new one. ``Jobs`` drives TorchJobs the way a user
does (kubectl apply / scale / patch) and waits on their status, failing with
the job's status, its Events and its pods' state when time runs out.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests import kube as k

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "torchjob.io_torchjobs.yaml"
TUNE_CRD_FILE = REPO / "crds" / "torchjob.io_torchtunes.yaml"
RUNTIME_CRD_FILES = (
    REPO / "crds" / "torchjob.io_torchruntimes.yaml",
    REPO / "crds" / "torchjob.io_clustertorchruntimes.yaml",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(AssertionError):
    """A process exited because a port ``free_port`` had found free was taken before it
    bound it (another process of the CI's side-by-side sessions got it first)."""


def exited(what: str, returncode: int | None, logs: str) -> AssertionError:
    """The error for a process that exited while it started: :class:`PortTaken` when its log
    says a port was in use (Python: "[Errno 98] Address already in use"; Go and aiohttp:
    "bind: address already in use"), else an AssertionError with its log."""
    if "address already in use" in logs.lower():
        return PortTaken(logs)
    return AssertionError(f"{what} exited with {returncode}:\n{logs}")


def start_on_free_ports(
    start: Callable[[], None], new_ports: Callable[[], None] = lambda: None, tries: int = 3
) -> None:
    """``start()``, and again after ``new_ports()`` while it raises :class:`PortTaken`, up to
    ``tries`` times: the one answer to a port ``free_port`` found free and another process
    took before ours bound it (CI 2026-11-29 the operator, 2026-12-06 Kueue)."""
    for attempt in range(tries):
        try:
            return start()
        except PortTaken:
            if attempt == tries - 1:
                raise
            new_ports()


class OperatorProcess:
    def __init__(
        self, cluster: k.Cluster, log_dir: Path, *, args: tuple[str, ...] = (), tag: str = ""
    ) -> None:
        self.cluster = cluster
        self.log_dir = log_dir
        self.args = args
        """Extra command-line arguments (e.g. --leader-elect)."""
        self.tag = tag
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.metrics_port = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator{self.tag}-{self.starts}.log"

    def start(self, *, wait: bool = True) -> None:
        """Start a new operator process; with ``wait``, return once its liveness endpoint
        answers. Without, return at once (a chaos test may kill it before it is up). A port
        that ``free_port`` found free can be taken by another process before the operator
        binds it (CI, 2026-11-29: "address already in use"): then it starts again on new
        ports, up to 3 times (``_start`` chooses them)."""
        start_on_free_ports(lambda: self._start(wait=wait))

    def _start(self, *, wait: bool) -> None:
        self.starts += 1
        port = free_port()
        self.metrics_port = free_port()
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchjob_operator",
                "--kubeconfig",
                str(self.cluster.kubeconfig),
                "--resync-period",
                "10",
                "--job-sweep",
                "30",
                "--liveness",
                f"http://127.0.0.1:{port}/healthz",
                "--metrics-port",
                str(self.metrics_port),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
            cwd=REPO,
        )
        if not wait:
            return

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise exited("operator", self.proc.returncode, self.logs())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        try:
            k.wait_for(
                healthy, 120, lambda: f"operator liveness endpoint\n{self.logs()}", interval=0.2
            )
        except BaseException:
            self.kill()  # never leave an operator running that no fixture will stop
            raise

    def scrape(self) -> str:
        """The operator's whole /metrics page."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    def metric(self, name: str) -> float:
        """One sample of the operator's Prometheus /metrics: ``name`` with its labels as
        exposed, e.g. ``torchjob_cache_objects{kind="pods"}``."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f"{name} "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} not in {url}")

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as when a node dies under the operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self, tail: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no operator log)"
        return "\n".join(lines[-tail:])


def worker_template(**spec_extra: Any) -> dict[str, Any]:
    """A pod template for kwok nodes: grace 0 so deletions are immediate."""
    return {
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
            **spec_extra,
        }
    }


def torchjob(name: str, *, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "replicas": replicas,
        "failurePolicy": {"maxRestarts": 3, "backoff": {"initialSeconds": 1, "maxSeconds": 2}},
        "template": worker_template(),
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TorchJob",
        "metadata": {"name": name},
        "spec": body,
    }


def shrinking_pair(name: str, **spec: Any) -> dict[str, Any]:
    """Two gloo ``KeepSurvivors`` pods that go on as one after a loss (elastic 1..2,
    ``shrinkOnDisruption``) and may not restart; ``spec`` adds to or overrides that."""
    base: dict[str, Any] = {
        "backend": "gloo",
        "membershipPolicy": "KeepSurvivors",
        "elastic": {"minReplicas": 1, "maxReplicas": 2, "shrinkOnDisruption": True},
        "failurePolicy": {"maxRestarts": 0},
    }
    return torchjob(name, replicas=2, **{**base, **spec})


class Jobs:
    """TorchJobs in one namespace, driven through kubectl and read through the API."""

    def __init__(
        self, cluster: k.Cluster, api: Any, namespace: str, operator: OperatorProcess
    ) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.operator = operator

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl("-n", self.ns, *args, input=input, check=check, timeout=timeout)

    def apply(self, manifest: dict[str, Any]) -> None:
        # A hang guard, not a measure: an apply took over 60 s on a machine at load 23
        # (kubectl's discovery and the admission of a large pod template). It is idempotent.
        # JSON, not YAML: PyYAML (YAML 1.1) writes a random tag such as 6576e281 unquoted, and
        # kubectl's YAML reads it as a float ("expected string, got ... 6.576e+285": CI,
        # 2026-12-01, test_elastic_job_shrinks_to_capacity_and_grows_back's uuid tag).
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(manifest), timeout=180.0)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)  # type: ignore[no-any-return]
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def status(self, name: str) -> dict[str, Any]:
        return (self.get(name) or {}).get("status") or {}

    def pods(self, name: str) -> list[Any]:
        return sorted(
            self.core.list_namespaced_pod(
                self.ns, label_selector=f"{contract.LABEL_JOB_NAME}={name}"
            ).items,
            key=lambda p: p.metadata.name,
        )

    def events(self, name: str) -> list[Any]:
        evs = self.core.list_namespaced_event(
            self.ns, field_selector=f"involvedObject.name={name}"
        ).items
        return sorted(evs, key=lambda e: e.metadata.creation_timestamp)

    def event_reasons(self, name: str) -> list[str]:
        return [e.reason for e in self.events(name)]

    def wait_events(self, name: str, *reasons: str, timeout: float = 30) -> list[Any]:
        """The job's Events once every reason in ``reasons`` is among them.

        The operator posts Events after the status patch that a test usually waits on, so an
        Event is asserted by waiting for it, not by reading once.
        """

        def probe() -> list[Any] | None:
            evs = self.events(name)
            return evs if set(reasons) <= {e.reason for e in evs} else None

        return k.wait_for(  # type: ignore[no-any-return]
            probe,
            timeout,
            lambda: f"Events {sorted(reasons)} for {name}\n{self.describe(name)}",
            interval=0.2,
        )

    def describe(self, name: str) -> str:
        job = self.get(name)
        lines = [
            f"TorchJob {self.ns}/{name} status:",
            json.dumps((job or {}).get("status"), indent=1),
        ]
        lines.append(
            "events: " + "; ".join(f"{e.type}/{e.reason}: {e.message}" for e in self.events(name))
        )
        lines.append(k.describe_namespace(self.core, self.ns))
        lines.append("operator log (tail):\n" + self.operator.logs(40))
        return "\n".join(lines)

    def wait(
        self, name: str, check: Callable[[dict[str, Any]], Any], what: str, timeout: float = 60
    ) -> Any:
        def probe() -> Any:
            return check(self.status(name))

        return k.wait_for(probe, timeout, lambda: f"{what}\n{self.describe(name)}", interval=0.2)

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
        return self.wait(  # type: ignore[no-any-return]
            name,
            lambda s: s if s.get("phase") == phase else None,
            f"TorchJob {name} phase {phase}",
            timeout,
        )

    def running_pods(self, name: str, count: int, generation: int) -> list[Any] | None:
        """The job's pods once exactly ``count`` are there (not being deleted), all of
        ``generation`` and Running; else None."""
        pods = [p for p in self.pods(name) if p.metadata.deletion_timestamp is None]
        gens = {p.metadata.labels.get(contract.LABEL_GENERATION) for p in pods}
        ok = (
            len(pods) == count
            and gens == {str(generation)}
            and all(p.status.phase == "Running" for p in pods)
        )
        return pods if ok else None

    def wait_running_pods(
        self, name: str, count: int, generation: int, timeout: float = 60
    ) -> list[Any]:
        return k.wait_for(  # type: ignore[no-any-return]
            lambda: self.running_pods(name, count, generation),
            timeout,
            lambda: f"{count} Running pods of generation {generation}\n{self.describe(name)}",
            interval=0.2,
        )

    def wait_current_pods(
        self, name: str, count: int, *, since: int, timeout: float = 60
    ) -> tuple[dict[str, Any], list[Any]]:
        """(status, pods) once the job's current generation (``status.currentGeneration``, at
        least ``since``) has ``count`` Running pods and nothing else: for a test whose job may
        rightly begin another generation before it runs (test_node_lost_is_a_disruption)."""

        def probe() -> tuple[dict[str, Any], list[Any]] | None:
            status = self.status(name)
            generation = status.get("currentGeneration")
            if not isinstance(generation, int) or generation < since:
                return None
            pods = self.running_pods(name, count, generation)
            return (status, pods) if pods else None

        return k.wait_for(  # type: ignore[no-any-return]
            probe,
            timeout,
            lambda: (
                f"{count} Running pods of the current generation (at least {since})\n"
                f"{self.describe(name)}"
            ),
            interval=0.2,
        )

    def exit_pod(
        self, pod: str, code: int, *, after: str | None = None, message: str | None = None
    ) -> None:
        k.make_pod_exit(self.core, self.ns, pod, code, after=after, message=message)

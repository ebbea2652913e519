"""Chaos: the operator SIGKILLed over and over while workers fail and get evicted.

The operator records every decision (new generation, counters, ``lastFailure``,
backoff) in the status before it deletes a pod of an older generation, so a
crash at any point replays the same decision. This test kills it at random
moments and, through a watch, right after it sees a status change land (when
the deletes or creates of that decision are in flight or not sent yet), with
failures and evictions injected while it is down. However the kills fall, the
counters must be exact and every job must end with exactly one generation of
pods.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.cluster

N_JOBS = 8
REPLICAS = 3
FAILED_INDEX = 1
EVICTED_INDEX = 2


def _names() -> list[str]:
    return [f"chaos-{i}" for i in range(N_JOBS)]


def _fails(name: str) -> bool:
    """Even jobs get a worker failure (exit 1), odd ones an eviction."""
    return int(name.rsplit("-", 1)[1]) % 2 == 0


def _decision(status: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(
        status.get(k)
        for k in ("currentGeneration", "createdGeneration", "restarts", "disruptions", "phase")
    )


def _generation(pod: Any) -> int:
    return int(pod.metadata.labels.get(contract.LABEL_GENERATION, "-1"))


class Killer:
    """Watches the namespace's TorchJobs and SIGKILLs the operator as soon as one of them
    shows a status it did not show before: the operator has just written a decision and is
    (or is about to be) carrying it out."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.baseline = {n: _decision(jobs.status(n)) for n in _names()}
        self.changed: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.jobs.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.jobs.ns,
                    PLURAL,
                    timeout_seconds=5,
                ):
                    obj = ev["object"]
                    name = obj["metadata"]["name"]
                    if _decision(obj.get("status") or {}) != self.baseline.get(name):
                        self.jobs.operator.kill()
                        self.changed = name
                        return
                    if self._stop.is_set():
                        return
            finally:
                w.stop()

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def wait(self, timeout: float) -> str | None:
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(10)
        return self.changed

    def __exit__(self, *_: Any) -> None:
        self._stop.set()


def _caught_mid_decision(jobs: Jobs, name: str) -> bool:
    """Whether the kill landed between the status patch and the deletes: the status names a
    newer generation while pods of an older one are still not being deleted."""
    gen = int(jobs.status(name).get("currentGeneration") or 0)
    return any(
        _generation(p) < gen and p.metadata.deletion_timestamp is None for p in jobs.pods(name)
    )


def _evict(jobs: Jobs, pod: str) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=jobs.ns))
    jobs.core.create_namespaced_pod_eviction(pod, jobs.ns, body)


def test_operator_killed_at_random_points_keeps_exact_counters(jobs: Jobs) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    started = time.monotonic()
    op = jobs.operator
    names = _names()
    kills = caught = 0

    # 1. Create the jobs while the operator is killed at random moments of its start-up and
    #    of the pod creations (the adopt path: pods created, status not yet written).
    op.kill()
    op.start(wait=False)
    manifests = [
        torchjob(
            n,
            replicas=REPLICAS,
            failurePolicy={"maxRestarts": 3, "backoff": {"initialSeconds": 1, "maxSeconds": 1}},
        )
        for n in names
    ]
    jobs.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(manifests))
    for _ in range(3):
        time.sleep(rng.uniform(0.5, 3.0))  # chaos timing, not a wait for a condition
        op.kill()
        kills += 1
        op.start(wait=False)
    op.kill()
    op.start()
    for n in names:
        jobs.wait_running_pods(n, REPLICAS, generation=0, timeout=90)
    for n in names:
        assert _decision(jobs.wait_phase(n, "Running"))[:4] == (0, 0, 0, 0), n

    # 2. With the operator down: worker 1 of the even jobs exits 1, worker 2 of the odd ones
    #    is evicted through the Eviction API.
    op.kill()
    for n in names:
        if _fails(n):
            jobs.exit_pod(f"{n}-worker-{FAILED_INDEX}", 1)
        else:
            _evict(jobs, f"{n}-worker-{EVICTED_INDEX}")

    def injected() -> bool:
        for n in names:
            pods = {p.metadata.name: p for p in jobs.pods(n)}
            if _fails(n):
                if pods[f"{n}-worker-{FAILED_INDEX}"].status.phase != "Failed":
                    return False
            elif f"{n}-worker-{EVICTED_INDEX}" in pods:
                return False
        return True

    k.wait_for(injected, 30, "failures and evictions to take effect", interval=0.2)

    # 3. Start the operator and kill it the moment a status changes, several times over,
    #    then at random moments.
    for _ in range(6):
        with Killer(jobs) as killer:
            op.start(wait=False)
            changed = killer.wait(15)
        op.kill()
        kills += 1
        if changed is None:
            break  # nothing left to decide
        if changed is not None and _caught_mid_decision(jobs, changed):
            caught += 1
    for _ in range(2):
        op.start(wait=False)
        time.sleep(rng.uniform(0.5, 3.0))  # chaos timing
        op.kill()
        kills += 1

    # 4. The operator for good: every job back to Running in generation 1, counters exact.
    op.start()
    for n in names:
        jobs.wait_running_pods(n, REPLICAS, generation=1, timeout=90)
    for n in names:
        status = jobs.wait(
            n,
            lambda s: (
                s if s.get("phase") == "Running" and s.get("createdGeneration") == 1 else None
            ),
            f"{n} Running in generation 1",
        )
        got = (status["currentGeneration"], status["restarts"], status["disruptions"])
        if _fails(n):
            assert got == (1, 1, 0), f"{n}: a failure is one restart (seed {seed})\n{status}"
            assert status["lastFailure"]["pod"] == f"{n}-worker-{FAILED_INDEX}"
            assert status["lastFailure"]["exitCode"] == 1
        else:
            assert got == (1, 0, 1), f"{n}: an eviction is one disruption (seed {seed})\n{status}"
            assert status.get("lastFailure") is None

    # No orphans: every pod in the namespace is a worker of a job's current generation.
    pods = jobs.core.list_namespaced_pod(jobs.ns).items
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    assert len(live) == N_JOBS * REPLICAS, [p.metadata.name for p in live]
    for p in live:
        labels = p.metadata.labels or {}
        assert labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER, p.metadata.name
        job = labels[contract.LABEL_JOB_NAME]
        assert _generation(p) == jobs.status(job)["currentGeneration"] == 1, p.metadata.name
    names_seen = [p.metadata.name for p in live]
    assert len(set(names_seen)) == len(names_seen)
    print(
        f"chaos: {N_JOBS} jobs x {REPLICAS} pods, {kills} SIGKILLs "
        f"({caught} between a status patch and its deletes), seed {seed}, "
        f"{time.monotonic() - started:.0f}s"
    )

"""The operator's read cache: its TorchJobs and their pods as its watches last saw them.

Every reconcile used to GET its job and LIST its pods from the API server; in a burst that
was a fifth of the operator's CPU (bench/README.md has the profile), and an idle job cost
two requests per resync. Like client-go's informers, ``Store`` keeps the latest object each
watch delivered (kopf's TorchJob watch, ``podwatch``'s label-selected pod watch) and a
reconcile reads memory instead.

A cache lags the API server, and a reconcile that read it right after the previous one wrote
would plan again on what was already done (create pods twice, count one failure twice). So,
as the ReplicaSet controller does, every write records an *expectation* of what the watch
shows once it has caught up: the pod exists, the pod is gone or terminating, the pod carries
the new label, the job's status holds what was patched. A job is not planned from the cache
while an expectation is unmet; the watch event that meets it pokes the job again. If the
watch has not caught up after ``deadline_s`` (a broken watch, an overloaded API server), the
expectations are dropped and that job's next reconcile reads the API server (``CachedKube``),
so the cache can delay a decision but never make a wrong one. Expectations are predicates on
what the cache holds, never resourceVersion comparisons: resourceVersions are opaque.

Pods are stored trimmed to what the planner reads (client-go's ``TransformFunc``): no
``managedFields``, no containers, only the conditions and container states the planner
judges, kept as compact JSON bytes, so 8000 pods take about 4 MiB.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import orjson

from torchjob_operator.common.nodes import AVOIDED_NODES
from torchjob_operator.engine import metrics
from torchjob_operator.engine.objects import (
    JobKey,
    Pod,
    job_key_of_pod,
    merge_applied,
    trim_job,
    trim_pod,
)

log = logging.getLogger("torchjob_operator")

ALL_NAMESPACES = ""
"""The scope of a cluster-wide pod watch."""

TOMBSTONE_S = 60.0
"""How long a deleted TorchJob is known to be gone: the garbage collector deletes its pods
after it, and each of their events pokes the job once more; the cache answers "gone" for
them instead of a GET per poke."""


@dataclass(frozen=True)
class PodExpectation:
    """What the pod watch shows of pod ``name`` once it has seen one of our writes."""

    name: str
    kind: Literal["created", "deleted", "labelled"]
    labels: Mapping[str, str] = field(default_factory=dict)
    """"labelled": the labels the pod must show; "created": the labels that tell the created
    pod from an earlier one of the same name (its generation), which may still be cached."""

    def met(self, pod: Mapping[str, Any] | None) -> bool:
        if self.kind == "created":
            # The pod of the last generation keeps its name: until the watch brings the
            # DELETED of that one and the ADDED of ours, the cache may hold the old pod, and
            # a plan from it would delete our new pod by name.
            if pod is None:
                return False
            have = (pod.get("metadata") or {}).get("labels") or {}
            return all(have.get(k) == v for k, v in self.labels.items())
        if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
            return True  # gone (or going): nothing more to see of it
        if self.kind == "deleted":
            return False
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.labels.items())


@dataclass
class _Pending:
    since: float
    pods: list[PodExpectation] = field(default_factory=list)
    status: list[Mapping[str, Any]] = field(default_factory=list)

    def said(self) -> str:
        """What was not seen, in a line: ``pod w-1 deleted, status (phase, history)``."""
        seen = [f"pod {e.name} {e.kind}" for e in self.pods[:5]]
        if len(self.pods) > 5:
            seen.append(f"{len(self.pods) - 5} more pods")
        fields = sorted({k for patch in self.status for k in patch})
        if fields:
            seen.append(f"status ({', '.join(fields)})")
        return ", ".join(seen) or "nothing"


_NODE_NAME = re.compile(rb'"nodeName":"([^"]*)"')
"""A compact pod's ``spec.nodeName`` (node names are DNS names: no quote, no escape)."""
_AVOIDED = re.compile(rb'"' + re.escape(AVOIDED_NODES.encode()) + rb'":"([^"]*)"')
"""... and the nodes it was kept off (``common.nodes.AVOIDED_NODES``, comma-separated)."""


def _compact(pod: Pod) -> bytes:
    # A copy of exactly its length: orjson's own result keeps its 4 KiB output buffer.
    return bytes(memoryview(orjson.dumps(pod)))


def _decoded(blob: bytes | None) -> Pod | None:
    return None if blob is None else cast(Pod, orjson.loads(blob))


def _on(blob: bytes, nodes: set[bytes]) -> bool:
    """A cached pod's JSON names one of ``nodes``: bound there, or kept off it."""
    m = _NODE_NAME.search(blob)
    if m is not None and m.group(1) in nodes:
        return True
    kept_off = _AVOIDED.search(blob)
    return kept_off is not None and not nodes.isdisjoint(kept_off.group(1).split(b","))


class Store:
    """TorchJobs and their pods as the watches delivered them, and what our writes expect.

    Thread-safe: the watch threads write, the reconcile threads read. Objects are replaced,
    never changed in place, so a reader may keep what it got without copying it, as long as
    it does not change it either."""

    def __init__(
        self, *, deadline_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.deadline_s = deadline_s
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._pods: dict[JobKey, dict[str, bytes]] = {}
        """Each pod trimmed, then kept as compact JSON: 8000 pods as dicts took 19 MiB, as
        bytes 4; a reader decodes the few it asks for (a few microseconds each) and gets
        objects of its own."""
        self._pod_jobs: dict[tuple[str, str], JobKey] = {}
        self._synced: set[str] = set()
        self._pending: dict[JobKey, _Pending] = {}
        self._live: dict[JobKey, set[str]] = {}
        self._gone: dict[JobKey, float] = {}
        """Deleted jobs, oldest first, with when: tombstones (``TOMBSTONE_S``)."""
        self._put_at: dict[JobKey, float] = {}
        """When the watch last delivered each cached job (``sweep``)."""
        self._rev = 0
        self._pod_rev: dict[JobKey, int] = {}
        """Moves whenever a job's cached pods change (``pods_revision``)."""

    # --- what the watches deliver -------------------------------------------------------
    def put_job(self, job: Mapping[str, Any]) -> JobKey:
        meta = job.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        now = self.clock()
        with self._lock:
            self._jobs[key] = trim_job(job)
            self._put_at[key] = now
            self._gone.pop(key, None)
            self._rev += 1
        return key

    def drop_job(self, key: JobKey) -> None:
        """The TorchJob is gone: forget it, its pods go with their own DELETED events."""
        now = self.clock()
        with self._lock:
            self._rev += 1
            self._jobs.pop(key, None)
            self._put_at.pop(key, None)
            self._pending.pop(key, None)
            self._live.pop(key, None)
            self._gone.pop(key, None)
            self._gone[key] = now  # the newest last
            for old, since in list(self._gone.items()):
                if now - since < TOMBSTONE_S:
                    break
                del self._gone[old]

    def sweep(self, listed: Iterable[JobKey], started: float) -> list[JobKey]:
        """Drop the jobs a LIST begun at ``started`` (this store's clock) no longer shows:
        they were deleted without the watch reporting it. A job first delivered after the
        LIST began may be newer than it, so it stays. Returns the dropped keys."""
        shown = set(listed)
        with self._lock:
            missing = [k for k, at in self._put_at.items() if at < started and k not in shown]
        for key in missing:
            self.drop_job(key)
        return missing

    def is_gone(self, key: JobKey) -> bool:
        """Whether the watch saw this job deleted (in the last ``TOMBSTONE_S``), and no new
        one of the same name since."""
        with self._lock:
            since = self._gone.get(key)
        return since is not None and self.clock() - since < TOMBSTONE_S

    def put_pod(self, pod: Mapping[str, Any]) -> JobKey | None:
        key = job_key_of_pod(pod)
        if key is not None:
            trimmed = trim_pod(pod)
            name = trimmed["metadata"]["name"]
            blob = _compact(trimmed)
            with self._lock:
                self._pods.setdefault(key, {})[name] = blob
                self._pod_jobs[(key[0], name)] = key
                self._moved(key)
        return key

    def drop_pod(self, pod: Mapping[str, Any]) -> JobKey | None:
        key = job_key_of_pod(pod)
        if key is not None:
            name = str((pod.get("metadata") or {}).get("name"))
            with self._lock:
                self._pod_jobs.pop((key[0], name), None)
                pods = self._pods.get(key)
                if pods is not None:
                    pods.pop(name, None)
                    if not pods:
                        del self._pods[key]
                # Our created pod came and went (deleted, evicted, preempted before it ran):
                # the watch has shown it, so a plan need not wait out the deadline for it.
                pending = self._pending.get(key)
                if pending is not None:
                    pending.pods = [
                        e
                        for e in pending.pods
                        if not (e.kind == "created" and e.name == name and e.met(pod))
                    ]
                self._moved(key)
        return key

    def replace_pods(self, scope: str, pods: Iterable[Mapping[str, Any]]) -> set[JobKey]:
        """A fresh LIST of the pods in ``scope`` (a namespace, or ``ALL_NAMESPACES``): what
        it holds replaces the cache there, which counts as synced from now on. Returns the
        jobs whose pods were listed or were cached before (each may have changed)."""
        fresh: dict[JobKey, dict[str, bytes]] = {}
        for pod in pods:
            key = job_key_of_pod(pod)
            if key is not None:
                trimmed = trim_pod(pod)
                fresh.setdefault(key, {})[trimmed["metadata"]["name"]] = _compact(trimmed)
        with self._lock:
            stale = [k for k in self._pods if scope == ALL_NAMESPACES or k[0] == scope]
            for k in stale:
                for name in self._pods.pop(k):
                    self._pod_jobs.pop((k[0], name), None)
            self._pods.update(fresh)
            for k, by_name in fresh.items():
                self._pod_jobs.update(((k[0], name), k) for name in by_name)
            for k in set(stale) | set(fresh):
                self._moved(k)
            self._synced.add(scope)
        return set(stale) | set(fresh)

    def _moved(self, key: JobKey) -> None:
        self._rev += 1
        if key in self._pods:
            self._pod_rev[key] = self._rev
        else:  # no pod left: revision 0, as for a job that never had one
            self._pod_rev.pop(key, None)

    def revision(self) -> int:
        """A number that changes whenever any cached job or pod does."""
        with self._lock:
            return self._rev

    def pods_revision(self, key: JobKey) -> int:
        """A number that changes whenever the job's cached pods do (what a reader keeps
        derived from them is still valid while it is the same)."""
        with self._lock:
            return self._pod_rev.get(key, 0)

    # --- what reconciles read -------------------------------------------------------------
    def job(self, key: JobKey) -> dict[str, Any] | None:
        with self._lock:
            return self._jobs.get(key)

    def jobs(self) -> list[dict[str, Any]]:
        """Every cached TorchJob (a snapshot: the objects are never changed in place)."""
        with self._lock:
            return list(self._jobs.values())

    def job_of_pod(self, namespace: str, name: str) -> JobKey | None:
        """The job of a cached pod; None when the cache does not hold it."""
        with self._lock:
            return self._pod_jobs.get((namespace, name))

    def jobs_on_node(self, node: str) -> set[JobKey]:
        """The jobs with a cached pod bound to ``node``."""
        return self.jobs_on_nodes({node})

    def jobs_on_nodes(self, nodes: Collection[str]) -> set[JobKey]:
        """The jobs with a cached pod bound to any of ``nodes``, or kept off one of them
        (``common.nodes.AVOIDED_NODES``): a node's notice or loss pokes the first, its return
        the second. One pass over the pods as they are kept, compact JSON, reading only each
        one's ``nodeName`` and that annotation: a LIST of thousands of nodes costs one pass,
        not one per node."""
        if not nodes:
            return set()
        wanted = {n.encode() for n in nodes}
        with self._lock:
            return {
                k for k, pods in self._pods.items() if any(_on(b, wanted) for b in pods.values())
            }

    def pods_of(self, key: JobKey) -> list[Pod] | None:
        """The job's pods in a LIST's order (by name), or None while no pod watch covering
        its namespace has synced. The order matters: plans and their messages are
        deterministic in their input, as they were over the API server's LIST."""
        with self._lock:
            if key[0] not in self._synced and ALL_NAMESPACES not in self._synced:
                return None
            pods = self._pods.get(key) or {}
            blobs = [pods[name] for name in sorted(pods)]
        return [orjson.loads(b) for b in blobs]

    # --- expectations ---------------------------------------------------------------------
    def expect_pods(self, key: JobKey, expectations: list[PodExpectation]) -> None:
        if expectations:
            with self._lock:
                self._pending_of(key).pods.extend(expectations)

    def expect_status(self, key: JobKey, patch: Mapping[str, Any]) -> None:
        if patch:
            with self._lock:
                self._pending_of(key).status.append(patch)

    def _pending_of(self, key: JobKey) -> _Pending:
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(since=self.clock())
        return pending

    def awaiting(self, key: JobKey) -> bool:
        """Whether some write to this job has not been seen by the watches yet."""
        with self._lock:
            return key in self._pending

    def catching_up(self, key: JobKey) -> float | None:
        """Seconds to wait for the watches to show this job's last writes; None when they
        do (plan from the cache) or when the wait ran out (``read_live`` says so then)."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                return None
            pods = self._pods.get(key) or {}
            pending.pods = [e for e in pending.pods if not e.met(_decoded(pods.get(e.name)))]
            job = self._jobs.get(key)
            status = (job or {}).get("status")
            pending.status = [p for p in pending.status if not merge_applied(status, p)]
            if not pending.pods and not pending.status:
                del self._pending[key]
                return None
            left = pending.since + self.deadline_s - self.clock()
            if left > 0:
                return left
            del self._pending[key]
            self._live[key] = {"job", "pods"}
            metrics.CACHE_EXPIRED.inc()
            # A decision waited this long: a broken watch, an overloaded API server, or a
            # write the cache never shows as made (then every write of this job waits).
            log.warning(
                "[%s/%s] the watches did not show our writes within %.0f s (%s): planning "
                "from the API server",
                *key,
                self.deadline_s,
                pending.said(),
            )
            return None

    def read_live(self, key: JobKey, what: Literal["job", "pods"]) -> bool:
        """Whether this job's next read of ``what`` must go to the API server (its
        expectations ran out); asking clears it, so only one reconcile pays for it."""
        with self._lock:
            left = self._live.get(key)
            if left is None or what not in left:
                return False
            left.discard(what)
            if not left:
                del self._live[key]
            return True

    def sizes(self) -> tuple[int, int, int]:
        """(jobs, pods, jobs awaiting their writes): the cache's size, for ``/metrics``."""
        with self._lock:
            return (
                len(self._jobs),
                sum(len(p) for p in self._pods.values()),
                len(self._pending),
            )

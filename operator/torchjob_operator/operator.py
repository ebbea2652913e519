"""The ``Operator``: everything one running operator holds, built once by ``__main__``.

Its settings, the API client and the read cache (``engine.cached.CachedKube`` over an
``engine.cache.Store``), the pod watch that fills the cache, the leader election, the write
pool, the controllers (TorchJob, TorchTune) and one work queue for each. kopf's handlers
(``handlers.py``) only hand it their events; nothing lives in a module global.

kopf watches the TorchJobs, TorchTunes and Kueue Workloads; the pods are watched by
``engine.podwatch.PodWatch``, which asks the API server for the operator's own pods only.
Both keep what they see in the one ``Store`` the reconciles read instead of the API server.
With several replicas a Lease elects the one that reconciles (``engine.leader``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes import config as kube_config

from torchjob_operator.engine import job_metrics, metrics
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.cached import CachedKube
from torchjob_operator.engine.client import KubeClient
from torchjob_operator.engine.kube import Kube
from torchjob_operator.engine.leader import LeaderElector
from torchjob_operator.engine.memory import TrimLater
from torchjob_operator.engine.nodewatch import LeaseWatch, NodeBook, NodeWatch
from torchjob_operator.engine.podwatch import PodWatch, WorkloadWatch
from torchjob_operator.engine.pool import WritePool
from torchjob_operator.engine.queue import Key, Result, WorkQueue
from torchjob_operator.engine.settings import ElectionConfig, OperatorSettings
from torchjob_operator.torchjob.controller import reconcile_once
from torchjob_operator.torchtune.controller import StudyController
from torchjob_operator.torchtune.observe import study_of_job

log = logging.getLogger("torchjob_operator")

TRIM_DELAY_S = 5.0
"""After the last TorchJob of a burst of deletions is gone, free memory goes back to the
kernel this many seconds later (``memory.release_freed``): one trim per burst."""


def load_kube_config() -> None:
    """In-cluster credentials, else the kubeconfig; then enough kept-alive connections for
    the concurrent creates of a few jobs at once: a request beyond the pool opens (and then
    drops) a new TLS connection, which costs more CPU than the request itself."""
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    api_config = client.Configuration.get_default_copy()
    api_config.connection_pool_maxsize = max(api_config.connection_pool_maxsize or 0, 64)
    client.Configuration.set_default(api_config)


class TorchJobs:
    """``engine.queue.Controller`` for TorchJobs over ``torchjob.controller.reconcile_once``; it also
    holds back status writes that would only move the worker counts (``progress_batch_s``)."""

    kind = "torchjob"

    def __init__(
        self,
        kube: CachedKube,
        settings: OperatorSettings,
        pool: WritePool,
        nodes: NodeBook | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.pool = pool
        self.nodes = nodes
        self._deferred_since: dict[Key, float] = {}
        """When a worker-count-only status write of the job was first held back (monotonic)."""

    def keys(self, namespaces: tuple[str, ...]) -> list[Key]:
        return list(self.kube.list_jobs(namespaces))

    def catching_up(self, key: Key) -> float | None:
        return self.kube.store.catching_up(key)

    def reconcile(self, namespace: str, name: str) -> Result:
        key = (namespace, name)
        started = time.monotonic()
        since = self._deferred_since.get(key)
        with metrics.RECONCILE_SECONDS.time():
            outcome = reconcile_once(
                self.kube,
                namespace,
                name,
                settings=self.settings,
                defer_progress=since is None or started - since < self.settings.progress_batch_s,
                pool=self.pool.executor(),
                nodes=None if self.nodes is None else self.nodes.snapshot(),
                avoid=() if self.nodes is None else self.nodes.avoid(),
            )
        if not outcome.deferred or outcome.gone:
            self._deferred_since.pop(key, None)
        elif since is None:
            self._deferred_since[key] = started
        return Result(requeue_after_s=outcome.requeue_after_s, gone=outcome.gone)

    def forget(self, key: Key) -> None:
        self._deferred_since.pop(key, None)
        metrics.forget_job(*key)

    def release(self) -> None:
        """No job left: end the write pool's threads (the next write starts them again)."""
        self.pool.release()


class Operator:
    def __init__(self, settings: OperatorSettings, live: Kube | None = None) -> None:
        self.settings = settings
        self.store = Store(deadline_s=settings.cache_deadline_s)
        self.kube = CachedKube(live if live is not None else KubeClient(), self.store)
        self.pool = WritePool(2 * settings.create_concurrency)
        leading = settings.leader_election is None
        self.node_book = NodeBook() if settings.watch_nodes else None
        self.torchjobs = TorchJobs(self.kube, settings, self.pool, self.node_book)
        self.trim = TrimLater(
            TRIM_DELAY_S, idle=lambda: not self.jobs.loops, release_idle=self._idle
        )
        self.jobs = WorkQueue(
            self.torchjobs,
            resync_s=settings.resync_period_s,
            leading=leading,
            on_drop=self.trim.soon,
        )
        self.studies = WorkQueue(
            StudyController(self.kube, settings), resync_s=settings.resync_period_s, leading=leading
        )
        self.pod_watch: PodWatch | None = None
        self.workload_watch: WorkloadWatch | None = None
        self.node_watch: NodeWatch | None = None
        self.lease_watch: LeaseWatch | None = None
        self.elector: LeaderElector | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # The operator's own bookkeeping, on /metrics: it must drain when the jobs do.
        metrics.JOB_LOOPS.set_function(lambda: len(self.jobs.loops))
        metrics.QUEUE_DEPTH.set_function(self.jobs.depth)
        job_metrics.register(self.store, self.node_book)
        for i, kind in enumerate(("jobs", "pods", "awaiting")):
            metrics.CACHE_OBJECTS.labels(kind=kind).set_function(
                lambda i=i: self.store.sizes()[i]  # type: ignore[misc]
            )

    def _idle(self) -> None:
        """With no job left, give back the write pool's threads (their stacks) and the
        kept-alive connections (their TLS buffers): the next job makes them again."""
        self.torchjobs.release()
        if isinstance(self.kube.live, KubeClient):
            self.kube.live.close_idle_connections()

    # --- start and stop (kopf's startup and cleanup) -------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # asyncio.to_thread's executor runs the reconciles (settings.max_concurrent_reconciles).
        loop.set_default_executor(
            ThreadPoolExecutor(
                self.settings.max_concurrent_reconciles, thread_name_prefix="torchjob-reconcile"
            )
        )
        if self.settings.leader_election is not None:
            self._elect(self.settings.leader_election)

        def on_job(namespace: str, job: str) -> None:
            loop.call_soon_threadsafe(self.jobs.poke, (namespace, job))

        # Pods are watched with a server-side label selector (see ``engine.podwatch``).
        self.pod_watch = PodWatch(
            client.ApiClient(),  # its own pool: a watch holds its connection for minutes
            on_job,
            self.store,
            namespaces=self.settings.namespaces,
            server_timeout_s=int(self.settings.watch_server_timeout_s),
            client_timeout_s=self.settings.watch_client_timeout_s,
        )
        self.pod_watch.start()
        # Kueue's Workloads, where Kueue is installed (or once it is): its own reflector, as
        # kopf's watch of a resource whose CRD goes away ends the whole operator.
        self.workload_watch = WorkloadWatch(
            client.ApiClient(),
            on_job,
            namespaces=self.settings.namespaces,
            server_timeout_s=int(self.settings.watch_server_timeout_s),
            client_timeout_s=self.settings.watch_client_timeout_s,
        )
        self.workload_watch.start()
        if self.node_book is not None:
            # Termination notices and nodes that stop reporting (``engine.nodewatch``).
            self.node_watch = NodeWatch(
                client.ApiClient(),
                on_job,
                self.store,
                self.node_book,
                self.settings.notice_taints,
                server_timeout_s=int(self.settings.watch_server_timeout_s),
                client_timeout_s=self.settings.watch_client_timeout_s,
            )
            self.node_watch.start()
            # Kubelets that stopped renewing their Lease, before their Node says so.
            self.lease_watch = LeaseWatch(
                client.ApiClient(),
                on_job,
                self.store,
                self.node_book,
                server_timeout_s=int(self.settings.watch_server_timeout_s),
                client_timeout_s=self.settings.watch_client_timeout_s,
            )
            self.lease_watch.start()
        self._keep(loop.create_task(self._sweep_forever(), name="torchjob-sweep"))

    def _keep(self, task: asyncio.Task[None]) -> None:
        # Held until done: the event loop keeps only a weak reference to a task.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.job_sweep_s)
            if self.jobs.leading:
                try:
                    await self.sweep_jobs()
                except Exception as exc:  # the next sweep tries again
                    log.warning("listing the TorchJobs to sweep the cache failed: %s", exc)

    async def sweep_jobs(self) -> list[Key]:
        """LIST the TorchJobs; forget every cached one the LIST no longer shows (deleted
        without a watch event, ``OperatorSettings.job_sweep_s``). Returns them."""
        started = self.store.clock()
        listed = await asyncio.to_thread(self.kube.list_jobs, self.settings.namespaces)
        dropped = self.store.sweep(listed, started)
        for key in dropped:
            log.warning("[%s/%s] deleted without a watch event: forgetting it", *key)
            metrics.GHOSTS_DROPPED.inc()
            self.jobs.forget(key)
        return dropped

    async def stop(self) -> None:
        """Clean shutdown (SIGTERM, a rolling upgrade): stop reconciling, hand the lease back
        so a standby leads at once instead of after the lease duration, stop the pod watch
        and the write pool."""
        if self.elector is not None:
            self.jobs.stop_leading()
            self.studies.stop_leading()
            await asyncio.get_running_loop().run_in_executor(None, self.elector.release)
        for watch in (self.pod_watch, self.workload_watch, self.node_watch, self.lease_watch):
            if watch is not None:
                await asyncio.to_thread(watch.stop)
        await asyncio.to_thread(self.pool.release)
        for task in list(self._tasks):
            task.cancel()

    def _elect(self, config: ElectionConfig) -> None:
        """Start the election; leading starts the loops, losing the lease ends the process
        (controller-runtime's behaviour: a new leader must never overlap with this one)."""
        loop = asyncio.get_running_loop()
        namespaces = self.settings.namespaces
        queues = (self.jobs, self.studies)

        def lead(queue: WorkQueue) -> None:  # on the event loop
            self._keep(
                loop.create_task(
                    queue.start_leading(namespaces), name=f"{queue.controller.kind}-leading"
                )
            )

        def started() -> None:
            for queue in queues:
                loop.call_soon_threadsafe(lead, queue)

        def stopped() -> None:
            # Stop the loops from this thread's view at once, then end the process: a
            # reconcile in flight in a worker thread must not outlive the lease.
            for queue in queues:
                queue.leading = False
                loop.call_soon_threadsafe(queue.stop_leading)
            log.error("leader election lost: exiting so that only the new leader reconciles")
            logging.shutdown()
            os._exit(1)

        self.elector = LeaderElector(
            client.CoordinationV1Api(), config, on_started=started, on_stopped=stopped
        )
        self.elector.start()

    # --- watch events (on the event loop) -----------------------------------------------
    def torchjob_event(self, event: Mapping[str, Any], namespace: str, name: str) -> None:
        key = (namespace, name)
        body = event.get("object")
        if event.get("type") == "DELETED":
            self.store.drop_job(key)
            self.jobs.forget(key)
            study = study_of_job(body or {})
            if study is not None:
                self.studies.poke((namespace, study))
            return
        before = self.store.job(key)
        if body:
            self.store.put_job(body)
            study = study_of_job(body)
            if study is not None:  # a trial's progress or phase: its study judges it
                self.studies.poke((namespace, study))
        if (
            event.get("type") == "MODIFIED"
            and key in self.jobs.loops
            and status_only(event)
            and not reported_silent(before, body)
            and not self.store.awaiting(key)
        ):
            return  # a status write (ours, or the agent's progress) nobody waits for
        self.jobs.poke(key)

    def torchtune_event(self, event: Mapping[str, Any], namespace: str, name: str) -> None:
        key = (namespace, name)
        if event.get("type") == "DELETED":
            self.studies.forget(key)  # its trial TorchJobs go with it (ownerReferences)
            return
        self.studies.poke(key)


def status_only(event: Mapping[str, Any]) -> bool:
    """The spec is the one the status was planned for, and no deletion started: the change
    was a status write. Every reconcile ends with one, so poking for it would run a second,
    idle reconcile (a GET and a LIST) after every change of every job."""
    body: Any = event.get("object") or {}
    meta = body.get("metadata") or {}
    observed = (body.get("status") or {}).get("observedGeneration")
    return not meta.get("deletionTimestamp") and observed == meta.get("generation")


def reported_silent(before: Mapping[str, Any] | None, body: Mapping[str, Any] | None) -> bool:
    """The survivors' silent-peer reports (``status.silentWorkers``, written by the workers)
    changed: a status write that must be planned at once. Left to the next pod event or
    requeue, it delayed the next generation by 0.2-8.2 s after each node vanish on the fleet
    bench (bench/results/2026-11-29j run 2, uniform over that range)."""

    def reports(job: Mapping[str, Any] | None) -> Any:
        return ((job or {}).get("status") or {}).get("silentWorkers") or []

    return bool(body) and reports(before) != reports(body)


__all__ = ["Operator", "TorchJobs", "load_kube_config", "reported_silent", "status_only"]

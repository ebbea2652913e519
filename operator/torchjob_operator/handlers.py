"""Thin kopf adapters: watch TorchJobs and their pods, and run one reconcile loop per job.

kopf watches the TorchJobs (reconnects, timeouts, namespaces); the pods are
watched by ``podwatch.PodWatch``, which asks the API server for the operator's own
pods only (kopf would receive and filter every pod of the cluster). Both keep what
they see in one ``cache.Store``, which the reconciles read instead of the API server.
With several replicas a Lease elects the one that reconciles (``leader.py``). Every
event only *pokes* the job's loop; the loop runs ``reconcile_once`` in a
thread, at most one at a time per job, once the cache shows the job's last writes
(``Store.catching_up``), and sleeps until the next poke or the planner's requeue time. This is the work-queue pattern of controller-runtime,
and it needs no finalizer: deleting a TorchJob never waits for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client
from kubernetes import config as kube_config

from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob.api.tune import PLURAL as TUNE_PLURAL
from torchjob_operator import memory, metrics
from torchjob_operator import settings as settings_mod
from torchjob_operator.cache import CachedKube, Store
from torchjob_operator.kube import KubeClient, KubeError
from torchjob_operator.leader import LeaderElector
from torchjob_operator.podwatch import PodWatch
from torchjob_operator.torchjob.controller import reconcile_once
from torchjob_operator.tune import list_tunes, reconcile_study, study_of_job

log = logging.getLogger("torchjob_operator")

JobKey = tuple[str, str]

TRIM_DELAY_S = 5.0
"""After the last TorchJob of a burst of deletions is gone, free memory goes back to the
kernel this many seconds later (``memory.release_freed``): one trim per burst."""


@dataclass
class _Loop:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    deferred_since: float | None = None
    """When a worker-count-only status write was first held back (monotonic)."""

    def may_defer(self, now: float, batch_s: float) -> bool:
        return self.deferred_since is None or now - self.deferred_since < batch_s


class _Loops:
    """One asyncio task per object key; pokes coalesce, so a burst of events is one reconcile.

    Loops run only while this replica leads (``leader.py``): a standby ignores pokes, and
    on losing the lease every loop is cancelled and none starts again. Subclasses say how
    to list their objects (``_keys``) and run one loop (``_run``)."""

    kind = "object"

    def __init__(self, kube: CachedKube, *, leading: bool = True) -> None:
        self.kube = kube
        self.loops: dict[JobKey, _Loop] = {}
        self.leading = leading

    def _keys(self, namespaces: tuple[str, ...]) -> list[JobKey]:
        raise NotImplementedError

    async def _run(self, key: JobKey, loop: _Loop) -> None:
        raise NotImplementedError

    async def start_leading(self, namespaces: tuple[str, ...]) -> None:
        """Became leader: reconcile every object, since the watch events came while standing by."""
        self.leading = True
        for key in await asyncio.to_thread(self._keys, namespaces):
            self.poke(key)

    def stop_leading(self) -> None:
        self.leading = False
        for key in list(self.loops):
            self.forget(key)

    def poke(self, key: JobKey) -> None:
        if not self.leading:
            return
        loop = self.loops.get(key)
        if loop is None or loop.task is None or loop.task.done():
            loop = _Loop()
            self.loops[key] = loop
            loop.task = asyncio.create_task(
                self._run(key, loop), name=f"{self.kind}:{key[0]}/{key[1]}"
            )
        loop.wake.set()

    def forget(self, key: JobKey) -> None:
        loop = self.loops.pop(key, None)
        if loop and loop.task:
            loop.task.cancel()


class Reconciler(_Loops):
    """One loop per TorchJob, running ``reconcile_once`` in a worker thread."""

    kind = "torchjob"

    def __init__(self, kube: CachedKube, *, leading: bool = True) -> None:
        super().__init__(kube, leading=leading)
        self.store = kube.store
        self._trim: asyncio.TimerHandle | None = None
        self._trim_task: asyncio.Future[bool] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def _writes(self, settings: settings_mod.OperatorSettings) -> ThreadPoolExecutor:
        """One long-lived pool for the concurrent pod writes of every job. A pool per reconcile
        started and ended up to 16 threads each time: CPU for nothing, and every new thread may
        take a fresh malloc arena that keeps its memory after the burst."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=2 * settings.create_concurrency, thread_name_prefix="torchjob-io"
                )
            return self._pool

    def _release_pool(self) -> None:
        """End the write pool's threads (their stacks go back to the kernel); the next
        reconcile that writes starts a new pool."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def _keys(self, namespaces: tuple[str, ...]) -> list[JobKey]:
        return list(self.kube.list_jobs(namespaces))

    def forget(self, key: JobKey) -> None:
        super().forget(key)
        self._release_memory_soon()

    def _release_memory_soon(self) -> None:
        if self._trim is not None:
            self._trim.cancel()
        self._trim = asyncio.get_running_loop().call_later(TRIM_DELAY_S, self._start_trim)

    def _start_trim(self) -> None:
        self._trim = None
        idle = not self.loops
        # Held until done: the event loop keeps only a weak reference to a task.
        self._trim_task = asyncio.ensure_future(asyncio.to_thread(self._release, idle))

    def _release(self, idle: bool) -> bool:
        """Give memory back; with no job left, also the write pool's threads (their stacks)
        and the kept-alive connections (their TLS buffers): the next job makes them again."""
        if idle:
            self._release_pool()
            if isinstance(self.kube.live, KubeClient):
                self.kube.live.close_idle_connections()
        return memory.release_freed()

    async def _run(self, key: JobKey, loop: _Loop) -> None:
        ns, name = key
        settings = settings_mod.SETTINGS
        error_backoff = 1.0
        while self.leading:
            loop.wake.clear()
            catching_up = self.store.catching_up(key)
            if catching_up is not None:
                # Our last writes are not in the cache yet: the watch events that bring them
                # poke this loop (or the deadline passes and the next pass reads live).
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(loop.wake.wait(), timeout=catching_up)
                continue
            try:
                started = time.monotonic()
                outcome = await asyncio.to_thread(
                    reconcile_once,
                    self.kube,
                    ns,
                    name,
                    settings=settings,
                    defer_progress=loop.may_defer(started, settings.progress_batch_s),
                    pool=self._writes(settings),
                )
                if not outcome.deferred:
                    loop.deferred_since = None
                elif loop.deferred_since is None:
                    loop.deferred_since = started
                error_backoff = 1.0
            except Exception as exc:  # never let one job's error end the operator
                if isinstance(exc, KubeError) and exc.namespace_terminating:
                    # Not a failure: the namespace's deletion removes the job, which ends
                    # this loop (reconcile_once then finds it gone).
                    log.info(
                        "[%s/%s] namespace is being deleted; nothing to create (next look in "
                        "%.0fs)",
                        ns,
                        name,
                        error_backoff,
                    )
                else:
                    metrics.RECONCILE_ERRORS.inc()
                    log.exception(
                        "[%s/%s] reconcile failed; retrying in %.0fs", ns, name, error_backoff
                    )
                delay: float | None = error_backoff
                error_backoff = min(error_backoff * 2, 60.0)
            else:
                if outcome.gone:
                    self.loops.pop(key, None)
                    self._release_memory_soon()
                    return
                delay = outcome.requeue_after_s
            timeout = (
                settings.resync_period_s if delay is None else min(delay, settings.resync_period_s)
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)


class StudyReconciler(_Loops):
    """One loop per TorchTune, as ``Reconciler`` has per TorchJob: pokes (the study's own
    events, and every event of one of its trial TorchJobs) coalesce into one
    ``reconcile_study`` in a worker thread."""

    kind = "torchtune"

    def _keys(self, namespaces: tuple[str, ...]) -> list[JobKey]:
        assert isinstance(self.kube.live, KubeClient)
        return list(list_tunes(self.kube.live, namespaces))

    async def _run(self, key: JobKey, loop: _Loop) -> None:
        ns, name = key
        settings = settings_mod.SETTINGS
        error_backoff = 1.0
        while self.leading:
            loop.wake.clear()
            delay: float | None
            try:
                outcome = await asyncio.to_thread(reconcile_study, self.kube, ns, name)
                error_backoff = 1.0
            except Exception:  # never let one study's error end the operator
                metrics.RECONCILE_ERRORS.inc()
                log.exception(
                    "[%s/%s] study reconcile failed; retrying in %.0fs", ns, name, error_backoff
                )
                delay = error_backoff
                error_backoff = min(error_backoff * 2, 60.0)
            else:
                if outcome.gone:
                    self.loops.pop(key, None)
                    return
                delay = outcome.requeue_after_s
                if delay == 0.0:
                    continue
            timeout = (
                settings.resync_period_s if delay is None else min(delay, settings.resync_period_s)
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)


RECONCILER: Reconciler | None = None
STUDIES: StudyReconciler | None = None
ELECTOR: LeaderElector | None = None


def _reconciler() -> Reconciler:
    global RECONCILER
    if RECONCILER is None:
        ours = settings_mod.SETTINGS
        store = Store(deadline_s=ours.cache_deadline_s)
        leading = ours.leader_election is None
        RECONCILER = reconciler = Reconciler(CachedKube(KubeClient(), store), leading=leading)
        global STUDIES
        STUDIES = StudyReconciler(reconciler.kube, leading=leading)
        # The operator's own bookkeeping, on /metrics: it must drain when the jobs do.
        metrics.JOB_LOOPS.set_function(lambda: len(reconciler.loops))
        for i, kind in enumerate(("jobs", "pods", "awaiting")):
            metrics.CACHE_OBJECTS.labels(kind=kind).set_function(
                lambda i=i: store.sizes()[i]  # type: ignore[misc]
            )
    return RECONCILER


def _studies() -> StudyReconciler:
    _reconciler()
    assert STUDIES is not None
    return STUDIES


def _elect(config: settings_mod.ElectionConfig) -> None:
    """Start the election; leading starts the loops, losing the lease ends the process
    (controller-runtime's behaviour: a new leader must never overlap with this one)."""
    global ELECTOR
    loop = asyncio.get_running_loop()
    reconciler = _reconciler()
    namespaces = settings_mod.SETTINGS.namespaces

    studies = _studies()

    def started() -> None:
        loop.call_soon_threadsafe(
            lambda: loop.create_task(reconciler.start_leading(namespaces), name="start-leading")
        )
        loop.call_soon_threadsafe(
            lambda: loop.create_task(studies.start_leading(namespaces), name="studies-leading")
        )

    def stopped() -> None:
        # Stop the loops from this thread's view at once, then end the process: a reconcile
        # in flight in a worker thread must not outlive the lease.
        reconciler.leading = False
        studies.leading = False
        loop.call_soon_threadsafe(reconciler.stop_leading)
        loop.call_soon_threadsafe(studies.stop_leading)
        log.error("leader election lost: exiting so that only the new leader reconciles")
        logging.shutdown()
        os._exit(1)

    ELECTOR = LeaderElector(
        client.CoordinationV1Api(), config, on_started=started, on_stopped=stopped
    )
    ELECTOR.start()


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    ours = settings_mod.SETTINGS
    # The API server wants whole seconds in timeoutSeconds.
    settings.watching.server_timeout = int(ours.watch_server_timeout_s)
    settings.watching.client_timeout = ours.watch_client_timeout_s
    settings.watching.connect_timeout = ours.watch_connect_timeout_s
    settings.posting.level = logging.WARNING  # our Events are posted by the reconciler
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        kube_config.load_kube_config()  # type: ignore[no-untyped-call]
    # Enough kept-alive connections for the concurrent creates of a few jobs at once: a
    # request beyond the pool opens (and then drops) a new TLS connection, which costs
    # more CPU than the request itself.
    api_config = client.Configuration.get_default_copy()
    api_config.connection_pool_maxsize = max(api_config.connection_pool_maxsize or 0, 64)
    client.Configuration.set_default(api_config)
    # asyncio.to_thread's executor runs the reconciles (settings.max_concurrent_reconciles).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(ours.max_concurrent_reconciles, thread_name_prefix="torchjob-reconcile")
    )
    if ours.leader_election is not None:
        _elect(ours.leader_election)


@kopf.on.cleanup()
async def release_lease(**_: Any) -> None:
    """Clean shutdown (SIGTERM, a rolling upgrade): stop reconciling, then hand the lease
    back so a standby leads at once instead of after the lease duration."""
    if ELECTOR is None:
        return
    _reconciler().stop_leading()
    _studies().stop_leading()
    await asyncio.get_running_loop().run_in_executor(None, ELECTOR.release)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_via_client(**kwargs)


# Async on purpose: kopf runs sync handlers in a thread pool, and the loops live on the event loop.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def torchjob_event(event: kopf.RawEvent, name: str, namespace: str | None, **_: Any) -> None:
    key = (namespace or "", name)
    reconciler = _reconciler()
    if event.get("type") == "DELETED":
        reconciler.store.drop_job(key)
        reconciler.forget(key)
        study = study_of_job(event.get("object") or {})
        if study is not None:
            _studies().poke((namespace or "", study))
        return
    body = event.get("object")
    if body:
        reconciler.store.put_job(body)
        study = study_of_job(body)
        if study is not None:  # a trial's progress or phase: its study judges it
            _studies().poke((namespace or "", study))
    if (
        event.get("type") == "MODIFIED"
        and key in reconciler.loops
        and _status_only(event)
        and not reconciler.store.awaiting(key)
    ):
        return  # a status write (ours, or the agent's progress) nobody waits for: nothing to plan
    reconciler.poke(key)


@kopf.on.event(GROUP, VERSION, TUNE_PLURAL)
async def torchtune_event(event: kopf.RawEvent, name: str, namespace: str | None, **_: Any) -> None:
    key = (namespace or "", name)
    studies = _studies()
    if event.get("type") == "DELETED":
        studies.forget(key)  # its trial TorchJobs go with it (ownerReferences)
        return
    studies.poke(key)


@kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads")
async def workload_event(event: kopf.RawEvent, namespace: str | None, **_: Any) -> None:
    """A TorchJob's Workload changed (admitted, evicted, ...): its job plans again. kopf
    watches Workloads only where Kueue's CRDs exist."""
    body: Any = event.get("object") or {}
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "TorchJob":
            _reconciler().poke((namespace or "", str(ref.get("name"))))


def _status_only(event: kopf.RawEvent) -> bool:
    """The spec is the one the status was planned for, and no deletion started: the change
    was a status write. Every reconcile ends with one, so poking for it would run a second,
    idle reconcile (a GET and a LIST) after every change of every job."""
    body: Any = event.get("object") or {}
    meta = body.get("metadata") or {}
    observed = (body.get("status") or {}).get("observedGeneration")
    return not meta.get("deletionTimestamp") and observed == meta.get("generation")


POD_WATCH: PodWatch | None = None


@kopf.on.startup()
async def start_pod_watch(**_: Any) -> None:
    """Pods are watched with a server-side label selector (see ``podwatch``)."""
    global POD_WATCH
    loop = asyncio.get_running_loop()
    reconciler = _reconciler()

    def on_job(namespace: str, job: str) -> None:
        loop.call_soon_threadsafe(reconciler.poke, (namespace, job))

    ours = settings_mod.SETTINGS
    POD_WATCH = PodWatch(
        client.ApiClient(),  # its own pool: a watch holds its connection for minutes
        on_job,
        reconciler.store,
        namespaces=ours.namespaces,
        server_timeout_s=int(ours.watch_server_timeout_s),
        client_timeout_s=ours.watch_client_timeout_s,
    )
    POD_WATCH.start()


@kopf.on.cleanup()
async def stop_pod_watch(**_: Any) -> None:
    if POD_WATCH is not None:
        await asyncio.to_thread(POD_WATCH.stop)

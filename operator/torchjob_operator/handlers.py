"""Thin kopf adapters: watch TorchJobs and their pods, and run one reconcile loop per job.

kopf does the watching (reconnects, timeouts, namespaces, peering). Every
event only *pokes* the job's loop; the loop runs ``reconcile_once`` in a
thread, at most one at a time per job, and sleeps until the next poke or the
planner's requeue time. This is the work-queue pattern of controller-runtime,
and it needs no finalizer: deleting a TorchJob never waits for the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import config as kube_config

from torchjob import contract
from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob_operator import metrics
from torchjob_operator import settings as settings_mod
from torchjob_operator.kube import Kube, KubeClient
from torchjob_operator.reconcile import reconcile_once

log = logging.getLogger("torchjob_operator")

JobKey = tuple[str, str]


@dataclass
class _Loop:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Reconciler:
    """One asyncio task per TorchJob; pokes coalesce, so a burst of pod events is one reconcile."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.loops: dict[JobKey, _Loop] = {}

    def poke(self, key: JobKey) -> None:
        loop = self.loops.get(key)
        if loop is None or loop.task is None or loop.task.done():
            loop = _Loop()
            self.loops[key] = loop
            loop.task = asyncio.create_task(
                self._run(key, loop), name=f"torchjob:{key[0]}/{key[1]}"
            )
        loop.wake.set()

    def forget(self, key: JobKey) -> None:
        loop = self.loops.pop(key, None)
        if loop and loop.task:
            loop.task.cancel()

    async def _run(self, key: JobKey, loop: _Loop) -> None:
        ns, name = key
        settings = settings_mod.SETTINGS
        error_backoff = 1.0
        while True:
            loop.wake.clear()
            try:
                outcome = await asyncio.to_thread(
                    reconcile_once, self.kube, ns, name, settings=settings
                )
                error_backoff = 1.0
            except Exception:  # never let one job's error end the operator
                metrics.RECONCILE_ERRORS.inc()
                log.exception(
                    "[%s/%s] reconcile failed; retrying in %.0fs", ns, name, error_backoff
                )
                delay: float | None = error_backoff
                error_backoff = min(error_backoff * 2, 60.0)
            else:
                if outcome.gone:
                    self.loops.pop(key, None)
                    return
                delay = outcome.requeue_after_s
            timeout = (
                settings.resync_period_s if delay is None else min(delay, settings.resync_period_s)
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(loop.wake.wait(), timeout=timeout)


RECONCILER: Reconciler | None = None


def _reconciler() -> Reconciler:
    global RECONCILER
    if RECONCILER is None:
        RECONCILER = Reconciler(KubeClient())
    return RECONCILER


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
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


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_via_client(**kwargs)


# Async on purpose: kopf runs sync handlers in a thread pool, and the loops live on the event loop.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def torchjob_event(event: kopf.RawEvent, name: str, namespace: str | None, **_: Any) -> None:
    key = (namespace or "", name)
    if event.get("type") == "DELETED":
        _reconciler().forget(key)
        return
    _reconciler().poke(key)


@kopf.on.event("", "v1", "pods", labels={contract.LABEL_JOB_NAME: kopf.PRESENT})
async def worker_pod_event(labels: kopf.Labels, namespace: str | None, **_: Any) -> None:
    _reconciler().poke((namespace or "", labels[contract.LABEL_JOB_NAME]))

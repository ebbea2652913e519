"""Leader election on a coordination.k8s.io/v1 Lease, with controller-runtime's semantics.

Several operator replicas run; one leads (reconciles), the others stand by (they watch,
so their liveness holds, but their per-job loops never start). The timing is client-go's:

* ``lease_duration`` (15 s): a standby takes the lease only when its record (holder and
  renew time) has not changed for this long, measured on the standby's own clock from
  when it *observed* the record, so clock skew between nodes does not matter.
* ``renew_deadline`` (10 s): the leader renews every ``retry_period``; when no renewal
  succeeded for this long it stops leading: its loops are cancelled and the process exits
  (as controller-runtime's manager does), so it has stopped before the lease can expire
  for anybody else (``renew_deadline < lease_duration``).
* ``retry_period`` (2 s): how often candidates try and the leader renews.

Writes carry the resourceVersion read, so two candidates can never both win one round.
``decide`` is the pure part (unit-tested); ``LeaderElector`` does the I/O in a thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from torchjob_operator.engine.settings import ElectionConfig

log = logging.getLogger("torchjob_operator.engine.leader")


@dataclass(frozen=True)
class Record:
    """The Lease's spec, as far as the election reads it."""

    holder: str
    renew_time: str
    transitions: int = 0


def may_take(
    record: Record | None,
    *,
    identity: str,
    observed_at: float,
    now: float,
    lease_duration_s: float,
) -> bool:
    """Whether ``identity`` may write itself into the lease now. ``observed_at`` is when
    (on this process's monotonic clock) the current record was first seen unchanged."""
    if record is None or not record.holder or record.holder == identity:
        return True
    return now - observed_at >= lease_duration_s


def _micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease(
    c: ElectionConfig,
    *,
    holder: str,
    acquire_time: str,
    transitions: int,
    duration_s: float | None = None,
    resource_version: str | None = None,
) -> dict[str, Any]:
    """A whole Lease body (create or replace); ``resource_version`` makes a replace
    conditional on the version read."""
    metadata: dict[str, Any] = {"name": c.name, "namespace": c.namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(
                1, round(c.lease_duration_s if duration_s is None else duration_s)
            ),
            "acquireTime": acquire_time,
            "renewTime": _micro_now(),
            "leaseTransitions": transitions,
        },
    }


class LeaderElector:
    """Runs the election in a daemon thread; ``on_started`` when this replica starts
    leading, ``on_stopped`` when it stops (then the process should end)."""

    def __init__(
        self,
        api: client.CoordinationV1Api,
        config: ElectionConfig,
        *,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.config = config
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.leading = threading.Event()
        self._observed: Record | None = None
        self._observed_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def release(self, timeout_s: float = 5.0) -> bool:
        """Clean shutdown (controller-runtime's ``ReleaseOnCancel``): stop the election and,
        if this replica led, empty the lease's holder so a standby takes over on its next
        round instead of waiting out the lease duration. The caller has stopped reconciling.
        True when the lease was handed back."""
        was_leading = self.leading.is_set()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if not was_leading:
            return False
        c = self.config
        try:
            lease: Any = self.api.read_namespaced_lease(
                c.name, c.namespace, _request_timeout=timeout_s
            )
            if (lease.spec.holder_identity or "") != c.identity:
                return False  # someone else holds it already
            body = _lease(
                c,
                holder="",
                acquire_time=_format(lease.spec.acquire_time),
                transitions=lease.spec.lease_transitions or 0,
                duration_s=1,
                resource_version=lease.metadata.resource_version,
            )
            self.api.replace_namespaced_lease(
                c.name, c.namespace, cast(Any, body), _request_timeout=timeout_s
            )
        except ApiException as e:
            log.warning("releasing lease %s/%s: %s %s", c.namespace, c.name, e.status, e.reason)
            return False
        log.info("released the lease %s/%s", c.namespace, c.name)
        return True

    # --- one round -----------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        c = self.config
        timeout = max(c.retry_period_s, 1.0)
        try:
            lease: Any = self.api.read_namespaced_lease(
                c.name, c.namespace, _request_timeout=timeout
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("reading lease %s/%s: %s %s", c.namespace, c.name, e.status, e.reason)
                return False
            return self._create(timeout)
        spec = lease.spec
        record = Record(
            holder=spec.holder_identity or "",
            renew_time=str(spec.renew_time or ""),
            transitions=spec.lease_transitions or 0,
        )
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        if not may_take(
            record,
            identity=c.identity,
            observed_at=self._observed_at,
            now=now,
            lease_duration_s=c.lease_duration_s,
        ):
            return False
        ours = record.holder == c.identity
        body = _lease(
            c,
            holder=c.identity,
            acquire_time=_format(spec.acquire_time) if ours and spec.acquire_time else _micro_now(),
            transitions=record.transitions + (0 if ours else 1),
            resource_version=lease.metadata.resource_version,
        )
        try:
            self.api.replace_namespaced_lease(
                c.name, c.namespace, cast(Any, body), _request_timeout=timeout
            )
        except ApiException as e:
            if e.status != 409:  # 409: someone else wrote first; not ours this round
                log.warning("updating lease %s/%s: %s %s", c.namespace, c.name, e.status, e.reason)
            return False
        return True

    def _create(self, timeout: float) -> bool:
        c = self.config
        body = _lease(c, holder=c.identity, acquire_time=_micro_now(), transitions=0)
        try:
            self.api.create_namespaced_lease(c.namespace, cast(Any, body), _request_timeout=timeout)
        except ApiException as e:
            if e.status != 409:
                log.warning("creating lease %s/%s: %s %s", c.namespace, c.name, e.status, e.reason)
            return False
        return True

    # --- the loop ------------------------------------------------------------------------
    def _round(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception:  # a network error is a failed round, never the end of the thread
            log.exception("leader election round failed")
            return False

    def _run(self) -> None:
        c = self.config
        log.info("waiting to lead: lease %s/%s as %s", c.namespace, c.name, c.identity)
        while not self._stop.is_set():
            if self._round():
                break
            self._stop.wait(c.retry_period_s)
        if self._stop.is_set():
            return
        log.info("became leader: lease %s/%s held by %s", c.namespace, c.name, c.identity)
        self.leading.set()
        self.on_started()
        renewed = self.clock()
        while not self._stop.is_set():
            self._stop.wait(c.retry_period_s)
            if self._round():
                renewed = self.clock()
            elif self.clock() - renewed >= c.renew_deadline_s:
                log.error(
                    "lost the lease %s/%s: not renewed for %.0fs; stopping",
                    c.namespace,
                    c.name,
                    c.renew_deadline_s,
                )
                break
        self.leading.clear()
        if not self._stop.is_set():  # lost, not a clean shutdown (``release``)
            self.on_stopped()


def _format(value: Any) -> str:
    if isinstance(value, datetime):
        v = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return v.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(value)

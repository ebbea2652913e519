"""Following the job's generations from inside a pod (``membershipPolicy: KeepSurvivors``).

The operator decides membership and publishes it in the TorchJob's status:
``currentGeneration``, ``replicas`` and ``members`` (the pod indices in rank order; absent:
pods ``<job>-worker-0 .. replicas-1``, rank ``i`` on pod ``i``; the rendezvous is on the first
member). A pod it keeps into a new generation is
not restarted, so its environment still names the old one: its runtime follows the
status instead, with one watch of the TorchJob through the pod's ServiceAccount (the
Role that lets pod 0 write ``status.progress`` also allows ``watch`` of this one job),
and re-forms the process group when the generation moves. An idle job makes no
request: the API server pushes the status when it changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from torchjob import contract
from torchjob.api.models import TERMINAL_PHASES, GenerationRecord, TorchJobStatus
from torchjob.train.job_status import JobEndpoint
from torchjob.train.recovery.preemption import Leaving

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Membership:
    generation: int
    replicas: int
    phase: str | None = None
    restart_after: datetime | None = None
    """During a restart backoff: the operator creates the replacement pods no earlier."""
    replaced: tuple[str, ...] = ()
    """Pods of earlier generations that are not members of this one (``replacedWorkers``)."""
    members: tuple[int, ...] | None = None
    """Pod indices in rank order (``status.members``); None: ``0..replicas-1``."""
    leaving: tuple[Leaving, ...] = ()
    """Members given notice, with their deadlines (``status.leavingWorkers``)."""
    joined: tuple[str, ...] = ()
    """Pods new in this generation (its ``status.history`` record's ``joined``; none in
    generation 0): the only members a formation names absent (``recovery.formation``)."""
    placed: tuple[str, ...] = ()
    """The pods of :attr:`joined` that were placed when it was published (joiners created
    ahead, their runtime already waiting); the others were created with it and start first,
    so a formation gives them the worker start timeout before it names them absent."""
    lost: tuple[tuple[int, str], ...] = ()
    """``(generation, pod)``: the pods a generation left out because they were lost (its
    ``status.history`` record's ``left``, with a cause in ``LOST_CAUSES``): they never come."""

    @property
    def ranked(self) -> tuple[int, ...]:
        return contract.ranked(self)

    def role(self, pod_index: int) -> contract.Role:
        """The pod's role in this generation: a member with its rank among the generation's
        pods, or a standby (``contract.role_in``)."""
        return contract.role_in(self, pod_index)

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> Membership | None:
        s = TorchJobStatus.parse(status)
        if s.current_generation is None or s.replicas is None:
            return None
        try:
            after = (
                datetime.fromisoformat(s.restart_after.replace("Z", "+00:00"))
                if s.restart_after
                else None
            )
        except ValueError:
            after = None
        return cls(
            generation=s.current_generation,
            replicas=s.replicas,
            phase=s.phase.value if s.phase else None,
            restart_after=after,
            replaced=tuple(s.replaced_workers or ()),
            members=s.rank_order(),
            leaving=tuple(
                Leaving(w.pod, w.reason, _time(w.deadline)) for w in s.leaving_workers or ()
            ),
            joined=_of_generation(s, GenerationRecord.joined_pods),
            placed=_of_generation(s, GenerationRecord.placed_joiners),
            lost=tuple(
                (r.generation, name) for r in s.history or () for name in sorted(r.lost_pods())
            ),
        )

    def excludes(self, pod_name: str, created_in: int) -> bool:
        """Whether the pod ``pod_name``, created for generation ``created_in``, is not a member
        of this generation: the operator lists it as replaced (a pod created for this
        generation or a later one may carry the same name, and is a member)."""
        return pod_name in self.replaced and created_in < self.generation

    def lost_since(self, generation: int) -> frozenset[str]:
        """The pods that generations after ``generation`` left out because they were lost."""
        return frozenset(name for g, name in self.lost if g > generation)

    def backoff_left_s(self, now: datetime | None = None) -> float:
        """Seconds until the replacement pods may be created (0 when not in a backoff)."""
        if self.restart_after is None:
            return 0.0
        now = now or datetime.now(timezone.utc)
        return max(0.0, (self.restart_after - now).total_seconds())


def _of_generation(
    s: TorchJobStatus, names: Callable[[GenerationRecord], frozenset[str]]
) -> tuple[str, ...]:
    """``names`` of the current generation's ``status.history`` record (none in generation 0)."""
    current = s.current_generation or 0
    return tuple(
        sorted(name for r in s.history or () if r.generation == current > 0 for name in names(r))
    )


def _time(text: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _tell(callback: Callable[[Membership], None], m: Membership) -> None:
    try:
        callback(m)
    except Exception as exc:  # advice to the workers: never the watch's end
        log.warning("torchjob: membership callback failed: %s", exc)


class GenerationTimeout(RuntimeError):
    """The operator did not start a new generation in time."""


class MembershipWatch:
    """Follows the job's membership with one watch of the TorchJob (``fieldSelector`` on its
    name): an idle job costs the API server no request per pod, only one open connection
    that the server renews every ``watch_timeout_s``. A background thread keeps the latest
    membership; :meth:`changed` and :meth:`wait_beyond` read it without any I/O.

    Where the pod's Role does not allow ``watch`` (a job created by an older operator), the
    thread falls back to reading the status every ``min_interval_s``."""

    def __init__(
        self,
        endpoint: JobEndpoint,
        *,
        min_interval_s: float = 5.0,
        watch_timeout_s: int = 300,
        first_read_timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self.min_interval_s = min_interval_s
        self.watch_timeout_s = watch_timeout_s
        self.first_read_timeout_s = first_read_timeout_s
        self._latest: Membership | None = None
        self._seen = False
        self._arrived: dict[int, float] = {}
        """When this watch first saw each generation (``time.monotonic()``)."""
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._response: Any = None
        self._warned = False
        self.polling = False
        """True once the watch was refused (403) and the thread polls instead."""
        self._on_deleting: list[Callable[[], None]] = []
        self._on_change: list[Callable[[Membership], None]] = []
        self._deletion_seen = False
        """The TorchJob is being deleted (its ``deletionTimestamp`` is set, or it is gone):
        no generation, and no replacement for a pod given notice, will come."""
        self._thread = threading.Thread(target=self._run, name="torchjob-membership", daemon=True)
        self._thread.start()

    # --- what the trainer asks --------------------------------------------------------------
    def read(self) -> Membership | None:
        """The latest membership (waits up to ``first_read_timeout_s`` for the first one)."""
        with self._cond:
            self._cond.wait_for(
                lambda: self._seen or self._closed.is_set(), self.first_read_timeout_s
            )
            return self._latest

    def changed(self, generation: int) -> Membership | None:
        """A membership newer than ``generation``, if one is published (no I/O)."""
        with self._cond:
            m = self._latest
        return m if m is not None and m.generation > generation else None

    def seen_after(self, generation: int) -> float | None:
        """When this watch first saw a generation later than ``generation`` (monotonic
        seconds); None while none is published."""
        with self._cond:
            later = [t for g, t in self._arrived.items() if g > generation]
        return min(later, default=None)

    def wait_beyond(
        self,
        generation: int,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        stop: threading.Event | None = None,
    ) -> Membership:
        """Block until the job moves past ``generation``; raise GenerationTimeout after
        ``timeout_s``, or when the job finished (no generation will come). ``poll_s`` is how
        often ``stop`` is looked at; the membership itself arrives through the watch."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._cond:
                m = self._latest
                if m is not None and m.generation > generation:
                    return m
                if m is not None and m.phase in TERMINAL_PHASES:
                    raise GenerationTimeout(f"the TorchJob is {m.phase}: no generation will follow")
                if stop is not None and stop.is_set():
                    raise GenerationTimeout("stopped while waiting for the next generation")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GenerationTimeout(
                        f"no generation after {generation} within {timeout_s:.0f}s "
                        f"(the operator publishes it in the TorchJob's status.currentGeneration)"
                    )
                self._cond.wait(min(left, poll_s) if poll_s > 0 else min(left, 0.01))

    @property
    def deleting(self) -> bool:
        """The TorchJob is being deleted, or is gone: no generation will follow."""
        with self._cond:
            return self._deletion_seen

    def on_deleting(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the watch's thread) once the TorchJob is being deleted; at
        once if it already is."""
        with self._cond:
            self._on_deleting.append(callback)
            now = self._deletion_seen
        if now:
            callback()

    def on_change(self, callback: Callable[[Membership], None]) -> None:
        """Call ``callback`` with every membership the status publishes (from the watch's
        thread; at once with the latest one, if any): ``preemption.NoticeWriter``. An
        exception in it is logged, not raised."""
        with self._cond:
            self._on_change.append(callback)
            latest = self._latest
        if latest is not None:
            _tell(callback, latest)

    def close(self) -> None:
        self._closed.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.close()
        with self._cond:
            self._cond.notify_all()

    # --- the background thread ----------------------------------------------------------------
    def _publish(self, status: dict[str, Any] | None) -> None:
        m = Membership.from_status(status or {})
        with self._cond:
            self._seen = True
            if m is not None:
                self._latest = m
                self._arrived.setdefault(m.generation, time.monotonic())
            self._cond.notify_all()
            callbacks = list(self._on_change) if m is not None else []
        for callback in callbacks:
            _tell(callback, m)  # type: ignore[arg-type]

    def _deleted(self) -> None:
        with self._cond:
            if self._deletion_seen:
                return
            self._deletion_seen = True
            callbacks = list(self._on_deleting)
        for callback in callbacks:
            callback()

    def _warn(self, what: str, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            log.warning("torchjob: cannot %s %s: %s", what, self.endpoint.url, exc)

    def _run(self) -> None:
        resource_version: str | None = None
        backoff = 0.5
        while not self._closed.is_set():
            if self.polling:
                self._poll_once()
                self._closed.wait(self.min_interval_s)
                continue
            try:
                resource_version = self._follow(resource_version)
                backoff = 0.5
                continue
            except urllib.error.HTTPError as exc:
                if exc.code == 403:
                    self.polling = True
                    log.info("torchjob: no watch on %s (%s): polling it", self.endpoint.url, exc)
                    continue
                if exc.code == 410:
                    resource_version = None
                self._warn("watch", exc)
            except Exception as exc:  # the watch outlives any error
                # close() from another thread makes http.client raise anything (even
                # AttributeError: its fp is gone): a closed watch just ends.
                if self._closed.is_set():
                    return
                self._warn("watch", exc)
            self._closed.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def _follow(self, resource_version: str | None) -> str | None:
        """One watch request, until the server ends it; returns where to resume."""
        response = self.endpoint.watch(resource_version, timeout_s=self.watch_timeout_s)
        self._response = response
        try:
            for line in response:
                if self._closed.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                kind = event.get("type")
                if kind == "ERROR":
                    if obj.get("code") == 410:  # Gone: the version is too old; start from now
                        return None
                    raise ValueError(f"watch error: {obj.get('message') or obj}")
                resource_version = (obj.get("metadata") or {}).get(
                    "resourceVersion", resource_version
                )
                if kind in ("ADDED", "MODIFIED"):
                    self._publish(obj.get("status"))
                elif kind == "DELETED":
                    self._publish({**(obj.get("status") or {}), "phase": "Failed"})
                if kind == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp"):
                    self._deleted()
        finally:
            self._response = None
            response.close()
        return resource_version

    def _poll_once(self) -> None:
        try:
            job = self.endpoint.call("GET")
        except (OSError, ValueError) as exc:
            self._warn("read", exc)
            return
        self._publish(job.get("status"))


__all__ = ["GenerationTimeout", "Membership", "MembershipWatch"]

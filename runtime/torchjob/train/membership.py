"""Following the job's generations from inside a pod (``membershipPolicy: KeepSurvivors``).

The operator decides membership and publishes it in the TorchJob's status:
``currentGeneration`` and ``replicas`` (pods ``<job>-worker-0 .. replicas-1``, rank
``i`` on pod ``i``, rendezvous on pod 0). A pod it keeps into a new generation is
not restarted, so its environment still names the old one: its runtime reads the
status instead, through the pod's ServiceAccount (the same grant that writes
``status.progress``), and re-forms the process group when the generation moves.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from torchjob.api.models import TERMINAL_PHASES, TorchJobStatus
from torchjob.train.job_status import JobEndpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Membership:
    generation: int
    replicas: int
    phase: str | None = None
    restart_after: datetime | None = None
    """During a restart backoff: the operator creates the replacement pods no earlier."""

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
        )

    def backoff_left_s(self, now: datetime | None = None) -> float:
        """Seconds until the replacement pods may be created (0 when not in a backoff)."""
        if self.restart_after is None:
            return 0.0
        now = now or datetime.now(timezone.utc)
        return max(0.0, (self.restart_after - now).total_seconds())


class GenerationTimeout(RuntimeError):
    """The operator did not start a new generation in time."""


class MembershipWatch:
    """Reads the job's membership, at most every ``min_interval_s`` from :meth:`changed`."""

    def __init__(self, endpoint: JobEndpoint, *, min_interval_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self.min_interval_s = min_interval_s
        self._last_read = 0.0
        self._warned = False

    def read(self) -> Membership | None:
        try:
            job = self.endpoint.call("GET")
        except (OSError, ValueError) as exc:
            if not self._warned:
                self._warned = True
                log.warning("torchjob: cannot read %s: %s", self.endpoint.url, exc)
            return None
        finally:
            self._last_read = time.monotonic()
        return Membership.from_status(job.get("status") or {})

    def changed(self, generation: int) -> Membership | None:
        """A membership newer than ``generation``, if one is published (rate-limited)."""
        if time.monotonic() - self._last_read < self.min_interval_s:
            return None
        m = self.read()
        return m if m is not None and m.generation > generation else None

    def wait_beyond(
        self,
        generation: int,
        *,
        timeout_s: float,
        poll_s: float = 1.0,
        stop: threading.Event | None = None,
    ) -> Membership:
        """Block until the job moves past ``generation``; raise GenerationTimeout after
        ``timeout_s``, or when the job finished (no generation will come)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.read()
            if m is not None and m.generation > generation:
                return m
            if m is not None and m.phase in TERMINAL_PHASES:
                raise GenerationTimeout(f"the TorchJob is {m.phase}: no generation will follow")
            if stop is not None and stop.is_set():
                raise GenerationTimeout("stopped while waiting for the next generation")
            if time.monotonic() >= deadline:
                raise GenerationTimeout(
                    f"no generation after {generation} within {timeout_s:.0f}s "
                    f"(the operator publishes it in the TorchJob's status.currentGeneration)"
                )
            time.sleep(poll_s)


__all__ = ["GenerationTimeout", "Membership", "MembershipWatch"]

"""How a kept pod's runtime follows the job's generations (the HTTP path runs in the e2e tests)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from torchjob.train.membership import GenerationTimeout, Membership, MembershipWatch


class ScriptedStatus:
    """The TorchJob status as successive GETs return it."""

    url = "https://api/apis/torchjob.io/v1alpha1/namespaces/ns/torchjobs/j/status"

    def __init__(self, *statuses: dict[str, Any] | Exception) -> None:
        self.statuses = list(statuses)
        self.calls = 0

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert method == "GET" and body is None
        item = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        if isinstance(item, Exception):
            raise item
        return {"status": item}


def watch(*statuses: dict[str, Any] | Exception) -> MembershipWatch:
    return MembershipWatch(ScriptedStatus(*statuses), min_interval_s=0)  # type: ignore[arg-type]


def test_waits_through_errors_and_old_generations_for_the_next_one() -> None:
    w = watch(
        OSError("connection refused"),
        {"currentGeneration": 3, "replicas": 4, "phase": "Restarting"},
        {"currentGeneration": 4, "replicas": 3, "phase": "Restarting"},
    )
    assert w.wait_beyond(3, timeout_s=5, poll_s=0) == Membership(4, 3, "Restarting")


def test_a_finished_job_or_a_stop_or_the_deadline_ends_the_wait() -> None:
    with pytest.raises(GenerationTimeout, match="Failed"):
        watch({"currentGeneration": 3, "replicas": 4, "phase": "Failed"}).wait_beyond(
            3, timeout_s=5, poll_s=0
        )
    stop = threading.Event()
    stop.set()
    with pytest.raises(GenerationTimeout, match="stopped"):
        watch({"currentGeneration": 3, "replicas": 4}).wait_beyond(
            3, timeout_s=5, poll_s=0, stop=stop
        )
    with pytest.raises(GenerationTimeout, match=r"status\.currentGeneration"):
        watch({"currentGeneration": 3, "replicas": 4}).wait_beyond(3, timeout_s=0, poll_s=0)


def test_changed_only_reports_a_newer_generation() -> None:
    w = watch({"currentGeneration": 2, "replicas": 2}, {"currentGeneration": 5, "replicas": 2})
    assert w.changed(2) is None
    assert w.changed(2) == Membership(5, 2)
    assert Membership.from_status({"phase": "Pending"}) is None, "not published yet"


def test_the_restart_backoff_is_read_from_the_status() -> None:
    from datetime import datetime, timezone

    m = Membership.from_status(
        {"currentGeneration": 2, "replicas": 4, "restartAfter": "2026-01-01T00:00:30Z"}
    )
    assert m is not None
    now = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)
    assert m.backoff_left_s(now) == 20
    assert m.backoff_left_s(datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc)) == 0
    assert Membership(2, 4).backoff_left_s(now) == 0

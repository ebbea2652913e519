"""How a kept pod's runtime follows the job's generations: a watch of the TorchJob, pushed
events, no request per read (the HTTP path against a real API server runs in the e2e tests)."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.error
from datetime import datetime, timezone
from typing import Any

import pytest

from torchjob.train.recovery.membership import GenerationTimeout, Membership, MembershipWatch


def event(kind: str, rv: int, **status: Any) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"resourceVersion": str(rv)}, "status": status}}


class OpenWatch:
    """A watch response: the scripted events, then silence until closed (as a live watch)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]
        self.closed = threading.Event()

    def __iter__(self) -> Any:
        yield from self.lines
        self.closed.wait(10)

    def close(self) -> None:
        self.closed.set()


class Ended(OpenWatch):
    """A watch response that the server ends after its events."""

    def __iter__(self) -> Any:
        yield from self.lines


class ScriptedEndpoint:
    """The API server as one pod's agent sees it: each watch request gets the next script
    (a list of events, or an exception); GETs return ``polled``."""

    url = "https://api/apis/torchjob.io/v1alpha1/namespaces/ns/torchjobs/j/status"

    def __init__(
        self, *watches: list[dict[str, Any]] | OpenWatch | Exception, polled: Any = None
    ) -> None:
        self.watches = list(watches)
        self.watch_calls: list[str | None] = []
        self.gets = 0
        self.polled = polled

    def watch(self, resource_version: str | None, *, timeout_s: int) -> OpenWatch:
        self.watch_calls.append(resource_version)
        item = self.watches.pop(0) if self.watches else []
        if isinstance(item, Exception):
            raise item
        return item if isinstance(item, OpenWatch) else OpenWatch(item)

    def call(self, method: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert method == "GET" and body is None
        self.gets += 1
        return {"status": self.polled}


def follow(endpoint: ScriptedEndpoint) -> MembershipWatch:
    return MembershipWatch(endpoint, min_interval_s=0.01)  # type: ignore[arg-type]


def test_an_idle_job_costs_one_watch_and_no_request_per_read() -> None:
    ep = ScriptedEndpoint(
        [
            event("ADDED", 10, currentGeneration=3, replicas=4, phase="Running"),
            event("BOOKMARK", 11),
            event("MODIFIED", 12, currentGeneration=4, replicas=3, phase="Restarting"),
        ]
    )
    w = follow(ep)
    assert w.wait_beyond(3, timeout_s=5, poll_s=0.01) == Membership(4, 3, "Restarting")
    for _ in range(1000):  # the training loop's on_tick
        assert w.changed(4) is None
    assert w.changed(3) == Membership(4, 3, "Restarting")
    assert ep.watch_calls == [None] and ep.gets == 0
    w.close()


def test_a_broken_watch_resumes_from_the_last_version_and_a_gone_one_from_now() -> None:
    ep = ScriptedEndpoint(
        OSError("connection refused"),
        Ended([event("ADDED", 7, currentGeneration=1, replicas=2)]),  # the server's timeout
        [{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}],
        [event("ADDED", 20, currentGeneration=2, replicas=2, phase="Running")],
    )
    w = follow(ep)
    assert w.wait_beyond(1, timeout_s=10, poll_s=0.01) == Membership(2, 2, "Running")
    assert ep.watch_calls == [None, None, "7", None]
    w.close()


class ClosedUnderneath(OpenWatch):
    """http.client when another thread closes the response mid-read: its fp is None."""

    def __iter__(self) -> Any:
        yield from self.lines
        self.closed.wait(10)
        raise AttributeError("'NoneType' object has no attribute 'peek'")


def test_closing_mid_read_ends_the_thread_quietly(monkeypatch: pytest.MonkeyPatch) -> None:
    crashed: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    ep = ScriptedEndpoint(ClosedUnderneath([event("ADDED", 1, currentGeneration=0, replicas=2)]))
    w = follow(ep)
    assert w.wait_beyond(-1, timeout_s=5, poll_s=0.01) == Membership(0, 2)
    w.close()
    w._thread.join(5)
    assert not w._thread.is_alive() and crashed == []


def test_without_the_watch_verb_the_agent_polls() -> None:
    refused = urllib.error.HTTPError("u", 403, "Forbidden", {}, io.BytesIO(b""))  # type: ignore[arg-type]
    ep = ScriptedEndpoint(refused, polled={"currentGeneration": 5, "replicas": 2})
    w = follow(ep)
    assert w.wait_beyond(4, timeout_s=5, poll_s=0.01) == Membership(5, 2)
    assert w.polling and ep.gets >= 1
    w.close()


def test_a_finished_job_or_a_stop_or_the_deadline_ends_the_wait() -> None:
    failed = follow(
        ScriptedEndpoint([event("ADDED", 1, currentGeneration=3, replicas=4, phase="Failed")])
    )
    with pytest.raises(GenerationTimeout, match="Failed"):
        failed.wait_beyond(3, timeout_s=5, poll_s=0.01)
    deleted = follow(
        ScriptedEndpoint(
            [
                event("ADDED", 1, currentGeneration=3, replicas=4),
                event("DELETED", 2, currentGeneration=3, replicas=4),
            ]
        )
    )
    with pytest.raises(GenerationTimeout, match="Failed"):
        deleted.wait_beyond(3, timeout_s=5, poll_s=0.01)
    running = [event("ADDED", 1, currentGeneration=3, replicas=4)]
    stop = threading.Event()
    stop.set()
    with pytest.raises(GenerationTimeout, match="stopped"):
        follow(ScriptedEndpoint(running)).wait_beyond(3, timeout_s=5, poll_s=0.01, stop=stop)
    with pytest.raises(GenerationTimeout, match=r"status\.currentGeneration"):
        follow(ScriptedEndpoint(running)).wait_beyond(3, timeout_s=0, poll_s=0.01)
    for w in (failed, deleted):
        w.close()


def test_read_returns_the_membership_once_published() -> None:
    w = follow(ScriptedEndpoint([event("ADDED", 1, phase="Pending")]))
    assert w.read() is None, "not published yet"
    w.close()
    w = follow(ScriptedEndpoint([event("ADDED", 1, currentGeneration=2, replicas=2)]))
    assert w.read() == Membership(2, 2)
    w.close()


def test_the_watch_says_when_it_first_saw_a_later_generation() -> None:
    before = time.monotonic()
    w = follow(
        ScriptedEndpoint(
            [
                event("ADDED", 1, currentGeneration=2, replicas=2),
                event("MODIFIED", 2, currentGeneration=3, replicas=2),
                event("MODIFIED", 3, currentGeneration=3, replicas=2, phase="Running"),
            ]
        )
    )
    w.wait_beyond(2, timeout_s=30, poll_s=0.01)
    third = w.seen_after(2)
    assert third is not None and before <= third <= time.monotonic()
    assert w.seen_after(1) is not None and w.seen_after(1) <= third  # generation 2, earlier
    assert w.seen_after(3) is None, "nothing later than 3 is published"
    w.close()


def test_the_restart_backoff_is_read_from_the_status() -> None:
    m = Membership.from_status(
        {"currentGeneration": 2, "replicas": 4, "restartAfter": "2026-01-01T00:00:30Z"}
    )
    assert m is not None
    now = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)
    assert m.backoff_left_s(now) == 20
    assert m.backoff_left_s(datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc)) == 0
    assert Membership(2, 4).backoff_left_s(now) == 0


def test_the_pods_a_generation_lost_are_read_from_its_history_record() -> None:
    """The pods a generation left out because they were lost (a SIGKILL, a vanished node),
    not those a scale-down or a notice took out (still running, they may yet form)."""

    def record(generation: int, cause: str, left: list[str]) -> dict[str, Any]:
        return {"generation": generation, "began": "t", "cause": cause, "left": left}

    m = Membership.from_status(
        {
            "currentGeneration": 13,
            "replicas": 7,
            "history": [
                record(11, "Killed", ["j-worker-1@node-2"]),
                record(12, "Notice", ["j-worker-5@node-1"]),
                record(13, "NodeLost", ["j-worker-2@node-2", "j-worker-0@node-2"]),
            ],
        }
    )
    assert m is not None
    assert m.lost == ((11, "j-worker-1"), (13, "j-worker-0"), (13, "j-worker-2"))
    assert m.lost_since(11) == {"j-worker-0", "j-worker-2"}
    assert m.lost_since(10) == {"j-worker-0", "j-worker-1", "j-worker-2"}
    assert Membership.from_status({"currentGeneration": 1, "replicas": 2}).lost == ()  # type: ignore[union-attr]


@pytest.mark.parametrize("how", ["deletionTimestamp", "DELETED"])
def test_the_jobs_deletion_is_told_to_every_listener_once(how: str) -> None:
    # Foreground deletion sets deletionTimestamp first; background deletion sends DELETED.
    going = event("MODIFIED", 12, currentGeneration=1, replicas=2, phase="Running")
    if how == "DELETED":
        going["type"] = "DELETED"
    else:
        going["object"]["metadata"]["deletionTimestamp"] = "2026-11-27T03:00:00Z"
    later = event("MODIFIED", 13, currentGeneration=1, replicas=2, phase="Running")
    if how != "DELETED":
        later["object"]["metadata"]["deletionTimestamp"] = "2026-11-27T03:00:00Z"
    ep = ScriptedEndpoint(
        [event("ADDED", 10, currentGeneration=1, replicas=2, phase="Running"), going, later]
    )
    told: list[str] = []
    seen = threading.Event()
    w = follow(ep)
    w.on_deleting(lambda: told.append("early"))
    w.on_deleting(seen.set)
    assert seen.wait(5)
    w.on_deleting(lambda: told.append("late"))  # registered after: told at once
    assert w.read() is not None
    assert sorted(told) == ["early", "late"], told
    w.close()


def test_a_running_job_is_not_being_deleted() -> None:
    ep = ScriptedEndpoint(
        Ended([event("ADDED", 10, currentGeneration=1, replicas=2, phase="Running")]),
        [event("MODIFIED", 11, currentGeneration=2, replicas=2, phase="Running")],
    )
    seen = threading.Event()
    w = follow(ep)
    w.on_deleting(seen.set)
    w.wait_beyond(1, timeout_s=5, poll_s=0.01)
    assert not seen.is_set()
    w.close()

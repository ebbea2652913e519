"""What a survivor's runtime writes into ``status.silentWorkers`` (``SilentReports``): a
server-side apply, under the reporter's own field manager, of every pod it found silent in
the current generation; the CRD makes the list a map keyed by reporter and pod, so the API
server keeps every reporter's entries (tests/cluster/test_silent_reports.py writes them)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tests.unit.builders import pod_env

from torchjob.api.crd import build_crd
from torchjob.launch.protocol import SilentPeer
from torchjob.train.progress import ProgressView
from torchjob.train.recovery.reports import SilentReports, silent_reporter
from torchjob.train.recovery.survivors import RestorePoints


class Applies:
    """Where the applies go (the API server's merge is the cluster test's); each takes
    ``delay_s``, so that writes on several threads overlap."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.delay_s = delay_s
        self.landed = threading.Condition()

    def apply(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
        time.sleep(self.delay_s)
        with self.landed:
            self.sent.append((field_manager, body))
            self.landed.notify_all()
        return {}


def _every_host_answers(address: tuple[str, int], timeout_s: float) -> socket.socket:
    raise ConnectionRefusedError  # a reset: the host is there


def hosts(down: set[str], asked: list[str]) -> Callable[[tuple[str, int], float], socket.socket]:
    """A sweep's connect: the hosts of ``down`` answer nothing (a timeout), the others reset;
    every host asked is appended to ``asked``."""

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        asked.append(address[0])
        raise TimeoutError if address[0] in down else ConnectionRefusedError

    return connect


def held_sweep(
    down: str,
) -> tuple[threading.Event, Callable[[tuple[str, int], float], socket.socket]]:
    """A sweep's connect that waits until the event is set; then hosts whose name starts
    with ``down`` answer nothing (a timeout), the others reset."""
    release = threading.Event()

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        assert release.wait(30), "the sweep was never let go"
        raise TimeoutError if address[0].startswith(down) else ConnectionRefusedError

    return release, connect


def entries(body: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(e["pod"], e["generation"], e["by"]) for e in body["status"]["silentWorkers"]]


def test_an_apply_holds_every_report_of_the_generation_under_the_reporters_manager() -> None:
    sink = Applies()
    reports = SilentReports(sink, pod_env(job_name="tj", pod_index=1, nproc_per_node=2))
    ranked = (1, 0, 2)  # pod 1 runs ranks 0-1, pod 0 ranks 2-3, pod 2 ranks 4-5
    assert reports.record(ranked, 4, 2, 5.04) and reports.record(ranked, 4, 5, 6.0, "store")
    reports.write()
    manager, body = sink.sent[-1]
    assert manager == "torchjob-silent-tj-worker-1"
    assert body["apiVersion"] == "torchjob.io/v1alpha1" and body["kind"] == "TorchJob"
    assert body["metadata"] == {"name": "tj"}
    # Both: an apply that left the first out would remove it from the status.
    assert entries(body) == [("tj-worker-0", 4, "tj-worker-1"), ("tj-worker-2", 4, "tj-worker-1")]
    assert body["status"]["silentWorkers"][0]["seconds"] == 5.0
    assert [e["how"] for e in body["status"]["silentWorkers"]] == ["heartbeat", "store"]
    # When each was found, RFC 3339 with milliseconds (the operator's hold of rank 0's reports).
    found = [datetime.fromisoformat(e["at"]) for e in body["status"]["silentWorkers"]]
    now = datetime.now(timezone.utc)
    assert all(abs((now - f).total_seconds()) < 60 for f in found), found
    assert not reports.record(ranked, 4, 6, 1.0), "rank 6 is of no pod"
    assert not reports.record(ranked, 3, 0, 1.0), "an older generation"
    assert reports.record((0, 1), 5, 0, 5.0)  # the next generation replaces the last one's
    reports.write()
    assert entries(sink.sent[-1][1]) == [("tj-worker-0", 5, "tj-worker-1")]


def test_reports_go_out_on_threads_one_at_a_time_and_the_last_write_holds_them_all() -> None:
    """The driver never waits on the API server; writes that overlap would each replace
    the reporter's entries with what they hold, so they go one at a time, each with the
    reports as they are when it starts."""
    sink = Applies(delay_s=0.05)
    reports = SilentReports(
        sink, pod_env(job_name="tj", pod_index=0, replicas=4), connect=_every_host_answers
    )
    for rank in (1, 2, 3):
        reports.report((0, 1, 2, 3), 0, rank, 5.0, "heartbeat")
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 3, timeout=30), sink.sent
    assert entries(sink.sent[-1][1]) == [(f"tj-worker-{i}", 0, "tj-worker-0") for i in (1, 2, 3)]


def test_silent_workers_is_a_list_map_keyed_by_reporter_and_pod() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    silent = schema["properties"]["status"]["properties"]["silentWorkers"]
    assert silent["x-kubernetes-list-type"] == "map"
    assert silent["x-kubernetes-list-map-keys"] == ["by", "pod"]
    assert {"by", "pod"} <= set(silent["items"]["required"])


def test_the_first_silent_peer_of_a_generation_sweeps_the_other_members_hosts() -> None:
    """Rank 0's pod serves the store every beat goes through: when its node vanishes, the
    watchdog sees rank 0 silent and nothing of its node-mates. The report's sweep finds
    them (their hosts do not answer a connect) and the same write names them all; a host
    that answers is not reported, this pod's own is not asked, and the sweep runs once a
    generation. The watchdog's own later word on a swept pod says more, and replaces it."""
    asked: list[str] = []
    connect = hosts({"tj-worker-0.tj.ns.svc", "tj-worker-3.tj.ns.svc"}, asked)
    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=4)
    reports = SilentReports(sink, pod, connect=connect)
    said: list[str] = []
    told = threading.Event()
    reports.say = lambda text: (said.append(text), told.set())
    reports.report((0, 1, 2, 3), 7, 0, 5.2, "heartbeat")
    with sink.landed:
        assert sink.landed.wait_for(lambda: sink.sent, timeout=30)
    body = sink.sent[-1][1]
    # The pod's log says what was written and how long it took (said after the write).
    assert told.wait(30)
    assert said[0].startswith(
        "[torchjob] reported tj-worker-0, tj-worker-3 silent (generation 7) to the job's status in "
    ), said
    assert "(the members' hosts swept in " in said[0]
    assert entries(body) == [("tj-worker-0", 7, "tj-worker-1"), ("tj-worker-3", 7, "tj-worker-1")]
    assert [e["how"] for e in body["status"]["silentWorkers"]] == ["heartbeat", "host"]
    assert sorted(asked) == ["tj-worker-2.tj.ns.svc", "tj-worker-3.tj.ns.svc"]
    reports.sweep((0, 1, 2, 3), 7)
    assert len(asked) == 2, "once a generation"
    swept_at = body["status"]["silentWorkers"][1]["at"]
    assert reports.record((0, 1, 2, 3), 7, 3, 5.4, "heartbeat")
    assert [e.how for e in reports.reports()] == ["heartbeat", "heartbeat"]
    # When it was first found stays (the operator holds a report of rank 0 from then).
    assert reports.reports()[1].at == swept_at


def test_no_report_is_written_while_the_sweep_of_its_generation_runs() -> None:
    """The watchdog reports two silent peers at once: the second report's write waits for
    the first one's sweep, so that the first write the operator sees names the node-mate the
    sweep finds too (written before it, it would publish the next generation without the
    node-mate, whose report then counts for nothing)."""
    release, connect = held_sweep("tj-worker-3.")
    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=5)
    reports = SilentReports(sink, pod, connect=connect)
    reports.report((0, 1, 2, 3, 4), 2, 0, 5.1, "heartbeat")
    reports.report((0, 1, 2, 3, 4), 2, 2, 5.0, "heartbeat")
    with sink.landed:
        assert not sink.landed.wait_for(lambda: sink.sent, timeout=0.5), "written mid-sweep"
    release.set()
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 2, timeout=30), sink.sent
    for _, body in sink.sent:
        assert {e[0] for e in entries(body)} == {"tj-worker-0", "tj-worker-2", "tj-worker-3"}


def test_a_report_that_cannot_be_written_is_said() -> None:
    class Refuses:
        def apply(self, body: dict[str, Any], *, field_manager: str) -> dict[str, Any]:
            raise RuntimeError("403 Forbidden")

    said: list[str] = []
    done = threading.Event()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=2)
    reports = SilentReports(Refuses(), pod, connect=_every_host_answers)
    reports.say = lambda text: (said.append(text), done.set())
    reports.report((0, 1), 3, 0, 5.0, "heartbeat")
    assert done.wait(30)
    assert said == [
        "[torchjob] could not write the silent report of generation 3: 403 Forbidden"
    ], said


def test_the_sweep_run_ahead_while_the_store_is_quiet_is_the_reports_sweep() -> None:
    """The store of rank 0 quiet for 3 s of 5: the driver sweeps the members' hosts then
    (``sweep_ahead``), and rank 0's report 2 s later uses those answers instead of sweeping
    again (the 2 s it would add to every node loss that takes rank 0). Kept apart until then:
    nothing is written while only the store is quiet, and a second word of quiet in the same
    generation does not sweep again."""
    asked: list[str] = []
    swept = threading.Event()

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        asked.append(address[0])
        if len(asked) == 3:
            swept.set()
        raise TimeoutError if address[0].startswith("tj-worker-3.") else ConnectionRefusedError

    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=4)
    reports = SilentReports(sink, pod, connect=connect)
    reports.sweep_ahead((0, 1, 2, 3), 5)
    reports.sweep_ahead((0, 1, 2, 3), 5)
    assert swept.wait(30)
    with sink.landed:
        assert not sink.landed.wait_for(lambda: sink.sent, timeout=0.3), "only the store is quiet"
    reports.report((0, 1, 2, 3), 5, 0, 5.0, "heartbeat")
    with sink.landed:
        assert sink.landed.wait_for(lambda: sink.sent, timeout=30)
    assert entries(sink.sent[-1][1]) == [
        ("tj-worker-0", 5, "tj-worker-1"),
        ("tj-worker-3", 5, "tj-worker-1"),
    ]
    # Rank 0's host was asked ahead too (its pod was not named yet); nothing was asked again.
    assert sorted(asked) == [f"tj-worker-{i}.tj.ns.svc" for i in (0, 2, 3)], asked


def test_a_sweep_run_ahead_too_long_ago_is_not_believed() -> None:
    """The store was quiet once and answered again; much later in the same generation rank 0
    goes silent: the answers of the early sweep are stale and the report sweeps afresh."""
    down: set[str] = set()
    asked: list[str] = []
    connect = hosts(down, asked)
    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=3)
    reports = SilentReports(sink, pod, connect=connect)
    reports._early = (4, time.monotonic() - 60, {0: True, 4: True})  # all answered, long ago
    down.add("tj-worker-2.tj.ns.svc")
    reports.report((0, 1, 2), 4, 0, 5.0, "heartbeat")
    with sink.landed:
        assert sink.landed.wait_for(lambda: sink.sent, timeout=30)
    assert [e[0] for e in entries(sink.sent[-1][1])] == ["tj-worker-0", "tj-worker-2"]
    assert asked == ["tj-worker-2.tj.ns.svc"], "swept again, rank 0's pod already named"


def test_a_report_does_not_wait_for_hosts_the_watchdog_declares_meanwhile() -> None:
    """The watchdog declares a vanished node's ranks one after another; the first one's
    report sweeps at once, and the sweep asks the hosts of the others too (not declared yet
    when it began). Once they are declared the report is written without waiting out their
    connects (2 s each on the fleet bench, for every node of 4 pods)."""
    release, asked = threading.Event(), threading.Event()

    def connect(address: tuple[str, int], timeout_s: float) -> socket.socket:
        if address[0].startswith("tj-worker-3."):
            asked.set()
            release.wait(60)  # the vanished node-mate: nothing answers
            raise TimeoutError
        raise ConnectionRefusedError

    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=4)
    reports = SilentReports(sink, pod, connect=connect)
    try:
        reports.report((0, 1, 2, 3), 6, 0, 5.1, "heartbeat")
        assert asked.wait(30), "the sweep asked pod 3's host"
        assert reports.record((0, 1, 2, 3), 6, 3, 4.6, "heartbeat")  # declared a moment later
        with sink.landed:
            assert sink.landed.wait_for(lambda: sink.sent, timeout=30), "waited for pod 3's host"
    finally:
        release.set()
    assert [e[0] for e in entries(sink.sent[-1][1])] == ["tj-worker-0", "tj-worker-3"]
    assert [e["how"] for e in sink.sent[-1][1]["status"]["silentWorkers"]] == ["heartbeat"] * 2


def test_a_broken_group_is_said_about_the_reporter_itself_beside_its_silent_peers() -> None:
    """A pod whose group broke with its own workers alive says so about itself
    (``how: broken``): once, on a thread, kept beside the silent peers it found in the same
    generation, and dropped with them by a later generation's first report."""
    sink = Applies()
    reports = SilentReports(sink, pod_env(job_name="tj", pod_index=1), connect=_every_host_answers)
    assert reports.record((0, 1, 2), 7, 2, 5.0)
    reports.broken(7)
    reports.broken(7)  # once: a second write would say nothing new
    reports.broken(6)  # an older generation: nothing
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 1, timeout=30), sink.sent
    body = sink.sent[-1][1]
    assert entries(body) == [("tj-worker-2", 7, "tj-worker-1"), ("tj-worker-1", 7, "tj-worker-1")]
    assert [e["how"] for e in body["status"]["silentWorkers"]] == ["heartbeat", "broken"]
    stored = [w for w in reports.reports() if w.broken_group]
    assert [(w.pod, w.generation) for w in stored] == [("tj-worker-1", 7)]
    assert reports.record((0, 1, 2), 8, 0, 5.0)
    assert not any(w.broken_group for w in reports.reports())


def test_a_broken_group_is_not_written_before_the_sweep_of_its_silent_peer() -> None:
    """Rank 0's node vanished: the watchdog reports rank 0 (its sweep then finds the
    node-mate, pod 3), and the group breaks meanwhile. The broken group's own write must not
    go out before the sweep's: it holds rank 0 without its node-mate, and the operator
    published a generation that kept pod 3, then another (bench/results/2026-12-06e). The
    report's write, after its sweep, carries the broken entry too."""
    release, connect = held_sweep("tj-worker-3.")
    sink = Applies()
    pod = pod_env(job_name="tj", namespace="ns", pod_index=1, replicas=4)
    reports = SilentReports(sink, pod, connect=connect)
    reports.report((0, 1, 2, 3), 5, 0, 3.1, "heartbeat")
    reports.broken(5)
    with sink.landed:
        assert not sink.landed.wait_for(lambda: sink.sent, timeout=0.5), "written mid-sweep"
    release.set()
    with sink.landed:
        assert sink.landed.wait_for(lambda: sink.sent, timeout=30), sink.sent
    assert {e[0] for e in entries(sink.sent[0][1])} == {"tj-worker-0", "tj-worker-1", "tj-worker-3"}
    # With no report in flight, a broken group is written at once, as before.
    reports.broken(6)
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 2, timeout=30), sink.sent
    assert entries(sink.sent[-1][1]) == [("tj-worker-1", 6, "tj-worker-1")]


def test_a_peer_whose_beats_stopped_after_a_later_generation_was_seen_is_not_reported() -> None:
    """The runtime side of the operator's ``silent.moved_on``: a survivor stuck in a step of
    generation 8 after generation 9 was published reads the beats its peers stopped writing
    there (they left at their next report) as silence (2026-12-06p, loss 5)."""
    sink = Applies()
    said: list[str] = []
    pod = pod_env(job_name="tj", pod_index=0, replicas=3)
    reports = SilentReports(sink, pod, connect=_every_host_answers)
    reports.say = said.append
    ninth_seen = time.monotonic() - 2.0  # this pod saw generation 9 two seconds ago
    reports.seen_after = lambda g: ninth_seen if g < 9 else None
    # Rank 1's beats stopped 1 s ago, after generation 9 arrived: it moved on.
    assert reports.moved_on(8, 1, 1.0)
    reports.report((0, 1, 2), 8, 1, 1.0, "heartbeat")
    assert reports.reports() == [] and sink.sent == []
    assert any("moved on" in line and "rank 1" in line for line in said), said
    # Rank 2's beats stopped 5 s ago, before generation 9 arrived: a silence of generation 8.
    assert not reports.moved_on(8, 2, 5.0)
    reports.report((0, 1, 2), 8, 2, 5.0, "heartbeat")
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 1, timeout=30), sink.sent
    assert entries(sink.sent[-1][1]) == [("tj-worker-2", 8, "tj-worker-0")]
    # A store found silent is not a beat (rank 0 of generation 8 may serve it still):
    # reported as before.
    reports.report((1, 0, 2), 8, 0, 1.0, "store")
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 2, timeout=30), sink.sent
    assert ("tj-worker-1", 8, "tj-worker-0") in entries(sink.sent[-1][1])
    # Nothing later than generation 9 is seen: a report of generation 9 is judged as any.
    assert not reports.moved_on(9, 1, 0.5)


def test_a_silence_that_began_before_a_later_generation_is_reported_however_late_it_is_read() -> (
    None
):
    """The watchdog says when the silence began (``SilentPeer.since``): a driver that reads
    the event seconds late judges it by that instant, not by its own clock less the silence
    the watchdog measured, which would place the start after the later generation."""
    sink = Applies()
    pod = pod_env(job_name="tj", pod_index=0, replicas=3)
    reports = SilentReports(sink, pod, connect=_every_host_answers)
    now = time.monotonic()
    reports.seen_after = lambda g: now - 2.0 if g < 9 else None  # generation 9 seen 2 s ago

    class Published:
        ranked = (0, 1, 2)
        generation = 8

    points = RestorePoints(report_silent=silent_reporter(Published(), reports))
    # Rank 2's beats stopped 3 s ago, before generation 9 arrived; the watchdog found it
    # silent after 1 s of that, and the driver reads the event only now, 2 s later.
    late = SilentPeer(rank=2, silent_s=1.0, by=0, since=now - 3.0)
    assert points.on_event(late, None, ProgressView(enabled=False, total_epochs=None))
    with sink.landed:
        assert sink.landed.wait_for(lambda: len(sink.sent) == 1, timeout=30), sink.sent
    assert entries(sink.sent[-1][1]) == [("tj-worker-2", 8, "tj-worker-0")]
    # Rank 1's stopped 1 s ago, after generation 9 arrived: it moved on, however it is read.
    moved = SilentPeer(rank=1, silent_s=1.0, by=0, since=now - 1.0)
    assert points.on_event(moved, None, ProgressView(enabled=False, total_epochs=None))
    assert [r.pod for r in reports.reports()] == ["tj-worker-2"]

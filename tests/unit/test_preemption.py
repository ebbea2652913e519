"""What the training function is told is coming (``torchjob.train.recovery.preemption``)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.unit.test_membership import OpenWatch, ScriptedEndpoint, event

from torchjob import contract
from torchjob.train.recovery.membership import Membership, MembershipWatch
from torchjob.train.recovery.preemption import (
    Leaving,
    NoticeReader,
    NoticeWriter,
    PreemptionInfo,
    info_of,
    notice_path,
)

T = datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_a_leaving_pod_is_told_in_the_world_ranks_its_processes_hold() -> None:
    leaving = [
        Leaving("j-worker-2", "aws-node-termination-handler/spot-itn", T + timedelta(seconds=90)),
        Leaving("j-worker-5", "EvictionByEvictionAPI", T + timedelta(seconds=30)),
        Leaving("j-worker-7", "x", None),
    ]
    # Rank order (1, 2, 0, 5): pod 2 runs ranks 2-3, pod 5 ranks 6-7 with 2 per pod.
    info = info_of(leaving, (1, 2, 0, 5), "j", 2)
    assert info is not None
    assert info.ranks == (2, 3, 6, 7)
    assert info.deadline == T + timedelta(seconds=30), "the earliest"
    assert info.pods == ("j-worker-2", "j-worker-5")
    assert info.reasons == ("aws-node-termination-handler/spot-itn", "EvictionByEvictionAPI")
    # A leaving standby holds no rank; no dated entry: no notice.
    standby = info_of([Leaving("j-worker-9", "x", T)], (0, 1), "j", 1)
    assert standby is not None and standby.ranks == ()
    assert info_of([Leaving("j-worker-1", "x", None)], (0, 1), "j", 1) is None


def test_two_reads_merge_into_their_union_and_the_earliest_deadline() -> None:
    a = PreemptionInfo(T + timedelta(seconds=60), (2,), ("j-worker-2",), ("aws",))
    b = PreemptionInfo(T + timedelta(seconds=30), (3,), ("j-worker-3",), ("gke",))
    m = a.merged(b)
    assert (m.deadline, m.ranks, m.pods, m.reasons) == (
        T + timedelta(seconds=30),
        (2, 3),
        ("j-worker-2", "j-worker-3"),
        ("aws", "gke"),
    )
    assert PreemptionInfo.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_the_driver_writes_the_notice_and_the_workers_read_it(tmp_path: Path) -> None:
    path = tmp_path / "notice.json"
    path.write_text("left by an earlier run")
    writer = NoticeWriter(path, "j", 1)
    assert not path.exists(), "a new driver starts with no notice"
    reader = NoticeReader(path)
    assert reader.read() is None
    writer([Leaving("j-worker-1", "aws", T)], (0, 1))
    got = reader.read()
    assert got is not None and got.ranks == (1,) and got.deadline == T
    assert reader.read() is got, "unchanged: not read again"
    writer([], (0, 2))
    assert not path.exists() and reader.read() is None
    assert NoticeReader(None).read() is None


def test_the_membership_carries_the_leaving_workers_and_the_watch_tells_each_change() -> None:
    status = {
        "currentGeneration": 3,
        "replicas": 2,
        "leavingWorkers": [
            {"pod": "j-worker-1", "reason": "aws", "deadline": "2026-01-01T00:02:00Z"},
            {"pod": "j-worker-4", "reason": "x", "deadline": "not a time"},
        ],
    }
    m = Membership.from_status(status)
    assert m is not None
    assert m.leaving == (
        Leaving("j-worker-1", "aws", T + timedelta(minutes=2)),
        Leaving("j-worker-4", "x", None),
    )
    watch = MembershipWatch(ScriptedEndpoint(OpenWatch([event("ADDED", 1, **status)])))
    try:
        assert watch.read() == m
        seen: list[Membership] = []
        watch.on_change(lambda _m: 1 / 0)  # a failing callback is logged, never raised
        watch.on_change(seen.append)  # registered late: told the latest at once
        assert seen == [m]
    finally:
        watch.close()


def test_each_pod_has_its_own_notice_file() -> None:
    def pod(i: int) -> contract.PodEnv:
        return contract.PodEnv("j", "ns", i, 2, 1, 0, "h")

    assert notice_path(pod(0)) != notice_path(pod(1))
    assert notice_path(pod(0)).name == "torchjob-notice-ns-j-0.json"

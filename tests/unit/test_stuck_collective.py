"""A pod's workers that stay in their collective after a peer of another pod went silent
(``RestorePoints.stuck_for``, which the controller's tick reads to kill them): seen on the real
node, where gloo kept a joiner rank in ``waitSend`` for the whole 300 s collective timeout
although its watchdog had shut its connections down."""

from __future__ import annotations

import time

from torchjob.launch.protocol import SilentPeer
from torchjob.train.progress import ProgressView
from torchjob.train.recovery.survivors import RestorePoints


def silent(rank: int) -> SilentPeer:
    return SilentPeer(rank=rank, silent_s=5.0, by=7, since=time.monotonic() - 5.0)


def test_workers_are_stuck_only_past_the_bound_after_a_remote_peer_went_silent() -> None:
    reported: list[int] = []
    points = RestorePoints(report_silent=lambda rank, _s, _how: reported.append(rank))
    view = ProgressView(enabled=False, total_epochs=None)
    assert points.stuck_for(1e9, 5.0) is None, "no silent peer: never stuck"
    assert points.on_event(silent(3), None, view)
    assert reported == [3]
    assert points.remote_silent is not None
    since, rank = points.remote_silent
    assert rank == 3
    assert points.stuck_for(since + 4.9, 5.0) is None, "a broken collective gets its moment"
    assert points.stuck_for(since + 6.0, 5.0) == 6.0
    # A second silent rank does not move the clock: the first one broke the connections.
    assert points.on_event(silent(4), None, view)
    assert points.remote_silent == (since, 3)


def test_a_pod_that_cannot_report_is_never_taken_for_stuck() -> None:
    """Without KeepSurvivors (no reporter) the group is restarted whole by the operator: this
    pod's driver does not kill its own workers for a peer's silence."""
    points = RestorePoints()
    assert points.on_event(silent(3), None, ProgressView(enabled=False, total_epochs=None))
    assert points.remote_silent is None and points.stuck_for(1e12, 5.0) is None

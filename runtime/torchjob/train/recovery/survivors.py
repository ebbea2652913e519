"""What the controller follows of the in-memory restore point and of silent peers.

The workers hold the last completed step's state in memory once the training function
registered it (``torchjob.train.recovery.restore_point``): their report events say so, and the first
rank of a generation that started from memory says where from. A rank's watchdog reports a
silent peer (``torchjob.launch.heartbeat``); a rank this host runs is then killed, so that
its connections close and the survivors' collectives fail as for any death. A rank on
another pod (KeepSurvivors) is reported to the operator (``recovery.reports.SilentReports``:
``status.silentWorkers``), which takes its pod for lost: nothing in Kubernetes says so
while its node has not noticed (a vanished node, a partition).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torchjob.launch import WorkerGroup
from torchjob.launch.protocol import (
    Dispatcher,
    MirrorFallback,
    Report,
    RestoredFromMemory,
    RestoredFromMirror,
    SilentPeer,
    StoreQuiet,
)
from torchjob.train.progress import ProgressView
from torchjob.train.recovery.reports import HEARTBEAT


@dataclass
class RestorePoints:
    """One generation's view of the restore point and of silent peers."""

    held: bool = False
    """The workers hold a restore point in memory (a report took one, or the generation
    started from one)."""
    restored: RestoredFromMemory | RestoredFromMirror | None = None
    """The restore event of this generation (where its state came from), if any."""
    silenced: set[int] = field(default_factory=set)
    """Ranks killed here because their peers found them silent."""
    report_silent: Callable[[int, float, str], None] | None = None
    """Tells the operator that a rank of another pod is silent (KeepSurvivors pods)."""
    sweep_early: Callable[[], None] | None = None
    """Starts the sweep of the members' hosts ahead, the store being quiet
    (:meth:`SilentReports.sweep_ahead`; KeepSurvivors pods)."""
    remote_silent: tuple[float, int] | None = None
    """When (monotonic) a rank of another pod was first found silent here, and which: this
    pod's workers broke their connections to the group then, and must leave their
    collective within moments (:meth:`stuck_for`)."""
    restore_point_bytes: int = 0

    def stuck_for(self, now: float, after_s: float) -> float | None:
        """Seconds since a rank of another pod was found silent, once more than ``after_s``
        have passed and this pod's workers are still running their task; else None.

        The watchdog shut down the workers' connections to the group when it found the rank
        silent, which fails a collective at once, as a rank's death does. But gloo does not
        always fail a *send* whose connection was shut down: seen on the real node, a joiner
        rank waited out the full collective timeout (300 s) in ``waitSend`` while the other
        survivors waited for it in the next generation's rendezvous. Past ``after_s`` the
        driver takes its workers for stuck (see the controller)."""
        if self.remote_silent is None:
            return None
        waited = now - self.remote_silent[0]
        return waited if waited > after_s else None

    def on_event(self, event: object, group: WorkerGroup | None, view: ProgressView) -> bool:
        """Handle ``event`` if it is about the restore point or a silent peer (True)."""
        return _POINTS(event, self, group, view)


def _report(e: Report, points: RestorePoints, _group: Any, _view: ProgressView) -> bool:
    if e.restore_point:
        points.held = True
        points.restore_point_bytes = e.restore_point_bytes
    return False  # the controller records the report itself


def _from_mirror(
    e: RestoredFromMirror, points: RestorePoints, _group: Any, view: ProgressView
) -> bool:
    points.held = True
    points.restored = e
    view.message(
        f"[torchjob] resumed from the shard mirror in the survivors' memory (report "
        f"{e.index}, {e.old_world} -> {e.world} ranks, "
        f"old rank(s) {', '.join(map(str, e.from_mirror)) or 'none'} from their mirror; "
        f"{e.bytes_moved / 2**20:.1f} MiB moved to rank 0 in "
        f"{e.seconds:.2f}s); storage was not read"
    )
    return True


def _fallback(e: MirrorFallback, _points: RestorePoints, _group: Any, view: ProgressView) -> bool:
    view.message(f"[torchjob] {e.reason}; resuming from the latest committed checkpoint")
    return True


def _from_memory(
    e: RestoredFromMemory, points: RestorePoints, _group: Any, view: ProgressView
) -> bool:
    points.held = True
    points.restored = e
    moved = (
        f"held by every rank, nothing moved, agreed in {e.seconds:.2f}s"
        if e.source_rank < 0
        else f"from rank {e.source_rank} in {e.seconds:.2f}s"
    )
    if e.kept_at is not None:
        view.message(
            f"[torchjob] the survivors went on from their live state at report {e.kept_at} "
            f"(restore point of report {e.index} not loaded, agreed in {e.seconds:.2f}s); "
            "re-formed in place (the training function goes on)"
        )
        return True
    view.message(
        f"[torchjob] resumed from the survivors' memory (report {e.index}, "
        f"{e.bytes / 2**20:.1f} MiB {moved}); storage was not read"
        + ("; re-formed in place (the training function goes on)" if e.in_place else "")
    )
    return True


def _silent(
    e: SilentPeer, points: RestorePoints, group: WorkerGroup | None, view: ProgressView
) -> bool:
    if e.rank in points.silenced:
        return True
    points.silenced.add(e.rank)
    said = f"[torchjob] rank {e.rank} silent for {e.silent_s:.1f}s (no heartbeat, "
    if group is not None and group.kill_rank(e.rank):
        view.message(f"{said}seen by rank {e.by}): killed, the survivors re-form")
    elif points.report_silent is not None:
        # Silent for as long as it has been by now: whether the silence began before or
        # after this pod saw a later generation (SilentReports.moved_on) does not depend on
        # how late the driver read the event.
        points.report_silent(e.rank, time.monotonic() - e.since, HEARTBEAT)
        if points.remote_silent is None:
            points.remote_silent = (time.monotonic(), e.rank)
        view.message(f"{said}seen by rank {e.by}): its pod is reported lost")
    return True


def _quiet(e: StoreQuiet, points: RestorePoints, _group: Any, _view: ProgressView) -> bool:
    if points.sweep_early is not None:
        points.sweep_early()
    return True


def _not_ours(_e: object, *_context: object) -> bool:
    return False


_POINTS = Dispatcher[bool](
    {
        Report: _report,
        RestoredFromMirror: _from_mirror,
        MirrorFallback: _fallback,
        RestoredFromMemory: _from_memory,
        SilentPeer: _silent,
        StoreQuiet: _quiet,
    },
    otherwise=_not_ours,
)
"""What :meth:`RestorePoints.on_event` handles: True when the event is done with."""

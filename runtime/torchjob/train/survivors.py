"""What the controller follows of the in-memory restore point and of silent peers.

The workers hold the last completed step's state in memory once the training function
registered it (``torchjob.train.restore_point``): their report events say so, and the first
rank of a generation that started from memory says where from. A rank's watchdog reports a
silent peer (``torchjob.launch.heartbeat``); a rank this host runs is then killed, so that
its connections close and the survivors' collectives fail as for any death.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchjob.launch import WorkerGroup
from torchjob.train.progress import ProgressView


@dataclass
class RestorePoints:
    """One generation's view of the restore point and of silent peers."""

    held: bool = False
    """The workers hold a restore point in memory (a report took one, or the generation
    started from one)."""
    restored: dict[str, Any] | None = None
    """The ``restored`` event of this generation (where its state came from), if any."""
    silenced: set[int] = field(default_factory=set)
    """Ranks killed here because their peers found them silent."""
    restore_point_bytes: int = 0

    def on_event(
        self, event: dict[str, Any], group: WorkerGroup | None, view: ProgressView
    ) -> bool:
        """Handle ``event`` if it is about the restore point or a silent peer (True)."""
        kind = event.get("type")
        if kind == "report":
            if event.get("restore_point"):
                self.held = True
                self.restore_point_bytes = int(event.get("restore_point_bytes") or 0)
            return False  # the controller records the report itself
        if kind == "restored" and event.get("from") == "mirror":
            self.held = True
            self.restored = dict(event)
            lost = event["from_mirror"]
            view.message(
                f"[torchjob] resumed from the shard mirror in the survivors' memory (report "
                f"{event['index']}, {event['old_world']} -> {event['world']} ranks, "
                f"old rank(s) {', '.join(map(str, lost)) or 'none'} from their mirror; "
                f"{event['bytes_moved'] / 2**20:.1f} MiB moved to rank 0 in "
                f"{event['seconds']:.2f}s); storage was not read"
            )
            return True
        if kind == "mirror_fallback":
            view.message(
                f"[torchjob] {event['reason']}; resuming from the latest committed checkpoint"
            )
            return True
        if kind == "restored":
            self.held = True
            self.restored = dict(event)
            view.message(
                f"[torchjob] resumed from the survivors' memory (report {event['index']}, "
                f"{event['bytes'] / 2**20:.1f} MiB from rank {event['source_rank']} in "
                f"{event['seconds']:.2f}s); storage was not read"
            )
            return True
        if kind == "silent_peer":
            rank = int(event["rank"])
            if group is not None and rank not in self.silenced and group.kill_rank(rank):
                self.silenced.add(rank)
                view.message(
                    f"[torchjob] rank {rank} silent for {event['silent_s']:.1f}s (no heartbeat, "
                    f"seen by rank {event['by']}): killed, the survivors re-form"
                )
            return True
        return False

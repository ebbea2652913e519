"""torchjob.checkpoint: checkpoint storage through fsspec, atomic commit, retention, data position.

One commit protocol (``torchjob.checkpoint.commit``) for whole-object and sharded
checkpoints; one capture and restore of a process's RNG states (``torchjob.checkpoint.rng``).

Used by ``torchjob.train`` on rank 0; usable on its own to inspect a run::

    from torchjob.checkpoint import latest_committed
    ckpt = latest_committed("s3://bucket/runs/my-run")   # or a local path / PVC mount
"""

from torchjob.checkpoint.errors import CheckpointError
from torchjob.checkpoint.manifest import (
    MANIFEST,
    MARKER,
    CommittedCheckpoint,
    checkpoint_dir_name,
    rank_checkpoints,
)
from torchjob.checkpoint.position import DataPosition
from torchjob.checkpoint.remote import Retry
from torchjob.checkpoint.rng import capture_rng, restore_rng
from torchjob.checkpoint.storage import (
    CheckpointStorage,
    committed_at,
    latest_committed,
    write_files,
)

__all__ = [
    "MANIFEST",
    "MARKER",
    "CheckpointError",
    "CheckpointStorage",
    "CommittedCheckpoint",
    "DataPosition",
    "Retry",
    "capture_rng",
    "checkpoint_dir_name",
    "committed_at",
    "latest_committed",
    "rank_checkpoints",
    "restore_rng",
    "write_files",
]

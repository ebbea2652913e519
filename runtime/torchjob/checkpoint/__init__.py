"""torchjob.checkpoint: checkpoint storage through fsspec, atomic commit, retention, data position.

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
from torchjob.checkpoint.storage import CheckpointStorage, latest_committed, write_files

__all__ = [
    "MANIFEST",
    "MARKER",
    "CheckpointError",
    "CheckpointStorage",
    "CommittedCheckpoint",
    "DataPosition",
    "Retry",
    "checkpoint_dir_name",
    "latest_committed",
    "rank_checkpoints",
    "write_files",
]

"""What a committed checkpoint is: its directory name, its manifest and marker files, and how
checkpoints rank for retention (see ``torchjob.checkpoint.commit`` for the commit protocol)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

MANIFEST = "_torchjob_manifest.json"
MARKER = "_COMMITTED"
DIR_RE = re.compile(r"^checkpoint_(\d{6,})$")
RESERVED = {MANIFEST, MARKER}


def checkpoint_dir_name(index: int) -> str:
    return f"checkpoint_{index:06d}"


@dataclass(frozen=True)
class CommittedCheckpoint:
    """A checkpoint whose commit marker is valid."""

    index: int
    path: str
    """Full URL or local path of the checkpoint directory."""
    metrics: dict[str, Any] = field(default_factory=dict)
    data_positions: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Relative path -> {"size", "sha256"}."""
    created_at: float = 0.0
    report: int | None = None
    """The run's report number this checkpoint was taken at (``report()``'s count over every
    generation); None in a manifest written before it was recorded."""


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rank_checkpoints(
    committed: list[CommittedCheckpoint], score_attribute: str | None, score_order: str = "max"
) -> list[CommittedCheckpoint]:
    """Best first: by ``score_attribute`` (checkpoints without it last), else newest first."""
    if score_attribute is None:
        return sorted(committed, key=lambda c: -c.index)
    sign = -1.0 if score_order == "max" else 1.0

    def key(c: CommittedCheckpoint) -> tuple[int, float, int]:
        value = c.metrics.get(score_attribute)
        if not isinstance(value, int | float):
            return (1, 0.0, -c.index)
        return (0, sign * float(value), -c.index)

    return sorted(committed, key=key)


def jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics as JSON can hold them (numpy/torch scalars become floats)."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, bool | int | float | str) or v is None:
            out[str(k)] = v
        elif hasattr(v, "item"):
            try:
                out[str(k)] = v.item()
            except (ValueError, RuntimeError):
                out[str(k)] = str(v)
        else:
            out[str(k)] = str(v)
    return out

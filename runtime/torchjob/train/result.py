"""``Result``: what ``TorchTrainer.fit`` returns (Ray Train's fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torchjob.train.checkpoint import Checkpoint

if TYPE_CHECKING:
    import pandas


@dataclass
class Result:
    """Final metrics, the latest checkpoint, the kept checkpoints and the metrics history."""

    metrics: dict[str, Any] | None
    """The last metrics rank 0 reported."""
    checkpoint: Checkpoint | None
    """The latest committed checkpoint."""
    path: str
    """The run directory (``<storage_path>/<name>``)."""
    error: BaseException | None = None
    metrics_history: list[dict[str, Any]] = field(default_factory=list)
    """Every report of rank 0, in order, across restarts of this ``fit``."""
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(default_factory=list)
    """Kept checkpoints with their metrics, best first (by score when one is configured)."""
    world_sizes: list[int] = field(default_factory=list)
    """World size of each generation this ``fit`` ran (elastic runs change it)."""

    @property
    def metrics_dataframe(self) -> pandas.DataFrame:
        """The metrics history as a pandas DataFrame (pandas is imported on first use)."""
        import pandas

        return pandas.DataFrame(self.metrics_history)

    @property
    def filesystem(self) -> Any:
        return self.checkpoint.filesystem if self.checkpoint else None

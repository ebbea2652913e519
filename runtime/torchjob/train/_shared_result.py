"""The same ``Result`` on every pod: rank 0 shares the run's outcome over the process group.

In a TorchJob only pod 0 holds rank 0, receives its reports and lists the
committed checkpoints; without this, every other pod's ``fit()`` would return
an empty ``Result`` and code after ``fit()`` (``result.checkpoint.as_directory()``)
would fail there. When ``train_func`` returns on every rank, rank 0 gathers the
final metrics, its report history and the committed checkpoints (paths and
metrics) and broadcasts them; each pod's controller builds its ``Result`` from
that. ``Result.checkpoint`` then names the same committed checkpoint on every
pod (in the job's ``spec.checkpoint`` storage, which every pod must reach to read it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchjob.checkpoint import CheckpointStorage, rank_checkpoints

if TYPE_CHECKING:
    from torchjob.train._session import Session
    from torchjob.train._spec import WorkerSpec
    from torchjob.train.result import Result


def summarize(spec: WorkerSpec, session: Session) -> dict[str, Any]:
    """On rank 0: the run's final metrics, history and committed checkpoints (JSON-like)."""
    history = [*spec.history_before, *session.history]
    summary: dict[str, Any] = {
        "metrics": history[-1] if history else None,
        "history": history,
        "latest": None,
        "best": [],
    }
    if spec.storage_url:
        try:
            committed = CheckpointStorage(spec.storage_url).list_committed()
        except Exception:  # the run succeeded: an unreadable listing must not fail it
            committed = []
        if committed:
            summary["latest"] = committed[-1].path
        ranked = rank_checkpoints(committed, spec.score_attribute, spec.score_order)
        summary["best"] = [(c.path, c.metrics) for c in ranked]
    return summary


def share(spec: WorkerSpec, session: Session) -> dict[str, Any] | None:
    """Collective (every rank, after ``train_func`` returned): rank 0's summary, on every rank.

    ``None`` when there is no process group (the training function destroyed it).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    box: list[Any] = [summarize(spec, session) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    shared: dict[str, Any] | None = box[0]
    return shared


def apply(result: Result, shared: dict[str, Any]) -> Result:
    """``result`` (built on a pod without rank 0) with rank 0's outcome filled in."""
    from torchjob.train.checkpoint import Checkpoint

    result.metrics = shared["metrics"]
    result.metrics_history = list(shared["history"])
    result.checkpoint = Checkpoint(shared["latest"]) if shared["latest"] else None
    result.best_checkpoints = [(Checkpoint(path), dict(m)) for path, m in shared["best"]]
    return result

"""``report`` and ``get_checkpoint``: how a training function talks to the run.

``report`` is collective: every rank calls it at the same point. Rank 0 commits
the checkpoint to storage (only rank 0 needs storage access), then all ranks
all-reduce their stop flags, which doubles as the barrier after the commit. If
any rank was asked to stop (SIGTERM, a resize), every rank leaves at this same
report, after the checkpoint is safe.
"""

from __future__ import annotations

from typing import Any

from torchjob.checkpoint import CheckpointStorage
from torchjob.launch import send_event, stop_requested
from torchjob.train import _session
from torchjob.train.checkpoint import Checkpoint


def _agree_to_stop(local_stop: bool) -> bool:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local_stop
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
    flag = torch.tensor([1 if local_stop else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Report ``metrics`` (rank 0's are kept) and optionally a checkpoint (rank 0's is saved)."""
    s = _session.current()
    if s is None:
        raise RuntimeError("torchjob.train.report() must be called inside a training function")
    s.reports += 1
    s.last_metrics = dict(metrics)
    s.history.append(dict(metrics))
    committed = None
    if s.world_rank == 0 and checkpoint is not None and s.storage_url:
        storage = CheckpointStorage(s.storage_url)
        with checkpoint.as_directory() as local_dir:
            committed = storage.commit(
                local_dir, metrics=metrics, data_positions=s.data_positions()
            )
        storage.apply_retention(
            s.num_to_keep, score_attribute=s.score_attribute, score_order=s.score_order
        )
    if s.world_rank == 0:
        send_event(
            {
                "type": "report",
                "metrics": dict(metrics),
                "checkpoint_path": committed.path if committed else None,
                "checkpoint_index": committed.index if committed else None,
                "world_size": s.world_size,
                "generation": s.generation,
                "report": s.reports,
            }
        )
    stop = _agree_to_stop(stop_requested())
    if stop:
        s.stopped_at_report = s.reports
        raise _session.StopTraining()


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from (latest committed), on every rank; ``None`` on a fresh start."""
    s = _session.current()
    return s.checkpoint if s is not None else None


def should_stop() -> bool:
    """Collective: True on every rank once any rank was asked to stop. For loops that report rarely."""
    return _agree_to_stop(stop_requested())

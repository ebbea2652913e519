"""Re-forming an NCCL group in place after a lost peer (issue 26, item 4). UNVERIFIED on GPUs:
off unless ``TORCHJOB_NCCL_REFORM=1``; see docs/runtime.md (GPU) for what runs by default.

A gloo group learns of a dead peer at once (its TCP connections close) and a survivor can
leave it with ``destroy_process_group``. An NCCL group does not: the survivors' kernels wait
on the dead peer (over NVLink or shared memory nothing closes) until the collective's
timeout, and destroying a communicator whose peer is gone may hang. So, for an NCCL group:

* every formed rank runs an ``AbortListener`` (``torchjob.launch.abort``, as a gloo rank does)
  whose action aborts this process's communicators (:func:`abort_group`:
  ``_abort_process_group``, ``ncclCommAbort``, not collective) when the generation's store
  holds the key ``abort`` or stops answering (rank 0, which serves it, is gone). The aborted
  collective raises ("communicator was aborted": a peer failure), the rank leaves the group
  and answers the driver;
* the driver sets that key when it sees a worker die (``abort.request_abort``);
* the survivors keep their processes, their CUDA context and what is on the device (the model,
  the optimizer state); a replacement process takes the lost rank's slot (its rank, its local
  rank and so its GPU: ``WorkerGroup.heal`` keeps the slots of an NCCL group), and the next
  generation forms a new communicator on the next generation's store.

The workers run with ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` unless it is set: its default tears
the process down on a communicator error, which would kill the survivors this keeps.
"""

from __future__ import annotations

from torchjob.launch.settings import ENV_NCCL_REFORM, RuntimeSettings

__all__ = ["ENV_NCCL_REFORM", "abort_group", "enabled", "in_place", "worker_env"]


def enabled(settings: RuntimeSettings) -> bool:
    """``TORCHJOB_NCCL_REFORM=1``: NCCL groups re-form in place (unverified; off by default)."""
    return settings.nccl_reform


def in_place(backend: str, settings: RuntimeSettings) -> bool:
    """Whether a group of ``backend`` broken by a lost peer re-forms in its survivors: gloo;
    NCCL only with ``TORCHJOB_NCCL_REFORM=1`` (unverified on GPUs)."""
    return backend == "gloo" or (backend == "nccl" and enabled(settings))


def worker_env(settings: RuntimeSettings) -> dict[str, str]:
    """What an NCCL worker that may be kept after a peer's loss needs in its environment."""
    if settings.nccl_async_error_handling is not None:
        return {}
    return {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


def abort_group() -> None:
    """Leave every process group of this process without a collective: abort the
    communicators (``_abort_process_group`` where this torch has it, else destroy)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is not None:
        abort()
    else:
        dist.destroy_process_group()

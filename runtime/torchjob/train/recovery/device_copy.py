"""The restore point's copies of GPU tensors: into page-locked host memory, on a stream of
their own, so that they overlap the next step's kernels instead of queueing with them.

A device-to-host copy into ordinary (pageable) memory goes through a staging buffer at a
fraction of the link's speed, and holds the host until it is done. Into page-locked
memory it is one DMA at the link's speed, and it can be asynchronous. On the device's
current stream (what ``tensor.copy_`` uses, from any thread) it still waits for every
kernel queued before it and holds up every kernel queued after it: the next step's forward
would wait for the whole state to reach the host. So:

* :func:`pin` page-locks a restore point's arena (``shm_keep.Arena``: one block for every
  tensor of the state, exact in size; the caching host allocator behind
  ``pin_memory=True`` would round each buffer up to a power of two) with
  ``cudaHostRegister``, as ``torch.distributed.checkpoint``'s stager does, and unregisters
  it when the arena goes;
* :class:`SideCopies` queues the copies of one restore point on a side stream per device,
  after the work queued so far on the current stream (the step that produced the state),
  and records an event per device when they are all queued; the next forward runs beside
  them on the copy engine; :func:`wait` blocks the host (a blocking-sync event: it sleeps,
  it does not spin) until they are done: the optimizers' step pre-hook waits there, so no
  step writes a tensor that is being copied (``host_copy``).

Nothing here runs without a CUDA tensor in the state: a CPU-only job never initializes CUDA.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchjob.train.recovery.shm_keep import Arena


def is_cuda(t: Any) -> bool:
    return bool(t.device.type == "cuda")


def holds_cuda(tree: Any) -> bool:
    """Whether ``tree`` (nested dicts, lists, tuples) holds a plain CUDA tensor."""
    import torch

    if isinstance(tree, torch.Tensor):
        return is_cuda(tree)
    if isinstance(tree, dict):
        return any(holds_cuda(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return any(holds_cuda(v) for v in tree)
    return False


def _unregister(data: Any) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(data.data_ptr())  # type: ignore[no-untyped-call]


def pin(arena: Arena) -> bool:
    """Page-lock ``arena.data`` (a CPU ``uint8`` tensor) until ``arena`` is collected. False
    where CUDA refuses (the memory stays pageable: the copies are then slower, not wrong)."""
    import torch

    if arena.pinned:
        return True
    data = arena.data
    if data.numel() == 0:
        return False
    if int(torch.cuda.cudart().cudaHostRegister(data.data_ptr(), data.numel(), 0)) != 0:  # type: ignore[no-untyped-call]
        return False
    arena.pinned = True
    # The finalizer holds ``data``: its pages are unregistered before they can be freed.
    weakref.finalize(arena, _unregister, data)
    return True


_STREAMS: dict[int, Any] = {}
"""One side stream per device, for the life of the process."""


def _side(device: Any) -> Any:
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    stream = _STREAMS.get(index)
    if stream is None:
        stream = _STREAMS[index] = torch.cuda.Stream(device=index)  # type: ignore[no-untyped-call]
    return stream


class SideCopies:
    """The device-to-host copies of one restore point, queued on side streams."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}

    def put(self, dst: Any, src: Any) -> None:
        """Queue ``dst.copy_(src)`` (``src`` on a GPU, ``dst`` in host memory) after what the
        current stream of ``src``'s device has queued so far."""
        import torch

        stream = self._streams.get(src.device.index)
        if stream is None:
            stream = _side(src.device)
            stream.wait_stream(torch.cuda.current_stream(src.device))
            self._streams[src.device.index] = stream
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)
        src.record_stream(stream)  # the caching allocator keeps it until the copy is done

    def __bool__(self) -> bool:
        return bool(self._streams)

    def record(self) -> list[Any]:
        """An event per side stream used, after its last copy (none when nothing was queued)."""
        import torch

        events = []
        for stream in self._streams.values():
            event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            event.record(stream)
            events.append(event)
        self._streams.clear()
        return events


def wait(events: list[Any]) -> None:
    """Block the host until every event's copies are done."""
    for event in events:
        event.synchronize()

"""A restore point between two ranks: its header and its arena, point to point.

``restore_point.agree`` encodes a snapshot as a header (bytes) and its arena (a ``uint8``
tensor) and sends it only to the ranks that lack it (:func:`send`), each of which receives
it from one holder (:func:`receive`): sizes first, then the two tensors, no pickling of the
tensors' bytes. NCCL moves only device tensors, so under NCCL they go through the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _device(dist: Any) -> Any:
    import torch

    return (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )


def send(header: bytes, body: Any, to: Sequence[int], dist: Any) -> None:
    """Send ``header`` and ``body`` (a ``uint8`` tensor) to each rank of ``to`` in turn."""
    import torch

    on = _device(dist)
    sizes = torch.tensor([len(header), body.numel()], dtype=torch.int64, device=on)
    head = torch.frombuffer(bytearray(header), dtype=torch.uint8).to(on or "cpu")
    data = body.to(on) if on is not None else body
    for dst in to:
        for t in (sizes, head, data):
            dist.send(t, dst=dst)


def receive(src: int, dist: Any) -> tuple[bytes, Any]:
    """What :func:`send` sent from rank ``src``: the header and the body (on the CPU)."""
    import torch

    on = _device(dist)
    sizes = torch.zeros(2, dtype=torch.int64, device=on)
    dist.recv(sizes, src=src)
    head = torch.empty(int(sizes[0].item()), dtype=torch.uint8, device=on)
    data = torch.empty(int(sizes[1].item()), dtype=torch.uint8, device=on)
    dist.recv(head, src=src)
    dist.recv(data, src=src)
    return head.cpu().numpy().tobytes(), data.cpu()

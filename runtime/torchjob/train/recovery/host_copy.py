"""Copying a state into host memory: at once, or overlapped with the next step.

:func:`copy_tree` is the restore point's copy (``recovery.restore_point``): nested dicts,
lists, tuples, tensors and plain values, written into the previous copy's CPU tensors where
the shapes match. Each tensor goes through a ``put(dst, src)``; :func:`now` copies at once.

**Overlap** (CheckFreq's pipelining, FAST '21). The tensors an optimizer owns, its
parameters and its state (Adam's moments), change only in its ``step()``. So their copy
need not hold up the loop: :class:`Overlap` copies everything else at once (buffers, which a
forward may change: BatchNorm's statistics, DDP's buffer broadcast; and the plain values)
and hands the optimizers' tensors to a thread, which copies them while the next step's
forward and backward run. Each registered optimizer waits for that thread in a step
pre-hook (:func:`hook`), so no step changes a tensor while it is being copied, and whoever
reads the restore point waits for it too (:func:`settle`). The loop pays the copies' start
and whatever of them the next forward and backward did not cover (:func:`waited`), and, for
the copies of CPU tensors, the CPU time the thread spent (:func:`cpu_beside`: beside a step
on the CPU it takes the step's cores), which is what ``recovery.cadence`` then budgets. A process lost during a copy loses only its own
copy; a survivor's thread finishes its copy whatever its peers do.

On a GPU the optimizers' tensors are not handed to the thread: their copies are queued at
once on a side stream into page-locked memory (``recovery.device_copy``), and the thread
waits for their event; a copy on the current stream would hold up the next step's kernels.

What it assumes: the optimizers' tensors change only in their ``step()``. A loop that
changes parameters in place elsewhere between a report and the next step (weight clipping
before the step, ``nn.Embedding(max_norm=...)``, which renormalizes rows in the forward)
turns it off: ``TORCHJOB_RESTORE_POINT_OVERLAP=0``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchjob.train.recovery import device_copy

Alloc = Callable[[Any], Any]
"""A new CPU tensor of the given tensor's shape and dtype, for a copy of it."""
Put = Callable[[Any, Any], None]
"""Copy ``src`` into ``dst`` (now, or later: :class:`Overlap`)."""


def private(t: Any) -> Any:
    """A CPU tensor for a copy of ``t`` (page-locked for a GPU tensor, so that its copy is one
    DMA: the caching host allocator's, where a restore point's arena is not used)."""
    import torch

    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=device_copy.is_cuda(t))


def now(dst: Any, src: Any) -> None:
    dst.copy_(src)


def _copy_later(dst: Any, src: Any) -> None:
    """One tensor's copy on the overlapped copy's thread."""
    dst.copy_(src)


def copy_tree(src: Any, old: Any, alloc: Alloc = private, put: Put = now) -> tuple[Any, int]:
    """A CPU copy of ``src`` (nested dicts, lists, tuples, tensors, plain values), written
    into ``old``'s tensors where their shapes match, else into tensors from ``alloc``;
    returns it and its tensor bytes. Each tensor's bytes are moved by ``put``."""
    import torch

    if isinstance(src, torch.Tensor):
        src = src.detach()
        if src.layout is not torch.strided or type(src) is not torch.Tensor:
            # A DTensor or another subclass: a full CPU copy (FSDP: the shard mirror's).
            t = src.to("cpu", copy=True)
            return t, t.numel() * t.element_size()
        if (
            isinstance(old, torch.Tensor)
            and old.shape == src.shape
            and old.dtype == src.dtype
            and old.device.type == "cpu"
        ):
            put(old, src)
            return old, old.numel() * old.element_size()
        t = alloc(src)
        put(t, src)
        return t, t.numel() * t.element_size()
    if isinstance(src, Mapping):
        prev = old if isinstance(old, Mapping) else {}
        out: dict[Any, Any] = {}
        total = 0
        for k, v in src.items():
            out[k], n = copy_tree(v, prev.get(k), alloc, put)
            total += n
        return out, total
    if isinstance(src, (list, tuple)):
        prev_seq = old if isinstance(old, (list, tuple)) and len(old) == len(src) else None
        items = []
        total = 0
        for i, v in enumerate(src):
            c, n = copy_tree(v, prev_seq[i] if prev_seq is not None else None, alloc, put)
            items.append(c)
            total += n
        return (type(src)(items) if isinstance(src, tuple) else items), total
    import copy

    return copy.deepcopy(src), 0


def optimizers(registered: Mapping[str, Any]) -> list[Any]:
    """The registered entries that are torch optimizers."""
    import torch

    return [v for v in registered.values() if isinstance(v, torch.optim.Optimizer)]


def _storage(t: Any) -> int:
    return int(t.untyped_storage().data_ptr()) if t.numel() else 0


def owned(opts: Iterable[Any]) -> set[int]:
    """The storages of every tensor the optimizers ``opts`` own: their parameters and the
    tensors of their state."""
    import torch

    found: set[int] = set()
    for opt in opts:
        for group in opt.param_groups:
            found.update(_storage(p) for p in group["params"])
        for per_param in opt.state.values():
            for v in per_param.values() if isinstance(per_param, Mapping) else ():
                if isinstance(v, torch.Tensor):
                    found.add(_storage(v))
    found.discard(0)
    return found


class Overlap:
    """One restore point's copy: ``put`` copies a tensor the optimizers do not own at once
    and keeps the others for :meth:`start`'s thread; a GPU tensor the optimizers own is
    queued at once on a side stream (``recovery.device_copy``), and the thread waits for it."""

    def __init__(self, owned_storages: set[int]) -> None:
        self.owned = owned_storages
        self.later: list[tuple[Any, Any]] = []
        self.side = device_copy.SideCopies()

    def put(self, dst: Any, src: Any) -> None:
        if _storage(src) not in self.owned:
            dst.copy_(src)
        elif device_copy.is_cuda(src):
            self.side.put(dst, src)
        else:
            self.later.append((dst, src))

    @property
    def pending(self) -> bool:
        """Some copies are left for :meth:`start`."""
        return bool(self.later) or bool(self.side)

    def clear(self) -> None:
        """Forget the copies left (their buffers are dropped): the queued GPU ones finish first."""
        self.later.clear()
        device_copy.wait(self.side.record())

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Copy the kept tensors on a thread, then run ``then`` (a shared-memory commit)."""
        settle()
        events = self.side.record()
        if not self.later and not events and then is None:
            return
        pairs, error = self.later, _FLIGHT.error

        def run() -> None:
            try:
                t0 = time.thread_time()
                for dst, src in pairs:
                    _copy_later(dst, src)
                busy = time.thread_time() - t0
                device_copy.wait(events)  # (a GPU's copies: waited for, not counted)
                if then is not None:
                    t1 = time.thread_time()
                    then()
                    busy += time.thread_time() - t1
                _FLIGHT.busy_s += busy
            except BaseException as e:  # said where the restore point is next read
                error.append(e)

        thread = threading.Thread(target=run, name="torchjob-restore-point", daemon=True)
        _FLIGHT.thread = thread
        thread.start()


@dataclass
class _Flight:
    """This process's copy in flight (one at a time), what it raised, the loop's waits."""

    thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)
    waited_s: float = 0.0
    busy_s: float = 0.0
    """CPU seconds the copies' thread spent copying (:func:`cpu_beside`)."""


_FLIGHT = _Flight()


def settle() -> None:
    """Wait for the copy in flight, if any (the wait is added to :func:`waited`). Raises
    what its thread raised."""
    thread = _FLIGHT.thread
    if thread is None:
        return
    t0 = time.monotonic()
    thread.join()
    _FLIGHT.thread = None
    _FLIGHT.waited_s += time.monotonic() - t0
    if _FLIGHT.error:
        e = _FLIGHT.error.pop()
        _FLIGHT.error.clear()
        raise RuntimeError(f"the restore point's copy failed: {e}") from e


def waited() -> float:
    """The seconds this process waited for copies in flight since it last asked (in the
    optimizers' steps, or at the next report where no step came between)."""
    w, _FLIGHT.waited_s = _FLIGHT.waited_s, 0.0
    return w


def cpu_beside() -> float:
    """The CPU seconds the copies' thread spent copying host tensors since this was last
    asked (a GPU's side-stream copies add none). Beside a step that trains on the CPU they
    are not free: the step's own threads had those cores, and on the fleet bench (8 workers
    on 2 cores) the loop waited 2-5 ms for each 252 MiB copy while its steps ran 4.8-8.3 %
    slower than without restore points (bench/results/2026-12-06p). ``recovery.cadence``
    counts them as part of what a copy costs."""
    busy, _FLIGHT.busy_s = _FLIGHT.busy_s, 0.0
    return busy


_HOOKED: weakref.WeakSet[Any] = weakref.WeakSet()


def _before_step(_opt: Any, _args: Any, _kwargs: Any) -> None:
    settle()


def hook(opts: Iterable[Any]) -> None:
    """Make each optimizer's ``step()`` wait for the copy in flight (once per optimizer)."""
    for opt in opts:
        if opt not in _HOOKED:
            opt.register_step_pre_hook(_before_step)
            _HOOKED.add(opt)

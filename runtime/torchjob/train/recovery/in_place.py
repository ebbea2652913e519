"""Re-forming a DDP group in place: the survivors of a lost rank go on inside the training
function, which is not run again (``register_state(state, in_place=True)``).

Without it, a lost peer fails the survivors' collective, the training function raises, and
the next generation runs it again: the model is built again, DDP constructed, the restore
point loaded (1.0-1.4 s of each shrink for 256 MiB on the fleet bench, bench/results/
2026-12-04a). In place:

* DDP's gradient all-reduce goes through a comm hook (:func:`install`) that, when the
  all-reduce fails because a peer is gone, marks the group broken, shuts this rank's
  connections (so ranks two hops away in the ring learn it too) and hands back the local
  gradients: ``backward()`` returns, and the step the loop then takes is rolled back below;
* ``should_stop()`` and ``report()`` look at the mark first, and a peer failure of their own
  collective counts the same: the worker *parks* there (``WorkerProcess.park``): it leaves
  the group, tells the driver the task failed as any survivor does, and waits, inside the
  call, for the driver's next commands. The driver's decision is unchanged (the same
  generations, the same counters);
* when the next generation's task arrives, every rank says whether it is parked, in the
  gather that agrees on the restore point (``restore_point.agree``). All parked (a shrink):
  the restore point is loaded into the registered objects, DDP moves to the new group
  (``DistributedDataParallel._update_process_group``), the session takes the new
  generation's ranks and numbers, and the call returns into the loop: ``should_stop()``
  says False and the next ``report()`` is void (its metrics belong to the step rolled back);
  a ``report()`` that parked returns and does not count. Any rank new to the group (a
  replacement that must run the training function and construct DDP) makes every parked
  rank give way: its task ends and the new one runs afresh, as without ``in_place``, with
  the restore point already agreed.

What the loop must do: read its counters from the registered state each step (they are
rolled back with it), and take its world size and rank from ``get_context()`` when it uses
them. A prepared loader's epoch in progress goes on where it was on each survivor: the
batches of the steps rolled back and the lost rank's rest of that epoch are not seen again
in it. gloo only (an NCCL group's failed collective is not a recoverable error in the
process); elsewhere ``in_place`` is ignored with a warning.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from torchjob.train.recovery import restore_point
from torchjob.train.recovery.restore_point import Restored

_ATTR = "_torchjob_in_place"


class _Mark:
    """This process's broken-group mark: set from a gloo thread, read by the loop."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None

    def set(self, exc: BaseException) -> None:
        if not self.event.is_set():
            self.error = exc
            self.event.set()
            from torchjob.launch import worker

            worker.current().break_group()  # the ring's farther ranks fail now, not at a timeout

    def clear(self) -> None:
        self.error = None
        self.event.clear()


_MARK = _Mark()


def broken() -> BaseException | None:
    """The peer failure DDP's all-reduce met since the group formed, or None."""
    return _MARK.error if _MARK.event.is_set() else None


def reset() -> None:
    """A new group: nothing is broken."""
    _MARK.clear()


def ddp_models(registered: MutableMapping[str, Any]) -> list[Any]:
    """The DDP-wrapped models among the registered entries."""
    from torch.nn.parallel import DistributedDataParallel

    return [v for v in registered.values() if isinstance(v, DistributedDataParallel)]


def supported() -> str | None:
    """Why the group cannot re-form in place here (None: it can)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return "no process group"
    if dist.get_backend() != "gloo":
        return f"the {dist.get_backend()} backend (gloo only)"
    return None


def install(registered: MutableMapping[str, Any]) -> bool:
    """Route every registered DDP model's gradient all-reduce through :func:`_hook`. False
    (after a warning) where in-place re-formation is not supported here."""
    why = supported()
    if why is not None:
        print(f"[torchjob] register_state(in_place=True) is ignored: {why}", file=sys.stderr)
        return False
    for ddp in ddp_models(registered):
        if getattr(ddp, _ATTR, False):
            continue
        try:
            ddp.register_comm_hook(ddp, _hook)
        except RuntimeError as exc:
            raise ValueError(
                "register_state(in_place=True) routes DDP's gradient all-reduce through "
                f"torchjob's comm hook, and this model has one already: {exc}"
            ) from exc
        setattr(ddp, _ATTR, True)
    return True


def _hook(ddp: Any, bucket: Any) -> Any:
    """DDP's default all-reduce (the mean over the group), except that a peer's loss marks
    the group broken and leaves the local gradients, instead of failing ``backward()``."""
    import torch
    import torch.distributed as dist

    from torchjob.launch.errors import classify_failure

    buf = bucket.buffer()
    if _MARK.event.is_set():
        return _done(buf)
    group = ddp.process_group
    try:
        buf.mul_(1.0 / group.size())  # as the reducer scales without a hook: the same bits
        work = dist.all_reduce(buf, group=group, async_op=True)
        assert work is not None
        fut = work.get_future()
    except Exception as exc:  # the group was left under it (the watchdog broke it)
        if classify_failure(exc) == "user":
            raise
        _MARK.set(exc)
        return _done(buf)

    def reduced(f: torch.futures.Future[Any]) -> Any:
        try:
            return f.value()[0]
        except Exception as exc:
            if classify_failure(exc) == "user":
                raise
            _MARK.set(exc)
            return buf

    return fut.then(reduced)


# DDP checks a hook's annotations against its own types when they are there; these are
# strings (``from __future__ import annotations``).
_hook.__annotations__ = {}


def _done(buf: Any) -> Any:
    import torch

    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(buf)
    return fut


_GAVE_WAY: list[tuple[Restored | None] | None] = [None]
"""The agreement a parked task made before it gave way (:func:`agree_parked`): the task run
afresh in the same generation takes it instead of agreeing again (its peers agreed once)."""


def agree(run: str, rank: int, world_size: int) -> Restored | None:
    """``restore_point.agree`` at a generation's start, unless a parked task of this process
    already agreed in this generation and gave way (then that agreement)."""
    gave_way, _GAVE_WAY[0] = _GAVE_WAY[0], None
    if gave_way is not None:
        return gave_way[0]
    return restore_point.agree(run, rank, world_size)


@dataclass(frozen=True)
class Agreed:
    """What the ranks of a new group agreed when this one's training function was parked."""

    restored: Restored | None
    everyone: bool
    """Every rank's function is parked: the group goes on in place."""
    kept_at: int | None
    """Every rank parked after a whole step at this report count (their all-reduce of it
    done, each holding the same state): the live state is kept, nothing rolls back."""


def agree_parked(run: str, rank: int, world_size: int, whole_at: int | None) -> Agreed:
    """The agreement of a parked task (``whole_at``: the report count it parked at after a
    whole step, None after a step the loss broke). When not every rank is parked, the task
    gives way and the one run afresh takes this agreement (:func:`agree`)."""
    mark = -1 if whole_at is None else whole_at
    restored, notes = restore_point.agree_noted(run, rank, world_size, mark)
    everyone = all(n is not None for n in notes)
    kept = everyone and len(set(notes)) == 1 and notes[0] >= 0
    if not everyone or restored is None:
        _GAVE_WAY[0] = (restored,)
    return Agreed(restored, everyone, notes[0] if kept else None)


def parked(s: Any, exc: BaseException | None, whole_at: int | None = None) -> bool:
    """Where the loop re-forms in place: ``exc`` is a peer's loss (DDP's all-reduce met it,
    or the caller's own collective), and the training function's session ``s`` registered
    its state ``in_place``. Then this rank parks until the next generation and returns True
    inside it, rolled back to the restore point the group agreed (or, where every rank
    parked after the same whole step, ``whole_at``, with its live state kept:
    ``s.rolled_back`` says which); or its task gives way to a fresh run
    (``WorkerProcess.park``) and this never returns."""
    if exc is None or not s.in_place:
        return False
    from torchjob.launch import worker
    from torchjob.launch.errors import classify_failure

    if classify_failure(exc) != "peer" or s.resume is None:
        return False
    s.parked_whole_at = whole_at
    worker.current().park(exc, s.resume)
    return True


def regroup(registered: MutableMapping[str, Any]) -> None:
    """After the group re-formed under the loop: every registered DDP model all-reduces in
    the new default group (its buckets are rebuilt at its next backward, on every rank)."""
    import torch.distributed as dist

    for ddp in ddp_models(registered):
        ddp._update_process_group(dist.group.WORLD)
    reset()


__all__ = [
    "agree",
    "agree_parked",
    "broken",
    "ddp_models",
    "install",
    "parked",
    "regroup",
    "reset",
    "supported",
]

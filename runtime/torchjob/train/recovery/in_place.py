"""Re-forming a DDP group in place: the survivors of a lost rank go on inside the training
function, which is not run again (``register_state(state, in_place=True)``); so do the
members of a group that grows, and a replacement joins them there.

Without it, a lost peer fails the survivors' collective, the training function raises, and
the next generation runs it again: the model is built again, DDP constructed, the restore
point loaded (1.0-1.4 s of each shrink for 256 MiB on the fleet bench, bench/results/
2026-12-04a). In place:

* DDP's gradient all-reduce goes through a comm hook (:func:`install`) that, when the
  all-reduce fails because a peer is gone, marks the group broken, shuts this rank's
  connections (so ranks two hops away in the ring learn it too) and hands back the local
  gradients: ``backward()`` returns, and the optimizer step the loop then takes does
  nothing (``step_undo``), what else it moved being put back at the park: the live state
  is the last report's again, and the loop does the step again (where an optimizer step
  went through since that report, the step is rolled back to the restore point instead);
* ``should_stop()`` and ``report()`` look at the mark first, and a peer failure of their own
  collective counts the same: the worker *parks* there (``WorkerProcess.park``): it leaves
  the group, tells the driver the task failed as any survivor does, and waits, inside the
  call, for the driver's next commands. The driver's decision is unchanged (the same
  generations, the same counters);
* when the next generation's task arrives, every rank says whether it is parked, in the
  gather that agrees on the restore point (``restore_point.agree``). All parked (a shrink):
  their live state is kept where every rank parked at the same report (the broken step
  undone) or after the same whole step, else the restore point is loaded into the
  registered objects; DDP moves to the new group
  (``DistributedDataParallel._update_process_group``), the session takes the new
  generation's ranks and numbers, and the call returns into the loop: ``should_stop()``
  says False and the next ``report()`` is void (its metrics belong to the step rolled back);
  a ``report()`` that parked returns and does not count;
* a generation that adds or drops a pod (a grow; a hand-over where no rank is being stopped)
  ends the group at a report (``_report._agree``, its restore point taken there): each rank
  parks at the end of that report (:func:`parks_at_regroup`), its task answered as a stop, and goes on
  from it in the next generation with its live state;
* a rank new to the group (a replacement, a grow's newcomer), or any rank whose function must
  run afresh, runs the training function from its start and *joins* the parked ones
  (:func:`decide`): the restore point comes to it in the agreement, ``prepare_model`` builds
  its DDP without a collective (``_ddp.wrap``), and ``register_state`` loads the restore point
  and lays out its gradient buckets with the parked ranks' (:func:`sync_buckets`, collective);
  the parked ranks keep their live state where they parked at that restore point, else roll
  back to it. Where a parked rank's DDP models are not all ``prepare_model``'s (a joiner's
  would broadcast at construction, and its parked peers would not), every parked rank gives
  way: its task ends and the new one runs afresh, with the restore point already agreed.

What the loop must do: read its counters from the registered state each step (they are
rolled back with it), and take its world size and rank from ``get_context()`` when it uses
them. A prepared loader's epoch in progress goes on as it was sharded on each parked rank,
where it was: the batches of the steps rolled back and the lost rank's rest of that epoch
are not seen again in it; a joiner's starts at the restore point's position at the new
world size, so some of that epoch's batches may be seen twice. The next epoch is sharded for
the new group (``PreparedDataLoader.reshard``). gloo only (an NCCL group's failed collective
is not a recoverable error in the process); elsewhere ``in_place`` is ignored with a
warning.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from torchjob.train.recovery import restore_point, step_undo
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
    """A new group: nothing is broken, and no step to undo (``step_undo``)."""
    _MARK.clear()
    step_undo.forget()


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
    step_undo.watch(registered, broken)  # a step after the loss does nothing
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

_JOINING: list[bool] = [False]
"""This process runs the training function afresh into a group whose other ranks go on in
place (:func:`agree`): its DDP is built without a collective (``_ddp.wrap``) and its buckets
are laid out with theirs at ``register_state`` (:func:`sync_buckets`)."""


@dataclass(frozen=True)
class Parked:
    """A parked rank's note in the agreement at the next generation's start (a rank that runs
    the training function afresh notes None)."""

    mark: int
    """The report count it parked at (-1: after a step the loss broke)."""
    exact: bool
    """Its live state is the restore point of report ``mark`` (it parked at the end of a
    regroup's report, that report's restore point taken); else, with ``mark`` >= 0, the
    whole step after report ``mark``."""
    joinable: bool
    """A rank run afresh can join it in place: every DDP model of its registered state was
    built by ``prepare_model`` (which builds a joiner's without a collective) and re-forms
    its buckets (:func:`joinable`)."""
    undone: bool = False
    """It parked after a step the loss broke, and that step was undone (``step_undo``): its
    live state is that of report ``mark`` (``exact``), and the loop does the step again."""


def decide(notes: list[Any], index: int | None) -> tuple[bool, int | None]:
    """Pure: (whether the parked ranks go on in place, the report count whose live state they
    keep, else None: roll back to the restore point), from every rank's note and the agreed
    restore point's index (None: no rank holds one, nothing goes on in place).

    All parked: in place; kept where each parked at the same place after a whole step. Some
    run afresh (a replacement, a newcomer of a grow): the parked go on in place where each is
    joinable, rolled back to the restore point the fresh ranks load unless each parked
    exactly at it."""
    parked = [n for n in notes if isinstance(n, Parked)]
    if index is None or not parked:
        return False, None
    fresh = len(parked) < len(notes)
    if fresh and not all(n.joinable for n in parked):
        return False, None
    places = {(n.mark, n.exact) for n in parked}
    mark, exact = next(iter(places))
    if len(places) == 1 and mark >= 0 and (not fresh or (exact and mark == index)):
        return True, mark
    return True, None


def fresh_at(notes: list[Any], indices: list[int]) -> int | None:
    """Pure: the report whose restore point the parked ranks take at the agreement, before
    a rank run afresh receives it, or None. Where every parked rank is joinable and its live
    state is exactly that of the same report (its broken step undone, ``step_undo``), newer
    than any restore point held, the rank that joins gets that state (one copy on each
    parked rank) instead of every parked rank rolling back to an older one."""
    parked = [n for n in notes if isinstance(n, Parked)]
    if not parked or len(parked) == len(notes) or not all(n.joinable for n in parked):
        return None
    places = {(n.mark, n.exact) for n in parked}
    if len(places) != 1:
        return None
    mark, exact = next(iter(places))
    return mark if exact and mark > max(indices) else None


def agree(run: str, rank: int, world_size: int) -> Restored | None:
    """``restore_point.agree`` at a generation's start, unless a parked task of this process
    already agreed in this generation and gave way (then that agreement). Where the other
    ranks go on in place, this one joins them (:func:`joining`)."""
    gave_way, _GAVE_WAY[0] = _GAVE_WAY[0], None
    _JOINING[0] = False
    if gave_way is not None:
        return gave_way[0]
    restored, notes = restore_point.agree_noted(run, rank, world_size, fresh=fresh_at)
    _JOINING[0] = decide(notes, restored.snapshot.index if restored else None)[0]
    return restored


def joining() -> bool:
    """This process's training function joins ranks that go on in place (:data:`_JOINING`)."""
    return _JOINING[0]


@dataclass(frozen=True)
class Agreed:
    """What the ranks of a new group agreed when this one's training function was parked."""

    restored: Restored | None
    joined: bool
    """A rank runs the function afresh and joins the parked ones (its note is None)."""
    stays: bool
    """This rank's function goes on in place (:func:`decide`); else it gives way."""
    kept_at: int | None
    """Its live state is kept, numbered from this report count; None: rolled back to the
    restore point."""


def agree_parked(
    run: str, rank: int, world_size: int, note: Parked, retake: Callable[[int], object]
) -> Agreed:
    """The agreement of a parked task. Where it does not go on in place, the task gives way
    and the one run afresh takes this agreement (:func:`agree`). ``retake(index)`` takes the
    restore point of the live state now (:func:`fresh_at`)."""
    restored, notes = restore_point.agree_noted(run, rank, world_size, note, fresh_at, retake)
    stays, kept_at = decide(notes, restored.snapshot.index if restored else None)
    if not stays:
        _GAVE_WAY[0] = (restored,)
    return Agreed(restored, any(n is None for n in notes), stays, kept_at)


def joinable(registered: MutableMapping[str, Any], wrapped: list[Any]) -> bool:
    """Whether a rank run afresh can join this one in place: its registered DDP models are
    exactly those ``prepare_model`` built (``wrapped``: a joiner builds the same without a
    collective), none with a static graph, and this torch can lay out their buckets anew
    (:func:`sync_buckets`)."""
    ddps = ddp_models(registered)
    if not ddps or len(ddps) != len(wrapped) or not all(any(d is w for w in wrapped) for d in ddps):
        return False
    return all(
        not getattr(d, "static_graph", False) and hasattr(d.reducer, "_push_all_rebuilt_params")
        for d in ddps
    )


def sync_buckets(registered: MutableMapping[str, Any]) -> None:
    """Collective, where a group goes on in place with a rank run afresh: every rank lays out
    its DDP models' gradient buckets alike. A survivor's buckets are those its group rebuilt
    in the order its gradients came; a joiner's, those of DDP's constructor; an all-reduce of
    unlike buckets mixes gradients. Each rank rebuilds them in the parameters' order, rank
    0's layout broadcast (the reducer's own rebuild), then forgets that it rebuilt them, so
    that the first step's gradients are laid out again in their order, rank 0's broadcast,
    as at a group's start."""
    for ddp in ddp_models(registered):
        reducer = ddp.reducer
        reducer._reset_state()
        reducer._push_all_rebuilt_params()
        reducer._rebuild_buckets()
        reducer._reset_state()


def parked(s: Any, exc: BaseException | None, whole_at: int | None = None) -> bool:
    """Where the loop re-forms in place: ``exc`` is a peer's loss (DDP's all-reduce met it,
    or the caller's own collective), and the training function's session ``s`` registered
    its state ``in_place``. Then this rank parks until the next generation and returns True
    inside it, rolled back to the restore point the group agreed (or, where every rank
    parked after the same whole step, ``whole_at``, or undid the step the loss broke
    (``step_undo``) after the same report, with its live state kept: ``s.rolled_back`` says
    which); or its task gives way to a fresh run
    (``WorkerProcess.park``) and this never returns."""
    if exc is None or not s.in_place:
        return False
    from torchjob.launch import worker
    from torchjob.launch.errors import classify_failure

    if classify_failure(exc) != "peer" or s.resume is None:
        return False
    can_join = joinable(s.registered, s.wrapped)
    at = s.report_base + s.reports
    if whole_at is not None:
        s.parked_note = Parked(whole_at, exact=False, joinable=can_join)
    elif step_undo.undo(s.run_path, at, s.registered):
        s.parked_note = Parked(at, exact=True, joinable=can_join, undone=True)
    else:
        s.parked_note = Parked(-1, exact=False, joinable=can_join)
    worker.current().park(exc, s.resume)
    return True


def parks_at_regroup(s: Any) -> bool:
    """At the end of a report where the group agreed to re-form from memory (a generation
    adds or drops a pod), the report's restore point taken: where the training function's
    session ``s`` registered its state ``in_place``, this rank parks there instead of
    ending its task, and returns True inside the next generation, its live state kept (a
    pod that leaves never returns: its task ends when its process is told to exit); or
    its task gives way to a fresh run and this never returns. False: not in place."""
    if not s.in_place or s.park_stopped is None:
        return False
    mark = s.report_base + s.reports
    s.parked_note = Parked(mark, exact=True, joinable=joinable(s.registered, s.wrapped))
    s.park_stopped(s)
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

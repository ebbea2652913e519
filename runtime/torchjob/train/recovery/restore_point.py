"""The in-memory restore point: the last completed step's state, held by every worker.

In data-parallel training every replica holds the full state after each step, so the
survivors of a lost rank already have what a storage checkpoint would give back. A training
function hands its state to the runtime once (``register_state``); ``report()`` copies it
into host memory (:func:`take`: CPU buffers reused from one copy to the next), with the RNG
states and the prepared loaders' data positions.

The worker process outlives a generation when the group re-forms in place (a survivor),
and so does what it holds. At the next generation's start the ranks agree on the newest
restore point any of them holds (:func:`agree_noted`: one ``all_gather_object``); its
holders send it to the ranks without it, nothing moves when every rank holds it, and nobody
reads storage. Only when no rank holds one does the generation resume from the latest
committed checkpoint.

The copies go into the pod's shared memory where the driver gave the worker a directory
there (``torchjob.train.recovery.shm_keep``): a process the driver replaces in the same pod
(a formation given up, a lost local worker) finds its predecessor's restore point there.

Sharded (FSDP2) state is held by the shard mirror instead (``recovery.shard_mirror``: each
rank holds its own shard and its ring neighbour's); :func:`take` holds nothing for DTensors.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchjob.checkpoint.rng import capture_rng
from torchjob.launch.settings import ENV_RESTORE_POINT_DIR
from torchjob.train.recovery import device_copy, host_copy, shm_keep
from torchjob.train.recovery import snapshot_wire as wire


@dataclass
class Snapshot:
    """One restore point: a run's state at one of its reports."""

    run: str
    """The run (its storage path): a process never restores another run's state."""
    index: int
    """Reports of the run up to this one (across generations): the newest wins."""
    state: dict[str, Any]
    """CPU copies of the registered state's entries (``state_dict()`` of those that have one)."""
    rng: dict[str, Any] = field(default_factory=dict)
    positions: list[dict[str, Any]] = field(default_factory=list)
    """The prepared loaders' data positions (``DataPosition.to_dict``)."""
    nbytes: int = 0
    arena: shm_keep.Arena | None = None
    """The one block holding the state's tensors: a file of the pod's shared memory
    (``path``), or this process's memory (a first copy's, or one received by broadcast);
    None where they were allocated one by one (the state changed its shapes)."""
    allocated: bool = False
    """This copy allocated its buffers (a first copy, or the state changed its shapes): it
    costs more than the copies that write over them (``recovery.cadence``)."""


_HELD: list[Snapshot | None] = [None]
"""This process's restore point. A module global: it outlives the training function and
the generation (the process re-forms in place), never the process."""


def held() -> Snapshot | None:
    """This process's restore point (once its copy in flight, if any, is done)."""
    host_copy.settle()
    return _HELD[0]


def drop() -> None:
    host_copy.settle()
    _HELD[0] = None
    slot = _SLOT[0]
    if slot is not None:
        slot.invalidate()


_SLOT: list[shm_keep.Slot | None] = [None]


def _slot(run: str) -> shm_keep.Slot | None:
    """This process's slot in the driver's shared-memory directory, if it gave one: claimed
    at the first use (a process that replaces a lost one takes over the slot it left)."""
    where = os.environ.get(ENV_RESTORE_POINT_DIR, "")
    held = _SLOT[0]
    if held is not None and str(held.dir) == where:
        return held
    if not where or not Path(where).is_dir():
        return None
    _SLOT[0] = shm_keep.Slot.claim(Path(where), run)
    return _SLOT[0]


def _kept(run: str) -> Snapshot | None:
    """The restore point of ``run`` this slot's previous process left in shared memory."""
    slot = _slot(run)
    found = slot.load(run) if slot is not None else None
    if found is None:
        return None
    arena, m = found
    return Snapshot(run, m["index"], m["state"], m["rng"], m["positions"], m["nbytes"], arena)


def _unwrapped(v: Any) -> Any:
    """A DDP-wrapped model's module: its state is held under the module's own keys, so a
    group that shrank to one worker (``prepare_model`` leaves it unwrapped) loads it too."""
    import torch

    return v.module if isinstance(v, torch.nn.parallel.DistributedDataParallel) else v


def state_of(registered: Mapping[str, Any]) -> dict[str, Any]:
    """What is held of each registered entry: its ``state_dict()`` where it has one (a model,
    an optimizer, a scheduler, a ``TrainState``), else the value itself (a step counter)."""
    return {
        k: _unwrapped(v).state_dict() if callable(getattr(v, "state_dict", None)) else v
        for k, v in registered.items()
    }


def load_into(registered: MutableMapping[str, Any], state: Mapping[str, Any]) -> None:
    """Put a restore point's entries back: ``load_state_dict`` where the entry has one, else
    the value replaces the registered one."""
    missing = sorted(set(registered) - set(state))
    if missing:
        raise KeyError(
            f"the restore point has no entry {missing[0]!r}: register_state() was called "
            f"with other keys than in the generation that took it ({sorted(state)})"
        )
    import torch

    for k, v in registered.items():
        # A module copies into its parameters; an optimizer keeps the tensors it is given
        # (``Optimizer.load_state_dict``), and so would a plain value: those get copies, or
        # the next steps would move the restore point with them.
        entry = (
            state[k]
            if isinstance(_unwrapped(v), torch.nn.Module)
            else host_copy.copy_tree(state[k], None)[0]
        )
        if callable(getattr(v, "load_state_dict", None)):
            _unwrapped(v).load_state_dict(entry)
        else:
            registered[k] = entry


def is_sharded(value: Any) -> bool:
    """Whether ``value`` holds a tensor subclass (a DTensor: an FSDP2 shard)."""
    import torch

    if isinstance(value, torch.Tensor):
        return type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter)
    if isinstance(value, Mapping):
        return any(is_sharded(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(is_sharded(v) for v in value)
    return False


def take(
    run: str,
    index: int,
    registered: Mapping[str, Any],
    positions: list[dict[str, Any]],
    live: Mapping[str, Any] | None = None,
    *,
    overlap: bool = False,
) -> Snapshot | None:
    """Copy the registered state into host memory as the restore point of report ``index``
    (the pod's shared memory where the driver gave a directory, else this process's; reusing
    the previous restore point's buffers, ``Snapshot.allocated`` says if not); ``live`` is
    ``state_of(registered)`` where the caller has it. ``overlap``: the registered optimizers'
    tensors are copied on a thread while the loop goes on (``host_copy``). None for sharded
    state (FSDP2 DTensors): a rank holds only its shard, which the shard mirror holds
    instead (``torchjob.train.recovery.shard_mirror``)."""
    live = state_of(registered) if live is None else live
    if is_sharded(live):
        drop()
        return None
    host_copy.settle()  # the last copy, still in flight, writes the buffers this one reuses
    opts = host_copy.optimizers(registered) if overlap else []
    host_copy.hook(opts)
    copy = host_copy.Overlap(host_copy.owned(opts))
    slot = _slot(run)
    meta: dict[str, Any] = {
        "run": run,
        "index": index,
        "rng": capture_rng(),
        "positions": list(positions),
    }
    if slot is not None and (snap := _into_shared(slot, run, live, meta, copy)) is not None:
        return snap
    prev = _HELD[0]
    if prev is not None and prev.run != run:
        prev = None
    allocs = [0]
    old = prev.state if prev is not None else None
    # A first copy goes into one block (pinned where the state is on a GPU), which a grow
    # then sends as it is; a later one writes over the held copy's tensors.
    arena = _private_arena(live) if old is None else None

    def counted(t: Any) -> Any:
        allocs[0] += 1
        return arena.alloc(t) if arena is not None else host_copy.private(t)

    copy.clear()
    state, nbytes = host_copy.copy_tree(live, old, counted, copy.put)
    snap = Snapshot(run, index, state, meta["rng"], meta["positions"], nbytes)
    snap.allocated = allocs[0] > 0
    if arena is not None:
        snap.arena = arena
    elif prev is not None and prev.arena is not None and prev.arena.path is None:
        snap.arena = prev.arena  # a private block (received by broadcast, or a first copy's)
    _HELD[0] = snap
    copy.start()
    return snap


def _private_arena(live: Any) -> shm_keep.Arena:
    """One block of this process's memory for every tensor of ``live``; page-locked when
    ``live`` holds a GPU tensor (``recovery.device_copy``)."""
    arena = shm_keep.Arena.private(shm_keep.arena_bytes(live))
    if device_copy.holds_cuda(live):
        device_copy.pin(arena)
    return arena


class _Reshaped(Exception):
    """A tensor of the state no longer has the shape of the one the arena holds."""


def _reshaped(_t: Any) -> Any:
    raise _Reshaped


def _into_shared(
    slot: shm_keep.Slot, run: str, live: Any, meta: dict[str, Any], copy: host_copy.Overlap
) -> Snapshot | None:
    """The copy into shared memory: over the held restore point's arena when the state kept
    its shapes, else into a new one; None where the shared memory has no room."""
    need = shm_keep.arena_bytes(live)
    prev = _HELD[0]
    shared = prev.arena if prev is not None and prev.run == run else None
    if prev is not None and shared is not None and shared.path is not None and shared.used == need:
        slot.invalidate()
        try:
            state, nbytes = host_copy.copy_tree(live, prev.state, _reshaped, copy.put)
            return _committed(slot, shared, state, nbytes, meta, copy, allocated=False)
        except _Reshaped:  # the same bytes in other shapes: a new arena
            copy.clear()
    if slot.no_room_for == need:
        return None  # the copies stay in private memory (said once, at the failed allocation)
    _HELD[0] = prev = None  # its pages go before the new arena's come
    arena = slot.allocate(need)
    if arena is None:
        return None
    if device_copy.holds_cuda(live):
        device_copy.pin(arena)
    state, nbytes = host_copy.copy_tree(live, None, arena.alloc, copy.put)
    return _committed(slot, arena, state, nbytes, meta, copy, allocated=True)


def _committed(
    slot: shm_keep.Slot,
    arena: shm_keep.Arena,
    state: dict[str, Any],
    nbytes: int,
    meta: dict[str, Any],
    copy: host_copy.Overlap,
    *,
    allocated: bool,
) -> Snapshot:
    """The snapshot, held now; the slot committed once its copies are done (at once, or on
    the overlapped copy's thread after them: a process lost before finds none there)."""

    def commit() -> None:
        slot.commit(arena, {**meta, "nbytes": nbytes}, state)
        slot.prune(meta["run"], meta["index"])

    snap = Snapshot(meta["run"], meta["index"], state, meta["rng"], meta["positions"], nbytes)
    snap.arena, snap.allocated = arena, allocated
    _HELD[0] = snap
    if copy.pending:
        copy.start(then=commit)
    else:
        commit()
    return snap


# --- agreeing on one restore point at a generation's start ---------------------------------


@dataclass(frozen=True)
class Restored:
    """What :func:`agree` found: the snapshot every rank now holds, where it came from."""

    snapshot: Snapshot
    source_rank: int
    received: bool
    """This rank received it from a holder (it held an older one, or none)."""
    seconds: float


def _encode(snap: Snapshot) -> tuple[bytes, Any]:
    """What a broadcast sends of ``snap``: a header (``torch.save`` of everything but the
    tensors' bytes, their places in the arena among it) and the arena itself, a ``uint8``
    tensor: the held one as it is (no copy), or the tensors packed into a new one."""
    import torch

    arena = snap.arena
    layout = shm_keep.skeleton(snap.state, arena) if arena is not None else None
    if arena is None or layout is None:
        arena = shm_keep.Arena.private(shm_keep.arena_bytes(snap.state))
        layout = shm_keep.skeleton(host_copy.copy_tree(snap.state, None, arena.alloc)[0], arena)
    meta = {"run": snap.run, "index": snap.index, "rng": snap.rng}
    buf = io.BytesIO()
    torch.save({**meta, "positions": snap.positions, "nbytes": snap.nbytes, "state": layout}, buf)
    return buf.getvalue(), arena.data[: max(arena.used, 1)]


def _decode(header: bytes, body: Any) -> Snapshot:
    """The snapshot :func:`_encode` sent: its tensors are views of ``body`` (kept as the
    snapshot's private arena, so that this rank can send it on as it is)."""
    import torch

    d = torch.load(io.BytesIO(header), weights_only=False)
    arena = shm_keep.Arena(None, body, used=body.numel())
    state = shm_keep.fill(d["state"], arena)
    return Snapshot(d["run"], d["index"], state, d["rng"], d["positions"], d["nbytes"], arena)


def agree(run: str, rank: int, world_size: int) -> Restored | None:
    """:func:`agree_noted` without a note: the restore point alone."""
    return agree_noted(run, rank, world_size)[0]


def agree_noted(
    run: str,
    rank: int,
    world_size: int,
    note: Any = None,
    fresh: Callable[[list[Any], list[int]], int | None] | None = None,
    retake: Callable[[int], object] | None = None,
) -> tuple[Restored | None, list[Any]]:
    """Collective, at a generation's start: the newest restore point of ``run`` any rank
    holds, now held by every rank, or None when no rank holds one (then from storage).

    Only the ranks that lack it receive it, from the holders in turn, point to point;
    nothing moves when every rank holds it (a broadcast to every rank cost each re-formation
    the whole state: 2.3-2.8 s for 252 MiB, bench/results/2026-11-29j).
    ``Restored.source_rank`` is -1 then. The same
    gather carries each rank's ``note`` (a small picklable value), returned in rank order:
    ``recovery.in_place`` says there where each rank's training function waits. ``fresh``
    (the same on every rank): from the notes and indices, a report whose restore point every
    rank with a note takes now (``retake``, on those ranks) before it moves, else None."""
    t0 = time.monotonic()
    host_copy.settle()  # a copy still in flight ends before the restore point is read
    host_copy.waited()  # and the loop's waits for copies start anew with the generation
    host_copy.cpu_beside()  # as does the copies' CPU time
    mine = _HELD[0]
    if mine is None or mine.run != run:
        mine = _HELD[0] = _kept(run) or mine
    index = mine.index if mine is not None and mine.run == run else -1
    if world_size == 1:
        if index < 0:
            return None, [note]
        assert mine is not None
        return Restored(mine, rank, False, time.monotonic() - t0), [note]
    import torch.distributed as dist

    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, (index, note))
    indices = [int(i) for i, _ in gathered]
    notes = [n for _, n in gathered]
    if fresh is not None and (at := fresh(notes, indices)) is not None:
        indices = [at if n is not None else i for n, i in zip(notes, indices, strict=True)]
        if note is not None and retake is not None:
            retake(at)
            mine = _HELD[0]
    best = max(indices)
    if best < 0:
        return None, notes
    holders = [r for r, i in enumerate(indices) if int(i) == best]
    senders = {
        r: holders[k % len(holders)]
        for k, r in enumerate(r for r, i in enumerate(indices) if int(i) != best)
    }
    if rank in senders:
        snap = _HELD[0] = _decode(*wire.receive(senders[rank], dist))
        return Restored(snap, senders[rank], True, time.monotonic() - t0), notes
    assert mine is not None
    mine_to = [r for r, h in senders.items() if h == rank]
    if mine_to:
        wire.send(*_encode(mine), mine_to, dist)
    return Restored(mine, min(holders) if senders else -1, False, time.monotonic() - t0), notes

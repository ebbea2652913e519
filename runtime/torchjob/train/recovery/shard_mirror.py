"""The shard mirror: the in-memory restore point of sharded (FSDP2) state.

In data-parallel training every replica holds the whole state (``torchjob.train.recovery.restore_point``);
with FSDP2 each rank holds only its shard, so a lost rank's shard would be nowhere in the
survivors' memory. The mirror keeps it there (Gemini's idea, SOSP 2023): at every ``report()``
of a training function that registered its state, each rank

1. copies its own shards (the ``DTensor`` leaves of the registered state: model parameters,
   optimizer moments) into one flat host buffer (reused from report to report; pinned, and the
   copy non-blocking, when CUDA is present), and the rest of the state (step, scheduler, data
   position, RNG, plain tensors) into a small pickled record;
2. sends both to rank ``(r - 1) % W`` and receives rank ``(r + 1) % W``'s into a second buffer
   (gloo ``isend``/``irecv``): the ring, so every shard lives in two processes' memory.

Memory: two shards of host RAM per rank (its own copy and its neighbour's), allocated at the
first report of a generation and reused. The copy is taken after the report's stop all-reduce,
so a rank lost before it leaves every survivor holding the previous report, consistently.

At the next generation's start (:func:`agree`, collective) the ranks gather which old ranks'
records each holds and pick the newest report whose every old rank's record is held by some
survivor: a lost rank's shard comes from its mirror. Records are combined only within one
report of one generation (a record carries both; the exchange refuses a peer at another
report), so one report's shards are never paired with another's step or moments. ``register_state`` then rebuilds the
state at the new world size (``torchjob.train.recovery.shard_rebuild``) and storage is not read. Two
adjacent ranks lost at once (a shard and its mirror) leave a hole: the generation resumes from
the latest committed checkpoint, and the driver says so.

On by default; ``TORCHJOB_SHARD_MIRROR=0`` or ``register_state(state, mirror=False)`` turns it
off (a loss then resumes from storage). Only ``DTensor``s on a one-dimensional mesh over the
whole group (FSDP2's ``fully_shard``) are mirrored; other sharded state holds nothing.
"""

from __future__ import annotations

import io
import logging
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchjob.launch import settings, worker

log = logging.getLogger(__name__)

ENV_SHARD_MIRROR = settings.ENV_SHARD_MIRROR
"""``0`` turns the shard mirror off (default on): ``RuntimeSettings.shard_mirror``."""
ALIGN = 64
"""Each leaf's bytes start at a multiple of this in the flat buffer (any dtype's alignment)."""
_TAG_HEADER, _TAG_META, _TAG_FLAT = 7301, 7302, 7303


def enabled(mirror: bool | None = None) -> bool:
    """The kwarg of ``register_state`` wins; else ``TORCHJOB_SHARD_MIRROR`` (on unless ``0``),
    as this worker process read it (``RuntimeSettings``)."""
    if mirror is not None:
        return mirror
    return worker.current().settings.shard_mirror


@dataclass(frozen=True)
class Leaf:
    """One ``DTensor`` of a rank's state: where its local piece sits in the global tensor and
    in the rank's flat buffer."""

    path: tuple[Any, ...]
    dtype: Any
    shape: tuple[int, ...]
    offset: tuple[int, ...]
    local: tuple[int, ...]
    placements: tuple[Any, ...]
    start: int
    nbytes: int


@dataclass
class Record:
    """One rank's state at one report: its shards (flat) and the rest (pickled)."""

    rank: int
    world: int
    index: int
    layout: tuple[Leaf, ...]
    flat: Any
    """A uint8 tensor: every leaf's local piece at ``Leaf.start``."""
    rest: bytes = b""
    """``torch.save`` of (the state with ``Piece`` markers for the leaves, RNG, positions)."""
    generation: int = -1
    """The generation that took it: records are combined only with records of the same
    (generation, index), i.e. of one report of one group."""

    def piece(self, leaf: Leaf) -> Any:
        return self.flat[leaf.start : leaf.start + leaf.nbytes].view(leaf.dtype).view(leaf.local)


@dataclass
class Holding:
    """What this process holds of a run: its own record and its ring neighbour's."""

    run: str
    generation: int
    own: Record
    mirror: Record | None = None
    seconds: float = 0.0
    """The last take's time (copy and exchange)."""

    @property
    def nbytes(self) -> int:
        n = int(self.own.flat.numel())
        return n + (int(self.mirror.flat.numel()) if self.mirror is not None else 0)

    def records(self) -> list[Record]:
        out = [self.own] if self.own.index >= 0 else []
        if self.mirror is not None and self.mirror.index >= 0:
            out.append(self.mirror)
        return out


@dataclass(frozen=True)
class Piece:
    """Where a ``DTensor`` leaf was in the pickled rest of a record."""

    path: tuple[Any, ...]


_WARNED: list[str] = []
_HOLD: list[Holding | None] = [None]
"""This process's holding: a module global, it outlives the generation (never the process)."""


def held(run: str | None = None) -> Holding | None:
    h = _HOLD[0]
    return h if h is not None and (run is None or h.run == run) else None


def drop() -> None:
    _HOLD[0] = None


# --- the state's leaves ------------------------------------------------------------------


def is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def split(value: Any, path: tuple[Any, ...] = ()) -> tuple[Any, list[tuple[tuple[Any, ...], Any]]]:
    """``value`` with each ``DTensor`` replaced by a :class:`Piece`, and the DTensors by path."""
    if is_dtensor(value):
        return Piece(path), [(path, value)]
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        leaves: list[tuple[tuple[Any, ...], Any]] = []
        for k, v in value.items():
            out[k], found = split(v, (*path, k))
            leaves += found
        return out, leaves
    if isinstance(value, list | tuple):
        items, leaves = [], []
        for i, v in enumerate(value):
            item, found = split(v, (*path, i))
            items.append(item)
            leaves += found
        return (tuple(items) if isinstance(value, tuple) else items), leaves
    return value, []


def fill(skeleton: Any, tensors: Mapping[tuple[Any, ...], Any]) -> Any:
    """The inverse of :func:`split`: each :class:`Piece` replaced by ``tensors[path]``."""
    if isinstance(skeleton, Piece):
        return tensors[skeleton.path]
    if isinstance(skeleton, Mapping):
        return {k: fill(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        items = [fill(v, tensors) for v in skeleton]
        return tuple(items) if isinstance(skeleton, tuple) else items
    return skeleton


def box(shape: Any, mesh: Any, placements: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """This rank's (local shape, global offset) of a tensor of ``shape`` laid out so on a 1-D
    ``mesh`` (``Shard(d)``: ``torch.chunk``'s split of dim ``d``, as DTensor's; ``Replicate``)."""
    from torch.distributed.tensor import Shard

    local, offset = [int(x) for x in shape], [0] * len(shape)
    for p in placements:
        if isinstance(p, Shard):
            n, world, rank = local[p.dim], mesh.size(), mesh.get_local_rank()
            chunk = -(-n // world)
            start = min(chunk * rank, n)
            local[p.dim], offset[p.dim] = min(n, start + chunk) - start, start
    return tuple(local), tuple(offset)


def mirrorable(leaves: list[tuple[tuple[Any, ...], Any]], world: int) -> str | None:
    """Why these leaves cannot be mirrored (None: they can)."""
    from torch.distributed.tensor import Replicate, Shard

    for path, t in leaves:
        mesh = t.device_mesh
        if mesh.ndim != 1 or mesh.size() != world:
            return (
                f"{'.'.join(map(str, path))} is on a {tuple(mesh.shape)} mesh, not 1-D over {world}"
            )
        if not all(isinstance(p, Shard | Replicate) for p in t.placements):
            return f"{'.'.join(map(str, path))} has placements {t.placements}"
    return None


def layout_of(leaves: list[tuple[tuple[Any, ...], Any]]) -> tuple[Leaf, ...]:
    out, start = [], 0
    for path, t in leaves:
        local, offset = box(t.shape, t.device_mesh, t.placements)
        nbytes = t.dtype.itemsize * _numel(local)
        out.append(
            Leaf(path, t.dtype, tuple(t.shape), offset, local, tuple(t.placements), start, nbytes)
        )
        start += -(-nbytes // ALIGN) * ALIGN
    return tuple(out)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _size(layout: tuple[Leaf, ...]) -> int:
    return max((leaf.start + leaf.nbytes for leaf in layout), default=0)


def _buffer(nbytes: int, old: Any) -> Any:
    import torch

    if old is not None and int(old.numel()) == nbytes:
        return old
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


# --- every report ---------------------------------------------------------------------------


def take(
    run: str,
    index: int,
    live: Mapping[str, Any],
    positions: list[dict[str, Any]],
    *,
    rank: int,
    world: int,
    generation: int,
    group: Any = None,
) -> Holding | None:
    """Collective (every rank, at the same report): copy this rank's state into its own record
    and exchange records with the ring neighbours. ``live`` is the registered state's
    ``state_dict()``s. None (nothing held) when its DTensors cannot be mirrored."""
    import torch

    t0 = time.perf_counter()
    skeleton, leaves = split(live)
    why = mirrorable(leaves, world)
    if why is not None:
        if not _WARNED:
            log.warning("torchjob: the shard mirror holds nothing: %s", why)
            _WARNED.append(why)
        _HOLD[0] = None
        return None
    from torchjob.checkpoint.rng import capture_rng

    layout = layout_of(leaves)
    prev = _HOLD[0] if _HOLD[0] is not None and _HOLD[0].run == run else None
    changed = (
        prev is None
        or prev.generation != generation
        or prev.own.layout != layout
        or (prev.own.rank, prev.own.world) != (rank, world)
    )
    if prev is None or changed:
        # A new generation (or layout): fresh records, the buffers reused where sizes match.
        flat = _buffer(_size(layout), prev.own.flat if prev is not None else None)
        mirror = prev.mirror if prev is not None else None
        if mirror is not None:
            mirror.index = -1  # another generation's: only its buffer is reused
        own = Record(rank, world, -1, layout, flat, generation=generation)
        h = Holding(run, generation, own, mirror)
    else:
        h = prev
        h.own.index = -1  # overwritten below: not a consistent record until the copy is done
    _HOLD[0] = h
    for leaf, (_, t) in zip(layout, leaves, strict=True):
        h.own.piece(leaf).copy_(t.to_local().detach(), non_blocking=True)
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
    buf = io.BytesIO()
    torch.save((skeleton, capture_rng(), list(positions)), buf)
    h.own.rest = buf.getvalue()
    h.own.index = index
    if world > 1:
        _exchange(h, index, rank, world, changed, group)
    h.seconds = time.perf_counter() - t0
    return h


def _exchange(h: Holding, index: int, rank: int, world: int, changed: bool, group: Any) -> None:
    """Send the own record to ``rank - 1``, receive ``rank + 1``'s into the mirror."""
    import torch

    to, frm = (rank - 1) % world, (rank + 1) % world
    meta = pickle.dumps((h.own.layout if changed else None, h.own.rest, index, h.generation))
    header = torch.tensor([int(h.own.flat.numel()), len(meta)], dtype=torch.int64)
    theirs = torch.zeros(2, dtype=torch.int64)
    _pairwise(header, to, theirs, frm, _TAG_HEADER, group)
    meta_in = torch.empty(int(theirs[1]), dtype=torch.uint8)
    _pairwise(
        torch.frombuffer(bytearray(meta), dtype=torch.uint8), to, meta_in, frm, _TAG_META, group
    )
    layout, rest, their_index, their_generation = pickle.loads(meta_in.numpy().tobytes())
    if (their_index, their_generation) != (index, h.generation):
        # Never pair one report's record with another's: the ring is out of step.
        raise RuntimeError(
            f"shard mirror: rank {frm} sent report {their_index} of generation "
            f"{their_generation}, this rank is at report {index} of generation {h.generation}"
        )
    old = h.mirror
    if layout is None and (old is None or (old.rank, old.world) != (frm, world)):
        raise RuntimeError(f"shard mirror: rank {frm} sent no layout and none is held for it")
    layout = layout if layout is not None else old.layout  # type: ignore[union-attr]
    if old is not None:
        old.index = -1  # being overwritten: not a consistent record until the receive is done
    flat = _buffer(int(theirs[0]), old.flat if old is not None else None)
    h.mirror = Record(frm, world, -1, layout, flat, rest, h.generation)
    _pairwise(h.own.flat, to, flat, frm, _TAG_FLAT, group)
    h.mirror.index = index


def _pairwise(send: Any, to: int, recv: Any, frm: int, tag: int, group: Any) -> None:
    import torch.distributed as dist

    works = [dist.isend(send, dst=to, group=group, tag=tag)]
    works.append(dist.irecv(recv, src=frm, group=group, tag=tag))
    for w in works:
        if w is not None:
            w.wait()

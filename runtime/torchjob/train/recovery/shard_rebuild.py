"""Rebuild sharded state at a new world size from the shard mirror (``torchjob.train.recovery.shard_mirror``).

At a generation's start, :func:`agree` (collective) finds the newest report whose every old
rank's record a survivor holds (a lost rank's from its mirror), or a :class:`Fallback` naming
the hole. Then :func:`restore`, collective, in ``register_state`` once the model and optimizer of the new generation exist
(their ``DTensor``s say where each rank's new piece of every tensor lies):

1. one ``all_gather_object``: each rank's target boxes (global offset and local shape of each
   of its new pieces) and, from the rank chosen to give each old rank's record (its own
   process, else its mirror's holder), that record's layout and its pickled rest;
2. every rank computes the same transfer list: for each old rank's piece of each tensor, its
   overlap with each new rank's box (n-d boxes; a replicated tensor comes from one piece);
3. one ``all_to_all_single`` of bytes (gloo): each holder sends every new rank the overlaps it
   needs, in that order; each rank assembles its new local pieces from what it received;
4. the new ``DTensor``s (``DTensor.from_local`` on the new mesh and placements) go back into
   the old state's structure, which ``load_state_dict`` loads (``set_state_dict`` for a
   ``TrainState``). Each new rank takes the rest (step, scheduler, data position, RNG) of
   the old rank with its number; a rank beyond the old world size takes old rank 0's rest
   and keeps its own RNG (as a DCP load at another world size does).

No rank ever holds more than its new pieces plus what it held: nothing is gathered on one rank.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from torchjob.train.recovery.shard_mirror import Leaf, Record, box, fill, held, split

# --- a generation's start ---------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What :func:`agree` found: the report every old rank's record is held for, and by whom."""

    index: int
    old_world: int
    generation: int
    """The generation that took the records (with ``index``: one report of one group)."""
    holders: dict[int, int]
    """Old rank -> the rank (of the new group) whose memory gives its record."""
    from_mirror: tuple[int, ...]
    """Old ranks whose own process is gone: their record comes from a mirror."""
    positions: list[dict[str, Any]] = field(default_factory=list)
    """Old rank 0's data positions (the prepared loaders')."""


@dataclass(frozen=True)
class Fallback:
    """The mirror cannot rebuild the newest report: why (for the driver's log line)."""

    index: int
    reason: str


def _summary(run: str) -> list[tuple[int, int, int, int, bool, Any]] | None:
    """(old rank, its world, its generation, report index, own record, old rank 0's
    positions) per complete record."""
    h = held(run)
    if h is None or not h.records():
        return None
    return [
        (
            r.rank,
            r.world,
            r.generation,
            r.index,
            r is h.own,
            _positions(r) if r.rank == 0 else None,
        )
        for r in h.records()
    ]


def _positions(rec: Record) -> list[dict[str, Any]]:
    import torch

    _, _, positions = torch.load(io.BytesIO(rec.rest), weights_only=False)
    return list(positions)


def agree(run: str, rank: int, world: int) -> Plan | Fallback | None:
    """Collective, at a generation's start (after the replicated restore point found none):
    the newest report of ``run`` whose every old rank's record some rank holds (a
    :class:`Plan`), a :class:`Fallback` when records are held but one is missing, or None when
    nobody holds any."""
    mine = _summary(run)
    everyone: list[Any] = [mine]
    if world > 1:
        import torch.distributed as dist

        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
    return choose(everyone)


def choose(everyone: list[Any]) -> Plan | Fallback | None:
    """:func:`agree`'s decision over every rank's ``_summary``: the newest report (index,
    then generation) of one group whose every old rank's record is held, complete, by some
    rank. Records of one report are never mixed with another's (nor with another
    generation's of the same index and size)."""
    Key = tuple[int, int, int]  # (index, generation, old world)
    by_index: dict[Key, dict[int, list[tuple[bool, int]]]] = {}
    positions: dict[Key, list[dict[str, Any]]] = {}
    for new_rank, records in enumerate(everyone):
        for old, old_world, generation, index, own, pos in records or []:
            key = (index, generation, old_world)
            holders = by_index.setdefault(key, {}).setdefault(old, [])
            holders.append((not own, new_rank))  # own records first, then mirrors
            if pos is not None:
                positions[key] = pos
    if not by_index:
        return None
    for key, held_by in sorted(by_index.items(), reverse=True):
        index, generation, old_world = key
        if all(k in held_by for k in range(old_world)):
            chosen = {k: min(held_by[k]) for k in range(old_world)}
            return Plan(
                index,
                old_world,
                generation,
                {k: new_rank for k, (_, new_rank) in chosen.items()},
                tuple(k for k, (mirrored, _) in chosen.items() if mirrored),
                positions.get(key, []),
            )
    (index, _, old_world), held_by = max(by_index.items())
    missing = [k for k in range(old_world) if k not in held_by]
    lost = ", ".join(f"{k} (mirrored by {(k - 1) % old_world})" for k in missing)
    reason = (
        f"the shard mirror cannot rebuild report {index}: the shards of old rank(s) {lost} "
        "were lost with their mirrors (or in the middle of a report's exchange)"
    )
    return Fallback(index, reason)


_Box = tuple[tuple[int, ...], tuple[int, ...]]
"""(global offset, local shape)."""


@dataclass(frozen=True)
class Rebuilt:
    """What :func:`restore` did (the ``restored`` event's figures)."""

    index: int
    old_world: int
    world: int
    from_mirror: tuple[int, ...]
    bytes_moved: int
    seconds: float


def _overlap(a: _Box, b: _Box) -> _Box | None:
    lo = tuple(max(x, y) for x, y in zip(a[0], b[0], strict=True))
    hi = tuple(min(x + n, y + m) for x, n, y, m in zip(a[0], a[1], b[0], b[1], strict=True))
    if any(top <= bottom for bottom, top in zip(lo, hi, strict=True)):
        return None
    return lo, tuple(top - bottom for bottom, top in zip(lo, hi, strict=True))


def _slices(inner: _Box, outer_offset: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(
        slice(o - base, o - base + n)
        for o, n, base in zip(inner[0], inner[1], outer_offset, strict=True)
    )


def _transfers(
    layouts: Mapping[int, tuple[Leaf, ...]], targets: list[dict[tuple[Any, ...], _Box]]
) -> list[tuple[int, Leaf, int, _Box]]:
    """(old rank, its leaf, new rank, overlap) in one order every rank computes alike."""
    out = []
    by_path = {k: {leaf.path: leaf for leaf in layout} for k, layout in layouts.items()}
    for path in [leaf.path for leaf in layouts[0]]:
        seen: set[_Box] = set()
        for k in sorted(layouts):
            leaf = by_path[k][path]
            piece = (leaf.offset, leaf.local)
            if leaf.nbytes == 0 or piece in seen:
                continue  # empty, or a replica of a piece already used
            seen.add(piece)
            for d, boxes in enumerate(targets):
                if path in boxes and (ov := _overlap(piece, boxes[path])) is not None:
                    out.append((k, leaf, d, ov))
    return out


def _targets(
    leaves: list[tuple[tuple[Any, ...], Any]], layout: tuple[Leaf, ...]
) -> tuple[dict[tuple[Any, ...], _Box], dict[tuple[Any, ...], tuple[Any, Any, Any]]]:
    """This rank's new box of every old leaf: the live DTensor's where the new state has one
    (a model parameter), else the old placements on the model's mesh (optimizer moments of an
    optimizer that has not stepped yet). Also (mesh, placements, device) per path."""
    live = dict(leaves)
    if not live:
        raise RuntimeError("shard mirror: the registered state has no DTensor to rebuild into")
    any_t = next(iter(live.values()))
    boxes, where = {}, {}
    for leaf in layout:
        t = live.get(leaf.path)
        if t is not None and tuple(t.shape) != leaf.shape:
            raise RuntimeError(
                f"shard mirror: {'.'.join(map(str, leaf.path))} has shape {tuple(t.shape)}, "
                f"the mirrored state {leaf.shape}: register_state() got another model"
            )
        mesh = t.device_mesh if t is not None else any_t.device_mesh
        placements = tuple(t.placements) if t is not None else leaf.placements
        device = (t if t is not None else any_t).to_local().device
        local, offset = box(leaf.shape, mesh, placements)
        boxes[leaf.path] = (offset, local)
        where[leaf.path] = (mesh, placements, device)
    return boxes, where


def restore(
    registered: MutableMapping[str, Any], plan: Plan, run: str, rank: int, world: int, group: Any
) -> Rebuilt:
    """Collective: load the mirrored report ``plan.index`` into ``registered`` at this world
    size (``torchjob.train.recovery.restore_point.load_into``, then this rank's RNG)."""
    import torch
    import torch.distributed as dist

    from torchjob.checkpoint.rng import restore_rng
    from torchjob.train.recovery import restore_point

    t0 = time.perf_counter()
    mine = _held_records(run, plan, rank)
    _, leaves = split(restore_point.state_of(registered))
    given = {k: (r.layout, r.rest) for k, r in mine.items()}
    # The layout is the same on every old rank but for the offsets: old rank 0's paths decide.
    layout0 = next(iter(given.values()))[0] if 0 in given else None
    everyone: list[Any] = [None] * world
    if world > 1:
        box0: list[Any] = [layout0]
        dist.broadcast_object_list(box0, src=plan.holders[0], group=group)
        layout0 = box0[0]
    assert layout0 is not None
    boxes, where = _targets(leaves, layout0)
    if world > 1:
        dist.all_gather_object(everyone, (boxes, given), group=group)
    else:
        everyone = [(boxes, given)]
    records = {k: v for _, g in everyone for k, v in g.items()}
    layouts = {k: records[k][0] for k in range(plan.old_world)}
    transfers = _transfers(layouts, [b for b, _ in everyone])
    flat_in, recv_sizes = _exchange(transfers, plan, mine, rank, world, group)
    old0 = {leaf.path: leaf for leaf in layout0}
    local = _assemble(transfers, plan, boxes, old0, flat_in, recv_sizes, rank, world)
    src_rank = rank if rank < plan.old_world else 0
    skeleton, rng, _ = torch.load(io.BytesIO(records[src_rank][1]), weights_only=False)
    restore_point.load_into(registered, fill(skeleton, _as_dtensors(local, where, old0)))
    if rank < plan.old_world:
        restore_rng(rng)
    return Rebuilt(
        plan.index,
        plan.old_world,
        world,
        plan.from_mirror,
        int(flat_in.numel()),
        time.perf_counter() - t0,
    )


def _held_records(run: str, plan: Plan, rank: int) -> dict[int, Record]:
    """The mirrored records of ``plan``'s report that this rank holds, by old rank."""
    h = held(run)
    mine: dict[int, Record] = {}
    if h is not None:
        for rec in h.records():
            same = (rec.index, rec.generation, rec.world)
            ours = plan.holders.get(rec.rank) == rank
            if ours and same == (plan.index, plan.generation, plan.old_world):
                mine.setdefault(rec.rank, rec)
    return mine


def _exchange(
    transfers: list[Any],
    plan: Plan,
    mine: dict[int, Record],
    rank: int,
    world: int,
    group: Any,
) -> tuple[Any, list[int]]:
    """Collective: every piece to its new owner in one ``all_to_all_single``; returns what
    this rank received (bytes, by source in rank order) and how much from each source."""
    import torch
    import torch.distributed as dist

    send: list[list[Any]] = [[] for _ in range(world)]
    recv_sizes = [0] * world
    for k, leaf, d, ov in transfers:
        src = plan.holders[k]
        n = leaf.dtype.itemsize * _numel(ov[1])
        if src == rank:
            part = mine[k].piece(leaf)[_slices(ov, leaf.offset)]
            send[d].append(part.contiguous().view(-1).view(torch.uint8))
        if d == rank:
            recv_sizes[src] += n
    send_sizes = [sum(int(p.numel()) for p in parts) for parts in send]
    empty = torch.empty(0, dtype=torch.uint8)
    flat_out = torch.cat([p for parts in send for p in parts]) if any(send_sizes) else empty
    if world == 1:
        return flat_out, recv_sizes
    flat_in = torch.empty(sum(recv_sizes), dtype=torch.uint8)
    dist.all_to_all_single(flat_in, flat_out, recv_sizes, send_sizes, group=group)
    return flat_in, recv_sizes


def _assemble(
    transfers: list[Any],
    plan: Plan,
    boxes: dict[Any, Any],
    old0: dict[Any, Any],
    flat_in: Any,
    recv_sizes: list[int],
    rank: int,
    world: int,
) -> dict[Any, Any]:
    """This rank's new local pieces from what each source sent, in the same order; every
    piece must be covered whole."""
    import torch

    local = {path: torch.empty(b[1], dtype=old0[path].dtype) for path, b in boxes.items()}
    covered = dict.fromkeys(boxes, 0)
    starts = [sum(recv_sizes[:s]) for s in range(world)]
    for k, leaf, d, ov in transfers:
        if d != rank:
            continue
        src = plan.holders[k]
        n = leaf.dtype.itemsize * _numel(ov[1])
        chunk = flat_in[starts[src] : starts[src] + n].view(leaf.dtype).view(ov[1])
        starts[src] += n
        local[leaf.path][_slices(ov, boxes[leaf.path][0])] = chunk
        covered[leaf.path] += _numel(ov[1])
    for path, (_, shape) in boxes.items():
        if covered[path] != _numel(shape):
            raise RuntimeError(f"shard mirror: {'.'.join(map(str, path))} was not fully rebuilt")
    return local


def _as_dtensors(
    local: dict[Any, Any], where: dict[Any, Any], old0: dict[Any, Any]
) -> dict[Any, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    tensors = {}
    for path, t in local.items():
        mesh, placements, device = where[path]
        shape = old0[path].shape
        tensors[path] = DTensor.from_local(
            t.to(device),
            mesh,
            placements,
            run_check=False,
            shape=torch.Size(shape),
            stride=_contiguous_stride(shape),
        )
    return tensors


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))

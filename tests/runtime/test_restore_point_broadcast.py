"""The restore point's broadcast between real gloo ranks, from an arena in /dev/shm.

A replacement pod on another node holds no restore point: at the generation's start the
lowest rank holding the newest one sends it (``restore_point.agree``). Held in the pod's
shared memory (``torchjob.train.recovery.shm_keep``), its tensors are views of one block
of several dtypes, which ``torch.save`` refuses; the broadcast sends the layout and the
block's bytes instead. Here rank 0 holds one in its slot and rank 1 receives it; then the
roles turn, and rank 1 sends on what it received; then both hold it, and nothing moves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from torchjob.launch import WorkerGroup


def _state(seed: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt, "step": seed}


def _flat(state: dict[str, Any]) -> list[float]:
    from torchjob.train.recovery import restore_point

    sd = restore_point.state_of(state)
    opt = sd["optimizer"]["state"]
    parts = [t.flatten() for t in sd["model"].values()]
    parts += [opt[i][k].flatten() for i in sorted(opt) for k in ("exp_avg", "exp_avg_sq")]
    import torch

    return [float(x) for x in torch.cat(parts)]


def _round(directory: str) -> dict[str, Any]:
    import torch.distributed as dist

    from torchjob.launch.settings import ENV_RESTORE_POINT_DIR
    from torchjob.train.recovery import restore_point

    os.environ[ENV_RESTORE_POINT_DIR] = directory
    rank = dist.get_rank()
    live = _state(7)
    if rank == 0:
        held = restore_point.take("run", 5, live, [{"epoch": 2}])
        assert held is not None and held.arena is not None and held.arena.path is not None
    first = restore_point.agree("run", rank, 2)
    assert first is not None
    received_first = first.received
    mine = _state(0)  # another state: what is loaded must be the sent one
    restore_point.load_into(mine, first.snapshot.state)
    loaded = _flat(mine)
    if rank == 0:
        restore_point.drop()  # now rank 1 holds the newest, as it received it
    second = restore_point.agree("run", rank, 2)
    assert second is not None
    third = restore_point.agree("run", rank, 2)  # both hold it now: nothing moves
    assert third is not None
    return {
        "third": (third.received, third.source_rank, third.snapshot.index),
        "received_first": received_first,
        "loaded": loaded,
        "expected": _flat(live),
        "received_second": second.received,
        "second_index": second.snapshot.index,
        "positions": second.snapshot.positions,
        "second": _flat(_loaded(second.snapshot.state)),
    }


def _loaded(state: dict[str, Any]) -> dict[str, Any]:
    from torchjob.train.recovery import restore_point

    target = _state(0)
    restore_point.load_into(target, state)
    return target


def test_a_restore_point_in_shared_memory_is_sent_and_sent_on(tmp_path: Path) -> None:
    with WorkerGroup(2, backend="gloo", timeout_s=60) as group:
        r0, r1 = group.execute(_round, str(tmp_path))
    assert not r0["received_first"] and r1["received_first"]
    assert r0["loaded"] == r0["expected"] and r1["loaded"] == r0["expected"]
    assert r0["received_second"] and not r1["received_second"]
    assert r0["second_index"] == 5 and r0["positions"] == [{"epoch": 2}]
    assert r0["second"] == r0["expected"]
    assert r0["third"] == r1["third"] == (False, -1, 5)


def _three(directory: str) -> dict[str, Any]:
    import torch.distributed as dist

    from torchjob.launch.settings import ENV_RESTORE_POINT_DIR
    from torchjob.train.recovery import restore_point

    os.environ[ENV_RESTORE_POINT_DIR] = directory
    rank = dist.get_rank()
    live = _state(3)
    if rank in (0, 2):  # two survivors hold it; rank 1 is a replacement
        restore_point.take("run", 9, live, [])
    got = restore_point.agree("run", rank, 3)
    assert got is not None
    return {
        "received": got.received,
        "source": got.source_rank,
        "state": _flat(_loaded(got.snapshot.state)),
        "expected": _flat(live),
    }


def test_only_the_rank_without_it_receives_the_restore_point(tmp_path: Path) -> None:
    """Three ranks, two of which hold the newest restore point (survivors) and one not (a
    replacement): only the replacement receives it, from a holder; the holders keep theirs
    and send nothing to each other."""
    with WorkerGroup(3, backend="gloo", timeout_s=60) as group:
        got = group.execute(_three, str(tmp_path / "three"))
    assert [g["received"] for g in got] == [False, True, False]
    assert got[1]["source"] == 0 and got[0]["source"] == 0
    assert all(g["state"] == got[0]["expected"] for g in got)

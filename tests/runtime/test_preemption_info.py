"""``get_preemption_info()`` and report()'s one all-reduce, on real processes: every rank
gets one answer, the union of what each read (each rank reads its pod's notice file; here
rank 0's pod alone has one yet), gathered only when a notice changed; and the ranks agree on
one restore-point cadence."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from torchjob.launch import WorkerGroup, worker_info
from torchjob.train.recovery.preemption import NoticeReader, PreemptionInfo, agree


def _agreed(paths: list[str]) -> dict[str, object] | None:
    info = worker_info()
    assert info is not None
    got = agree(NoticeReader(Path(paths[info.rank])).read())
    return None if got is None else got.to_json()


def test_every_rank_gets_the_same_notice_though_only_one_read_it(
    group3: WorkerGroup, tmp_path: Path
) -> None:
    deadline = datetime.now(timezone.utc) + timedelta(seconds=120)
    notice = PreemptionInfo(deadline, ranks=(2,), pods=("j-worker-2",), reasons=("aws",))
    paths = [str(tmp_path / f"notice-{r}.json") for r in range(3)]
    Path(paths[0]).write_text(__import__("json").dumps(notice.to_json()))
    assert group3.execute(_agreed, paths) == [notice.to_json()] * 3
    # No notice anywhere: None on every rank.
    Path(paths[0]).unlink()
    assert group3.execute(_agreed, paths) == [None] * 3


def _session_args(info: Any) -> dict[str, Any]:
    return {
        "world_rank": info.rank,
        "local_rank": info.rank,
        "world_size": info.world_size,
        "local_world_size": info.world_size,
        "node_rank": 0,
        "generation": 0,
        "experiment_name": "notice",
        "run_path": "",
        "device": "cpu",
        "storage_url": None,
        "num_to_keep": None,
        "score_attribute": None,
        "score_order": "max",
    }


def _asked_every_step(paths: list[str], notice: dict[str, object]) -> dict[str, object]:
    """A loop that reports, then asks ``get_preemption_info()``, six times; rank 0's pod is
    given notice before the third report. Counts the gathers of notices."""
    import json

    from torchjob.train import _session, get_preemption_info, report
    from torchjob.train.recovery import preemption

    info = worker_info()
    assert info is not None
    preemption._reader = NoticeReader(Path(paths[info.rank]))
    gathers = 0
    gather = preemption.agree

    def counted(local: PreemptionInfo | None) -> PreemptionInfo | None:
        nonlocal gathers
        gathers += 1
        return gather(local)

    preemption.agree = counted
    _session.set_current(_session.Session(**_session_args(info)))
    seen = []
    try:
        for i in range(6):
            if i == 2 and info.rank == 0:
                Path(paths[0]).write_text(json.dumps(notice))
            report({"i": i})
            got = get_preemption_info()
            seen.append(None if got is None else got.to_json())
    finally:
        _session.set_current(None)
        preemption.agree = gather
        preemption._reader = None
    return {"seen": seen, "gathers": gathers}


def test_a_loop_that_asks_every_step_gathers_notices_only_when_one_changed(
    group3: WorkerGroup, tmp_path: Path
) -> None:
    """The notices' digest rides on report()'s all-reduce: the answer is the same on every
    rank from the report after the notice was written, and the notices were gathered once
    (when the digest moved), not at each of the six calls."""
    deadline = datetime.now(timezone.utc) + timedelta(seconds=120)
    notice = PreemptionInfo(deadline, ranks=(0,), pods=("j-worker-0",), reasons=("aws",))
    paths = [str(tmp_path / f"notice-{r}.json") for r in range(3)]
    got = group3.execute(_asked_every_step, paths, notice.to_json())
    expected = [None, None] + [notice.to_json()] * 4
    assert got == [{"seen": expected, "gathers": 1}] * 3


def _copied_at(slow_rank: int, poll: bool = False) -> list[int]:
    """30 reports of a 9 MiB registered state (over the 8 MiB a budget applies to), one rank's
    copies slowed 20 ms: the report index of the restore point held after each report.
    ``poll``: the docs' loop, ``should_stop()`` before each report."""
    import time

    import torch

    from torchjob.train import _session, register_state, report, should_stop
    from torchjob.train.recovery import restore_point

    info = worker_info()
    assert info is not None
    take = restore_point.take

    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)
        return take(*args, **kwargs)

    if info.rank == slow_rank:
        restore_point.take = slowed
    _session.set_current(_session.Session(**_session_args(info)))
    held = []
    try:
        register_state({"w": torch.zeros(9 * 2**18), "step": 0})
        for i in range(30):
            time.sleep(0.05)
            if poll:
                should_stop()
            report({"i": i})
            snap = restore_point.held()
            held.append(-1 if snap is None else snap.index)
    finally:
        _session.set_current(None)
        restore_point.take = take
        restore_point.drop()
    return held


@pytest.mark.parametrize("poll", [False, True], ids=["report", "should_stop-then-report"])
def test_ranks_whose_copies_cost_differently_hold_the_same_restore_points(
    group3: WorkerGroup, poll: bool
) -> None:
    """Each rank would choose its own cadence from its own copies, and a collective waits
    for whichever rank copies: the job would pay every rank's copies. report()'s all-reduce
    agrees on one, so after every report each rank holds the same report's restore point
    (the one a re-formed group resumes from), and not every report copies."""
    held = group3.execute(_copied_at, 2, poll)
    assert held[0] == held[1] == held[2], held
    assert len(set(held[0])) < len(held[0]), "the 2 % budget skips some reports"


def _all_reduces(poll: bool) -> int:
    """Six steps with a registered state, each ending in ``report()``, after
    ``should_stop()`` when ``poll`` (the docs' loop): how many all-reduces the runtime made."""
    import torch
    import torch.distributed as dist

    from torchjob.train import _session, register_state, report, should_stop
    from torchjob.train.recovery import restore_point

    info = worker_info()
    assert info is not None
    calls = 0
    reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return reduce(*args, **kwargs)

    _session.set_current(_session.Session(**_session_args(info)))
    dist.all_reduce = counted
    try:
        register_state({"w": torch.zeros(16), "step": 0})
        for i in range(6):
            if poll:
                should_stop()
            report({"i": i})
    finally:
        dist.all_reduce = reduce
        _session.set_current(None)
        restore_point.drop()
    return calls


def test_the_docs_loop_makes_one_all_reduce_per_step_not_two(group3: WorkerGroup) -> None:
    """should_stop() agreed the stop flags, the notices' digest and the cadence; the report
    after it needs no all-reduce of its own (it made one before: 12 for six steps). A loop
    that reports without asking still agrees at each report."""
    assert group3.execute(_all_reduces, True) == [6, 6, 6]
    assert group3.execute(_all_reduces, False) == [6, 6, 6]

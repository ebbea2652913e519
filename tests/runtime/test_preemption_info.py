"""``get_preemption_info()`` on real processes: every rank gets one answer, the union of what
each read (each rank reads its pod's notice file; here rank 0's pod alone has one yet)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

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

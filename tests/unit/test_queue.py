"""``engine.queue.WorkQueue``: one loop per key for any controller (the TorchJob and the
TorchTune controllers both run on it)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from torchjob_operator.engine.queue import Key, Result, WorkQueue


class Scripted:
    """A controller whose reconciles answer from a script, one entry per call."""

    kind = "scripted"

    def __init__(self, *answers: Result | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[Key] = []
        self.forgotten: list[Key] = []

    def keys(self, namespaces: tuple[str, ...]) -> list[Key]:
        return [("ns", "a"), ("ns", "b")]

    def catching_up(self, key: Key) -> float | None:
        return None

    def reconcile(self, namespace: str, name: str) -> Result:
        self.calls.append((namespace, name))
        answer = self.answers.pop(0) if self.answers else Result(gone=True)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def forget(self, key: Key) -> None:
        self.forgotten.append(key)


async def _until(cond: object, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)


def test_a_requeue_of_zero_runs_again_at_once_and_gone_ends_the_loop() -> None:
    async def main() -> None:
        ctl = Scripted(Result(requeue_after_s=0.0), Result(requeue_after_s=0.0), Result(gone=True))
        drops: list[bool] = []
        queue = WorkQueue(ctl, resync_s=60.0, on_drop=lambda: drops.append(True))
        queue.poke(("ns", "a"))
        await _until(lambda: not queue.loops)
        assert ctl.calls == [("ns", "a")] * 3
        assert ctl.forgotten == [("ns", "a")] and drops == [True]

    asyncio.run(main())


def test_a_failed_reconcile_is_retried_and_the_loop_survives() -> None:
    async def main() -> None:
        ctl = Scripted(RuntimeError("boom"), Result(gone=True))
        queue = WorkQueue(ctl, resync_s=60.0)
        queue.poke(("ns", "a"))
        await _until(lambda: not queue.loops)  # retried after 1 s, then gone
        assert ctl.calls == [("ns", "a")] * 2

    asyncio.run(main())


def test_only_a_leader_runs_loops() -> None:
    async def main() -> None:
        ctl = Scripted(Result(), Result(), Result(), Result())
        queue = WorkQueue(ctl, resync_s=60.0, leading=False)
        queue.poke(("ns", "a"))
        assert not queue.loops and not ctl.calls
        await queue.start_leading(())
        await _until(lambda: len(ctl.calls) == 2)
        assert set(queue.loops) == {("ns", "a"), ("ns", "b")}
        queue.stop_leading()
        assert not queue.loops and sorted(ctl.forgotten) == [("ns", "a"), ("ns", "b")]
        queue.poke(("ns", "a"))
        assert not queue.loops

    asyncio.run(main())


def test_a_reconcile_that_ends_long_after_its_event_says_where_the_time_went(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poke that waits behind a running reconcile, then a slow reconcile of its own: the
    log says how long after the event it ended, and how much of that was waiting."""
    monkeypatch.setattr("torchjob_operator.engine.queue.SLOW_S", 0.8)

    class Slow(Scripted):
        def reconcile(self, namespace: str, name: str) -> Result:
            answer = super().reconcile(namespace, name)
            time.sleep(0.5)
            return answer

    async def main() -> None:
        ctl = Slow(Result(), Result(gone=True))
        queue = WorkQueue(ctl, resync_s=60.0)
        queue.poke(("ns", "a"))
        await _until(lambda: ctl.calls)
        queue.poke(("ns", "a"))  # while the first runs: it waits ~0.5 s, then runs 0.5 s
        await _until(lambda: not queue.loops)

    with caplog.at_level(logging.INFO, logger="torchjob_operator"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if "after the event that woke it" in r.message]
    waits = [float(m.split("(")[1].split("s before it began")[0]) for m in said]
    assert said and said[-1].startswith("[ns/a] scripted reconcile ended "), said
    assert waits[-1] >= 0.2, said  # the second waited behind the first

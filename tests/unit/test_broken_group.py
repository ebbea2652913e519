"""A group every member left with its own workers alive (torchjob_operator/torchjob/broken.py):
each member says so in ``status.silentWorkers`` (``how: broken``, about itself); once all
have and no pod is lost, the next generation re-forms the same members, uncharged, unless it
broke again before a step (then it is a charged restart, and the budget ends it)."""

from __future__ import annotations

from typing import Any

from tests.unit.builders import at, job, running
from tests.unit.test_planner import apply, step

from torchjob.api.models import Phase, SilentWorker
from torchjob_operator.torchjob.observed import JobState, PodView
from torchjob_operator.torchjob.plan import JobView, Plan, plan, with_state

NAMES = [f"tj-worker-{i}" for i in range(3)]


def broke(view: JobView, status: dict[str, Any], generation: int, *by: str) -> JobView:
    """``view`` once the pods ``by`` each said their group of ``generation`` broke."""
    entries = [
        {"pod": p, "generation": generation, "by": p, "how": SilentWorker.BROKEN} for p in by
    ]
    return with_state(view, {**status, "silentWorkers": entries})


def settled(max_restarts: int = 5) -> tuple[JobView, dict[str, Any], list[PodView]]:
    """Three KeepSurvivors pods running generation 0."""
    built = job().replicas(3).keep_survivors().max_restarts(max_restarts).build()
    _, view, pods = step(built, [], 0)
    up = [running(p) for p in pods]
    ready, view, _ = step(view, up, 1)
    assert ready.phase == Phase.RUNNING
    return view, ready.status, up


def reformed(decided: Plan, pods: list[PodView]) -> list[PodView]:
    """The pods once ``decided`` is carried out, running."""
    return [running(p) for p in apply(decided, pods)]


def test_every_member_broken_with_none_lost_reforms_the_same_members_uncharged() -> None:
    view, status, up = settled()
    decided = plan(broke(view, status, 0, *NAMES), up, at(10))
    st = decided.status
    assert (st["currentGeneration"], st["replicas"], st["restarts"], st["disruptions"]) == (
        1,
        3,
        0,
        0,
    )
    assert st.get("members") is None, "the same rank order"
    assert decided.create is None and decided.delete == ()
    assert sorted(decided.relabel) == NAMES, "all kept, relabelled with generation 1"
    assert st.get("restartAfter") is None, "no backoff"
    warned = [e for e in decided.events if e.reason == "GroupBroken"]
    assert len(warned) == 1 and warned[0].type == "Warning"
    assert "every one of the 3 members of generation 0" in warned[0].message
    assert "not charged" in warned[0].message
    record = st["history"][-1]
    assert (record["generation"], record["cause"]) == (1, "GroupBroken")
    assert st["losses"] == {"GroupBroken": 1}
    # Carried out, the reports of generation 0 count for nothing in generation 1.
    after = plan(broke(with_state(view, st), st, 0, *NAMES), reformed(decided, up), at(11))
    assert after.status["currentGeneration"] == 1


def test_not_every_member_said_it_or_another_generation_it_waits() -> None:
    view, status, up = settled()
    for said in (broke(view, status, 0, *NAMES[:2]), broke(view, status, 1, *NAMES)):
        decided = plan(said, up, at(10))
        assert decided.status["currentGeneration"] == 0
        assert not any(e.reason == "GroupBroken" for e in decided.events)
    # ``broken`` about another pod is no pod's word on its own group.
    crossed = [
        {"pod": NAMES[(i + 1) % 3], "generation": 0, "by": n, "how": SilentWorker.BROKEN}
        for i, n in enumerate(NAMES)
    ]
    assert JobState.from_status({**status, "silentWorkers": crossed}).broken == ()
    # And a pod's word on its own group is no silent peer.
    own = broke(view, status, 0, *NAMES).state
    assert own.silent == () and len(own.broken) == 3


def test_a_member_lost_is_a_loss_not_a_broken_group() -> None:
    """Every pod said its group broke, and one has gone: the loss decides (replaced at full
    size, a disruption), not the broken group."""
    view, status, up = settled()
    gone = [up[0], up[1]]  # tj-worker-2 deleted by someone else
    decided = plan(broke(view, status, 0, *NAMES), gone, at(10))
    assert not any(e.reason == "GroupBroken" for e in decided.events)
    assert decided.status["disruptions"] == 1


def test_broken_again_before_a_step_is_charged_and_the_budget_ends_it() -> None:
    view, status, up = settled(max_restarts=1)
    first = plan(broke(view, status, 0, *NAMES), up, at(10))
    pods, view = reformed(first, up), with_state(view, first.status)
    ready = plan(view, pods, at(11))
    view = with_state(view, ready.status)
    # Generation 1 never trained a step (no progress report), and broke again.
    again = plan(broke(view, ready.status, 1, *NAMES), pods, at(12))
    st = again.status
    assert (st["currentGeneration"], st["restarts"], st["disruptions"]) == (2, 1, 0)
    assert st["restartAfter"] is not None, "a charged restart waits its backoff"
    assert again.create is None and sorted(again.relabel) == NAMES
    said = next(e.message for e in again.events if e.reason == "GroupBroken")
    assert "broke again before a step: restart 1/1" in said
    assert st["losses"] == {"GroupBroken": 2}
    pods, view = reformed(again, pods), with_state(view, st)
    ready = plan(view, pods, at(40))  # past the backoff
    view = with_state(view, ready.status)
    last = plan(broke(view, ready.status, 2, *NAMES), pods, at(41))
    assert last.phase == Phase.FAILED
    assert any(e.reason == "RestartLimitExceeded" for e in last.events)
    assert last.status["restarts"] == 1


def test_a_generation_that_trained_breaking_is_uncharged_again() -> None:
    view, status, up = settled(max_restarts=0)
    first = plan(broke(view, status, 0, *NAMES), up, at(10))
    pods, view = reformed(first, up), with_state(view, first.status)
    st = plan(view, pods, at(11)).status
    trained = {"generation": 1, "step": 5, "firstStepTime": "2026-01-01T00:00:12Z"}
    view = with_state(view, {**st, "progress": trained})
    st = plan(view, pods, at(13)).status  # the record of generation 1 recovers
    assert st["history"][-1]["recoverySeconds"] is not None
    again = plan(broke(with_state(view, st), st, 1, *NAMES), pods, at(20))
    assert again.status["currentGeneration"] == 2 and again.status["restarts"] == 0
    assert any(e.reason == "GroupBroken" for e in again.events)


def test_a_silent_report_that_waits_to_count_decides_instead() -> None:
    """A partition breaks every member's group too, and the report naming rank 0's pod waits
    RANK0_HOLD_S before it counts: the broken group waits with it, and the loss decides."""
    view, status, up = settled()
    entries = [
        {"pod": n, "generation": 0, "by": n, "how": SilentWorker.BROKEN} for n in NAMES
    ] + [
        {"pod": NAMES[0], "generation": 0, "by": NAMES[2], "how": "heartbeat", "seconds": 5.0,
         "at": "2026-01-01T00:00:10.000Z"}
    ]  # fmt: skip
    said = with_state(view, {**status, "silentWorkers": entries})
    held = plan(said, up, at(10.5))
    assert held.status["currentGeneration"] == 0 and held.requeue_after_s is not None
    assert not any(e.reason == "GroupBroken" for e in held.events)
    counted = plan(said, up, at(20))
    assert counted.status["currentGeneration"] == 1 and counted.status["disruptions"] == 1
    assert not any(e.reason == "GroupBroken" for e in counted.events)
    assert counted.status["history"][-1]["cause"] == "SilentPeer"

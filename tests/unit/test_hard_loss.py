"""A hard loss under KeepSurvivors (operator/.../torchjob/loss.py over ``torchjob.rules``): a
pod whose trainer was SIGKILLed with no OOM evidence is a disruption (never charged), an OOM
kill a charged failure with no backoff; either way an elastic job that shrinks on a loss goes
on smaller at once from the survivors' memory."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest
from tests.unit.builders import at, failed, job, running
from tests.unit.test_planner import step

from torchjob import contract
from torchjob.launch import WorkerDiedError
from torchjob.launch.termination import failure_message
from torchjob.rules import Disruption, Failure
from torchjob_operator.torchjob.observed import PodView, pod_view
from torchjob_operator.torchjob.plan import JobView, plan


def elastic_keep(replicas: int = 2, lo: int = 1, shrink: bool = True) -> JobView:
    builder = job().replicas(replicas).elastic(lo, replicas).keep_survivors().max_restarts(10)
    builder.spec["elastic"]["shrinkOnDisruption"] = shrink
    return builder.build()


def trainer_killed(p: PodView, *, oom: bool = False, at_s: float = 5) -> PodView:
    """The pod's worker process was SIGKILLed (by the OOM killer: ``oom``); its driver exited
    1 and said so."""
    said = contract.parse_termination_message(failure_message(WorkerDiedError(1, -9, oom=oom)))
    assert said is not None and said.killed and said.oom is oom
    return replace(failed(p, 1, at_s=at_s), summary=said.line, killed=True, oom=said.oom)


def oom_killed(p: PodView, at_s: float = 5) -> PodView:
    """The kubelet says the container was OOMKilled."""
    return replace(failed(p, 137, at_s=at_s), reason="OOMKilled")


def test_the_runtime_says_a_sigkilled_worker_and_the_operator_reads_it() -> None:
    text = failure_message(WorkerDiedError(1, -9))
    assert text == "torchjob: killed: rank 1 worker process died: killed by SIGKILL"
    oom = failure_message(WorkerDiedError(1, -9, oom=True))
    assert oom == (
        "torchjob: killed: oom: rank 1 worker process died: killed by SIGKILL (the OOM killer)"
    )

    def view_of(message: str) -> PodView:
        labels = {contract.LABEL_POD_INDEX: "1", contract.LABEL_GENERATION: "0"}
        terminated = {"exitCode": 1, "reason": "Error", "message": message}
        body = {
            "metadata": {"name": "tj-worker-1", "labels": labels},
            "status": {
                "phase": "Failed",
                "containerStatuses": [{"state": {"terminated": terminated}}],
            },
        }
        view = pod_view(body)
        assert view is not None
        return view

    killed = view_of(text)
    assert killed.killed and killed.loss == Disruption("killed by SIGKILL")
    assert killed.summary == "rank 1 worker process died: killed by SIGKILL"
    assert view_of(oom).loss == Failure(137, signal.SIGKILL, oom=True)
    # An exception, or a worker that exited on its own, is no kill.
    own = failure_message(WorkerDiedError(1, 3))
    assert not contract.parse_termination_message(own).killed  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("how", "charged"),
    [
        ("container-137", False),
        ("trainer-sigkill", False),
        ("oom", True),
        ("trainer-oom", True),
    ],
)
def test_a_hard_loss_shrinks_at_once_and_the_replacement_joins_when_ready(
    how: str, charged: bool
) -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    lost = {
        "container-137": failed(up[1], 137, at_s=5),
        "trainer-sigkill": trainer_killed(up[1]),
        "oom": oom_killed(up[1]),
        "trainer-oom": trainer_killed(up[1], oom=True),
    }[how]
    decided, view, pods = step(view, [up[0], lost], 5)
    st = decided.status
    assert (st["currentGeneration"], st["replicas"], st["worldSize"]) == (1, 1, 1)
    counted = (1, 0) if charged else (0, 1)
    assert (st["restarts"], st["disruptions"]) == counted, "an OOM is charged, a kill is not"
    assert st.get("restartAfter") is None, "no backoff"
    assert decided.relabel == ("tj-worker-0",) and decided.create is None
    assert decided.delete == ("tj-worker-1",), "the killed pod goes; the survivor stays"
    reason = "ShrunkAfterLoss" if charged else "ShrunkAfterDisruption"
    shrunk = next(e for e in decided.events if e.reason == reason)
    assert "1 of 2 workers" in shrunk.message
    assert ("survivors' memory" in shrunk.message) is charged
    # The killed pod is gone: its replacement is created at once, as a joiner of generation 2.
    joining, view, pods = step(view, pods, 6)
    assert joining.create is not None and joining.create.joiners
    assert (joining.create.indices, joining.create.generation) == ((1,), 2)
    assert joining.status["currentGeneration"] == 1
    grown, view, pods = step(view, [running(p) for p in pods], 12)
    assert grown.status["currentGeneration"] == 2 and grown.status["replicas"] == 2
    assert "ScaledUp" in {e.reason for e in grown.events}
    assert (grown.status["restarts"], grown.status["disruptions"]) == counted


def test_repeated_oom_kills_never_wait_for_a_backoff() -> None:
    """The issue's run: recoveries of 23.8 s, 30.9 s, 52.0 s as the backoff doubled."""
    _, view, pods = step(elastic_keep(), [], 0)
    pods = [running(p) for p in pods]
    now = 1.0
    for n in range(1, 5):
        victim = pods[n % 2]
        others = [p for p in pods if p is not victim]
        decided, view, pods = step(view, [*others, oom_killed(victim, at_s=now)], now)
        assert decided.status["restarts"] == n
        assert decided.status.get("restartAfter") is None
        assert "ShrunkAfterLoss" in {e.reason for e in decided.events}
        joining, view, pods = step(view, pods, now + 0.5)
        assert joining.create is not None, f"loss {n}: the replacement is created at once"
        grown, view, pods = step(view, [running(p) for p in pods], now + 5)
        assert grown.status["replicas"] == 2
        pods = [running(p) for p in pods]
        now += 20


@pytest.mark.parametrize(
    ("shrink", "how", "restarts", "backoff"),
    [
        pytest.param(False, "oom", 1, False, id="not-asked-to-shrink: full size, no backoff"),
        pytest.param(False, "kill", 0, False, id="a-kill-not-asked-to-shrink: full size, free"),
        pytest.param(True, "exit-1", 1, True, id="an-exception: full size after the backoff"),
    ],
)
def test_no_shrink_without_a_hard_loss_or_the_opt_in(
    shrink: bool, how: str, restarts: int, backoff: bool
) -> None:
    _, view, pods = step(elastic_keep(shrink=shrink), [], 0)
    up = [running(p) for p in pods]
    lost = {"oom": oom_killed(up[1]), "kill": failed(up[1], 137, at_s=5)}.get(how)
    decided, view, pods = step(view, [up[0], lost or failed(up[1], 1, at_s=5)], 5)
    assert decided.status["replicas"] == 2 and decided.status["restarts"] == restarts
    assert {"ShrunkAfterLoss", "ShrunkAfterDisruption"}.isdisjoint(e.reason for e in decided.events)
    waits = decided.status.get("restartAfter") not in (None, "2026-01-01T00:00:05Z")
    assert waits is backoff
    later = plan(view, pods, at(5.5))
    assert (later.create is None) is backoff, "no backoff: the replacement is created at once"


def test_below_min_replicas_a_hard_loss_replaces_at_full_size() -> None:
    _, view, pods = step(elastic_keep(replicas=3, lo=3), [], 0)
    up = [running(p) for p in pods]
    decided = plan(view, [up[0], up[1], oom_killed(up[2])], at(5))
    assert decided.status["replicas"] == 3
    assert decided.status.get("restartAfter") == "2026-01-01T00:00:05Z", "no backoff"
    assert "ShrunkAfterLoss" not in {e.reason for e in decided.events}
    killed = plan(view, [up[0], up[1], failed(up[2], 137, at_s=5)], at(5))
    assert killed.status["replicas"] == 3 and killed.status["disruptions"] == 1
    assert killed.status.get("restartAfter") is None and killed.status["restarts"] == 0

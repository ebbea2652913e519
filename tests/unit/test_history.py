"""status.history (issue 41): one record per generation, why it began, who left and joined,
and what the recovery cost, completed from rank 0's progress report."""

from __future__ import annotations

from dataclasses import replace

from tests.unit.builders import at, failed, job, running
from tests.unit.test_planner import step

from torchjob.api.models import HISTORY_LIMIT, GenerationRecord
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import JobView, plan, with_state


def elastic_keep() -> JobView:
    builder = job().replicas(3).elastic(1, 3).keep_survivors().max_restarts(10)
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    return builder.build()


def on_node(p: PodView, node: str) -> PodView:
    return replace(running(p), node=node, scheduled=True)


def reported(view: JobView, status: dict, **progress: object) -> JobView:
    """The job after rank 0's runtime wrote ``progress`` into the status."""
    return with_state(view, {**status, "progress": progress})


def test_a_loss_is_recorded_with_its_cause_its_pods_and_its_recovery() -> None:
    decided, view, pods = step(elastic_keep(), [], 0)
    start = decided.status["history"]
    assert [(r["generation"], r["cause"], r["worldSize"]) for r in start] == [(0, "Start", 3)]
    assert [e.reason for e in decided.events if e.reason == "GenerationStarted"]
    up = [on_node(p, f"node-{p.index % 2}") for p in pods]
    ran, view, pods = step(view, up, 5)
    view = reported(view, ran.status, generation=0, step=40, firstStepTime="2026-01-01T00:00:06Z")
    # Pod 1 dies with exit 137 (its container killed) at t=20.
    lost = replace(failed(up[1], 137, at_s=20), node="node-1")
    decided, view, pods = step(view, [up[0], lost, up[2]], 21)
    records = decided.status["history"]
    assert [r["generation"] for r in records] == [0, 1]
    loss = records[1]
    assert loss["cause"] == "Killed", loss  # a kill from outside: a disruption, uncharged
    assert loss["left"] == ["tj-worker-1@node-1"] and loss.get("joined") is None, loss
    assert loss["worldSize"] == 2 and loss["stepAtLoss"] == 40
    assert loss["lossTime"].startswith("2026-01-01T00:00:20"), loss
    assert "recoverySeconds" not in loss, loss
    # Rank 0 of generation 1 restored step 39 from memory and finished a step at t=22.5.
    view = reported(
        view,
        decided.status,
        generation=1,
        step=40,
        restoredFrom="memory",
        restoredStep=39,
        firstStepTime="2026-01-01T00:00:22.500Z",
    )
    again = plan(view, [up[0], up[2]], at(23))
    done = again.status["history"][1]
    assert done["restoredFrom"] == "memory" and done["stepsLost"] == 1, done
    assert done["recoverySeconds"] == 2.5, done
    recovered = [e for e in again.events if e.reason == "Recovered"]
    assert recovered and "2.5s after the loss" in recovered[0].message
    assert "restored from memory, 1 steps done again" in recovered[0].message
    # Nothing new to say on the next pass.
    quiet = plan(with_state(view, again.status), [up[0], up[2]], at(24))
    assert quiet.status["history"] == again.status["history"]
    assert not [e for e in quiet.events if e.reason in ("GenerationStarted", "Recovered")]


def test_the_history_keeps_the_last_generations() -> None:
    last = HISTORY_LIMIT - 1
    full = [
        GenerationRecord(generation=g, began="2026-01-01T00:00:00Z", cause="Restart").to_wire()
        for g in range(HISTORY_LIMIT)
    ]
    view = with_state(
        elastic_keep(),
        {"currentGeneration": last, "replicas": 3, "phase": "Running", "history": full},
    )
    pods = [replace(running(p), generation=last) for p in step(elastic_keep(), [], 0)[2]]
    decided = plan(view, [pods[0], failed(pods[1], 137, at_s=1), pods[2]], at(2))
    assert decided.status["currentGeneration"] == HISTORY_LIMIT
    records = decided.status["history"]
    assert len(records) == HISTORY_LIMIT
    assert records[0]["generation"] == 1 and records[-1]["generation"] == HISTORY_LIMIT


def test_a_job_from_before_the_history_starts_it_with_its_next_generation() -> None:
    view = with_state(elastic_keep(), {"currentGeneration": 4, "replicas": 3, "phase": "Running"})
    pods = [running(p) for p in step(elastic_keep(), [], 0)[2]]
    pods = [replace(p, generation=4) for p in pods]
    decided = plan(view, pods, at(0))
    assert "history" not in decided.status, "nothing invented for generations it did not see"
    assert not [e for e in decided.events if e.reason == "GenerationStarted"]


def test_torchjob_history_prints_one_row_per_generation() -> None:
    from torchjob.client.table import history_table

    obj = {
        "status": {
            "history": [
                {
                    "generation": 0,
                    "began": "2026-01-01T00:00:00.000Z",
                    "cause": "Start",
                    "worldSize": 3,
                    "joined": ["tj-worker-0@a", "tj-worker-1@b"],
                },
                {
                    "generation": 1,
                    "began": "2026-01-01T00:01:00.000Z",
                    "cause": "SilentPeer",
                    "worldSize": 2,
                    "left": ["tj-worker-0@a"],
                    "restoredFrom": "memory",
                    "recoverySeconds": 8.84,
                    "stepsLost": 1,
                },
            ]
        }
    }
    t = history_table(obj)
    assert t.rows[1] == [
        "1",
        "2026-01-01 00:01:00",
        "SilentPeer",
        "2",
        "tj-worker-0@a",
        "-",
        "memory",
        "8.8s",
        "1",
    ]
    assert t.rows[0][4:6] == ["-", "tj-worker-0@a, tj-worker-1@b"]


def test_a_silent_peers_loss_is_dated_from_when_it_went_silent() -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [on_node(p, "node-a") for p in pods]
    ran, view, pods = step(view, up, 5)
    report = {"pod": "tj-worker-2", "generation": 0, "by": "tj-worker-0", "seconds": 6.0}
    view = with_state(view, {**ran.status, "silentWorkers": [report]})
    decided = plan(view, up, at(30))
    record = decided.status["history"][-1]
    assert (record["generation"], record["cause"]) == (1, "SilentPeer"), record
    assert record["left"] == ["tj-worker-2@node-a"]
    assert record["lossTime"] == "2026-01-01T00:00:24.000Z", "30 s, less the 6 s of silence"


def test_recreate_group_records_every_pod_as_replaced() -> None:
    """RecreateGroup deletes the healthy pods too: the record says all left and all joined,
    the one whose collective had not broken yet included."""
    _, view, pods = step(job().replicas(2).max_restarts(3).build(), [], 0)
    up = [on_node(p, f"node-{p.index}") for p in pods]
    _, view, pods = step(view, up, 5)
    decided, _, _ = step(view, [up[0], replace(failed(up[1], 1, at_s=20), node="node-1")], 21)
    record = decided.status["history"][-1]
    assert (record["generation"], record["cause"]) == (1, "Failure"), record
    assert record["left"] == ["tj-worker-0@node-0", "tj-worker-1@node-1"], record
    assert record["joined"] == ["tj-worker-0", "tj-worker-1"], record


def test_joined_names_the_node_of_a_joiner_placed_ahead_and_none_for_a_pod_made_with_it() -> None:
    """A joiner is created ahead and taken in once Ready: the record names it ``pod@node``.
    A pod replaced under its name at full size is created with the generation and has no node
    yet: the record names it alone, and its peers' formation gives it the time to start
    before naming it absent (``Membership.placed``; the old pod's node is not its node)."""
    _, view, pods = step(elastic_keep(), [], 0)
    up = [on_node(p, f"node-{p.index % 2}") for p in pods]
    _, view, pods = step(view, up, 5)
    _, view, _ = step(view, [up[0], replace(failed(up[1], 137, at_s=20), node="node-1"), up[2]], 21)
    _, view, pods = step(view, [up[0], up[2]], 22)
    joiner = next(p for p in pods if p.joiner)
    ready = replace(on_node(joiner, "node-3"), ready=True)
    grown, _, _ = step(view, [up[0], up[2], ready], 30)
    record = grown.status["history"][-1]
    assert (record["generation"], record["joined"]) == (2, ["tj-worker-1@node-3"]), record
    assert GenerationRecord.model_validate(record).placed_joiners() == {"tj-worker-1"}

    _, view, pods = step(job().replicas(3).keep_survivors().max_restarts(10).build(), [], 0)
    up = [on_node(p, f"node-{p.index % 2}") for p in pods]
    _, view, pods = step(view, up, 5)
    lost = replace(failed(up[1], 137, at_s=20), node="node-1")
    again, _, _ = step(view, [up[0], lost, up[2]], 21)
    record = again.status["history"][-1]
    assert (record["generation"], record["joined"]) == (1, ["tj-worker-1"]), record
    assert GenerationRecord.model_validate(record).placed_joiners() == set()

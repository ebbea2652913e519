"""The TorchTune study planner (torchjob_operator.torchtune.plan), table by table: a simulated
world of trial TorchJobs is driven through ``plan_study`` the way the operator drives it."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from tests.unit.builders import torchtune

from torchjob import contract
from torchjob_operator.torchtune.plan import plan_study

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def tune(**spec: Any) -> dict[str, Any]:
    grid = [{"name": "x", "type": "grid", "values": [1.0, 2.0, 3.0, 4.0]}]
    meta = {"name": "study", "namespace": "ns", "uid": "u-1", "generation": 1}
    return torchtune(grid, meta, **{"sampler": {"type": "grid"}, "parallelism": 2, **spec})


def job(phase: str | None = None, step: int | None = None, **metrics: float) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if step is not None:
        status["progress"] = {
            "step": step,
            "metrics": metrics,
            "lastCheckpoint": f"/ck/{step}",
        }
    return {"metadata": {}, "spec": {}, "status": status}


def config_of(manifest: dict[str, Any]) -> dict[str, Any]:
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    return dict(json.loads(next(e["value"] for e in env if e["name"] == contract.TUNE_CONFIG)))


def test_first_trials_are_recorded_then_created_and_a_repeat_changes_nothing() -> None:
    tt = tune()
    plan = plan_study(tt, {}, NOW)
    assert [m["metadata"]["name"] for m in plan.create] == ["study-t0", "study-t1"]
    assert [config_of(m) for m in plan.create] == [{"x": 1.0}, {"x": 2.0}]
    owner = plan.create[0]["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("TorchTune", "u-1", True)
    assert plan.status["trialsCreated"] == 2
    assert [t["state"] for t in plan.status["trials"]] == ["Pending", "Pending"]
    # The operator died after the status write, before the creates: the same TorchJobs again.
    again = plan_study({**tt, "status": plan.status}, {}, NOW)
    assert [m["metadata"]["name"] for m in again.create] == ["study-t0", "study-t1"]
    assert again.status["trials"] == plan.status["trials"]


def test_a_study_runs_to_success_with_median_pruning_and_exact_counts() -> None:
    tt = tune(pruner={"type": "median", "startupTrials": 2, "warmupSteps": 0})
    plan = plan_study(tt, {}, NOW)
    tt["status"] = plan.status
    # t0 and t1 report at step 1, then at step 3 and succeed.
    world: dict[str, Any] = {
        "study-t0": job("Running", 1, loss=1.0),
        "study-t1": job("Running", 1, loss=2.0),
    }
    tt["status"] = plan_study(tt, world, NOW).status
    world = {
        "study-t0": job("Succeeded", 3, loss=1.0 / 3),
        "study-t1": job("Succeeded", 3, loss=2.0 / 3),
    }
    plan = plan_study(tt, world, NOW)
    tt["status"] = plan.status
    assert plan.status["trialsSucceeded"] == 2
    assert [m["metadata"]["name"] for m in plan.create] == ["study-t2", "study-t3"]
    # t2 is worse than the median at step 1: pruned; t3 is better and goes on.
    world["study-t2"] = job("Running", 1, loss=3.0)
    world["study-t3"] = job("Running", 1, loss=0.1)
    plan = plan_study(tt, world, NOW)
    tt["status"] = plan.status
    assert plan.prune == ["study-t2"]
    assert plan.status["trialsPruned"] == 1
    # Pruned again until the world shows it: idempotent, counted once.
    plan = plan_study(tt, world, NOW)
    assert plan.prune == ["study-t2"] and plan.status["trialsPruned"] == 1
    world["study-t2"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    world["study-t3"] = job("Succeeded", 3, loss=0.05)
    plan = plan_study(tt, world, NOW)
    tt["status"] = plan.status
    assert plan.prune == [] and plan.create == []
    s = plan.status
    assert (s["phase"], s["trialsCreated"], s["trialsSucceeded"], s["trialsPruned"]) == (
        "Succeeded",
        4,
        3,
        1,
    )
    assert s["trialsRunning"] == 0 and s["trialsFailed"] == 0
    assert s["progress"] == "4/4"
    assert s["bestTrial"] == {
        "number": 3,
        "name": "study-t3",
        "params": {"x": 4.0},
        "value": 0.05,
        "checkpoint": "/ck/3",
    }
    assert s["bestValue"] == 0.05
    assert {c["type"]: c["status"] for c in s["conditions"]} == {
        "Ready": "True",
        "Complete": "True",
    }
    # A finished study stays finished.
    assert plan_study(tt, world, NOW).status["phase"] == "Succeeded"


def test_a_trial_without_the_objective_metric_fails_listing_what_it_reported() -> None:
    tt = tune(parallelism=1, maxTrials=1)
    tt["status"] = plan_study(tt, {}, NOW).status
    plan = plan_study(tt, {"study-t0": job("Succeeded", 2, acc=0.9, lr=0.1)}, NOW)
    trial = plan.status["trials"][0]
    assert trial["state"] == "Failed"
    assert "'loss'" in trial["message"] and "acc, lr" in trial["message"]


def test_too_many_failures_fail_the_study_and_stop_the_running_trials() -> None:
    tt = tune(maxFailedTrials=0)
    tt["status"] = plan_study(tt, {}, NOW).status
    plan = plan_study(tt, {"study-t0": job("Failed"), "study-t1": job("Running", 1, loss=1.0)}, NOW)
    assert plan.status["phase"] == "Failed"
    assert plan.stop == ["study-t1"]
    assert plan.status["trialsFailed"] == 2 and plan.create == []
    failed = {c["type"]: c for c in plan.status["conditions"]}["Failed"]
    assert failed["reason"] == "TooManyFailedTrials" and "spec.maxFailedTrials" in failed["message"]


def test_the_deadline_fails_the_study_and_requeues_until_then() -> None:
    tt = tune(activeDeadlineSeconds=60)
    plan = plan_study(tt, {}, NOW)
    assert plan.requeue_after_s == pytest.approx(60)
    tt["status"] = plan.status
    late = plan_study(
        tt, {"study-t0": job("Running"), "study-t1": job("Running")}, NOW + timedelta(seconds=61)
    )
    assert late.status["phase"] == "Failed" and sorted(late.stop) == ["study-t0", "study-t1"]


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes"])
def test_samplers_draw_within_the_space_and_nest_paths(sampler: str) -> None:
    tt = tune(
        searchSpace=[
            {"name": "train/lr", "type": "loguniform", "low": 1e-4, "high": 1e-1},
            {"name": "train/layers", "type": "int", "low": 1, "high": 4},
            {"name": "opt", "type": "categorical", "values": ["sgd", "adam"]},
        ],
        sampler={"type": sampler, "seed": 7},
        parallelism=3,
        maxTrials=3,
    )
    plan = plan_study(tt, {}, NOW)
    assert len(plan.create) == 3
    for m in plan.create:
        c = config_of(m)
        assert 1e-4 <= c["train"]["lr"] <= 1e-1
        assert 1 <= c["train"]["layers"] <= 4
        assert c["opt"] in ("sgd", "adam")
    # The seed makes a replay identical (an operator restart re-derives nothing differently).
    assert plan_study(tt, {}, NOW).status["trials"] == plan.status["trials"]


def test_successive_halving_keeps_its_rungs_in_the_status() -> None:
    tt = tune(
        searchSpace=[{"name": "x", "type": "uniform", "low": 0, "high": 1}],
        sampler={"type": "random", "seed": 1},
        pruner={"type": "successiveHalving", "minResource": 1, "reductionFactor": 2},
        parallelism=1,
        maxTrials=3,
    )
    tt["status"] = plan_study(tt, {}, NOW).status
    plan = plan_study(tt, {"study-t0": job("Running", 1, loss=0.5)}, NOW)
    attrs = plan.status["trials"][0]["systemAttrs"]
    assert any(k.startswith("completed_rung_") for k in attrs)


def test_an_invalid_spec_fails_the_study_naming_the_field() -> None:
    tt = tune(searchSpace=[])
    plan = plan_study(tt, {}, NOW)
    assert plan.status["phase"] == "Failed" and plan.create == []
    assert (
        "spec.searchSpace must list at least one parameter"
        in plan.status["conditions"][0]["message"]
    )


def test_the_status_of_1000_trials_fits_in_one_object() -> None:
    """Measured: the status (the study's whole storage) at 1,000 trials of 3 parameters and
    10 progress steps each; the API server's limit for an object is 1.5 MiB."""
    tt = tune(
        searchSpace=[
            {"name": "lr", "type": "loguniform", "low": 1e-5, "high": 1e-1},
            {"name": "layers", "type": "int", "low": 1, "high": 8},
            {"name": "opt", "type": "categorical", "values": ["sgd", "adam"]},
        ],
        sampler={"type": "random", "seed": 0},
        parallelism=1000,
        maxTrials=1000,
    )
    tt["status"] = plan_study(tt, {}, NOW).status
    world = {f"study-t{i}": job("Running", 10, loss=1.0 / (i + 1)) for i in range(1000)}
    for t in tt["status"]["trials"]:
        t["intermediate"] = {str(s): 1.0 / (s + t["number"] + 1) for s in range(1, 11)}
    plan = plan_study(tt, world, NOW)
    size = len(json.dumps(plan.status, separators=(",", ":")))
    print(f"status of 1000 trials: {size} bytes ({size / 1000:.0f} B/trial)")
    assert size < 1_000_000


@pytest.mark.parametrize(
    ("pruner", "loss", "pruned"),
    [
        ({"type": "threshold", "upper": 5.0}, 6.0, True),
        ({"type": "threshold", "upper": 5.0}, 4.0, False),
        (
            {"type": "hyperband", "minResource": 1, "maxResource": 9, "reductionFactor": 3},
            1.0,
            None,
        ),
    ],
)
def test_threshold_and_hyperband_judge_a_rebuilt_study(
    pruner: dict[str, Any], loss: float, pruned: bool | None
) -> None:
    tt = tune(
        searchSpace=[{"name": "x", "type": "uniform", "low": 0, "high": 1}],
        sampler={"type": "tpe", "seed": 1},
        pruner=pruner,
        parallelism=2,
        maxTrials=4,
    )
    tt["status"] = plan_study(tt, {}, NOW).status
    world = {"study-t0": job("Running", 1, loss=loss), "study-t1": job("Running", 2, loss=loss)}
    plan = plan_study(tt, world, NOW)
    states = [t["state"] for t in plan.status["trials"]]
    if pruned is None:  # hyperband: a verdict without error, each trial judged once
        assert set(states[:2]) <= {"Running", "Pruned"}
    else:
        assert states[:2] == (["Pruned", "Pruned"] if pruned else ["Running", "Running"])
        assert len(states) == (4 if pruned else 2)  # the freed slots take new trials


def test_a_finished_trial_still_takes_a_checkpoint_reported_after_its_job_ended() -> None:
    """The trial's agent writes its last progress (with the last checkpoint) on a thread that
    races its pod's exit: the study may see the TorchJob Succeeded first. The best trial must
    still end up pointing at the last checkpoint, not at none."""
    tt = tune(parallelism=1, maxTrials=1)
    tt["status"] = plan_study(tt, {}, NOW).status
    ended = job("Succeeded", 3, loss=0.5)
    del ended["status"]["progress"]["lastCheckpoint"]  # its last write had not landed yet
    tt["status"] = plan_study(tt, {"study-t0": ended}, NOW).status
    assert tt["status"]["trials"][0]["state"] == "Succeeded"
    assert "checkpoint" not in tt["status"]["bestTrial"]
    landed = plan_study(tt, {"study-t0": job("Succeeded", 3, loss=0.5)}, NOW).status
    assert landed["bestTrial"]["checkpoint"] == "/ck/3"
    assert landed["trials"][0]["checkpoint"] == "/ck/3"


def test_a_trial_lists_its_own_losses_by_cause() -> None:
    from torchjob.api.torchtune import TrialRecord, TrialState
    from torchjob_operator.torchtune.trials import observe_trial

    record = TrialRecord(number=0, name="study-0", params={"x": 1.0})
    trained = job("Running", 3, loss=0.5)
    trained["status"]["losses"] = {"Killed": 2, "SilentPeer": 1}
    seen = observe_trial(record, trained, "loss", "now")
    assert seen.state is TrialState.RUNNING and seen.losses == {"Killed": 2, "SilentPeer": 1}
    assert seen.to_wire()["losses"] == {"Killed": 2, "SilentPeer": 1}
    assert observe_trial(record, job("Running", 3, loss=0.5), "loss", "now").losses is None

"""Replace before leaving: a pod given notice trains on while its replacement starts
(``torchjob.rules.drain``, ``torchjob_operator.torchjob.drain``, ``torchjob.train.recovery.notice``)."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.builders import T0, at, job, pod, running
from tests.unit.test_planner import step
from tests.unit.test_pods import env

from torchjob import contract
from torchjob.api import TorchJobSpec
from torchjob.api.models import Phase
from torchjob.rules.drain import MARGIN_S, drain_left, drain_seconds
from torchjob.train.recovery.notice import Notice
from torchjob_operator.resources.pods import worker_pod
from torchjob_operator.torchjob.observed import PodView, pod_view
from torchjob_operator.torchjob.plan import JobView, plan

GRACE_S = 30


def given_notice(p: PodView, at_s: float, grace_s: float = GRACE_S) -> PodView:
    """A running pod the Eviction API took at ``at_s``: DisruptionTarget set, deleted with
    ``grace_s`` of grace, its container still running."""
    return replace(
        running(p),
        disruption="EvictionByEvictionAPI",
        deleting=True,
        deletion_at=at(at_s + grace_s),
    )


def elastic_job(replicas: int = 4, *, drain: bool = True, shrink: bool = True) -> JobView:
    builder = job().replicas(replicas).elastic(1, replicas).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = shrink
    builder.spec["elastic"]["replaceBeforeLeaving"] = drain
    return builder.build()


def started(view: JobView) -> tuple[JobView, list[PodView]]:
    _, view, pods = step(view, [], 0)
    up = [running(p) for p in pods]
    _, view, _ = step(view, up, 1)
    return view, up


def reasons(p: Any) -> set[str]:
    return {e.reason for e in p.events}


# --- the shared rule ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("grace", "drain"), [(None, 0), (0, 0), (19, 0), (20, 10), (30, 20), (120, 110)]
)
def test_a_pod_drains_its_grace_period_less_the_margin(grace: int | None, drain: int) -> None:
    assert drain_seconds(grace) == drain


def test_the_time_left_to_drain_counts_down_to_the_margin() -> None:
    deadline = at(30)
    assert drain_left(deadline, at(0)) == 30 - MARGIN_S
    assert drain_left(deadline, at(15)) == 15 - MARGIN_S
    assert drain_left(deadline, at(25)) == 0.0
    assert drain_left(None, at(0)) == 0.0


# --- the operator ----------------------------------------------------------------------------


def test_the_leaving_pod_trains_on_its_replacement_starts_at_once_and_takes_its_place() -> None:
    view, up = started(elastic_job())
    leaving = given_notice(up[2], 10)
    pods = [up[0], up[1], leaving, up[3]]
    noticed, view, pods = step(view, pods, 10)
    # No new generation: the group trains on at full size; the replacement is created now,
    # under index 4 (the leaving pod holds its name), for generation 1.
    assert noticed.status["currentGeneration"] == 0 and noticed.status["replicas"] == 4
    assert noticed.phase == Phase.RUNNING
    assert noticed.create is not None and noticed.create.joiners
    assert (noticed.create.indices, noticed.create.generation) == ((4,), 1)
    assert noticed.delete == ()
    assert {"CreatedJoiner", "ReplacingBeforeLeaving"} <= reasons(noticed)
    assert noticed.requeue_after_s == pytest.approx(GRACE_S - MARGIN_S)
    assert noticed.status["disruptions"] == 0
    # Nothing new while the replacement starts (Pending, then Running but not yet Ready).
    assert plan(view, pods, at(11)).create is None
    joiner = pods[-1]
    unready = [*pods[:-1], replace(running(joiner), ready=False)]
    waiting = plan(view, unready, at(14))
    assert waiting.status["currentGeneration"] == 0 and waiting.create is None
    # Ready: one generation with the replacement in the leaving pod's place.
    swapped, view, pods = step(view, [*pods[:-1], running(joiner)], 16)
    assert swapped.status["currentGeneration"] == 1 and swapped.status["replicas"] == 4
    assert swapped.status["members"] == [0, 1, 3, 4]
    assert (swapped.status["disruptions"], swapped.status["restarts"]) == (1, 0)
    assert swapped.status["replacedWorkers"] == ["tj-worker-2"]
    assert swapped.create is None, "every pod of generation 1 exists"
    # The survivors are relabelled; the replacement was created for generation 1.
    assert set(swapped.relabel) == {"tj-worker-0", "tj-worker-1", "tj-worker-3"}
    assert "ReplacedBeforeLeaving" in reasons(swapped)
    assert "ShrunkAfterDisruption" not in reasons(swapped)
    said = next(e.message for e in swapped.events if e.reason == "ReplacedBeforeLeaving")
    assert "disruption 1, the restart budget is not charged" in said, said
    assert "shrinking" not in said, "a swap at full size shrinks nothing"
    # The leaving pod goes its way; the job runs at full size with nothing more to do.
    gone = [p for p in pods if p.name != "tj-worker-2"]
    settled = plan(view, gone, at(20))
    assert settled.phase == Phase.RUNNING and settled.status["currentGeneration"] == 1
    assert settled.create is None and settled.delete == ()


def test_a_replacement_too_slow_for_the_grace_period_falls_back_to_the_shrink() -> None:
    view, up = started(elastic_job())
    leaving = given_notice(up[1], 10)
    noticed, view, pods = step(view, [up[0], leaving, *up[2:]], 10)
    assert noticed.create is not None and noticed.create.indices == (4,)
    joiner = running(pods[-1])
    slow = [*pods[:-1], replace(joiner, ready=False)]
    # MARGIN_S before the kubelet's SIGKILL, the operator stops counting on the leaving pod.
    due = 10 + GRACE_S - MARGIN_S
    still = plan(view, slow, at(due - 1))
    assert still.status["currentGeneration"] == 0
    shrunk, view, pods = step(view, slow, due)
    assert shrunk.status["currentGeneration"] == 1 and shrunk.status["replicas"] == 3
    assert "ShrunkAfterDisruption" in reasons(shrunk)
    assert shrunk.delete == (), "the replacement stays for the generation after"
    # The replacement gets Ready: the job grows back to it.
    grown, view, _ = step(view, [*[p for p in pods[:-1] if p.name != "tj-worker-1"], joiner], 25)
    assert grown.status["currentGeneration"] == 2 and grown.status["members"] == [0, 2, 3, 4]
    assert "ScaledUp" in reasons(grown)


def test_a_disruption_target_before_the_deletion_holds_the_generation_briefly() -> None:
    """The Eviction API writes DisruptionTarget, then deletes: the first is no loss yet."""
    view, up = started(elastic_job())
    marked = replace(up[3], disruption="EvictionByEvictionAPI")
    decided = plan(view, [*up[:3], marked], at(10))
    assert decided.status["currentGeneration"] == 0
    assert decided.requeue_after_s is not None and decided.requeue_after_s <= 1.0


@pytest.mark.parametrize(
    ("drain", "grace"),
    [pytest.param(False, GRACE_S, id="not-asked-for"), pytest.param(True, 5, id="grace-too-short")],
)
def test_without_a_drain_the_job_shrinks_at_once_and_replaces_under_a_free_index(
    drain: bool, grace: float
) -> None:
    view, up = started(elastic_job(drain=drain))
    leaving = given_notice(up[0], 10, grace)
    shrunk, view, _ = step(view, [leaving, *up[1:]], 10)
    assert shrunk.status["currentGeneration"] == 1 and shrunk.status["replicas"] == 3
    assert shrunk.status["members"] == [1, 2, 3]
    assert "ShrunkAfterDisruption" in reasons(shrunk)
    # The next pass creates the replacement at once, under index 4: pod 0 holds its name.
    survivors = [replace(p, generation=1) for p in up[1:]]
    joining = plan(view, [leaving, *survivors], at(11))
    assert joining.create is not None
    assert (joining.create.indices, joining.create.members) == ((4,), (1, 2, 3, 4))


def test_a_full_size_replacement_keeps_a_survivor_whose_index_is_beyond_the_size() -> None:
    """After a swap the members may be (0, 1, 3, 4): losing one without a shrink keeps pod 4
    and creates the lost place under the lowest free index."""
    builder = job().replicas(4).elastic(1, 4).keep_survivors()
    builder.spec["elastic"]["replaceBeforeLeaving"] = False
    view = builder.with_status(
        phase="Running",
        currentGeneration=3,
        createdGeneration=3,
        replicas=4,
        members=[0, 1, 3, 4],
    ).build()
    members = [running(replace(pod(i), generation=3)) for i in (0, 1, 3, 4)]
    lost = plan(view, [members[0], members[1], given_notice(members[2], 6), members[3]], at(6))
    assert lost.status["currentGeneration"] == 4
    assert lost.status["members"] == [0, 1, 4, 2]


# --- what the pods say ------------------------------------------------------------------------


def test_the_deletion_deadline_is_read_from_the_pod() -> None:
    when = T0 + timedelta(seconds=30)
    raw = {
        "metadata": {
            "name": "tj-worker-2",
            "deletionTimestamp": when.isoformat().replace("+00:00", "Z"),
            "labels": {contract.LABEL_POD_INDEX: "2", contract.LABEL_GENERATION: "0"},
        },
        "spec": {"restartPolicy": "Never", "nodeName": "n"},
        "status": {"phase": "Running"},
    }
    view = pod_view(raw)
    assert view is not None and view.deleting and view.deletion_at == when


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("ready", "start_s"), [(("True", 17), 17.0), (("False", 17), None), (None, None)]
)
def test_a_pods_start_is_read_from_its_creation_and_its_ready_condition(
    ready: tuple[str, int] | None, start_s: float | None
) -> None:
    conditions = (
        []
        if ready is None
        else [{"type": "Ready", "status": ready[0], "lastTransitionTime": stamp(ready[1])}]
    )
    raw = {
        "metadata": {
            "name": "tj-worker-5",
            "creationTimestamp": stamp(0),
            "labels": {
                contract.LABEL_POD_INDEX: "5",
                contract.LABEL_GENERATION: "1",
                contract.LABEL_JOINER: "true",
            },
        },
        "spec": {"restartPolicy": "Never", "nodeName": "n"},
        "status": {"phase": "Running", "conditions": conditions},
    }
    view = pod_view(raw)
    assert view is not None and view.joiner and view.start_s == start_s


def pod_env(**spec: Any) -> dict[str, str | None]:
    body = {
        "replicas": 2,
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "t", "image": "i"}],
            }
        },
        **spec,
    }
    pod = worker_pod(
        name="tj",
        namespace="ns",
        uid="u",
        spec=TorchJobSpec.model_validate(body),
        index=0,
        generation=0,
        replicas=2,
    )
    return env(pod)


def test_only_an_elastic_keep_survivors_pod_is_told_to_drain() -> None:
    elastic = {"minReplicas": 1, "maxReplicas": 2}
    keep = {"membershipPolicy": "KeepSurvivors"}
    assert pod_env(elastic=elastic, **keep)[contract.DRAIN_S] == "20"
    assert contract.DRAIN_S not in pod_env(elastic=elastic)
    assert contract.DRAIN_S not in pod_env(**keep)
    off = {**elastic, "replaceBeforeLeaving": False}
    assert contract.DRAIN_S not in pod_env(elastic=off, **keep)
    parsed = contract.PodEnv.from_env(pod_env(elastic=elastic, **keep))  # type: ignore[arg-type]
    assert parsed is not None and parsed.drain_s == 20


# --- the runtime --------------------------------------------------------------------------------


def test_a_sigterm_while_training_drains_then_stops() -> None:
    stop = threading.Event()
    notice = Notice(stop, 0.2)
    with notice.training():
        notice.sigterm()
        assert not stop.is_set() and notice.given
        told = notice.tell()
        assert told is not None and "train on for up to 0.2s" in told
        assert notice.tell() is None, "said once"
        assert stop.wait(5), "the stop comes when the drain is over"


@pytest.mark.parametrize("drain_s", [0.0, 30.0])
def test_a_sigterm_stops_at_once_without_a_drain_or_outside_training(drain_s: float) -> None:
    stop = threading.Event()
    notice = Notice(stop, drain_s)
    notice.sigterm()  # not training: a joiner waiting to join, a survivor between generations
    assert stop.is_set() and notice.tell() is None


def test_a_second_sigterm_during_the_drain_changes_nothing_and_cancel_ends_it() -> None:
    stop = threading.Event()
    notice = Notice(stop, 0.3)
    with notice.training():
        notice.sigterm()
        notice.sigterm()
    notice.cancel()
    assert not stop.wait(0.6), "the run ended: no stop requested after it"


@pytest.mark.parametrize("deleted_first", [True, False])
def test_a_job_deletion_ends_the_drain_whichever_comes_first(deleted_first: bool) -> None:
    # Deleting the TorchJob deletes its pods: no replacement will come, so a pod given notice
    # stops at its next report instead of training on for the drain (30 s here).
    stop = threading.Event()
    notice = Notice(stop, 30.0)
    with notice.training():
        if deleted_first:
            notice.final()
            assert not stop.is_set(), "the deletion alone stops nothing: the SIGTERM will"
            told = notice.tell()
            # Said before the SIGTERM: another pod's stop may end this pod's run first.
            assert told is not None and "a SIGTERM will stop this pod" in told, told
            assert notice.tell() is None, "said once"
        notice.sigterm()
        if not deleted_first:
            assert not stop.is_set() and notice.given, "draining until the deletion is seen"
            told = notice.tell()
            assert told is not None and "train on for up to 30s" in told
            notice.final()
        assert stop.is_set()
        if not deleted_first:
            told = notice.tell()
            assert told is not None and "SIGTERM: the TorchJob is being deleted" in told
        assert notice.tell() is None, "said once"
    notice.cancel()


def test_a_job_deletion_is_not_told_in_a_pod_that_would_not_drain() -> None:
    notice = Notice(threading.Event(), 0.0)
    notice.final()
    assert notice.tell() is None

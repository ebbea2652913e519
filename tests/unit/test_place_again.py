"""Pods kept off nodes that need avoiding no more (``torchjob.nodes.place_again``).

A new pod gets a required node affinity against the nodes that are noticed or not Ready at
that moment (``common.nodes.avoided``). Affinity is immutable: when every node a job may use
was noticed at once, its restarted pods could fit nowhere, and when those nodes came back
clean under their own names nothing made the pods again; they stayed Pending to the end of
bench/results/2026-11-30m's notice row (233 s)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.builders import at, job, pod, preempted, running
from tests.unit.test_planner import step, unschedulable

from torchjob.api.models import Phase
from torchjob_operator.common.nodes import AVOIDED_NODES
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.objects import trim_pod
from torchjob_operator.torchjob.amend import Created, WriteFailure, amend
from torchjob_operator.torchjob.nodes import unplaceable
from torchjob_operator.torchjob.observed import PodView, pod_view
from torchjob_operator.torchjob.plan import plan, with_state
from torchjob_operator.torchjob.writes import decide

SPOT = ("n1", "n2", "n3")


def kept_off(p: PodView, nodes: tuple[str, ...], since_s: float = 5) -> PodView:
    """``p`` as created while ``nodes`` were avoided, and found unplaceable since then."""
    return replace(unschedulable(p, since_s), avoided=nodes)


def test_pods_kept_off_nodes_that_returned_are_made_again_in_the_same_generation() -> None:
    view = job().replicas(2).build()
    _, view, made = step(view, [], 0)
    pending = [kept_off(p, SPOT) for p in made]
    still = plan(replace(view, avoid_nodes=SPOT), pending, at(10))
    assert still.delete == () and still.status.get("placingAgain") is None, "still noticed"
    # n2 came back under its name (the others still noticed): both pods could go there now.
    back = replace(view, avoid_nodes=("n1", "n3"))
    first = plan(back, pending, at(20))
    assert set(first.delete) == {"tj-worker-0", "tj-worker-1"} and first.create is None
    assert first.status["placingAgain"] == [0, 1]
    said = next(e for e in first.events if e.reason == "PlacingAgain")
    assert "tj-worker-0, tj-worker-1" in said.message and "kept off n2," in said.message
    # Gone: made again, the same generation, nothing counted.
    view = with_state(back, first.status)
    again = plan(view, [], at(21))
    assert again.create is not None and again.create.indices == (0, 1)
    assert again.create.generation == 0 == again.status["currentGeneration"]
    assert (again.status["disruptions"], again.status["restarts"]) == (0, 0)
    assert again.status.get("placingAgain") is None
    assert "PlacingAgain" not in {e.reason for e in again.events}
    settled = plan(with_state(view, again.status), [pod(0), pod(1)], at(22))
    assert settled.create is None and settled.delete == ()


def test_its_own_deletions_seen_going_are_no_disruption() -> None:
    """The API server shows the deletion of an unscheduled pod as two watch events: an update
    that sets its deletionTimestamp, then its removal. A pass between the two saw the members
    it had deleted "going", judged them taken by another client and started a new generation
    (a disruption counted, the pods made under generation 1: a CI run of 2026-12-02,
    tests/cluster/test_node_notice.py's pods kept off a node that returns)."""
    view = job().replicas(2).build()
    _, view, made = step(view, [], 0)
    pending = [kept_off(p, SPOT) for p in made]
    back = replace(view, avoid_nodes=("n1", "n3"))
    first = plan(back, pending, at(20))
    assert set(first.delete) == {"tj-worker-0", "tj-worker-1"}
    view = with_state(back, first.status)
    going = [replace(p, deleting=True) for p in pending]
    between = plan(view, going, at(20))
    assert between.status["currentGeneration"] == 0, "no new generation"
    assert (between.status["disruptions"], between.status["restarts"]) == (0, 0)
    assert between.create is None, "not while they hold their names"
    assert between.delete == () and between.status["placingAgain"] == [0, 1]
    again = plan(with_state(view, between.status), [], at(21))
    assert again.create is not None and again.create.indices == (0, 1)
    assert again.create.generation == 0 and again.status.get("placingAgain") is None


def test_only_the_members_that_cannot_be_placed_are_made_again() -> None:
    """One member Running, one Pending against a node still avoided, one Pending against a
    node that returned: only that one goes, and the running job is not disturbed."""
    view = job().replicas(3).build()
    _, view, made = step(view, [], 0)
    pods = [running(made[0]), kept_off(made[1], ("n1",)), kept_off(made[2], ("n1", "n2"))]
    out = plan(replace(view, avoid_nodes=("n1",)), pods, at(10))
    assert out.delete == ("tj-worker-2",) and out.status["placingAgain"] == [2]
    assert out.status["currentGeneration"] == 0
    # Not unschedulable (yet), or already bound: the scheduler may still place it; left be.
    waiting = [running(made[0]), replace(made[1], avoided=("n2",)), made[2]]
    assert plan(replace(view, avoid_nodes=()), waiting, at(10)).delete == ()
    assert unplaceable([replace(made[1], avoided=("n2",), scheduled=True)], ()) == []


def test_a_pod_deleted_by_someone_else_meanwhile_is_still_a_disruption() -> None:
    """``placingAgain`` excuses the indices it names, nothing else."""
    view = job().replicas(2).build()
    _, view, made = step(view, [], 0)
    pods = [running(made[0]), kept_off(made[1], ("n1",))]
    first = plan(view, pods, at(10))
    assert first.status["placingAgain"] == [1]
    lost = plan(with_state(view, first.status), [], at(11))  # pod 0 deleted by a user too
    assert lost.status["disruptions"] == 1 and lost.status["currentGeneration"] == 1
    assert lost.status.get("placingAgain") is None, "a new generation makes every pod"


def test_an_elastic_job_does_not_shrink_for_a_pod_it_makes_again() -> None:
    builder = job().replicas(2).elastic(1, 2)
    builder.spec["elastic"]["scaleDownAfterSeconds"] = 5
    view = builder.build()
    _, view, made = step(view, [], 0)
    pods = [running(made[0]), kept_off(made[1], ("n1",), since_s=1)]
    out = plan(view, pods, at(30))  # unschedulable for longer than scaleDownAfterSeconds
    assert out.status["currentGeneration"] == 0 and out.status["replicas"] == 2
    assert out.delete == ("tj-worker-1",)


def test_a_joiner_kept_off_a_returned_node_is_deleted_and_made_anew() -> None:
    builder = job().replicas(2).elastic(1, 2).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    view = builder.build()
    _, view, made = step(view, [], 0)
    up = [running(p) for p in made]
    _, view, _ = step(view, up, 1)
    _, view, pods = step(view, [up[0], preempted(up[1])], 2)
    made, view, pods = step(view, [p for p in pods if p.name != "tj-worker-1"], 3)
    assert made.create is not None and made.create.joiners, "the replacement joiner"
    pods = [kept_off(p, ("n1",)) if p.joiner else p for p in pods]
    (joiner,) = [p for p in pods if p.joiner]
    out = plan(view, pods, at(10))
    assert joiner.name in out.delete
    assert out.status.get("placingAgain") is None, "a joiner is no member"
    anew = plan(with_state(view, out.status), [p for p in pods if not p.joiner], at(11))
    assert anew.create is not None and anew.create.joiners


def worker_pod_dict(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "status": {"phase": "Pending"}}


def test_the_pod_says_which_nodes_it_was_kept_off_for_their_state() -> None:
    """The annotation names the Node watch's nodes, not a spread move's ``keep_off``: a
    move's replacement stays off its crowded node by design."""
    view = replace(job().replicas(1).build(), avoid_nodes=("n2", "n1"))
    decided = decide(view, "uid-1", [], [], at(0))
    (body,) = decided.workers
    assert body["metadata"]["annotations"][AVOIDED_NODES] == "n2,n1"
    seen = pod_view(worker_pod_dict(body))
    assert seen is not None and set(seen.avoided) == {"n1", "n2"}
    (bare,) = decide(job().replicas(1).build(), "uid-1", [], [], at(0)).workers
    assert AVOIDED_NODES not in (bare["metadata"].get("annotations") or {})


def test_a_failed_create_keeps_the_places_to_make_again() -> None:
    view = job().replicas(2).build()
    _, view, made = step(view, [], 0)
    first = plan(view, [running(made[0]), kept_off(made[1], ("n1",))], at(10))
    view = with_state(view, first.status)
    decided = decide(view, "uid-1", [running(made[0])], [], at(11))
    assert decided.plan.create is not None and decided.plan.create.indices == (1,)
    failed = Created(pod_failures=(WriteFailure("exceeded quota", permanent=False),))
    out = amend(
        view,
        decided.plan,
        (),
        failed,
        old_status=first.status,
        now=at(11),
        defer_progress=False,
        progress_batch_s=0.0,
    )
    assert out.status["placingAgain"] == [1], "the next pass tries again"
    assert out.status["phase"] != Phase.FAILED.value


def test_a_node_back_pokes_the_jobs_with_pods_kept_off_it() -> None:
    """The operator's cache keeps the annotation (``trim_pod``), and a Node's change pokes
    the jobs with a pod kept off it as well as those with a pod on it: a Pending pod is on
    no node, and nothing else would plan its job again."""
    (body,) = decide(
        replace(job().replicas(1).build(), avoid_nodes=("n1", "n2")), "u", [], [], at(0)
    ).workers
    kept = trim_pod(worker_pod_dict(body))
    seen = pod_view(kept)
    assert seen is not None and seen.avoided == ("n1", "n2")
    store = Store()
    store.put_pod(kept)
    key = (body["metadata"]["namespace"], "tj")
    assert store.jobs_on_nodes({"n2"}) == {key}
    assert store.jobs_on_nodes({"n1", "n9"}) == {key}
    assert store.jobs_on_nodes({"n9"}) == set(), "neither on it nor kept off it"
    assert store.jobs_on_nodes({"n"}) == set(), "a whole name, not a prefix"

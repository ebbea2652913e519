"""A job its losses crowded onto few nodes moves one member at a time
(``torchjob_operator.torchjob.spread``): the planner steps, with the nodes as the Node watch
reads them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.unit.builders import at
from tests.unit.test_nodes import elastic, on, reasons
from tests.unit.test_planner import step

from torchjob.api.models import GenerationRecord, Phase, TorchJobSpec
from torchjob_operator.common.nodes import NodeView, node_view
from torchjob_operator.torchjob.drain import REBALANCE
from torchjob_operator.torchjob.observed import PodPhase, PodView
from torchjob_operator.torchjob.plan import JobView, plan, with_state
from torchjob_operator.torchjob.spread import GIVE_UP_S, SETTLE_S, WINDOW_S, usable
from torchjob_operator.torchjob.writes import decide

SYSTEM = ("bench.torchjob.io/system", "", "NoSchedule")


def nodes(*names: str, back_at_s: float | None = None, **views: NodeView) -> dict[str, NodeView]:
    """Ready nodes ``names`` (the last one Ready since ``back_at_s``, if given), and ``views``."""
    out = {n: NodeView(n) for n in names}
    if back_at_s is not None:
        out[names[-1]] = NodeView(names[-1], ready_since=at(back_at_s))
    return {**out, **views}


def crowded(node_map: dict[str, NodeView]) -> tuple[JobView, list[PodView]]:
    """A 4-pod job running with 3 members on n0 and 1 on n1 (a node was lost and its pods'
    replacements went to n0), generation 0 begun at 0 s."""
    view = replace(elastic(4), nodes=node_map)
    _, view, pods = step(view, [], 0)
    up = [on(p, "n1" if p.index == 1 else "n0") for p in pods]
    _, view, _ = step(view, up, 1)
    return view, up


def test_a_crowded_job_moves_its_last_ranked_member_on_the_crowded_node_once_settled() -> None:
    view, up = crowded(nodes("n0", "n1", "n2"))
    early = plan(view, up, at(SETTLE_S - 1))
    assert early.create is None and early.status.get("leavingWorkers") is None
    moving, view, pods = step(view, up, SETTLE_S + 1)
    # n0 holds 3, n2 none: pod 3 (the last rank on n0) moves; its replacement starts now,
    # kept off every node but n2, the move's target.
    assert moving.status["currentGeneration"] == 0 and moving.phase == Phase.RUNNING
    assert moving.create is not None and moving.create.joiners
    assert (moving.create.indices, moving.create.avoid) == ((4,), ("n0", "n1"))
    assert moving.status["leavingWorkers"] == [
        {"pod": "tj-worker-3", "reason": REBALANCE, "node": "n0"}
    ]
    told = next(e for e in moving.events if e.reason == "Rebalancing")
    assert told.message == (
        "the job's pods per node: n0 3, n1 1, n2 0; moving tj-worker-3 (n0 -> n2): the "
        "replacements tj-worker-4 start off n0, n1 and take their places at one re-formation"
    )
    # Still starting: the member trains on, nothing more is created.
    again, view, pods = step(view, [*pods[:-1], replace(pods[-1], node="")], SETTLE_S + 5)
    assert again.create is None and again.delete == () and again.status["currentGeneration"] == 0
    # Ready on n2: the two swap in one generation, a move, not a failure.
    swapped, view, pods = step(view, [*up, on(pods[-1], "n2")], SETTLE_S + 9)
    assert swapped.status["currentGeneration"] == 1
    assert swapped.status["members"] == [0, 1, 2, 4] and swapped.delete == ("tj-worker-3",)
    assert swapped.status["restarts"] == 0 and swapped.status["leavingWorkers"] is None
    assert swapped.status["history"][-1]["cause"] == "Rebalance"
    # 2, 1, 1: spread as far as one move a time can; nothing moves any more.
    left = [p for p in pods if p.name != "tj-worker-3"]
    for t in (SETTLE_S + 10, 2 * SETTLE_S + 20, 2 * SETTLE_S + 60):
        later = plan(view, left, at(t))
        assert later.create is None and "Rebalancing" not in reasons(later), t


def test_the_settle_counts_from_the_generations_first_step_not_its_publication() -> None:
    """bench/results/2026-12-05h +484 s: a restart on a returned node was crowded, and its
    move's replacements started 15 s after it was published, while its own pods still
    imported torch. A generation that has not stepped moves nothing; once rank 0 reports its
    first step, the settle counts from there."""
    view = replace(elastic(4), nodes=nodes("n0", "n1", "n2"))
    _, view, pods = step(view, [], 0)
    up = [on(p, "n1" if p.index == 1 else "n0") for p in pods]
    ran, view, _ = step(view, up, 1)
    starting = with_state(view, {**ran.status, "progress": {"generation": 0, "step": 0}})
    assert plan(starting, up, at(SETTLE_S + 60)).create is None, "no step yet"
    first = {"generation": 0, "step": 1, "firstStepTime": "2026-01-01T00:01:40.000Z"}  # at 100 s
    stepped = with_state(view, {**ran.status, "progress": first})
    assert plan(stepped, up, at(100 + SETTLE_S - 1)).create is None
    moving = plan(stepped, up, at(100 + SETTLE_S + 1))
    assert moving.create is not None and moving.create.avoid == ("n0", "n1")
    older = with_state(view, {**ran.status, "progress": {**first, "generation": -1}})
    assert plan(older, up, at(100 + SETTLE_S + 1)).create is None, "an earlier one's step"


def test_a_replacement_that_cannot_be_placed_is_given_up_and_no_move_starts_after_the_window() -> (
    None
):
    view, up = crowded(nodes("n0", "n1", "n2"))
    moving, view, pods = step(view, up, SETTLE_S + 1)
    assert moving.create is not None
    stuck = replace(pods[-1], unschedulable_since=at(SETTLE_S + 2))
    waiting = plan(view, [*up, stuck], at(SETTLE_S + 2 + GIVE_UP_S - 1))
    assert waiting.status["leavingWorkers"] is not None and waiting.delete == ()
    given_up, view, _ = step(view, [*up, stuck], SETTLE_S + 2 + GIVE_UP_S)
    # No member leaves; the replacement is no joiner the job has room for: it goes.
    assert given_up.status.get("leavingWorkers") is None
    assert given_up.delete == ("tj-worker-4",) and given_up.status["currentGeneration"] == 0
    late = plan(view, up, at(SETTLE_S + WINDOW_S))
    assert late.create is None, "no move starts again until something changes"


def test_a_node_that_returns_opens_a_window_of_its_own() -> None:
    view, up = crowded(nodes("n0", "n1", "n2", back_at_s=400))
    assert plan(view, up, at(400 + SETTLE_S - 1)).create is None
    moving = plan(view, up, at(400 + SETTLE_S + 1))
    assert moving.create is not None and moving.create.avoid == ("n0", "n1")


def test_only_a_node_the_pods_may_use_is_a_reason_to_move() -> None:
    """n2 is a system node (tainted): the job's pods may not go there, and n0's three against
    n1's one is a reason only once n1 may take one more (it holds one: 3 - 1 >= 2)."""
    system = NodeView("n2", taints=(SYSTEM,))
    view, up = crowded(nodes("n0", "n1", n2=system))
    moving = plan(view, up, at(SETTLE_S + 1))
    assert moving.create is not None and moving.create.avoid == ("n0",)
    told = next(e for e in moving.events if e.reason == "Rebalancing")
    assert "moving tj-worker-3 (n0 -> n1)" in told.message
    balanced = replace(view, nodes=nodes("n0", "n1", n2=system))
    two_two = [on(p, "n0" if p.index < 2 else "n1") for p in up]
    assert plan(balanced, two_two, at(SETTLE_S + 1)).create is None


def test_what_a_node_lets_a_pod_do() -> None:
    tolerating: dict[str, Any] = {
        "tolerations": [{"key": SYSTEM[0], "operator": "Exists", "effect": "NoSchedule"}]
    }
    system = NodeView("s", taints=(SYSTEM,))
    assert not usable(system, {}) and usable(system, tolerating)
    assert usable(system, {"tolerations": [{"operator": "Exists"}]}), "tolerates everything"
    assert not usable(system, {"tolerations": [{"key": SYSTEM[0], "value": "other"}]})
    gpu = NodeView("g", labels=(("gpu", "h200"),))
    assert usable(gpu, {"nodeSelector": {"gpu": "h200"}})
    assert not usable(gpu, {"nodeSelector": {"gpu": "a100"}})
    assert not usable(NodeView("n", ready=False), {}) and not usable(NodeView("n", notice="x"), {})
    pinned = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "gpu", "operator": "In", "values": ["a100"]}
                            ]
                        },
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["g"]}
                            ]
                        },
                    ]
                }
            }
        }
    }
    assert usable(gpu, pinned), "the second term names it"
    assert not usable(replace(gpu, name="g2"), pinned), "neither term matches"
    exists = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}
    some = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": exists}}
    }
    assert usable(gpu, some) and not usable(NodeView("plain"), some)
    read = node_view(
        {
            "metadata": {"name": "s"},
            "spec": {"taints": [{"key": SYSTEM[0], "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "lastTransitionTime": "2026-01-01T00:01:00Z",
                    }
                ]
            },
        },
        (),
    )
    assert (read.taints, read.ready_since) == ((SYSTEM,), at(60))


def test_a_job_that_does_not_drain_or_keeps_standbys_never_moves() -> None:
    view, up = crowded(nodes("n0", "n1", "n2"))
    undrained = replace(elastic(4, drain=False), nodes=view.nodes, state=view.state)
    assert plan(undrained, up, at(SETTLE_S + 1)).create is None
    assert view.spec.elastic is not None
    el = view.spec.elastic.model_copy(update={"standby_replicas": 1})
    spec = view.spec.model_copy(update={"elastic": el})
    standby = plan(replace(view, spec=spec), up, at(SETTLE_S + 1))
    assert "Rebalancing" not in reasons(standby), "a standby would be swapped in where it runs"
    restarting = [replace(up[0], phase=PodPhase.PENDING, scheduled=False), *up[1:]]
    assert "Rebalancing" not in reasons(plan(view, restarting, at(SETTLE_S + 1)))
    assert "Rebalancing" in reasons(plan(view, up, at(SETTLE_S + 1)))


def test_the_replacement_body_stays_off_the_crowded_node_and_a_tolerated_taint_is_no_bar() -> None:
    """The template's tolerations are read from the job: tolerating the system node's taint
    makes it a node the job may use, and the replacement's body keeps off the crowded one
    (required node affinity: the default spread alone would not)."""
    view, up = crowded(nodes("n0", "n1", n2=NodeView("n2", taints=(SYSTEM,))))
    wire = view.spec.model_dump(by_alias=True, exclude_none=True)
    wire["template"]["spec"]["tolerations"] = [{"key": SYSTEM[0], "operator": "Exists"}]
    tolerant = replace(view, spec=TorchJobSpec.model_validate(wire))
    made = decide(tolerant, "uid", up, (), at(SETTLE_S + 1))
    told = next(e for e in made.plan.events if e.reason == "Rebalancing")
    assert "(n0 -> n2)" in told.message
    (body,) = made.workers
    required = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert required["nodeSelectorTerms"] == [
        {
            "matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]},
                {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
            ]
        }
    ]


def halves(*causes: str) -> tuple[JobView, list[PodView]]:
    """8 pods, 4 on n0 and 4 on n1, n2 back and empty, generation 0 begun at 0 s; the job's
    history holds earlier generations begun for ``causes``."""
    view = replace(elastic(8), nodes=nodes("n0", "n1", "n2"))
    _, view, pods = step(view, [], 0)
    up = [on(p, "n0" if p.index < 4 else "n1") for p in pods]
    _, view, _ = step(view, up, 1)
    (now,) = view.state.history
    past = tuple(
        GenerationRecord(generation=-i, began=now.began, cause=c, world_size=8)
        for i, c in enumerate(causes, 1)
    )
    return replace(view, state=replace(view.state, history=(*past, now))), up


def test_the_moves_of_a_spread_go_together_in_one_re_formation() -> None:
    """8 pods, 4 on n0 and 4 on n1, n2 back and empty, after a node lost without notice: one
    member of each crowded node moves to n2 (4, 4, 0 -> 3, 3, 2), both replacements start at
    once, and both swap in one generation once both are Ready."""
    view, up = halves("Notice", "NodeLost")
    moving, view, pods = step(view, up, SETTLE_S + 1)
    assert moving.create is not None
    assert (moving.create.indices, moving.create.avoid) == ((8, 9), ("n0", "n1"))
    assert [w["pod"] for w in moving.status["leavingWorkers"]] == ["tj-worker-3", "tj-worker-7"]
    one_ready = plan(view, [*up, on(pods[-2], "n2"), replace(pods[-1], node="")], at(SETTLE_S + 5))
    assert one_ready.status["currentGeneration"] == 0, "waits for both"
    swapped = plan(view, [*up, on(pods[-2], "n2"), on(pods[-1], "n2")], at(SETTLE_S + 9))
    assert swapped.status["currentGeneration"] == 1
    assert sorted(swapped.delete) == ["tj-worker-3", "tj-worker-7"]
    assert sorted(swapped.status["members"]) == [0, 1, 2, 4, 5, 6, 8, 9]


def test_a_job_whose_losses_all_came_with_notice_moves_only_off_a_node_with_over_half() -> None:
    """A move costs a re-formation, and a node lost with notice costs one whatever it holds:
    4, 4, 0 stays while every loss so far came with notice (or was a move), and moves once
    the job has lost a pod its peers found silent; 3 of 4 on one node moves at once
    (``test_a_crowded_job_moves_...``)."""
    view, up = halves("Notice", "Rebalance", "Notice", "Killed")
    for t in (SETTLE_S + 1, SETTLE_S + 30, SETTLE_S + WINDOW_S - 1):
        stays = plan(view, up, at(t))
        assert stays.create is None and "Rebalancing" not in reasons(stays), t
        assert stays.status.get("leavingWorkers") is None
    view, up = halves("Notice", "SilentPeer")
    moving = plan(view, up, at(SETTLE_S + 1))
    assert moving.create is not None and moving.create.indices == (8, 9)
    assert "Rebalancing" in reasons(moving)


def spread(p: Any) -> tuple[str, str, str] | None:
    """The plan's ``Spread`` condition: (status, reason, message), None if it has none."""
    found = [c for c in p.status.get("conditions") or () if c["type"] == "Spread"]
    return (found[0]["status"], found[0]["reason"], found[0]["message"]) if found else None


def test_the_spread_condition_says_why_a_crowded_job_stays_and_when_it_moves() -> None:
    """``kubectl describe`` tells a crowded job kept as it is from one about to move, and says
    the move and the even spread after it."""
    view, up = halves("Notice", "Notice")
    kept = spread(plan(view, up, at(SETTLE_S + 1)))
    assert kept is not None and kept[:2] == ("False", "CrowdedKept")
    assert kept[2].startswith("members per node: n0 4, n1 4; none on n2; kept as they are: every")

    view, up = crowded(nodes("n0", "n1", "n2"))
    assert spread(plan(view, up, at(SETTLE_S - 1))) == (
        "False",
        "Crowded",
        "members per node: n0 3, n1 1; none on n2; one node holds more than half of them, or a loss "
        f"came without notice: members move to the emptier nodes once the job has trained "
        f"{SETTLE_S:g}s at full size",
    )
    moving, view, pods = step(view, up, SETTLE_S + 1)
    assert spread(moving) == (
        "False",
        "MovingMembers",
        "moving 1 member(s) off crowded nodes (members per node: n0 3, n1 1); their "
        "replacements take their places in one re-formation",
    )
    _, view, pods = step(view, [*up, on(pods[-1], "n2")], SETTLE_S + 9)
    left = [p for p in pods if p.name != "tj-worker-3"]
    even = spread(plan(view, left, at(2 * SETTLE_S + 20)))
    assert even == ("True", "EvenlySpread", "members per node: n0 2, n1 1, n2 1")


def test_a_job_that_never_moves_has_no_spread_condition() -> None:
    """Without ``replaceBeforeLeaving``, or without the Node watch, nothing is judged."""
    spec = elastic(4).spec.model_dump(by_alias=True, exclude_none=True)
    spec["elastic"]["replaceBeforeLeaving"] = False
    no_drain = replace(elastic(4), spec=TorchJobSpec.model_validate(spec))
    for view in (replace(no_drain, nodes=nodes("n0", "n1", "n2")), elastic(4)):
        first, view, pods = step(view, [], 0)
        up = [on(p, "n1" if p.index == 1 else "n0") for p in pods]
        for t in (1, SETTLE_S + 1):
            running, view, _ = step(view, up, t)
            assert spread(running) is None and spread(first) is None


def test_a_spread_message_names_at_most_a_dozen_nodes_of_each_kind() -> None:
    """In a cluster of 40 usable nodes the message stays short: 16 members on 14 nodes (3 on
    n13), 26 usable nodes without one."""
    names = [f"n{i:02}" for i in range(40)]
    view = replace(elastic(16), nodes=nodes(*names))
    _, view, pods = step(view, [], 0)
    up = [on(p, names[min(p.index, 13)]) for p in pods]
    _, view, _ = step(view, up, 1)
    said = spread(plan(view, up, at(SETTLE_S - 1)))
    assert said is not None and said[1] == "CrowdedKept"
    assert said[2].startswith(
        "members per node: n00 1, n01 1, n02 1, n03 1, n04 1, n05 1, n06 1, n07 1, n08 1, n09 1, "
        "n10 1, n11 1 and 2 more nodes; none on n14, n15, n16, n17, n18, n19, n20, n21, n22, "
        "n23, n24, n25 and 14 more usable nodes; kept as they are"
    ), said[2]

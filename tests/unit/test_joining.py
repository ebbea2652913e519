"""Which pods wait to join (``torchjob_operator.torchjob.joining``): a member left out is a
leaver even when it started as a replacement, and joiners on noticed nodes come last."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.builders import at, job, running
from tests.unit.test_nodes import noticed, on, restarted_for_a_preemption
from tests.unit.test_planner import evicted, standby_job, step

from torchjob_operator.common.nodes import NodeView
from torchjob_operator.torchjob.nodes import with_nodes
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import plan


def test_a_member_that_started_as_a_replacement_goes_once_a_generation_leaves_it_out() -> None:
    """bench/results/2026-12-03c: members that had joined as replacements (their joiner label
    stays for life) were left out by generation 4 and taken for joiners still waiting: kept
    within the joiners' room, generation 5 took them back in. Here a warm standby's room:
    the noticed member that started as a replacement is swapped for the standby, and goes."""
    builder = job().replicas(4).elastic(1, 4).keep_survivors()
    builder.spec["elastic"].update(
        shrinkOnDisruption=True, replaceBeforeLeaving=True, standbyReplicas=1
    )
    _, view, pods = step(builder.build(), [], 0)
    up = [on(p, f"n{p.index % 2}") for p in pods]
    standby, view, pods = step(view, up, 1)
    assert standby.create is not None and standby.create.indices == (4,)
    pods = [on(p, "n2") if p.index == 4 else p for p in pods]
    pods = [noticed(replace(p, joiner=True), 10) if p.index == 1 else p for p in pods]
    swapped, view, _ = step(view, pods, 10)
    assert swapped.status["currentGeneration"] == 1 and swapped.status["members"] == [0, 2, 3, 4]
    assert swapped.delete == ("tj-worker-1",), "a leaver, though labelled as a joiner"
    assert swapped.status["standbyWorkers"] == 0
    # The pass after, with generation 1's record written, before the deletion shows: still a
    # leaver, not a standby.
    again = plan(view, [replace(p, generation=1) if p.index == 4 else p for p in pods], at(11))
    assert again.status["currentGeneration"] == 1 and again.status["standbyWorkers"] == 0
    assert again.delete == ("tj-worker-1",)


def test_a_joiner_on_a_node_without_a_notice_takes_a_place_first() -> None:
    """Two ready standbys, the one with the lower index on a node given notice since it
    started: the evicted member's place goes to the other."""
    created, view, pods = step(standby_job(2, standby=2), [], 0)
    assert created.create is not None
    up = [running(p) for p in pods]
    standby, view, pods = step(view, up, 2)
    assert standby.create is not None and standby.create.indices == (2, 3)
    placed = {2: "doomed", 3: "fine"}
    pods = [
        replace(running(p), node=placed.get(p.index, "n0"), scheduled=True, ready=True)
        for p in pods
    ]
    nodes = {
        "n0": NodeView("n0"),
        "fine": NodeView("fine"),
        "doomed": NodeView("doomed", notice="aws-node-termination-handler/spot-itn", window_s=120),
    }
    by = {p.index: p for p in with_nodes(pods, nodes, at(4))}
    assert by[2].notice_until is not None and by[3].notice_until is None
    decided = plan(view, [evicted(by[0]), by[1], by[2], by[3]], at(5))
    assert decided.status["currentGeneration"] == 1 and decided.status["members"] == [1, 3]


def test_a_pod_deleted_on_a_noticed_node_holds_only_its_name_once_the_node_is_due() -> None:
    """bench/results/2026-12-03c: a restart waited 30 s for a leaver deleted on a noticed node
    that went at its deadline, until the pod was overdue. Past the notice's deadline it holds
    its name only; before, the restart looks again at the deadline."""
    view, up = restarted_for_a_preemption()
    nodes = {
        "n0": NodeView("n0"),
        "n1": NodeView("n1", notice="aws-node-termination-handler/spot-itn", window_s=120),
    }
    leaving = replace(up[1], deleting=True, deletion_at=at(60))  # a long grace period
    seen = {leaving.name: at(30)}  # the deadline an earlier pass gave it
    before: PodView = with_nodes([leaving], nodes, at(20), seen)[0]
    assert before.notice_until == at(30)
    waiting = plan(view, [before], at(20))
    assert waiting.create is None
    assert waiting.requeue_after_s == pytest.approx(10)
    after = with_nodes([leaving], nodes, at(30), seen)[0]
    due = plan(view, [after], at(30))
    assert due.create is not None and due.create.indices == (0, 2)
    assert due.status["members"] == [0, 2]

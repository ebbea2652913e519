"""Nodes that announce their end or stop reporting (``torchjob_operator.torchjob.nodes``), what
the planner does with their pods, and the watch's bookkeeping (``engine.nodewatch``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import at, job, pod, preempted, running
from tests.unit.test_planner import step

from torchjob.api.models import GenerationRecord, Phase, TorchJobSpec
from torchjob_operator.common.nodes import (
    DEFAULT_NOTICE_TAINTS,
    NodeView,
    NoticeTaint,
    avoided,
    node_view,
    parse_notice_taints,
)
from torchjob_operator.engine.cache import Store
from torchjob_operator.engine.nodewatch import NodeBook
from torchjob_operator.resources.pods import avoid_nodes
from torchjob_operator.torchjob.drain import replacement_lead
from torchjob_operator.torchjob.nodes import (
    NODE_LOST,
    OVERDUE_S,
    SUSPECT_S,
    held_only,
    recently_silent,
    suspect_nodes,
    with_nodes,
)
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import JobView, plan, with_state
from torchjob_operator.torchjob.writes import decide


def node(
    name: str = "n1",
    *,
    taints: list[dict[str, Any]] | None = None,
    ready: str = "True",
    cordoned: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"taints": taints or [], "unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


AWS = {"key": "aws-node-termination-handler/spot-itn", "value": "x", "effect": "NoSchedule"}


# --- reading a Node ----------------------------------------------------------------------


def test_the_default_notices_are_aws_karpenter_and_gke() -> None:
    keys = {t.key for t in parse_notice_taints("default")}
    assert "aws-node-termination-handler/spot-itn" in keys
    assert {"karpenter.sh/disrupted", "karpenter.sh/disruption"} <= keys
    assert "cloud.google.com/impending-node-termination" in keys
    assert parse_notice_taints("") == ()


def test_notice_taints_are_read_with_their_window_and_value() -> None:
    got = parse_notice_taints("example.com/going=soon:45, default")
    assert got[0] == NoticeTaint("example.com/going", 45.0, value="soon")
    assert got[1:] == DEFAULT_NOTICE_TAINTS


@pytest.mark.parametrize("bad", ["no-window", "example.com/x:0", "example.com/x:soon", ":30"])
def test_a_wrong_notice_taint_is_named(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("/", ".")):
        parse_notice_taints(f"default,{bad}")


def test_a_node_with_a_notice_taint_is_noticed_with_the_keys_window() -> None:
    v = node_view(node(taints=[AWS]), DEFAULT_NOTICE_TAINTS)
    assert (v.notice, v.window_s, v.noticed_at) == (AWS["key"], 120.0, None)
    assert v.doomed and v.ready
    gke = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    assert node_view(node(taints=[gke]), DEFAULT_NOTICE_TAINTS).window_s == 30.0


def test_a_notice_taint_with_a_time_counts_from_it() -> None:
    timed = {**AWS, "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:05Z"}
    v = node_view(node(taints=[timed]), DEFAULT_NOTICE_TAINTS)
    assert v.noticed_at == at(5)


def test_karpenter_before_v1_counts_only_with_its_value() -> None:
    disrupting = {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"}
    other = {**disrupting, "value": "candidate"}
    assert node_view(node(taints=[disrupting]), DEFAULT_NOTICE_TAINTS).notice is not None
    assert node_view(node(taints=[other]), DEFAULT_NOTICE_TAINTS).notice is None


def test_other_taints_a_cordon_and_a_silent_node() -> None:
    spot = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot"}
    plain = node_view(node(taints=[spot]), DEFAULT_NOTICE_TAINTS)
    assert plain.notice is None and not plain.doomed, "a spot pool's taint is no notice"
    assert node_view(node(cordoned=True), DEFAULT_NOTICE_TAINTS).doomed
    silent = node_view(node(ready="Unknown"), DEFAULT_NOTICE_TAINTS)
    assert not silent.ready and silent.doomed
    nodes = {
        "a": NodeView("a"),
        "b": NodeView("b", ready=False),
        "c": NodeView("c", unschedulable=True),
    }
    nodes["d"] = replace(NodeView("d"), notice=AWS["key"], window_s=120.0)
    assert avoided(nodes) == ("b", "d"), "the scheduler keeps pods off a cordoned node"


# --- what the pods on them become -----------------------------------------------------------


def on(p: PodView, name: str) -> PodView:
    return replace(running(p), node=name, scheduled=True)


def test_a_pod_on_a_noticed_node_is_given_its_notice_and_keeps_its_deadline() -> None:
    nodes = {"n1": node_view(node("n1", taints=[AWS]), DEFAULT_NOTICE_TAINTS), "n2": NodeView("n2")}
    pods = [on(pod(0), "n1"), on(pod(1), "n2")]
    first = with_nodes(pods, nodes, at(10))
    assert first[0].notice_until == at(130) and first[0].notice == AWS["key"]
    assert first[1] == pods[1]
    # A later pass (another operator, after a restart) keeps the deadline the first gave.
    later = with_nodes(pods, nodes, at(50), {"tj-worker-0": at(130)})
    assert later[0].notice_until == at(130)


def test_a_pod_on_a_silent_node_is_lost_and_a_pod_with_its_own_disruption_keeps_it() -> None:
    nodes = {"n1": NodeView("n1", ready=False)}
    evicted = replace(on(pod(1), "n1"), disruption="EvictionByEvictionAPI")
    got = with_nodes([on(pod(0), "n1"), evicted, pod(2)], nodes, at(0))
    assert got[0].disruption == NODE_LOST
    assert got[1].disruption == "EvictionByEvictionAPI"
    assert got[2] == pod(2), "not scheduled: no node to ask"


# --- the planner ----------------------------------------------------------------------------


def elastic(replicas: int = 4, *, drain: bool = True) -> JobView:
    builder = job().replicas(replicas).elastic(1, replicas).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    builder.spec["elastic"]["replaceBeforeLeaving"] = drain
    return builder.build()


def started(view: JobView) -> tuple[JobView, list[PodView]]:
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index % 2}") for p in pods]
    _, view, _ = step(view, up, 1)
    return view, up


def noticed(p: PodView, at_s: float, window_s: float = 120.0) -> PodView:
    return replace(p, notice=AWS["key"], notice_until=at(at_s + window_s))


def reasons(p: Any) -> set[str]:
    return {e.reason for e in p.events}


def test_a_notice_starts_the_replacement_at_once_and_it_takes_the_place_when_ready() -> None:
    view, up = started(elastic())
    pods = [up[0], noticed(up[1], 10), up[2], up[3]]
    first, view, pods = step(view, pods, 10)
    # The doomed pod trains on; its replacement is created now, under a free index.
    assert first.status["currentGeneration"] == 0 and first.phase == Phase.RUNNING
    assert first.create is not None and first.create.joiners
    assert first.create.indices == (4,)
    assert first.status["leavingWorkers"] == [
        {
            "pod": "tj-worker-1",
            "reason": AWS["key"],
            "node": "n1",
            "deadline": "2026-01-01T00:02:10Z",
        }
    ]
    assert first.requeue_after_s == pytest.approx(120 - 10)
    told = next(e for e in first.events if e.reason == "ReplacingBeforeLeaving")
    assert "tj-worker-1 (node n1: aws-node-termination-handler/spot-itn, 120 s left)" in (
        told.message
    )
    assert first.delete == ()
    joiner = on(pods[-1], "n2")
    swapped, view, pods = step(view, [*pods[:-1], joiner], 20)
    assert swapped.status["currentGeneration"] == 1 and swapped.status["members"] == [0, 2, 3, 4]
    assert (swapped.status["disruptions"], swapped.status["restarts"]) == (1, 0)
    assert swapped.status["replacedWorkers"] == ["tj-worker-1"]
    assert swapped.status["leavingWorkers"] is None
    record = swapped.status["history"][-1]
    assert (record["cause"], swapped.status["losses"]) == ("Notice", {"Notice": 1}), record
    # The doomed pod is no member any more: it goes now (a SIGTERM: it stops at its next
    # report, excluded by the generation), not when its node does.
    assert swapped.delete == ("tj-worker-1",)
    settled = plan(view, pods, at(21))
    assert settled.create is None and settled.delete == ()


def measured(p: PodView, start_s: float) -> PodView:
    """A member that started as a replacement, Ready ``start_s`` after its creation."""
    return replace(p, joiner=True, start_s=start_s)


def test_a_long_notice_creates_the_replacement_its_measured_lead_before_the_deadline() -> None:
    """The job's replacements took up to 20 s to start (worker-3 started as one): the lead is
    1.5 x 20 + 30 = 60 s, so a 120 s notice at +10 s (deadline +130 s) creates the
    replacement at +70 s, and the doomed pod trains on meanwhile."""
    view, up = started(elastic())
    up[3] = measured(up[3], 20.0)
    assert replacement_lead(view.spec, up) == pytest.approx(60.0)
    pods = [up[0], noticed(up[1], 10), up[2], up[3]]
    first, view, pods = step(view, pods, 10)
    assert first.create is None and first.delete == () and first.phase == Phase.RUNNING
    assert first.status["leavingWorkers"] == [
        {
            "pod": "tj-worker-1",
            "reason": AWS["key"],
            "node": "n1",
            "deadline": "2026-01-01T00:02:10Z",
            "replaceAt": "2026-01-01T00:01:10Z",
        }
    ]
    assert first.requeue_after_s == pytest.approx(60.0), "looked at again when it is due"
    told = next(e for e in first.events if e.reason == "ReplacingLater")
    assert "tj-worker-1 (node n1: aws-node-termination-handler/spot-itn)" in told.message
    assert "2026-01-01T00:01:10Z, 60 s before it goes" in told.message, told.message
    # Told once: the next pass finds the pod in status.leavingWorkers.
    again = plan(view, pods, at(40))
    assert again.create is None and "ReplacingLater" not in reasons(again)
    assert plan(view, pods, at(69)).create is None
    due, view, pods = step(view, pods, 70)
    assert due.create is not None and due.create.joiners and due.create.indices == (4,)
    assert "ReplacingBeforeLeaving" in reasons(due)
    assert "replaceAt" not in due.status["leavingWorkers"][0]
    swapped = plan(view, [*pods[:-1], on(pods[-1], "n2")], at(100))
    assert swapped.status["currentGeneration"] == 1 and swapped.status["members"] == [0, 2, 3, 4]
    assert (swapped.status["disruptions"], swapped.status["restarts"]) == (1, 0)


def test_a_notice_shorter_than_the_lead_or_an_eviction_creates_the_replacement_at_once() -> None:
    view, up = started(elastic())
    up[3] = measured(up[3], 20.0)  # lead 60 s
    short = plan(view, [up[0], noticed(up[1], 10, window_s=45), up[2], up[3]], at(10))
    assert short.create is not None and short.create.indices == (4,)
    assert "ReplacingLater" not in reasons(short)
    evicted = replace(up[1], disruption="EvictionByEvictionAPI", deleting=True, deletion_at=at(130))
    now = plan(view, [up[0], evicted, up[2], up[3]], at(10))
    assert now.create is not None and now.create.indices == (4,)


def test_a_notice_on_more_than_half_of_the_members_does_not_wait_for_the_measured_lead() -> None:
    """Most of the job going at once: its replacements start together, slower than any start
    the job measured, and a late swap would restart it from storage; they start at once. Half
    of it waits for the lead, and so does a lead the spec sets."""
    view, up = started(elastic())
    up[3] = measured(up[3], 20.0)  # lead 60 s
    half = plan(view, [noticed(up[0], 10), noticed(up[1], 10), up[2], up[3]], at(10))
    assert half.create is None and "ReplacingLater" in reasons(half)
    most = [noticed(up[0], 10), noticed(up[1], 10), noticed(up[2], 10), up[3]]
    now = plan(view, most, at(10))
    assert now.create is not None and now.create.indices == (4, 5, 6)
    assert "ReplacingLater" not in reasons(now)
    builder = job().replicas(4).elastic(1, 4).keep_survivors()
    builder.spec["elastic"] |= {"shrinkOnDisruption": True, "replacementLeadSeconds": 30}
    view, up = started(builder.build())
    told = plan(view, [noticed(up[0], 10), noticed(up[1], 10), noticed(up[2], 10), up[3]], at(10))
    assert told.create is None
    assert {w["replaceAt"] for w in told.status["leavingWorkers"]} == {"2026-01-01T00:01:40Z"}


def test_the_spec_sets_the_lead_and_a_job_that_measured_nothing_replaces_at_once() -> None:
    view, up = started(elastic())
    pods = [up[0], noticed(up[1], 10), up[2], up[3]]
    assert plan(view, pods, at(10)).create is not None, "nothing measured yet: at once"
    builder = job().replicas(4).elastic(1, 4).keep_survivors()
    builder.spec["elastic"] |= {"shrinkOnDisruption": True, "replacementLeadSeconds": 30}
    view, up = started(builder.build())
    first = plan(view, [up[0], noticed(up[1], 10), up[2], up[3]], at(10))
    assert first.create is None
    assert first.status["leavingWorkers"][0]["replaceAt"] == "2026-01-01T00:01:40Z"


def test_a_replacement_created_is_kept_when_the_measured_lead_shrinks() -> None:
    """The pod whose start was slowest goes after the replacement was created: the lead falls
    to 1.5 x 2 + 30 = 33 s and the replacement would not be due yet; it stays all the same."""
    view, up = started(elastic())
    up[3] = measured(up[3], 20.0)
    pods = [up[0], noticed(up[1], 10), up[2], up[3]]
    due, view, pods = step(view, pods, 80)
    assert due.create is not None and due.create.indices == (4,)
    joiner = replace(pods[-1], phase=pods[-1].phase, joiner=True)
    quick = [up[0], noticed(up[1], 10), up[2], measured(up[3], 2.0), joiner]
    later = plan(view, quick, at(85))
    assert later.delete == () and later.create is None
    assert later.status["leavingWorkers"][0]["replaceAt"] == "2026-01-01T00:01:37Z"
    swapped = plan(view, [*quick[:-1], on(joiner, "n2")], at(90))
    assert swapped.status["currentGeneration"] == 1 and swapped.status["members"] == [0, 2, 3, 4]


def test_a_notice_that_runs_out_before_the_replacement_is_ready_shrinks_the_job() -> None:
    view, up = started(elastic())
    pods = [up[0], noticed(up[1], 10, window_s=30), up[2], up[3]]
    _, view, pods = step(view, pods, 10)
    slow = [*pods[:-1], replace(running(pods[-1]), ready=False)]
    assert plan(view, slow, at(29)).status["currentGeneration"] == 0
    shrunk = plan(view, slow, at(31))  # within the margin of the notice's end
    assert shrunk.status["currentGeneration"] == 1 and shrunk.status["replicas"] == 3
    assert shrunk.status["disruptions"] == 1 and shrunk.status["restarts"] == 0


def all_on_one_node(replicas: int, floor: int) -> tuple[JobView, list[PodView]]:
    """A KeepSurvivors job (``shrinkOnDisruption``) whose every member runs on node n1."""
    builder = job().replicas(replicas).elastic(floor, replicas).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    _, view, pods = step(builder.build(), [], 0)
    up = [on(p, "n1") for p in pods]
    _, view, _ = step(view, up, 1)
    return view, up


def test_a_notice_on_the_node_of_every_member_restarts_the_job_once() -> None:
    """Every member on one noticed node (the others were lost: bench/results/2026-11-29g):
    the notice runs out, nobody survives, and the job is replaced at full size under the
    same indices. The doomed pods hold those indices but are never members of the new
    generation: they go, and the generation stays (it published one per pass, counting a
    disruption each, while they lived)."""
    view, up = all_on_one_node(8, 5)
    doomed = [noticed(p, 10, window_s=30) for p in up]
    first, view, _ = step(view, doomed, 10)
    assert first.create is not None and first.create.joiners and len(first.create.indices) == 8
    joiners = [pod(i, first.create.generation) for i in first.create.indices]  # Pending
    pods = [*doomed, *[replace(j, joiner=True) for j in joiners]]
    out = plan(view, pods, at(31))  # within the margin of the notice's end
    assert out.status["currentGeneration"] == 1 and out.status["disruptions"] == 1
    assert set(out.delete) == {p.name for p in doomed} and out.relabel == ()
    view = with_state(view, out.status)
    going = [replace(p, deleting=True, deletion_at=at(61)) for p in doomed]
    for t in (32, 33, 40):
        again = plan(view, [*going, *pods[8:]], at(t))
        assert again.status["currentGeneration"] == 1, f"a generation per pass at +{t}s"
        assert again.status["disruptions"] == 1 and again.relabel == ()
        view = with_state(view, again.status)


def test_replacements_whose_own_node_is_noticed_take_no_place_they_cannot_keep() -> None:
    """bench/results/2026-12-05d, +150 s: a 30 s notice on the node of every member, their
    replacements placed on a node noticed 4.5 s later. Ready 14 s before their own deadline,
    they took every place, the members went mid-step without their checkpoint, and the job
    restarted from storage. Now such replacements wait for nothing: they go, others start
    elsewhere at once, the members train on to their margin, and the job restarts then (the
    members leave the generation: they stop at a checkpoint) with the new ones. One with time
    enough on its node still takes its place."""
    view, up = all_on_one_node(8, 5)
    doomed = [noticed(p, 10, window_s=30) for p in up]  # gone at +40
    first, view, pods = step(view, doomed, 10)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    assert first.create is not None and first.create.indices == tuple(range(8, 16))
    late = [noticed(on(replace(p, joiner=True), "n2"), 14, window_s=30) for p in pods[8:]]
    held = plan(view, [*doomed, *late], at(26))  # Ready, 18 s to their own end
    assert held.status["currentGeneration"] == 0, held.status
    assert len(held.status["leavingWorkers"]) == 8
    # They wait for nothing: they go, and replacements start on another node.
    assert set(held.delete) == {p.name for p in late}
    assert held.create is not None and held.create.joiners
    assert held.create.indices == tuple(range(16, 24))
    going = [replace(p, deleting=True, deletion_at=at(56)) for p in late]
    starting = [replace(pod(i, 1), joiner=True) for i in range(16, 24)]  # Pending
    gone = plan(view, [*doomed, *going, *starting], at(31))  # the members inside their margin
    st = gone.status
    assert (st["currentGeneration"], st["phase"]) == (1, "Restarting"), st
    assert st["members"] == list(range(16, 24)), st["members"]
    assert {p.name for p in doomed} <= set(gone.delete)
    # Noticed with 60 s left, the replacements are worth the swap.
    longer = [noticed(on(replace(p, joiner=True), "n2"), 14, window_s=60) for p in pods[8:]]
    swapped = plan(view, [*doomed, *longer], at(26))
    assert swapped.status["currentGeneration"] == 1, swapped.status
    assert set(swapped.status["members"]) & set(range(8, 16))


@pytest.mark.parametrize("relabelled", [False, True])
def test_a_notice_right_after_a_hand_over_drains_the_kept_members(relabelled: bool) -> None:
    """bench/results/2026-12-05f, +150 s: a hand-over kept four members on n2 (their relabel
    not yet seen: labelled with the generation before) and n2 was noticed in the same
    second. Judged taken, the kept members left at once and the job restarted from storage;
    they are members given notice like any other, and train on while replacements start."""
    view, up = all_on_one_node(8, 5)
    up = [on(p, "n1" if p.index < 4 else "n2") for p in up]
    doomed = [noticed(p, 10, window_s=30) if p.index < 4 else p for p in up]
    first, view, pods = step(view, doomed, 10)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    ready = [on(replace(p, joiner=True), "n2") for p in pods[8:]]
    handed = plan(view, [*doomed, *ready], at(20))
    assert handed.status["members"] == list(range(4, 12)), handed.status
    assert handed.relabel == tuple(f"tj-worker-{i}" for i in range(4, 8))
    view = with_state(view, {**handed.status, "progress": formed_at(0)})
    left = [p for p in [*doomed, *ready] if p.name not in handed.delete]
    if relabelled:
        left = [replace(p, generation=1) for p in left]
    out = plan(view, [noticed(p, 21, window_s=30) for p in left], at(22))
    assert (out.status["currentGeneration"], out.status["phase"]) == (1, "Running"), out.status
    assert out.delete == () and "WorkerDisrupted" not in reasons(out)
    assert len(out.status["leavingWorkers"]) == 8
    assert out.create is not None and out.create.joiners


def test_a_generation_of_joiners_counts_itself_created_while_its_leavers_still_go() -> None:
    """bench/results/2026-12-05g, +442 s: a loss put eight joiners in every place while the
    members they replaced were still being deleted on a noticed node with time left. Waiting
    for those, the generation never counted itself created, could not drain, and a notice on
    its own members' node 20 s later restarted the job at once. Nothing is created, so
    nothing is waited for: the notice is drained (replacements start, the members train on)."""
    view, up = all_on_one_node(8, 5)
    doomed = [noticed(p, 0, window_s=40) for p in up]
    first, view, pods = step(view, doomed, 5)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    starting = [replace(on(p, "n2"), joiner=True, ready=False) for p in pods[8:]]
    took = plan(view, [*doomed, *starting], at(31))  # the members inside their margin
    assert took.status["members"] == list(range(8, 16)), took.status
    assert took.status["createdGeneration"] == 1, "every place has its pod"
    view = with_state(view, {**took.status, "progress": formed_at(0)})
    going = [replace(p, deleting=True, deletion_at=at(61)) for p in doomed]
    members = [replace(p, generation=1, ready=True) for p in starting]
    out = plan(view, [*going, *[noticed(p, 33, window_s=30) for p in members]], at(34))
    assert (out.status["currentGeneration"], out.status["phase"]) == (1, "Running"), out.status
    assert "WorkerDisrupted" not in reasons(out) and len(out.status["leavingWorkers"]) == 8
    assert out.create is not None and out.create.joiners


def test_a_notice_on_every_member_keeps_one_to_hand_the_state_over() -> None:
    """Every member on one noticed node, three of their four replacements Ready: generation 1
    keeps the first leaver (rank 0, its state in memory) beside the three, who receive the
    state from it; it is swapped for the fourth replacement only once generation 1 made its
    first step (rank 0's report), so no generation starts from storage."""
    view, up = all_on_one_node(4, 1)
    doomed = [noticed(p, 10) for p in up]
    first, view, pods = step(view, doomed, 10)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    assert first.create is not None and first.create.indices == (4, 5, 6, 7)
    ready = [on(replace(p, joiner=True), "n2") for p in pods[4:7]]
    starting = replace(pods[7], joiner=True)
    handed, view, pods = step(view, [*doomed, *ready, starting], 30)
    assert handed.status["currentGeneration"] == 1 and handed.status["members"] == [0, 4, 5, 6]
    assert [w["pod"] for w in handed.status["leavingWorkers"]] == ["tj-worker-0"]
    assert set(handed.delete) == {"tj-worker-1", "tj-worker-2", "tj-worker-3"}
    assert "tj-worker-0" in handed.relabel and handed.create is None
    assert (handed.status["disruptions"], handed.status["restarts"]) == (1, 0)
    told = [e.message for e in handed.events if e.reason == "KeepingDonor"]
    assert len(told) == 1 and told[0].startswith("every member was given notice: tj-worker-0 ")
    # Generation 1 forming (rank 0's last report is of generation 0): the donor stays, even
    # with the fourth replacement Ready.
    view = with_state(view, {**handed.status, "progress": formed_at(0)})
    pods = [p for p in pods if p.name not in handed.delete]
    pods = [on(p, "n2") if p.index == 7 else p for p in pods]
    forming = plan(view, pods, at(32))
    assert forming.status["currentGeneration"] == 1 and forming.delete == ()
    assert forming.requeue_after_s is not None and forming.requeue_after_s <= 1.0
    assert "KeepingDonor" not in reasons(forming), "told once, when the donor is kept"
    view = with_state(view, {**forming.status, "progress": formed_at(1)})
    swapped = plan(view, pods, at(40))
    assert swapped.status["currentGeneration"] == 2 and swapped.status["members"] == [4, 5, 6, 7]
    assert swapped.delete == ("tj-worker-0",)


def test_a_notice_on_every_member_keeps_a_donor_when_every_replacement_is_ready_at_once() -> None:
    """Replacements made together (a measured lead: all at the same moment) are often all Ready
    by the pass that sees the first: the donor is kept then too, not every member swapped
    (which started the job from its last checkpoint)."""
    view, up = all_on_one_node(4, 1)
    doomed = [noticed(p, 10) for p in up]
    first, view, pods = step(view, doomed, 10)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    assert first.create is not None and first.create.indices == (4, 5, 6, 7)
    ready = [on(replace(p, joiner=True), "n2") for p in pods[4:]]
    handed = plan(view, [*doomed, *ready], at(30))
    assert handed.status["currentGeneration"] == 1 and handed.status["members"] == [0, 4, 5, 6]
    assert [w["pod"] for w in handed.status["leavingWorkers"]] == ["tj-worker-0"]
    assert "KeepingDonor" in reasons(handed)


def test_a_loss_keeps_the_leavers_that_still_have_time_when_nobody_else_survives() -> None:
    """bench/results/2026-12-01s notice120-2, generation 11: two noticed nodes hold every
    member; those of n1 reach their margin while the replacements still start (not Ready),
    those of n3 have 30 s left. Taken with the loss, nobody survived and the job restarted at
    full size from storage (49 s); kept, they lead the next generation with the starting
    replacements, which receive the state from them, and the drain swaps them out once the
    other replacements are Ready: never from storage, never charged."""
    view, up = all_on_one_node(8, 5)
    up = [on(p, "n1" if p.index < 4 else "n3") for p in up]
    doomed = [noticed(p, 0, 40) if p.index < 4 else noticed(p, 0, 70) for p in up]
    first, view, pods = step(view, doomed, 10)
    assert first.create is not None and first.create.indices == tuple(range(8, 16))
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    starting = [replace(on(p, "n2"), joiner=True, ready=False) for p in pods[8:]]
    lost, view, pods = step(view, [*doomed, *starting], 31)  # n1 inside its 10 s margin
    st = lost.status
    assert (st["currentGeneration"], st["members"]) == (1, [4, 5, 6, 7, 8, 9, 10, 11]), st
    assert [w["pod"] for w in st["leavingWorkers"]] == [f"tj-worker-{i}" for i in (4, 5, 6, 7)]
    assert sorted(lost.delete) == [f"tj-worker-{i}" for i in range(4)]
    assert (st["restarts"], st["disruptions"]) == (0, 1), st
    # Generation 1 formed (its newcomers hold the state now); the other four are Ready.
    view = with_state(view, {**st, "progress": formed_at(1)})
    ready = [on(replace(p, joiner=p.index >= 12), "n2") if p.index >= 8 else p for p in pods]
    swapped = plan(view, ready, at(40))
    assert swapped.status["currentGeneration"] == 2
    assert swapped.status["members"] == list(range(8, 16)), swapped.status
    assert sorted(swapped.delete) == [f"tj-worker-{i}" for i in (4, 5, 6, 7)]


@pytest.mark.parametrize("unplaced", [False, True])
def test_a_storm_keeps_the_pods_with_time_left_when_no_node_is_free(unplaced: bool) -> None:
    """bench/results/2026-12-05r notice120-0, 16:35:28-34: every spot node noticed at once.
    n3's members (deadline +120 s) and n1's (+124 s) wait for replacements; n2 returns, takes
    all eight, and is noticed itself (+206 s). Four are Ready by n3's margin and take its
    members' places; generation 1 has not made its first step when n1's members reach their
    margin. Taken with that loss, the four pods starting on n2 were deleted as stale, the
    four members there were judged taken at the next pass (the generation still to create
    could not drain), and the job restarted from storage with eight new pods that no node
    could take: 66.6 s without a step while n2 had 90 s left. The pods with time left keep
    their places: generation 2 is the eight on n2 (from storage: none of them holds the
    state), the replacements of all eight start at once, and nothing is charged. With four
    replacements no node took yet (``unplaced``), the places go to the four on n2 all the
    same (2026-12-05t notice120-0: the four unplaced took them, 38 s without a step)."""
    view, up = all_on_one_node(8, 5)
    up = [on(p, "n3" if p.index < 4 else "n1") for p in up]
    pods = [noticed(p, 0) if p.index < 4 else p for p in up]
    zero, view, pods = step(view, pods, 0)
    view = with_state(view, {**zero.status, "progress": formed_at(0)})
    pods = [noticed(p, 4) if p.index in range(4, 8) else p for p in pods]
    first, view, pods = step(view, pods, 4)
    assert [p.index for p in pods if p.joiner] == list(range(8, 16)), "more than half: at once"
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    # n2 took the eight replacements and was noticed a second later; four are Ready.
    on_n2 = [noticed(replace(on(p, "n2"), ready=p.index < 12), 86) for p in pods if p.joiner]
    pods = [*(p for p in pods if not p.joiner), *on_n2]
    swapped, view, pods = step(view, pods, 110.8)  # n3's members at their margin
    assert swapped.status["members"] == [4, 5, 6, 7, 8, 9, 10, 11], swapped.status
    view = with_state(view, {**swapped.status, "progress": formed_at(0)})  # not formed
    if unplaced:
        pods += [replace(pod(i, 2), joiner=True) for i in range(16, 20)]
    lost, view, pods = step(view, pods, 115.3)  # n1's members at their margin
    st = lost.status
    assert (st["currentGeneration"], st["members"]) == (2, list(range(8, 16))), st
    assert sorted(lost.delete) == [f"tj-worker-{i}" for i in range(4, 8)], "none on n2"
    assert set(lost.relabel) == {f"tj-worker-{i}" for i in range(8, 16)}
    view = with_state(view, {**st, "progress": formed_at(0)})
    after, view, pods = step(view, pods, 115.9)
    st = after.status
    assert (st["currentGeneration"], st["phase"], st["restarts"]) == (2, "Running", 0), st
    assert after.delete == () and len(st["leavingWorkers"]) == 8
    assert after.create is not None and after.create.joiners
    assert len(after.create.indices) == 4 if unplaced else 8, after.create
    # Inside the margin of n2's notice, with the replacements still nowhere, the job restarts
    # from storage after all, once.
    late = plan(view, pods, at(197))
    assert late.status["currentGeneration"] == 3, late.status
    assert {f"tj-worker-{i}" for i in range(8, 16)} <= set(late.delete)


def three_nodes(n2_window_s: float) -> tuple[JobView, list[PodView]]:
    """Eight members, min 5: 0-2 on n1 (a 30 s notice at +10 s), 3-5 on n2 (noticed at
    +10 s with ``n2_window_s``), 6-7 on n3 (no notice); the six replacements created at
    once start on n3, not Ready yet."""
    view, up = all_on_one_node(8, 5)
    up = [on(p, "n1" if p.index < 3 else "n2" if p.index < 6 else "n3") for p in up]
    window = {0: 30.0, 1: n2_window_s}
    pods = [noticed(p, 10, window[p.index // 3]) if p.index < 6 else p for p in up]
    first, view, pods = step(view, pods, 10)
    assert first.create is not None and first.create.indices == tuple(range(8, 14))
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    return view, [replace(on(p, "n3"), ready=False) if p.joiner else p for p in pods]


def test_a_loss_keeps_the_leavers_with_time_left_beside_the_other_survivors() -> None:
    """n1's notice runs out before any replacement is Ready; n2 (90 s left) and n3 hold the
    rest. Taken with the loss, n2's three left two survivors, below the minimum of 5: the job
    restarted at full size and waited for six replacements to start, n2's pods deleted with
    90 s to train. Kept, the job shrinks to five at once, from memory, and the replacements
    take n2's places and n1's in one swap once they are Ready."""
    view, pods = three_nodes(120)
    lost, view, pods = step(view, pods, 31)  # n1 inside its margin
    st = lost.status
    assert (st["currentGeneration"], st["members"]) == (1, [3, 4, 5, 6, 7]), st
    assert sorted(lost.delete) == ["tj-worker-0", "tj-worker-1", "tj-worker-2"]
    assert [w["pod"] for w in st["leavingWorkers"]] == [f"tj-worker-{i}" for i in (3, 4, 5)]
    assert (st["restarts"], st["disruptions"]) == (0, 1)
    assert "ShrunkAfterDisruption" in reasons(lost)
    view = with_state(view, {**st, "progress": formed_at(1)})
    pods = [replace(p, ready=True) if p.joiner else p for p in pods]
    swapped = plan(view, pods, at(45))
    assert swapped.status["members"] == [6, 7, *range(8, 14)], swapped.status
    assert sorted(swapped.delete) == [f"tj-worker-{i}" for i in (3, 4, 5)]


def test_a_loss_takes_the_leavers_whose_time_is_short() -> None:
    """n2 with 24 s left at the loss (``joining.MIN_NOTICED_JOINER_S``: under 30 s, a
    re-formation and a few steps are not worth it): taken, as before; the job goes on at
    full size with the replacements that start."""
    view, pods = three_nodes(45)
    lost = plan(view, pods, at(31))
    st = lost.status
    assert (st["currentGeneration"], st["members"]) == (1, [6, 7, *range(8, 14)]), st
    assert {f"tj-worker-{i}" for i in range(6)} <= set(lost.delete)
    assert (st["restarts"], st["disruptions"]) == (0, 1)


def test_leavers_stuck_on_a_vanished_node_leave_the_next_generation_free_to_drain() -> None:
    """bench/results/2026-12-02e notice30-2, +131 s: a notice took four members whose four
    replacements were not Ready by the notice's margin, so the loss made them members
    (nothing to create); the four leavers, deleted, stayed Terminating on their node, which
    vanished. Waited for, the generation never counted itself created, could not drain, and
    the next notice (on the node of every member, 30 s) restarted the job at once: every
    member deleted, 51 s without a step. Their names are not the generation's: it is created,
    and the next notice is drained (replacements started, the members train on)."""
    view, up = all_on_one_node(8, 5)
    up = [on(p, "n1" if p.index < 4 else "n2") for p in up]
    doomed = [noticed(p, 10, window_s=30) if p.index < 4 else p for p in up]
    first, view, pods = step(view, doomed, 10)
    assert first.create is not None and first.create.indices == (8, 9, 10, 11)
    view = with_state(view, {**first.status, "progress": formed_at(0)})
    starting = [replace(on(p, "n2"), joiner=True, ready=False) for p in pods[8:]]
    lost, view, _ = step(view, [*doomed, *starting], 31)  # inside the notice's margin
    assert lost.status["members"] == [4, 5, 6, 7, 8, 9, 10, 11] and lost.create is None
    # Every place has its pod (the survivors, the replacements): nothing is created, so the
    # leavers still there are not waited for (2026-12-05g, +442 s).
    assert lost.status["createdGeneration"] == 1
    # n1 vanished with its four leavers, deleted: Terminating, the node not yet known lost.
    stuck = [replace(p, deleting=True, deletion_at=at(61)) for p in doomed[:4]]
    members = [replace(p, ready=True, generation=1) for p in (*up[4:], *starting)]
    view = with_state(view, {**lost.status, "progress": formed_at(1)})
    formed = plan(view, [*stuck, *members], at(35))
    assert formed.status["createdGeneration"] == 1 and formed.delete == ()
    view = with_state(view, formed.status)
    every = [noticed(p, 45, window_s=30) for p in members]
    drained = plan(view, [*stuck, *every], at(45))
    assert drained.phase == Phase.RUNNING, reasons(drained)
    assert drained.status["currentGeneration"] == 1 and drained.delete == ()
    assert drained.create is not None and drained.create.joiners
    assert drained.create.indices == tuple(range(12, 20)), "the stuck pods' names are held"
    assert len(drained.status["leavingWorkers"]) == 8


def formed_at(generation: int) -> dict[str, Any]:
    """``status.progress``: rank 0 reported generation ``generation``'s first step."""
    return {"step": 5, "generation": generation, "firstStepTime": "2026-01-01T00:00:05.000Z"}


def test_a_leaver_that_trains_on_is_kept_through_a_grow() -> None:
    """A grow while a member trains on through its notice (below the size after a loss, a
    joiner ready): the leaver stays a member of the grown generation until its own
    replacement is ready; it is not dropped as taken."""
    view, up = started(elastic())
    _, view, pods = step(view, [up[0], up[1], up[2], preempted(up[3])], 5)
    pods = [on(p, "n2") if p.index >= 4 else p for p in pods]
    pods = [noticed(p, 6) if p.index == 1 else p for p in pods]
    _, view, pods = step(view, pods, 6)
    pods = [on(p, "n2") if p.index >= 4 else p for p in pods]
    grown = plan(view, pods, at(7))
    assert grown.status["currentGeneration"] == 2 and grown.status["members"] == [0, 1, 2, 4]
    assert grown.delete == () and "tj-worker-1" in grown.relabel
    assert [w["pod"] for w in grown.status["leavingWorkers"]] == ["tj-worker-1"]


def test_a_job_that_does_not_drain_leaves_a_noticed_node_at_once_charging_no_failure() -> None:
    view, up = started(elastic(drain=False))
    shrunk = plan(view, [up[0], noticed(up[1], 10), up[2], up[3]], at(10))
    assert shrunk.status["currentGeneration"] == 1 and shrunk.status["replicas"] == 3
    assert (shrunk.status["disruptions"], shrunk.status["restarts"]) == (1, 0)
    # A RecreateGroup job restarts elsewhere, as after an eviction: a disruption too.
    view = job().replicas(2).build()
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index}") for p in pods]
    _, view, _ = step(view, up, 1)
    restarted = plan(view, [noticed(up[0], 5), up[1]], at(5))
    assert restarted.status["currentGeneration"] == 1
    assert (restarted.status["disruptions"], restarted.status["restarts"]) == (1, 0)


def test_a_silent_node_loses_its_pods_at_once() -> None:
    view, up = started(elastic())
    lost = list(with_nodes(up, {"n0": NodeView("n0"), "n1": NodeView("n1", ready=False)}, at(10)))
    shrunk = plan(view, lost, at(10))
    assert shrunk.status["history"][-1]["cause"] == "NodeLost"
    assert shrunk.status["losses"] == {"NodeLost": 1}
    assert shrunk.status["currentGeneration"] == 1 and shrunk.status["replicas"] == 2
    assert shrunk.status["members"] == [0, 2]
    assert shrunk.status["leavingWorkers"] is None, "a lost pod trains on nowhere"
    assert (shrunk.status["disruptions"], shrunk.status["restarts"]) == (1, 0)


# --- the watch's bookkeeping -----------------------------------------------------------------


def test_the_book_says_which_nodes_changed() -> None:
    book = NodeBook()
    assert book.replace({"a": NodeView("a"), "b": NodeView("b")}) == {"a", "b"}
    assert not book.put(NodeView("a")), "a heartbeat changes nothing"
    assert book.put(NodeView("a", unschedulable=True))
    assert book.replace({"a": NodeView("a", unschedulable=True)}) == {"b"}
    assert book.avoid() == ()
    assert book.put(NodeView("b", ready=False)) and book.avoid() == ("b",)
    assert book.drop("a") and not book.drop("a")
    assert book.drop("b") and book.avoid() == ()
    assert dict(book.snapshot()) == {}


def test_the_book_dates_a_notice_without_a_time_when_it_first_saw_it() -> None:
    """GKE's taint has no time: every pass counted the 30 s from its own clock, so a pod being
    deleted there, no longer a leaver, never passed its node's deadline and a restart waited
    for it to be overdue (bench/results/2026-12-05d: 45 s after its deletion)."""
    gke = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    book = NodeBook()
    book.replace({"n1": node_view(node("n1"), DEFAULT_NOTICE_TAINTS)}, now=at(0))
    noticed = node_view(node("n1", taints=[gke]), DEFAULT_NOTICE_TAINTS)
    assert noticed.noticed_at is None
    assert book.put(noticed, now=at(10)), "the notice is news"
    assert not book.put(noticed, now=at(20)), "a heartbeat neither changes nor re-dates it"
    assert book.replace({"n1": noticed}, now=at(25)) == set(), "nor does a relist"
    assert book.snapshot()["n1"].noticed_at == at(10)
    going = replace(on(pod(0), "n1"), deleting=True, deletion_at=at(46))
    (seen,) = with_nodes([going], book.snapshot(), at(41))
    assert seen.notice_until == at(40)
    assert held_only(seen, at(41)), "past its node's deadline it holds its name only"
    # The notice lifted (the node returned) and given again: dated anew.
    assert book.put(node_view(node("n1"), DEFAULT_NOTICE_TAINTS), now=at(100))
    assert book.put(noticed, now=at(130)) and book.snapshot()["n1"].noticed_at == at(130)
    # A taint with a time keeps it.
    dated = {**gke, "timeAdded": "2026-01-01T00:00:05Z"}
    assert book.put(node_view(node("n2", taints=[dated]), DEFAULT_NOTICE_TAINTS), now=at(140))
    assert book.snapshot()["n2"].noticed_at == at(5)


def test_the_store_finds_the_jobs_with_a_pod_on_a_node() -> None:
    store = Store()

    def pod_on(ns: str, job_name: str, name: str, node_name: str) -> dict[str, Any]:
        return {
            "metadata": {
                "namespace": ns,
                "name": name,
                "labels": {"torchjob.io/job-name": job_name},
            },
            "spec": {"nodeName": node_name, "restartPolicy": "Never"},
            "status": {"phase": "Running"},
        }

    store.put_pod(pod_on("a", "j1", "j1-worker-0", "n1"))
    store.put_pod(pod_on("a", "j2", "j2-worker-0", "n10"))
    store.put_pod(pod_on("b", "j3", "j3-worker-0", "n1"))
    assert store.jobs_on_node("n1") == {("a", "j1"), ("b", "j3")}
    assert store.jobs_on_node("n10") == {("a", "j2")}
    assert store.jobs_on_node("n2") == set()
    assert store.jobs_on_nodes({"n10", "n2"}) == {("a", "j2")}
    assert store.jobs_on_nodes(set()) == set()


def test_a_new_pod_is_kept_off_the_avoided_nodes_in_every_affinity_term() -> None:
    bare: dict[str, Any] = {"spec": {}}
    avoid_nodes(bare, ["n2", "n1"])
    terms = bare["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # One requirement a node: the API server takes one value for a metadata.name requirement.
    away = [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in ("n1", "n2")]
    assert terms == [{"matchFields": away}]
    gpu = {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
    user: dict[str, Any] = {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [dict(gpu), dict(zone)]
                    }
                }
            }
        }
    }
    avoid_nodes(user, ["n1", "n2"])
    got = user["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert got == [{**gpu, "matchFields": away}, {**zone, "matchFields": away}]
    untouched: dict[str, Any] = {"spec": {}}
    avoid_nodes(untouched, [])
    assert untouched == {"spec": {}}


def test_a_pod_stuck_terminating_on_a_lost_node_holds_its_name_and_nothing_else() -> None:
    """A RecreateGroup job loses the node of pod 1: it restarts at once (a disruption), and
    pod 1, deleted, stays Terminating on the node that cannot confirm it. The new generation
    is not held up: its second place is created as pod 2, and the rank order says so."""
    view = job().replicas(2).build()
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index}") for p in pods]
    _, view, _ = step(view, up, 1)
    nodes = {"n0": NodeView("n0"), "n1": NodeView("n1", ready=False)}
    restarted, view, _ = step(view, list(with_nodes(up, nodes, at(5))), 5)
    assert restarted.status["currentGeneration"] == 1
    assert (restarted.status["disruptions"], restarted.status["restarts"]) == (1, 0)
    assert set(restarted.delete) == {"tj-worker-0", "tj-worker-1"}
    assert restarted.create is None, "the old pods go first"
    stuck = replace(up[1], deleting=True)
    again = plan(view, list(with_nodes([stuck], nodes, at(6))), at(6))
    assert again.create is not None and again.create.indices == (0, 2)
    assert again.create.members == (0, 2) and again.status["members"] == [0, 2]
    assert again.delete == (), "it was deleted already; it only cannot go"
    # A stale pod that is merely terminating (its node reports) is waited for, as before.
    waiting = plan(view, [stuck], at(6))
    assert waiting.create is None


def restarted_for_a_preemption() -> tuple[JobView, list[PodView]]:
    """A RecreateGroup job of 2 pods on nodes n0 and n1, restarted (generation 1) after pod 1
    was preempted: its pods are not created until the old ones are gone."""
    view = job().replicas(2).build()
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index}") for p in pods]
    _, view, _ = step(view, up, 1)
    restarted, view, _ = step(view, [up[0], preempted(up[1])], 5)
    assert restarted.status["currentGeneration"] == 1 and restarted.create is None
    return view, up


def test_a_pod_overdue_past_its_deletion_deadline_holds_its_name_and_nothing_else() -> None:
    """bench/results/2026-12-02i: a leaver deleted on a node that then vanished stayed until
    the node was known lost (43 s) and held the restart that long. A pod still there
    OVERDUE_S past its deletion deadline (a live kubelet kills it at the deadline) holds
    only its name, before its node is known lost; until then the restart looks again when
    it would be overdue, since nothing else may say so."""
    view, up = restarted_for_a_preemption()
    leaving = replace(up[1], deleting=True, deletion_at=at(20))  # a 15 s grace period
    waiting = plan(view, [leaving], at(21))
    assert waiting.create is None, "before its deadline it may still commit a checkpoint"
    assert waiting.requeue_after_s == pytest.approx(20 - 21 + OVERDUE_S)
    assert plan(view, [leaving], at(20 + OVERDUE_S - 1)).create is None
    overdue = plan(view, [leaving], at(20 + OVERDUE_S))
    assert overdue.create is not None and overdue.create.indices == (0, 2)
    assert overdue.status["members"] == [0, 2]


def test_a_replacement_would_rather_not_go_to_the_node_of_a_silent_pod() -> None:
    """Its peers reported pod 1 silent: its node may have vanished while the API server still
    shows it Ready, so the replacement prefers the other nodes (a preference only: a hung
    process on the only node with room must not strand the job)."""
    view, up = started(elastic(2))
    report = {"pod": "tj-worker-1", "generation": 0, "by": "tj-worker-0", "seconds": 10.0}
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": [report]})
    shrunk, view, _ = step(view, up, 12)
    assert shrunk.status["replicas"] == 1
    stuck = replace(up[1], deleting=True)  # deleted, on a node that does not answer
    view = with_state(view, {**shrunk.status, "silentWorkers": [report]})
    made = decide(view, "uid", [replace(up[0], generation=1), stuck], (), at(13))
    assert made.plan.create is not None and len(made.workers) == 1
    affinity = made.workers[0]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 100,
            "preference": {
                "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]
            },
        }
    ]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity


def test_once_the_silent_pod_is_gone_its_replacement_still_keeps_off_its_node() -> None:
    """A partition: the silent pod's node stays Ready and, once the pod is deleted, holds none
    of the job's pods, so the default spread (ScheduleAnyway) would score it best and put the
    replacement back where it cannot reach its peers (seen on three real nodes). The node is
    remembered from the generation's history (left: pod@node) and the default spread gives
    way to the preference; a spread of the job's own stays."""
    view, up = started(elastic(2))
    # A partition: each side reports the other; rank 0's report is the one trusted.
    reports = [
        {"pod": "tj-worker-1", "generation": 0, "by": "tj-worker-0", "seconds": 10.0},
        {"pod": "tj-worker-0", "generation": 0, "by": "tj-worker-1", "seconds": 10.0},
    ]
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": reports})
    assert suspect_nodes(view.state, up, (), "tj") == ["n1"], "rank 0's node is not suspect"
    shrunk, view, _ = step(view, up, 12)
    (latest,) = [r for r in shrunk.status["history"] if r["generation"] == 1]
    assert latest["cause"] == "SilentPeer" and latest["left"] == ["tj-worker-1@n1"], latest
    view = with_state(view, {**shrunk.status, "silentWorkers": reports})
    alone = [replace(up[0], generation=1)]  # the silent pod is gone
    made = decide(view, "uid", alone, (), at(13))
    assert made.plan.create is not None and len(made.workers) == 1
    spec = made.workers[0]["spec"]
    away = spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert away[0]["preference"]["matchFields"][0]["values"] == ["n1"]
    assert "topologySpreadConstraints" not in spec
    own = [{"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
    wire = view.spec.model_dump(by_alias=True, exclude_none=True)
    wire["template"]["spec"]["topologySpreadConstraints"] = own
    spread_view = replace(view, spec=TorchJobSpec.model_validate(wire))
    kept = decide(spread_view, "uid", alone, (), at(13))
    assert kept.workers[0]["spec"]["topologySpreadConstraints"] == own
    # Past the generation that lost it, the node is remembered for SUSPECT_S from then.
    later = with_state(view, {**shrunk.status, "silentWorkers": reports, "currentGeneration": 2})
    assert suspect_nodes(later.state, alone, (), "tj", at(13)) == ["n1"]
    assert suspect_nodes(later.state, alone, (), "tj", at(13 + SUSPECT_S)) == []
    assert suspect_nodes(view.state, alone, ("n1",), "tj") == [], "an avoided node is left out"


def test_nodes_lost_to_silence_stay_suspect_for_a_while_unless_they_came_back() -> None:
    """Issue 39, seen in the fleet benchmark (2026-12-05l): two nodes vanished 4 s apart.
    The generation begun for the second forgot the first (still shown Ready for 40 s, and
    holding none of the job's pods), and the even spread put all three replacements there,
    44.5 s without a step. Every generation begun within SUSPECT_S that left silent pods
    names their nodes, but a node Ready again since it was left (it went and came back)."""
    first = GenerationRecord(
        generation=4,
        began=at(100).isoformat(),
        cause="SilentPeer",
        left=["tj-worker-1@n3", "tj-worker-2@n3"],
        silent=["tj-worker-1", "tj-worker-2"],
    )
    second = GenerationRecord(
        generation=5,
        began=at(105).isoformat(),
        cause="SilentPeer",
        left=["tj-worker-0@n1", "tj-worker-5@n2"],
        silent=["tj-worker-0"],  # tj-worker-5 left for another reason: n2 is not suspect
    )
    grown = GenerationRecord(generation=6, began=at(110).isoformat(), cause="ScaleUp")
    history = [first, second, grown]
    assert recently_silent(history, at(110), {}) == {"n1", "n3"}
    assert recently_silent(history, at(100 + SUSPECT_S + 1), {}) == {"n1"}
    assert recently_silent(history, at(106 + SUSPECT_S), {}) == set()
    back = {"n3": NodeView(name="n3", ready=True, ready_since=at(103))}
    assert recently_silent(history, at(110), back) == {"n1"}, "n3 came back"
    never_left = {"n3": NodeView(name="n3", ready=True, ready_since=at(0))}
    assert recently_silent(history, at(110), never_left) == {"n1", "n3"}


def test_a_silent_pods_place_is_created_anew_while_it_is_still_being_deleted() -> None:
    """Issue 39, seen in the fleet benchmark: a node vanishes; its pod's peers report it
    silent, the next generation is published and the pod deleted, but its node, frozen, never
    confirms the deletion, and the API server shows it Ready for ~40 s. The place was created
    only once the pod was gone (the node back, or marked ~48 s later). It is created at once
    under another index, as for a pod stuck on a node known lost."""
    view = job().replicas(2).keep_survivors().max_restarts(3).build()
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index}") for p in pods]
    _, view, _ = step(view, up, 1)
    report = {"pod": "tj-worker-1", "generation": 0, "by": "tj-worker-0", "seconds": 10.0}
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": [report]})
    lost, view, _ = step(view, up, 12)
    assert lost.status["currentGeneration"] == 1 and "tj-worker-1" in lost.delete
    assert lost.status["history"][-1]["cause"] == "SilentPeer"
    # Published with the rank order the survivors read at once: the new place is pod 2 from
    # the start (pod 1's name is held), never rewritten at a later pass.
    assert lost.status["members"] == [0, 2]
    view = with_state(view, {**lost.status, "silentWorkers": [report]})
    frozen = replace(up[1], deleting=True)  # Ready as far as the API server knows
    assert not frozen.stuck
    again = plan(view, [replace(up[0], generation=1), frozen], at(13))
    assert again.create is not None and again.create.indices == (2,), again.create
    assert again.status["members"] == [0, 2]
    assert again.delete == (), "it was deleted already; it only cannot go"
    # A pod merely being deleted for another reason is still waited for.
    plain = with_state(view, {**lost.status, "silentWorkers": [], "history": []})
    assert plan(plain, [replace(up[0], generation=1), frozen], at(13)).create is None


def test_a_published_rank_order_never_changes_when_a_nodes_pods_cannot_go() -> None:
    """bench/results/2026-11-29h run 2, loss 3: a KeepSurvivors job lost a node whose pods its
    peers found silent; the generation was published naming new pods under the lost pods'
    indices and rewritten a pass later (the names were held), after the survivors had read it.
    Their rank-to-pod map was wrong, and when the next node went they reported the old pods
    instead of the new ones. The order published first is the one the pods are created by."""
    view = job().replicas(4).keep_survivors().max_restarts(3).build()
    _, view, pods = step(view, [], 0)
    up = [on(p, f"n{p.index // 2}") for p in pods]  # n0: pods 0, 1; n1: pods 2, 3
    _, view, _ = step(view, up, 1)
    nodes = {"n0": NodeView("n0"), "n1": NodeView("n1", ready=False)}
    report = {"pod": "tj-worker-2", "generation": 0, "by": "tj-worker-0", "seconds": 6.0}
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": [report]})
    lost, view, _ = step(view, list(with_nodes(up, nodes, at(8))), 8)
    assert lost.status["currentGeneration"] == 1
    published = lost.status["members"]
    assert published[:2] == [0, 1] and not {2, 3} & set(published[2:]), published
    view = with_state(view, {**lost.status, "silentWorkers": [report]})
    kept = [replace(p, generation=1) for p in up[:2]]
    gone = [replace(p, deleting=True) for p in up[2:]]
    again = plan(view, list(with_nodes(kept + gone, nodes, at(9))), at(9))
    assert again.status["members"] == published
    assert again.create is not None and set(again.create.indices) == set(published[2:])


def test_a_replacement_already_starting_takes_a_place_when_the_job_must_refill() -> None:
    """bench/results/2026-11-29h run 2, loss 8: a node went while the replacements of the
    node before were starting, and the job fell below its minimum. The full-size generation
    deleted the joiners 35 s into their start and created new pods in their places; the
    joiners now take places first, and only the rest are new pods."""
    builder = job().replicas(4).elastic(3, 4).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    view, up = started(builder.build())
    lost = {"pod": "tj-worker-3", "generation": 0, "by": "tj-worker-0", "seconds": 6.0}
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": [lost]})
    shrunk, view, pods = step(view, up, 8)
    assert shrunk.status["replicas"] == 3
    made, view, pods = step(view, [*pods, replace(up[3], deleting=True)], 9)
    assert made.create is not None and made.create.indices == (4,), made.create
    starting = next(p for p in pods if p.index == 4)
    assert starting.joiner
    # Pods 1 and 2 go silent before the joiner is ready: 1 of 3 left, below the minimum.
    reports = [
        {"pod": f"tj-worker-{i}", "generation": 1, "by": "tj-worker-0", "seconds": 6.0}
        for i in (1, 2)
    ]
    view = with_state(view, {**made.status, "silentWorkers": reports})
    now = [on(replace(p, generation=1), f"n{p.index % 2}") for p in pods if p.index < 3]
    gone = replace(on(up[3], "n1"), deleting=True, node_lost=True)  # its node stopped reporting
    refill = plan(view, [*now, gone, starting], at(15))
    members = refill.status["members"]
    assert refill.status["currentGeneration"] == 2 and members[:2] == [0, 4], members
    assert not {1, 2, 3} & set(members), "held names are not reused"
    assert "tj-worker-4" not in refill.delete


def test_a_pod_left_silent_stays_out_when_a_later_loss_restarts_the_job() -> None:
    """bench/results/2026-11-30a, losses 8 and 9: a node vanished; its pods' peers reported
    them silent and the next generation left them (deleted, but Ready as far as the API
    server knew: the node frozen). Another silent pod two seconds later took the job below its
    minimum, and the full-size generation that followed took the first pods back as members
    (only the latest generation's verdict was remembered, and the reporters' new reports had
    replaced their old ones), then waited 37-39 s for the node controller. A verdict holds
    until a new pod of that name joins (``status.history``'s ``silent``)."""
    builder = job().replicas(4).elastic(3, 4).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    view, up = started(builder.build())
    first = {"pod": "tj-worker-3", "generation": 0, "by": "tj-worker-0", "seconds": 6.0}
    view = with_state(view, {**plan(view, up, at(2)).status, "silentWorkers": [first]})
    shrunk, view, _ = step(view, up, 8)
    assert shrunk.status["replicas"] == 3 and "tj-worker-3" in shrunk.delete
    (record,) = [r for r in shrunk.status["history"] if r["generation"] == 1]
    assert record["cause"] == "SilentPeer" and record["silent"] == ["tj-worker-3"], record
    frozen = replace(up[3], deleting=True)  # deleted, its node frozen: Ready to the API
    assert not frozen.stuck
    # Reporter 0's next report (pod 2, generation 1) replaces its first one, as it does.
    second = {"pod": "tj-worker-2", "generation": 1, "by": "tj-worker-0", "seconds": 6.0}
    view = with_state(view, {**shrunk.status, "silentWorkers": [second]})
    kept = [replace(p, generation=1) for p in up[:3]]
    refill = plan(view, [*kept, frozen], at(12))
    assert refill.status["currentGeneration"] == 2, refill.status
    assert refill.phase == Phase.RESTARTING
    members = refill.status["members"]
    assert members[:2] == [0, 1] and not {2, 3} & set(members), members
    assert refill.status["history"][-1]["silent"] == ["tj-worker-2"]
    assert refill.delete == ("tj-worker-2",)
    # Both silent pods deleted and frozen: neither is waited for, both names stay held.
    view = with_state(view, {**refill.status, "silentWorkers": [second]})
    now = [replace(p, generation=2) for p in kept[:2]]
    held = [replace(kept[2], deleting=True), frozen]
    made = plan(view, [*now, *held], at(13))
    assert made.status["members"] == members, "the published order stays"
    assert made.create is not None and set(made.create.indices) == set(members[2:])
    assert made.delete == ()

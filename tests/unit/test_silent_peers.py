"""Silent peers reported by the survivors (``status.silentWorkers``,
torchjob_operator/torchjob/silent.py): the silent pod is lost, a disruption that is never
charged (``torchjob.rules.loss.Silent``), the job goes on without it at once; reports that
cannot be right are not acted on."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from tests.unit.builders import at, job, pod, running
from tests.unit.test_hard_loss import elastic_keep
from tests.unit.test_planner import step

from torchjob.api.models import SilentWorker
from torchjob_operator.torchjob.nodes import lost_silent
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import JobView, Plan, plan, with_state
from torchjob_operator.torchjob.silent import NODE_HOW, RANK0_HOLD_S, silenced, trusted_reports


def format_ms(t: datetime) -> str:
    """``t`` as the runtime writes a report's ``at``: RFC 3339, milliseconds, ``Z``."""
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def reported(
    view: JobView,
    status: dict,
    *reports: tuple[str, int, str] | tuple[str, int, str, str],
    how: str | None = None,
    at_s: float | None = None,
) -> JobView:
    """``view`` once survivors patched ``status.silentWorkers`` with ``reports`` (pod,
    generation, reporter, and its own ``how`` if given; ``how``: absent, as an older runtime
    writes them, or ``heartbeat`` / ``store`` / ``host`` / ``absent``; ``at_s``: when they were
    made, absent as an older runtime writes them)."""
    extra: dict = {} if at_s is None else {"at": format_ms(at(at_s))}
    body = []
    for p, g, by, *own in reports:
        said = own[0] if own else how
        body.append(
            {"pod": p, "generation": g, "by": by, "seconds": 10.5, **extra}
            | ({} if said is None else {"how": said})
        )
    return with_state(view, {**status, "silentWorkers": body})


def test_a_pod_reported_silent_is_an_uncharged_loss_and_the_job_shrinks_at_once() -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = reported(view, settled.status, ("tj-worker-1", 0, "tj-worker-0"))
    decided = plan(view, up, at(12))  # worker 1 still shows Running: its node noticed nothing
    st = decided.status
    assert (st["currentGeneration"], st["replicas"], st["restarts"]) == (1, 1, 0)
    assert st["disruptions"] == 1
    assert decided.delete == ("tj-worker-1",) and decided.relabel == ("tj-worker-0",)
    shrunk = next(e for e in decided.events if e.reason == "ShrunkAfterDisruption")
    assert "tj-worker-1: silent for 10s (no heartbeat; seen by tj-worker-0)" in shrunk.message
    assert st.get("lastFailure") is None, "a silent peer is no failure"
    # The report is of generation 0: once generation 1 runs it is moot (the replacement that
    # takes the name later is not silent).
    after = reported(view, decided.status, ("tj-worker-1", 0, "tj-worker-0"))
    joining, after, pods = step(after, [up[0]], 13)
    assert joining.status["currentGeneration"] == 1 and joining.status["disruptions"] == 1
    assert joining.create is not None and joining.create.indices == (1,)
    grown = plan(after, [running(p) for p in pods], at(20))
    assert grown.status["currentGeneration"] == 2 and grown.status["replicas"] == 2


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("store", "its store did not answer"),
        ("host", "its host did not answer"),
    ],
)
def test_a_store_or_host_found_silent_is_said_so(how: str, said: str) -> None:
    """A forming pod's probe of rank 0's store (``how: store``), or a sweep of the members'
    hosts (``how: host``): the events say what was silent, not "no heartbeat"."""
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = reported(view, settled.status, ("tj-worker-0", 0, "tj-worker-1"), how=how)
    decided = plan(view, up, at(12))
    shrunk = next(e for e in decided.events if e.reason == "ShrunkAfterDisruption")
    assert f"tj-worker-0: silent for 10s ({said}; seen by tj-worker-1)" in shrunk.message
    assert decided.delete == ("tj-worker-0",) and decided.status["restarts"] == 0


def test_reports_the_planner_does_not_act_on() -> None:
    members = ["tj-worker-0", "tj-worker-1", "tj-worker-2"]

    def w(pod: str, gen: int, by: str) -> SilentWorker:
        return SilentWorker(pod=pod, generation=gen, by=by, seconds=11.0)

    assert set(trusted_reports([w("tj-worker-2", 3, "tj-worker-0")], 3, members)) == {"tj-worker-2"}
    assert not trusted_reports([w("tj-worker-2", 2, "tj-worker-0")], 3, members), "stale"
    assert not trusted_reports([w("tj-worker-5", 3, "tj-worker-0")], 3, members), "no member"
    assert not trusted_reports([w("tj-worker-2", 3, "tj-worker-9")], 3, members), "by a stranger"
    # A partition between pods 1 and 2: each reports the other; pod 0 (rank 0, the store)
    # reports 2 as well: 2 goes.
    both = [w("tj-worker-2", 3, "tj-worker-1"), w("tj-worker-1", 3, "tj-worker-2")]
    assert set(trusted_reports([*both, w("tj-worker-2", 3, "tj-worker-0")], 3, members)) == {
        "tj-worker-2"
    }
    # Only the two of them: the pod that runs rank 0 is right (it serves the beats' store).
    mutual = [w("tj-worker-0", 3, "tj-worker-1"), w("tj-worker-1", 3, "tj-worker-0")]
    assert set(trusted_reports(mutual, 3, members)) == {"tj-worker-1"}


def members(status: dict) -> list[int]:
    """The generation's pod indices in rank order (``members``, or 0..replicas-1)."""
    return status.get("members") or list(range(status["replicas"]))


def assert_waits(decided: Plan, left_s: float) -> None:
    """Nothing acted on yet: generation 0 goes on, and the planner looks again in ``left_s``."""
    assert decided.status["currentGeneration"] == 0 and decided.delete == ()
    assert decided.requeue_after_s == pytest.approx(left_s)


def assert_goes_on_with(decided: Plan, kept: list[int], gone: list[str]) -> None:
    """The next generation is ``kept`` (indices in rank order), ``gone`` deleted, nothing charged."""
    assert members(decided.status) == kept, decided.status
    assert sorted(decided.delete) == gone
    assert decided.status["restarts"] == 0


def test_a_partition_goes_to_rank_0s_side_whichever_side_reports_first() -> None:
    """A partition between two nodes: pods 0 and 1 (rank 0, the store) on one, 2 and 3 on
    the other. Both sides find the other silent in the same seconds; the side cut off from the
    store reported first (seen in CI) and the operator dropped rank 0's side. A report that
    names rank 0's pod waits ``RANK0_HOLD_S``: rank 0's report of the other side comes in that
    time and wins. Without one (rank 0's node vanished), the wait ends and the report counts."""
    _, view, pods = step(elastic_keep(4, 2), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    cut = ("tj-worker-0", 0, "tj-worker-2"), ("tj-worker-1", 0, "tj-worker-2")
    cut_off = reported(view, settled.status, *cut, at_s=10)
    assert_waits(plan(cut_off, up, at(10.5)), RANK0_HOLD_S - 0.5)
    # Rank 0's side reports the other side a second later: it keeps the job.
    both = reported(
        view,
        settled.status,
        *cut,
        ("tj-worker-2", 0, "tj-worker-0"),
        ("tj-worker-3", 0, "tj-worker-0"),
        at_s=11,
    )
    assert_goes_on_with(plan(both, up, at(11.2)), [0, 1], ["tj-worker-2", "tj-worker-3"])
    # Nobody answers for rank 0's pod (its node vanished): once the wait is over, pod 2's
    # report counts, and the job goes on with 2 and 3 (a new rank 0).
    vanished = plan(cut_off, up, at(10 + RANK0_HOLD_S))
    assert members(vanished.status) == [2, 3], vanished.status
    assert sorted(vanished.delete) == ["tj-worker-0", "tj-worker-1"]
    # A report of a pod other than rank 0's does not wait.
    other = reported(view, settled.status, ("tj-worker-3", 0, "tj-worker-1"), at_s=10)
    assert members(plan(other, up, at(10.1)).status) == [0, 1, 2]


def test_rank_0s_pod_named_from_two_other_nodes_counts_at_once() -> None:
    """Six pods on three nodes, two each, rank 0's on node a. Its node vanishes: pods on b and
    c both name rank 0's pod, and no wait can bring rank 0's own report (its node is gone, or
    cut off from both): the job goes on with the four at once, not ``RANK0_HOLD_S`` later
    (bench/results/2026-12-06b: such a vanish re-formed 3 s later than one that spared rank
    0). A partition between a and b has one side that names rank 0 (c reaches its store, and
    reports b): that side still waits, and rank 0's side keeps the job."""
    _, view, pods = step(elastic_keep(6, 2), [], 0)
    up = [replace(running(p), node="abc"[p.index // 2]) for p in pods]
    settled, view, _ = step(view, up, 1)
    # Each reporter names rank 0's pod (its store went silent) and its node-mate (the sweep).
    by_b = [("tj-worker-0", 0, "tj-worker-2"), ("tj-worker-1", 0, "tj-worker-2", "host")]
    by_c = [("tj-worker-0", 0, "tj-worker-4"), ("tj-worker-1", 0, "tj-worker-4", "host")]
    gone = [*by_b, *by_c]
    vanished = plan(reported(view, settled.status, *gone, at_s=10), up, at(10.2))
    assert_goes_on_with(vanished, [2, 3, 4, 5], ["tj-worker-0", "tj-worker-1"])
    # One node names rank 0 (both of its pods): the wait holds.
    lone = reported(view, settled.status, *by_b, ("tj-worker-0", 0, "tj-worker-3"), at_s=10)
    assert_waits(plan(lone, up, at(10.2)), RANK0_HOLD_S - 0.2)
    # The partition a|b: c reports b's pods (their beats no longer reach the store): a keeps it.
    cut = reported(
        view,
        settled.status,
        *by_b,
        ("tj-worker-2", 0, "tj-worker-4"),
        ("tj-worker-3", 0, "tj-worker-5"),
        at_s=10,
    )
    assert_goes_on_with(plan(cut, up, at(10.2)), [0, 1, 4, 5], ["tj-worker-2", "tj-worker-3"])
    # Two pods of rank 0's own node name it (its node-mate cut off): not another node's view.
    mates = [("tj-worker-0", 0, "tj-worker-1"), ("tj-worker-0", 0, "tj-worker-2")]
    assert_waits(plan(reported(view, settled.status, *mates, at_s=10), up, at(10.2)), 2.8)


def test_a_silent_report_under_a_fixed_size_job_replaces_the_pod_without_backoff() -> None:
    _, view, pods = step(job().replicas(2).keep_survivors().max_restarts(3).build(), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = reported(view, settled.status, ("tj-worker-0", 0, "tj-worker-1"))
    decided = plan(view, up, at(12))
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 2
    assert decided.delete == ("tj-worker-0",)
    assert decided.status.get("restartAfter") is None, "no backoff"
    assert (decided.status["restarts"], decided.status["disruptions"]) == (0, 1)


def test_a_report_of_the_generation_before_counts_for_a_pod_carried_into_this_one() -> None:
    """bench/results/2026-11-29h run 2, loss 4: a generation was published for another reason
    (a grow, a spread's swap) just as a node vanished; the survivors' reports, of the
    generation before, counted for nothing, and the new generation found the same pods again
    while it formed, 10-15 s later. A report of the generation before counts when the pod
    it names and its reporter were both carried into this one; never for a pod new in it."""
    _, view, pods = step(elastic_keep(3), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = reported(view, settled.status, ("tj-worker-2", 0, "tj-worker-0"))
    shrunk, view, pods = step(view, up, 12)
    assert shrunk.status["replicas"] == 2
    going = [*(running(p) for p in pods), replace(up[2], deleting=True)]
    made, view, pods = step(view, going, 13)
    assert made.create is not None
    (joiner,) = made.create.indices
    assert joiner == 3, "pod 2 still holds its name"
    # The replacement runs: the job grows back (generation 2), pod 2 gone by then.
    alive = [running(p) for p in pods if p.name != "tj-worker-2"]
    grown, view, pods = step(view, alive, 20)
    assert grown.status["currentGeneration"] == 2, grown.status
    assert grown.status["members"] == [0, 1, joiner]
    assert grown.status["history"][-1]["cause"] == "ScaleUp"
    up = [running(p) for p in pods]
    # Written as generation 2 came out: pod 0 saw pod 1 and the new pod go silent in
    # generation 1 (the new pod was no member of it: that part cannot be right).
    new = f"tj-worker-{joiner}"
    view = reported(view, grown.status, ("tj-worker-1", 1, "tj-worker-0"), (new, 1, "tj-worker-0"))
    decided = plan(view, up, at(22))
    st = decided.status
    assert (st["currentGeneration"], st["members"], st["restarts"]) == (3, [0, joiner], 0)
    assert decided.delete == ("tj-worker-1",)
    assert st["history"][-1]["cause"] == "SilentPeer", st["history"][-1]
    # Lost to its silence, for what follows (its name held while its node cannot confirm
    # the deletion, its node avoided): the report counts there too.
    body = [r.model_dump(by_alias=True, exclude_none=True) for r in view.state.silent]
    after = with_state(view, {**st, "silentWorkers": body})
    assert set(lost_silent(after.state)) == {"tj-worker-1"}
    # Two generations back is too old, and a report of this generation still counts alone.
    stale = reported(view, grown.status, ("tj-worker-1", 0, "tj-worker-0"))
    assert plan(stale, up, at(22)).status["currentGeneration"] == 2


def with_a_replacement() -> tuple[JobView, dict, list[PodView], str]:
    """A 3-pod job (elastic 2..3) that lost pod 2 and grew back with its replacement:
    generation 2, members [0, 1, the replacement]; the view, its status, the pods (running),
    and the replacement's name."""
    _, view, pods = step(elastic_keep(3, 2), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = reported(view, settled.status, ("tj-worker-2", 0, "tj-worker-0"))
    _, view, pods = step(view, up, 12)
    going = [*(running(p) for p in pods), replace(up[2], deleting=True)]
    made, view, pods = step(view, going, 13)
    assert made.create is not None
    (joiner,) = made.create.indices
    grown, view, pods = step(view, [running(p) for p in pods if p.name != "tj-worker-2"], 20)
    assert grown.status["currentGeneration"] == 2, grown.status
    assert grown.status["members"] == [0, 1, joiner], grown.status
    return view, grown.status, [running(p) for p in pods], f"tj-worker-{joiner}"


def test_a_replacement_that_never_arrives_is_lost_and_a_survivor_is_never_named_absent() -> None:
    """``how: absent`` (the formation's arrivals, 30 s): it counts for a pod new in the
    generation; never for a survivor carried into it (it arrives at its next report, which
    may be minutes away), nor in generation 0 (pods start as their images come)."""
    view, status, up, new = with_a_replacement()
    late = reported(view, status, ("tj-worker-1", 2, "tj-worker-0"), how="absent")
    kept = plan(late, up, at(60))
    assert kept.status["currentGeneration"] == 2 and kept.delete == (), kept.status
    absent = reported(view, status, (new, 2, "tj-worker-0"), how="absent")
    decided = plan(absent, up, at(60))
    shrunk = next(e for e in decided.events if e.reason == "ShrunkAfterDisruption")
    said = f"{new}: silent for 10s (it never joined the forming group; seen by tj-worker-0)"
    assert said in shrunk.message, shrunk.message
    assert decided.delete == (new,) and members(decided.status) == [0, 1]
    assert decided.status["restarts"] == 0
    _, first, pods = step(elastic_keep(3, 2), [], 0)
    settled, first, _ = step(first, [running(p) for p in pods], 1)
    start = reported(first, settled.status, ("tj-worker-2", 0, "tj-worker-0"), how="absent")
    assert plan(start, [running(p) for p in pods], at(60)).delete == ()


def test_a_replacement_cut_off_from_the_store_does_not_take_rank_0_out_of_the_job() -> None:
    """Generation 2 forms with a replacement that cannot reach rank 0's store (its route to
    it is broken): its store probe names rank 0's pod after 5 s, while pod 1 arrived there and
    says nothing. One of the two other members: no majority, and that report never counts
    (it took rank 0's pod out of the job 3 s later). Once the others name the replacement
    absent (the formation's arrivals, 30 s), it goes. Had pod 1 found the store silent too,
    rank 0's pod would have gone; a heartbeat's report needs no majority."""
    view, status, up, new = with_a_replacement()
    lone = ("tj-worker-0", 2, new, "store")
    accused = reported(view, status, lone, at_s=25)
    waiting = plan(accused, up, at(25 + 10 * RANK0_HOLD_S))
    assert waiting.status["currentGeneration"] == 2 and waiting.delete == (), waiting.status
    absent = reported(
        view,
        status,
        lone,
        (new, 2, "tj-worker-0", "absent"),
        (new, 2, "tj-worker-1", "absent"),
        at_s=55,
    )
    decided = plan(absent, up, at(55.1))
    assert members(decided.status) == [0, 1] and decided.delete == (new,), decided.status
    assert decided.status["restarts"] == 0
    both = reported(view, status, lone, ("tj-worker-0", 2, "tj-worker-1", "store"), at_s=25)
    gone = plan(both, up, at(25 + RANK0_HOLD_S))
    assert gone.delete == ("tj-worker-0",), gone.status
    assert members(gone.status) == [1, int(new.rsplit("-", 1)[1])], gone.status
    beat = reported(view, status, ("tj-worker-0", 2, new, "heartbeat"), at_s=25)
    assert plan(beat, up, at(25 + RANK0_HOLD_S)).delete == ("tj-worker-0",)


def test_a_joiner_on_the_node_of_a_silent_member_is_lost_with_it() -> None:
    """bench/results/2026-12-05n, +1289 s: a replacement placed on a node 4 s before the node
    vanished joined the next generation (no member beats with a joiner, so no report named
    it), which waited the 30 s of ``absent`` for it. A joiner on the node of a member found
    silent is lost with it, its name held; one on another node, or not yet placed, is not."""
    members = [replace(running(pod(i, 1)), node=f"n{i}") for i in range(3)]
    on_dark = replace(running(pod(3, 2)), node="n1", joiner=True)
    elsewhere = replace(running(pod(4, 2)), node="n2", joiner=True)
    unplaced = replace(pod(5, 2), joiner=True)
    report = SilentWorker(pod="tj-worker-1", generation=1, by="tj-worker-0", seconds=3.2)
    pods = [*members, on_dark, elsewhere, unplaced]
    out = {p.name: p for p in silenced(pods, [report], 1, [0, 1, 2], "tj")}
    assert out["tj-worker-1"].silent is not None
    lost = out["tj-worker-3"].silent
    assert lost is not None and lost.how == NODE_HOW and lost.seen_by == "tj-worker-0"
    assert not out["tj-worker-3"].active
    assert "a joiner on the node of a silent member" in out["tj-worker-3"].message
    assert out["tj-worker-4"] == elsewhere and out["tj-worker-5"] == unplaced
    assert out["tj-worker-0"] == members[0] and out["tj-worker-2"] == members[2]
    # Without a report, nothing is inferred.
    assert silenced(pods, [], 1, [0, 1, 2], "tj") == pods


def test_the_generation_after_a_silent_node_leaves_its_joiner_out() -> None:
    """The planner's side of the rule above: a 3-pod job that may not shrink (min 3) has a
    replacement starting on the node of pod 2 when pod 2 is found silent. The next
    generation, at full size, takes neither pod 2 nor that joiner; both are deleted, and a new
    pod starts in the joiner's place under an index neither holds."""
    _, view, pods = step(elastic_keep(3, 3), [], 0)
    up = [replace(running(p), node=f"n{p.index}") for p in pods]
    settled, view, _ = step(view, up, 1)
    joiner = replace(running(pod(3, 1)), node="n2", joiner=True)
    view = reported(view, settled.status, ("tj-worker-2", 0, "tj-worker-0"))
    decided = plan(view, [*up, joiner], at(12))
    st = decided.status
    assert st["currentGeneration"] == 1 and st["restarts"] == 0, st
    assert 2 not in st["members"] and 3 not in st["members"], st["members"]
    assert {"tj-worker-2", "tj-worker-3"} <= set(decided.delete), decided.delete
    assert st["members"] == [0, 1, 4], "the new pod under an index neither holds"
    kept = [replace(p, generation=1) for p in up[:2]]  # relabelled
    going = [*kept, replace(up[2], deleting=True), replace(joiner, deleting=True)]
    made = plan(with_state(view, st), going, at(13))
    assert made.create is not None and made.create.indices == (4,), made.create


def _silent_body(*reports: tuple[str, int, str, float, float | None, str | None]) -> list[dict]:
    """``status.silentWorkers`` entries: (pod, generation, reporter, seconds silent, when
    made or None, how or None)."""
    return [
        {"pod": p, "generation": g, "by": by, "seconds": s}
        | ({} if made is None else {"at": format_ms(at(made))})
        | ({} if how is None else {"how": how})
        for p, g, by, s, made, how in reports
    ]


def _shrunk_to_three() -> tuple[JobView, dict, list[PodView]]:
    """A 4-pod job whose pod 3 its peers found silent in generation 0: generation 1, pods
    0-2, published at 12 s."""
    _, view, pods = step(elastic_keep(4), [], 0)
    up = [running(p) for p in pods]
    settled, view, _ = step(view, up, 1)
    view = with_state(view, {**settled.status, "silentWorkers": _silent_body(
        ("tj-worker-3", 0, "tj-worker-0", 3.1, 10.0, None))})  # fmt: skip
    shrunk, view, pods = step(view, up, 12)
    assert (shrunk.status["currentGeneration"], shrunk.status["replicas"]) == (1, 3)
    return view, shrunk.status, [running(p) for p in pods if p.name != "tj-worker-3"]


def test_a_rank_left_in_the_old_generation_does_not_take_out_peers_that_moved_on() -> None:
    """bench/results/2026-12-06p, loss 5: one survivor of a SIGKILL, still in the old
    generation, found its 6 live peers silent 2.3-3.2 s after the new generation was
    published (they had left the old group: some said their group broke, the others left at
    their next report as asked), and the operator replaced all 7 pods. Such reports count
    for nothing; one whose silence began before the publication, of a pod that never said
    its group broke, still counts (a node that vanished just as the generation came out)."""
    view, status, up = _shrunk_to_three()
    old = status.get("silentWorkers", [])
    moved = _silent_body(
        ("tj-worker-1", 0, "tj-worker-1", 0.0, 11.0, "broken"),  # its group broke; alive
        ("tj-worker-0", 0, "tj-worker-2", 2.3, 14.5, None),  # silent from 12.2 s: after 12
        ("tj-worker-1", 0, "tj-worker-2", 3.2, 14.5, None),  # before 12, but said it broke
    )
    decided = plan(with_state(view, {**status, "silentWorkers": [*old, *moved]}), up, at(20))
    st = decided.status
    assert (st["currentGeneration"], st["replicas"]) == (1, 3), st
    assert not decided.delete
    # The same pod 1, silent from 11.3 s without saying its group broke: lost to its silence.
    died = _silent_body(("tj-worker-1", 0, "tj-worker-2", 3.2, 14.5, None))
    decided = plan(with_state(view, {**status, "silentWorkers": [*old, *died]}), up, at(20))
    assert decided.status["currentGeneration"] == 2
    assert decided.status["history"][-1]["cause"] == "SilentPeer"
    assert decided.delete == ("tj-worker-1",)

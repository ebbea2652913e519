"""Table-driven tests of the pure planner, plus hypothesis invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.builders import at, failed, job, pod, preempted, running, succeeded

from torchjob.api.models import Phase
from torchjob.rules import RestartRules, Verdict, backoff_seconds, decide_failure
from torchjob_operator.torchjob.observed import PodView
from torchjob_operator.torchjob.plan import JobView, Plan, plan, with_state


def apply(p: Plan, pods: list[PodView]) -> list[PodView]:
    """What the cluster looks like once a plan is carried out (deleted pods vanish at once)."""
    left = [x for x in pods if x.name not in p.delete]
    gen = p.status["currentGeneration"]
    left = [replace(x, generation=gen) if x.name in p.relabel else x for x in left]
    if p.create:
        left += [
            replace(pod(i, p.create.generation), joiner=p.create.joiners) for i in p.create.indices
        ]
    return left


def step(view: JobView, pods: list[PodView], now_s: float) -> tuple[Plan, JobView, list[PodView]]:
    decided = plan(view, pods, at(now_s))
    return decided, with_state(view, decided.status), apply(decided, pods)


def test_first_reconcile_creates_all_workers_of_generation_zero() -> None:
    decided = plan(job().replicas(4).build(), [], at(0))
    assert decided.create is not None
    assert decided.create.indices == (0, 1, 2, 3)
    assert decided.create.generation == 0
    assert decided.phase == Phase.PENDING
    assert decided.status["createdGeneration"] == 0
    assert decided.status["startTime"] == "2026-01-01T00:00:00Z"


def test_repeated_plan_creates_nothing_new() -> None:
    _decided, view, pods = step(job().replicas(2).build(), [], 0)
    again = plan(view, pods, at(1))
    assert again.create is None
    assert again.delete == ()


def test_all_running_is_running_and_ready() -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    decided = plan(view, [running(p) for p in pods], at(5))
    assert decided.phase == Phase.RUNNING
    ready = next(c for c in decided.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert decided.status["workers"] == "2/2"


def test_all_workers_exit_zero_succeeds_and_keeps_finished_pods() -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    decided = plan(view, [succeeded(p) for p in pods], at(9))
    assert decided.phase == Phase.SUCCEEDED
    assert decided.delete == ()  # cleanPodPolicy Running keeps finished pods for logs
    assert decided.status["completionTime"] == "2026-01-01T00:00:09Z"


def test_one_success_is_not_the_job_succeeding() -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    decided = plan(view, [succeeded(pods[0]), running(pods[1])], at(9))
    assert decided.phase == Phase.RUNNING


@pytest.mark.parametrize(
    ("code", "policy", "expected_phase", "restarts"),
    [
        pytest.param(1, {}, Phase.RESTARTING, 1, id="retryable-default"),
        pytest.param(3, {"permanentExitCodes": [3]}, Phase.FAILED, 0, id="permanent-listed"),
        pytest.param(3, {"retryableExitCodes": [137]}, Phase.FAILED, 0, id="not-in-retryable-list"),
        pytest.param(2, {"retryableExitCodes": [2]}, Phase.RESTARTING, 1, id="in-retryable-list"),
    ],
)
def test_failure_exit_code_classes(
    code: int, policy: dict, expected_phase: Phase, restarts: int
) -> None:
    _, view, pods = step(job().replicas(2).max_restarts(3, **policy).build(), [], 0)
    decided = plan(view, [failed(pods[0], code), running(pods[1])], at(5))
    assert decided.phase == expected_phase
    assert decided.status["restarts"] == restarts
    assert decided.status["lastFailure"]["exitCode"] == code
    assert decided.status["lastFailure"]["pod"] == "tj-worker-0"


def test_failure_restarts_whole_group_after_backoff() -> None:
    _, view, pods = step(job().replicas(2).max_restarts(2).build(), [], 0)
    decided, view, pods = step(view, [failed(pods[0], 1), running(pods[1])], 5)
    assert decided.phase == Phase.RESTARTING
    assert set(decided.delete) == {"tj-worker-0", "tj-worker-1"}
    assert decided.create is None
    assert decided.status["currentGeneration"] == 1
    assert decided.requeue_after_s == pytest.approx(10)  # backoff.initialSeconds
    # Before the backoff expires nothing is created...
    early = plan(view, pods, at(10))
    assert early.create is None
    # ...and the Restarting condition counts down, pass after pass, while Ready's message
    # (which the next pass starts from) never carries the countdown.

    def said(decision: Plan, type_: str) -> str:
        return str(next(c["message"] for c in decision.status["conditions"] if c["type"] == type_))

    first = said(early, "Restarting")
    assert first.endswith("; restarting in 5s"), first
    again = plan(with_state(view, early.status), pods, at(12))
    assert said(again, "Restarting") == first.replace("in 5s", "in 3s")
    assert "restarting in" not in said(again, "Ready"), said(again, "Ready")
    # ...after it, the new generation appears.
    late, view, pods = step(view, pods, 16)
    assert late.create is not None and late.create.generation == 1
    assert {p.generation for p in pods} == {1}


def test_the_service_is_ensured_with_the_pods_not_on_every_reconcile() -> None:
    _, view, pods = step(job().replicas(3).build(), [], 0)
    assert plan(view, [], at(0)).ensure_service  # before the first pods
    assert not plan(view, [running(p) for p in pods], at(2)).ensure_service


def test_the_status_never_counts_pods_the_plan_deletes() -> None:
    _, view, pods = step(job().replicas(3).max_restarts(2).build(), [], 0)
    up = [running(p) for p in pods]
    assert plan(view, up, at(2)).status["readyWorkers"] == 3
    decided = plan(view, [failed(pods[0], 1), *up[1:]], at(5))
    assert set(decided.delete) == {"tj-worker-1", "tj-worker-2"} | {"tj-worker-0"}
    # Written before the deletes: it must not claim the two running pods that are going.
    assert decided.status["readyWorkers"] == 0
    assert decided.status["workers"] == "0/3"


def blames_peer(p: PodView, summary: str = "rank 0 raised DistBackendError: closed") -> PodView:
    return replace(p, summary=summary, peer_failure=True)


def test_root_cause_pod_is_blamed_not_the_peer_whose_connection_broke() -> None:
    _, view, pods = step(job().replicas(3).max_restarts(2).build(), [], 0)
    own = replace(failed(pods[2], 1, at_s=6), summary="rank 2 raised ValueError: bad batch")
    # The peer exited a second earlier by the pod clock: the clock alone would blame it.
    decided = plan(view, [blames_peer(failed(pods[0], 1, at_s=5)), running(pods[1]), own], at(7))
    assert decided.phase == Phase.RESTARTING
    assert decided.status["lastFailure"]["pod"] == "tj-worker-2"
    assert decided.status["lastFailure"]["message"] == "rank 2 raised ValueError: bad batch"
    failed_event = next(e for e in decided.events if e.reason == "WorkerFailed")
    assert (
        "tj-worker-2 exited with code 1 (Error): rank 2 raised ValueError" in failed_event.message
    )


def test_only_peer_failures_wait_for_the_root_cause_then_blame_the_peer() -> None:
    _, view, pods = step(job().replicas(2).max_restarts(2).build(), [], 0)
    peer = blames_peer(failed(pods[0], 1, at_s=5))
    waiting = plan(view, [peer, running(pods[1])], at(7))
    assert waiting.phase not in (Phase.RESTARTING, Phase.FAILED), "no verdict while waiting"
    assert waiting.status["restarts"] == 0 and not waiting.delete
    assert waiting.requeue_after_s == pytest.approx(8)  # 5 + ROOT_CAUSE_GRACE(10) - 7
    # The grace runs out and nothing else failed: the peer is blamed after all.
    late = plan(view, [peer, running(pods[1])], at(15.5))
    assert late.phase == Phase.RESTARTING and late.status["restarts"] == 1
    assert late.status["lastFailure"]["pod"] == "tj-worker-0"
    # With no pod left running nothing can explain it better: decided at once.
    done = plan(view, [peer, blames_peer(failed(pods[1], 1, at_s=5))], at(6))
    assert done.phase == Phase.RESTARTING


@pytest.mark.parametrize(
    ("waiting", "reason"),
    [
        ("ImagePullBackOff", "ImagePullFailed"),
        ("ErrImagePull", "ImagePullFailed"),
        ("CreateContainerConfigError", "ContainerCannotStart"),
    ],
)
def test_a_worker_that_cannot_start_is_reported_with_one_warning(waiting: str, reason: str) -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    stuck = replace(
        pods[1], scheduled=True, waiting=waiting, waiting_message='secret "creds" not found'
    )
    decided, view, _ = step(view, [running(pods[0]), stuck], 5)
    assert decided.phase == Phase.STARTING
    ready = next(c for c in decided.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", reason)
    assert ready["message"] == (
        f'1 of 2 workers cannot start (e.g. tj-worker-1: {waiting}: secret "creds" not found)'
    )
    assert [(e.type, e.reason) for e in decided.events] == [("Warning", reason)]
    again = plan(view, [running(pods[0]), stuck], at(30))
    assert not again.events, "one Warning, not one per reconcile"
    assert not again.delete and again.create is None, "the job waits (deadline bounds it)"


def test_keep_survivors_replaces_only_the_failed_pod() -> None:
    _, view, pods = step(job().replicas(3).max_restarts(2).keep_survivors().build(), [], 0)
    pods = [running(p) for p in pods]
    decided, view, pods = step(view, [pods[0], failed(pods[1], 1, at_s=5), pods[2]], 5)
    assert decided.phase == Phase.RESTARTING and decided.status["restarts"] == 1
    assert decided.delete == ("tj-worker-1",), "the survivors stay"
    assert set(decided.relabel) == {"tj-worker-0", "tj-worker-2"}
    assert decided.status["currentGeneration"] == 1
    assert "KeptSurvivors" in {e.reason for e in decided.events}
    late, view, pods = step(view, pods, 20)  # after the backoff
    assert late.create is not None and late.create.indices == (1,)
    assert late.create.generation == 1 and not late.delete and not late.relabel
    assert sorted((p.index, p.generation) for p in pods) == [(0, 1), (1, 1), (2, 1)]


@pytest.mark.parametrize("oom", [True, False])
def test_keep_survivors_a_killed_pod_is_replaced_without_backoff(oom: bool) -> None:
    # SIGKILL (exit 137): the survivors hold the last step in memory, so the replacement
    # comes at once; the OOM killer's kill is charged, any other kill is a disruption; an
    # exception (exit 1) keeps its backoff.
    _, view, pods = step(job().replicas(3).max_restarts(2).keep_survivors().build(), [], 0)
    pods = [running(p) for p in pods]
    lost = failed(pods[1], 137, at_s=5)
    lost = replace(lost, reason="OOMKilled") if oom else lost
    decided, view, pods = step(view, [pods[0], lost, pods[2]], 5)
    assert decided.phase == Phase.RESTARTING
    st = decided.status
    assert (st["restarts"], st["disruptions"]) == ((1, 0) if oom else (0, 1))
    warning = next(e.message for e in decided.events if e.type == "Warning")
    assert ("survivors' memory" in warning) is oom
    at_once, _, _ = step(view, pods, 6)
    assert at_once.create is not None and at_once.create.indices == (1,)


def test_keep_survivors_after_a_preemption_and_not_unplaced_pods() -> None:
    _, view, pods = step(job().replicas(3).keep_survivors().build(), [], 0)
    placed = [running(pods[0]), preempted(pods[1]), replace(pods[2], scheduled=False)]
    decided, view, pods = step(view, placed, 5)
    assert decided.status["disruptions"] == 1 and decided.status["restarts"] == 0
    # The pending, never-placed pod holds nothing worth keeping: it is recreated too.
    assert set(decided.delete) == {"tj-worker-1", "tj-worker-2"}
    assert decided.relabel == ("tj-worker-0",)
    again, _, _ = step(view, pods, 6)
    assert again.create is not None and again.create.indices == (1, 2)


def test_recreate_group_is_the_default() -> None:
    _, view, pods = step(job().replicas(2).max_restarts(2).build(), [], 0)
    decided = plan(view, [running(pods[0]), failed(pods[1])], at(5))
    assert set(decided.delete) == {"tj-worker-0", "tj-worker-1"} and not decided.relabel


def test_restart_budget_exhausted_fails() -> None:
    view = job().replicas(1).max_restarts(1).build()
    _, view, pods = step(view, [], 0)
    _, view, pods = step(view, [failed(pods[0])], 1)
    _, view, pods = step(view, pods, 100)
    final = plan(view, [failed(p) for p in pods], at(200))
    assert final.phase == Phase.FAILED
    assert final.status["restarts"] == 1
    assert any(c["type"] == "Stalled" and c["status"] == "True" for c in final.status["conditions"])
    assert "RestartLimitExceeded" in {e.reason for e in final.events}


def test_preemption_is_a_disruption_and_never_charged() -> None:
    _, view, pods = step(job().replicas(3).max_restarts(0).build(), [], 0)
    # The peer's crash is seen too: the generation as a whole counts as disrupted.
    observed = [preempted(pods[0]), failed(pods[1], 1), running(pods[2])]
    decided = plan(view, observed, at(5))
    assert decided.phase == Phase.RESTARTING
    assert decided.status["restarts"] == 0
    assert decided.status["disruptions"] == 1
    assert decided.requeue_after_s is None or decided.requeue_after_s > 0
    assert decided.status["restartAfter"] is None


def test_pod_deleted_by_someone_else_is_a_disruption() -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    decided = plan(view, [running(pods[1])], at(5))
    assert decided.status["disruptions"] == 1
    assert decided.status["restarts"] == 0
    assert decided.status["currentGeneration"] == 1


def test_suspend_deletes_pods_and_resume_starts_new_generation() -> None:
    builder = job().replicas(2)
    _, view, pods = step(builder.build(), [], 0)
    suspended_view = replace(view, spec=builder.run_policy(suspend=True).build().spec)
    decided, view, pods = step(suspended_view, [running(p) for p in pods], 5)
    assert decided.phase == Phase.SUSPENDED
    assert set(decided.delete) == {"tj-worker-0", "tj-worker-1"}
    # kstatus: Ready=True is Current, as for a suspended batch/v1 Job (issue 17).
    ready = next(c for c in decided.status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Suspended")
    resumed_view = replace(view, spec=builder.run_policy(suspend=False).build().spec)
    decided = plan(resumed_view, pods, at(10))
    assert decided.create is not None and decided.create.generation == 1
    assert decided.status["startTime"] == "2026-01-01T00:00:10Z"


def test_deadline_fails_job_and_deletes_running_pods() -> None:
    _, view, pods = step(job().replicas(2).run_policy(activeDeadlineSeconds=30).build(), [], 0)
    mid = plan(view, [running(p) for p in pods], at(10))
    assert mid.requeue_after_s == pytest.approx(20)
    decided = plan(view, [running(p) for p in pods], at(31))
    assert decided.phase == Phase.FAILED
    assert set(decided.delete) == {"tj-worker-0", "tj-worker-1"}
    assert "DeadlineExceeded" in {e.reason for e in decided.events}


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param({"activeDeadlineSeconds": 2**63 - 1}, id="deadline-int64-max"),
        pytest.param({"ttlSecondsAfterFinished": 2**31 - 1}, id="ttl-int32-max"),
    ],
)
def test_never_deadlines_as_kubernetes_accepts_them_plan_without_overflow(policy: dict) -> None:
    # int64/int32 maxima are what Job accepts (a common "never"); no datetime overflow, and
    # the job is looked at again no later than a day from now.
    _, view, pods = step(job().replicas(1).run_policy(**policy).build(), [], 0)
    mid = plan(view, [running(p) for p in pods], at(10))
    assert mid.phase == Phase.RUNNING
    done, view, pods = step(view, [succeeded(p) for p in pods], 20)
    assert done.phase == Phase.SUCCEEDED and not done.delete_job
    for decided in (mid, done):
        assert decided.requeue_after_s is None or decided.requeue_after_s <= 86400


def test_ttl_deletes_finished_job() -> None:
    _, view, pods = step(job().replicas(1).run_policy(ttlSecondsAfterFinished=60).build(), [], 0)
    done, view, pods = step(view, [succeeded(p) for p in pods], 10)
    assert done.requeue_after_s == pytest.approx(60)
    assert not plan(view, pods, at(30)).delete_job
    assert plan(view, pods, at(71)).delete_job


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param("None", set(), id="none"),
        pytest.param("Running", {"tj-worker-1"}, id="running"),
        pytest.param("All", {"tj-worker-0", "tj-worker-1"}, id="all"),
    ],
)
def test_clean_pod_policy(policy: str, expected: set[str]) -> None:
    _, view, pods = step(
        job().replicas(2).max_restarts(0).run_policy(cleanPodPolicy=policy).build(), [], 0
    )
    decided = plan(view, [failed(pods[0], 1), running(pods[1])], at(5))
    assert decided.phase == Phase.FAILED
    assert set(decided.delete) == expected


def test_scale_starts_new_generation_with_new_size() -> None:
    builder = job().replicas(2)
    _, view, pods = step(builder.build(), [], 0)
    view = replace(view, spec=builder.replicas(3).build().spec)
    decided, view, pods = step(view, [running(p) for p in pods], 5)
    assert decided.status["currentGeneration"] == 1
    assert decided.status["restarts"] == 0 and decided.status["disruptions"] == 0
    decided, view, pods = step(view, pods, 6)
    assert decided.create is not None and decided.create.indices == (0, 1, 2)


def test_backoff_is_exponential_and_capped() -> None:
    policy = RestartRules.of(
        job()
        .max_restarts(10, backoff={"initialSeconds": 5, "maxSeconds": 30, "factor": 2})
        .build()
        .spec.failure_policy
    )
    assert [backoff_seconds(n, policy) for n in range(1, 6)] == [5, 10, 20, 30, 30]
    assert decide_failure(1, restarts=10, rules=policy).verdict == Verdict.FAIL_BUDGET_EXHAUSTED


# --- invariants ----------------------------------------------------------------------

POD_FATES = st.sampled_from(["running", "pending", "failed", "preempted", "succeeded", "gone"])


@settings(max_examples=200, deadline=None)
@given(
    replicas=st.integers(1, 6),
    max_restarts=st.integers(0, 3),
    rounds=st.lists(st.lists(POD_FATES, min_size=6, max_size=6), min_size=1, max_size=6),
    keep=st.booleans(),
)
def test_invariants_over_random_histories(
    replicas: int, max_restarts: int, rounds: list[list[str]], keep: bool
) -> None:
    builder = job().replicas(replicas).max_restarts(max_restarts, backoff={"initialSeconds": 0})
    view = (builder.keep_survivors() if keep else builder).build()
    pods: list[PodView] = []
    t = 0.0
    failures_seen = 0
    for fates in rounds:
        decided, view, pods = step(view, pods, t)
        t += 100
        # never more pods than desired, ranks unique and dense
        assert len(pods) <= replicas
        assert len({p.name for p in pods}) == len(pods), "one pod per name"
        live = [p for p in pods if p.generation == view.state.generation]
        indices = sorted(p.index for p in live)
        assert indices == list(range(len(indices)))
        if decided.phase.is_terminal:
            break
        new = []
        round_failed = False
        round_disrupted = False
        for p, fate in zip(pods, fates, strict=False):
            if fate == "running":
                new.append(running(p))
            elif fate == "pending":
                new.append(p)
            elif fate == "failed":
                new.append(failed(p))
                round_failed = True
            elif fate == "preempted":
                new.append(preempted(p))
                round_disrupted = True
            elif fate == "succeeded":
                new.append(succeeded(p))
            else:
                round_disrupted = True
        pods = new
        if round_failed and not round_disrupted:
            failures_seen += 1
        restarts_before = view.state.restarts
        decided, view, pods = step(view, pods, t)
        t += 100
        # disruptions never charged to the failure budget
        if round_disrupted:
            assert view.state.restarts == restarts_before
        assert view.state.restarts <= max_restarts
        assert view.state.restarts <= failures_seen
        if decided.phase.is_terminal:
            break


def test_pods_created_by_a_dead_operator_are_adopted() -> None:
    """The operator died after creating pods but before writing the status."""
    view = job().replicas(2).build()
    decided = plan(view, [running(pod(0)), running(pod(1))], at(3))
    assert decided.create is None
    assert decided.status["createdGeneration"] == 0
    assert decided.status["startTime"] == "2026-01-01T00:00:03Z"
    assert decided.phase == Phase.RUNNING


# --- elastic fit-to-capacity ----------------------------------------------------------


def unschedulable(p: PodView, since_s: float) -> PodView:
    return replace(p, unschedulable_since=at(since_s), scheduled=False)


def elastic_job(*, lo: int = 2, hi: int = 4, replicas: int = 4) -> JobView:
    b = job().replicas(replicas).elastic(lo, hi)
    b.spec["elastic"].update(scaleDownAfterSeconds=30, scaleUpCooldownSeconds=60)
    return b.build()


def test_elastic_shrinks_to_what_fits_after_the_grace() -> None:
    _, view, pods = step(elastic_job(), [], 0)
    observed = [
        running(pods[0]),
        running(pods[1]),
        unschedulable(pods[2], 1),
        unschedulable(pods[3], 1),
    ]
    early = plan(view, observed, at(20))
    assert early.status["currentGeneration"] == 0 and early.requeue_after_s == pytest.approx(11)
    decided, view, pods = step(view, observed, 31)
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 2
    assert (decided.status["restarts"], decided.status["disruptions"]) == (0, 0)
    assert "ScaledDown" in {e.reason for e in decided.events}
    assert set(decided.delete) == {f"tj-worker-{i}" for i in range(4)}
    again, view, pods = step(view, pods, 32)
    assert again.create is not None and again.create.indices == (0, 1)


def test_elastic_waits_below_min_instead_of_shrinking() -> None:
    _, view, pods = step(elastic_job(lo=3), [], 0)
    observed = [
        running(pods[0]),
        running(pods[1]),
        unschedulable(pods[2], 0),
        unschedulable(pods[3], 0),
    ]
    decided = plan(view, observed, at(100))
    assert decided.status["currentGeneration"] == 0
    assert decided.phase == Phase.PENDING
    assert "WaitingForCapacity" in {e.reason for e in decided.events}


def test_elastic_grows_back_only_when_probes_fit() -> None:
    from torchjob_operator.torchjob.observed import ProbeView

    _, view, pods = step(elastic_job(), [], 0)
    _, view, pods = step(
        view,
        [running(pods[0]), running(pods[1]), unschedulable(pods[2], 0), unschedulable(pods[3], 0)],
        31,
    )
    _, view, pods = step(view, pods, 32)  # generation 1 created with 2 workers
    pods = [running(p) for p in pods]
    cooling = plan(view, pods, at(60))
    assert cooling.create_probes == () and cooling.requeue_after_s == pytest.approx(31)
    probing = plan(view, pods, at(100))
    assert probing.create_probes == (0, 1) and probing.status["currentGeneration"] == 1
    pending = [ProbeView("tj-probe-0", scheduled=True), ProbeView("tj-probe-1", scheduled=False)]
    waiting = plan(view, pods, at(110), probes=pending)
    assert waiting.status["currentGeneration"] == 1 and waiting.delete == ()
    placed = [ProbeView("tj-probe-0", scheduled=True), ProbeView("tj-probe-1", scheduled=True)]
    grown = plan(view, pods, at(120), probes=placed)
    assert grown.status["currentGeneration"] == 2 and grown.status["replicas"] == 4
    assert {"tj-probe-0", "tj-probe-1"} <= set(grown.delete)
    assert "ScaledUp" in {e.reason for e in grown.events}


def test_user_scale_of_an_elastic_job_is_honoured() -> None:
    builder = job().replicas(2).elastic(1, 4)
    _, view, pods = step(builder.build(), [], 0)
    view = replace(view, spec=builder.replicas(3).build().spec)
    decided = plan(view, [running(p) for p in pods], at(5))
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 3


def test_progress_only_is_the_counts_and_the_messages_that_quote_them() -> None:
    from torchjob_operator.torchjob.status import progress_only

    ready = {"type": "Ready", "status": "False", "reason": "WaitingForPods"}
    old = {"phase": "Pending", "workers": "1/4", "readyWorkers": 1, "conditions": [
        {**ready, "message": "1/4 workers ready"}]}  # fmt: skip
    counts = {**old, "workers": "2/4", "readyWorkers": 2, "conditions": [
        {**ready, "message": "2/4 workers ready"}]}  # fmt: skip
    assert progress_only(old, counts)
    assert not progress_only(old, old), "no change is nothing to hold back"
    assert not progress_only(old, {**counts, "phase": "Running"})
    assert not progress_only(old, {**counts, "restarts": 1})
    flipped = {**counts, "conditions": [{**ready, "status": "True", "message": "x"}]}
    assert not progress_only(old, flipped)
    assert not progress_only(old, {**counts, "conditions": []})


# --- a TorchJob deleted and created again under the same name ------------------------------


def test_pods_of_an_earlier_same_named_job_are_waited_for_not_counted() -> None:
    """issue 19: `kubectl delete tj x --wait` then `kubectl apply` of x at once. The new job
    must neither count the old pods (a spurious disruption threw generation 0 away) nor create
    pods of the same names while they are there."""
    earlier = ("tj-worker-0", "tj-worker-1")
    view = replace(job().replicas(2).build(), foreign_pods=earlier)
    decided = plan(view, [], at(0))
    assert decided.create is None
    assert decided.delete == ()  # not ours to delete
    assert (decided.status["currentGeneration"], decided.status["disruptions"]) == (0, 0)
    assert decided.status["restarts"] == 0
    assert decided.status.get("createdGeneration") is None
    assert decided.phase == Phase.PENDING
    ready = next(c for c in decided.status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "WaitingForEarlierJob"
    assert "2 pods (tj-worker-0, ...) of an earlier TorchJob named tj" in ready["message"]
    assert decided.requeue_after_s is not None and decided.requeue_after_s <= 2.0
    # Asked again while they are still there: the same answer, and no repeated Event.
    again = plan(with_state(view, decided.status), [], at(1))
    assert again.create is None and again.events == ()
    # Once they are gone, generation 0 is created as for any new job.
    gone = plan(replace(with_state(view, decided.status), foreign_pods=()), [], at(2))
    assert gone.create is not None and gone.create.generation == 0
    assert gone.create.indices == (0, 1)
    assert (gone.status["currentGeneration"], gone.status["disruptions"]) == (0, 0)


# --- issue 16: act on an eviction while the evicted pod still checkpoints -----------------------


def evicted(p: PodView) -> PodView:
    """A running pod the Eviction API took: DisruptionTarget set, terminating (its grace period)."""
    return replace(running(p), disruption="EvictionByEvictionAPI", deleting=True)


def elastic_keep(replicas: int = 2, lo: int = 1) -> JobView:
    builder = job().replicas(replicas).elastic(lo, replicas).keep_survivors()
    builder.spec["elastic"]["shrinkOnDisruption"] = True
    return builder.build()


def test_elastic_goes_on_smaller_at_once_and_grows_back_when_the_replacement_runs() -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    # The evicted pod is still there (checkpointing in its grace period): decided anyway.
    terminating = [up[0], evicted(up[1])]
    decided, view, _ = step(view, terminating, 5)
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 1
    assert (decided.status["restarts"], decided.status["disruptions"]) == (0, 1)
    assert decided.relabel == ("tj-worker-0",) and decided.create is None
    assert decided.delete == (), "the evicted pod is already going; the survivor stays"
    assert "ShrunkAfterDisruption" in {e.reason for e in decided.events}
    assert decided.status["worldSize"] == 1
    survivor = replace(up[0], generation=1)
    # The evicted pod holds its name for its grace period: the replacement is created at once
    # under the lowest free index, for the *next* generation, ranked after the survivor.
    joining, view, pods = step(view, [survivor, evicted(up[1])], 6)
    assert joining.phase == Phase.RUNNING
    assert joining.create is not None
    assert (
        joining.create.indices,
        joining.create.generation,
        joining.create.replicas,
        joining.create.members,
    ) == ((2,), 2, 2, (0, 2))
    pods = [p for p in pods if p.name != "tj-worker-1"]  # the evicted pod is gone
    assert joining.create.joiners, "created ahead: their pods get the joiner's readiness probe"
    assert joining.status["currentGeneration"] == 1, "the job goes on at 1 meanwhile"
    assert "CreatedJoiner" in {e.reason for e in joining.events}
    # Pending joiner: kept (not stale), not a member, nothing else happens.
    pending = plan(view, pods, at(10))
    assert pending.delete == () and pending.create is None
    assert pending.status["currentGeneration"] == 1
    # Running but not ready (its runtime does not wait to join yet): no grow.
    started = plan(view, [running(pods[0]), replace(running(pods[1]), ready=False)], at(11))
    assert started.status["currentGeneration"] == 1
    # Ready: generation 2 at the full size, the survivor relabelled, nothing recreated.
    grown, view, pods = step(view, [running(p) for p in pods], 12)
    assert grown.status["currentGeneration"] == 2 and grown.status["replicas"] == 2
    assert grown.relabel == ("tj-worker-0",) and grown.create is None and grown.delete == ()
    assert "ScaledUp" in {e.reason for e in grown.events}
    assert (grown.status["restarts"], grown.status["disruptions"]) == (0, 1)
    settled = plan(view, [running(p) for p in pods], at(13))
    assert settled.phase == Phase.RUNNING and settled.status["currentGeneration"] == 2
    assert settled.create is None and settled.delete == () and settled.relabel == ()


def test_a_forced_deletion_shrinks_and_creates_the_joiner_on_the_next_pass() -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    decided, view, pods = step(view, [up[0]], 5)  # worker 1 vanished (grace 0, --force)
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 1
    nxt = plan(view, pods, at(5.5))
    assert nxt.create is not None and nxt.create.indices == (1,) and nxt.create.generation == 2


@pytest.mark.parametrize(
    ("replicas", "lo", "lost", "keep"),
    [
        pytest.param(3, 2, (1, 2), True, id="below-min"),
        pytest.param(2, 1, (1,), False, id="recreate-group"),
        pytest.param(2, 1, (1,), None, id="not-asked-for"),
    ],
)
def test_a_disruption_replaces_at_full_size_when_survivors_cannot_go_on(
    replicas: int, lo: int, lost: tuple[int, ...], keep: bool | None
) -> None:
    """``keep`` None: KeepSurvivors without ``shrinkOnDisruption`` (the default)."""
    builder = job().replicas(replicas).elastic(lo, replicas)
    builder.spec["elastic"]["shrinkOnDisruption"] = keep is not None
    keep = keep is None or keep
    view = (builder.keep_survivors() if keep else builder).build()
    _, view, pods = step(view, [], 0)
    observed = [evicted(p) if p.index in lost else running(p) for p in pods]
    decided = plan(view, observed, at(5))
    assert decided.status["currentGeneration"] == 1
    assert decided.status["replicas"] == replicas
    assert "WorkerDisrupted" in {e.reason for e in decided.events}
    assert decided.create is None, "the lost pods' names are still taken"


def test_losing_pod_0_goes_on_with_a_survivor_as_rank_0_and_the_replacement_joins_last() -> None:
    """Any survivor can lead (status.members): pod 0's loss costs what any pod's loss costs."""
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    assert "members" not in {k for k, v in plan(view, up, at(1)).status.items() if v is not None}
    decided, view, _ = step(view, [evicted(up[0]), up[1]], 5)
    assert decided.status["currentGeneration"] == 1 and decided.status["replicas"] == 1
    assert decided.status["members"] == [1], "pod 1 is rank 0 of generation 1"
    assert decided.relabel == ("tj-worker-1",) and decided.create is None
    assert decided.status["replacedWorkers"] == ["tj-worker-0"]
    assert "ShrunkAfterDisruption" in {e.reason for e in decided.events}
    survivor = replace(up[1], generation=1)
    # The name is free: worker-0 is created as the joiner of generation 2, ranked after pod 1.
    joining, view, pods = step(view, [survivor], 9)
    assert joining.create is not None and joining.create.indices == (0,)
    assert (joining.create.generation, joining.create.members) == (2, (1, 0))
    assert joining.status["members"] == [1]
    grown, view, pods = step(view, [running(p) for p in pods], 12)
    assert grown.status["currentGeneration"] == 2 and grown.status["members"] == [1, 0]
    assert grown.relabel == ("tj-worker-1",) and grown.create is None and grown.delete == ()
    # Losing the new rank 0 (pod 1) goes on with pod 0 alone.
    by_index = {p.index: running(p) for p in pods}
    again = plan(view, [by_index[0], evicted(by_index[1])], at(20))
    assert again.status["currentGeneration"] == 3 and again.status["members"] is None
    assert again.status["replicas"] == 1 and again.status["replacedWorkers"] == ["tj-worker-1"]


def test_a_member_that_finished_training_is_not_replaced_while_rank_0_finishes() -> None:
    """The last step done, rank 1 exits 0 a moment before rank 0: its place is not free for
    a joiner (an e2e run created one, which the job's success then deleted unstarted)."""
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    ending = plan(view, [up[0], succeeded(up[1])], at(30))
    assert ending.create is None, ending.create
    assert "CreatedJoiner" not in {e.reason for e in ending.events}
    assert ending.status["currentGeneration"] == 0
    done = plan(view, [succeeded(up[0]), succeeded(up[1])], at(31))
    assert done.phase == Phase.SUCCEEDED


def test_keep_survivors_replaces_pod_0_at_full_size_behind_the_survivors() -> None:
    _, view, pods = step(job().replicas(3).keep_survivors().build(), [], 0)
    up = [running(p) for p in pods]
    decided, view, _ = step(view, [evicted(up[0]), up[1], up[2]], 5)
    assert decided.status["members"] == [1, 2, 0] and decided.status["replicas"] == 3
    gone, view, _ = step(view, [replace(p, generation=1) for p in up[1:]], 7)
    assert gone.create is not None and gone.create.indices == (0,)
    assert gone.create.members == (1, 2, 0)


def test_recreate_group_never_reorders_ranks() -> None:
    _, view, pods = step(job().replicas(2).build(), [], 0)
    up = [running(p) for p in pods]
    decided = plan(view, [evicted(up[0]), up[1]], at(5))
    assert decided.status["currentGeneration"] == 1 and decided.status["members"] is None


def standby_job(replicas: int = 2, standby: int = 1) -> JobView:
    builder = job().replicas(replicas).elastic(replicas, replicas).keep_survivors()
    builder.spec["elastic"]["standbyReplicas"] = standby
    return builder.build()


def with_ready_standby() -> tuple[JobView, list[PodView]]:
    """Generation 0 of 2 workers runs, and standby pod 2 waits to join (ready)."""
    created, view, pods = step(standby_job(), [], 0)
    assert created.create is not None and created.create.indices == (0, 1)
    up = [running(p) for p in pods]
    standby, view, pods = step(view, up, 2)
    assert standby.create is not None and standby.create.indices == (2,)
    assert standby.create.joiners, "a standby gets the joiner's label and readiness probe"
    assert standby.status["currentGeneration"] == 0 and standby.status["standbyWorkers"] == 0
    assert "CreatedJoiner" in {e.reason for e in standby.events}
    pods = [running(p) for p in pods]
    settled, view, _ = step(view, pods, 3)
    assert settled.create is None and settled.delete == ()
    assert settled.status["standbyWorkers"] == 1 and settled.status["workers"] == "2/2"
    return view, pods


def test_a_ready_standby_takes_an_evicted_pods_place_at_once() -> None:
    view, pods = with_ready_standby()
    by = {p.index: p for p in pods}
    decided, view, _ = step(view, [evicted(by[0]), by[1], by[2]], 5)
    assert decided.status["currentGeneration"] == 1 and decided.status["members"] == [1, 2]
    assert (decided.status["restarts"], decided.status["disruptions"]) == (0, 1)
    assert decided.create is None, "nothing to start: the standby is already running"
    assert decided.status["restartAfter"] is None
    assert decided.relabel == ("tj-worker-1",), "the standby was labelled for generation 1"
    assert decided.status["replacedWorkers"] == ["tj-worker-0"]
    assert "StandbyTookOver" in {e.reason for e in decided.events}
    # Once the evicted pod is gone, its index comes back as the new standby.
    kept = [replace(by[1], generation=1), replace(by[2], generation=1)]
    again, view, pods = step(view, kept, 7)
    assert again.create is not None and again.create.indices == (0,) and again.create.joiners
    assert again.status["currentGeneration"] == 1 and again.status["standbyWorkers"] == 0


@pytest.mark.parametrize("oom", [True, False])
def test_a_hard_loss_the_standby_takes_over_without_backoff(oom: bool) -> None:
    view, pods = with_ready_standby()
    by = {p.index: p for p in pods}
    lost = failed(by[1], 137, at_s=4)
    lost = replace(lost, reason="OOMKilled") if oom else lost
    decided = plan(view, [by[0], lost, by[2]], at(5))
    assert decided.status["currentGeneration"] == 1 and decided.status["members"] == [0, 2]
    counted = (decided.status["restarts"], decided.status["disruptions"])
    assert counted == ((1, 0) if oom else (0, 1)), "an OOM kill is charged, a kill is not"
    assert decided.status["restartAfter"] is None and decided.create is None
    assert decided.delete == ("tj-worker-1",)


def test_without_a_ready_standby_the_job_is_replaced_at_full_size() -> None:
    _, view, pods = step(standby_job(), [], 0)
    up = [running(p) for p in pods]
    _, view, pods = step(view, up, 2)
    starting = [p if p.index != 2 else replace(p, ready=False) for p in (running(p) for p in pods)]
    by = {p.index: p for p in starting}
    decided = plan(view, [evicted(by[0]), by[1], by[2]], at(5))
    # The standby still starting takes the place (it is up sooner than a pod started now,
    # after the evicted one is gone); the generation waits for it, not for a new pod.
    assert decided.status["currentGeneration"] == 1 and decided.status["members"] == [1, 2]
    assert "WorkerDisrupted" in {e.reason for e in decided.events}
    assert decided.create is None and "tj-worker-2" not in decided.delete


def test_standby_replicas_need_keep_survivors() -> None:
    from pydantic import ValidationError

    builder = job().replicas(2).elastic(2, 2)
    builder.spec["elastic"]["standbyReplicas"] = 1
    with pytest.raises(ValidationError, match=r"standbyReplicas needs spec\.membershipPolicy"):
        builder.build()


def test_a_failed_joiner_is_replaced_not_waited_for() -> None:
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    _, view, _ = step(view, [up[0], evicted(up[1])], 5)
    survivor = replace(up[0], generation=1)
    _, view, pods = step(view, [survivor], 6)
    joiner = next(p for p in pods if p.index == 1)
    broken = plan(view, [survivor, failed(joiner, 1)], at(8))
    assert broken.delete == ("tj-worker-1",) and broken.status["currentGeneration"] == 1
    again = plan(view, [survivor], at(9))
    assert again.create is not None and again.create.indices == (1,)


def test_keep_survivors_publishes_the_generation_before_the_evicted_pod_is_gone() -> None:
    _, view, pods = step(job().replicas(2).keep_survivors().build(), [], 0)
    up = [running(p) for p in pods]
    decided, view, _ = step(view, [up[0], evicted(up[1])], 5)
    assert decided.status["currentGeneration"] == 1 and decided.relabel == ("tj-worker-0",)
    assert decided.create is None
    # Published in the same write: the evicted pod, still checkpointing, is not a member of
    # generation 1 (its runtime stops rather than join in its successor's place).
    assert decided.status["replacedWorkers"] == ["tj-worker-1"]
    survivor = replace(up[0], generation=1)
    gone = plan(view, [survivor], at(7))
    assert gone.create is not None and gone.create.indices == (1,)
    assert gone.create.generation == 1
    assert gone.status["replacedWorkers"] is None  # gone: nothing left to exclude


def test_a_joiner_stranded_by_the_end_of_training_does_not_hold_the_job() -> None:
    """The grow to a joiner was published as the survivor finished training: the survivor
    exits 0, the joiner waits for a group that cannot form. Ten seconds later the job has
    succeeded and the joiner is deleted; before that the other member may still finish."""
    _, view, pods = step(elastic_keep(), [], 0)
    up = [running(p) for p in pods]
    _, view, _ = step(view, [evicted(up[0]), up[1]], 5)
    survivor = replace(up[1], generation=1)
    _, view, pods = step(view, [survivor], 9)
    grown, view, pods = step(view, [running(p) for p in pods], 12)
    assert grown.status["currentGeneration"] == 2 and grown.status["members"] == [1, 0]
    by = {p.index: running(p) for p in pods}
    ended = [by[0], succeeded(replace(by[1], finished_at=at(13)))]
    waiting = plan(view, ended, at(15))
    assert waiting.phase == Phase.RUNNING and waiting.delete == ()
    assert waiting.requeue_after_s is not None and waiting.requeue_after_s <= 8
    done = plan(view, ended, at(24))
    assert done.phase == Phase.SUCCEEDED and "tj-worker-0" in done.delete
    # RecreateGroup keeps waiting for every worker (each pod trains to the end itself).
    _, rview, rpods = step(job().replicas(2).build(), [], 0)
    rby = {p.index: running(p) for p in rpods}
    mixed = [rby[0], succeeded(replace(rby[1], finished_at=at(1)))]
    assert plan(rview, mixed, at(60)).phase != Phase.SUCCEEDED

"""TorchTrainer's controller: every transition out of a generation, per mode, without processes.

The runtime tests (tests/runtime) prove the same behaviour with real worker groups; these
make each branch of the state machine cheap to read and to test.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from tests.unit.builders import pod_env as pod

from torchjob.contract import KEEP_SURVIVORS, PodEnv
from torchjob.launch import WorkerDiedError, WorkerGroupError, WorkerGroupStartError
from torchjob.launch.policy import Resize, RunState
from torchjob.train import FailureConfig, RunConfig, ScalingConfig
from torchjob.train._spec import WorkerOutcome
from torchjob.train.controller import Controller
from torchjob.train.modes import SUPERSEDED_AFTER_S, KeepSurvivorsMode, LocalMode, PodMode
from torchjob.train.progress import ProgressView
from torchjob.train.ready import JoinerReady
from torchjob.train.recovery.membership import GenerationTimeout, Membership
from torchjob.train.steps import (
    Completed,
    Crashed,
    Errored,
    Finished,
    Following,
    Interrupted,
    Reforming,
    Resizing,
    Restarting,
    Stopped,
)
from torchjob.train.trainer import TorchTrainer


def trainer(
    tmp_path: Path, *, workers: int = 2, min_workers: int | None = None, failures: int = 1
) -> TorchTrainer:
    return TorchTrainer(
        lambda: None,
        scaling_config=ScalingConfig(
            num_workers=workers if min_workers is None else (min_workers, workers)
        ),
        run_config=RunConfig(
            storage_path=str(tmp_path),
            name="run",
            failure_config=FailureConfig(max_failures=failures),
        ),
    )


STATE = RunState(num_workers=2)
RAISED = WorkerGroupError(1, "ValueError", "bad batch")
KILLED = WorkerDiedError(1, -signal.SIGKILL)
CORRUPT = WorkerGroupError(0, "CheckpointError", "checkpoint_000003 is corrupt")


def stopped(at: int = 4) -> Interrupted:
    return Interrupted([WorkerOutcome(rank=0, stopped=True, reports=at, stopped_at_report=at)])


def test_local_failure_restarts_until_the_budget_is_spent(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, failures=1), None)
    assert isinstance(c.mode, LocalMode)
    step = c._next(STATE, Crashed(RAISED))
    assert isinstance(step, Restarting) and step.decision.charged
    spent = RunState(num_workers=2, generation=1, failures=1)
    step = c._next(spent, Crashed(RAISED))
    assert (
        isinstance(step, Errored) and "gave up" in step.message and "max_failures=1" in step.message
    )


def test_local_elastic_loss_shrinks_uncharged(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, workers=3, min_workers=1), None)
    step = c._next(RunState(num_workers=3), Crashed(KILLED))
    assert isinstance(step, Restarting)
    assert (step.decision.num_workers, step.decision.charged) == (2, False)


def test_a_corrupt_checkpoint_is_never_retried(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, failures=5), None)
    step = c._next(STATE, Crashed(CORRUPT))
    assert isinstance(step, Errored) and step.err is CORRUPT


def test_sigterm_turns_an_interrupt_into_a_stop_and_a_crash_into_an_error(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, failures=5), None)
    c.stop_requested.set()
    assert c._next(STATE, stopped(7)) == Stopped(7)
    assert isinstance(c._next(STATE, Crashed(RAISED)), Errored)


def test_a_pod_told_to_stop_while_its_peers_never_came_stops_cleanly(tmp_path: Path) -> None:
    """2026-12-02i, gp-worker-8: left out of a generation while its group formed, and
    deleted meanwhile, a pod ended with TrainingFailedError and a traceback. Its own workers
    were fine; only its peers (never came, or broke the group) did anything wrong."""
    c = survivor(tmp_path, Membership(0, 2))
    c.stop_requested.set()
    given_up = WorkerGroupStartError("rank(s) [3] were still joining", waiting_for_peers=True)
    assert c._next(STATE, Crashed(given_up)) == Stopped(None)
    peer = WorkerGroupError(0, "DistBackendError", "Connection closed by peer", peer_failure=True)
    assert c._next(STATE, Crashed(peer)) == Stopped(None)
    # Its own workers' failures stay errors, stopping or not.
    assert isinstance(c._next(STATE, Crashed(RAISED)), Errored)
    own = WorkerGroupStartError("rank 1 worker died while joining the process group")
    assert isinstance(c._next(STATE, Crashed(own)), Errored)


def test_local_interrupt_is_a_resize_only_when_one_was_decided(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, workers=3, min_workers=1), None)
    assert c._next(STATE, stopped(2)) == Stopped(2)
    assert isinstance(c.mode, LocalMode)
    c.mode.pending = Resize(num_workers=3, reason="grow back")
    step = c._next(STATE, stopped(2))
    assert isinstance(step, Resizing) and step.resize.num_workers == 3
    assert c.mode.pending is None


def test_completion_finishes_in_every_mode(tmp_path: Path) -> None:
    done = Completed([WorkerOutcome(rank=0, stopped=False, reports=3, stopped_at_report=None)])
    assert isinstance(Controller(trainer(tmp_path), None)._next(STATE, done), Finished)
    assert isinstance(Controller(trainer(tmp_path), pod())._next(STATE, done), Finished)


def test_a_pod_fails_fast_and_stops_with_its_group(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path, failures=5), pod())
    assert isinstance(c.mode, PodMode)
    step = c._next(STATE, Crashed(RAISED))
    assert isinstance(step, Errored) and step.err is RAISED
    assert c._next(STATE, stopped(3)) == Stopped(3)


def test_keep_survivors_without_a_token_fails_fast(tmp_path: Path) -> None:
    c = Controller(trainer(tmp_path), pod(membership=KEEP_SURVIVORS))
    assert isinstance(c.mode, PodMode)  # no ServiceAccount token in this process


class Watch:
    """The job's published membership, as KeepSurvivorsMode reads it."""

    def __init__(self, published: Membership | None, deleting: bool = False) -> None:
        self.published = published
        self.deleting = deleting

    def read(self) -> Membership | None:
        return self.published

    def changed(self, generation: int) -> Membership | None:
        p = self.published
        return p if p is not None and p.generation > generation else None


def survivor(tmp_path: Path, published: Membership | None) -> Controller:
    c = Controller(trainer(tmp_path), pod(membership=KEEP_SURVIVORS))
    c.mode = KeepSurvivorsMode(Watch(published), Membership(generation=0, replicas=2))  # type: ignore[arg-type]
    return c


def test_keep_survivors_follows_a_peer_loss(tmp_path: Path) -> None:
    peer = WorkerGroupError(1, "DistBackendError", "connection reset", peer_failure=True)
    step = survivor(tmp_path, Membership(0, 2))._next(STATE, Crashed(peer))
    assert isinstance(step, Following) and step.err is peer


def test_a_group_broken_with_no_newer_generation_is_told_to_the_operator(
    tmp_path: Path,
) -> None:
    """bench/results/2026-12-03a: every member's group broke at once with no pod lost; each
    waited for a generation no loss would bring. Each now says its group broke (the operator
    publishes the next generation once all have); not for its own failure, nor for a
    generation already superseded."""
    peer = WorkerGroupError(1, "DistBackendError", "Connection closed by peer", peer_failure=True)
    told: list[int] = []
    for published, err in (
        (Membership(0, 2), peer),
        (None, peer),
        (Membership(0, 2), RAISED),  # its own failure: it ends, the operator sees it
        (Membership(1, 2), peer),  # the next generation is out already
    ):
        c = survivor(tmp_path, published)
        assert isinstance(c.mode, KeepSurvivorsMode)
        c.mode.on_broken = told.append
        c._next(STATE, Crashed(err))
    assert told == [0, 0]


def test_a_deleted_job_stops_every_pod_at_one_report_and_a_broken_group_is_a_stop(
    tmp_path: Path,
) -> None:
    """CI 2026-12-03: the job was deleted; pod 1's SIGTERM stopped all ranks at a report
    before pod 0's SIGTERM came, and pod 0, stopped by no request of its own, waited for a
    generation, read the deleted job as Failed and ended in error. Once a pod sees the
    deletion, it stops all ranks at the next report itself, and whatever ends its group
    then (a stop, a peer's loss, the wait for a generation) is a stop, not a failure."""
    peer = WorkerGroupError(1, "DistBackendError", "Connection closed by peer", peer_failure=True)
    c = survivor(tmp_path, Membership(0, 2))
    assert c.mode.interrupt(c, STATE) is None  # not deleted: trains on
    assert isinstance(c._next(STATE, stopped(3)), Following)
    assert isinstance(c._next(STATE, Crashed(peer)), Following)
    for end, step in ((stopped(3), Stopped(3)), (Crashed(peer), Stopped(None))):
        c = survivor(tmp_path, Membership(0, 2))
        assert isinstance(c.mode, KeepSurvivorsMode)
        c.mode.watch.deleting = True  # type: ignore[attr-defined]
        said = c.mode.interrupt(c, STATE)
        assert said is not None and "the TorchJob is being deleted" in said, said
        assert c._next(STATE, end) == step

    class Gone(Watch):
        def wait_beyond(self, generation: int, **_: Any) -> Membership:
            self.deleting = True
            raise GenerationTimeout("the TorchJob is Failed: no generation will follow")

    c = survivor(tmp_path, Membership(0, 2))
    assert isinstance(c.mode, KeepSurvivorsMode)
    c.mode.watch = Gone(Membership(0, 2))  # type: ignore[assignment]
    with ProgressView(enabled=False, total_epochs=None) as view:
        assert c._follow(STATE, "the group broke", peer, view) == Stopped(None)


def test_a_new_generation_asks_the_workers_to_regroup_and_a_deletion_then_to_stop(
    tmp_path: Path,
) -> None:
    """A generation published while the workers train re-forms the group from memory: the
    workers get REGROUP_SIGNAL (their loop writes no stop's checkpoint), once. The job's
    deletion, seen after, is a stop: SIGTERM, so the loop checkpoints. A laptop's resize
    stays a SIGTERM."""
    from torchjob.launch import REGROUP_SIGNAL
    from torchjob.train.generation import GenerationRun
    from torchjob.train.recovery.survivors import RestorePoints

    class Group:
        def __init__(self) -> None:
            self.sent: list[int] = []

        def signal(self, sig: int) -> None:
            self.sent.append(sig)

    c = survivor(tmp_path, Membership(0, 2))
    assert isinstance(c.mode, KeepSurvivorsMode)
    with ProgressView(enabled=False, total_epochs=None) as view:
        run = GenerationRun(c, STATE, view, points=RestorePoints(), generation=0)
        run.group = group = Group()  # type: ignore[assignment]
        run.on_tick()
        assert group.sent == []
        c.mode.watch.published = Membership(1, 2)  # type: ignore[attr-defined]
        run.on_tick()
        run.on_tick()
        assert group.sent == [REGROUP_SIGNAL]
        c.mode.watch.deleting = True  # type: ignore[attr-defined]
        run.on_tick()
        run.on_tick()
        assert group.sent == [REGROUP_SIGNAL, signal.SIGTERM]
    assert not LocalMode.regroups and not PodMode.regroups


def test_keep_survivors_follows_a_new_generation(tmp_path: Path) -> None:
    c = survivor(tmp_path, Membership(1, 2))
    step = c._next(STATE, Crashed(RAISED))
    assert isinstance(step, Following)
    assert c.mode.interrupt(c, STATE) is not None  # the running group is stopped for it
    assert isinstance(c._next(STATE, stopped()), Following)


def test_a_pod_follows_the_first_generation_published_since_its_own(tmp_path: Path) -> None:
    """The peers whose group broke when generation 1 was published form generation 1; a pod
    whose workers left the broken collective later (stuck in it until killed) joins them
    there, even when generation 2 came meanwhile: generation 1 then re-forms in place for it.
    Following the newest left generation 1's formation waiting SUPERSEDED_AFTER_S for this pod
    (bench/results/2026-12-07zd, kills 8 and 9: 13 s without a step)."""
    c = survivor(tmp_path, Membership(1, 2))
    mode = c.mode
    assert isinstance(mode, KeepSurvivorsMode)
    assert mode.interrupt(c, STATE) is not None
    mode.watch.published = Membership(2, 3)  # type: ignore[attr-defined]
    assert mode.interrupt(c, STATE) is not None
    assert mode.next is not None and mode.next.generation == 1
    with ProgressView(enabled=False, total_epochs=None) as view:
        mode.follow(c, "the group broke", view)
    assert mode.membership.generation == 1 and mode.next is None
    # In generation 1, generation 2 is the first one since.
    assert mode.interrupt(c, STATE) is not None
    assert mode.next is not None and mode.next.generation == 2


def test_a_member_stuck_in_the_old_collective_is_killed_sooner_once_asked_to_regroup(
    tmp_path: Path,
) -> None:
    """A rank of another pod found silent while this pod's workers stay in the collective:
    they are killed STUCK_AFTER_SILENT_S after, or STUCK_AFTER_REGROUP_S after where a later
    generation was published meanwhile (the silent ranks left for it; its members wait for
    this pod)."""
    import time

    from torchjob.launch import REGROUP_SIGNAL
    from torchjob.train.generation import (
        STUCK_AFTER_REGROUP_S,
        STUCK_AFTER_SILENT_S,
        GenerationRun,
    )
    from torchjob.train.recovery.survivors import RestorePoints

    class Group:
        def __init__(self) -> None:
            self.sent: list[int] = []
            self.killed = 0

        def signal(self, sig: int) -> None:
            self.sent.append(sig)

        def kill_with_stacks(self) -> None:
            self.killed += 1

    assert STUCK_AFTER_REGROUP_S < STUCK_AFTER_SILENT_S
    between = (STUCK_AFTER_REGROUP_S + STUCK_AFTER_SILENT_S) / 2
    for regroup in (False, True):
        c = survivor(tmp_path, Membership(1 if regroup else 0, 2))
        with ProgressView(enabled=False, total_epochs=None) as view:
            points = RestorePoints()
            run = GenerationRun(c, STATE, view, points=points, generation=0)
            run.group = group = Group()  # type: ignore[assignment]
            run.on_tick()
            assert group.sent == ([REGROUP_SIGNAL] if regroup else [])
            points.remote_silent = (time.monotonic() - between, 3)
            run.on_tick()
            assert group.killed == int(regroup), regroup
            points.remote_silent = (time.monotonic() - STUCK_AFTER_SILENT_S - 0.5, 3)
            run.on_tick()
            assert group.killed == 1, "killed once, past the longer bound at the latest"
            assert run.unstuck is not None and run.unstuck.peer_failure
            assert ("it left for the generation" in run.unstuck.message) == regroup


def test_keep_survivors_reforms_while_a_peer_is_not_up(tmp_path: Path) -> None:
    late = WorkerGroupStartError("rendezvous timed out", waiting_for_peers=True)
    assert isinstance(survivor(tmp_path, Membership(0, 2))._next(STATE, Crashed(late)), Reforming)
    done = Membership(0, 2, phase="Failed")
    assert isinstance(survivor(tmp_path, done)._next(STATE, Crashed(late)), Errored)


def test_a_formation_is_superseded_once_a_later_generation_is_published(
    tmp_path: Path,
) -> None:
    """Issue 39: a generation's member vanished while the group formed (its node gone): the
    others would wait for it up to the collective timeout. Once the operator publishes the
    next generation the formation is given up (once it has waited long enough that it is not
    merely forming), and the pod follows the new generation."""
    assert survivor(tmp_path, Membership(0, 2)).mode.superseded(60.0) is None
    # A pure grow keeps every pod the formation waits for, but a member that read the grow
    # before it reached this formation forms the grow instead (2026-12-02h: 116 s with
    # neither formation complete): given up too, once it is not merely forming.
    grown = survivor(tmp_path, Membership(1, 3))
    assert grown.mode.superseded(SUPERSEDED_AFTER_S - 1) is None
    assert grown.mode.superseded(SUPERSEDED_AFTER_S) == (
        f"generation 1 grew it by pod(s) [2], {SUPERSEDED_AFTER_S:.0f}s into the formation: "
        "a member that read the grow first forms that generation, never this one"
    )
    c = survivor(tmp_path, Membership(1, 2, members=(0, 2)))  # pod 1 lost, pod 2 in its place
    # A formation that may still complete (then stop at its first report, memory kept) goes on.
    assert c.mode.superseded(SUPERSEDED_AFTER_S - 1) is None
    why = c.mode.superseded(SUPERSEDED_AFTER_S)
    assert why == (
        f"generation 1 was published without pod(s) [1], {SUPERSEDED_AFTER_S:.0f}s into the "
        "formation"
    )
    given_up = WorkerGroupStartError(
        f"rank(s) [1] were still joining when {why}", waiting_for_peers=True
    )
    assert isinstance(c._next(STATE, Crashed(given_up)), Following)
    # The later generation names pod 1 lost (its processes were killed, its node vanished):
    # it never comes, and the formation is given up at once (bench/results/2026-12-04f: two
    # kills 1.4 s apart, a formation waited 10 s for the second pod).
    for lost, at_once in (
        (((1, "job-worker-1"),), True),
        ((), False),  # a scale-down or a notice took it out: it may still come
        (((0, "job-worker-1"),), False),  # an earlier pod of that name was lost
    ):
        c = survivor(tmp_path, Membership(1, 2, members=(0, 2), lost=lost))
        assert isinstance(c.mode, KeepSurvivorsMode)
        c.mode.pod_name = "job-worker-0"
        said = c.mode.superseded(0.6)
        expected = "generation 1 names pod(s) [1] of it lost, 1s into the formation"
        assert said == (expected if at_once else None), (lost, said)
    # The same pods by name: a pod's processes were killed and a new pod took its name;
    # it joins the later generation, never this formation (bench/results/2026-11-29f: a
    # formation waited 86 s for such a pod until another loss broke it).
    same = survivor(tmp_path, Membership(1, 2)).mode.superseded(SUPERSEDED_AFTER_S)
    assert same is not None and "same pods by name" in same
    # ... at once where the later generation names the renewed pod's old instance lost.
    c = survivor(
        tmp_path, Membership(1, 2, replaced=("job-worker-1",), lost=((1, "job-worker-1"),))
    )
    assert isinstance(c.mode, KeepSurvivorsMode)
    c.mode.pod_name = "job-worker-0"
    assert (
        c.mode.superseded(0.2) == "generation 1 names pod(s) [1] of it lost, 0s into the formation"
    )
    # A grow that also replaced a member under its name (still present): given up too.
    c = survivor(tmp_path, Membership(1, 3, replaced=("job-worker-1",)))
    assert isinstance(c.mode, KeepSurvivorsMode)
    c.mode.pod_name = "job-worker-0"
    renewed = c.mode.superseded(SUPERSEDED_AFTER_S)
    assert renewed is not None and "replaced: [1]" in renewed
    # A laptop's and a plain pod's formations are never superseded.
    assert Controller(trainer(tmp_path), None).mode.superseded(60.0) is None
    assert Controller(trainer(tmp_path), pod()).mode.superseded(60.0) is None


def test_a_generation_asks_its_mode_while_its_group_forms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller hands the workers' formation a question without arguments (what
    ``await_ready`` asks every half second), wired to the mode and the formation's age."""
    from torchjob.train import modes

    c = survivor(tmp_path, Membership(1, 2, members=(0, 2)))
    asked: list[str | None] = []

    def take(placement: Any, env: Any, pod: Any, abandon: Any = None) -> Any:
        asked.append(abandon())
        raise WorkerGroupStartError(f"given up: {asked[-1]}", waiting_for_peers=True)

    monkeypatch.setattr(c.workers, "take", take)
    with ProgressView(enabled=False, total_epochs=None) as view:
        assert isinstance(c._run_generation(STATE, view), Crashed)
        monkeypatch.setattr(modes, "SUPERSEDED_AFTER_S", 0.0)
        assert isinstance(c._run_generation(STATE, view), Crashed)
    assert asked[0] is None  # a formation in its first seconds is not given up
    assert asked[1] == "generation 1 was published without pod(s) [1], 0s into the formation"


def replaced(tmp_path: Path, published: Membership | None, name: str) -> Controller:
    c = Controller(trainer(tmp_path), pod(membership=KEEP_SURVIVORS))
    c.mode = KeepSurvivorsMode(Watch(published), Membership(0, 2), pod_name=name)  # type: ignore[arg-type]
    return c


def test_an_evicted_pod_stops_rather_than_join_the_generation_that_replaces_it(
    tmp_path: Path,
) -> None:
    """The operator publishes generation 1 while the evicted pod 1 still runs: pod 1 (created
    for generation 0) is listed as replaced, so it stops instead of re-forming, at a report
    or after a broken group; pod 0, kept, follows."""
    g1 = Membership(1, 2, replaced=("job-worker-1",))
    evicted = replaced(tmp_path, g1, "job-worker-1")
    assert isinstance(evicted.mode, KeepSurvivorsMode)
    assert "replaces this pod (job-worker-1)" in (evicted.mode.interrupt(evicted, STATE) or "")
    assert evicted._next(STATE, stopped(4)) == Stopped(4)
    peer = WorkerGroupError(0, "DistBackendError", "connection reset", peer_failure=True)
    assert replaced(tmp_path, g1, "job-worker-1")._next(STATE, Crashed(peer)) == Stopped(None)

    kept = replaced(tmp_path, g1, "job-worker-0")
    assert isinstance(kept.mode, KeepSurvivorsMode)
    assert kept.mode.interrupt(kept, STATE) is not None and kept.mode.leaving is None
    assert isinstance(kept._next(STATE, stopped(4)), Following)


def test_the_pod_that_replaces_a_lost_one_is_a_member_under_the_same_name() -> None:
    g1 = Membership(1, 2, replaced=("job-worker-1",))
    assert g1.excludes("job-worker-1", created_in=0)
    assert not g1.excludes("job-worker-1", created_in=1)  # the successor, created for g1
    assert not g1.excludes("job-worker-0", created_in=0)  # a survivor
    assert (
        Membership.from_status(
            {"currentGeneration": 1, "replicas": 2, "replacedWorkers": ["job-worker-1"]}
        )
        == g1
    )


def test_keep_survivors_ends_on_its_own_failure(tmp_path: Path) -> None:
    step = survivor(tmp_path, Membership(0, 2))._next(STATE, Crashed(RAISED))
    assert isinstance(step, Errored) and step.err is RAISED


def test_a_survivor_leads_the_generation_that_lost_pod_0(tmp_path: Path) -> None:
    """status.members [1]: pod 1 runs rank 0, hosts the rendezvous and owns the storage."""
    c = Controller(
        trainer(tmp_path),
        pod(membership=KEEP_SURVIVORS, rdzv_host="job-worker-0.job.ns.svc"),
    )
    assert c.storage is None and c.job_status is None, "pod 1 does not lead generation 0"
    c.mode = KeepSurvivorsMode(  # type: ignore[assignment]
        Watch(None),  # type: ignore[arg-type]
        Membership.from_status({"currentGeneration": 1, "replicas": 1, "members": [1]})
        or Membership(0, 0),
        pod_name="job-worker-1",
        pod_index=1,
    )
    now = c._pod_now()
    assert now is not None
    assert (now.group_rank, now.world_size, now.rdzv_host) == (0, 1, "job-worker-1.job.ns.svc")
    assert now.to_env()["RANK"] == "0" and now.to_env()["TORCHJOB_POD_INDEX"] == "1"
    assert c.storage is not None, "rank 0's pod reads and lists the checkpoints"


def test_a_pod_left_out_of_a_later_generation_stops(tmp_path: Path) -> None:
    """A joiner created for generation 2 whose generation was overtaken by a shrink to
    members [1] is no member of it: it stops (the operator deletes it) instead of forming a
    group it has no rank in."""
    g2 = Membership.from_status({"currentGeneration": 2, "replicas": 1, "members": [1]})
    c = Controller(trainer(tmp_path), pod(membership=KEEP_SURVIVORS, pod_index=0, generation=2))
    c.mode = KeepSurvivorsMode(Watch(g2), Membership(2, 2), pod_name="job-worker-0", pod_index=0)  # type: ignore[arg-type]
    assert isinstance(c.mode, KeepSurvivorsMode)
    c.mode.joined = True  # it was a member (a joiner or standby that never was just waits)
    assert c.mode._excluded(g2)
    assert "has no place for this pod (job-worker-0)" in (c.mode.leaving or "")
    assert c._next(STATE, stopped(3)) == Stopped(3)
    # A survivor created in generation 0 that is a member of generation 2 follows it.
    kept = KeepSurvivorsMode(Watch(g2), Membership(0, 2), pod_name="job-worker-1", pod_index=1)  # type: ignore[arg-type]
    assert not kept._excluded(g2)


def test_the_env_names_the_rank_among_pods_and_the_first_members_host() -> None:
    from torchjob.api.models import TorchJobSpec
    from torchjob.rules.worker_env import worker_pod_env

    spec = TorchJobSpec.model_validate(
        {"replicas": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}
    )
    env = worker_pod_env(
        spec, job_name="j", namespace="n", index=0, generation=2, replicas=2, members=(1, 0)
    )
    wire = env.to_env()
    assert (wire["RANK"], wire["TORCHJOB_POD_INDEX"], wire["MASTER_ADDR"]) == (
        "1",
        "0",
        "j-worker-1.j.n.svc",
    )
    assert PodEnv.from_env(wire) == env
    canonical = worker_pod_env(spec, job_name="j", namespace="n", index=1, generation=0, replicas=2)
    assert canonical.node_rank is None and canonical.to_env()["RANK"] == "1"


class Script:
    """A job whose published membership moves through ``steps`` as a pod waits on it."""

    deleting = False

    def __init__(self, *steps: Membership) -> None:
        self.steps = list(steps)

    def read(self) -> Membership | None:
        return self.steps[0]

    def changed(self, generation: int) -> Membership | None:
        return None

    def wait_beyond(self, generation: int, **_: Any) -> Membership:
        self.steps = [m for m in self.steps if m.generation > generation]
        return self.steps[0]


def test_a_standby_waits_through_generations_without_it_and_joins_the_one_that_names_it(
    tmp_path: Path,
) -> None:
    def gen(n: int, members: list[int], **status: Any) -> Membership:
        m = Membership.from_status(
            {"currentGeneration": n, "replicas": len(members), "members": members, **status}
        )
        assert m is not None
        return m

    ready = tmp_path / "ready"
    standby = pod(
        membership=KEEP_SURVIVORS, pod_index=2, generation=1, rdzv_host="job-worker-0.job.ns.svc"
    )
    c = Controller(trainer(tmp_path), standby)
    watch = Script(gen(0, [1, 0]), gen(1, [0, 1]), gen(2, [1, 2]))
    c.mode = KeepSurvivorsMode(
        watch, Membership(1, 2), pod_name="job-worker-2", pod_index=2, ready=JoinerReady(ready)
    )  # type: ignore[arg-type]
    assert isinstance(c.mode, KeepSurvivorsMode)
    with ProgressView(enabled=False, total_epochs=None) as view:
        c.mode.await_own_generation(c, view)
    assert ready.exists(), "ready (its readiness probe) while it waits"
    assert c.mode.membership.generation == 2 and c.mode.joined
    now = c._pod_now()
    assert now is not None
    assert (now.group_rank, now.world_size, now.rdzv_host) == (1, 2, "job-worker-1.job.ns.svc")

    listed = Script(gen(2, [0, 1], replacedWorkers=["job-worker-2"]))
    gone = KeepSurvivorsMode(
        listed, Membership(1, 2), pod_name="job-worker-2", pod_index=2, ready=JoinerReady(ready)
    )  # type: ignore[arg-type]
    with (
        ProgressView(enabled=False, total_epochs=None) as view,
        pytest.raises(GenerationTimeout, match="replaces"),
    ):
        gone.await_own_generation(c, view)


def test_a_pod_replaced_while_it_waits_to_join_stops_rather_than_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench/results/2026-12-03a: a joiner the next generation replaced (``replacedWorkers``)
    ended with TrainingFailedError and a traceback. It now says why and stops (exit 75), as a
    member left out of a generation does."""
    from torchjob.train.errors import TrainingFailedError, TrainingStoppedError

    published = Membership.from_status(
        {"currentGeneration": 2, "replicas": 2, "replacedWorkers": ["job-worker-2"]}
    )
    assert published is not None
    joiner = pod(membership=KEEP_SURVIVORS, pod_index=2, generation=1)
    c = Controller(trainer(tmp_path), joiner)
    c.mode = KeepSurvivorsMode(
        Script(published), Membership(1, 2), pod_name="job-worker-2", pod_index=2,
        ready=JoinerReady(tmp_path / "ready"),
    )  # type: ignore[arg-type]  # fmt: skip
    monkeypatch.setattr(c, "_prestart", lambda *_: None)  # no worker processes here
    with (
        ProgressView(enabled=False, total_epochs=None) as view,
        pytest.raises(TrainingStoppedError) as stopped,
    ):
        c._loop(view)
    assert not isinstance(stopped.value, TrainingFailedError)
    said = capsys.readouterr()
    assert "generation 2 replaces this pod (job-worker-2)" in said.out + said.err

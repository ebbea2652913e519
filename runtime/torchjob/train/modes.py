"""The three modes of ``TorchTrainer.fit()`` (see ``torchjob.train.controller``): what differs
between a laptop, a TorchJob pod, and a KeepSurvivors pod. Each mode turns how a generation
ended into the next step (``torchjob.train.steps``), with the pure policies of
``torchjob.launch.policy``; the controller carries the steps out.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol, assert_never

from torchjob.api.models import TERMINAL_PHASES
from torchjob.contract import Member, PodEnv, Standby, worker_pod_name
from torchjob.launch import LaunchError, WorkerGroupError, WorkerGroupStartError
from torchjob.launch.placement import available_workers
from torchjob.launch.policy import (
    Fail,
    GroupFailurePolicy,
    GroupScalingPolicy,
    Resize,
    RunState,
    as_failure,
)
from torchjob.rules import ElasticRules
from torchjob.train.job_status import JobEndpoint
from torchjob.train.progress import ProgressView
from torchjob.train.ready import JoinerReady
from torchjob.train.recovery.membership import GenerationTimeout, Membership, MembershipWatch
from torchjob.train.recovery.preemption import NoticeWriter, notice_path
from torchjob.train.steps import (
    Errored,
    FitContext,
    Following,
    Reforming,
    Resizing,
    Restarting,
    Step,
    Stopped,
    TrainerSettings,
)

log = logging.getLogger(__name__)

FOLLOW_TIMEOUT_S = 900.0
"""KeepSurvivors: how long a broken group's pod waits for the next generation (backoff)."""

SUPERSEDED_AFTER_S = 10.0
"""A formation a later generation superseded is given up once it waited this long (a sound one
forms in seconds, then stops at its first report, its processes kept), or at once for a loss."""


# --- modes ---------------------------------------------------------------------------------


class FitMode(Protocol):
    """What differs between a laptop, a pod, and a KeepSurvivors pod."""

    name: str

    def interrupt(self, c: FitContext, state: RunState) -> str | None:
        """Polled while a generation runs: a reason to stop every rank at its next report."""

    @property
    def regroups(self) -> bool:
        """An interrupt now re-forms the group from memory (no stop's checkpoint)."""

    def superseded(self, forming_s: float) -> str | None:
        """Polled while a generation's group forms (for ``forming_s`` seconds so far): a
        reason to give up on forming it (a later generation was published), else None."""

    def after_interrupt(self, c: FitContext, state: RunState, at_report: int | None) -> Step:
        """Every rank stopped at a report, and not because this process got SIGTERM."""

    def after_failure(self, c: FitContext, state: RunState, err: LaunchError) -> Step:
        """A retryable failure broke the group while no stop was requested."""


class LocalMode:
    """All ranks are this machine's processes; the controller owns restarts and resizes."""

    name = "local"
    regroups = False  # a resize stops the loop as a SIGTERM does

    def __init__(
        self, failure: GroupFailurePolicy, scaling: GroupScalingPolicy, use_gpu: bool
    ) -> None:
        self.failure = failure
        self.scaling = scaling
        self.use_gpu = use_gpu
        self.pending: Resize | None = None

    def interrupt(self, c: FitContext, state: RunState) -> str | None:
        if not self.scaling.elastic.elastic:
            return None
        decision = self.scaling.decide_for(
            state,
            now_s=time.monotonic(),
            available_workers=available_workers(self.scaling.elastic.ceiling, self.use_gpu),
        )
        if isinstance(decision, Resize):
            self.pending = decision
            return decision.reason
        return None

    def superseded(self, forming_s: float) -> str | None:
        return None  # a local group forms in moments; a resize waits for it

    def after_interrupt(self, c: FitContext, state: RunState, at_report: int | None) -> Step:
        resize, self.pending = self.pending, None
        if resize is None:
            # Only a resize interrupts a local group; anything else is a stop.
            return Stopped(at_report)
        return Resizing(state, resize)

    def after_failure(self, c: FitContext, state: RunState, err: LaunchError) -> Step:
        self.pending = None  # a resize decided before the crash is moot now
        decision = self.failure.decide(state, as_failure(err))
        if isinstance(decision, Fail):
            return Errored(err, f"{err}\n(training gave up: {decision.reason})")
        return Restarting(state, decision)


class PodMode:
    """A TorchJob pod whose job restarts all pods on a failure: fail fast, tell the operator."""

    name = "pod"
    regroups = False

    def interrupt(self, c: FitContext, state: RunState) -> str | None:
        return None

    def superseded(self, forming_s: float) -> str | None:
        return None

    def after_interrupt(self, c: FitContext, state: RunState, at_report: int | None) -> Step:
        # A peer pod stopped the group (it was preempted): this pod ends too.
        return Stopped(at_report)

    def after_failure(self, c: FitContext, state: RunState, err: LaunchError) -> Step:
        return Errored(err, str(err))


class KeepSurvivorsMode:
    """A TorchJob pod that outlives generations: it follows the job's published membership."""

    name = "keep-survivors"

    def __init__(
        self,
        watch: MembershipWatch,
        membership: Membership,
        *,
        pod_name: str = "",
        pod_index: int | None = None,
        ready: JoinerReady | None = None,
    ) -> None:
        self.watch = watch
        self.membership = membership
        self.pod_name = pod_name
        self.pod_index = pod_index
        self.created_in = membership.generation
        self.ready = ready or JoinerReady()
        self.next: Membership | None = None
        self.entered_s = time.monotonic()
        self.joined = False
        """This pod has been a member of a generation (a joiner or standby: not yet)."""
        self.leaving: str | None = None
        """Why this pod is not a member of the published generation (it stops, not re-forms)."""
        self.on_broken: Callable[[int], None] | None = None
        """Tells the operator that this pod's group of a generation broke with its workers
        alive (``SilentReports.broken``): with every member's, the next generation comes."""

    def await_own_generation(self, c: FitContext, view: ProgressView) -> None:
        """A pod created ahead of its generation waits until the operator publishes one that
        includes it. An elastic job that lost a pod goes on smaller at once, and the operator creates the
        replacement for the *next* generation (a joiner, docs/api.md); a warm standby
        (``elastic.standbyReplicas``) waits until a generation takes it in a lost pod's
        place. Either starts and imports while the group trains, and forms the group only
        once a generation names it (``status.members``); forming it earlier would meet the
        running group's rendezvous. From here it reads ready (``self.ready``: the joiner
        pod's readiness probe), so the operator counts on it only once it is this far. Raises
        :class:`GenerationTimeout` when the job ends or stops first, or the operator lists
        this pod as replaced."""
        # Ready (the joiner's readiness probe) from here, also when its generation came first:
        # a joiner that never waited read unready all its life (bench/results/2026-12-05v).
        self.ready.set()
        own = self.membership.generation
        m = self.watch.read()
        if m is None:
            self.joined = True
            return
        told = False
        while m.generation < own or not self._named_in(m):
            if m.excludes(self.pod_name, self.created_in):
                self._excluded(m)
                view.message(f"[torchjob] {self.leaving}")  # it stops: the operator replaced it
                raise GenerationTimeout(self.leaving or "replaced")
            if not told:
                view.message(
                    f"[torchjob] this pod waits to join (created for generation {own}); the "
                    f"job runs generation {m.generation}"
                )
                told = True
            m = self.watch.wait_beyond(m.generation, timeout_s=math.inf, stop=c.stop_requested)
        if m.generation >= own:
            self.membership = m  # with its rank order (status.members)
        self.entered_s = time.monotonic()
        self.joined = True

    def _named_in(self, m: Membership) -> bool:
        """Whether generation ``m`` names this pod as a member (a pod of unknown index, as in
        the tests: every generation does)."""
        if self.pod_index is None:
            return True
        match m.role(self.pod_index):
            case Member():
                return True
            case Standby():
                return False
            case role:
                assert_never(role)

    def _excluded(self, m: Membership | None) -> bool:
        """``m`` lists this pod as replaced (it was evicted, or is beyond the new size), or
        is a generation at or after the one this pod was created for that leaves it out
        (the operator deletes such a pod: a joiner whose generation was overtaken), or the
        job is being deleted (all pods stop at one report, not each at its own SIGTERM)."""
        if self.watch.deleting:
            self.leaving = "the TorchJob is being deleted: no generation will follow, so it stops"
            return True
        if m is None:
            return False
        if m.excludes(self.pod_name, self.created_in):
            why = "replaces this pod"
        elif self.joined and m.generation >= self.created_in and not self._named_in(m):
            why = "has no place for this pod"
        else:
            return False
        self.leaving = (
            f"generation {m.generation} {why} ({self.pod_name}): it stops instead of re-forming"
        )
        return True

    def stops(self) -> bool:  # it leaves rather than re-forms: replaced, left out, deleted
        return self.leaving is not None or self._excluded(None)

    @property
    def regroups(self) -> bool:  # a new generation, also one this pod leaves; not a deletion
        return not self.watch.deleting

    def interrupt(self, c: FitContext, state: RunState) -> str | None:
        moved = self.watch.changed(self.membership.generation)
        if self.watch.deleting and self._excluded(moved):
            return f"{self.leaving}: stopping all ranks at the next report"
        if moved is None:
            return None
        if self._excluded(moved):
            return self.leaving
        if self.next is None or self.next.generation <= self.membership.generation:
            # The first since: a broken group's peers form it (the newest: +10 s, 12-07zd).
            self.next = moved
        return (
            f"generation {moved.generation} published: stopping all ranks at the next report "
            "to re-form the group"
        )

    def superseded(self, forming_s: float) -> str | None:
        """A later generation, once this group has formed for :data:`SUPERSEDED_AFTER_S`, or
        at once where it names a pod of it lost (left out or renewed: it never comes): follow
        it. It left out a pod this formation waits for, gave an old pod's name to a new one
        (which joins the later generation), or grew it (a member that read the grow first
        forms that one, never this: 2026-12-02h, 116 s). Giving up costs the processes, not
        the restore point (shm_keep)."""
        moved = self.watch.changed(self.membership.generation)
        if moved is None:
            return None
        forming, later = set(self.membership.ranked), set(moved.ranked)
        at, job = f"{forming_s:.0f}s into the formation", self.pod_name.rpartition("-worker-")[0]
        dead = moved.lost_since(self.membership.generation) - {self.pod_name}
        if lost := sorted(i for i in forming if worker_pod_name(job, i) in dead):
            return f"generation {moved.generation} names pod(s) {lost} of it lost, {at}"
        if forming_s < SUPERSEDED_AFTER_S:
            return None
        if gone := sorted(forming - later):
            return f"generation {moved.generation} was published without pod(s) {gone}, {at}"
        renewed = sorted(i for i in forming if worker_pod_name(job, i) in moved.replaced)
        if later > forming and not renewed:
            return (
                f"generation {moved.generation} grew it by pod(s) {sorted(later - forming)}, "
                f"{at}: a member that read the grow first forms that generation, never this one"
            )
        return (
            f"generation {moved.generation} was published with the same pods by name"
            f"{f' (replaced: {renewed})' if renewed else ''}, {at}: a pod under one of their "
            "names is a new one"
        )

    def after_interrupt(self, c: FitContext, state: RunState, at_report: int | None) -> Step:
        if self.leaving or self._excluded(self.watch.read()):
            return Stopped(at_report)
        # Not this pod's SIGTERM: a peer pod was preempted, or the generation moved.
        return Following(state, "the group stopped for a membership change")

    def after_failure(self, c: FitContext, state: RunState, err: LaunchError) -> Step:
        moved = self.watch.read()
        generation = self.membership.generation
        if self._excluded(moved):
            return Stopped(at_report=None)
        if (
            isinstance(err, WorkerGroupStartError)
            and err.waiting_for_peers
            and (moved is None or moved.generation == generation)
            and (moved is None or moved.phase not in TERMINAL_PHASES)
            and time.monotonic() - self.entered_s < FOLLOW_TIMEOUT_S
        ):
            return Reforming(state, f"the group did not form ({err}); trying again")
        peer = isinstance(err, WorkerGroupError) and err.peer_failure
        if (
            peer
            and self.on_broken is not None
            and (moved is None or moved.generation == generation)
        ):
            self.on_broken(generation)  # with no loss, nothing else may publish the next one
        if peer or (moved is not None and moved.generation > generation):
            # A peer's loss broke the group: survive it and follow the next generation.
            return Following(state, f"the group broke ({err})", err=err)
        return Errored(err, str(err))

    def follow(self, c: FitContext, why: str, view: ProgressView) -> None:
        """Wait for the next generation (raises :class:`GenerationTimeout`), then its backoff."""
        m = self.next
        nxt = m.generation if m is not None else self.membership.generation + 1
        view.message(f"[torchjob] {why}; this pod stays and waits for generation {nxt}")
        if m is None or m.generation <= self.membership.generation:
            m = self.watch.wait_beyond(
                self.membership.generation, timeout_s=FOLLOW_TIMEOUT_S, stop=c.stop_requested
            )
        if self._excluded(m):
            view.message(f"[torchjob] {self.leaving}")
            return
        self.membership, self.next = m, None
        self.entered_s = time.monotonic()
        wait = min(m.backoff_left_s(), FOLLOW_TIMEOUT_S)
        if wait > 0:
            # The replacements come after the operator's backoff: forming the group earlier
            # would only spend the rendezvous timeout waiting for them.
            view.message(f"[torchjob] restart backoff: the new pods come in {wait:.0f}s")
            c.stop_requested.wait(wait)
        index = c.pod.pod_index if c.pod else 0
        match m.role(index):
            case Member(node_rank=rank):
                place = f"rank {rank} among pods"
            case Standby():
                place = "a standby"
            case role:
                assert_never(role)
        view.message(
            f"[torchjob] generation {m.generation}: {m.replicas} pods, this one is pod "
            f"{index} ({place}); resuming from the latest checkpoint"
        )


# --- pure helpers ------------------------------------------------------------------------


def choose_mode(
    trainer: TrainerSettings, pod: PodEnv | None, endpoint: JobEndpoint | None
) -> FitMode:
    """The mode for where ``fit()`` runs (see the module docstring)."""
    if pod is None:
        sc = trainer.scaling_config
        elastic = ElasticRules(
            floor=sc.min_workers, ceiling=sc.max_workers, grow_cooldown_s=sc.elastic_grow_cooldown_s
        )
        return LocalMode(
            GroupFailurePolicy(trainer.run_config.failure_config.budget, elastic),
            GroupScalingPolicy(elastic),
            use_gpu=sc.use_gpu,
        )
    if pod.keeps_survivors:
        if endpoint is not None:
            watch = MembershipWatch(endpoint)
            # What the operator says is coming, for the workers' get_preemption_info().
            notice = NoticeWriter(notice_path(pod), pod.job_name, pod.nproc_per_node)
            watch.on_change(lambda m: notice(m.leaving, m.ranked))
            return KeepSurvivorsMode(
                watch,
                Membership(pod.generation, pod.replicas),
                pod_name=worker_pod_name(pod.job_name, pod.pod_index),
                pod_index=pod.pod_index,
                ready=JoinerReady.probed(),
            )
        log.warning(
            "torchjob: membershipPolicy KeepSurvivors needs the pod's ServiceAccount "
            "token to follow generations; a broken group ends this pod instead"
        )
    return PodMode()

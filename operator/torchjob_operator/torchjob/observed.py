"""What the planner sees: typed, read-only views of pods and of the job's own status.

``pod_view`` and ``JobState.from_status`` turn raw Kubernetes dicts into these
values; they are pure functions, so the planner never touches a dict shaped by
the API and the unit tests build views directly.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchjob import contract
from torchjob.api.models import (
    FailureRecord,
    GenerationRecord,
    Phase,
    Progress,
    SilentWorker,
    TorchJobStatus,
)
from torchjob.rules.loss import SIGNAL_EXIT_BASE, Loss, Silent, classify, signal_of_exit
from torchjob.rules.member import MemberPhase
from torchjob_operator.common.clock import parse_time, parse_time_or_none, seconds_between
from torchjob_operator.common.nodes import AVOIDED_NODES
from torchjob_operator.common.owners import controller_uid

IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
"""Waiting reasons of a container whose image cannot be pulled."""
CANNOT_START_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError", "PreStartHookError"}
)
"""Waiting reasons of a container the kubelet cannot create or start (a missing Secret ...)."""

DOMAIN_LABEL = f"{contract.GROUP}/domain"
"""The hash of the topology domain a pod was placed in (``torchjob.topology``)."""

NODE_LOSS_REASONS = frozenset({"NodeLost", "Evicted", "Shutdown", "NodeShutdown", "Terminated"})
"""``pod.status.reason`` values set when a node goes away or the kubelet evicts."""


PodPhase = MemberPhase


def phase_of(status: Mapping[str, Any]) -> PodPhase:
    """A pod's ``status.phase`` (Pending when absent; Unknown when not one Kubernetes has)."""
    try:
        return PodPhase(status.get("phase") or "Pending")
    except ValueError:
        return PodPhase.UNKNOWN


"""Pod phases are the members' phases (``torchjob.rules.member``)."""


@dataclass(frozen=True)
class PodView:
    """One worker pod as the planner needs it: a ``torchjob.rules.Member``."""

    name: str
    index: int
    generation: int
    phase: PodPhase = PodPhase.PENDING
    ready: bool = False
    deleting: bool = False
    scheduled: bool = False
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    disruption: str | None = None
    """Why the cluster took this pod away (DisruptionTarget reason, node loss), else None."""
    finished_at: datetime | None = None
    unschedulable_since: datetime | None = None
    waiting: str = ""
    """Kubelet reason (``ImagePullBackOff`` ...) when a container cannot start; see
    IMAGE_PULL_REASONS and CANNOT_START_REASONS. Normal waits (ContainerCreating) are ''."""
    waiting_message: str = ""
    summary: str = ""
    """One line on why the container stopped: from its termination message, if it left one."""
    peer_failure: bool = False
    """The runtime said this pod failed only because a peer did (not a root cause)."""
    killed: bool = False
    """The runtime said a worker process of this pod was SIGKILLed (``kill -9``, the OOM
    killer), as if the container had exited 137."""
    oom: bool = False
    """... by the OOM killer (the runtime's evidence: the cgroup's ``oom_kill`` counter)."""
    silent: Silent | None = None
    """Its peers reported it silent (``status.silentWorkers``, ``torchjob/silent.py``)."""
    joiner: bool = False
    """Created ahead of the generation that takes it in (``contract.LABEL_JOINER``)."""
    domain: str = ""
    """Its topology domain's hash (``torchjob.topology.DOMAIN_LABEL``), if it was placed."""
    deletion_at: datetime | None = None
    """When the kubelet kills it (``deletionTimestamp``: the delete's time plus its grace
    period), for a pod being deleted."""
    node: str = ""
    """The node it was bound to (``spec.nodeName``; empty until scheduled)."""
    notice: str | None = None
    """The termination notice its node carries (a taint key, ``torchjob/nodes.py``)."""
    notice_until: datetime | None = None
    """When its noticed node goes (the notice's deadline)."""
    avoided: tuple[str, ...] = ()
    """The nodes it was created to avoid for their state (``common.nodes.AVOIDED_NODES``)."""
    start_s: float | None = None
    """Seconds from its creation to ``Ready`` (its last transition there), once Ready: for a
    joiner, how long a replacement of this job takes to start (``drain.replacement_lead``)."""
    node_lost: bool = False
    """Its node stopped reporting (``Ready`` not ``True``): a pod being deleted there stays
    Terminating until the node returns or is removed (``torchjob/nodes.py``)."""

    @property
    def stuck(self) -> bool:
        """Being deleted on a node that cannot confirm it: it holds its name, and nothing else."""
        return self.deleting and self.node_lost

    @property
    def active(self) -> bool:
        return (
            self.phase in (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.UNKNOWN)
            and not self.deleting
        )

    @property
    def loss(self) -> Loss | None:
        """How this pod was lost (``torchjob.rules.loss.classify``): its disruption, its
        silence, or how its container ended (``128 + n``: signal ``n``; a worker process the
        runtime said was SIGKILLed counts as a container that exited 137; ``OOMKilled`` or the
        runtime's ``oom``: the OOM killer)."""
        code = SIGNAL_EXIT_BASE + signal.SIGKILL if self.killed else self.exit_code
        return classify(
            ended=self.phase == PodPhase.FAILED,
            exit_code=code,
            signal=signal_of_exit(code),
            oom=self.oom or self.reason == "OOMKilled",
            taken=self.disruption,
            silent=self.silent,
        )


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == type_:
            return cond  # type: ignore[no-any-return]
    return None


@dataclass(frozen=True)
class ProbeView:
    """A capacity probe pod: does a worker-sized pod fit right now?"""

    name: str
    scheduled: bool
    deleting: bool = False


def split_by_owner(
    pods: list[dict[str, Any]], uid: str
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """(the pods this job controls, the names of the others), for pods carrying its name label.

    A TorchJob deleted and created again under the same name finds the old one's pods still
    there (terminating, or not yet collected): they carry the same labels and names but
    another controller uid. They are not this job's to judge, count or delete.
    """
    ours = [p for p in pods if controller_uid(p) == uid]
    others = tuple(
        sorted(str((p.get("metadata") or {}).get("name", "")) for p in pods if p not in ours)
    )
    return ours, others


def probe_view(pod: Mapping[str, Any]) -> ProbeView | None:
    """A probe pod dict -> ProbeView; None for any other pod."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(contract.LABEL_ROLE) != contract.ROLE_PROBE:
        return None
    scheduled = bool((pod.get("spec") or {}).get("nodeName"))
    return ProbeView(
        name=meta.get("name", ""),
        scheduled=scheduled,
        deleting=meta.get("deletionTimestamp") is not None,
    )


def ended_phase(pod: Mapping[str, Any], phase: PodPhase) -> PodPhase:
    """The phase of a ``restartPolicy: Never`` pod (every worker pod) whose containers have
    all terminated: Failed if one failed, else Succeeded, as the kubelet will say. It says so
    in a second status update, about a second after the one that shows the containers
    terminated; a hard loss (a SIGKILLed trainer) is judged on the first, so the survivors
    re-form that much sooner. Any other pod keeps its phase."""
    if phase not in (PodPhase.PENDING, PodPhase.RUNNING):
        return phase
    if ((pod.get("spec") or {}).get("restartPolicy")) != "Never":
        return phase
    states = [
        (cs.get("state") or {}).get("terminated")
        for cs in (pod.get("status") or {}).get("containerStatuses") or ()
    ]
    if not states or not all(t and t.get("exitCode") is not None for t in states):
        return phase
    failed = any(int(t["exitCode"]) != 0 for t in states if t)
    return PodPhase.FAILED if failed else PodPhase.SUCCEEDED


def _root_exit(status: Mapping[str, Any]) -> tuple[int | None, str, str, datetime | None]:
    """The pod's exit: (exit code, reason, message, finished at) of the root-cause container
    (the first non-zero exit, else the first code seen); the pod's own reason and message
    where no container terminated."""
    exit_code: int | None = None
    reason = status.get("reason") or ""
    message = status.get("message") or ""
    finished_at: datetime | None = None
    for cs in status.get("containerStatuses") or ():
        terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
            "terminated"
        )
        if terminated and terminated.get("exitCode") is not None:
            code = int(terminated["exitCode"])
            # The first non-zero exit is the root cause; otherwise keep the first code seen.
            if exit_code is None or (exit_code == 0 and code != 0):
                exit_code = code
                reason = terminated.get("reason") or reason
                message = terminated.get("message") or message
                finished_at = parse_time(terminated.get("finishedAt"))
    return exit_code, reason, message, finished_at


def _waiting(status: Mapping[str, Any]) -> tuple[str, str]:
    """(reason, message) of the first container that cannot start (an image it cannot pull,
    a config error); ``("", "")`` when none."""
    for cs in [
        *(status.get("initContainerStatuses") or ()),
        *(status.get("containerStatuses") or ()),
    ]:
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason") in IMAGE_PULL_REASONS | CANNOT_START_REASONS:
            return w["reason"], w.get("message") or ""
    return "", ""


def _disruption(status: Mapping[str, Any]) -> str | None:
    """Why the pod was taken away (``DisruptionTarget``, a lost node, Kueue's eviction), if it
    was."""
    disruption: str | None = None
    target = _condition(status, "DisruptionTarget")
    if target and target.get("status") == "True":
        disruption = target.get("reason") or "DisruptionTarget"
    elif target is None and (status.get("reason") or "") in NODE_LOSS_REASONS:
        disruption = status["reason"]
    # Kueue marks workloads it evicts with TerminationTarget.
    kueue = _condition(status, "TerminationTarget")
    if disruption is None and kueue and kueue.get("status") == "True":
        disruption = kueue.get("reason") or "TerminationTarget"
    return disruption


def pod_view(pod: Mapping[str, Any]) -> PodView | None:
    """A worker pod dict -> PodView; ``None`` for pods that are not torchjob workers."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(contract.LABEL_ROLE, contract.ROLE_WORKER) != contract.ROLE_WORKER:
        return None
    try:
        index = int(labels[contract.LABEL_POD_INDEX])
        generation = int(labels.get(contract.LABEL_GENERATION, "0"))
    except (KeyError, ValueError):
        return None
    status = pod.get("status") or {}
    phase = phase_of(status)
    exit_code, reason, message, finished_at = _root_exit(status)
    phase = ended_phase(pod, phase)
    waiting, waiting_message = _waiting(status)
    said = contract.parse_termination_message(message) if exit_code not in (None, 0) else None
    disruption = _disruption(status)

    ready_cond = _condition(status, "Ready")
    scheduled_cond = _condition(status, "PodScheduled")
    unschedulable_since = None
    if (
        scheduled_cond
        and scheduled_cond.get("status") == "False"
        and scheduled_cond.get("reason") == "Unschedulable"
    ):
        unschedulable_since = parse_time(scheduled_cond.get("lastTransitionTime"))
        message = message or scheduled_cond.get("message") or ""
    scheduled = bool(
        (pod.get("spec") or {}).get("nodeName")
        or (scheduled_cond is not None and scheduled_cond.get("status") == "True")
    )
    return PodView(
        name=meta.get("name", ""),
        index=index,
        generation=generation,
        joiner=labels.get(contract.LABEL_JOINER) == "true",
        domain=labels.get(DOMAIN_LABEL, ""),
        phase=phase,
        ready=bool(ready_cond and ready_cond.get("status") == "True"),
        deleting=meta.get("deletionTimestamp") is not None,
        deletion_at=parse_time_or_none(meta.get("deletionTimestamp")),
        scheduled=scheduled,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        exit_code=exit_code,
        reason=reason,
        message=message,
        disruption=disruption,
        finished_at=finished_at,
        unschedulable_since=unschedulable_since,
        avoided=tuple(
            n for n in (meta.get("annotations") or {}).get(AVOIDED_NODES, "").split(",") if n
        ),
        waiting=waiting,
        waiting_message=waiting_message,
        summary=said.line if said else "",
        peer_failure=said.peer_failure if said else False,
        killed=said.killed if said else False,
        oom=said.oom if said else False,
        start_s=seconds_between(meta.get("creationTimestamp"), ready_cond.get("lastTransitionTime"))
        if ready_cond and ready_cond.get("status") == "True"
        else None,
    )


@dataclass(frozen=True)
class JobState:
    """The planner's memory between reconciles, kept in the TorchJob status (never in the operator)."""

    phase: Phase | None = None
    generation: int = 0
    """Membership generation whose pods should exist."""
    replicas: int = 0
    """Worker pods of that generation."""
    members: tuple[int, ...] | None = None
    """Their indices in rank order, when not ``0..replicas-1`` (``status.members``)."""
    created_generation: int | None = None
    spec_replicas: int | None = None
    last_rescale: datetime | None = None
    restarts: int = 0
    disruptions: int = 0
    start_time: datetime | None = None
    completion_time: datetime | None = None
    restart_after: datetime | None = None
    last_failure: FailureRecord | None = None
    conditions: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    silent: tuple[SilentWorker, ...] = ()
    """Member pods the survivors' runtimes saw go silent (``status.silentWorkers``)."""
    broken: tuple[SilentWorker, ...] = ()
    """Members whose group broke with their workers alive, each its own word
    (``status.silentWorkers`` entries with ``how: broken``; ``torchjob/broken.py``)."""
    history: tuple[GenerationRecord, ...] = ()
    """The last generations (``status.history``; ``torchjob_operator.torchjob.history``)."""
    progress: Progress | None = None
    """Rank 0's last report (``status.progress``)."""
    losses: Mapping[str, int] = field(default_factory=dict)
    """Generations begun for a loss, by cause (``status.losses``)."""
    leaving: Mapping[str, datetime] = field(default_factory=dict)
    """The deadlines of the pods given notice, by pod (``status.leavingWorkers``): a notice
    whose taint has no time keeps the deadline its first pass gave it."""
    placing_again: tuple[int, ...] = ()
    """Members deleted unscheduled, to create again (``status.placingAgain``)."""

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> JobState:
        """The status through ``torchjob.api.TorchJobStatus`` (malformed fields read as absent)."""
        s = TorchJobStatus.parse(status)
        return cls(
            phase=s.phase,
            generation=s.current_generation or 0,
            replicas=s.replicas or 0,
            members=s.rank_order(),
            created_generation=s.created_generation,
            spec_replicas=s.spec_replicas or None,
            last_rescale=parse_time_or_none(s.last_rescale_time),
            restarts=s.restarts or 0,
            disruptions=s.disruptions or 0,
            start_time=parse_time_or_none(s.start_time),
            completion_time=parse_time_or_none(s.completion_time),
            restart_after=parse_time_or_none(s.restart_after),
            last_failure=s.last_failure,
            conditions=tuple(c.to_wire() for c in s.conditions or ()),
            silent=tuple(w for w in s.silent_workers or () if not w.broken_group),
            broken=tuple(w for w in s.silent_workers or () if w.broken_group),
            history=tuple(s.history or ()),
            progress=s.progress,
            losses=dict(s.losses or {}),
            leaving={
                w.pod: at
                for w in s.leaving_workers or ()
                if (at := parse_time_or_none(w.deadline)) is not None
            },
            placing_again=tuple(s.placing_again or ()),
        )

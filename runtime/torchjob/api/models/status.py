"""The status of a TorchJob: what the operator (and rank 0's progress report) writes."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError

from torchjob.api.models.base import _Model
from torchjob.api.models.history import GenerationRecord
from torchjob.api.models.initializers import InitializerStatus
from torchjob.api.models.placement import PlacementStatus


class Phase(str, Enum):
    """Lifecycle of a TorchJob. ``is_terminal`` phases never change again."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def is_terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


TERMINAL_PHASES = frozenset(p.value for p in Phase if p.is_terminal)
"""The wire values of the phases after which a TorchJob never changes again."""


class Condition(_Model):
    """A metav1.Condition."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class FailureRecord(_Model):
    pod: str
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    time: str | None = None


class Progress(_Model):
    """Training progress reported by rank 0."""

    model_config = ConfigDict(extra="allow")

    epoch: int | None = None
    step: int | None = None
    metrics: dict[str, Any] | None = Field(
        default=None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )
    last_checkpoint: str | None = None
    last_checkpoint_time: str | None = Field(
        default=None, description="When rank 0's runtime saw the last checkpoint committed."
    )
    checkpoint_generation: int | None = Field(
        default=None,
        description=(
            "The membership generation that committed lastCheckpoint: an elastic RecreateGroup"
            " job with spec.checkpoint grows back only once its generation committed one."
        ),
    )
    update_time: str | None = None
    generation: int | None = Field(default=None, description="The generation that reported.")
    restored_from: str | None = Field(
        default=None,
        description="Where this generation's state came from: memory, mirror, storage, start.",
    )
    restored_step: int | None = Field(default=None, description="The step it resumed after.")
    first_step_time: str | None = Field(
        default=None, description="When this generation's first step completed (ms precision)."
    )


def loop_step(progress: Mapping[str, Any] | None) -> int | None:
    """The training loop's own step, where rank 0's reports carry it as ``metrics.step`` (an
    integer); None where they do not. ``progress.step`` counts reports instead, which a loop
    that reports once per checkpoint makes far fewer of than steps: a rate of it is reports
    per second. The dashboard and the operator's ``torchjob_job_step`` read the step here."""
    metrics = (progress or {}).get("metrics")
    step = metrics.get("step") if isinstance(metrics, Mapping) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


class RuntimeStatus(_Model):
    """The runtime blueprint a job started from (``spec.runtimeRef``), pinned: the job keeps
    this snapshot whatever happens to the blueprint later."""

    model_config = ConfigDict(extra="allow")

    kind: str
    name: str
    resource_version: str | None = None
    generation: int | None = None
    spec: dict[str, Any] = Field(
        description="The blueprint's spec as it was read.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Tracking(_Model):
    """The experiment-tracking run of the job, written by rank 0's pod (``torchjob.train.tracking``):
    every generation logs into this run."""

    model_config = ConfigDict(extra="allow")

    backend: str | None = Field(default=None, description="mlflow")
    run_id: str | None = Field(default=None, description="The MLflow run of this job.")
    experiment_id: str | None = None
    tracking_uri: str | None = Field(default=None, description="Without credentials.")
    wandb_run_id: str | None = None
    error: str | None = Field(
        default=None, description="Why nothing is tracked (the server named could not be reached)."
    )


class SilentWorker(_Model):
    """A member pod whose heartbeat stopped, as a survivor's runtime saw it; or, with
    ``how: broken`` and ``pod`` its own reporter, a member whose group broke while every one
    of its own workers lived (:attr:`broken_group`)."""

    BROKEN: ClassVar[str] = "broken"
    """``how`` of a pod's report about itself: its group broke (a peer closed a connection, a
    collective failed) with its own workers alive, and it waits for the next generation. When
    every member of the generation says so and none is lost, the operator publishes the next
    generation with the same members (``torchjob_operator.torchjob.broken``)."""

    pod: str
    generation: int = Field(description="The generation the pod was silent in.")
    by: str = Field(description="The pod whose runtime saw it.")
    seconds: float = Field(default=0.0, description="How long it had been silent.")
    how: str | None = Field(
        default=None,
        description=(
            "What went silent: heartbeat (its beats stopped while the group trained; the"
            " default), store (the rendezvous store it serves did not answer a connection"
            " while the group formed), or host (its pod's address did not answer a"
            " connection: probed once another member went silent, or while the group"
            " formed), or absent (a pod new in the generation whose host answered, but a"
            " rank of it never entered the rendezvous of a group still forming after 30 s;"
            " the operator takes it only for such a pod). A store report naming rank 0's pod"
            " counts only from more than half of the other members nobody reports. broken: the"
            " reporter's own group broke with its workers alive (pod is the reporter itself);"
            " once every member says so and none is lost, the next generation re-forms the"
            " same members."
        ),
    )
    at: str | None = Field(
        default=None,
        description=(
            "When the reporter found it silent (RFC 3339, its clock). A report that names the"
            " pod of rank 0 counts a few seconds after it: across a partition, rank 0's side"
            " reports the other side in the same seconds, and its view wins."
        ),
    )

    @property
    def broken_group(self) -> bool:
        """A member's report that its own group broke (not that a peer went silent)."""
        return self.how == self.BROKEN and self.pod == self.by


class LeavingWorker(_Model):
    """A member pod given notice: it trains on until its replacement takes its place, or
    until shortly before ``deadline``."""

    pod: str
    reason: str = Field(
        description=(
            "Why it leaves: the termination notice's taint key on its node, or the pod's own"
            " disruption (EvictionByEvictionAPI, a deletion)."
        )
    )
    node: str | None = Field(default=None, description="The node it runs on.")
    deadline: str | None = Field(
        default=None,
        description="When it goes (RFC 3339): its deletion's grace period, or its node's notice.",
    )
    replace_at: str | None = Field(
        default=None,
        description=(
            "When its replacement is created (RFC 3339), when that is later than the notice:"
            " the deadline less the job's replacement lead (elastic.replacementLeadSeconds)."
        ),
    )


class TorchJobStatus(_Model):
    model_config = ConfigDict(extra="allow")

    phase: Phase | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
    replicas: int | None = Field(default=None, description="Workers of the current generation.")
    ready_workers: int | None = None
    active_workers: int | None = None
    succeeded_workers: int | None = None
    failed_workers: int | None = None
    workers: str | None = Field(default=None, description="ready/desired, for kubectl get.")
    selector: str | None = Field(
        default=None, description="Label selector of the workers (scale subresource)."
    )
    current_generation: int | None = Field(
        default=None, description="Membership generation of the pods."
    )
    world_size: int | None = None
    restarts: int | None = Field(default=None, description="Group restarts caused by failures.")
    disruptions: int | None = Field(
        default=None, description="Membership changes caused by disruptions."
    )
    last_failure: FailureRecord | None = None
    restart_after: str | None = Field(
        default=None, description="Backoff: next generation not before this time."
    )
    spec_replicas: int | None = Field(
        default=None,
        description="spec.replicas the current size was decided from (tells a user's scale from a shrink).",
    )
    last_rescale_time: str | None = Field(default=None, description="Last elastic shrink or grow.")
    created_generation: int | None = Field(
        default=None,
        description="Latest generation whose pods were all created (a later loss is a disruption).",
    )
    members: list[int] | None = Field(
        default=None,
        description=(
            "KeepSurvivors: the pod indices of the current generation in rank order (pod"
            " members[i] runs ranks i*nprocPerNode and up; the rendezvous is on members[0])."
            " Absent: pods 0..replicas-1 in index order. A generation that lost pod 0 goes on"
            " with a survivor as rank 0."
        ),
    )
    standby_workers: int | None = Field(
        default=None,
        description=(
            "Pods waiting to join (spec.elastic.standbyReplicas, or an elastic job's"
            " replacements) that are ready to take a worker's place."
        ),
    )
    replaced_workers: list[str] | None = Field(
        default=None,
        description=(
            "KeepSurvivors: pods of an earlier generation, still present, that are not members"
            " of the current one (a new pod may take their name): their runtime stops instead"
            " of joining the current generation's group."
        ),
    )
    placing_again: list[int] | None = Field(
        default=None,
        description=(
            "Pod indices of the current generation deleted before they were ever scheduled,"
            " because they were kept off nodes that no longer need avoiding (a notice lifted,"
            " a node Ready again): the operator creates them again in the same generation."
        ),
    )
    leaving_workers: list[LeavingWorker] | None = Field(
        default=None,
        description=(
            "KeepSurvivors with replaceBeforeLeaving: member pods given notice (an eviction,"
            " a termination notice on their node) that train on while their replacements"
            " start; each pod's runtime tells its training function"
            " (torchjob.train.get_preemption_info)."
        ),
    )
    silent_workers: list[SilentWorker] | None = Field(
        default=None,
        description=(
            "KeepSurvivors: member pods whose heartbeat stopped (a vanished node, a partition),"
            " one entry per reporter and pod, each written by that survivor's runtime (a"
            " server-side apply under its own field manager, so that concurrent reports are"
            " all kept); the operator treats the current generation's as hard losses."
        ),
        # A list map: the API server merges each reporter's apply into the list instead of
        # replacing it (a merge patch replaces the whole list: the last reporter won).
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["by", "pod"],
        },
    )
    start_time: str | None = None
    completion_time: str | None = None
    progress: Progress | None = None
    runtime: RuntimeStatus | None = Field(
        default=None,
        description="spec.runtimeRef: the blueprint, its version and spec, pinned at start.",
    )
    placement: PlacementStatus | None = Field(
        default=None, description="spec.placement: the topology domains the job holds."
    )
    initializers: list[InitializerStatus] | None = Field(
        default=None, description="spec.initializers: each one's phase, bytes and message."
    )
    tracking: Tracking | None = None
    losses: dict[str, int] | None = Field(
        default=None,
        description="Generations begun for a loss, by cause (status.history's causes).",
    )
    history: list[GenerationRecord] | None = Field(
        default=None,
        description="The last generations: why each began, who left and joined, what it cost.",
    )

    def rank_order(self) -> tuple[int, ...] | None:
        """``members`` when it is a usable rank order (``replicas`` distinct, non-negative pod
        indices); None otherwise, which both readers take as ``0..replicas-1``."""
        m, n = self.members, self.replicas or 0
        if not m or len(m) != n or len(set(m)) != n or min(m) < 0:
            return None
        return tuple(m)

    def to_patch(self) -> dict[str, Any]:
        """The operator's JSON merge patch of ``/status``: every field it owns, ``None`` as an
        explicit null (which clears it), and ``progress`` and ``tracking`` left out: the pod's
        agent owns them (``runtime`` too: written once, when the blueprint is pinned;
        ``silentWorkers``: the survivors' agents write it). ``history`` and ``losses`` only
        when there are some (a write that did not plan, such as an invalid spec's, never
        clears them)."""
        patch = self.model_dump(
            by_alias=True,
            mode="json",
            exclude={"progress", "runtime", "tracking", "silent_workers", "history", "losses"},
        )
        # List items without their unset fields: the API server drops a null it stores, and
        # the operator's cache compares what it wrote with what the watch shows.
        patch["leavingWorkers"] = [
            w.model_dump(by_alias=True, mode="json", exclude_none=True)
            for w in self.leaving_workers or ()
        ] or None
        if self.history:
            patch["history"] = [r.to_wire() for r in self.history]
        if self.losses:
            patch["losses"] = dict(self.losses)
        return patch

    @classmethod
    def parse(cls, status: Mapping[str, Any] | None) -> TorchJobStatus:
        """The status as the API server holds it, tolerating fields another writer left
        malformed: each such field reads as absent (the operator rewrites it)."""
        raw = dict(status or {})
        for _ in range(len(raw) + 1):
            try:
                return cls.model_validate(raw)
            except ValidationError as err:
                bad = {e["loc"][0] for e in err.errors() if e["loc"]}
                if not bad & raw.keys():
                    break
                for key in bad:
                    raw.pop(str(key), None)
        return cls()

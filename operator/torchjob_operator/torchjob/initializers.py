"""``spec.initializers``: which initialisers must run, which are done, which failed, and so
what to do (PURE). ``initializing`` turns the answer into the job's decision.

The rules:

* An initialiser is one pod (``resources.initializers``), created while the job has created
  no worker yet (``status.createdGeneration`` absent) and the plan holds it in ``Pending``
  with reason ``Initializing``. No worker pod exists before every initialiser succeeded.
* Its outcome is recorded in ``status.initializers[]`` (phase, bytes, message,
  completionTime), keyed by kind and URI: a recorded ``Succeeded`` is final. A restart, a
  disruption or a rescale starts a new generation of workers and never runs an initialiser
  again (and ``torchjob initialize`` finds its completion marker in the volume if it did).
* A pod that exits non-zero fails the job at once (``Failed``, reason ``InitializerFailed``,
  the termination message quoted: a bad URI, bad credentials naming the bucket). Retrying
  would not fix a wrong URI or a wrong Secret, and transient errors are retried inside
  ``torchjob initialize``. A pod the cluster took away (evicted, its node lost) is created
  again. A pod that cannot start (a missing Secret, an image that cannot be pulled) keeps
  the job ``Initializing`` with the kubelet's reason in the message: that is fixable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torchjob import contract
from torchjob.api.models import InitializerStatus, TorchJobSpec
from torchjob.rules import initializer as rules
from torchjob.rules.loss import OUTSIDE_SIGNALS, signal_of_exit
from torchjob_operator.common.events import Event
from torchjob_operator.torchjob.observed import (
    CANNOT_START_REASONS,
    IMAGE_PULL_REASONS,
    NODE_LOSS_REASONS,
    PodPhase,
    phase_of,
)


class Stage(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class InitPod:
    """An initialiser pod as the decision needs it."""

    kind: str
    name: str
    phase: PodPhase = PodPhase.PENDING
    exit_code: int | None = None
    line: str = ""
    """Its termination message's summary line (``rules.summary`` on success, the error else)."""
    waiting: str = ""
    """Why it cannot start: a kubelet reason (``ImagePullBackOff`` ...) or ``Unschedulable``
    (a claim that does not exist ...); else ''."""
    waiting_message: str = ""
    finished_at: str | None = None
    deleting: bool = False
    disrupted: bool = False
    """The cluster took it away (evicted, node lost): not the initialiser's failure."""


def init_pod_view(pod: Mapping[str, Any]) -> InitPod | None:
    """An initialiser pod dict -> ``InitPod``; None for any other pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(contract.LABEL_ROLE) != contract.ROLE_INITIALIZER:
        return None
    status = pod.get("status") or {}
    phase = phase_of(status)
    exit_code, line, finished, waiting, waiting_message = None, "", None, "", ""
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        done = state.get("terminated")
        if done and done.get("exitCode") is not None:
            exit_code, finished = int(done["exitCode"]), done.get("finishedAt")
            said = contract.parse_termination_message(done.get("message") or "")
            line = said.line if said else (done.get("reason") or "")
        w = state.get("waiting") or {}
        if w.get("reason") in IMAGE_PULL_REASONS | CANNOT_START_REASONS:
            waiting, waiting_message = w["reason"], w.get("message") or ""
    conditions = {c.get("type"): c for c in status.get("conditions") or ()}
    placed = conditions.get("PodScheduled") or {}
    if not waiting and placed.get("status") == "False" and placed.get("reason") == "Unschedulable":
        waiting, waiting_message = "Unschedulable", placed.get("message") or ""  # a missing claim
    target = conditions.get("DisruptionTarget") or {}
    disrupted = target.get("status") == "True" or status.get("reason") in NODE_LOSS_REASONS
    return InitPod(
        kind=str(labels.get(rules.LABEL_KIND, "")),
        name=str(meta.get("name", "")),
        phase=phase,
        exit_code=exit_code,
        line=line,
        waiting=waiting,
        waiting_message=waiting_message,
        finished_at=finished,
        deleting=meta.get("deletionTimestamp") is not None,
        # Taken away while it ran (killed by a signal from outside), not ended on its own.
        disrupted=disrupted and (exit_code is None or signal_of_exit(exit_code) in OUTSIDE_SIGNALS),
    )


@dataclass(frozen=True)
class Record:
    """One ``status.initializers[]`` entry."""

    kind: str
    uri: str
    stage: Stage
    pod: str | None = None
    bytes: int | None = None
    message: str = ""
    completion_time: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return InitializerStatus(
            name=self.kind,
            uri=self.uri,
            phase=self.stage.value,
            pod=self.pod,
            bytes=self.bytes,
            message=self.message,
            completion_time=self.completion_time,
        ).to_wire()


@dataclass(frozen=True)
class InitGate:
    """The initialisers of one job, decided: what the status says of each, the pods to
    create (kinds) or delete (names), and the Events of what finished in this pass."""

    records: tuple[Record, ...]
    create: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()

    @property
    def done(self) -> bool:
        return all(r.stage == Stage.SUCCEEDED for r in self.records)

    @property
    def failed(self) -> Record | None:
        return next((r for r in self.records if r.stage == Stage.FAILED), None)

    def status(self) -> list[dict[str, Any]]:
        return [r.to_wire() for r in self.records]

    def progress(self) -> str:
        """e.g. ``dataset Running, model Succeeded (1.0 GiB)``."""
        return ", ".join(
            f"{r.kind} {r.stage.value}"
            + (f" ({size(r.bytes)})" if r.bytes is not None else "")
            + (f": {r.message}" if r.stage == Stage.PENDING and r.message else "")
            for r in self.records
        )


def size(n: int) -> str:
    """``n`` bytes for a person: ``512 B``, ``1.5 KiB`` ... ``1.0 GiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def recorded(status: Mapping[str, Any] | None) -> dict[str, Record]:
    """``status.initializers`` by kind (malformed entries read as absent)."""
    found: dict[str, Record] = {}
    for raw in (status or {}).get("initializers") or ():
        try:
            s = InitializerStatus.model_validate(raw)
            found[s.name] = Record(
                s.name, s.uri, Stage(s.phase), s.pod, s.bytes, s.message, s.completion_time
            )
        except ValueError:
            continue
    return found


def decide_initializers(
    spec: TorchJobSpec, status: Mapping[str, Any] | None, pods: Sequence[InitPod]
) -> InitGate | None:
    """The initialisers of a job with ``spec.initializers`` (None without): recorded
    outcomes are final, otherwise each one's pod says where it is."""
    if spec.initializers is None:
        return None
    before = recorded(status)
    by_kind = {p.kind: p for p in pods}
    records: list[Record] = []
    create: list[str] = []
    delete: list[str] = []
    events: list[Event] = []
    for kind, source in spec.initializers.sources().items():
        old = before.get(kind)
        if (
            old is not None
            and old.uri == source.uri
            and old.stage
            in (
                Stage.SUCCEEDED,
                Stage.FAILED,
            )
        ):
            records.append(old)
            continue
        pod = by_kind.get(kind)
        if pod is None:
            create.append(kind)
            records.append(Record(kind, source.uri, Stage.PENDING, message="creating its pod"))
            continue
        name = pod.name
        rec = Record(kind, source.uri, Stage.PENDING, name)
        if pod.deleting:
            rec = Record(kind, source.uri, Stage.PENDING, name, message="its pod is going away")
        elif pod.disrupted and pod.phase == PodPhase.FAILED:
            delete.append(pod.name)
            rec = Record(kind, source.uri, Stage.PENDING, name, message="disrupted; starting again")
        elif pod.phase == PodPhase.SUCCEEDED:
            got = rules.fetched_bytes(pod.line)
            rec = Record(kind, source.uri, Stage.SUCCEEDED, name, got, pod.line, pod.finished_at)
            events.append(
                Event.of(
                    "InitializerSucceeded",
                    kind=kind,
                    size="?" if got is None else size(got),
                    uri=source.uri,
                )
            )
        elif pod.phase == PodPhase.FAILED:
            why = pod.line or f"exit code {pod.exit_code}"
            rec = Record(kind, source.uri, Stage.FAILED, name, None, why, pod.finished_at)
        elif pod.waiting:
            detail = f"{pod.waiting}: {pod.waiting_message}".rstrip(": ")
            rec = Record(kind, source.uri, Stage.PENDING, name, message=detail)
        elif pod.phase == PodPhase.RUNNING:
            rec = Record(kind, source.uri, Stage.RUNNING, name, message="fetching")
        records.append(rec)
    return InitGate(tuple(records), tuple(create), tuple(delete), tuple(events))


def created_events(job: str, spec: TorchJobSpec, kinds: Sequence[str]) -> tuple[Event, ...]:
    """One ``CreatedInitializer`` Event per pod the plan creates."""
    init = spec.initializers
    if init is None:
        return ()
    sources = init.sources()
    return tuple(
        Event.of("CreatedInitializer", pod=rules.pod_name(job, k), kind=k, uri=sources[k].uri)
        for k in kinds
    )

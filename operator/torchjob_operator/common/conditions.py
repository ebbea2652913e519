"""Status conditions: reasons with their meaning, and a setter that keeps transition times stable.

Condition types follow Kubernetes conventions (metav1.Condition). ``Ready`` and
``Stalled`` follow kstatus, so Flux's health checks (kstatus) read a TorchJob
without custom code: Ready=True while training, after success and while suspended
(as kstatus treats a suspended batch/v1 Job); Stalled=True once it failed for good.
Argo CD does not read kstatus for custom resources: it needs the Lua health script
in ``charts/torchjob-operator/argocd/`` (docs/fits-your-cluster.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

# Condition types
CREATED: Final = "Created"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUSPENDED: Final = "Suspended"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
READY: Final = "Ready"
STALLED: Final = "Stalled"
COMPLETE: Final = "Complete"
"""A TorchTune's: its study ended with every trial it wanted."""
PLACED: Final = "Placed"
"""A TorchJob with ``spec.placement`` and a Kueue topology: every scheduled worker runs in the
job's domains (False: some spilled over, which only a preferred request allows)."""
SPREAD: Final = "Spread"
"""An elastic ``KeepSurvivors`` job with ``replaceBeforeLeaving`` and the Node watch: how its
members sit on the nodes, and why a crowded job is or is not moved (torchjob/spread.py)."""
CONDITION_TYPES: Final = frozenset(
    {
        CREATED,
        RUNNING,
        RESTARTING,
        SUSPENDED,
        SUCCEEDED,
        FAILED,
        READY,
        STALLED,
        COMPLETE,
        PLACED,
        SPREAD,
    }
)
"""Every condition type either controller writes."""

# Every reason the operator writes into a condition or an Event (CamelCase), with the
# message template it goes with. ``Decision.transition`` and ``Event`` refuse any other.
REASONS: Final[Mapping[str, str]] = {
    # conditions (and the Event of the transition)
    "PodsCreated": "created {replicas} worker pods for generation {generation}",
    "WorkerPodsCreated": "worker pods created (generation {generation})",
    "WaitingForPods": "{ready}/{replicas} workers ready",
    "WaitingForPodsCreation": "waiting for worker pods to be created",
    "WaitingForEarlierJob": "waiting for {what} of an earlier TorchJob named {name} to be "
    "deleted before creating this one's",
    "AllWorkersRunning": "all {replicas} workers are running (generation {generation})",
    "WorkerFailed": "{detail}; {explanation}",
    "WorkerDisrupted": "{detail}; disruption {disruptions}, the restart budget is not charged",
    "ShrunkAfterDisruption": "{detail}; disruption {disruptions}, the restart budget is not "
    "charged; continuing at once with {replicas} of {target} workers (min {min}) while the "
    "replacement starts",
    "GenerationStarted": "generation {generation} ({cause}): world size {world}; left: {left};"
    " joined: {joined}",
    "Recovered": "generation {generation} trained again {seconds}s after the loss, restored from"
    " {source}, {lost} steps done again",
    "ShrunkAfterLoss": "{detail}; {explanation}; continuing at once with {replicas} of "
    "{target} workers (min {min}) while the replacement starts",
    "StandbyTookOver": "{detail}; {counted}; standby {pods} took the lost place at once "
    "(generation {generation}, {replicas} workers); a new standby starts",
    "ReplacedBeforeLeaving": "{detail}; {counted}; {pods}, started while the leaving pod "
    "trained on through its grace period, took its place at once (generation {generation}, "
    "{replicas} workers)",
    "Rescaled": "replicas changed from {old} to {replicas}; starting generation {generation}",
    "InDomains": "all {count} scheduled workers run in the job's domains at {level}",
    "SpilledOver": "{pods} outside the job's domains at {level}: the request is preferred, so "
    "the scheduler put them where there was room",
    "EvenlySpread": "members per node: {counts}",
    "Crowded": "members per node: {counts}; one node holds more than half of them, or a loss "
    "came without notice: members move to the emptier nodes once the job has trained "
    "{settle}s at full size",
    "CrowdedKept": "members per node: {counts}; kept as they are: every loss so far came with "
    "notice, and a noticed node's members are replaced together in one re-formation, so "
    "evening them out would cost a re-formation for nothing",
    "MovingMembers": "moving {count} member(s) off crowded nodes (members per node: {counts}); "
    "their replacements take their places in one re-formation",
    "BackoffWaiting": "restarting in {seconds}s",
    "Suspended": "the job is suspended; its pods were deleted",
    "WaitingForAdmission": "waiting for Kueue to admit Workload {workload} (LocalQueue {queue}); "
    "no pod runs before",
    "TopologyUnsatisfiable": "Kueue cannot admit Workload {workload}: no domain of the "
    "{how} topology level {level} (spec.placement) has room for the job ({detail}); the job "
    "waits without pods until one has",
    "AdmissionEvicted": "Kueue evicted Workload {workload} ({detail}); the workers stop and "
    "checkpoint, the job resumes from it when admitted again; the restart budget is not charged",
    "Resumed": "the job resumed",
    "AllWorkersSucceeded": "all {replicas} workers exited 0",
    "PermanentFailure": "{detail}; {explanation}",
    "RestartLimitExceeded": "{detail}; {explanation}",
    "DeadlineExceeded": "the job ran longer than spec.runPolicy.activeDeadlineSeconds={deadline}",
    "InvalidSpec": "{detail}",
    "RuntimeNotFound": "{detail}",
    "InvalidRuntimeMerge": "{detail}",
    "FailedCreatePod": "{detail}",
    "ImagePullFailed": "{stuck} of {replicas} workers cannot start (e.g. {pod}: {detail})",
    "ContainerCannotStart": "{stuck} of {replicas} workers cannot start (e.g. {pod}: {detail})",
    "Unschedulable": "{count} of {replicas} workers cannot be scheduled (e.g. {pod}: {detail})",
    "WaitingForCapacity": "only {placed} of at least {min} workers fit; waiting for capacity",
    "ScaledDown": "{lost} of {old} workers unschedulable for {after}s; continuing with {placed} "
    "(min {min}) from the latest checkpoint",
    "ScaledUp": "capacity for {want} more workers; growing from {old} to {replicas} from the "
    "latest checkpoint",
    "GroupBroken": "every one of the {count} members of generation {generation} left its "
    "group, broken with their workers alive and no pod lost; the next generation re-forms the "
    "same members ({charged})",
    "PhaseIs": "the job is {phase}",
    # Events only
    "RuntimeResolved": "{runtime} (resourceVersion {version}) resolved and pinned in "
    "status.runtime: later edits of it do not change this job",
    "KeptSurvivors": "generation {generation} keeps {count} running worker(s) ({pods}); "
    "the rest are replaced",
    "CreatedService": "created headless service {name}",
    "CreatedPodGroup": "created PodGroup {name} (minMember {min})",
    "FailedCreatePodGroup": "{detail}",
    "CreatedWorkerAccount": "created {kinds} {name}",
    "CreatedPod": "created {pods} (generation {generation})",
    "CreatedProbe": "probing capacity with pod {name}",
    "KeptOffNodes": "{pods} kept off {nodes}: a node that is going or not talking to the API "
    "server would take a pod it never runs",
    "PlacingAgain": "{pods} could not be scheduled, kept off {nodes}, which need avoiding no "
    "more: created again",
    "CreatedJoiner": "replacement {pods} starting for generation {generation}; it joins at a "
    "step boundary once it runs",
    "ReplacingBeforeLeaving": "{leaving} was given notice: it trains on while its "
    "replacement {pods} starts, which then takes its place",
    "ReplacingLater": "{leaving} was given notice: it trains on, and its replacement is "
    "created at {at}, {lead} s before it goes (the time this job's replacements need to start, "
    "with room to spare; elastic.replacementLeadSeconds)",
    "KeepingDonor": "every member was given notice: {donor} stays one generation more, "
    "beside the replacements, which take the state from its memory (not the last checkpoint); "
    "it goes once that generation has made a step",
    "Rebalancing": "the job's pods per node: {counts}; moving {leaving}: the replacements "
    "{pods} start off {keep_off} and take their places at one re-formation",
    "DeletedPod": "deleted {pods}",
    "CreatedWorkload": "created Workload {name} in LocalQueue {queue} ({count} pods)",
    "DeletedWorkload": "deleted Workload {name}: the job's pod set changed; a new one queues",
    "ReleasedQuota": "no worker left after the eviction of Workload {name}: its quota is "
    "handed back and Kueue queues it again",
    "FinishedWorkload": "marked Workload {name} Finished ({result})",
    "FailedWorkload": "{detail}",
    "KueueNotInstalled": "queue {queue} is set but the cluster serves no Kueue Workload API "
    "(kueue.x-k8s.io/v1beta2): the queue label is inert and the job runs without an admission",
    # spec.initializers (torchjob_operator.torchjob.initializers)
    "Initializing": "waiting for the initializers before creating workers: {progress}",
    "InitializerFailed": "the {kind} initializer ({uri}) failed: {detail}",
    "InitializerSucceeded": "the {kind} initializer put {size} from {uri} into the volume",
    "CreatedInitializer": "created initializer pod {pod} ({kind} from {uri})",
    # TorchTune studies (torchjob_operator.torchtune)
    "TrialPruned": "{trial}: {detail}",
    "TooManyFailedTrials": "{failed} trials failed, more than spec.maxFailedTrials={limit}",
    "StudyDeadlineExceeded": "the study ran longer than spec.activeDeadlineSeconds={deadline}",
    "StudySucceeded": "{count} trials; best: {best}",
    "TrialsRunning": "{running} running, {done}/{limit} finished",
    "StudyFailed": "the study failed",
}
SHOWN_AS: Final[Mapping[str, str]] = {
    "WaitingForPodsCreation": "WaitingForPods",
    "WorkerPodsCreated": "PodsCreated",
    "StudyDeadlineExceeded": "DeadlineExceeded",
}
"""Templates that stand for another reason: the condition shows that one
(``WaitingForPodsCreation`` is shown as ``WaitingForPods``)."""


def message(reason: str, **values: Any) -> str:
    """The message for ``reason``, filled with ``values``."""
    return REASONS[reason].format(**values)


def declared(reason: str) -> bool:
    """Whether ``reason`` is one the operator writes (a key of ``REASONS``, or what one of
    them is shown as)."""
    return reason in REASONS or reason in SHOWN_AS.values()


def say(reason: str, **values: Any) -> tuple[str, str]:
    """(the reason as users see it, its message)."""
    return SHOWN_AS.get(reason, reason), message(reason, **values)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    observed_generation: int | None,
) -> tuple[list[dict[str, Any]], bool]:
    """Return (new conditions, changed). ``lastTransitionTime`` moves only when status flips."""
    wanted = "True" if status else "False"
    out: list[dict[str, Any]] = []
    changed = True
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        found = True
        transition = cond.get("lastTransitionTime") or now
        if cond.get("status") != wanted:
            transition = now
        new = {
            "type": type_,
            "status": wanted,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
            "observedGeneration": observed_generation,
        }
        changed = any(cond.get(k) != v for k, v in new.items())
        out.append(new)
    if not found:
        out.append(
            {
                "type": type_,
                "status": wanted,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": observed_generation,
            }
        )
    return out, changed


def set_conditions(
    conditions: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``conditions`` with each of ``new`` (whole condition dicts, as another API's status
    holds them, such as a Kueue Workload's) set by :func:`set_condition`; a missing
    ``observedGeneration`` stays missing."""
    out: list[dict[str, Any]] = [dict(c) for c in conditions]
    for n in new:
        out, _ = set_condition(
            out,
            type_=n["type"],
            status=n["status"] == "True",
            reason=n["reason"],
            message=n["message"],
            now=n["lastTransitionTime"],
            observed_generation=n.get("observedGeneration"),
        )
    return [{k: v for k, v in c.items() if v is not None} for c in out]

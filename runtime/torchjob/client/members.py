"""``torchjob run``'s view of a generation: a local pod's process as a
``torchjob.rules.Member``, and the decision over the generation (the operator's rules,
``torchjob.rules``, with local processes as the members). Pure."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from torchjob import contract
from torchjob.rules import (
    Counters,
    Loss,
    Member,
    MemberPhase,
    Outcome,
    RestartRules,
    Verdict,
    classify,
    deadline_left,
    decide_restart,
    judge_generation,
)


@dataclass(frozen=True)
class LocalMember:
    """One local pod's process as a ``torchjob.rules.Member``."""

    name: str
    index: int
    phase: MemberPhase = MemberPhase.RUNNING
    exit_code: int | None = None
    reason: str = ""
    finished_at: datetime | None = None
    summary: str = ""
    peer_failure: bool = False
    deleting: bool = False
    signal: int | None = None
    """The signal that killed it (or, its runtime said, one of its worker processes)."""
    oom: bool = False
    """Evidence of the OOM killer (the cgroup's ``oom_kill`` counter, or its runtime's word)."""
    taken: str | None = None
    """Why it was taken away (a test's preemption; ``torchjob run`` itself takes none)."""

    @property
    def active(self) -> bool:
        return self.phase in (MemberPhase.PENDING, MemberPhase.RUNNING)

    @property
    def loss(self) -> Loss | None:
        return classify(
            ended=self.phase == MemberPhase.FAILED,
            exit_code=self.exit_code,
            signal=self.signal,
            oom=self.oom,
            taken=self.taken,
        )


def process_member(
    job: str,
    index: int,
    returncode: int | None,
    finished_at: datetime | None = None,
    *,
    oom: bool = False,
    said: contract.TerminationSummary | None = None,
) -> LocalMember:
    """A local pod from its process's return code (None: still running), the OOM killer's
    evidence, and its termination message (``said``), as the operator sees a pod: a process
    killed by signal ``n`` reports ``128 + n``; a runtime that said one of its worker
    processes was SIGKILLed (by the OOM killer or not) counts as that kill; one that said it
    failed only because a peer did is a peer failure."""
    name = contract.worker_pod_name(job, index)
    if returncode is None:
        return LocalMember(name, index)
    if returncode == 0:
        return LocalMember(name, index, MemberPhase.SUCCEEDED, 0, "Completed", finished_at)
    sig = -returncode if returncode < 0 else None
    code = 128 - returncode if returncode < 0 else returncode
    reason = signal.Signals(sig).name if sig is not None else "Error"
    if said is not None and said.killed and sig is None:
        sig, code, oom = signal.SIGKILL, 128 + signal.SIGKILL, oom or said.oom
    return LocalMember(
        name,
        index,
        MemberPhase.FAILED,
        code,
        reason,
        finished_at,
        summary=said.line if said else "",
        peer_failure=said.peer_failure if said else False,
        signal=sig,
        oom=oom,
    )


@dataclass(frozen=True)
class LocalDecision:
    """What ``torchjob run`` does after looking at a generation (see ``decide``)."""

    action: Literal["continue", "succeed", "restart", "fail"]
    counters: Counters
    reason: str = ""
    """The condition reason the operator would give (``WorkerFailed``, ``PermanentFailure`` ...)."""
    detail: str = ""
    backoff_s: float = 0.0
    culprit: int | None = None


def decide(
    rules: RestartRules,
    deadline_s: int | None,
    counters: Counters,
    members: Sequence[Member],
    *,
    start_time: datetime,
    now: datetime,
) -> LocalDecision:
    """The local launcher's decision over one generation: the operator's rules
    (``torchjob.rules``), with local processes as the members. ``rules`` are the manifest's
    ``spec.failurePolicy`` (``RestartRules.of``), ``deadline_s`` its
    ``activeDeadlineSeconds``."""
    left = deadline_left(deadline_s, start_time, now)
    if left is not None and left <= 0:
        return LocalDecision(
            "fail", counters, "DeadlineExceeded", f"activeDeadlineSeconds={deadline_s} exceeded"
        )
    j = judge_generation(members, replicas=len(members))
    culprit = j.culprit.index if j.culprit is not None else None
    if j.outcome is Outcome.SUCCEEDED:
        return LocalDecision("succeed", counters, "AllWorkersSucceeded")
    if j.outcome in (Outcome.DISRUPTED, Outcome.FAILED) and j.loss is not None:
        d = decide_restart(counters, rules, j.loss, workers=len(members))
        if d.verdict is Verdict.DISRUPTED:
            return LocalDecision("restart", d.counters, "WorkerDisrupted", j.detail, 0.0, culprit)
        detail = f"{j.detail}; {d.explanation}"
        if d.restarts:
            return LocalDecision(
                "restart", d.counters, "WorkerFailed", detail, d.backoff_s, culprit
            )
        return LocalDecision("fail", d.counters, d.verdict.value, detail, 0.0, culprit)
    return LocalDecision("continue", counters)

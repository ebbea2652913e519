"""What a lost worker was, and so what it costs: the one loss model of every launcher.

A launcher observes a worker end (a pod's container, a local "pod" process of ``torchjob
run``, a worker process of a local group) and ``classify`` turns what it saw into one
:data:`Loss`, the same for the same evidence wherever it was seen:

* :class:`Disruption`: taken away by the platform, never charged: a ``DisruptionTarget``,
  an eviction, a lost node, a deletion by someone else, and a process killed by a signal
  it does not send itself (``OUTSIDE_SIGNALS``: SIGKILL, SIGTERM, SIGINT, SIGHUP) with no
  evidence of the OOM killer. *Why:* a SIGKILL with no OOM is the platform's doing (a
  ``kill -9``, a lost machine, a node agent), like an eviction; charging it would end
  healthy jobs, and the laptop and the cluster must agree.
* :class:`Failure`: the job's own, charged to the restart budget: a non-zero exit, an
  exception, a hang, and an **OOM kill** (a container ``OOMKilled``, or the runtime's
  evidence: the cgroup's ``oom_kill`` counter moved when the worker died, said as ``oom`` in
  the termination message). *Why:* the job's own memory use recurs after a restart, so the
  budget must bound it. A permanent exit code (``spec.failurePolicy``) fails at once.
* :class:`Silent`: a peer whose heartbeat stopped (``status.silentWorkers``), never charged:
  the driver beats for a live process whatever its GIL does, so silence means the machine or
  its network is gone.
* :class:`Stopped`: the worker exited with ``contract.STOPPED_EXIT_CODE``: it stopped as
  asked (a graceful stop, a drain, the job's deletion), never charged, never a failure.

A worker whose collective failed or timed out because a peer was lost (``peer_failure``, from
its termination message) is no loss of its own: ``judge_generation`` blames the lost peer.

``ElasticRules`` is the elastic half: how far a loss may shrink the group and when a shrunk
group grows back (``torchjob.rules.resize``). Pure, standard library and contract only.
"""

from __future__ import annotations

import signal as _signal
from dataclasses import dataclass

from torchjob.termination import STOPPED_EXIT_CODE

OUTSIDE_SIGNALS = frozenset({_signal.SIGKILL, _signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP})
"""Signals a worker process does not send itself: the machine or pod went away, a node agent,
a preemption, Ctrl-C (the OOM killer's SIGKILL is told apart by its evidence)."""

SIGNAL_EXIT_BASE = 128
"""A container (or shell) whose process died of signal ``n`` exits ``128 + n``."""


def signal_of_exit(exit_code: int | None) -> int | None:
    """The signal a container's exit code says killed its process (``137`` -> SIGKILL), else
    None (an exit of its own)."""
    if exit_code is None or not SIGNAL_EXIT_BASE < exit_code < SIGNAL_EXIT_BASE + 65:
        return None
    return exit_code - SIGNAL_EXIT_BASE


def _signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass(frozen=True)
class Disruption:
    """Taken away by the platform: never charged."""

    reason: str

    @property
    def why(self) -> str:
        return self.reason


@dataclass(frozen=True)
class Failure:
    """The job's own: charged to the restart budget (unless permanent: the job fails)."""

    exit_code: int | None
    signal: int | None = None
    oom: bool = False
    """Killed by the OOM killer (a container ``OOMKilled``, or the cgroup's evidence)."""
    permanent: bool | None = None
    """Overrides the exit-code classes (``PyTorchTrainer.train``: never permanent); None: the
    classes of ``RestartRules`` decide."""

    @property
    def hard(self) -> bool:
        """Killed with no grace (the OOM killer's SIGKILL): the survivors run on and may hold
        the last completed step in memory."""
        return self.oom or self.signal == _signal.SIGKILL

    @property
    def why(self) -> str:
        if self.oom:
            return "killed by the OOM killer"
        if self.signal is not None:
            return f"killed by {_signal_name(self.signal)}"
        return "exit code unknown" if self.exit_code is None else f"exit code {self.exit_code}"


_SILENT_HOW = {
    "store": "its store did not answer",
    "host": "its host did not answer",
    "absent": "it never joined the forming group",
    "node": "a joiner on the node of a silent member",
}


@dataclass(frozen=True)
class Silent:
    """A peer found silent for ``seconds`` by ``seen_by``: never charged. ``how``: its
    heartbeat stopped (``heartbeat``), the store it serves did not answer while the group
    formed (``store``), its host did not answer a connect (``host``: a sweep of the
    members once another was found silent, or while the group formed), or its host answered
    but it never entered the rendezvous of a group still forming (``absent``); or, the
    operator's inference, a joiner on the node of a member found silent (``node``)."""

    seconds: float
    seen_by: str
    how: str = "heartbeat"

    @property
    def why(self) -> str:
        what = _SILENT_HOW.get(self.how, "no heartbeat")
        return f"silent for {self.seconds:.0f}s ({what}; seen by {self.seen_by})"


@dataclass(frozen=True)
class Stopped:
    """Stopped as asked (exit code ``contract.STOPPED_EXIT_CODE``): never charged."""

    @property
    def why(self) -> str:
        return f"stopped as asked (exit code {STOPPED_EXIT_CODE})"


Loss = Disruption | Failure | Silent | Stopped


def charged(loss: Loss) -> bool:
    """Whether the loss costs a restart of the budget (only a :class:`Failure` does)."""
    return isinstance(loss, Failure)


def classify(
    *,
    ended: bool,
    exit_code: int | None = None,
    signal: int | None = None,
    oom: bool = False,
    taken: str | None = None,
    silent: Silent | None = None,
) -> Loss | None:
    """The one classifier: what a launcher observed of one worker -> its loss, or None (it
    runs, or it succeeded).

    ``ended``: the worker ended unsuccessfully (a failed pod, a non-zero exit); ``exit_code``
    and ``signal`` say how (a container's ``128 + n`` is read with ``signal_of_exit``);
    ``oom``: evidence of the OOM killer; ``taken``: why the platform took it away
    (``DisruptionTarget``, eviction, node loss, deletion by someone else); ``silent``: its
    peers reported it silent.
    """
    if taken is not None:
        return Disruption(taken)
    if silent is not None:
        return silent
    if not ended:
        return None
    if oom:
        return Failure(exit_code, signal, oom=True)
    if signal is None and exit_code == STOPPED_EXIT_CODE:
        return Stopped()
    if signal is not None and signal in OUTSIDE_SIGNALS:
        return Disruption(f"killed by {_signal_name(signal)}")
    return Failure(exit_code, signal)


@dataclass(frozen=True)
class ElasticRules:
    """An elastic group's bounds, as plain values, for every launcher: the operator (from
    ``spec.elastic``), TorchTrainer's local group (``ScalingConfig``), ``torchjob run``."""

    floor: int
    """The fewest workers the group goes on with (``minReplicas``, ``min_workers``)."""
    ceiling: int
    """The size it grows back to (``min(replicas, maxReplicas)``, ``max_workers``)."""
    grow_cooldown_s: float = 0.0
    """The least age of a generation before it grows back (flapping capacity cannot thrash)."""
    checkpoint_before_grow: bool = True
    """Grow back only once the generation committed a checkpoint (the resize loses no work);
    False where the survivors re-form in place from their memory (KeepSurvivors pods)."""
    shrink_on_loss: bool = True
    """A loss shrinks the group to its survivors (``shrinkOnDisruption``) while at least
    ``floor`` remain; otherwise the lost workers are replaced."""

    @property
    def elastic(self) -> bool:
        return self.floor < self.ceiling

    def shrinks_to(self, survivors: int) -> bool:
        """A loss that leaves ``survivors`` workers goes on with them."""
        return self.shrink_on_loss and survivors >= 1 and self.floor <= survivors < self.ceiling

"""The job rules: the decisions every launcher shares, pure, typed, torch-free and
Kubernetes-free, over plain values (counters and policies are passed in).

One set of rules for the operator (its TorchJob planner, the Kubernetes view),
``torchjob run`` (``torchjob.client.local``), ``TorchTrainer``'s controller
(``torchjob.train.trainer`` through ``torchjob.launch.policy``) and
``PyTorchTrainer.train`` (``torchjob.sgd.trainer``), so a job fails, restarts and
counts disruptions the same way on a laptop and on a cluster:

* ``loss``: the one loss model: ``classify`` turns what a launcher observed of a worker
  (exit code, signal, OOM evidence, taken away, silent, stopped as asked) into a ``Loss``
  (``Disruption | Failure | Silent | Stopped``: only a ``Failure`` is charged), and
  ``ElasticRules`` (floor, ceiling, cooldown, the checkpoint before a grow, shrink on a loss).
* ``member``: what a launcher observes of one worker (a pod, or a local process), as a
  ``Member`` protocol, and ``judge_generation``: healthy, succeeded, failed (root
  cause) or disrupted.
* ``failure``: the failure policy as plain values (``RestartRules``, built from the
  CRD's ``spec.failurePolicy`` by ``RestartRules.of``) and the failure verdict:
  exit-code classes, the restart budget, the backoff (overflow-safe for any input).
* ``generation``: the counters (generation, restarts, disruptions) and how each
  decision moves them; the ``activeDeadlineSeconds`` clock.
* ``restart``: ``decide_restart``, the one decision after a generation is judged lost
  (to a ``Loss``, under ``RestartRules`` and ``ElasticRules``): restart with backoff, fail,
  count a disruption or shrink, with the counters moved, and where the state comes from
  (``Recovery``: the survivors' memory, or storage).
* ``resize``: ``grow_back``, when a shrunk elastic group grows back.

Two builders live here too because both the operator and the local launchers need them
and they sit above ``torchjob.api``: ``worker_env`` (the env contract of one worker) and
``trial`` (a tuning trial's config and how it merges into ``train_loop_config``).

Nothing here imports torch, kubernetes or kopf (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

from torchjob.rules.failure import (
    FailureDecision,
    RestartRules,
    Verdict,
    backoff_seconds,
    decide_failure,
    is_permanent,
)
from torchjob.rules.generation import Counters, deadline_left
from torchjob.rules.loss import (
    OUTSIDE_SIGNALS,
    Disruption,
    ElasticRules,
    Failure,
    Loss,
    Silent,
    Stopped,
    charged,
    classify,
    signal_of_exit,
)
from torchjob.rules.member import (
    ROOT_CAUSE_GRACE,
    Judgement,
    Member,
    MemberPhase,
    Outcome,
    judge_generation,
)
from torchjob.rules.resize import Noop, Resize, ScalingDecision, grow_back
from torchjob.rules.restart import Recovery, RestartDecision, decide_restart

__all__ = [
    "OUTSIDE_SIGNALS",
    "ROOT_CAUSE_GRACE",
    "Counters",
    "Disruption",
    "ElasticRules",
    "Failure",
    "FailureDecision",
    "Judgement",
    "Loss",
    "Member",
    "MemberPhase",
    "Noop",
    "Outcome",
    "Recovery",
    "Resize",
    "RestartDecision",
    "RestartRules",
    "ScalingDecision",
    "Silent",
    "Stopped",
    "Verdict",
    "backoff_seconds",
    "charged",
    "classify",
    "deadline_left",
    "decide_failure",
    "decide_restart",
    "grow_back",
    "is_permanent",
    "judge_generation",
    "signal_of_exit",
]

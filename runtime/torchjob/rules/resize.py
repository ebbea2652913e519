"""When a shrunk elastic group grows back toward its ceiling (``ElasticRules``).

It grows once capacity for more workers exists, ``grow_cooldown_s`` passed since the
generation started (so flapping capacity cannot thrash) and, where the rules ask for it
(``checkpoint_before_grow``), the generation committed at least one checkpoint (so the resize
loses no work). Every launcher asks :func:`grow_back`: ``TorchTrainer``'s local group
(``torchjob.launch.policy``) with its processes, the operator (``torchjob_operator.torchjob.
elastic``) with what its capacity probes or its joiners prove.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchjob.rules.loss import ElasticRules


@dataclass(frozen=True)
class Resize:
    """Stop the running generation at its next checkpoint and re-form it with ``num_workers``."""

    num_workers: int
    reason: str


@dataclass(frozen=True)
class Noop:
    """Keep going."""

    reason: str = ""
    """Why not now (empty: nothing to grow)."""


ScalingDecision = Resize | Noop


def grow_back(
    rules: ElasticRules,
    *,
    num_workers: int,
    available_workers: int,
    checkpoints_in_generation: int,
    generation_age_s: float,
) -> ScalingDecision:
    """Whether a group of ``num_workers`` grows back now, and to how many."""
    target = min(rules.ceiling, available_workers)
    if target <= num_workers:
        return Noop()
    if rules.checkpoint_before_grow and checkpoints_in_generation < 1:
        return Noop("no checkpoint committed in this generation yet")
    if generation_age_s < rules.grow_cooldown_s:
        return Noop("cooling down")
    return Resize(
        num_workers=target,
        reason=f"capacity for {target} workers (running {num_workers}); growing back",
    )

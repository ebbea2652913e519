"""When a shrunk elastic group grows back toward its maximum size.

It grows once the current generation committed at least one checkpoint (so the
resize loses no work) and ``grow_cooldown_s`` passed since it started (so flapping
capacity cannot thrash). The operator's elastic sizing adds capacity probes on top
(``torchjob_operator.torchjob.elastic``); ``TorchTrainer`` asks this directly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resize:
    """Stop the running generation at its next checkpoint and re-form it with ``num_workers``."""

    num_workers: int
    reason: str


@dataclass(frozen=True)
class Noop:
    """Keep going."""


ScalingDecision = Resize | Noop


@dataclass(frozen=True)
class ScalingPolicy:
    min_workers: int
    max_workers: int
    grow_cooldown_s: float = 0.0

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.max_workers

    def decide(
        self,
        *,
        num_workers: int,
        checkpoints_in_generation: int,
        generation_age_s: float,
        available_workers: int,
    ) -> ScalingDecision:
        target = min(self.max_workers, available_workers)
        if target <= num_workers:
            return Noop()
        if checkpoints_in_generation < 1:
            return Noop()
        if generation_age_s < self.grow_cooldown_s:
            return Noop()
        return Resize(
            num_workers=target,
            reason=f"capacity for {target} workers (running {num_workers}); growing back",
        )

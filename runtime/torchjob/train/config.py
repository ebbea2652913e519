"""Run configuration, with Ray Train's names and defaults where they make sense.

Pydantic models, so a bad value is rejected when the config is built and the
error names the field (``ScalingConfig(num_workers=0)`` -> ``num_workers``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)


class ScalingConfig(_Config):
    """How many workers, on what.

    ``num_workers`` is an int (fixed group) or ``(min, max)``: an elastic group
    that keeps training with fewer workers when one is lost and grows back to
    ``max`` later.
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    """Accepted for Ray compatibility; locally only ``GPU`` is honoured (one per worker)."""
    trainer_resources: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    elastic_grow_cooldown_s: float = Field(default=30.0, ge=0)
    """Seconds a shrunk elastic group runs before it grows back (after at least one checkpoint)."""

    @field_validator("num_workers")
    @classmethod
    def _check_workers(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        if isinstance(v, tuple):
            lo, hi = v
            if lo < 1 or hi < lo:
                raise ValueError(f"num_workers=(min, max) needs 1 <= min <= max, got {v}")
        elif v < 1:
            raise ValueError(f"num_workers must be >= 1, got {v}")
        return v

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.max_workers


class CheckpointConfig(_Config):
    """Retention: keep the best ``num_to_keep`` by score (the newest is always kept too)."""

    num_to_keep: int | None = Field(default=None, ge=1)
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    async_commit: bool = True
    """``report(..., checkpoint=...)`` returns once the checkpoint's files are staged (hard
    links) and commits them to storage on a background thread, one at a time, with the same
    atomic protocol; a stop, a failure and the end of the run wait for it. ``False``: every
    report waits until its checkpoint is committed (Ray's behaviour)."""


class FailureConfig(_Config):
    """How many charged failures a run survives (``-1``: unlimited, as in Ray)."""

    max_failures: int = Field(default=0, ge=-1)
    fail_fast: bool = False

    @property
    def budget(self) -> int | None:
        return None if self.max_failures == -1 else self.max_failures


class RunConfig(_Config):
    """Where results go, and how failures and checkpoints are handled."""

    name: str | None = None
    storage_path: str | None = None
    """fsspec URL or local path; default ``~/torchjob_results`` (in a pod: TORCHJOB_CHECKPOINT_PATH)."""
    checkpoint_config: CheckpointConfig = CheckpointConfig()
    failure_config: FailureConfig = FailureConfig()
    progress: bool = True
    """Live rich progress in local mode."""
    verbose: int = 1
    callbacks: list[Any] | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str | None) -> str | None:
        if v is not None and (not v or "/" in v):
            raise ValueError(f"name must be a non-empty string without '/', got {v!r}")
        return v


class TorchConfig(_Config):
    """The process group: backend (``auto`` picks nccl on GPUs, else gloo) and collective timeout."""

    backend: Literal["auto", "gloo", "nccl"] | None = None
    init_method: str = "env"
    timeout_s: float = Field(default=300.0, gt=0)
    """A hung collective fails after this many seconds and names the rank that hung."""

    @model_validator(mode="after")
    def _default_backend(self) -> TorchConfig:
        if self.backend is None:
            object.__setattr__(self, "backend", "auto")
        return self

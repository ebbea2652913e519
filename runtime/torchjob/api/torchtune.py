"""Pydantic models of the TorchTune custom resource: a tuning study whose trials are TorchJobs.

Same group as TorchJob (``torchjob.io/v1alpha1``), generated into
``crds/torchjob.io_torchtunes.yaml`` by ``make crds``. The search space is a list of typed
parameters; ``spec.trialTemplate.spec`` is a whole TorchJob spec (validated by the same
schema and CEL rules as a TorchJob), and each trial's parameters reach its containers in
``TORCHJOB_TUNE_CONFIG`` exactly as ``TuneConfig(backend="cluster")`` does.

``status.trials`` is the study's storage: every trial with its parameters, its state, its
intermediate values and optuna's system attributes. The operator rebuilds an optuna study
from it on every reconcile (``torchjob_operator.torchtune``), so a restarted or failed-over
operator continues the study where the object says it is.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from torchjob.api.models import (
    CEL,
    GROUP,
    MAX_DEADLINE_SECONDS,
    Condition,
    ObjectMeta,
    TorchJobSpec,
    _Model,
)
from torchjob.api.tune_rules import NUMERIC, enforce_tune, tune_cel

KIND = "TorchTune"
PLURAL = "torchtunes"
SINGULAR = "torchtune"
SHORT_NAMES = ["tt"]

MAX_TRIALS = 2_000
"""status.trials is the study's storage: about 0.5 KB a trial of 10 progress steps (measured),
so 2,000 trials stay under the API server's 1.5 MiB object limit."""


class ParameterType(str, Enum):
    UNIFORM = "uniform"
    LOGUNIFORM = "loguniform"
    INT = "int"
    CATEGORICAL = "categorical"
    GRID = "grid"


_MSG_VALUES = "spec.searchSpace[].values must list at least one value for categorical and grid"
_MSG_NO_VALUES = "spec.searchSpace[].values is only for categorical and grid parameters"


class Parameter(_Model):
    """One hyperparameter. ``name`` is the key of the trial's config; ``a/b`` nests (``{"a": {"b": v}}``)."""

    model_config = ConfigDict(
        json_schema_extra={
            CEL: tune_cel("Parameter"),
            # CEL cannot see ``values`` (its items are untyped JSON, which the API server
            # leaves out of CEL's view), so "categorical and grid need values" is an OpenAPI
            # value validation. The API server reports the failing branch that matched most,
            # so the one with ``required`` comes first and names the field:
            # "spec.searchSpace[0].values: Required value".
            "anyOf": [
                {"required": ["values"], "properties": {"type": {"enum": ["categorical", "grid"]}}},
                {"properties": {"type": {"enum": ["uniform", "loguniform", "int"]}}},
            ],
        }
    )

    name: str = Field(min_length=1, max_length=253, pattern=r"^[A-Za-z_][A-Za-z0-9_./-]*$")
    type: ParameterType
    low: float | None = None
    high: float | None = Field(default=None, description="Inclusive (int too: low..high).")
    values: list[Any] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description=(
            "categorical: the choices; grid: every value is tried (required for both, at "
            "least one). Any JSON values."
        ),
        json_schema_extra={"items": {"x-kubernetes-preserve-unknown-fields": True}},
    )

    @model_validator(mode="after")
    def _check(self) -> Parameter:
        enforce_tune("Parameter", self)
        numeric = self.type.value in NUMERIC
        if not numeric and not self.values:
            raise ValueError(_MSG_VALUES)
        if numeric and self.values is not None:
            raise ValueError(_MSG_NO_VALUES)
        return self


class Mode(str, Enum):
    MIN = "min"
    MAX = "max"


class Objective(_Model):
    metric: str = Field(min_length=1, description="A key of the trials' reported metrics.")
    mode: Mode = Mode.MIN


class SamplerType(str, Enum):
    TPE = "tpe"
    RANDOM = "random"
    GRID = "grid"
    CMAES = "cmaes"


class Sampler(_Model):
    type: SamplerType = SamplerType.TPE
    seed: int | None = Field(default=None, description="Trial n samples with seed + n.")
    startup_trials: int | None = Field(
        default=None, ge=0, description="tpe/cmaes: random trials before the model is used."
    )


class PrunerType(str, Enum):
    NONE = "none"
    MEDIAN = "median"
    SUCCESSIVE_HALVING = "successiveHalving"
    HYPERBAND = "hyperband"
    THRESHOLD = "threshold"


class Pruner(_Model):
    model_config = ConfigDict(json_schema_extra={CEL: tune_cel("Pruner")})

    type: PrunerType = PrunerType.NONE
    startup_trials: int = Field(default=1, ge=0, description="median: trials completed first.")
    warmup_steps: int = Field(default=0, ge=0, description="median: steps never pruned.")
    min_resource: int = Field(default=1, ge=1, description="successiveHalving/hyperband.")
    max_resource: int | None = Field(default=None, ge=1, description="hyperband; default auto.")
    reduction_factor: int = Field(default=3, ge=2, description="successiveHalving/hyperband.")
    lower: float | None = Field(default=None, description="threshold: prune below.")
    upper: float | None = Field(default=None, description="threshold: prune above.")

    @model_validator(mode="after")
    def _check(self) -> Pruner:
        enforce_tune("Pruner", self)
        return self


class PruneAction(str, Enum):
    DELETE = "Delete"
    SUSPEND = "Suspend"


class TrialTemplate(_Model):
    """What every trial TorchJob is made from: its metadata (labels, annotations) and spec."""

    metadata: ObjectMeta | None = None
    spec: TorchJobSpec


class TorchTuneSpec(_Model):
    model_config = ConfigDict(json_schema_extra={CEL: tune_cel("TorchTuneSpec")})

    search_space: list[Parameter] = Field(max_length=64, description="The hyperparameters.")
    objective: Objective
    sampler: Sampler = Field(default_factory=Sampler)
    pruner: Pruner = Field(default_factory=Pruner)
    parallelism: int = Field(default=1, ge=1, le=1000, description="Trials running at once.")
    max_trials: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TRIALS,
        description="Trials in all; default: the grid's size with the grid sampler, else 10.",
    )
    max_failed_trials: int = Field(
        default=3, ge=0, le=MAX_TRIALS, description="The study fails after more failed trials."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="The study stops its trials and fails this long after it started.",
        # int64, as activeDeadlineSeconds on a TorchJob, Job or Pod (see RunPolicy).
        json_schema_extra={"format": "int64"},
    )
    prune_action: PruneAction = Field(
        default=PruneAction.DELETE,
        description="A pruned trial's TorchJob is deleted, or suspended (pods deleted, status kept).",
    )
    trial_template: TrialTemplate

    @model_validator(mode="after")
    def _check(self) -> TorchTuneSpec:
        enforce_tune("TorchTuneSpec", self)
        d = self.active_deadline_seconds
        if d is not None and d > MAX_DEADLINE_SECONDS:
            raise ValueError("spec.activeDeadlineSeconds must fit in int64 (at most 2^63-1)")
        return self


class TrialState(str, Enum):
    PENDING = "Pending"
    """Recorded; its TorchJob is being created (a restart creates it again, idempotently)."""
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    PRUNED = "Pruned"
    FAILED = "Failed"


TERMINAL_TRIAL_STATES = (TrialState.SUCCEEDED, TrialState.PRUNED, TrialState.FAILED)


class TrialRecord(_Model):
    model_config = ConfigDict(extra="allow")

    number: int = Field(ge=0)
    name: str = Field(description="The trial's TorchJob.")
    params: dict[str, Any] = Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    state: TrialState = TrialState.PENDING
    value: float | None = Field(default=None, description="The objective's last reported value.")
    step: int | None = Field(default=None, description="The last progress step judged.")
    intermediate: dict[str, float] | None = Field(
        default=None, description="Objective value by progress step (what the pruner judges)."
    )
    system_attrs: dict[str, Any] | None = Field(
        default=None,
        description="optuna's per-trial bookkeeping (successive halving's rungs).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    checkpoint: str | None = None
    losses: dict[str, int] | None = Field(
        default=None,
        description=(
            "Generations the trial's TorchJob began for a loss, by cause (its status.losses;"
            " its status.history tells each one)."
        ),
    )
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None


class BestTrial(_Model):
    number: int
    name: str
    params: dict[str, Any] = Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})
    value: float
    checkpoint: str | None = None


class StudyPhase(str, Enum):
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class TorchTuneStatus(_Model):
    model_config = ConfigDict(extra="allow")

    phase: StudyPhase | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
    trials_created: int | None = None
    trials_running: int | None = None
    trials_succeeded: int | None = None
    trials_pruned: int | None = None
    trials_failed: int | None = None
    progress: str | None = Field(default=None, description="finished/maxTrials, for kubectl get.")
    best_trial: BestTrial | None = None
    best_value: float | None = Field(default=None, description="For kubectl get.")
    trials: list[TrialRecord] | None = None
    start_time: str | None = None
    completion_time: str | None = None


class TorchTune(_Model):
    """A whole TorchTune object, as ``kubectl apply -f study.yaml`` sends it."""

    api_version: Literal["torchjob.io/v1alpha1"] = "torchjob.io/v1alpha1"
    kind: Literal["TorchTune"] = "TorchTune"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: TorchTuneSpec
    status: TorchTuneStatus | None = None


__all__ = [
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "BestTrial",
    "Mode",
    "Objective",
    "Parameter",
    "ParameterType",
    "PruneAction",
    "Pruner",
    "PrunerType",
    "Sampler",
    "SamplerType",
    "StudyPhase",
    "TorchTune",
    "TorchTuneSpec",
    "TorchTuneStatus",
    "TrialRecord",
    "TrialState",
    "TrialTemplate",
]

"""The policies of a TorchJob's spec: elastic bounds, failures and their backoff, the run.

The CEL rules of each model and the Python checks of its validator come from one table,
``torchjob.api.models.rules``.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from torchjob.api.models.base import CEL, _Model
from torchjob.api.models.limits import (
    MAX_BACKOFF_FACTOR,
    MAX_BACKOFF_SECONDS,
    MAX_DEADLINE_SECONDS,
    MAX_REPLICAS,
    MAX_RESTARTS,
    MAX_TTL_SECONDS,
    MAX_WAIT_SECONDS,
)
from torchjob.api.models.rules import cel_of, enforce


class ElasticPolicy(_Model):
    """Bounds and pacing of elastic rescaling. Present means the job may run below ``replicas``."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("ElasticPolicy")})

    min_replicas: int = Field(
        ge=1, le=MAX_REPLICAS, description="Fewest workers the job trains with."
    )
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Most workers the job grows to.")
    scale_down_after_seconds: int = Field(
        default=60,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Seconds a worker may stay unschedulable before the job continues without it.",
    )
    scale_up_cooldown_seconds: int = Field(
        default=120,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="Seconds between a membership change and the next grow step.",
    )
    shrink_on_disruption: bool = Field(
        default=False,
        description=(
            "With membershipPolicy KeepSurvivors: when a worker is disrupted and no standby is"
            " ready, go on at once with the survivors (any of them, at least minReplicas; the"
            " first becomes rank 0, status.members) and let the replacement join the generation"
            " after; off: replace it at full size. Each such eviction costs two re-formations"
            " (shrink, grow); docs/runtime.md has the measurement."
        ),
    )
    replace_before_leaving: bool = Field(
        default=True,
        description=(
            "With membershipPolicy KeepSurvivors: a worker given notice (a graceful eviction,"
            " preemption or node drain, with at least 20 s of grace left) trains on through its"
            " grace period while its replacement starts under a new pod index; once that is"
            " Ready, one generation puts it in the leaving pod's place (one re-formation, at"
            " full size). The leaving pod stops 10 s before its grace period ends, or when"
            " replaced. Off: it stops at once (then shrinkOnDisruption, a standby or a"
            " full-size replacement applies)."
        ),
    )
    replacement_lead_seconds: int | None = Field(
        default=None,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=(
            "With replaceBeforeLeaving: how long before a noticed node goes (a termination"
            " notice's deadline) the replacements of its workers are created. Unset: the job's"
            " own measure, 1.5 times the longest creation-to-Ready of its pods that started as"
            " replacements, plus 30 s; at once until one has started. Created later than at the"
            " notice, a replacement is paid for less time, is kept off the nodes noticed"
            " meanwhile, and does not import beside the job for nothing. A notice shorter than"
            " the lead, an eviction and a move create theirs at once."
        ),
    )
    standby_replicas: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description=(
            "With membershipPolicy KeepSurvivors: warm standby pods kept beside the workers,"
            " their runtime started and torch imported, waiting to join. A lost worker's place"
            " is taken by a ready standby in the next generation at once (no pod to start), and"
            " a new standby is created in its stead. Counted in status.standbyWorkers."
        ),
    )

    @model_validator(mode="after")
    def _rules(self) -> ElasticPolicy:
        enforce("ElasticPolicy", self)
        return self


class Backoff(_Model):
    """Exponential backoff between group restarts: initial * factor^(n-1), capped at max."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("Backoff")})

    initial_seconds: int = Field(
        default=10, ge=0, le=MAX_BACKOFF_SECONDS, description="Delay before the first restart."
    )
    max_seconds: int = Field(
        default=300, ge=0, le=MAX_BACKOFF_SECONDS, description="Cap on the delay."
    )
    factor: float = Field(
        default=2.0,
        ge=1.0,
        le=MAX_BACKOFF_FACTOR,
        allow_inf_nan=False,
        description="Growth per restart.",
    )

    @model_validator(mode="after")
    def _rules(self) -> Backoff:
        enforce("Backoff", self)
        return self


ExitCode = Annotated[
    int,
    Field(ge=1, le=255, description="A container exit code: 1-255 (0 is success, not a failure)."),
]


class FailurePolicy(_Model):
    """What a worker failure (a non-zero exit that is not a disruption) means."""

    model_config = ConfigDict(json_schema_extra={CEL: cel_of("FailurePolicy")})

    max_restarts: int = Field(
        default=3,
        ge=0,
        le=MAX_RESTARTS,
        description="Group restarts allowed for failures. Disruptions (preemption, eviction, node loss) never count.",
    )
    permanent_exit_codes: list[ExitCode] | None = Field(
        default=None,
        max_length=255,
        description="Exit codes that fail the job at once, without a restart.",
    )
    retryable_exit_codes: list[ExitCode] | None = Field(
        default=None,
        max_length=255,
        description="When set, only these exit codes restart the group; any other non-zero code is permanent.",
    )
    backoff: Backoff = Field(default_factory=Backoff)

    @model_validator(mode="after")
    def _rules(self) -> FailurePolicy:
        enforce("FailurePolicy", self)
        return self


class CleanPodPolicy(str, Enum):
    NONE = "None"
    RUNNING = "Running"
    ALL = "All"


class RunPolicy(_Model):
    suspend: bool = Field(
        default=False, description="Delete the pods and keep the status; false resumes."
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job this many seconds after it first started.",
        # int64 as on a Pod or Job: no `maximum` in the CRD (the API server reads a schema's
        # maximum as a float64, and 2^63-1 is not one); the JSON integer itself is the bound.
        json_schema_extra={"format": "int64"},
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description="Delete the TorchJob this long after it succeeded or failed.",
    )
    clean_pod_policy: CleanPodPolicy = Field(
        default=CleanPodPolicy.RUNNING,
        description="Pods deleted when the job finishes: None, Running (keep finished pods for logs), or All.",
    )

    @model_validator(mode="after")
    def _int64_deadline(self) -> RunPolicy:
        d = self.active_deadline_seconds
        if d is not None and d > MAX_DEADLINE_SECONDS:
            raise ValueError(
                "spec.runPolicy.activeDeadlineSeconds must fit in int64 (at most 2^63-1), as on a Job"
            )
        return self

"""What a TorchJob went through: one record per generation (``status.history``).

The operator appends a record when it publishes a generation (why it began, which pods and
nodes left and joined) and completes it from rank 0's progress report (where the state was
restored from, when the first step after the loss completed, how many steps were redone).
"""

from __future__ import annotations

from pydantic import Field

from torchjob.api.models.base import _Model

HISTORY_LIMIT = 20
"""Generations kept in ``status.history`` (the oldest are dropped)."""

CAUSES = (
    "Start",
    "Failure",
    "OOM",
    "Killed",
    "SilentPeer",
    "Disruption",
    "NodeLost",
    "Notice",
    "Rebalance",
    "ScaleUp",
    "ScaleDown",
    "Restart",
    "GroupBroken",
)
"""Why a generation began; the documented values of ``GenerationRecord.cause``."""

LOST_CAUSES = frozenset({"Failure", "OOM", "Killed", "SilentPeer", "Disruption", "NodeLost"})
"""The causes whose ``left`` pods are gone: their processes ended or cannot be reached (not a
notice, a rebalance or a scale-down, whose pods may still be running)."""


class GenerationRecord(_Model):
    """One generation of the job: why it began and what the change cost."""

    generation: int
    began: str = Field(description="When the operator published it.")
    cause: str = Field(description="Why it began: " + ", ".join(CAUSES) + ".")
    detail: str = Field(default="", description="The loss or change in a line.")
    world_size: int = 0
    left: list[str] | None = Field(
        default=None, description="Pods of the previous generation not in this one (pod@node)."
    )
    joined: list[str] | None = Field(
        default=None,
        description="Pods new in this generation: pod@node for a pod placed when it began (a "
        "joiner created ahead), the name alone for one created with it.",
    )
    silent: list[str] | None = Field(
        default=None,
        description="Pods of left that their peers found silent: kept out of every later "
        "generation until a new pod of that name joins.",
    )
    loss_time: str | None = Field(default=None, description="When the loss was seen.")
    step_at_loss: int | None = Field(
        default=None, description="The last step rank 0 had reported before the loss."
    )
    restored_from: str | None = Field(
        default=None, description="Where the state came from: memory, mirror, storage, start."
    )
    restored_step: int | None = None
    first_step_time: str | None = Field(
        default=None, description="When the first step of this generation completed."
    )
    recovery_seconds: float | None = Field(
        default=None, description="From the loss (or the generation's start) to its first step."
    )
    steps_lost: int | None = Field(
        default=None, description="Steps done before the loss and done again after it."
    )

    def joined_pods(self) -> frozenset[str]:
        """The names of the pods new in this generation (``joined`` without ``@node``)."""
        return frozenset(x.partition("@")[0] for x in self.joined or ())

    def lost_pods(self) -> frozenset[str]:
        """The pods of ``left`` that were lost (a cause in :data:`LOST_CAUSES`), by name."""
        lost = self.cause in LOST_CAUSES
        return frozenset(x.partition("@")[0] for x in self.left or () if lost)

    def silent_nodes(self) -> dict[str, str]:
        """The pods of ``silent`` with the nodes ``left`` names for them (pod -> node; "" for
        a pod ``left`` gives no node)."""
        nodes = {pod: node for pod, _, node in (x.partition("@") for x in self.left or ())}
        return {pod: nodes.get(pod, "") for pod in self.silent or ()}

    def placed_joiners(self) -> frozenset[str]:
        """The pods of :meth:`joined_pods` that were already placed when the operator
        published the generation (``pod@node``: joiners created ahead, their runtime waiting);
        the others were created with it and must start first."""
        return frozenset(x.partition("@")[0] for x in self.joined or () if "@" in x)

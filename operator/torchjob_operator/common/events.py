"""Kubernetes Events as values: a reason from ``conditions.REASONS`` and its message.

Controllers decide their Events in pure code and post them once the status that shows the
same thing landed (an Event never announces what the status does not show).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torchjob_operator.common import conditions as cond


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str

    def __post_init__(self) -> None:
        assert self.reason in cond.REASONS, f"reason {self.reason} is not in conditions.REASONS"

    @classmethod
    def of(cls, reason: str, *, warning: bool = False, **values: object) -> Event:
        """The Event for ``reason``, its message from ``conditions.REASONS``."""
        shown, text = cond.say(reason, **values)
        return cls("Warning" if warning else "Normal", shown, text)


__all__ = ["Event"]

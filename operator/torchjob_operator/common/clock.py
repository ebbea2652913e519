"""Time for both controllers: the clock, and RFC 3339 as the Kubernetes API writes it.

Every timestamp the operator writes (status fields, condition transition times, Kueue
Workload conditions) goes through ``format_time``: UTC, whole seconds, a ``Z`` suffix.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

Clock = Callable[[], datetime]
"""What a controller asks for the time (tests pass a fake one)."""


def utcnow() -> datetime:
    """Now, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with whole seconds: ``2026-01-01T00:00:00Z``."""
    return value.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_time(value: str | datetime | None) -> datetime | None:
    """An RFC 3339 timestamp (``Z`` or an offset) as an aware datetime; None for none.
    Raises ValueError for text that is not one (``parse_time_or_none`` does not)."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def parse_time_or_none(value: str | None) -> datetime | None:
    """``parse_time``, with None for a value that is not a timestamp (a hand-edited status)."""
    try:
        return parse_time(value)
    except ValueError:
        return None


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds from one RFC 3339 timestamp to a later one (0 if it is not later); None when
    either is missing or not a timestamp."""
    a, b = parse_time_or_none(start), parse_time_or_none(end)
    return None if a is None or b is None else max((b - a).total_seconds(), 0.0)


__all__ = ["Clock", "format_time", "parse_time", "parse_time_or_none", "seconds_between", "utcnow"]

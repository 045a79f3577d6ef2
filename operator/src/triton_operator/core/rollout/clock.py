"""Time helpers: RFC 3339 times as Kubernetes writes them, and the wall clock in UTC."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as Kubernetes writes times."""
    return to_utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """A status time back to an aware datetime; None for missing or unreadable values."""
    if isinstance(value, datetime):
        return to_utc(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        return to_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def later(moment: datetime, seconds: float) -> datetime | None:
    """``moment`` plus ``seconds``; None past datetime's range (a pause stored before its bound)."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return None


def to_utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive one is taken as UTC already."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def utcnow() -> datetime:
    """The wall clock, in UTC (the default clock of a pass and of the peering monitor)."""
    return datetime.now(UTC)


def elapsed(since: datetime | None, seconds: float, now: datetime) -> bool:
    """``seconds`` have passed since ``since`` (never when there is no ``since``): the deadline's rule,
    for either step mover."""
    return since is not None and (now - since).total_seconds() >= seconds


def pause_left(duration: int | None, started: datetime | None, now: datetime) -> float | None:
    """Seconds left of a timed pause step begun at ``started`` (not begun: all of it; 0 or less: it is
    over); None: it pauses until promoted. The pause's rule, for either step mover."""
    if duration is None:
        return None
    return duration - ((now - started).total_seconds() if started is not None else 0.0)

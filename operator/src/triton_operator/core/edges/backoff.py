"""Retry delays: capped exponential backoff with full jitter, honouring a server's Retry-After (pure).

Every retry loop of the operator and its pods takes its delays from here, so that callers that
failed together (16 sync threads on one throttled store, a thousand TritonServices after an API
server hiccup) do not come back together: each waits a random time up to a ceiling that doubles with
each attempt (full jitter), never past a cap, and at least what the server asked for in Retry-After.
The random source is a parameter (tests give their own); by default it is the system's.
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
import random as _random
from collections.abc import Callable
from datetime import UTC, datetime

Random = Callable[[], float]
"""A source of uniform numbers in [0, 1), e.g. ``random.Random(7).random``."""

_SYSTEM = _random.SystemRandom()


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Delays before retry ``attempt`` (0: the first retry) of one caller.

    >>> b = Backoff(base=1.0, cap=10.0)
    >>> [b.ceiling(n) for n in range(6)]
    [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    >>> b.delay(2, random=lambda: 0.5)
    2.0
    >>> b.delay(0, retry_after=3.0, random=lambda: 0.5)  # at least what the server asked
    3.5
    >>> b.delay(0, retry_after=600.0, random=lambda: 0.99)  # never past the cap
    10.0
    """

    base: float
    """The ceiling of the first retry's delay."""
    cap: float
    """No delay is longer, whatever the attempt or the server's Retry-After."""
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap and self.factor >= 1):
            raise ValueError(f"backoff needs 0 < base <= cap and factor >= 1: {self}")

    def ceiling(self, attempt: int) -> float:
        """The longest delay before retry ``attempt``: base * factor**attempt, at most the cap."""
        exponent = max(attempt, 0)
        if self.factor > 1 and exponent > math.log(self.cap / self.base, self.factor):
            return self.cap
        return min(self.cap, self.base * self.factor**exponent)

    def delay(self, attempt: int, *, retry_after: float | None = None, random: Random | None = None) -> float:
        """A random delay before retry ``attempt``: uniform in [0, ceiling] (full jitter); with a
        Retry-After, that long (up to the cap) plus the jitter (so the callers the server told the
        same thing do not all come back at that moment), never past the cap."""
        floor = min(max(retry_after or 0.0, 0.0), self.cap)
        spread = min(self.ceiling(attempt), self.cap - floor)
        return floor + (random or _SYSTEM.random)() * spread


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds a Retry-After header asks to wait: a number of seconds, or an HTTP date (then from
    ``now``); None when there is none or it cannot be read.

    >>> parse_retry_after("7")
    7.0
    >>> parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC))
    10.0
    >>> parse_retry_after("soon") is None
    True
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            moment = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = (moment - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)

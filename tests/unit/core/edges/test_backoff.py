"""core.edges.backoff: the retry delays every retry loop shares grow, are jittered, capped, and wait out a
server's Retry-After."""

from __future__ import annotations

import doctest
import itertools
import random
from datetime import UTC, datetime

import pytest

from triton_operator.core.edges import backoff
from triton_operator.core.edges.backoff import Backoff, parse_retry_after


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(backoff).failed == 0


def test_the_delays_grow_with_each_attempt() -> None:
    b = Backoff(base=0.5, cap=100.0)
    top = [b.delay(n, random=lambda: 1.0) for n in range(6)]
    assert top == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    # on average too: the mean of many jittered delays doubles
    rng = random.Random(3).random
    means = [sum(b.delay(n, random=rng) for _ in range(2000)) / 2000 for n in range(4)]
    assert all(later > 1.6 * earlier for earlier, later in itertools.pairwise(means))


def test_callers_that_failed_together_do_not_retry_together() -> None:
    """Full jitter: 16 threads (or 1,000 objects) that failed at once spread over the whole window."""
    b = Backoff(base=1.0, cap=30.0)
    callers = [random.Random(seed).random for seed in range(16)]
    first = [b.delay(0, random=r) for r in callers]
    assert len(set(first)) == 16
    assert all(0.0 <= d <= 1.0 for d in first)
    assert max(first) - min(first) > 0.5  # spread, not bunched
    # with the system's random source, two callers do not coincide either
    assert b.delay(3) != b.delay(3)


@pytest.mark.parametrize("attempt", [0, 5, 10, 64, 1000, 10**9])
def test_no_delay_passes_the_cap(attempt: int) -> None:
    b = Backoff(base=0.2, cap=5.0)
    assert b.ceiling(attempt) <= 5.0
    assert b.delay(attempt, random=lambda: 0.999999) <= 5.0
    assert b.delay(attempt, retry_after=3600.0, random=lambda: 0.999999) <= 5.0


@pytest.mark.parametrize("retry_after", [0.0, 0.3, 2.0, 4.9])
def test_a_retry_after_is_waited_out(retry_after: float) -> None:
    b = Backoff(base=0.2, cap=5.0)
    for seed in range(50):
        delay = b.delay(0, retry_after=retry_after, random=random.Random(seed).random)
        assert retry_after <= delay <= min(retry_after + 0.2, 5.0)


def test_a_retry_after_past_the_cap_is_waited_up_to_the_cap() -> None:
    assert Backoff(base=1.0, cap=10.0).delay(0, retry_after=600.0, random=lambda: 0.0) == 10.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # a date past: no wait
        ("", None),
        (None, None),
        ("later", None),
        ("inf", None),
        ("nan", None),
    ],
)
def test_retry_after_is_read_as_seconds_or_an_http_date(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, datetime(2015, 10, 21, 7, 28, 0, tzinfo=UTC)) == seconds


@pytest.mark.parametrize(("base", "cap", "factor"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (1.0, 2.0, 0.5)])
def test_a_backoff_that_makes_no_sense_is_refused(base: float, cap: float, factor: float) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(base=base, cap=cap, factor=factor)

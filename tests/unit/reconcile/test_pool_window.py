"""A pool's window of Triton's per-model counters (reconcile.analysis): readings kept over windowSeconds,
each pod's increase over its own span, summed over pods; a restarted process starts its own series."""

from __future__ import annotations

import pytest

from triton_operator.adapters.triton_reader import PodReading
from triton_operator.core.rollout.canary_analysis import Counters
from triton_operator.reconcile.analysis import PoolSamples, pool_figures, pool_window


def reading(uid: str, at: float, restarts: int = 0, **models: tuple[float, float]) -> PodReading:
    """A pod's metrics reading at ``at``: per model (requests so far, queue microseconds so far)."""
    counters = {m: Counters(success=n, queue_us=q) for m, (n, q) in models.items()}
    return PodReading(uid, "r1", restarts, read_at=at, counters=counters, counters_at=at)


def test_the_figures_are_each_pods_increase_over_the_window_summed() -> None:
    samples: PoolSamples = {}
    for at, a, b in ((0, 0, 0), (10, 100, 50), (20, 200, 100), (30, 300, 150)):
        readings = {
            "p0": reading("p0", at, a=(a, a * 20_000.0)),
            "p1": reading("p1", at, a=(b, b * 2_000.0), b=(0, 0.0)),
        }
        samples = pool_window(samples, readings, window=20)
    assert [at for at, _ in samples["p0/0"]] == [10, 20, 30]  # 20 s back from the latest, plus the baseline
    figures = pool_figures(samples)
    assert figures is not None
    assert figures["a"].inferences_per_second == pytest.approx(10 + 5)
    # Queue time per request over both pods: (200 x 20 ms + 100 x 2 ms) / 300 requests.
    assert figures["a"].queue_us == pytest.approx((200 * 20_000 + 100 * 2_000) / 300)
    assert figures["b"].inferences_per_second == 0 and figures["b"].queue_us is None
    assert figures["b"].requests == 0 and figures["a"].requests == 300


def test_no_figures_before_two_readings_and_a_restart_starts_a_new_series() -> None:
    first = pool_window({}, {"p0": reading("p0", 0, a=(500, 0.0))}, window=60)
    assert pool_figures(first) is None
    restarted = pool_window(first, {"p0": reading("p0", 10, restarts=1, a=(3, 0.0))}, window=60)
    assert set(restarted) == {"p0/1"} and pool_figures(restarted) is None  # counters from 0 again
    later = pool_window(restarted, {"p0": reading("p0", 20, restarts=1, a=(23, 0.0))}, window=60)
    figures = pool_figures(later)
    assert figures is not None and figures["a"].inferences_per_second == pytest.approx(2)


def test_a_reading_not_newer_than_the_last_adds_nothing() -> None:
    samples = pool_window({}, {"p0": reading("p0", 5, a=(10, 0.0))}, window=60)
    again = pool_window(samples, {"p0": reading("p0", 5, a=(10, 0.0))}, window=60)
    assert again == samples

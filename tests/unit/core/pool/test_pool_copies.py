"""Copies follow load: a busy model gains a copy after a wait, an idle one loses one after a longer wait,
within its least and most copies, never flapping; the pool fits, the least recently used extras first."""

from __future__ import annotations

import itertools
import random
from decimal import Decimal

import pytest

from triton_operator.core.pool.copies import (
    ADD,
    BUSY_WAITING,
    DROP,
    HOLD,
    IDLE_WAITING,
    LEAST,
    LOADING,
    MOST,
    ModelLoad,
    Streak,
    Thresholds,
    decide_copies,
    fit_pool,
    rate,
)
from triton_operator.core.pool.placement import PoolModel, pods_needed

MiB = 1024 * 1024
T = Thresholds(busy_queue_us=10_000, idle_rate=1.0, stabilization_s=300, up_stabilization_s=30)
BUSY = 50_000.0


def test_a_busy_model_gains_a_copy_only_once_busy_for_the_stabilization_and_then_waits_again() -> None:
    limits = {"a": (1, None)}
    first = decide_copies([ModelLoad("a", 2, BUSY, 200.0)], limits, T, 1000, {}, current={"a": 2})
    assert (first.wanted, first.reasons) == ({"a": 2}, {"a": BUSY_WAITING})
    assert first.streaks == {"a": Streak(busy_since=1000)}
    early = decide_copies([ModelLoad("a", 2, BUSY, 200.0)], limits, T, 1029, first.streaks, current={"a": 2})
    assert early.wanted == {"a": 2} and early.streaks == first.streaks
    added = decide_copies([ModelLoad("a", 2, BUSY, 200.0)], limits, T, 1030, early.streaks, current={"a": 2})
    assert (added.wanted, added.reasons) == ({"a": 3}, {"a": ADD})
    # The new copy loads: no other, and the busy wait ends until all wanted copies serve.
    loading = decide_copies(
        [ModelLoad("a", 2, BUSY, 200.0, loading=1)], limits, T, 1031, added.streaks, current={"a": 3}
    )
    assert (loading.wanted, loading.reasons, loading.streaks) == ({"a": 3}, {"a": LOADING}, {})
    served = decide_copies(
        [ModelLoad("a", 3, BUSY, 200.0)], limits, T, 1100, loading.streaks, current={"a": 3}
    )
    assert (served.wanted, served.reasons) == ({"a": 3}, {"a": BUSY_WAITING})  # its own wait again
    again = decide_copies([ModelLoad("a", 3, BUSY, 200.0)], limits, T, 1130, served.streaks, current={"a": 3})
    assert again.wanted == {"a": 4}


def test_a_busy_spell_shorter_than_the_stabilization_adds_nothing() -> None:
    limits = {"a": (1, None)}
    busy = decide_copies([ModelLoad("a", 1, BUSY, 20.0)], limits, T, 0, {}, current={"a": 1})
    calm = decide_copies([ModelLoad("a", 1, 2_000, 20.0)], limits, T, 20, busy.streaks, current={"a": 1})
    assert calm.reasons == {"a": HOLD} and calm.streaks == {}
    busy_again = decide_copies([ModelLoad("a", 1, BUSY, 20.0)], limits, T, 40, calm.streaks, current={"a": 1})
    assert busy_again.wanted == {"a": 1} and busy_again.reasons == {"a": BUSY_WAITING}


def test_busy_by_inferences_per_copy_when_that_threshold_is_set() -> None:
    per_copy = Thresholds(busy_rate=50.0, up_stabilization_s=0)
    loads = [ModelLoad("a", 2, 100.0, 120.0), ModelLoad("b", 2, 100.0, 80.0)]
    decided = decide_copies(
        loads, {"a": (1, None), "b": (1, None)}, per_copy, 0, {}, current={"a": 2, "b": 2}
    )
    assert decided.wanted == {"a": 3, "b": 2}  # 60/s a copy is busy; 40/s is not
    assert decided.reasons == {"a": ADD, "b": HOLD}


def test_an_idle_model_drops_to_its_least_one_copy_a_stabilization_at_a_time() -> None:
    limits = {"a": (1, None)}
    streaks: dict[str, Streak] = {}
    wanted, drops = 3, []
    for now in range(0, 1000, 10):
        decided = decide_copies(
            [ModelLoad("a", wanted, None, 0.0)], limits, T, now, streaks, current={"a": wanted}
        )
        if decided.reasons["a"] == DROP:
            drops.append(now)
        wanted, streaks = decided.wanted["a"], decided.streaks
    assert drops == [300, 600] and wanted == 1
    assert decided.reasons == {"a": LEAST} and decided.streaks == {}  # at its least: no wait runs


def test_an_idle_wait_is_ended_by_one_pass_with_load() -> None:
    limits = {"a": (1, None)}
    idle = decide_copies([ModelLoad("a", 3, None, 0.0)], limits, T, 0, {}, current={"a": 3})
    assert (idle.reasons, idle.streaks) == ({"a": IDLE_WAITING}, {"a": Streak(idle_since=0)})
    steady = decide_copies([ModelLoad("a", 3, 2_000, 5.0)], limits, T, 290, idle.streaks, current={"a": 3})
    assert (steady.wanted, steady.reasons, steady.streaks) == ({"a": 3}, {"a": HOLD}, {})
    idle_again = decide_copies(
        [ModelLoad("a", 3, None, 0.0)], limits, T, 310, steady.streaks, current={"a": 3}
    )
    assert idle_again.wanted == {"a": 3}  # the wait starts again


def test_never_below_the_least_nor_above_the_most() -> None:
    loads = [
        ModelLoad("low", 1, None, 0.0),
        ModelLoad("under", 0, None, 0.0),
        ModelLoad("over", 5, 0, 9.0),
        ModelLoad("full", 3, BUSY, 900.0),
    ]
    limits = {"low": (1, None), "under": (2, None), "over": (1, 3), "full": (1, 3)}
    long_ago = {n: Streak(busy_since=0, idle_since=0) for n in limits}
    decided = decide_copies(
        loads, limits, T, 10_000, long_ago, current={"low": 1, "under": 1, "over": 5, "full": 3}
    )
    assert decided.wanted == {"low": 1, "under": 2, "over": 3, "full": 3}
    assert decided.reasons["under"] == LEAST and decided.reasons["over"] == MOST
    assert decided.reasons["full"] == MOST


@pytest.mark.parametrize("seed", range(40))
def test_random_loads_stay_within_least_and_most_and_move_by_one_at_most(seed: int) -> None:
    rng = random.Random(seed)
    loads, limits, current, streaks = [], {}, {}, {}
    for i in range(20):
        least = rng.randint(1, 3)
        most = rng.choice([None, least + rng.randint(0, 3)])
        copies = rng.randint(least, most if most is not None else least + 4)
        queue = rng.choice([None, float(rng.randint(0, 40_000))])
        loads.append(ModelLoad(f"m{i}", copies, queue, float(rng.randint(0, 50)), loading=rng.randint(0, 1)))
        limits[f"m{i}"] = (least, most)
        current[f"m{i}"] = copies + loads[-1].loading
        streaks[f"m{i}"] = Streak(rng.choice([None, 0.0]), rng.choice([None, 0.0]))
    decided = decide_copies(loads, limits, T, rng.randint(0, 1000), streaks, current=current)
    for load in loads:
        least, most = limits[load.name]
        wanted = decided.wanted[load.name]
        assert least <= wanted and (most is None or wanted <= most)
        assert abs(wanted - current[load.name]) <= 1


def _queue(rate_per_s: float, copies: int, capacity: float = 10.0) -> float | None:
    """A model's queue time for a load spread over its copies, each serving ``capacity`` a second."""
    if rate_per_s <= 0:
        return None
    return 100_000.0 if rate_per_s / copies > capacity else 1_000.0


@pytest.mark.parametrize("seed", range(10))
def test_copies_never_flap_over_a_sequence_of_passes(seed: int) -> None:
    """Passes every 10 s under loads that stay for an hour each: within a phase the copies move one way
    only, adds are up_stabilization_s apart and drops stabilization_s apart, and a steady load ends
    steady where it belongs (no copy comes and goes)."""
    rng = random.Random(seed)
    limits = {"a": (1, 8)}
    streaks: dict[str, Streak] = {}
    wanted, serving, now = 1, 1, 0
    for _phase in range(6):
        load = rng.choice([0.0, 0.5, 5.0, 25.0, 45.0, 70.0])
        moves: list[tuple[int, int]] = []
        for _ in range(360):  # an hour
            now += 10
            loading = wanted - serving
            decided = decide_copies(
                [ModelLoad("a", serving, _queue(load, serving), load, loading)],
                limits,
                T,
                now,
                streaks,
                current={"a": wanted},
            )
            if decided.wanted["a"] != wanted:
                moves.append((now, decided.wanted["a"] - wanted))
            serving = wanted  # what was wanted by the last pass serves by this one
            wanted, streaks = decided.wanted["a"], decided.streaks
        directions = {step for _, step in moves}
        assert len(directions) <= 1, moves  # one way only within a phase
        times = [t for t, _ in moves]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        wait = T.up_stabilization_s if directions == {1} else T.stabilization_s
        assert all(gap >= wait for gap in gaps), moves
        assert not moves or moves[-1][0] < now - 600, moves  # settled well before the phase ends
        # ...where the load puts it: not busy unless at its most, not idle unless at its least.
        assert wanted == 8 or load / wanted <= 10.0, (load, wanted)
        assert wanted == 1 or load / (wanted - 1) >= T.idle_rate, (load, wanted)


def test_the_pool_size_follows_the_sum_and_memory_short_takes_the_least_recently_used_extra_first() -> None:
    models = [
        PoolModel("hot", 400 * MiB, min_copies=1, wanted=3, last_used=100.0),
        PoolModel("warm", 400 * MiB, min_copies=1, wanted=2, last_used=50.0),
        PoolModel("cold", 400 * MiB, min_copies=1, wanted=2, last_used=1.0),
    ]
    roomy = fit_pool(models, 1200 * MiB, most_pods=10)
    assert roomy.pods == pods_needed(models, 1200 * MiB) == 3 and roomy.trimmed == ()
    assert roomy.wanted == {"hot": 3, "warm": 2, "cold": 2}
    short = fit_pool(models, 800 * MiB, most_pods=3)  # 2 copies a pod: 6 copies at most
    assert short.trimmed == ("cold",)
    assert short.wanted == {"hot": 3, "warm": 2, "cold": 1}
    assert short.pods == 3
    shorter = fit_pool(models, 800 * MiB, most_pods=2)
    assert shorter.trimmed == ("cold", "warm", "hot")
    assert shorter.wanted == {"hot": 2, "warm": 1, "cold": 1} and shorter.pods == 2


def test_memory_short_among_models_used_as_recently_takes_the_copy_serving_least_first() -> None:
    # lastUsed is kept to 5-minute periods: the models busy in one period tie on it. The copy given back is
    # the one of the model that serves least a copy it keeps, not the first by name.
    models = [
        PoolModel("a-busy", 400 * MiB, min_copies=1, wanted=3, last_used=600.0),
        PoolModel("b-warm", 400 * MiB, min_copies=1, wanted=3, last_used=600.0),
        PoolModel("c-cold", 400 * MiB, min_copies=1, wanted=1, last_used=0.0),
    ]
    rates = {"a-busy": 90.0, "b-warm": 2.0, "c-cold": 0.0}
    short = fit_pool(models, 800 * MiB, most_pods=3, rates=rates)  # 2 copies a pod: 6 of 7 copies
    assert short.trimmed == ("b-warm",)
    assert short.wanted == {"a-busy": 3, "b-warm": 2, "c-cold": 1} and short.pods == 3
    # 4 copies: b-warm's two extra go (2 then 1 a copy it keeps), then a-busy's (45 a copy it keeps).
    shorter = fit_pool(models, 800 * MiB, most_pods=2, rates=rates)
    assert shorter.trimmed == ("b-warm", "b-warm", "a-busy")
    assert shorter.wanted == {"a-busy": 2, "b-warm": 1, "c-cold": 1}
    # Where a-busy serves less a copy than b-warm, its copy goes first.
    calm = fit_pool(models, 800 * MiB, most_pods=3, rates={"a-busy": 2.0, "b-warm": 9.0})
    assert calm.trimmed == ("a-busy",)
    # Without figures the name decides, as before.
    assert fit_pool(models, 800 * MiB, most_pods=3).trimmed == ("a-busy",)


def test_least_copies_are_never_trimmed_and_the_size_says_what_they_need() -> None:
    models = [PoolModel(f"m{i}", 600 * MiB, min_copies=2, wanted=2) for i in range(3)]
    size = fit_pool(models, 1200 * MiB, most_pods=1)
    assert size.wanted == {"m0": 2, "m1": 2, "m2": 2} and size.trimmed == () and size.pods == 3


def test_rates_are_read_as_kubernetes_quantities() -> None:
    assert (
        rate("500m") == Decimal("0.5")
        and rate("2") == 2
        and rate("2k") == 2000
        and rate("1.5") == Decimal("1.5")
    )
    for bad in ("", "fast", "-1", "NaN"):
        with pytest.raises(ValueError, match="is not a number"):
            rate(bad)

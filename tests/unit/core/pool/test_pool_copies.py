"""Copies follow load: a busy model gains a copy, an idle one loses one after a wait; the pool fits."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from triton_operator.core.pool.copies import (
    ADD,
    DROP,
    HOLD,
    IDLE_WAITING,
    LEAST,
    LOADING,
    MOST,
    ModelLoad,
    Thresholds,
    decide_copies,
    fit_pool,
    rate,
)
from triton_operator.core.pool.placement import PoolModel, pods_needed

MiB = 1024 * 1024
T = Thresholds(busy_queue_us=10_000, idle_rate=1.0, stabilization_s=300)


def test_a_busy_model_gets_one_more_copy_up_to_its_most() -> None:
    loads = [ModelLoad("a", 2, 50_000, 200.0), ModelLoad("b", 3, 50_000, 200.0)]
    decided = decide_copies(loads, {"a": (1, None), "b": (1, 3)}, T, now=0, idle_since={})
    assert decided.wanted == {"a": 3, "b": 3}
    assert decided.reasons == {"a": ADD, "b": MOST}


def test_a_busy_model_gets_no_other_copy_while_its_new_one_is_loading() -> None:
    loading = [ModelLoad("a", 2, 50_000, 200.0, loading=1)]
    decided = decide_copies(loading, {"a": (1, None)}, T, now=0, idle_since={})
    assert (decided.wanted, decided.reasons) == ({"a": 3}, {"a": LOADING})
    served = decide_copies([ModelLoad("a", 3, 50_000, 200.0)], {"a": (1, None)}, T, now=5, idle_since={})
    assert served.wanted == {"a": 4}


def test_an_idle_model_loses_a_copy_only_after_the_stabilization_window_and_then_waits_again() -> None:
    idle = [ModelLoad("a", 3, None, 0.0)]
    limits = {"a": (1, None)}
    first = decide_copies(idle, limits, T, now=1000, idle_since={})
    assert (first.wanted, first.reasons, first.idle_since) == ({"a": 3}, {"a": IDLE_WAITING}, {"a": 1000})
    early = decide_copies(idle, limits, T, now=1299, idle_since=first.idle_since)
    assert early.wanted == {"a": 3}
    drop = decide_copies(idle, limits, T, now=1300, idle_since=early.idle_since)
    assert (drop.wanted, drop.reasons) == ({"a": 2}, {"a": DROP})
    after = decide_copies([ModelLoad("a", 2, None, 0.0)], limits, T, now=1301, idle_since=drop.idle_since)
    assert after.wanted == {"a": 2}  # the next drop waits its own window


def test_a_load_between_the_thresholds_moves_nothing_and_ends_idleness() -> None:
    # 3 copies, 5 inferences/s: one copy fewer would see 2.5/s each, above the idle rate; no queueing.
    steady = [ModelLoad("a", 3, 2_000, 5.0)]
    decided = decide_copies(steady, {"a": (1, None)}, T, now=10, idle_since={"a": 0})
    assert (decided.wanted, decided.reasons, decided.idle_since) == ({"a": 3}, {"a": HOLD}, {})


def test_never_below_the_least_nor_above_the_most() -> None:
    loads = [ModelLoad("low", 1, None, 0.0), ModelLoad("under", 0, None, 0.0), ModelLoad("over", 5, 0, 9.0)]
    decided = decide_copies(
        loads, {"low": (1, None), "under": (2, None), "over": (1, 3)}, T, now=10_000, idle_since={"low": 0}
    )
    assert decided.wanted == {"low": 1, "under": 2, "over": 3}
    assert decided.reasons["under"] == LEAST and decided.reasons["over"] == MOST


@pytest.mark.parametrize("seed", range(40))
def test_random_loads_stay_within_least_and_most_and_move_by_one_at_most(seed: int) -> None:
    rng = random.Random(seed)
    loads, limits = [], {}
    for i in range(20):
        least = rng.randint(1, 3)
        most = rng.choice([None, least + rng.randint(0, 3)])
        copies = rng.randint(least, most if most is not None else least + 4)
        queue = rng.choice([None, float(rng.randint(0, 40_000))])
        loads.append(ModelLoad(f"m{i}", copies, queue, float(rng.randint(0, 50))))
        limits[f"m{i}"] = (least, most)
    decided = decide_copies(loads, limits, T, now=rng.randint(0, 1000), idle_since={})
    for load in loads:
        least, most = limits[load.name]
        wanted = decided.wanted[load.name]
        assert least <= wanted and (most is None or wanted <= most)
        assert abs(wanted - load.copies) <= 1


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

"""When a pooled TritonService's next pass is due for its pool (core.decision.pool_plan.pool_requeue):
within a second while a copy loads, so a model moved off a leaving pod is routed inside drainSeconds;
no faster than the load's look when nothing loads or waits."""

from __future__ import annotations

from triton_operator.core.decision.pool_plan import (
    POOL_LOAD_SECONDS,
    POOL_LOADING_SECONDS,
    POOL_RETRY_SECONDS,
    PodPatch,
    PoolPlan,
    pool_requeue,
)

NOW = 1000.0


def plan(**fields: object) -> PoolPlan:
    base: dict[str, object] = {"services": (), "patches": (), "status": {}, "replicas": 3}
    return PoolPlan(**{**base, **fields})  # type: ignore[arg-type]


def test_a_copy_loading_is_looked_at_again_within_a_second() -> None:
    assert POOL_LOADING_SECONDS <= 1.0
    loading = (("p1", "m0"),)
    assert pool_requeue(plan(loading=loading, waiting=("p1: m0 1 is loading",)), NOW) == POOL_LOADING_SECONDS
    # A drain ending later (the leaving pod's other copies) does not hold the loading copy's look back.
    later = plan(loading=loading, next_at=NOW + 30.0, waiting=("p0: m1 drains before it unloads",))
    assert pool_requeue(later, NOW) == POOL_LOADING_SECONDS
    sooner = plan(loading=loading, next_at=NOW + 0.25)
    assert pool_requeue(sooner, NOW) == 0.25


def test_nothing_loading_nothing_waiting_is_one_look_at_the_load_per_period() -> None:
    assert pool_requeue(plan(), NOW) == POOL_LOAD_SECONDS
    assert pool_requeue(None, NOW) is None
    assert pool_requeue(PoolPlan(services=(), patches=(), status=None), NOW) is None  # no pool


def test_other_waits_keep_their_own_pace() -> None:
    waiting = plan(waiting=("p0: m0 waits for its other copies to change version",))
    assert pool_requeue(waiting, NOW) == POOL_RETRY_SECONDS
    patched = plan(patches=(PodPatch("p0", "7"),))
    assert pool_requeue(patched, NOW) == POOL_RETRY_SECONDS
    assert pool_requeue(plan(next_at=NOW + 3.0, waiting=("p0: m0 drains",)), NOW) == 3.0
    assert pool_requeue(plan(next_at=NOW - 2.0), NOW) == 0.0  # overdue: at once
    assert pool_requeue(plan(next_at=NOW + 60.0), NOW) == POOL_LOAD_SECONDS


def test_a_copy_waiting_for_its_pods_unload_is_looked_at_again_within_a_second() -> None:
    waiting = ("p0: waiting for p0 to unload m1 to make room for m0",)
    unloading = plan(unloading=(("p0", "m1"),), waiting=waiting, next_at=NOW + 30.0)
    assert pool_requeue(unloading, NOW) == POOL_LOADING_SECONDS

"""Pool placement on random instances: budgets held, least copies placed when they can be, stable, spread."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from triton_operator.core.pool.explain import as_quantity, measured_memory, pool_status
from triton_operator.core.pool.placement import (
    BUDGET_FULL,
    MAX_COPIES,
    TOO_FEW_PODS,
    WANTED,
    Placement,
    PoolModel,
    PoolPod,
    _Bins,
    _fill,
    _keep,
    place,
    pods_needed,
)
from triton_operator.models import PoolModelStatus, PoolStatus

MiB = 1024 * 1024
SEEDS = range(60)


def _instance(seed: int) -> tuple[list[PoolPod], list[PoolModel]]:
    """Pods of 1-3 GiB on a few nodes, models of 10-900 MiB wanting 1-4 copies."""
    rng = random.Random(seed)
    nodes = [f"node-{i}" for i in range(rng.randint(1, 4))]
    pods = [
        PoolPod(f"pod-{i:02d}", rng.choice(nodes), rng.choice([1024, 1200, 2048, 3072]) * MiB)
        for i in range(rng.randint(1, 10))
    ]
    models = []
    for i in range(rng.randint(1, 40)):
        least = rng.randint(1, 3)
        most = rng.choice([None, least, least + 2])
        models.append(
            PoolModel(
                f"model-{i:02d}",
                rng.randint(10, 900) * MiB,
                min_copies=least,
                max_copies=most,
                wanted=rng.randint(1, 5),
                last_used=rng.choice([None, float(rng.randint(0, 1000))]),
            )
        )
    return pods, models


def _check_budgets(pods: Sequence[PoolPod], models: Sequence[PoolModel], placed: Placement) -> None:
    memory = {m.name: m.memory for m in models}
    for pod in pods:
        held = placed.pods[pod.name]
        assert sum(memory[m] for m in held) <= pod.budget, (pod, held)
        assert len(set(held)) == len(held)


def _as_current(placed: Placement) -> dict[str, tuple[str, ...]]:
    return {pod: models for pod, models in placed.pods.items() if models}


@pytest.mark.parametrize("seed", SEEDS)
def test_no_pod_is_given_more_than_its_budget_and_no_model_more_than_its_target(seed: int) -> None:
    pods, models = _instance(seed)
    placed = place(pods, models)
    _check_budgets(pods, models, placed)
    for model in models:
        where = placed.models[model.name]
        assert where.copies <= model.target
        assert where.copies == sum(model.name in held for held in placed.pods.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_least_copies_placed_from_a_placement_of_least_copies_alone_are_placed_whatever_the_start(
    seed: int,
) -> None:
    pods, models = _instance(seed)
    least_only = [PoolModel(m.name, m.memory, m.min_copies, m.max_copies, m.min_copies) for m in models]
    feasible = not place(pods, least_only).least_unmet(least_only)
    rng = random.Random(seed + 1000)
    # A start from an unrelated placement (another seed's wanted copies) must reach them too.
    shuffled = [PoolModel(m.name, m.memory, m.min_copies, m.max_copies, rng.randint(1, 6)) for m in models]
    start = _as_current(place(list(reversed(pods)), shuffled))
    placed = place(pods, models, start)
    _check_budgets(pods, models, placed)
    if feasible:
        assert placed.least_unmet(models) == []
        assert not placed.least_unmet(models) and place(pods, models).least_unmet(models) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_second_run_with_the_same_input_moves_nothing(seed: int) -> None:
    pods, models = _instance(seed)
    first = place(pods, models)
    second = place(pods, models, _as_current(first))
    assert second.loads == () and second.unloads == ()
    assert second.pods == first.pods


@pytest.mark.parametrize("seed", SEEDS)
def test_adding_a_model_never_unloads_a_least_copy_and_with_room_unloads_nothing(seed: int) -> None:
    pods, models = _instance(seed)
    first = place(pods, models)
    if first.least_unmet(models):
        return  # only a placement whose least copies all stand is a start to keep
    new = PoolModel("model-new", 50 * MiB, min_copies=1, wanted=2)
    second = place(pods, [*models, new], _as_current(first))
    _check_budgets(pods, [*models, new], second)
    assert all(load[1] == "model-new" for load in second.loads) or second.least_unmet([*models, new])
    least = {m.name: m.min_copies for m in models}
    for model in models:
        assert second.models[model.name].copies >= min(least[model.name], first.models[model.name].copies)
    roomy = [PoolPod(p.name, p.node, 64 * 1024 * MiB) for p in pods]
    before = place(roomy, models)
    after = place(roomy, [*models, new], _as_current(before))
    assert after.unloads == ()
    assert {load[1] for load in after.loads} == {"model-new"}


def test_copies_spread_over_nodes_before_doubling_up_on_one() -> None:
    pods = [PoolPod(f"p{i}", f"n{i % 3}", 1024 * MiB) for i in range(6)]
    placed = place(pods, [PoolModel("m", 100 * MiB, min_copies=3, wanted=3)])
    nodes = {f"p{i}": f"n{i % 3}" for i in range(6)}
    assert sorted(nodes[p] for p in placed.models["m"].pods) == ["n0", "n1", "n2"]


def test_a_pod_that_is_gone_has_its_models_placed_again_and_the_rest_stays() -> None:
    pods = [PoolPod(f"p{i}", f"n{i}", 300 * MiB) for i in range(3)]
    models = [PoolModel(f"m{i}", 100 * MiB, wanted=1) for i in range(6)]
    first = place(pods, models)
    survivors = [*pods[:2], PoolPod("p3", "n3", 300 * MiB)]
    second = place(survivors, models, _as_current(first))
    lost = set(first.pods["p2"])
    assert {model for _, model in second.loads} == lost
    for pod in ("p0", "p1"):
        assert set(first.pods[pod]) <= set(second.pods[pod])
    assert second.least_unmet(models) == []


def test_a_pod_over_its_budget_sheds_the_least_recently_used_copy_beyond_its_least_first() -> None:
    models = [
        PoolModel("old", 100 * MiB, min_copies=1, wanted=2, last_used=1.0),
        PoolModel("new", 100 * MiB, min_copies=1, wanted=2, last_used=9.0),
        PoolModel("one", 100 * MiB, min_copies=1, wanted=1, last_used=0.0),
    ]
    current = {"a": ["old", "new", "one"], "b": ["old", "new"]}
    shrunk = [PoolPod("a", "n", 200 * MiB), PoolPod("b", "n2", 300 * MiB)]
    placed = place(shrunk, models, current)
    assert placed.unloads == (("a", "old"),)
    assert placed.models["old"].reason == BUDGET_FULL


def test_least_copies_make_room_by_unloading_extra_copies_least_recently_used_first() -> None:
    pods = [PoolPod("a", "n1", 200 * MiB), PoolPod("b", "n2", 200 * MiB)]
    models = [
        PoolModel("busy", 100 * MiB, min_copies=1, wanted=2, last_used=50.0),
        PoolModel("stale", 100 * MiB, min_copies=1, wanted=2, last_used=5.0),
    ]
    first = place(pods, models)
    assert all(len(held) == 2 for held in first.pods.values())
    added = PoolModel("fresh", 100 * MiB, min_copies=1, wanted=1)
    placed = place(pods, [*models, added], _as_current(first))
    assert placed.models["fresh"].copies == 1
    assert [model for _, model in placed.unloads] == ["stale"]
    assert placed.models["busy"].copies == 2


def test_each_model_says_why_it_has_no_more_copies() -> None:
    pods = [PoolPod(f"p{i}", f"n{i}", 250 * MiB) for i in range(3)]
    models = [
        PoolModel("enough", 10 * MiB, min_copies=1, wanted=2),
        PoolModel("capped", 10 * MiB, min_copies=1, max_copies=2, wanted=3),
        PoolModel("everywhere", 10 * MiB, min_copies=1, wanted=5),
    ]
    placed = place(pods, models)
    reasons = {name: (where.reason, where.copies) for name, where in placed.models.items()}
    assert reasons["enough"] == (WANTED, 2)
    assert reasons["capped"] == (MAX_COPIES, 2)
    assert reasons["everywhere"] == (TOO_FEW_PODS, 3)
    assert "3 pods" in placed.models["everywhere"].message
    crowded = place(
        pods, [PoolModel("big", 200 * MiB, min_copies=1, wanted=3), PoolModel("other", 100 * MiB)]
    )
    assert (crowded.models["big"].reason, crowded.models["big"].copies) == (BUDGET_FULL, 2)
    assert crowded.models["other"].reason == WANTED


def _pods_of(placed: Placement) -> Mapping[str, int]:
    return {pod: len(held) for pod, held in placed.pods.items()}


def test_pods_needed_packs_forty_models_of_100_mib_into_pods_of_1200_mib() -> None:
    models = [PoolModel(f"m{i}", 100 * MiB) for i in range(40)]
    assert pods_needed(models, 1200 * MiB) == 4  # 12 a pod: ceil(40 / 12)
    two = [PoolModel(f"m{i}", 100 * MiB, min_copies=2, wanted=2) for i in range(40)]
    assert pods_needed(two, 1200 * MiB) == 7  # 80 copies, 12 a pod
    with pytest.raises(ValueError, match="more than a pod"):
        pods_needed([PoolModel("huge", 2000 * MiB)], 1200 * MiB)


@pytest.mark.parametrize("seed", range(20))
def test_pods_needed_is_enough_for_place_to_put_every_target_copy(seed: int) -> None:
    _, models = _instance(seed)
    models = [m for m in models if m.memory <= 1024 * MiB]
    count = pods_needed(models, 1024 * MiB)
    placed = place([PoolPod(f"p{i}", None, 1024 * MiB) for i in range(count)], models)
    assert all(placed.models[m.name].copies == m.target for m in models)
    assert sum(_pods_of(placed).values()) == sum(m.target for m in models)


def test_status_pool_says_per_model_where_how_many_and_why_and_keeps_the_measured_memory() -> None:
    pods = [PoolPod(f"p{i}", f"n{i}", 250 * MiB) for i in range(2)]
    declared = [PoolModel("a", 100 * MiB, wanted=2), PoolModel("b", 200 * MiB, wanted=2)]
    status = PoolStatus(
        models=[
            PoolModelStatus(name="b", measured_memory="120Mi"),
            PoolModelStatus(name="x", measured_memory="?"),
        ]
    )
    measured = measured_memory(status)
    assert measured == {"b": 120 * MiB}
    models = [PoolModel(m.name, measured.get(m.name, m.memory), wanted=m.wanted) for m in declared]
    placed = place(pods, models)
    report = pool_status(placed, models, measured, pods_needed=pods_needed(models, 250 * MiB))
    rows = {m.name: m for m in report.models}
    assert (rows["a"].pods, rows["a"].copies, rows["a"].reason) == (["p0", "p1"], 2, WANTED)
    # Measured, b takes 120 MiB and two copies fit beside a's; declared (200 MiB), they would not.
    assert (rows["b"].memory, rows["b"].measured_memory, rows["b"].copies) == ("120Mi", "120Mi", 2)
    assert place(pods, declared).models["b"].reason == BUDGET_FULL and rows["a"].measured_memory is None
    assert report.pods_needed == 2
    assert report.to_api()["models"][0] == {
        "name": "a",
        "pods": ["p0", "p1"],
        "copies": 2,
        "wantedCopies": 2,
        "memory": "100Mi",
        "reason": "Wanted",
        "message": "2 copies, as its load asks",
    }
    assert as_quantity(1000) == "1000" and as_quantity(3 * 1024**3) == "3Gi"


def _rule_alone(
    pods: Sequence[PoolPod], models: Sequence[PoolModel], current: Mapping[str, Sequence[str]] | None = None
) -> tuple[int, int]:
    """(copies placed, least copies unplaced) by the rounds alone, as placement was before it tried other
    orders: the kept copies, the rounds, and a placement from nothing when that places more least copies."""
    by_name = {m.name: m for m in models}
    order = sorted(models, key=lambda m: (-m.target, -m.memory, m.name))
    bins = _Bins(pods, by_name)
    _keep(bins, current or {})
    _fill(bins, order)
    if current and bins.unmet():
        fresh = _Bins(pods, by_name)
        _fill(fresh, order)
        if fresh.unmet() < bins.unmet():
            bins = fresh
    return bins.copies(), bins.unmet()


def _hot_instance(seed: int) -> tuple[list[PoolPod], list[PoolModel]]:
    """Models of one size, most wanting one copy and a few many, on about as many pods as their memory
    needs: where the rounds' best fit fills the pods before the hot models' last copies find pods."""
    rng = random.Random(seed)
    memory = rng.choice([60, 100, 120, 250]) * MiB
    budget = rng.choice([600, 1000, 1200, 1400]) * MiB
    models = [PoolModel(f"m{i:02d}", memory, wanted=1) for i in range(rng.randint(5, 45))]
    for i in rng.sample(range(len(models)), rng.randint(1, min(5, len(models)))):
        models[i] = PoolModel(models[i].name, memory, wanted=rng.randint(2, 6))
    copies = sum(m.target for m in models)
    count = max(-(-copies * memory // budget), *(m.target for m in models)) + rng.randint(0, 1)
    nodes = [f"node-{i}" for i in range(rng.randint(1, 3))]
    return [PoolPod(f"p{i:02d}", rng.choice(nodes), budget) for i in range(count)], models


def _copies_and_unmet(placed: Placement, models: Sequence[PoolModel]) -> tuple[int, int]:
    copies = sum(where.copies for where in placed.models.values())
    return copies, sum(max(0, m.min_copies - placed.models[m.name].copies) for m in models)


@pytest.mark.parametrize("seed", range(150))
def test_placement_never_places_fewer_copies_nor_more_least_copies_short_than_the_rounds_alone(
    seed: int,
) -> None:
    pods, models = _hot_instance(seed) if seed % 2 else _instance(seed)
    for current in ({}, _as_current(place(list(reversed(pods)), models[: len(models) // 2]))):
        copies, unmet = _copies_and_unmet(place(pods, models, current), models)
        before, before_unmet = _rule_alone(pods, models, current)
        assert copies >= before and unmet <= before_unmet, (current, copies, before, unmet, before_unmet)
        again = place(pods, models, _as_current(place(pods, models, current)))
        assert again.loads == () and again.unloads == ()


def test_placement_places_more_than_the_rounds_alone_where_hot_models_need_distinct_pods() -> None:
    better = 0
    for seed in range(150):
        pods, models = _hot_instance(seed)
        better += _copies_and_unmet(place(pods, models), models)[0] > _rule_alone(pods, models)[0]
    assert better > 0


def test_placement_holds_the_demos_hot_models_copies_on_as_few_pods_as_their_memory_takes() -> None:
    # bench/pool/demo.py --plan --memory 120Mi --budget 1200Mi at the peak: 41 models of 120Mi, the three
    # hot ones at 4 copies, the warm one at 2: 51 copies, 10 a pod.
    budget = 1200 * MiB
    models = [PoolModel(f"m{i}", 120 * MiB, wanted=4 if i < 3 else 2 if i == 3 else 1) for i in range(41)]
    lower = max(-(-sum(m.memory * m.target for m in models) // budget), *(m.target for m in models))
    pods = [PoolPod(f"p{i}", None, budget) for i in range(lower)]
    placed = place(pods, models)
    assert all(placed.models[m.name].copies == m.target for m in models)
    _check_budgets(pods, models, placed)
    # The rounds alone leave a hot model's last copy without a pod there (every pod with room holds it),
    # and the pool is sized by them: one pod more, the room a pool that grows copy by copy needs.
    assert _rule_alone(pods, models)[0] < sum(m.target for m in models)
    assert pods_needed(models, budget) == lower + 1


@pytest.mark.parametrize("seed", range(20))
def test_pods_needed_is_the_fewest_pods_on_which_the_rounds_put_every_copy(seed: int) -> None:
    _, models = _hot_instance(seed)
    budget = 1400 * MiB
    count = pods_needed(models, budget)
    total = sum(m.target for m in models)
    lower = max(-(-sum(m.memory * m.target for m in models) // budget), *(m.target for m in models))
    assert count >= lower
    assert _rule_alone([PoolPod(f"p{i}", None, budget) for i in range(count)], models)[0] == total
    if count > lower:
        assert _rule_alone([PoolPod(f"p{i}", None, budget) for i in range(count - 1)], models)[0] < total
    placed = place([PoolPod(f"p{i}", None, budget) for i in range(count)], models)
    assert all(placed.models[m.name].copies == m.target for m in models)


def test_the_only_copies_of_a_pod_that_is_gone_load_on_different_pods() -> None:
    # p0 holds the only copies of a, b and c; p1-p3 have room for all three each, p1 the least.
    pods = [PoolPod(f"p{i}", f"n{i}", 1000 * MiB) for i in range(4)]
    models = [PoolModel(name, 100 * MiB) for name in ("a", "b", "c")] + [
        PoolModel(f"x{i}", 100 * MiB) for i in range(9)
    ]
    current = {
        "p0": ("a", "b", "c"),
        "p1": ("x0", "x1", "x2", "x3"),
        "p2": ("x4", "x5", "x6"),
        "p3": ("x7", "x8"),
    }
    placed = place(pods[1:], models, current)
    assert sorted(model for _, model in placed.loads) == ["a", "b", "c"]
    assert len({pod for pod, _ in placed.loads}) == 3
    for pod in ("p1", "p2", "p3"):
        assert set(current[pod]) <= set(placed.pods[pod])
    again = place(pods[1:], models, _as_current(placed))
    assert again.loads == () and again.unloads == ()


def test_loads_spread_over_pods_that_hold_models_and_leave_an_empty_pods_room_whole() -> None:
    pods = [PoolPod(f"p{i}", f"n{i}", 1000 * MiB) for i in range(4)]
    models = [PoolModel(name, 100 * MiB) for name in ("a", "b", "c")] + [
        PoolModel(f"x{i}", 100 * MiB) for i in range(7)
    ]
    current = {"p0": ("a", "b", "c"), "p1": ("x0", "x1", "x2", "x3"), "p2": ("x4", "x5", "x6")}
    placed = place(pods[1:], models, current)
    loads = [pod for pod, _ in placed.loads]
    assert sorted(model for _, model in placed.loads) == ["a", "b", "c"]
    assert placed.pods["p3"] == ()
    assert sorted(loads.count(pod) for pod in ("p1", "p2")) == [1, 2]


@pytest.mark.parametrize("seed", range(40))
def test_loads_after_a_pod_is_gone_spread_and_kept_copies_stay(seed: int) -> None:
    pods, models = _hot_instance(seed) if seed % 2 else _instance(seed)
    first = place([*pods, PoolPod("spare", "node-x", pods[0].budget)], models)
    gone = max(first.pods, key=lambda pod: (len(first.pods[pod]), pod))
    survivors = [p for p in [*pods, PoolPod("spare", "node-x", pods[0].budget)] if p.name != gone]
    current = _as_current(first)
    second = place(survivors, models, current)
    _check_budgets(survivors, models, second)
    before, before_unmet = _rule_alone(survivors, models, current)
    copies, unmet = _copies_and_unmet(second, models)
    assert copies >= before and unmet <= before_unmet
    third = place(survivors, models, _as_current(second))
    assert third.loads == () and third.unloads == ()

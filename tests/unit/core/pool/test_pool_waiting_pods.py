"""status.pool's messages name the pool's pods that do not run yet, for the models short of a pod only,
and the pods whose agent waits for something before it can load a model (core.pool.explain)."""

from __future__ import annotations

from triton_operator.core.pool.assignment import Copy
from triton_operator.core.pool.explain import agents_waiting, waiting_for
from triton_operator.core.pool.placement import BUDGET_FULL, TOO_FEW_PODS, WANTED, PoolModel, PoolPod, place

MIB = 1 << 20


def test_only_the_models_short_of_a_pod_name_the_waiting_pods() -> None:
    pods = [PoolPod("p0", "n0", 200 * MIB)]
    models = [
        PoolModel("full", 100 * MIB, min_copies=1, wanted=1),
        PoolModel("short", 100 * MIB, min_copies=1, wanted=1),
        PoolModel("wide", 50 * MIB, min_copies=1, max_copies=3, wanted=2),
        PoolModel("late", 100 * MIB, min_copies=1, wanted=1),
    ]
    placed = place(pods, models)
    reasons = {name: m.reason for name, m in placed.models.items()}
    assert sorted(reasons.values()).count(WANTED) >= 1 and BUDGET_FULL in reasons.values(), reasons
    assert TOO_FEW_PODS in reasons.values(), reasons
    why = "Pending, Unschedulable: 0/1 nodes are available: 1 node(s) were unschedulable."
    shown = waiting_for(placed, {"p1": why})
    for name, entry in shown.models.items():
        before = placed.models[name]
        assert (entry.pods, entry.reason, entry.target) == (before.pods, before.reason, before.target)
        if before.reason in (BUDGET_FULL, TOO_FEW_PODS):
            assert entry.message.startswith(before.message) and f"p1 is {why}" in entry.message, entry
        else:
            assert entry.message == before.message, entry
    assert waiting_for(placed, {}) == placed


def test_a_model_an_agent_waits_for_names_each_such_pod_and_what_it_waits_for() -> None:
    placed = place(
        [PoolPod("p0", "n0", 200 * MIB), PoolPod("p1", "n1", 200 * MIB)],
        [
            PoolModel("a", 100 * MIB, min_copies=2, wanted=2),
            PoolModel("b", 100 * MIB, min_copies=1, wanted=1),
        ],
    )
    waits = "waits for revision r2's files, not in the in-place volume after 5s"
    reports = {
        "p1": {"a": Copy("UNAVAILABLE", "v2", waiting=waits), "b": Copy("READY", "v1")},
        "p0": {"a": Copy("READY", "v1", waiting=waits)},
        "gone": {"z": Copy("UNAVAILABLE", "v1", waiting=waits)},  # a model placement does not have
    }
    shown = agents_waiting(placed, reports)
    assert shown.models["a"].message == f"{placed.models['a'].message}; pod p0 {waits}; pod p1 {waits}"
    assert shown.models["b"] == placed.models["b"] and set(shown.models) == set(placed.models)
    assert agents_waiting(placed, {"p0": {"a": Copy("READY", "v1")}}) == placed

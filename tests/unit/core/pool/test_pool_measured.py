"""Each model's memory measured at its load: the agent's report carries it, status keeps it rounded and
with hysteresis, placement counts the larger of declared and measured, and one larger than a pod is said."""

from __future__ import annotations

import pytest

from triton_operator.core.pool.assignment import (
    AssignmentError,
    Copy,
    build_report,
    parse_report,
)
from triton_operator.core.pool.copies import fit_pool
from triton_operator.core.pool.explain import update_measured
from triton_operator.core.pool.placement import BUDGET_FULL, LARGER_THAN_POD, PoolModel, PoolPod, place

MiB = 1 << 20


def test_the_report_carries_the_memory_measured_and_refuses_a_bad_one_naming_it() -> None:
    copies = {"a": Copy("READY", "v1", memory=123 * MiB + 5), "b": Copy("LOADING", "v2", attempt=2)}
    report = build_report(copies)
    assert "memory" not in report["models"]["b"]
    assert parse_report(report) == copies
    with pytest.raises(AssignmentError, match=r"models\.a\.memory"):
        parse_report({"models": {"a": {"state": "READY", "version": "v", "attempt": 1, "memory": -1}}})
    with pytest.raises(AssignmentError, match=r"models\.a\.memory"):
        parse_report({"models": {"a": {"state": "READY", "version": "v", "attempt": 1, "memory": "1Mi"}}})


def test_the_kept_figure_is_the_largest_ready_copy_rounded_up_to_a_mib_and_changes_only_beyond_a_tenth() -> (
    None
):
    reports = {
        "p0": {"a": Copy("READY", "v1", memory=300 * MiB + 1), "b": Copy("LOADING", "v1", memory=900 * MiB)},
        "p1": {"a": Copy("READY", "v1", memory=280 * MiB), "c": Copy("READY", "v1")},
    }
    first = update_measured({}, reports, ["a", "b", "c"])
    assert first == {"a": 301 * MiB}  # b is not READY, c not measured: neither has a figure
    # Within a tenth of the kept figure: kept (status does not churn); beyond: replaced, down as up.
    assert update_measured({"a": 290 * MiB}, reports, ["a"]) == {"a": 290 * MiB}
    assert update_measured({"a": 200 * MiB}, reports, ["a"]) == {"a": 301 * MiB}
    assert update_measured({"a": 400 * MiB}, reports, ["a"]) == {"a": 301 * MiB}
    # No report of it: the kept figure stays; a model gone from the spec goes.
    assert update_measured({"a": 290 * MiB, "gone": MiB, "c": 5 * MiB}, {}, ["a", "c"]) == {
        "a": 290 * MiB,
        "c": 5 * MiB,
    }


def test_a_model_measured_larger_than_a_pod_is_never_placed_and_says_so_without_failing() -> None:
    pods = [PoolPod(f"p{i}", f"n{i}", 1000 * MiB) for i in range(2)]
    models = [PoolModel("big", 1200 * MiB), PoolModel("small", 100 * MiB, min_copies=2, wanted=2)]
    placed = place(pods, models, {"p0": ("big", "small")})
    assert placed.models["big"].copies == 0 and placed.models["big"].reason == LARGER_THAN_POD
    assert (
        "1258291200 bytes" in placed.models["big"].message and "memoryPerPod" in placed.models["big"].message
    )
    assert placed.models["small"].pods == ("p0", "p1")
    assert ("p0", "big") in placed.unloads
    size = fit_pool(models, 1000 * MiB, 4)  # no ValueError: the pool is sized for what can be placed
    assert size.pods == 2 and size.wanted == {"big": 1, "small": 2}


def test_memory_a_pod_holds_outside_placement_is_given_to_no_model() -> None:
    pods = [PoolPod("p0", "n0", 1000 * MiB, reserved=700 * MiB), PoolPod("p1", "n1", 1000 * MiB)]
    models = [PoolModel("m", 400 * MiB, min_copies=2, wanted=2), PoolModel("k", 300 * MiB)]
    placed = place(pods, models, {"p0": ("m", "k")})
    assert placed.pods == {"p0": ("k",), "p1": ("m",)}, placed.pods
    assert placed.models["m"].reason == BUDGET_FULL  # its second copy has no pod with room
    assert PoolPod("p", None, 100, reserved=300).room == 0

"""spec.pool refuses what cannot fit, naming the field: a model without memory or over a pod, bad copies."""

from __future__ import annotations

import copy
from typing import Any

from triton_operator.core.pool.members import pool_models, thresholds
from triton_operator.core.spec.validation.spec import check_spec, spec_warnings
from triton_operator.models import TritonServiceSpec
from tritonservice_bodies import CONFIG


def _spec(models: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
        "models": [{"config": copy.deepcopy(CONFIG), **m} for m in models],
        **spec,
    }


def _errors(raw: dict[str, Any]) -> list[tuple[str, str]]:
    parsed, errors = check_spec(raw)
    assert parsed is not None, errors
    return [(e.field, e.message) for e in errors]


def _forty(**extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"m{i:02d}", "memory": "100Mi", **extra} for i in range(40)]


def test_forty_models_of_100_mib_fit_a_pool_of_four_pods_of_1200_mib() -> None:
    assert _errors(_spec(_forty(), replicas=4, pool={"memoryPerPod": "1200Mi"})) == []


def test_without_a_pool_every_model_loads_everywhere_and_copies_are_refused() -> None:
    raw = _spec([{"name": "a", "memory": "1Gi"}, {"name": "b", "minCopies": 2, "maxCopies": 3}])
    assert _errors(raw) == [
        (
            "spec.models[1].minCopies",
            "only used in a pool: set spec.pool (its memoryPerPod), or leave it out",
        ),
        (
            "spec.models[1].maxCopies",
            "only used in a pool: set spec.pool (its memoryPerPod), or leave it out",
        ),
    ]
    parsed, _ = check_spec(_spec([{"name": "a"}]))
    assert parsed is not None and parsed.pool is None


def test_a_model_without_memory_or_larger_than_a_pod_is_refused_naming_it() -> None:
    raw = _spec([{"name": "a"}, {"name": "b", "memory": "2Gi"}], replicas=2, pool={"memoryPerPod": "1Gi"})
    errors = _errors(raw)
    assert [field for field, _ in errors] == ["spec.models[0].memory", "spec.models[1].memory"]
    assert "is required in a pool" in errors[0][1]
    assert "2Gi is more than spec.pool.memoryPerPod (1Gi)" in errors[1][1]


def test_least_copies_above_most_or_above_the_pods_are_refused() -> None:
    raw = _spec(
        [
            {"name": "a", "memory": "1Mi", "minCopies": 3, "maxCopies": 2},
            {"name": "b", "memory": "1Mi", "minCopies": 5},
        ],
        replicas=4,
        pool={"memoryPerPod": "1Gi"},
    )
    assert _errors(raw) == [
        ("spec.models[0].minCopies", "3 is more than maxCopies (2)"),
        (
            "spec.models[1].minCopies",
            "5 copies need 5 pods (a copy a pod), and the pool has at most 4 (spec.replicas)",
        ),
    ]
    scaled = {
        "minReplicas": 1,
        "maxReplicas": 5,
        "metrics": [{"queueTime": {"averageMicroseconds": 1000}}],
    }
    assert _errors({**raw, "models": raw["models"][1:], "autoscaling": scaled}) == []


def test_least_copies_the_pods_cannot_hold_together_are_refused_naming_each_left_out() -> None:
    raw = _spec(_forty(minCopies=2), replicas=4, pool={"memoryPerPod": "1200Mi"})  # 80 copies, 48 fit
    errors = _errors(raw)
    assert errors and all(field.endswith(".minCopies") for field, _ in errors)
    assert "4 pods (spec.replicas) of 1200Mi (spec.pool.memoryPerPod) cannot hold them all" in errors[0][1]
    assert _errors({**raw, "replicas": 7}) == []


def test_the_idle_rate_must_be_a_number() -> None:
    raw = _spec(
        _forty(), replicas=4, pool={"memoryPerPod": "1200Mi", "scaling": {"idleInferencesPerSecond": "1e"}}
    )
    parsed, errors = check_spec(raw)
    # The schema's quantity pattern lets "1e" through; the check names it.
    assert [e.field for e in errors] == ["spec.pool.scaling.idleInferencesPerSecond"]
    assert parsed is not None


def test_placement_counts_the_larger_of_the_declared_and_the_measured_memory() -> None:
    spec = TritonServiceSpec.model_validate(
        _spec(
            [
                {"name": "a", "memory": "100Mi", "minCopies": 2},
                {"name": "b", "memory": "1Mi", "maxCopies": 3},
            ],
            pool={"memoryPerPod": "1Gi"},
        )
    )
    models = {m.name: m for m in pool_models(spec, measured={"a": 300 * 1024 * 1024}, wanted={"b": 5})}
    assert (models["a"].memory, models["a"].min_copies, models["a"].target) == (300 * 1024 * 1024, 2, 2)
    assert (models["b"].memory, models["b"].max_copies, models["b"].target) == (1024 * 1024, 3, 3)
    smaller = {m.name: m for m in pool_models(spec, measured={"a": 50 * 1024 * 1024})}
    assert smaller["a"].memory == 100 * 1024 * 1024  # measured smaller: the declared room is kept


def test_the_scaling_thresholds_come_from_spec_pool_scaling() -> None:
    spec = TritonServiceSpec.model_validate(
        _spec(
            _forty(),
            pool={
                "memoryPerPod": "1200Mi",
                "scaling": {"busyQueueMicroseconds": 5000, "idleInferencesPerSecond": "500m"},
            },
        )
    )
    found = thresholds(spec)
    assert (found.busy_queue_us, found.idle_rate, found.stabilization_s) == (5000, 0.5, 300)


def test_a_pool_is_said_not_carried_out_yet_until_the_pods_load_by_placement() -> None:
    spec = TritonServiceSpec.model_validate(_spec(_forty(), replicas=4, pool={"memoryPerPod": "1200Mi"}))
    assert [w.field for w in spec_warnings(spec, "nvcr.io/nvidia/tritonserver:25.01-py3")] == ["spec.pool"]
    plain = TritonServiceSpec.model_validate(_spec([{"name": "a"}]))
    assert spec_warnings(plain, "nvcr.io/nvidia/tritonserver:25.01-py3") == []


def test_a_busy_rate_not_above_the_idle_rate_is_refused_and_the_waits_are_read() -> None:
    scaling = {"busyInferencesPerSecond": "1", "idleInferencesPerSecond": "2"}
    raw = _spec(_forty(), replicas=4, pool={"memoryPerPod": "1200Mi", "scaling": scaling})
    assert _errors(raw) == [
        (
            "spec.pool.scaling.busyInferencesPerSecond",
            "1 is not above idleInferencesPerSecond (2): a copy added for being busy would be idle at once,"
            " and copies would come and go",
        )
    ]
    bad = _spec(
        _forty(), replicas=4, pool={"memoryPerPod": "1200Mi", "scaling": {"busyInferencesPerSecond": "x"}}
    )
    assert [e.field for e in check_spec(bad)[1]] == ["spec.pool.scaling.busyInferencesPerSecond"]
    waits: dict[str, Any] = {
        "busyInferencesPerSecond": "50",
        "scaleUpStabilizationSeconds": 5,
        "windowSeconds": 30,
    }
    spec = TritonServiceSpec.model_validate(
        _spec(_forty(), pool={"memoryPerPod": "1200Mi", "scaling": waits})
    )
    found = thresholds(spec)
    assert (found.busy_rate, found.up_stabilization_s, found.idle_rate) == (50.0, 5.0, 1.0)

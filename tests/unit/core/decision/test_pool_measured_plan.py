"""A pass keeps each model's memory measured by the agents (status.pool.models[].measuredMemory) and
places by the larger of declared and measured: a model measured larger than declared overfills no pod."""

from __future__ import annotations

import dataclasses

from test_pool_copies_plan import (  # type: ignore[import-not-found,unused-ignore]
    by_model,
    service,
    serving_pods,
    status_after,
)

from triton_operator.core.decision.pool_plan import decide_pool
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION, Copy, parse_assignment
from triton_operator.core.pool.placement import LARGER_THAN_POD

MiB = 1 << 20


def measured(reports: dict[str, dict[str, Copy]], model: str, size: int) -> dict[str, dict[str, Copy]]:
    return {
        pod: {m: dataclasses.replace(c, memory=size) if m == model else c for m, c in copies.items()}
        for pod, copies in reports.items()
    }


def test_a_model_measured_larger_than_declared_is_kept_in_status_and_moves_off_a_pod_it_would_overfill() -> (
    None
):
    ts = service(replicas=3)  # models of 400Mi declared on pods of 1000Mi
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"], "p2": []})
    before = status_after(ts, pods, reports, {}, None, now=1000.0)
    assert all("measuredMemory" not in m for m in by_model(before).values())
    assert by_model(before)["a"]["pods"] == ["p0"] and by_model(before)["b"]["pods"] == ["p0"]

    grown = measured(reports, "a", 700 * MiB - 3)
    after = status_after(ts, pods, grown, before, None, now=1010.0)
    a = by_model(after)["a"]
    assert (a["measuredMemory"], a["memory"]) == ("700Mi", "700Mi")
    assert by_model(after)["b"]["memory"] == "400Mi"
    held = {
        pod: [m for m, row in by_model(after).items() if pod in row["pods"]] for pod in ("p0", "p1", "p2")
    }
    assert sorted(held["p0"]) != ["a", "b"], held  # 700Mi + 400Mi do not go on a pod of 1000Mi
    assert all(len(models) == 1 for models in held.values()), held


def test_the_measured_figure_changes_only_beyond_a_tenth_and_a_smaller_one_keeps_the_declared_room() -> None:
    ts = service(replicas=3)
    pods, reports = serving_pods({"p0": ["a"], "p1": ["b"], "p2": ["c"]})
    first = status_after(ts, pods, measured(reports, "a", 500 * MiB), {}, None, now=1000.0)
    assert by_model(first)["a"]["measuredMemory"] == "500Mi"
    near = status_after(ts, pods, measured(reports, "a", 540 * MiB), first, None, now=1010.0)
    assert by_model(near)["a"]["measuredMemory"] == "500Mi"  # within a tenth: status unchanged
    far = status_after(ts, pods, measured(reports, "a", 100 * MiB), near, None, now=1020.0)
    row = by_model(far)["a"]
    assert (row["measuredMemory"], row["memory"]) == ("100Mi", "400Mi")  # the declared room is kept
    gone = status_after(ts, pods, reports, far, None, now=1030.0)  # no measurement in the reports
    assert by_model(gone)["a"]["measuredMemory"] == "100Mi"


def test_a_model_measured_larger_than_a_pod_is_taken_off_and_named_and_the_pass_does_not_fail() -> None:
    ts = service(replicas=3)
    pods, reports = serving_pods({"p0": ["a"], "p1": ["b"], "p2": ["c"]})
    after = status_after(ts, pods, measured(reports, "a", 1500 * MiB), {}, None, now=1000.0)
    a = by_model(after)["a"]
    assert a["reason"] == LARGER_THAN_POD and a["pods"] == [] and a["measuredMemory"] == "1500Mi"
    assert "1572864000 bytes" in a["message"] and "spec.pool.memoryPerPod" in a["message"]
    # The pass itself does not fail (no crash loop), and no other pod is given it.
    plan = decide_pool(
        ts, pods, measured(reports, "a", 1500 * MiB), revisions=["r1"], configs={}, previous={}, now=1000.0
    )
    assert plan is not None and plan.status is not None
    warned = [e for e in plan.events if e.reason == "PoolModelLargerThanPod"]
    assert len(warned) == 1 and warned[0].message.startswith("model a: one copy needs 1572864000 bytes")
    # Said once: the next pass, which reads the status that says so, warns no more.
    again = decide_pool(
        ts,
        pods,
        measured(reports, "a", 1500 * MiB),
        revisions=["r1"],
        configs={},
        previous={"pool": plan.status},
        now=1010.0,
    )
    assert again is not None and not [e for e in again.events if e.reason == "PoolModelLargerThanPod"]
    for patch in plan.patches:
        for key, text in patch.annotations.items():
            if key != ASSIGNMENT_ANNOTATION:
                continue
            assert text is None or "a" not in parse_assignment(text).models or patch.pod == "p0"


def test_the_pod_still_holding_a_model_larger_than_a_pod_is_given_nothing_more_on_top_of_it() -> None:
    ts = service(replicas=3)  # pods of 1000Mi
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"], "p2": []})
    after = status_after(ts, pods, measured(reports, "a", 1100 * MiB), {}, None, now=1000.0)
    rows = by_model(after)
    assert rows["a"]["reason"] == LARGER_THAN_POD and rows["a"]["pods"] == []
    # a stays loaded on p0 (its last copy), so p0 has no room left: b moves off it, nothing comes on.
    assert "p0" not in rows["b"]["pods"] and "p0" not in rows["c"]["pods"], rows
    assert rows["b"]["copies"] == 1 and rows["c"]["copies"] == 1


def test_a_copy_placed_anew_says_whether_status_pool_keeps_its_models_measured_memory() -> None:
    """The pod holding a and b goes: their new copies are placed on the pods that stay. a's memory is
    in status.pool (measured): its new entry says so, and the agent may load it beside another; b's is
    not: its entry does not, and the agent loads it alone, to measure it."""
    ts = service(replicas=3)
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"], "p2": []})
    before = status_after(ts, pods, measured(reports, "a", 300 * MiB), {}, None, now=1000.0)
    assert by_model(before)["a"]["measuredMemory"] == "300Mi"
    assert "measuredMemory" not in by_model(before)["b"]
    staying = [p for p in pods if p["metadata"]["name"] != "p0"]
    plan = decide_pool(
        ts,
        staying,
        {p: r for p, r in reports.items() if p != "p0"},
        revisions=["r1"],
        configs={},
        previous=before,
        now=1010.0,
    )
    assert plan is not None
    entries = {
        m: w
        for patch in plan.patches
        for m, w in parse_assignment(patch.annotations[ASSIGNMENT_ANNOTATION]).models.items()
    }
    assert entries["a"].measured and not entries["b"].measured
    assert not entries["c"].measured  # held already: its entry as it was written

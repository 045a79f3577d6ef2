"""A pass's copies decision for a pool (core.decision.pool_plan.pool_copies): the figures against the copies
that serve, the streaks and last use carried in status.pool, the pool's pods following the wanted copies
within spec.replicas and the most pods, and memory short taking the least recently used extra first."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.core.decision.pool_plan import decide_pool, pool_copies
from triton_operator.core.objects.names import LABEL_REVISION
from triton_operator.core.pool.assignment import (
    ASSIGNMENT_ANNOTATION,
    Copy,
    PodAssignment,
    Wanted,
    build_assignment,
)
from triton_operator.core.pool.copies import (
    ADD,
    BUSY_WAITING,
    DROP,
    LOADING,
    MEMORY_SHORT,
    NO_READINGS,
    Figures,
)
from triton_operator.core.pool.labels import READY, model_label_key
from triton_operator.models import TritonService
from tritonservice_bodies import CONFIG

MODELS = ("a", "b", "c")
BUSY = Figures(inferences_per_second=90.0, queue_us=80_000.0, requests=5400.0)
CALM = Figures(inferences_per_second=5.0, queue_us=500.0, requests=300.0)
IDLE = Figures(inferences_per_second=0.0, queue_us=None, requests=0.0)


def service(replicas: int = 2, max_replicas: int | None = 6, **scaling: Any) -> TritonService:
    """Three models of 400Mi on pods of 1000Mi (two a pod), one least copy each."""
    spec: dict[str, Any] = {
        "replicas": replicas,
        "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
        "pool": {"memoryPerPod": "1000Mi", "scaling": scaling},
        "models": [{"name": m, "config": copy.deepcopy(CONFIG), "memory": "400Mi"} for m in MODELS],
    }
    if max_replicas is not None:
        spec["autoscaling"] = {
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metrics": [{"queueTime": {"averageMicroseconds": 5000}}],
        }
    return TritonService.model_validate(
        {"metadata": {"name": "pool", "namespace": "ml", "uid": "u"}, "spec": spec}
    )


def serving_pods(
    holding: Mapping[str, Sequence[str]],
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Copy]]]:
    """Live pods holding, READY and labelled, the models given, and their agents' reports."""
    pods, reports = [], {}
    for name, models in holding.items():
        assignment = PodAssignment(models={m: Wanted("v1") for m in models})
        pods.append(
            {
                "metadata": {
                    "name": name,
                    "labels": {LABEL_REVISION: "r1", **{model_label_key(m): READY for m in models}},
                    "annotations": {ASSIGNMENT_ANNOTATION: build_assignment(assignment)},
                    "resourceVersion": "1",
                },
                "spec": {"nodeName": f"node-{name}"},
                "status": {"podIP": "10.0.0.1"},
            }
        )
        reports[name] = {m: Copy("READY", "v1") for m in models}
    return pods, reports


def status_after(
    ts: TritonService, pods: list[dict[str, Any]], reports: Any, previous: Any, load: Any, *, now: float
) -> dict[str, Any]:
    """status.pool as the pass writes it, to carry to the next pass."""
    copies = pool_copies(ts, pods, reports, previous=previous, load=load, now=now)
    plan = decide_pool(
        ts, pods, reports, revisions=["r1"], configs={}, previous=previous, now=now, copies=copies
    )
    assert plan is not None and plan.status is not None
    return {"pool": plan.status}


def by_model(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in status["pool"]["models"]}


def test_a_busy_model_gains_a_copy_after_the_wait_carried_in_status_and_the_pool_grows_for_it() -> None:
    ts = service(replicas=2)
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    load = {"a": BUSY, "b": CALM, "c": CALM}
    first = status_after(ts, pods, reports, {}, load, now=1000.0)
    assert by_model(first)["a"]["copiesReason"] == BUSY_WAITING
    assert by_model(first)["a"]["busySince"] == "1970-01-01T00:16:40Z"
    assert by_model(first)["a"]["wantedCopies"] == 1
    # The figures are the operator's metrics: the sentence names the threshold and the wait.
    assert not {"queueMicroseconds", "inferencesPerSecond"} & set(by_model(first)["a"])
    assert by_model(first)["a"]["copiesMessage"] == (
        "busy (over 10 ms in the queue a request): one more copy once busy for 30s"
    )
    early = pool_copies(ts, pods, reports, previous=first, load=load, now=1029.0)
    assert early is not None and early.wanted["a"] == 1
    later = pool_copies(ts, pods, reports, previous=first, load=load, now=1030.0)
    assert later is not None and later.wanted == {"a": 2, "b": 1, "c": 1}
    assert later.shown["a"].reason == ADD
    assert later.pods_needed == 2 and later.replicas == 2  # 4 copies of 400Mi: two pods


def test_the_pool_size_follows_the_sum_up_to_the_most_pods_and_back_to_spec_replicas() -> None:
    ts = service(replicas=1, max_replicas=6, scaleUpStabilizationSeconds=0, scaleDownStabilizationSeconds=0)
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    previous: dict[str, Any] = {}
    sizes = []
    for step in range(8):  # every model busy: one copy more each pass, up to one on every pod allowed
        copies = pool_copies(ts, [], {}, previous=previous, load=dict.fromkeys(MODELS, BUSY), now=float(step))
        assert copies is not None
        sizes.append(copies.replicas)
        wanted = copies.wanted
        # Every wanted copy serves by the next pass.
        holding = {f"p{i}": [m for m in MODELS if wanted[m] > i] for i in range(max(wanted.values()))}
        pods, reports = serving_pods(holding)
        previous = status_after(ts, pods, reports, previous, dict.fromkeys(MODELS, BUSY), now=float(step))
    assert sizes == sorted(sizes) and sizes[-1] == 6 and sizes[0] == 2  # 3 copies of 400Mi need 2 pods
    assert all(m["wantedCopies"] <= 6 for m in previous["pool"]["models"])
    for step in range(8, 30):  # every model idle: copies drop to the least, the pool to spec.replicas
        copies = pool_copies(
            ts, pods, reports, previous=previous, load=dict.fromkeys(MODELS, IDLE), now=float(step)
        )
        assert copies is not None
        previous = status_after(ts, pods, reports, previous, dict.fromkeys(MODELS, IDLE), now=float(step))
    assert copies is not None and copies.wanted == dict.fromkeys(MODELS, 1)
    assert copies.replicas == 2  # 3 x 400Mi: still 2 pods
    assert copies.pods_needed == 2 and previous["pool"]["podsNeeded"] == 2


def test_without_autoscaling_the_pool_keeps_its_pods_and_the_least_recently_used_extra_goes() -> None:
    ts = service(replicas=2, max_replicas=None, scaleUpStabilizationSeconds=0)
    # Two pods of two models each: room for four copies. a and b want a second copy; c (used least
    # recently) has only its least copy, which is never taken back.
    previous = {
        "pool": {
            "models": [
                {"name": "a", "wantedCopies": 1, "lastUsed": "2026-01-01T10:00:00Z"},
                {"name": "b", "wantedCopies": 1, "lastUsed": "2026-01-01T11:00:00Z"},
                {"name": "c", "wantedCopies": 1, "lastUsed": "2026-01-01T09:00:00Z"},
            ]
        }
    }
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    load = {"a": Figures(90.0, 80_000.0, 0.0), "b": Figures(90.0, 80_000.0, 0.0), "c": IDLE}
    copies = pool_copies(ts, pods, reports, previous=previous, load=load, now=1.77e9)
    assert copies is not None and copies.replicas == 2
    assert copies.wanted == {"a": 1, "b": 2, "c": 1}  # a was used before b: its extra copy goes first
    assert copies.shown["a"].reason == MEMORY_SHORT and copies.shown["b"].reason == ADD
    assert "least recently used" in copies.shown["a"].message


def test_a_model_used_in_the_window_is_remembered_as_used_in_this_5_minute_period() -> None:
    """lastUsed is kept to 5 minutes (the period's start), so the windows that see a request within
    one period leave the status as it was; the next period's first one moves it."""
    ts = service()
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    now = datetime.datetime(2026, 2, 2, 2, 43, 17, tzinfo=datetime.UTC)
    load = {"a": CALM, "b": IDLE, "c": IDLE}
    status = status_after(ts, pods, reports, {}, load, now=now.timestamp())
    assert by_model(status)["a"]["lastUsed"] == "2026-02-02T02:40:00Z"
    assert "lastUsed" not in by_model(status)["b"]
    later = status_after(ts, pods, reports, status, load, now=now.timestamp() + 100)
    assert later == status  # 02:44:57: the same period, nothing to write
    next_period = status_after(ts, pods, reports, later, load, now=now.timestamp() + 200)
    assert by_model(next_period)["a"]["lastUsed"] == "2026-02-02T02:45:00Z"


def test_without_figures_every_model_keeps_what_it_wanted() -> None:
    ts = service(scaleDownStabilizationSeconds=0)
    previous = {"pool": {"models": [{"name": "a", "wantedCopies": 2}, {"name": "b", "wantedCopies": 1}]}}
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["a", "c"]})
    copies = pool_copies(ts, pods, reports, previous=previous, load=None, now=5.0)
    assert copies is not None and copies.wanted == {"a": 2, "b": 1, "c": 1}
    assert {s.reason for s in copies.shown.values()} == {NO_READINGS}
    idle = pool_copies(ts, pods, reports, previous=previous, load=dict.fromkeys(MODELS, IDLE), now=5.0)
    assert idle is not None and idle.wanted["a"] == 1 and idle.shown["a"].reason == DROP


def test_a_copy_loading_holds_a_busy_model_but_a_copy_draining_does_not() -> None:
    ts = service(scaleUpStabilizationSeconds=0)
    previous = {"pool": {"models": [{"name": "a", "wantedCopies": 1}]}}
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    extra = PodAssignment(models={"c": Wanted("v1"), "a": Wanted("v1")})
    pods[1]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = build_assignment(extra)  # a loads on p1
    load = {"a": BUSY, "b": CALM, "c": CALM}
    loading = pool_copies(ts, pods, reports, previous=previous, load=load, now=5.0)
    assert loading is not None and loading.wanted["a"] == 1 and loading.shown["a"].reason == LOADING
    draining = PodAssignment(models={"c": Wanted("v1"), "a": Wanted("v1")}, draining={"a": 1.0})
    pods[1]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = build_assignment(draining)  # a leaves p1
    busy = pool_copies(ts, pods, reports, previous=previous, load=load, now=5.0)
    assert busy is not None and busy.wanted["a"] == 2 and busy.shown["a"].reason == ADD


def test_memory_short_between_models_busy_in_one_period_takes_the_copy_of_the_one_serving_less() -> None:
    ts = service(replicas=2, max_replicas=None, scaleUpStabilizationSeconds=0)
    # a and b both served requests in this window: their lastUsed is the same 5-minute period. Both are
    # busy and ask for a second copy; room is left for one. b serves a third of a's requests: b's goes.
    previous = {"pool": {"models": [{"name": m, "wantedCopies": 1} for m in ("a", "b", "c")]}}
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    load = {"a": Figures(90.0, 80_000.0, 900.0), "b": Figures(30.0, 80_000.0, 300.0), "c": IDLE}
    copies = pool_copies(ts, pods, reports, previous=previous, load=load, now=1.77e9)
    assert copies is not None and copies.replicas == 2
    assert copies.last_used["a"] == copies.last_used["b"]
    assert copies.wanted == {"a": 2, "b": 1, "c": 1}
    assert copies.shown["b"].reason == MEMORY_SHORT and copies.shown["a"].reason == ADD

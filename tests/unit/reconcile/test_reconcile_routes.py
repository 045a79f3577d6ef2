"""reconcile.routes over MemKube (an in-memory fake of KubeAPI): the weights written on the user's
Gateway API routes, a conflicting write read again and retried, routes missing or pointing elsewhere.

A fake because a real API server cannot be made to change a route between the operator's read and
its write on demand; tests/e2e/test_rollout_e2e.py writes real routes on a real one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bigmanifest import plan_for
from memkube import Call, MemKube
from triton_operator.adapters.kube import ConflictError
from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import TritonService
from triton_operator.reconcile.routes import (
    ROUTE_RETRY_SECONDS,
    ROUTE_WRITE_ATTEMPTS,
    route_traffic,
    set_route,
)

NS = "ml"
STABLE, CANARY = "svc-stable", "svc-canary"
PLAN: RolloutPlan = dataclasses.replace(plan_for("r1"), weights=TrafficWeights.canary_percent(20))


def make_ts(http: str | None = "web", grpc: str | None = "grpc") -> TritonService:
    gateway = {k: v for k, v in (("httpRoute", http), ("grpcRoute", grpc)) if v is not None}
    return TritonService.model_validate(
        {
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {
                "repository": {"uri": "s3://models/prod"},
                "models": [{"name": "add", "config": {"backend": "python"}}],
                "rollout": {"trafficRouting": {"gatewayAPI": gateway}},
            },
        }
    )


def route(kind: str, name: str, *backends: str) -> dict[str, Any]:
    port = 8000 if kind == "HTTPRoute" else 8001
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "rules": [{"backendRefs": [{"name": b, "port": port} for b in backends or (STABLE,)]}],
        },
    }


def weights(kube: MemKube, kind: str, name: str) -> dict[str, int | None]:
    """Weight per backend over every rule of the stored route."""
    stored = kube.find(kind, NS, name)
    assert stored is not None
    return {ref["name"]: ref.get("weight") for rule in stored["spec"]["rules"] for ref in rule["backendRefs"]}


@pytest.fixture
def kube() -> MemKube:
    kube = MemKube()
    kube.put(route("HTTPRoute", "web"))
    kube.put(route("GRPCRoute", "grpc"))
    return kube


async def test_both_routes_get_the_plans_weights(kube: MemKube) -> None:
    traffic = await route_traffic(kube, make_ts(), PLAN)
    assert traffic is not None
    assert (traffic.verdict.status, traffic.verdict.reason) == (cond.TRUE, cond.WEIGHTS_SET)
    assert traffic.retry_after is None
    assert weights(kube, "HTTPRoute", "web") == {STABLE: 80, CANARY: 20}
    assert weights(kube, "GRPCRoute", "grpc") == {STABLE: 80, CANARY: 20}


async def test_no_traffic_routing_writes_nothing(kube: MemKube) -> None:
    ts = make_ts()
    ts.spec.rollout.traffic_routing = None
    assert await route_traffic(kube, ts, PLAN) is None
    assert kube.calls == []


# ----------------------------------------------------------------- conflicts


async def test_a_route_changed_between_read_and_write_is_read_again_and_the_users_edit_kept(
    kube: MemKube,
) -> None:
    admin = {"matches": [{"path": {"value": "/admin"}}], "backendRefs": [{"name": "admin", "port": 80}]}

    def user_adds_a_rule(call: Call) -> None:
        kube.edit("HTTPRoute", NS, "web", lambda r: r["spec"]["rules"].append(admin))

    # The user's edit lands after the operator's read: its write carries a stale resourceVersion.
    kube.before("merge_patch", user_adds_a_rule, kind="HTTPRoute")
    problem = await set_route(kube, make_ts(), PLAN, "HTTPRoute", "web")
    assert problem is None
    assert kube.count("get", "web") == 2
    assert [c.method for c in kube.calls] == ["get", "merge_patch", "get", "merge_patch"]
    stored = kube.find("HTTPRoute", NS, "web")
    assert stored is not None
    assert admin in stored["spec"]["rules"]  # the retried write was built from the route read again
    assert weights(kube, "HTTPRoute", "web") == {STABLE: 80, CANARY: 20, "admin": None}


async def test_conflicts_short_of_the_attempts_are_retried(kube: MemKube) -> None:
    kube.fail_next("merge_patch", ConflictError("HTTPRoute", "web"), times=ROUTE_WRITE_ATTEMPTS - 1)
    assert await set_route(kube, make_ts(), PLAN, "HTTPRoute", "web") is None
    assert kube.count("merge_patch", "web") == ROUTE_WRITE_ATTEMPTS
    assert weights(kube, "HTTPRoute", "web") == {STABLE: 80, CANARY: 20}


async def test_a_route_that_keeps_changing_is_route_invalid(kube: MemKube) -> None:
    kube.fail_next("merge_patch", ConflictError("HTTPRoute", "web"), times=ROUTE_WRITE_ATTEMPTS)
    problem = await set_route(kube, make_ts(), PLAN, "HTTPRoute", "web")
    assert problem is not None
    reason, message = problem
    assert reason == cond.ROUTE_INVALID
    assert "kept changing" in message and "HTTPRoute ml/web" in message
    assert kube.count("get", "web") == ROUTE_WRITE_ATTEMPTS
    assert weights(kube, "HTTPRoute", "web") == {STABLE: None}  # never written


# ----------------------------------------------------------------- missing and elsewhere


async def test_a_missing_route_is_route_not_found_and_retried_and_does_not_hold_back_the_other(
    kube: MemKube,
) -> None:
    await kube.delete("HTTPRoute", NS, "web")
    traffic = await route_traffic(kube, make_ts(), PLAN)
    assert traffic is not None
    assert (traffic.verdict.status, traffic.verdict.reason) == (cond.FALSE, cond.ROUTE_NOT_FOUND)
    assert traffic.retry_after == ROUTE_RETRY_SECONDS
    assert "HTTPRoute ml/web does not exist" in traffic.verdict.message
    assert "weights set on GRPCRoute ml/grpc" in traffic.verdict.message
    assert weights(kube, "GRPCRoute", "grpc") == {STABLE: 80, CANARY: 20}
    assert kube.find("HTTPRoute", NS, "web") is None  # never created


async def test_a_route_deleted_between_read_and_write_is_route_not_found(kube: MemKube) -> None:
    def user_deletes_it(call: Call) -> None:
        kube.objects.pop(("HTTPRoute", NS, "web"))

    kube.before("merge_patch", user_deletes_it)
    problem = await set_route(kube, make_ts(), PLAN, "HTTPRoute", "web")
    assert problem is not None and problem[0] == cond.ROUTE_NOT_FOUND
    assert kube.find("HTTPRoute", NS, "web") is None


async def test_a_route_referencing_neither_revision_service_is_route_not_referencing(kube: MemKube) -> None:
    kube.put(route("HTTPRoute", "web", "someone-else"))
    traffic = await route_traffic(kube, make_ts(grpc=None), PLAN)
    assert traffic is not None
    assert (traffic.verdict.status, traffic.verdict.reason) == (cond.FALSE, cond.ROUTE_NOT_REFERENCING)
    assert traffic.retry_after == ROUTE_RETRY_SECONDS
    assert weights(kube, "HTTPRoute", "web") == {"someone-else": None}
    assert kube.count("merge_patch") == 0

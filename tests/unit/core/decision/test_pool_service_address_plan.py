"""A pass writes, in each pool pod's assignment, the address of each of its models' Service (from the
Services its watches hold): what the pod asks when it leaves. A Service without an IP yet gives none."""

from __future__ import annotations

import json
from typing import Any

from test_pool_copies_plan import (  # type: ignore[import-not-found,unused-ignore]
    service,
    serving_pods,
)

from triton_operator.core.decision.pool_plan import decide_pool, service_addresses
from triton_operator.core.objects.model_routes import build_model_service
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION, parse_assignment


def stored_service(model: str, address: str | None) -> dict[str, Any]:
    body = build_model_service("pool", "ml", model, owner_ref={"uid": "u"}, labels={})
    if address is not None:
        body["spec"]["clusterIP"] = address
    return body


def test_each_pod_is_told_its_models_service_addresses() -> None:
    ts = service(replicas=2)
    pods, reports = serving_pods({"p0": ["a", "b"], "p1": ["c"]})
    stored = [stored_service("a", "10.96.0.10"), stored_service("b", "10.96.0.11"), stored_service("c", None)]
    plan = decide_pool(
        ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1000.0, stored=stored
    )
    assert plan is not None
    written = {
        p.pod: parse_assignment(p.annotations[ASSIGNMENT_ANNOTATION]).services
        for p in plan.patches
        if ASSIGNMENT_ANNOTATION in p.annotations
    }
    assert written["p0"] == {"a": "10.96.0.10", "b": "10.96.0.11"}
    assert written.get("p1", {}) == {}  # c's Service has no address yet

    for pod in pods:  # written: the next pass writes the same string, so nothing
        for patch in plan.patches:
            if patch.pod == pod["metadata"]["name"] and ASSIGNMENT_ANNOTATION in patch.annotations:
                pod["metadata"]["annotations"][ASSIGNMENT_ANNOTATION] = patch.annotations[
                    ASSIGNMENT_ANNOTATION
                ]
    again = decide_pool(
        ts, pods, reports, revisions=["r1"], configs={}, previous={}, now=1001.0, stored=stored
    )
    assert again is not None
    assert [p.pod for p in again.patches if ASSIGNMENT_ANNOTATION in p.annotations] == []


def test_only_an_ip_counts_as_a_services_address() -> None:
    stored = [
        stored_service("a", "10.96.0.10"),
        stored_service("b", "None"),  # a headless Service
        stored_service("c", ""),
        {"kind": "HTTPRoute", "metadata": {"annotations": {}}, "spec": {}},
    ]
    assert service_addresses(stored) == {"a": "10.96.0.10"}
    assert json.loads(json.dumps(service_addresses([]))) == {}

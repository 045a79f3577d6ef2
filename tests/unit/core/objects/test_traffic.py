"""Tests of the pure traffic builders: revision Services and Gateway API route bodies."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from triton_operator.core.objects import traffic
from triton_operator.core.objects.traffic import (
    HEADER_RULES_ANNOTATION,
    TrafficError,
    TrafficWeights,
    build_revision_service,
    build_route_patch,
    references_services,
)
from triton_operator.models import SetHeaderRoute

OWNER = {"apiVersion": "triton-operator.io/v1alpha1", "kind": "TritonService", "name": "resnet", "uid": "u1"}
STABLE, CANARY = "resnet-stable", "resnet-canary"
PORTS = {"HTTPRoute": 8000, "GRPCRoute": 8001}


def header_route(**values: str) -> SetHeaderRoute:
    return SetHeaderRoute.model_validate(
        {"name": "beta", "match": [{"headerName": "x-canary", "headerValue": dict(values)}]}
    )


def route(
    kind: str, rules: list[dict[str, Any]], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "resnet", "namespace": "ml", "resourceVersion": "7"}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "spec": {"parentRefs": [{"name": "gw"}], "rules": rules},
    }


def patch(
    kind: Any,
    existing: dict[str, Any],
    weights: TrafficWeights,
    header: SetHeaderRoute | None = None,
) -> dict[str, Any]:
    return build_route_patch(
        kind,
        "resnet",
        "ml",
        existing,
        stable_svc=STABLE,
        canary_svc=CANARY,
        weights=weights,
        header_route=header,
    )


def applied(existing: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """What the route looks like after our apply (rules atomic; our annotation owned on its own)."""
    out = copy.deepcopy(existing)
    out["spec"]["rules"] = copy.deepcopy(body["spec"]["rules"])
    annotations = dict(out["metadata"].get("annotations") or {})
    annotations.pop(HEADER_RULES_ANNOTATION, None)
    annotations.update(body["metadata"].get("annotations") or {})
    out["metadata"]["annotations"] = annotations
    return out


# ----------------------------------------------------------------- weights


@pytest.mark.parametrize(("canary", "stable"), [(0, 100), (1, 99), (10, 90), (50, 50), (100, 0)])
def test_weights_add_up(canary: int, stable: int) -> None:
    assert TrafficWeights.canary_percent(canary) == TrafficWeights(stable, canary)


@pytest.mark.parametrize(("stable", "canary"), [(90, 20), (101, -1), (50, 49), (-10, 110)])
def test_weights_reject_bad_splits(stable: int, canary: int) -> None:
    with pytest.raises(ValueError):
        TrafficWeights(stable, canary)


# ----------------------------------------------------------------- revision Services


@pytest.mark.parametrize("role", ["stable", "canary"])
def test_revision_service(role: Any) -> None:
    svc = build_revision_service("resnet", "ml", role, "abc123", owner_ref=OWNER, labels={"team": "a"})
    assert svc["metadata"]["name"] == f"resnet-{role}"
    assert svc["metadata"]["namespace"] == "ml"
    assert svc["metadata"]["ownerReferences"] == [OWNER]
    assert svc["metadata"]["labels"] == {
        "team": "a",
        "triton-operator.io/service": "resnet",
        "triton-operator.io/role": role,
    }
    assert svc["spec"]["selector"] == {
        "triton-operator.io/service": "resnet",
        "triton-operator.io/revision": "abc123",
    }
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, "http"),
        ("grpc", 8001, "grpc"),
        ("metrics", 8002, "metrics"),
    ]
    assert svc["spec"]["type"] == "ClusterIP"


@pytest.mark.parametrize(("role", "revision"), [("preview", "abc"), ("stable", "")])
def test_revision_service_rejects(role: Any, revision: str) -> None:
    with pytest.raises(ValueError):
        build_revision_service("resnet", "ml", role, revision, owner_ref=OWNER, labels={})


# ----------------------------------------------------------------- routes


@pytest.mark.parametrize("kind", ["HTTPRoute", "GRPCRoute"])
@pytest.mark.parametrize("canary", [0, 10, 50, 100])
def test_route_weights_replace_our_backend_refs(kind: str, canary: int) -> None:
    existing = route(kind, [{"backendRefs": [{"name": STABLE, "port": 80}]}])
    body = patch(kind, existing, TrafficWeights.canary_percent(canary))
    assert body["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert body["kind"] == kind
    assert body["metadata"] == {"name": "resnet", "namespace": "ml"}
    assert set(body["spec"]) == {"rules"}  # we own rules only: parentRefs stay the user's
    port = PORTS[kind]
    assert body["spec"]["rules"] == [
        {
            "backendRefs": [
                {"name": STABLE, "port": port, "weight": 100 - canary},
                {"name": CANARY, "port": port, "weight": canary},
            ]
        }
    ]


@pytest.mark.parametrize("kind", ["HTTPRoute", "GRPCRoute"])
def test_route_keeps_user_rules_matches_filters_and_other_backends(kind: str) -> None:
    user_rules = [
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/v2"}}],
            "filters": [
                {
                    "type": "RequestHeaderModifier",
                    "requestHeaderModifier": {"set": [{"name": "a", "value": "b"}]},
                }
            ],
            "backendRefs": [
                {"name": "other", "port": 9000, "weight": 5},
                {"name": CANARY, "port": 8000, "weight": 30},
                {"name": STABLE, "port": 8000, "weight": 70},
            ],
        },
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/admin"}}],
            "backendRefs": [{"name": "admin", "port": 80}],
        },
    ]
    existing = route(kind, copy.deepcopy(user_rules))
    body = patch(kind, existing, TrafficWeights(80, 20))
    port = PORTS[kind]
    first, second = body["spec"]["rules"]
    assert first["matches"] == user_rules[0]["matches"]
    assert first["filters"] == user_rules[0]["filters"]
    assert first["backendRefs"] == [
        {"name": "other", "port": 9000, "weight": 5},
        {"name": STABLE, "port": port, "weight": 80},
        {"name": CANARY, "port": port, "weight": 20},
    ]
    assert second == user_rules[1]  # a rule that is not ours is copied unchanged
    assert existing["spec"]["rules"] == user_rules  # the input is not modified


def test_route_ignores_same_named_refs_of_another_kind_or_namespace() -> None:
    refs = [
        {"name": STABLE, "port": 80, "kind": "ServiceImport", "group": "multicluster.x-k8s.io"},
        {"name": STABLE, "port": 80, "namespace": "elsewhere"},
    ]
    existing = route("HTTPRoute", [{"backendRefs": copy.deepcopy(refs)}])
    assert not references_services(existing, "ml", STABLE, CANARY)
    body = patch("HTTPRoute", existing, TrafficWeights(50, 50))
    assert body["spec"]["rules"] == [{"backendRefs": refs}]


def test_route_keeps_backend_ref_filters_on_both_refs() -> None:
    ref_filter = [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x", "value": "1"}]}}
    ]
    existing = route("HTTPRoute", [{"backendRefs": [{"name": STABLE, "port": 8000, "filters": ref_filter}]}])
    body = patch("HTTPRoute", existing, TrafficWeights(90, 10))
    refs = body["spec"]["rules"][0]["backendRefs"]
    assert [r["filters"] for r in refs] == [ref_filter, ref_filter]


@pytest.mark.parametrize("kind", ["HTTPRoute", "GRPCRoute"])
def test_route_without_rules_gets_one_catch_all_rule(kind: str) -> None:
    existing = route(kind, [])
    body = patch(kind, existing, TrafficWeights(100, 0))
    assert body["spec"]["rules"] == [
        {
            "backendRefs": [
                {"name": STABLE, "port": PORTS[kind], "weight": 100},
                {"name": CANARY, "port": PORTS[kind], "weight": 0},
            ]
        }
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"exact": "yes"}, {"type": "Exact", "value": "yes"}),
        ({"regex": "^b(eta|1)$"}, {"type": "RegularExpression", "value": "^b(eta|1)$"}),
        ({"prefix": "a.b"}, {"type": "RegularExpression", "value": "^a\\.b.*"}),
    ],
)
def test_header_matches(value: dict[str, str], expected: dict[str, str]) -> None:
    assert traffic.header_matches("HTTPRoute", header_route(**value)) == [{"name": "x-canary", **expected}]


def test_http_header_route_is_an_extra_rule_first() -> None:
    user_rule = {
        "matches": [
            {"path": {"type": "PathPrefix", "value": "/v2"}},
            {"path": {"type": "Exact", "value": "/health"}, "headers": [{"name": "X-Canary", "value": "no"}]},
        ],
        "timeouts": {"request": "10s"},
        "backendRefs": [{"name": STABLE, "port": 8000}],
    }
    existing = route("HTTPRoute", [copy.deepcopy(user_rule)])
    body = patch("HTTPRoute", existing, TrafficWeights(90, 10), header_route(exact="yes"))
    assert body["metadata"]["annotations"] == {HEADER_RULES_ANNOTATION: "1"}
    ab, main = body["spec"]["rules"]
    assert ab == {
        "matches": [
            {
                "path": {"type": "PathPrefix", "value": "/v2"},
                "headers": [{"name": "x-canary", "type": "Exact", "value": "yes"}],
            },
            {
                # the user's header of the same name (case-insensitive) gives way to ours
                "path": {"type": "Exact", "value": "/health"},
                "headers": [{"name": "x-canary", "type": "Exact", "value": "yes"}],
            },
        ],
        "timeouts": {"request": "10s"},
        "backendRefs": [{"name": CANARY, "port": 8000, "weight": 1}],
    }
    assert main["backendRefs"] == [
        {"name": STABLE, "port": 8000, "weight": 90},
        {"name": CANARY, "port": 8000, "weight": 10},
    ]


def test_header_route_on_a_rule_without_matches() -> None:
    http = patch(
        "HTTPRoute",
        route("HTTPRoute", [{"backendRefs": [{"name": STABLE}]}]),
        TrafficWeights(),
        header_route(exact="1"),
    )
    assert http["spec"]["rules"][0]["matches"] == [
        {
            "path": {"type": "PathPrefix", "value": "/"},
            "headers": [{"name": "x-canary", "type": "Exact", "value": "1"}],
        }
    ]
    grpc = patch(
        "GRPCRoute",
        route("GRPCRoute", [{"backendRefs": [{"name": STABLE}]}]),
        TrafficWeights(),
        header_route(exact="1"),
    )
    assert grpc["spec"]["rules"][0]["matches"] == [
        {"headers": [{"name": "x-canary", "type": "Exact", "value": "1"}]}
    ]
    assert grpc["spec"]["rules"][0]["backendRefs"] == [{"name": CANARY, "port": 8001, "weight": 1}]


def test_grpc_header_route_keeps_the_method_match() -> None:
    method = {"type": "Exact", "service": "inference.GRPCInferenceService", "method": "ModelInfer"}
    existing = route(
        "GRPCRoute", [{"matches": [{"method": method}], "backendRefs": [{"name": STABLE, "port": 8001}]}]
    )
    body = patch("GRPCRoute", existing, TrafficWeights(100, 0), header_route(regex="b.*"))
    ab = body["spec"]["rules"][0]
    assert ab["matches"] == [
        {"method": method, "headers": [{"name": "x-canary", "type": "RegularExpression", "value": "b.*"}]}
    ]


@pytest.mark.parametrize("kind", ["HTTPRoute", "GRPCRoute"])
@pytest.mark.parametrize(
    "sequence",
    [
        [(TrafficWeights(90, 10), True), (TrafficWeights(90, 10), True)],
        [(TrafficWeights(90, 10), True), (TrafficWeights(50, 50), False)],
        [(TrafficWeights(100, 0), False), (TrafficWeights(80, 20), True), (TrafficWeights(100, 0), False)],
    ],
)
def test_reapplying_is_stable_and_drops_earlier_header_rules(
    kind: str, sequence: list[tuple[TrafficWeights, bool]]
) -> None:
    user_rules = [
        {"backendRefs": [{"name": STABLE, "port": PORTS[kind]}]},
        {"backendRefs": [{"name": "other", "port": 1}]},
    ]
    current = route(kind, copy.deepcopy(user_rules))
    for weights, with_header in sequence:
        body = patch(kind, current, weights, header_route(exact="y") if with_header else None)
        again = patch(kind, applied(current, body), weights, header_route(exact="y") if with_header else None)
        assert again == body  # applying our own result changes nothing
        current = applied(current, body)
        rules = current["spec"]["rules"]
        assert len(rules) == (3 if with_header else 2)
        assert rules[-1] == user_rules[1]
        assert rules[-2]["backendRefs"][0]["weight"] == weights.stable


def test_a_user_edit_of_the_header_rules_is_not_mistaken_for_ours() -> None:
    # The annotation says one A/B rule is first, but someone replaced the rules meanwhile.
    existing = route(
        "HTTPRoute",
        [{"backendRefs": [{"name": STABLE, "port": 8000}]}, {"backendRefs": [{"name": "other", "port": 1}]}],
        annotations={HEADER_RULES_ANNOTATION: "1"},
    )
    body = patch("HTTPRoute", existing, TrafficWeights(70, 30))
    assert len(body["spec"]["rules"]) == 2
    assert "annotations" not in body["metadata"]  # no A/B rules now: our annotation is dropped


def test_too_many_rules_with_header_routes() -> None:
    rules = [
        {"matches": [{"path": {"type": "Exact", "value": f"/{i}"}}], "backendRefs": [{"name": STABLE}]}
        for i in range(9)
    ]
    with pytest.raises(TrafficError, match="16"):
        patch("HTTPRoute", route("HTTPRoute", rules), TrafficWeights(), header_route(exact="y"))
    assert len(patch("HTTPRoute", route("HTTPRoute", rules), TrafficWeights())["spec"]["rules"]) == 9


@pytest.mark.parametrize("existing", [{}, None])
def test_missing_route_is_an_error(existing: Any) -> None:
    with pytest.raises(TrafficError, match="does not exist"):
        patch("HTTPRoute", existing, TrafficWeights())


def test_unknown_kind() -> None:
    with pytest.raises(ValueError):
        patch("TCPRoute", route("HTTPRoute", []), TrafficWeights())


@pytest.mark.parametrize(
    ("rules", "expected"),
    [
        ([], False),
        ([{"backendRefs": [{"name": "x"}]}], False),
        ([{"backendRefs": [{"name": STABLE}]}], True),
        ([{"backendRefs": [{"name": "x"}]}, {"backendRefs": [{"name": CANARY, "kind": "Service"}]}], True),
    ],
)
def test_references_services(rules: list[dict[str, Any]], expected: bool) -> None:
    assert references_services(route("HTTPRoute", rules), "ml", STABLE, CANARY) is expected


# ----------------------------------------------------------------- the merge patch actually sent


def test_route_merge_patch_is_conditional_and_sets_or_removes_our_annotation() -> None:
    existing = route("HTTPRoute", [{"backendRefs": [{"name": STABLE, "port": 8000}]}])
    with_header = patch("HTTPRoute", existing, TrafficWeights.canary_percent(10), header_route(exact="1"))
    merge = traffic.route_merge_patch(with_header, existing)
    assert merge["metadata"] == {"resourceVersion": "7", "annotations": {HEADER_RULES_ANNOTATION: "1"}}
    assert merge["spec"] == {"rules": with_header["spec"]["rules"]}
    assert "parentRefs" not in merge["spec"]  # the user's fields are never part of it

    # the A/B rule ends: our annotation is removed (null in a merge patch), others stay untouched
    ours = route(
        "HTTPRoute",
        with_header["spec"]["rules"],
        annotations={HEADER_RULES_ANNOTATION: "1", "team": "ml"},
    )
    plain = patch("HTTPRoute", ours, TrafficWeights())
    merge = traffic.route_merge_patch(plain, ours)
    assert merge["metadata"] == {"resourceVersion": "7", "annotations": {HEADER_RULES_ANNOTATION: None}}
    assert len(merge["spec"]["rules"]) == 1

    # without the annotation before or after, the patch leaves annotations alone
    merge = traffic.route_merge_patch(patch("HTTPRoute", existing, TrafficWeights()), existing)
    assert merge["metadata"] == {"resourceVersion": "7"}

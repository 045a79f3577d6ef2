"""Routing by model: per-model Services over the pods holding it READY, HTTPRoutes of 16 rules a route."""

from __future__ import annotations

import re

import pytest

from triton_operator.core.objects.model_routes import (
    MODEL_ANNOTATION,
    build_model_http_routes,
    build_model_service,
    model_endpoints,
    model_route_rule,
    pod_model_labels,
)
from triton_operator.core.objects.names import LABEL_SERVICE
from triton_operator.core.pool.labels import MODEL_LABEL_PREFIX, READY, model_label_key, model_object_name

OWNER = {"apiVersion": "triton-operator.io/v1alpha1", "kind": "TritonService", "name": "svc", "uid": "u"}
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
AWKWARD = ["resnet50", "ResNet50", "_private", "a.b-c_d", "x" * 128, "bert_base.v2-", "model-", "9lives"]


def test_a_model_service_selects_the_pods_of_the_service_that_hold_the_model_ready() -> None:
    service = build_model_service("svc", "ml", "resnet50", owner_ref=OWNER, labels={"team": "a"})
    assert service["metadata"]["name"] == "svc-m-resnet50"
    assert service["metadata"]["annotations"] == {MODEL_ANNOTATION: "resnet50"}
    assert service["spec"]["selector"] == {LABEL_SERVICE: "svc", "model.triton-operator.io/resnet50": "ready"}
    # Triton's ports, and the agent's read-only one (a leaving pod asks which pod answers).
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002, 8009}
    assert service["metadata"]["ownerReferences"] == [OWNER]


@pytest.mark.parametrize("model", AWKWARD)
def test_every_model_name_gets_a_valid_label_key_and_service_name(model: str) -> None:
    key = model_label_key(model)
    assert key.startswith(MODEL_LABEL_PREFIX) and LABEL_NAME.match(key.removeprefix(MODEL_LABEL_PREFIX)), key
    name = model_object_name("a-service-name-of-fifty-six-characters-xxxxxxxxxxxxxxxxx", model)
    assert DNS_1035.match(name) and len(name) <= 63, name


def test_models_differing_in_case_or_in_characters_a_name_cannot_hold_get_different_names() -> None:
    names = ["ResNet", "resnet", "res_net", "res.net", "res-net"]
    assert len({model_object_name("svc", n) for n in names}) == len(names)
    assert len({model_label_key(n) for n in ["_a", "a", "a_", "x" * 64, "x" * 65]}) == 5
    assert model_label_key("resnet50") == "model.triton-operator.io/resnet50"


def test_a_route_rule_sends_the_model_paths_to_its_service() -> None:
    assert model_route_rule("svc", "resnet50") == {
        "matches": [{"path": {"type": "PathPrefix", "value": "/v2/models/resnet50"}}],
        "backendRefs": [{"name": "svc-m-resnet50", "port": 8000}],
    }


def test_forty_models_take_three_routes_of_at_most_sixteen_rules() -> None:
    models = [f"m{i:02d}" for i in range(40)]
    parents = [{"name": "gw", "namespace": "infra"}]
    routes = build_model_http_routes("svc", "ml", models, parent_refs=parents, owner_ref=OWNER, labels={})
    assert [r["metadata"]["name"] for r in routes] == ["svc-models-0", "svc-models-1", "svc-models-2"]
    assert [len(r["spec"]["rules"]) for r in routes] == [16, 16, 8]
    paths = [rule["matches"][0]["path"]["value"] for r in routes for rule in r["spec"]["rules"]]
    assert paths == [f"/v2/models/{m}" for m in models]
    assert all(r["spec"]["parentRefs"] == parents for r in routes)
    with pytest.raises(ValueError, match="parentRef"):
        build_model_http_routes("svc", "ml", models, parent_refs=[], owner_ref=OWNER, labels={})


def test_a_pod_label_patch_adds_ready_models_and_removes_the_others() -> None:
    patch = pod_model_labels(["a", "b"], loaded_before=["b", "c"])
    assert patch == {model_label_key("a"): READY, model_label_key("b"): READY, model_label_key("c"): None}


@pytest.mark.parametrize("model", AWKWARD)
def test_a_model_s_endpoints_are_its_own_service_s_ports_for_any_model_name(model: str) -> None:
    service = build_model_service("svc", "ml", model, owner_ref=OWNER, labels={})
    endpoints = model_endpoints("svc", "ml", model)
    host = f"{service['metadata']['name']}.ml.svc"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert endpoints.model_dump() == {k: f"{host}:{ports[k]}" for k in ("http", "grpc", "metrics")}

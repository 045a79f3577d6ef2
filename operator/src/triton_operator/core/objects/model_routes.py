"""Routing by model in a pool, pure: per-model Services over the pods holding it READY, HTTPRoutes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator import GROUP
from triton_operator.core.objects.names import AGENT_PORT, GRPC_PORT, HTTP_PORT, LABEL_SERVICE, METRICS_PORT
from triton_operator.core.objects.traffic import GATEWAY_API_VERSION, MAX_RULES, service_body
from triton_operator.core.pool.labels import READY, model_label_key, model_object_name
from triton_operator.models import Endpoints

LABEL_MODEL_ROUTE = f"{GROUP}/model-route"
"""On the per-model Services and routes: marks them as the pool's, for listing and cleanup."""
MODEL_ANNOTATION = f"{GROUP}/model"
"""On a per-model Service: the model's own name (a label value could not hold every model name)."""


def model_selector(ts_name: str, model: str) -> dict[str, str]:
    """The pods of TritonService ``ts_name`` on which ``model`` is READY (whichever revision they run)."""
    return {LABEL_SERVICE: ts_name, model_label_key(model): READY}


def build_model_service(
    ts_name: str,
    namespace: str,
    model: str,
    *,
    owner_ref: Mapping[str, Any],
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """Service ``<name>-m-<model>``: Triton's ports over the pods holding ``model`` READY. Its endpoints
    follow the model label: set once Triton reports the model READY on a pod, taken off before the model
    is unloaded, so no request reaches a pod without the model. It also has the agent's read-only port
    (AGENT_PORT): a leaving pod asks its models' Services which pod answers their /v1/pool
    (core.pool.assignment.served_here)."""
    return service_body(
        model_object_name(ts_name, model),
        namespace,
        labels={**labels, LABEL_SERVICE: ts_name, LABEL_MODEL_ROUTE: "true"},
        owner_ref=owner_ref,
        selector=model_selector(ts_name, model),
        annotations={MODEL_ANNOTATION: model},
        extra_ports=[{"name": "agent", "port": AGENT_PORT, "targetPort": "agent", "protocol": "TCP"}],
    )


def model_endpoints(ts_name: str, namespace: str, model: str) -> Endpoints:
    """The in-cluster addresses of ``model``'s own Service, as status.pool.models[].endpoints gives them
    to clients (the Service ``build_model_service`` makes)."""
    host = f"{model_object_name(ts_name, model)}.{namespace}.svc"
    return Endpoints(http=f"{host}:{HTTP_PORT}", grpc=f"{host}:{GRPC_PORT}", metrics=f"{host}:{METRICS_PORT}")


def model_route_rule(ts_name: str, model: str) -> dict[str, Any]:
    """The HTTPRoute rule sending ``/v2/models/<model>`` and everything under it (infer, ready, config,
    versions/<v>/...) to the model's Service. PathPrefix matches whole path segments, so model ``a`` does
    not catch ``/v2/models/ab``."""
    return {
        "matches": [{"path": {"type": "PathPrefix", "value": f"/v2/models/{model}"}}],
        "backendRefs": [{"name": model_object_name(ts_name, model), "port": HTTP_PORT}],
    }


def build_model_http_routes(
    ts_name: str,
    namespace: str,
    models: Sequence[str],
    *,
    parent_refs: Sequence[Mapping[str, Any]],
    owner_ref: Mapping[str, Any],
    labels: Mapping[str, str],
) -> list[dict[str, Any]]:
    """HTTPRoutes ``<name>-models-<i>`` with one rule a model (sorted by name), at most 16 rules a route as
    Gateway API allows; each is attached to ``parent_refs`` (the user's Gateway). Requests to the server
    as a whole (``/v2``, ``/v2/health/...``, the repository index) are left to the user's own route."""
    if not parent_refs:
        raise ValueError("a route by model needs at least one parentRef (the Gateway it attaches to)")
    names = sorted(set(models))
    routes = []
    for index in range(0, len(names), MAX_RULES):
        chunk = names[index : index + MAX_RULES]
        routes.append(
            {
                "apiVersion": GATEWAY_API_VERSION,
                "kind": "HTTPRoute",
                "metadata": {
                    "name": f"{ts_name}-models-{index // MAX_RULES}",
                    "namespace": namespace,
                    "labels": dict(labels) | {LABEL_SERVICE: ts_name, LABEL_MODEL_ROUTE: "true"},
                    "ownerReferences": [dict(owner_ref)],
                },
                "spec": {
                    "parentRefs": [dict(ref) for ref in parent_refs],
                    "rules": [model_route_rule(ts_name, model) for model in chunk],
                },
            }
        )
    return routes


def pod_model_labels(ready: Sequence[str], loaded_before: Sequence[str] = ()) -> dict[str, str | None]:
    """The label patch of a pool pod: ``ready`` for each model Triton reports READY on it, None (a merge
    patch's removal) for each model of ``loaded_before`` no longer READY or about to be unloaded."""
    patch: dict[str, str | None] = {model_label_key(m): None for m in loaded_before}
    patch.update({model_label_key(m): READY for m in ready})
    return patch

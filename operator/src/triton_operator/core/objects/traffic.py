"""Pure traffic builders: the stable/canary Services and the Gateway API route rules that split traffic."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from triton_operator import GROUP
from triton_operator.core.objects.names import (
    GRPC_PORT,
    HTTP_PORT,
    LABEL_REVISION,
    LABEL_SERVICE,
    METRICS_PORT,
)
from triton_operator.models import HeaderMatch, SetHeaderRoute

# How traffic is split (the replica maths: docs/rollouts.md, "How the engine works"):
#
# * Without a router the one Service `<name>` selects the pods of every revision, so the split
#   follows the ratio of Ready pods: canary replicas are ceil(replicas * weight / 100).
# * With Gateway API two more Services select one revision each: `<name>-stable` (the stable
#   revision) and `<name>-canary` (the canary revision, or the stable one when no canary runs, so
#   the route never points at a Service without endpoints). The routes named in
#   spec.rollout.trafficRouting.gatewayAPI carry both as backendRefs with weights
#   stable = 100 - canary and canary = the weight of the last completed setWeight step.
#
# Field ownership. HTTPRoute and GRPCRoute declare spec.rules (and each rule's backendRefs and
# matches) as `x-kubernetes-list-type: atomic` (gateway-api v1.x CRDs): server-side apply cannot
# own one weight inside the list, only the whole list. So the operator writes the whole
# spec.rules list, rebuilt from the route as it is now (`existing_route`): the user's rules are
# copied unchanged except that backendRefs naming `<name>-stable` or `<name>-canary` are replaced
# by the two weighted refs. A/B header routes are extra rules put first, sending matching
# requests to the canary only; their count is recorded in the annotation HEADER_RULES_ANNOTATION
# (a map key, owned on its own) so the next write drops them before copying the user's rules.
# The write is a merge patch carrying the resourceVersion that was read (route_merge_patch): a
# route changed since it was read is not overwritten (409, read again), and a route deleted
# meanwhile is not re-created (404), which a server-side apply would do.
# Consequences: the operator's field manager owns spec.rules after the first write; a user who
# edits rules with a plain update (kubectl edit/apply) keeps working because every reconcile
# copies what is there; a GitOps tool applying the route server-side must ignore the weights
# (e.g. Argo CD ignoreDifferences on .spec.rules) or it fights the operator.

LABEL_ROLE = f"{GROUP}/role"
HEADER_RULES_ANNOTATION = f"{GROUP}/header-route-rules"
GATEWAY_API_VERSION = "gateway.networking.k8s.io/v1"

Role = Literal["stable", "canary"]
RouteKind = Literal["HTTPRoute", "GRPCRoute"]
ROLES: tuple[Role, ...] = ("stable", "canary")
ROUTE_PORTS: Mapping[str, int] = {"HTTPRoute": HTTP_PORT, "GRPCRoute": GRPC_PORT}
MAX_RULES = 16


class TrafficError(ValueError):
    """The route cannot carry the split (missing route, too many rules)."""


@dataclasses.dataclass(frozen=True)
class TrafficWeights:
    """Percent of traffic to the stable and the canary revision; they add up to 100."""

    stable: int = 100
    canary: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.canary <= 100 and 0 <= self.stable <= 100 and self.stable + self.canary == 100):
            raise ValueError(f"weights must be 0..100 and add up to 100, got {self.stable}/{self.canary}")

    @classmethod
    def canary_percent(cls, canary: int) -> TrafficWeights:
        return cls(stable=100 - canary, canary=canary)


def revision_service_name(ts_name: str, role: Role) -> str:
    """`<name>-stable` or `<name>-canary`."""
    return f"{ts_name}-{role}"


def build_revision_service(
    ts_name: str,
    namespace: str,
    role: Role,
    revision: str,
    *,
    owner_ref: Mapping[str, Any],
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """Service `<name>-<role>` selecting only the pods of ``revision`` (ClusterIP, ports 8000/8001/8002)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if not revision:
        raise ValueError("a revision Service needs a revision to select")
    return service_body(
        revision_service_name(ts_name, role),
        namespace,
        labels={**labels, LABEL_SERVICE: ts_name, LABEL_ROLE: role},
        owner_ref=owner_ref,
        selector={LABEL_SERVICE: ts_name, LABEL_REVISION: revision},
    )


def service_body(
    name: str,
    namespace: str,
    *,
    labels: Mapping[str, str],
    owner_ref: Mapping[str, Any],
    selector: Mapping[str, str],
    service_type: str = "ClusterIP",
    annotations: Mapping[str, str] | None = None,
    extra_ports: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A Service of Triton's ports (http, grpc as h2c, metrics), and ``extra_ports``, over the pods of
    ``selector``."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [dict(owner_ref)],
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": service_type,
            "selector": dict(selector),
            "ports": [
                {
                    "name": "http",
                    "port": HTTP_PORT,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                },
                {
                    "name": "grpc",
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
                *[dict(port) for port in extra_ports],
            ],
        },
    }


# ----------------------------------------------------------------- routes


def _is_our_ref(ref: Mapping[str, Any], names: set[str], namespace: str) -> bool:
    return (
        ref.get("name") in names
        and ref.get("group", "") in ("", "core")
        and ref.get("kind", "Service") == "Service"
        and ref.get("namespace", namespace) == namespace
    )


def references_services(
    existing_route: Mapping[str, Any], namespace: str, stable_svc: str, canary_svc: str
) -> bool:
    """Whether any rule of the route sends traffic to the stable or canary Service."""
    names = {stable_svc, canary_svc}
    rules = (existing_route.get("spec") or {}).get("rules") or []
    return any(_is_our_ref(ref, names, namespace) for rule in rules for ref in rule.get("backendRefs") or [])


def header_matches(kind: RouteKind, header_route: SetHeaderRoute) -> list[dict[str, Any]]:
    """Gateway API header matches: exact -> Exact, regex -> RegularExpression, prefix -> ^escaped.*.

    Gateway API has no prefix match for headers, so a prefix becomes an anchored regular expression
    (implementation-specific support, as every RegularExpression match).
    """
    del kind  # HTTPHeaderMatch and GRPCHeaderMatch have the same shape
    out: list[dict[str, Any]] = []
    for match in header_route.match:
        out.append({"name": match.header_name, **_header_value(match)})
    return out


def _header_value(match: HeaderMatch) -> dict[str, str]:
    value = match.header_value
    if value.exact is not None:
        return {"type": "Exact", "value": value.exact}
    if value.prefix is not None:
        return {"type": "RegularExpression", "value": f"^{re.escape(value.prefix)}.*"}
    if value.regex is not None:
        return {"type": "RegularExpression", "value": value.regex}
    raise ValueError(f"header {match.header_name}: no value to match")


def _weighted_refs(
    rule: Mapping[str, Any],
    *,
    names: set[str],
    namespace: str,
    stable_svc: str,
    canary_svc: str,
    port: int,
    weights: TrafficWeights,
) -> list[dict[str, Any]]:
    """The rule's backendRefs with ours replaced by stable+canary at ``weights``, other refs kept."""
    refs = [dict(r) for r in rule.get("backendRefs") or []]
    ours = [r for r in refs if _is_our_ref(r, names, namespace)]
    template_stable = next((r for r in ours if r.get("name") == stable_svc), ours[0])
    template_canary = next((r for r in ours if r.get("name") == canary_svc), template_stable)
    stable = {**copy.deepcopy(template_stable), "name": stable_svc, "port": port, "weight": weights.stable}
    canary = {**copy.deepcopy(template_canary), "name": canary_svc, "port": port, "weight": weights.canary}
    out: list[dict[str, Any]] = []
    placed = False
    for ref in refs:
        if _is_our_ref(ref, names, namespace):
            if not placed:
                out += [stable, canary]
                placed = True
            continue
        out.append(ref)
    return out


def _is_header_rule(rule: Mapping[str, Any], canary_svc: str, namespace: str) -> bool:
    refs = rule.get("backendRefs") or []
    return len(refs) == 1 and _is_our_ref(refs[0], {canary_svc}, namespace)


def _header_rule(
    kind: RouteKind,
    rule: Mapping[str, Any],
    headers: Sequence[Mapping[str, Any]],
    canary_ref: Mapping[str, Any],
) -> dict[str, Any]:
    """A copy of the user's rule whose every match also requires ``headers``, sent to the canary only."""
    base_matches = rule.get("matches") or [
        {"path": {"type": "PathPrefix", "value": "/"}} if kind == "HTTPRoute" else {}
    ]
    names = {h["name"].lower() for h in headers}
    matches = []
    for match in base_matches:
        kept = [h for h in match.get("headers") or [] if str(h.get("name", "")).lower() not in names]
        matches.append({**copy.deepcopy(dict(match)), "headers": [*kept, *(dict(h) for h in headers)]})
    out: dict[str, Any] = {"matches": matches}
    for key in ("filters", "timeouts"):
        if key in rule:
            out[key] = copy.deepcopy(rule[key])
    out["backendRefs"] = [{**copy.deepcopy(dict(canary_ref)), "weight": 1}]
    return out


def build_route_patch(
    kind: RouteKind,
    route_name: str,
    namespace: str,
    existing_route: Mapping[str, Any],
    *,
    stable_svc: str,
    canary_svc: str,
    weights: TrafficWeights,
    header_route: SetHeaderRoute | None,
) -> dict[str, Any]:
    """The server-side-apply body that sets the split on a user's HTTPRoute or GRPCRoute.

    The body holds only spec.rules (atomic: written whole, see the notes at the top of this module)
    and our annotation. Rules that reference neither Service are copied unchanged; when the route has
    no rules at all, one catch-all rule with the two refs is written. The route must exist: the
    operator never creates a route (its parentRefs are the user's to choose).
    """
    if kind not in ROUTE_PORTS:
        raise ValueError(f"kind must be HTTPRoute or GRPCRoute, got {kind!r}")
    if not existing_route:
        raise TrafficError(f"{kind} {namespace}/{route_name} does not exist")
    port = ROUTE_PORTS[kind]
    names = {stable_svc, canary_svc}
    metadata = existing_route.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    try:
        injected = int(annotations.get(HEADER_RULES_ANNOTATION, "0"))
    except ValueError:
        injected = 0
    existing_rules = [dict(r) for r in (existing_route.get("spec") or {}).get("rules") or []]
    # Drop the A/B rules a previous apply put first, checking each still looks like one of ours
    # (a single backendRef to the canary Service) in case someone edited the rules since.
    skip = 0
    while skip < min(injected, len(existing_rules)) and _is_header_rule(
        existing_rules[skip], canary_svc, namespace
    ):
        skip += 1
    user_rules = existing_rules[skip:]

    rules: list[dict[str, Any]] = []
    ab_rules: list[dict[str, Any]] = []
    headers = header_matches(kind, header_route) if header_route is not None else []
    if not user_rules:
        user_rules = [{"backendRefs": [{"name": stable_svc, "port": port}]}]
    for rule in user_rules:
        if not any(_is_our_ref(r, names, namespace) for r in rule.get("backendRefs") or []):
            rules.append(copy.deepcopy(rule))
            continue
        refs = _weighted_refs(
            rule,
            names=names,
            namespace=namespace,
            stable_svc=stable_svc,
            canary_svc=canary_svc,
            port=port,
            weights=weights,
        )
        rules.append({**copy.deepcopy(rule), "backendRefs": refs})
        if headers:
            canary_ref = next(r for r in refs if r.get("name") == canary_svc)
            ab_rules.append(_header_rule(kind, rule, headers, canary_ref))
    all_rules = [*ab_rules, *rules]
    if len(all_rules) > MAX_RULES:
        raise TrafficError(
            f"{kind} {namespace}/{route_name} would need {len(all_rules)} rules with the header route; "
            f"Gateway API allows {MAX_RULES}"
        )
    body_metadata: dict[str, Any] = {"name": route_name, "namespace": namespace}
    if ab_rules:
        body_metadata["annotations"] = {HEADER_RULES_ANNOTATION: str(len(ab_rules))}
    return {
        "apiVersion": GATEWAY_API_VERSION,
        "kind": kind,
        "metadata": body_metadata,
        "spec": {"rules": all_rules},
    }


def route_merge_patch(route_patch: Mapping[str, Any], existing_route: Mapping[str, Any]) -> dict[str, Any]:
    """``build_route_patch``'s body as a JSON merge patch, conditional on the route not having changed.

    The patch carries the resourceVersion of ``existing_route`` (the API server refuses it with
    409 when the route changed since, and with 404 when it is gone: never re-created), the whole
    spec.rules list, and our annotation: set when the body has it, else removed (null) if present.
    """
    existing_metadata = existing_route.get("metadata") or {}
    metadata: dict[str, Any] = {}
    if existing_metadata.get("resourceVersion"):
        metadata["resourceVersion"] = str(existing_metadata["resourceVersion"])
    ours = (route_patch.get("metadata") or {}).get("annotations") or {}
    if HEADER_RULES_ANNOTATION in ours:
        metadata["annotations"] = {HEADER_RULES_ANNOTATION: ours[HEADER_RULES_ANNOTATION]}
    elif HEADER_RULES_ANNOTATION in (existing_metadata.get("annotations") or {}):
        metadata["annotations"] = {HEADER_RULES_ANNOTATION: None}
    return {"metadata": metadata, "spec": {"rules": copy.deepcopy(route_patch["spec"]["rules"])}}

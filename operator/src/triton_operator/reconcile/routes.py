"""Routes: the user's Gateway API routes read (before the decision), and the rollout's weights (and A/B
rule) written on them (after the objects are applied)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.adapters.kube import (
    ConflictError,
    KubeAPI,
    ObjectRejectedError,
)
from triton_operator.core.objects.traffic import (
    RouteKind,
    TrafficError,
    build_route_patch,
    references_services,
    revision_service_name,
    route_merge_patch,
)
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import TritonService


@dataclasses.dataclass(frozen=True)
class Traffic:
    """How the Gateway API routes were set: the TrafficRouted verdict, and when to look again."""

    verdict: cond.Verdict
    retry_after: float | None = None


ROUTE_RETRY_SECONDS = 30.0

Routes = Mapping[tuple[RouteKind, str], Mapping[str, Any] | None]
"""The named routes as read: (kind, name) -> the route (None: it does not exist)."""


def named_routes(ts: TritonService) -> list[tuple[RouteKind, str]] | None:
    """The HTTPRoute and GRPCRoute the spec names; None when it routes no traffic through Gateway API."""
    routing = ts.spec.rollout.traffic_routing
    gateway = routing.gateway_api if routing is not None else None
    if gateway is None:
        return None
    routes: list[tuple[RouteKind, str]] = []
    if gateway.http_route:
        routes.append(("HTTPRoute", gateway.http_route))
    if gateway.grpc_route:
        routes.append(("GRPCRoute", gateway.grpc_route))
    return routes


async def read_routes(kube: KubeAPI, specs: Sequence[TritonService]) -> list[Routes]:
    """Read every route each of ``specs`` names (none when it routes no traffic through Gateway API),
    each route once however many of them name it."""
    read: dict[tuple[RouteKind, str], Mapping[str, Any] | None] = {}
    for ts in specs:
        for kind, name in named_routes(ts) or []:
            if (kind, name) not in read:
                read[(kind, name)] = await kube.get(kind, ts.namespace, name)
    return [{key: read[key] for key in named_routes(ts) or []} for ts in specs]


async def route_traffic(
    kube: KubeAPI, ts: TritonService, plan: RolloutPlan, read: Routes | None = None
) -> Traffic | None:
    """Write the weights (and the A/B rule) into the user's HTTPRoute and GRPCRoute, if any are named.

    ``read``: the routes as the pass read them (read_routes); each is written from that read, and
    read again only when it changed since (a conflict). Without it each route is read here.
    Every named route is handled on its own: one missing route does not hold back the other. A
    route that is missing or points at neither revision Service is looked at again after
    ROUTE_RETRY_SECONDS (routes are not watched).
    """
    routes = named_routes(ts)
    if routes is None:
        return None
    if not routes:
        message = "spec.rollout.trafficRouting.gatewayAPI names no httpRoute or grpcRoute"
        return Traffic(cond.Verdict(cond.FALSE, cond.ROUTE_NOT_FOUND, message))
    done: list[str] = []
    problems: list[tuple[str, str]] = []
    retry: float | None = None
    for kind, route_name in routes:
        where = f"{kind} {ts.namespace}/{route_name}"
        problem = await set_route(kube, ts, plan, kind, route_name, read=read)
        if problem is None:
            done.append(where)
            continue
        problems.append(problem)
        if problem[0] in (cond.ROUTE_NOT_FOUND, cond.ROUTE_NOT_REFERENCING):
            retry = ROUTE_RETRY_SECONDS
    if problems:
        message = "; ".join(m for _, m in problems)
        if done:
            message += f"; weights set on {', '.join(done)}"
        return Traffic(cond.Verdict(cond.FALSE, problems[0][0], message), retry)
    weights = f"stable {plan.weights.stable}% / canary {plan.weights.canary}%"
    if plan.header_route is not None:
        weights += f", header route {plan.header_route.name} to the canary"
    return Traffic(cond.Verdict(cond.TRUE, cond.WEIGHTS_SET, f"{', '.join(done)}: {weights}"))


ROUTE_WRITE_ATTEMPTS = 3


async def set_route(
    kube: KubeAPI,
    ts: TritonService,
    plan: RolloutPlan,
    kind: RouteKind,
    route_name: str,
    *,
    read: Routes | None = None,
) -> tuple[str, str] | None:
    """Set the plan's weights on one route: None when done, else (TrafficRouted reason, message).

    The first attempt writes from the route in ``read`` when it is there; a conflict (the route
    changed since) reads it again. The merge patch carries the resourceVersion of the route read."""
    where = f"{kind} {ts.namespace}/{route_name}"
    stable_svc = revision_service_name(ts.name, "stable")
    canary_svc = revision_service_name(ts.name, "canary")
    missing = (
        cond.ROUTE_NOT_FOUND,
        f"{where} does not exist: create it with a backendRef to Service {stable_svc} "
        "(the operator sets the weights of existing routes, it never creates one)",
    )
    for attempt in range(ROUTE_WRITE_ATTEMPTS):
        if attempt == 0 and read is not None and (kind, route_name) in read:
            existing = read[(kind, route_name)]
        else:
            existing = await kube.get(kind, ts.namespace, route_name)
        if existing is None:
            return missing
        if (existing.get("spec") or {}).get("rules") and not references_services(
            existing, ts.namespace, stable_svc, canary_svc
        ):
            message = f"{where} has no backendRef to Service {stable_svc} or {canary_svc}: nothing to weigh"
            return cond.ROUTE_NOT_REFERENCING, message
        try:
            body = build_route_patch(
                kind,
                route_name,
                ts.namespace,
                existing,
                stable_svc=stable_svc,
                canary_svc=canary_svc,
                weights=plan.weights,
                header_route=plan.header_route,
            )
            patched = await kube.merge_patch(
                kind, ts.namespace, route_name, route_merge_patch(body, existing)
            )
        except ConflictError:
            continue  # changed since it was read (a user's edit): read it again
        except (TrafficError, ObjectRejectedError) as exc:
            return cond.ROUTE_INVALID, f"{where}: {exc}"
        return missing if patched is None else None
    return cond.ROUTE_INVALID, f"{where} kept changing while its weights were written"

"""Level-based reconcile of one TritonService: observe -> desired -> apply -> status (written if changed)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from triton_operator.adapters.kube import (
    ConflictError,
    Kube,
    ObjectRejectedError,
    ObjectTooLargeError,
    Owned,
    retry_delay,
)
from triton_operator.adapters.storage import pin_repository
from triton_operator.adapters.storage.base import StoreError
from triton_operator.core import conditions as cond
from triton_operator.core.manifest import (
    Manifest,
    ManifestError,
    SelectionFailed,
    StoreRef,
    json_digest,
    manifest_from_json,
    manifest_to_json,
    model_sources,
    unpinned_manifest,
)
from triton_operator.core.manifestparts import ManifestTooLarge, compress, stored_manifest
from triton_operator.core.modelconfig import ModelConfigError
from triton_operator.core.objects import (
    LABEL_MANAGED_BY,
    LABEL_REVISION,
    LABEL_SERVICE,
    MANAGED_BY,
    Actions,
    RevisionPlan,
    build_event,
    check_body,
    compute_revision,
    deployment_state,
    disruption_budget_enabled,
    endpoints,
    layout_of,
    model_statuses,
    object_name,
    plan_actions,
    pod_state,
    revision_object_names,
    split_by_owner,
)
from triton_operator.core.rollout import (
    DEGRADED,
    PROGRESSING,
    RolloutCondition,
    RolloutInput,
    RolloutPlan,
    RolloutStatus,
    format_time,
    observe_revisions,
    parse_control_requests,
    plan_rollout,
)
from triton_operator.core.traffic import (
    RouteKind,
    TrafficError,
    build_route_patch,
    references_services,
    revision_service_name,
    route_merge_patch,
)
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.settings import Settings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PinnedManifest:
    """The manifest a revision's pods sync: its JSON, and its digest (None when it pins nothing)."""

    json: str
    digest: str | None
    objects: int = 0
    total_bytes: int = 0
    problem: str | None = None
    """Set when the last listing failed and this is the manifest pinned before it."""
    unversioned: bool = False
    """Objects pinned by ETag alone (no object version): an upload to the same key breaks them."""


class RepositoryError(Exception):
    """The repository cannot be listed and nothing was pinned before: no revision can be made."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# The storage seam: pin the manifest a TritonService's pods will sync. ``current`` is the
# manifest JSON of the newest running revision (reused until a re-list is due). Raises
# RepositoryError when nothing can be pinned.
ManifestPinner = Callable[[TritonService, str | None], Awaitable[PinnedManifest]]


def _summary(manifest: Manifest, problem: str | None = None) -> PinnedManifest:
    text = manifest_to_json(manifest)
    return PinnedManifest(
        json=text,
        digest=json_digest(text) if manifest.pinned else None,
        objects=len(manifest.entries),
        total_bytes=manifest.total_bytes,
        problem=problem,
        unversioned=manifest.pinned and any(not e.generation for e in manifest.entries),
    )


def _parse_manifest(text: str | None) -> Manifest | None:
    if not text:
        return None
    try:
        return manifest_from_json(text)
    except (ManifestError, ValueError):
        return None


def _same_source(manifest: Manifest, wanted: Manifest) -> bool:
    """Whether ``manifest`` was pinned from the repository and models that ``wanted`` names."""

    def models(m: Manifest) -> list[tuple[str, str, object]]:
        return sorted((x.name, x.folder.strip("/"), x.policy) for x in m.models)

    return manifest.repository == wanted.repository and models(manifest) == models(wanted)


@dataclasses.dataclass(frozen=True)
class _Listing:
    when: float
    manifest: Manifest
    problem: str | None = None
    summary: PinnedManifest = dataclasses.field(init=False, compare=False)
    """Computed once a listing: its JSON and digest take a second for 50,000 objects."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", _summary(self.manifest, self.problem))


class RepositoryPinner:
    """Lists a TritonService's object store and pins what its models select (core.manifest).

    Listings are cached per object for repository.pollIntervalSeconds, so reconciles driven by
    pod events do not list the store; ``refresh`` lists now and tells whether the pin changed.
    A pvc:// claim is never listed here (the pod links it): its manifest is unpinned.
    """

    def __init__(self, kube: Kube, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._listings: dict[tuple[str, str], _Listing] = {}

    def forget(self, namespace: str, name: str) -> None:
        self._listings.pop((namespace, name), None)

    async def __call__(self, ts: TritonService, current: str | None) -> PinnedManifest:
        wanted = unpinned_manifest(
            StoreRef.from_repository(ts.spec.repository), model_sources(ts.spec.models)
        )
        if ts.spec.repository.scheme == "pvc":
            return _summary(wanted)
        key = (ts.namespace, ts.name)
        poll = ts.spec.repository.poll_interval_seconds
        cached = self._listings.get(key)
        fresh = cached is not None and (poll == 0 or self.clock() - cached.when < poll)
        if cached is not None and fresh and _same_source(cached.manifest, wanted):
            return cached.summary
        running = _parse_manifest(current)
        if running is not None and (not running.pinned or not _same_source(running, wanted)):
            running = None
        if running is not None and poll == 0:
            listing = self._listings[key] = _Listing(self.clock(), running)
            return listing.summary
        try:
            manifest = await self._list(ts)
        except RepositoryError as exc:
            fallback = (
                cached.manifest if cached is not None and _same_source(cached.manifest, wanted) else running
            )
            if fallback is None:
                raise
            # Keep serving what was pinned; try again after the poll interval.
            listing = self._listings[key] = _Listing(self.clock(), fallback, exc.message)
            return listing.summary
        listing = self._listings[key] = _Listing(self.clock(), manifest)
        return listing.summary

    async def refresh(self, ts: TritonService) -> bool:
        """List now; True when the pinned manifest differs from the cached one (or the listing failed)."""
        key = (ts.namespace, ts.name)
        before = self._listings.get(key)
        try:
            manifest = await self._list(ts)
        except RepositoryError as exc:
            logger.warning("listing the repository of %s/%s failed: %s", *key, exc.message)
            return True
        after = self._listings[key] = _Listing(self.clock(), manifest)
        return before is None or before.problem is not None or before.summary.digest != after.summary.digest

    async def _list(self, ts: TritonService) -> Manifest:
        repository = ts.spec.repository
        credentials: dict[str, str] = {}
        if repository.credentials_secret:
            secret = await self.kube.get_secret_data(ts.namespace, repository.credentials_secret)
            if secret is None:
                raise RepositoryError(
                    cond.CREDENTIALS_MISSING,
                    f"spec.repository.credentialsSecret: Secret {repository.credentials_secret!r} "
                    f"not found in namespace {ts.namespace}",
                )
            credentials = secret
        started = time.perf_counter()
        try:
            manifest = await asyncio.to_thread(pin_repository, repository, ts.spec.models, credentials)
        except SelectionFailed as exc:
            raise RepositoryError(cond.MODELS_NOT_FOUND, f"{repository.uri}: {exc}") from exc
        except (StoreError, ModelConfigError) as exc:
            raise RepositoryError(cond.REPOSITORY_ERROR, f"{repository.uri}: {exc}") from exc
        METRICS.record_repository_listing(
            ts.namespace,
            ts.name,
            scheme=repository.scheme,
            seconds=time.perf_counter() - started,
            objects=len(manifest.entries),
            total_bytes=manifest.total_bytes,
        )
        return manifest


@dataclasses.dataclass(frozen=True)
class Result:
    """What one reconcile did."""

    status: dict[str, Any] | None
    """The status computed (None when the TritonService is gone)."""
    written: bool = False
    """Whether the status was patched (it changed)."""
    revision: str | None = None
    """The desired revision (None for an invalid spec)."""
    invalid: str | None = None
    """Why nothing could be applied (None when the spec was applied)."""
    reason: str | None = None
    """The Ready reason of ``invalid``: InvalidSpec, or a repository reason (retry later)."""
    plan: RolloutPlan | None = None
    """The rollout engine's plan that was carried out."""
    ts: TritonService | None = None
    """The parsed spec that was applied (or refused for its manifest's size: its repository is
    still polled, and a change there tries again)."""
    requeue_after: float | None = None
    """Seconds until the next reconcile is due with nothing else happening (a timed pause, a deadline)."""


FOREIGN_RETRY_SECONDS = 2.0
"""How soon to look again while an earlier TritonService's object holds a name we need."""


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def owned_selector(name: str) -> dict[str, str]:
    return {LABEL_SERVICE: name, LABEL_MANAGED_BY: MANAGED_BY}


def _current_manifest(owned: Owned, previous: Mapping[str, Any]) -> str | None:
    """The manifest JSON of the newest running revision (the canary's, else the stable one's),
    from its ConfigMaps: plain JSON, or gzipped parts put back together (core.manifestparts)."""
    for revision in (previous.get("canaryRevision"), previous.get("stableRevision")):
        if not revision:
            continue
        configmaps = [
            c
            for c in owned.configmaps
            if (c.get("metadata", {}).get("labels") or {}).get(LABEL_REVISION) == revision
        ]
        text = stored_manifest(configmaps)
        if text is not None:
            return text
    return None


def _too_large(pinned: PinnedManifest | None, manifest_json: str | None, detail: str) -> str:
    """ManifestTooLarge's message: what the manifest pins, and why it cannot be stored."""
    size = len(manifest_json.encode("utf-8")) if manifest_json is not None else 0
    objects = pinned.objects if pinned is not None else 0
    return (
        f"the pinned manifest of {objects} objects ({size} bytes of JSON) cannot be stored: {detail}; "
        "the serving revision stays as it is. Pin fewer objects: narrow the models' folders or "
        "version policies"
    )


def _parts_summary(actions: Actions, manifest_json: str | None) -> str:
    """How the refused revision stores its manifest (its Deployment says how many parts)."""
    deployment = next((o for o in actions.apply if o.get("kind") == "Deployment"), None)
    layout = layout_of(deployment)
    if manifest_json is None or layout is None or layout.plain:
        return ""
    return f"{len(compress(manifest_json))} bytes gzipped in {layout.parts} ConfigMaps; "


def _repository_verdict(ts: TritonService, pinned: PinnedManifest | None) -> cond.Verdict:
    if pinned is not None and pinned.problem is not None:
        return cond.Verdict(
            cond.FALSE, cond.REPOSITORY_ERROR, f"{pinned.problem}; pods keep the manifest pinned before"
        )
    if ts.spec.repository.scheme == "pvc":
        return cond.Verdict(
            cond.TRUE, cond.VOLUME_MOUNTED, f"pods link the models of {ts.spec.repository.uri}"
        )
    if pinned is None or pinned.digest is None:
        return cond.Verdict(cond.TRUE, cond.UNPINNED, "repository not pinned (no storage adapter configured)")
    message = f"{pinned.objects} objects, {pinned.total_bytes} bytes pinned (manifest {pinned.digest[:12]})"
    if pinned.unversioned:
        message += (
            "; the bucket keeps no object versions, so rollback is not exact: after an upload to a"
            " pinned key, new pods of earlier revisions cannot sync (enable bucket versioning)"
        )
    return cond.Verdict(cond.TRUE, cond.MANIFEST_PINNED, message)


async def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    settings: Settings,
    *,
    pin_manifest: ManifestPinner | None = None,
    clock: Callable[[], datetime.datetime] = utcnow,
) -> Result:
    """Bring one TritonService's objects and status in line with its spec, as stored right now.

    Reads the object afresh (its status is the base of the next one), so callers need only
    its name: a kopf handler for the TritonService, or a watch on the pods it owns. The rollout
    engine (core.rollout) decides the replicas of every revision, the traffic and the status;
    this function carries out its plan and says when to come back (Result.requeue_after).
    """
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    moment = clock()
    now = format_time(moment)
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    generation = int(metadata.get("generation") or 0)
    previous: Mapping[str, Any] = body.get("status") or {}
    found = await kube.list_owned(namespace, owned_selector(name))
    # By owner, not by label: what a deleted TritonService of this name left is not ours.
    adoption = split_by_owner(str(metadata.get("uid") or ""), found.deployments, found.configmaps, found.pods)
    owned = Owned(
        deployments=[dict(d) for d in adoption.deployments],
        configmaps=[dict(c) for c in adoption.configmaps],
        pods=[dict(p) for p in adoption.pods],
    )
    deployments = [deployment_state(d) for d in owned.deployments]
    pods = [pod_state(p) for p in owned.pods]

    async def refuse(
        message: str,
        reason: str = cond.INVALID_SPEC,
        repository: cond.Verdict | None = None,
        ts: TritonService | None = None,
    ) -> Result:
        # A bad spec never touches what runs: no apply, no delete; only the status says why.
        status = cond.build_status(
            previous,
            cond.Observation(
                generation=generation,
                now=now,
                deployments=deployments,
                pods=pods,
                invalid=message,
                blocked_reason=reason,
                repository=repository,
            ),
        )
        written = await _write_status(kube, namespace, name, previous, status)
        return Result(status=status, written=written, invalid=message, reason=reason, ts=ts)

    async def too_large(message: str) -> Result:
        logger.warning("%s/%s: %s", namespace, name, message)
        verdict = cond.Verdict(cond.FALSE, cond.MANIFEST_TOO_LARGE, message)
        return await refuse(message, cond.MANIFEST_TOO_LARGE, verdict, ts)

    checked = check_body(body)
    if checked.problems or checked.ts is None:
        return await refuse(checked.message)

    ts = checked.ts
    pinned: PinnedManifest | None = None
    if pin_manifest is not None:
        try:
            pinned = await pin_manifest(ts, _current_manifest(owned, previous))
        except RepositoryError as exc:
            verdict = cond.Verdict(cond.FALSE, exc.reason, exc.message)
            return await refuse(exc.message, exc.reason, verdict)
    revision = compute_revision(ts, settings, checked.configs, pinned.digest if pinned else None)
    if revision_object_names(ts, revision, adoption.foreign):
        # The same name is still held by an earlier TritonService's object that the garbage
        # collector has yet to remove: applying ours now would give it two controllers.
        logger.info(
            "%s/%s: waiting for the garbage collector to remove %s of an earlier TritonService",
            namespace,
            name,
            object_name(ts, revision),
        )
        return Result(status=dict(previous), revision=revision, requeue_after=FOREIGN_RETRY_SECONDS)
    plan = plan_rollout(
        RolloutInput(
            rollout=ts.spec.rollout,
            replicas=ts.spec.replicas,
            desired_revision=revision,
            now=moment,
            status=RolloutStatus.from_status(previous),
            revisions=observe_revisions(owned.deployments, owned.pods),
            gpus_per_pod=ts.spec.resources.gpus,
            requests=parse_control_requests(metadata.get("annotations")),
            progress_deadline_seconds=ts.spec.progress_deadline(),
        )
    )
    # A PodDisruptionBudget the spec no longer wants is looked up (and deleted) only then.
    stale_pdb = not disruption_budget_enabled(ts) and (
        await kube.get("PodDisruptionBudget", namespace, ts.name) is not None
    )
    manifest_json = pinned.json if pinned else None
    try:
        actions = plan_actions(
            ts,
            settings,
            revision,
            plan,
            configs=checked.configs,
            manifest_json=manifest_json,
            deployments=owned.deployments,
            configmaps=owned.configmaps,
            revision_services=cond.find_condition(previous.get("conditions") or [], cond.TRAFFIC_ROUTED)
            is not None,
            disruption_budget=stale_pdb,
        )
    except ManifestTooLarge as exc:
        return await too_large(_too_large(pinned, manifest_json, str(exc)))
    try:
        for obj in actions.apply:
            await kube.apply(obj)
    except ObjectTooLargeError as exc:
        # Refused for its size even so (a cluster with lower limits): a condition that says so, not
        # InvalidSpec, nor a retry that can only be refused again.
        if exc.kind != "ConfigMap":
            return await refuse(str(exc))
        detail = f"{_parts_summary(actions, manifest_json)}{exc}"
        return await too_large(_too_large(pinned, manifest_json, detail))
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        return await refuse(str(exc))
    traffic = await _route_traffic(kube, ts, plan)

    rs = plan.status
    METRICS.set_rollout(
        namespace,
        name,
        step_index=rs.current_step_index if rs.canary_revision is not None else None,
        canary_weight=plan.weights.canary,
    )
    kept = set(plan.replicas)
    progressing = plan.condition(PROGRESSING)
    degraded = plan.condition(DEGRADED)
    status = cond.build_status(
        previous,
        cond.Observation(
            generation=generation,
            now=now,
            deployments=[d for d in deployments if d.revision in kept],
            pods=[p for p in pods if p.revision in kept],
            plan=RevisionPlan(
                replicas=plan.replicas,
                delete=plan.delete,
                stable=rs.stable_revision,
                rolling=rs.canary_revision,
            ),
            replicas=ts.spec.replicas,
            repository=_repository_verdict(ts, pinned),
            endpoints=endpoints(ts),
            models=model_statuses(ts),
            rollout=rs.to_status(),
            progressing=_verdict(progressing),
            rollout_degraded=_verdict(degraded),
            aborted=degraded.message if rs.aborted_revision is not None and degraded is not None else None,
            traffic=traffic.verdict if traffic is not None else None,
        ),
    )
    # The status records a decision before its effects show: the other revisions are scaled (the
    # old stable down at a flip) and deleted only once it is written, so whoever sees a revision
    # scaled down also finds the status that says why.
    written = await _write_status(kube, namespace, name, previous, status)
    for deployment, replicas in sorted(actions.scale.items()):
        logger.info("scaling Deployment %s/%s to %d", namespace, deployment, replicas)
        await kube.scale(namespace, deployment, replicas)
    for kind, gone in actions.delete:
        if await kube.delete(kind, namespace, gone):
            logger.info("deleted %s %s/%s", kind, namespace, gone)
    # Events after the status: a crash in between loses an event rather than repeating one (the
    # engine emits each event once, in the call whose status records the change).
    for event in plan.events:
        logger.info("%s/%s: %s %s: %s", namespace, name, event.type, event.reason, event.message)
        try:
            await kube.post_event(build_event(metadata, event.type, event.reason, event.message, now=now))
        except Exception as exc:  # events are best effort: the status holds the truth
            if retry_delay(exc) is None:
                raise
            logger.warning("could not post event %s for %s/%s: %s", event.reason, namespace, name, exc)
    requeue = [t for t in (plan.requeue_after, traffic.retry_after if traffic else None) if t is not None]
    return Result(
        status=status,
        written=written,
        revision=revision,
        plan=plan,
        ts=ts,
        requeue_after=min(requeue) if requeue else None,
    )


def _verdict(condition: RolloutCondition | None) -> cond.Verdict | None:
    if condition is None:
        return None
    return cond.Verdict(condition.status, condition.reason, condition.message)


@dataclasses.dataclass(frozen=True)
class Traffic:
    """How the Gateway API routes were set: the TrafficRouted verdict, and when to look again."""

    verdict: cond.Verdict
    retry_after: float | None = None


ROUTE_RETRY_SECONDS = 30.0


async def _route_traffic(kube: Kube, ts: TritonService, plan: RolloutPlan) -> Traffic | None:
    """Write the weights (and the A/B rule) into the user's HTTPRoute and GRPCRoute, if any are named.

    Every named route is handled on its own: one missing route does not hold back the other. A
    route that is missing or points at neither revision Service is looked at again after
    ROUTE_RETRY_SECONDS (routes are not watched).
    """
    routing = ts.spec.rollout.traffic_routing
    gateway = routing.gateway_api if routing is not None else None
    if gateway is None:
        return None
    routes: list[tuple[RouteKind, str]] = []
    if gateway.http_route:
        routes.append(("HTTPRoute", gateway.http_route))
    if gateway.grpc_route:
        routes.append(("GRPCRoute", gateway.grpc_route))
    if not routes:
        message = "spec.rollout.trafficRouting.gatewayAPI names no httpRoute or grpcRoute"
        return Traffic(cond.Verdict(cond.FALSE, cond.ROUTE_NOT_FOUND, message))
    done: list[str] = []
    problems: list[tuple[str, str]] = []
    retry: float | None = None
    for kind, route_name in routes:
        where = f"{kind} {ts.namespace}/{route_name}"
        problem = await _set_route(kube, ts, plan, kind, route_name)
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


async def _set_route(
    kube: Kube, ts: TritonService, plan: RolloutPlan, kind: RouteKind, route_name: str
) -> tuple[str, str] | None:
    """Set the plan's weights on one route: None when done, else (TrafficRouted reason, message)."""
    where = f"{kind} {ts.namespace}/{route_name}"
    stable_svc = revision_service_name(ts.name, "stable")
    canary_svc = revision_service_name(ts.name, "canary")
    missing = (
        cond.ROUTE_NOT_FOUND,
        f"{where} does not exist: create it with a backendRef to Service {stable_svc} "
        "(the operator sets the weights of existing routes, it never creates one)",
    )
    for _ in range(ROUTE_WRITE_ATTEMPTS):
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


async def _write_status(
    kube: Kube, namespace: str, name: str, previous: Mapping[str, Any], status: Mapping[str, Any]
) -> bool:
    if not cond.status_changed(previous, status):
        return False
    await kube.apply_status(namespace, name, status)
    return True


REQUEUE_SLACK_SECONDS = 0.05


class Reconciler:
    """Serializes reconciles per TritonService, coalesces triggers, requeues, and polls repositories.

    A trigger while a reconcile for the same object is queued (not yet started) is dropped:
    the queued one reads the object and its pods afresh when it starts, so it sees the change.
    A reconcile whose plan is timed (a pause with a duration, a progress deadline) leaves one
    timer task per object that reconciles again when it is due; the next reconcile replaces it,
    so an idle object has no timer and nothing polls the API server.
    A repository with pollIntervalSeconds > 0 gets a poll task that lists the store (never the
    API server) and reconciles only when the pinned manifest changed.
    """

    def __init__(self, kube: Kube, settings: Settings, *, pinner: RepositoryPinner | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.pinner = pinner
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._queued: dict[tuple[str, str], int] = {}
        self._specs: dict[tuple[str, str], TritonService] = {}
        self._pollers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._timers: dict[tuple[str, str], asyncio.Task[None]] = {}

    def _dequeue(self, key: tuple[str, str]) -> None:
        left = self._queued.get(key, 0) - 1
        if left > 0:
            self._queued[key] = left
        else:
            self._queued.pop(key, None)

    async def __call__(self, namespace: str, name: str, *, coalesce: bool = False) -> Result | None:
        """Reconcile now (after any running one); with ``coalesce``, skip if one is already queued."""
        key = (namespace, name)
        if coalesce and self._queued.get(key, 0) > 0:
            return None
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        self._queued[key] = self._queued.get(key, 0) + 1
        started = False
        try:
            async with lock:
                started = True
                self._dequeue(key)
                with METRICS.reconcile_timer() as outcome:
                    result = await reconcile(
                        self.kube, namespace, name, self.settings, pin_manifest=self.pinner
                    )
                    if result.invalid:
                        outcome.fail(result.reason or cond.INVALID_SPEC, outcome="invalid")
        finally:
            if not started:
                self._dequeue(key)
        if result.status is None:
            self.forget(namespace, name)
            return result
        if result.ts is not None:
            self._watch_repository(key, result.ts)
        self.requeue(key, result.requeue_after)
        return result

    def requeue(self, key: tuple[str, str], delay: float | None) -> None:
        """Reconcile ``key`` again after ``delay`` seconds (replacing any timer); None: no timer."""
        timer = self._timers.pop(key, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if delay is not None:
            self._timers[key] = asyncio.create_task(
                self._requeue(key, max(delay, 0.0) + REQUEUE_SLACK_SECONDS),
                name=f"requeue {key[0]}/{key[1]}",
            )

    def pending_timer(self, namespace: str, name: str) -> bool:
        """Whether a timed reconcile is due for a TritonService (for tests and metrics)."""
        timer = self._timers.get((namespace, name))
        return timer is not None and not timer.done()

    async def _requeue(self, key: tuple[str, str], delay: float) -> None:
        await asyncio.sleep(delay)
        if self._timers.get(key) is asyncio.current_task():
            del self._timers[key]
        try:
            await self(*key, coalesce=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            retry = retry_delay(exc)
            logger.warning("timed reconcile of %s/%s failed: %s", *key, exc)
            if retry is not None and key not in self._timers:
                self.requeue(key, retry)

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept for a TritonService that is gone."""
        key = (namespace, name)
        self._specs.pop(key, None)
        poller = self._pollers.pop(key, None)
        if poller is not None:
            poller.cancel()
        timer = self._timers.pop(key, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if self.pinner is not None:
            self.pinner.forget(namespace, name)
        METRICS.forget(namespace, name)

    async def close(self) -> None:
        tasks = [*self._pollers.values(), *self._timers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pollers.clear()
        self._timers.clear()

    def _polls(self, ts: TritonService) -> bool:
        return (
            self.pinner is not None
            and ts.spec.repository.scheme != "pvc"
            and ts.spec.repository.poll_interval_seconds > 0
        )

    def _watch_repository(self, key: tuple[str, str], ts: TritonService) -> None:
        self._specs[key] = ts
        poller = self._pollers.get(key)
        if self._polls(ts) and (poller is None or poller.done()):
            self._pollers[key] = asyncio.create_task(self._poll(key), name=f"poll {key[0]}/{key[1]}")

    async def _poll(self, key: tuple[str, str]) -> None:
        while True:
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts) or self.pinner is None:
                return
            await asyncio.sleep(ts.spec.repository.poll_interval_seconds)
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts):
                return
            try:
                if await self.pinner.refresh(ts):
                    await self(*key, coalesce=True)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("polling the repository of %s/%s failed", *key)

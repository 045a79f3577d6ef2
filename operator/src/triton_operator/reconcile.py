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
from triton_operator.adapters.storage import PinResult, pin_with_versioning
from triton_operator.adapters.storage.base import AccessRefused, StoreError
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
    stale_pins,
    unpinned_manifest,
)
from triton_operator.core.manifestparts import ManifestTooLarge, compress
from triton_operator.core.modelconfig import ModelConfigError
from triton_operator.core.objects import (
    LABEL_MANAGED_BY,
    LABEL_SERVICE,
    MANAGED_BY,
    Actions,
    DeploymentState,
    PodState,
    RevisionPlan,
    build_event,
    check_body,
    compute_revision,
    deployment_state,
    disruption_budget_enabled,
    endpoints,
    last_valid,
    layout_of,
    model_statuses,
    object_name,
    plan_actions,
    pod_state,
    revision_manifest,
    revision_object_names,
    split_by_owner,
)
from triton_operator.core.repository_access import RepositoryAccess
from triton_operator.core.rollout import (
    RolloutInput,
    RolloutPlan,
    RolloutStatus,
    format_time,
    observe_revisions,
    parse_control_requests,
    pending_requests,
    plan_rollout,
)
from triton_operator.core.status import Observation, build_status, status_changed
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
    """Objects pinned by ETag alone (no object version, or S3's "null" one), or in a bucket that
    keeps no old versions (GCS without versioning): an upload to the same key breaks them."""
    versions_kept: bool | None = None
    """What the store said when it listed: the bucket keeps old object versions (None: not known)."""


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


def _summary(manifest: Manifest, problem: str | None = None, versioned: bool | None = None) -> PinnedManifest:
    """``versioned``: what the store said of the bucket when it was listed (None: not known)."""
    text = manifest_to_json(manifest)
    return PinnedManifest(
        json=text,
        digest=json_digest(text) if manifest.pinned else None,
        objects=len(manifest.entries),
        total_bytes=manifest.total_bytes,
        problem=problem,
        unversioned=manifest.pinned
        and (versioned is False or any(not e.version_pinned for e in manifest.entries)),
        versions_kept=versioned,
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
    versioned: bool | None = None
    summary: PinnedManifest = dataclasses.field(init=False, compare=False)
    """Computed once a listing: its JSON and digest take a second for 50,000 objects."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", _summary(self.manifest, self.problem, self.versioned))


class RepositoryPinner:
    """Lists a TritonService's object store and pins what its models select (core.manifest).

    Listings are cached per object for repository.pollIntervalSeconds, so reconciles driven by
    pod events do not list the store; ``refresh`` lists now and tells whether the pin changed.
    A pvc:// claim is never listed here (the pod links it): its manifest is unpinned.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        clock: Callable[[], float] = time.monotonic,
        access: RepositoryAccess | None = None,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.access = access or RepositoryAccess()  # by default no namespace gets our identity
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
            pin = await self._list(ts)
        except RepositoryError as exc:
            fallback = (
                cached.manifest if cached is not None and _same_source(cached.manifest, wanted) else running
            )
            if fallback is None:
                raise
            # Keep serving what was pinned; try again after the poll interval.
            versioned = cached.versioned if cached is not None and fallback is cached.manifest else None
            listing = self._listings[key] = _Listing(self.clock(), fallback, exc.message, versioned)
            return listing.summary
        listing = self._listings[key] = _Listing(self.clock(), pin.manifest, versioned=pin.versioned)
        return listing.summary

    async def refresh(self, ts: TritonService) -> bool:
        """List now; True when the pinned manifest differs from the cached one (or the listing failed)."""
        key = (ts.namespace, ts.name)
        before = self._listings.get(key)
        try:
            pin = await self._list(ts)
        except RepositoryError as exc:
            logger.warning("listing the repository of %s/%s failed: %s", *key, exc.message)
            return True
        after = self._listings[key] = _Listing(self.clock(), pin.manifest, versioned=pin.versioned)
        return before is None or before.problem is not None or before.summary.digest != after.summary.digest

    async def _list(self, ts: TritonService) -> PinResult:
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
            pin = await asyncio.to_thread(
                pin_with_versioning,
                repository,
                ts.spec.models,
                credentials,
                access=self.access,
                namespace=ts.namespace,
            )
        except AccessRefused as exc:
            raise RepositoryError(exc.reason, str(exc)) from None
        except SelectionFailed as exc:
            raise RepositoryError(cond.MODELS_NOT_FOUND, f"{repository.uri}: {exc}") from exc
        except (StoreError, ModelConfigError) as exc:
            raise RepositoryError(cond.REPOSITORY_ERROR, f"{repository.uri}: {exc}") from exc
        METRICS.record_repository_listing(
            ts.namespace,
            ts.name,
            scheme=repository.scheme,
            seconds=time.perf_counter() - started,
            objects=len(pin.manifest.entries),
            total_bytes=pin.manifest.total_bytes,
        )
        return pin


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
    """The manifest JSON of the newest running revision (the canary's, else the stable one's)."""
    for revision in (previous.get("canaryRevision"), previous.get("stableRevision")):
        text = revision_manifest(owned.configmaps, revision) if revision else None
        if text is not None:
            return text
    return None


def _unsyncable(seen: _Seen, pinned: PinnedManifest | None) -> dict[str, str]:
    """Revisions an undo must not go back to: objects they pinned were overwritten (unversioned).

    Judged against the listing just pinned, and only while an undo request waits (it parses
    the manifest of every revision an undo may go back to).
    """
    requests = pending_requests(seen.metadata.get("annotations"), seen.previous)
    if pinned is None or pinned.digest is None or not any(r.action == "undo" for r in requests):
        return {}
    current = _parse_manifest(pinned.json)
    if current is None:
        return {}
    out: dict[str, str] = {}
    status = RolloutStatus.from_status(seen.previous)
    # What an undo may go back to (core.rollout: the stable revision or one in history).
    candidates = [h.revision for h in status.history] + [r for r in (status.stable_revision,) if r]
    for revision in candidates:
        earlier = _parse_manifest(revision_manifest(seen.owned.configmaps, revision))
        why = (
            stale_pins(earlier, current, versions_kept=pinned.versions_kept is not False)
            if earlier is not None
            else None
        )
        if why is not None:
            out[revision] = why
    return out


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


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What one reconcile read: the TritonService and the objects it owns (by owner, not by label)."""

    namespace: str
    name: str
    metadata: Mapping[str, Any]
    generation: int
    previous: Mapping[str, Any]
    moment: datetime.datetime
    owned: Owned
    foreign: frozenset[str]
    deployments: list[DeploymentState]
    pods: list[PodState]

    @property
    def now(self) -> str:
        return format_time(self.moment)


@dataclasses.dataclass(frozen=True)
class _Blocked:
    """Why the current spec cannot be applied: its Ready reason and message (and RepositoryReady)."""

    message: str
    reason: str = cond.INVALID_SPEC
    repository: cond.Verdict | None = None
    ts: TritonService | None = None
    """The current spec when it is valid (its repository is polled, so a new pin tries again)."""


class _NotStoredError(Exception):
    """The revision's manifest cannot be stored in ConfigMaps (too many parts, or refused for size)."""


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
    A spec that cannot be applied (invalid, its repository unreadable, refused by the API server)
    changes nothing it asks for: the rollout goes on under the last valid spec (_hold).
    """
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    seen = await _observe(kube, namespace, name, body, clock())

    checked = check_body(body)
    if checked.problems or checked.ts is None:
        return await _hold(kube, seen, settings, _Blocked(checked.message))
    ts = checked.ts
    pinned: PinnedManifest | None = None
    if pin_manifest is not None:
        try:
            pinned = await pin_manifest(ts, _current_manifest(seen.owned, seen.previous))
        except RepositoryError as exc:
            verdict = cond.Verdict(cond.FALSE, exc.reason, exc.message)
            return await _hold(kube, seen, settings, _Blocked(exc.message, exc.reason, verdict))
    revision = compute_revision(ts, settings, checked.configs, pinned.digest if pinned else None)
    try:
        return await _carry_out(
            kube,
            seen,
            settings,
            ts,
            revision,
            configs=checked.configs,
            manifest_json=pinned.json if pinned else None,
            repository=_repository_verdict(ts, pinned),
            unsyncable=_unsyncable(seen, pinned),
        )
    except _NotStoredError as exc:
        message = _too_large(pinned, pinned.json if pinned else None, str(exc))
        logger.warning("%s/%s: %s", namespace, name, message)
        verdict = cond.Verdict(cond.FALSE, cond.MANIFEST_TOO_LARGE, message)
        return await _hold(kube, seen, settings, _Blocked(message, cond.MANIFEST_TOO_LARGE, verdict, ts))
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        return await _hold(kube, seen, settings, _Blocked(str(exc)))


async def _observe(
    kube: Kube, namespace: str, name: str, body: Mapping[str, Any], moment: datetime.datetime
) -> _Seen:
    metadata: Mapping[str, Any] = body.get("metadata") or {}
    found = await kube.list_owned(namespace, owned_selector(name))
    # By owner, not by label: what a deleted TritonService of this name left is not ours.
    adoption = split_by_owner(str(metadata.get("uid") or ""), found.deployments, found.configmaps, found.pods)
    owned = Owned(
        deployments=[dict(d) for d in adoption.deployments],
        configmaps=[dict(c) for c in adoption.configmaps],
        pods=[dict(p) for p in adoption.pods],
    )
    return _Seen(
        namespace=namespace,
        name=name,
        metadata=metadata,
        generation=int(metadata.get("generation") or 0),
        previous=body.get("status") or {},
        moment=moment,
        owned=owned,
        foreign=frozenset(adoption.foreign),
        deployments=[deployment_state(d) for d in owned.deployments],
        pods=[pod_state(p) for p in owned.pods],
    )


async def _hold(kube: Kube, seen: _Seen, settings: Settings, blocked: _Blocked) -> Result:
    """The current spec cannot be applied: go on under the last valid one, else change nothing.

    A bad spec pushed mid-rollout must not switch off rollout safety: the last valid spec (kept in
    its revision's ConfigMap) still drives aborts, deadlines, timed steps and control requests,
    and Ready=False says why the new spec waits. With no last valid spec, nothing is applied or
    deleted; only the status says why.
    """
    last = last_valid(seen.metadata, seen.previous, seen.owned.configmaps)
    if last is not None:
        kept = check_body(last.body)
        if kept.ts is not None and not kept.problems:
            try:
                return await _carry_out(
                    kube,
                    seen,
                    settings,
                    kept.ts,
                    last.revision,
                    configs=kept.configs,
                    manifest_json=last.manifest_json,
                    repository=blocked.repository,
                    blocked=blocked,
                )
            except (ObjectRejectedError, _NotStoredError) as exc:
                logger.warning(
                    "%s/%s: the last valid spec is refused too: %s", seen.namespace, seen.name, exc
                )
    status = build_status(
        seen.previous,
        Observation(
            generation=seen.generation,
            now=seen.now,
            deployments=seen.deployments,
            pods=seen.pods,
            invalid=blocked.message,
            blocked_reason=blocked.reason,
            repository=blocked.repository,
        ),
    )
    written = await _write_status(kube, seen.namespace, seen.name, seen.previous, status)
    return Result(
        status=status, written=written, invalid=blocked.message, reason=blocked.reason, ts=blocked.ts
    )


async def _carry_out(
    kube: Kube,
    seen: _Seen,
    settings: Settings,
    ts: TritonService,
    revision: str,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
    repository: cond.Verdict | None,
    blocked: _Blocked | None = None,
    unsyncable: Mapping[str, str] | None = None,
) -> Result:
    """Plan the rollout toward ``revision`` of ``ts`` and carry it out: apply, route, status, scale,
    delete, Events. ``blocked``: ``ts`` is the last valid spec and the current one waits (why)."""
    namespace, name, previous = seen.namespace, seen.name, seen.previous
    if revision_object_names(ts, revision, sorted(seen.foreign)):
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
            now=seen.moment,
            status=RolloutStatus.from_status(previous),
            revisions=observe_revisions(seen.owned.deployments, seen.owned.pods),
            gpus_per_pod=ts.spec.resources.gpus,
            requests=parse_control_requests(seen.metadata.get("annotations")),
            progress_deadline_seconds=ts.spec.progress_deadline(),
            unsyncable=unsyncable or {},
        )
    )
    # A PodDisruptionBudget the spec no longer wants is looked up (and deleted) only then.
    stale_pdb = not disruption_budget_enabled(ts) and (
        await kube.get("PodDisruptionBudget", namespace, ts.name) is not None
    )
    try:
        actions = plan_actions(
            ts,
            settings,
            revision,
            plan,
            configs=configs,
            manifest_json=manifest_json,
            deployments=seen.owned.deployments,
            configmaps=seen.owned.configmaps,
            revision_services=cond.find_condition(previous.get("conditions") or [], cond.TRAFFIC_ROUTED)
            is not None,
            disruption_budget=stale_pdb,
        )
    except ManifestTooLarge as exc:
        raise _NotStoredError(str(exc)) from exc
    try:
        for obj in actions.apply:
            await kube.apply(obj)
    except ObjectTooLargeError as exc:
        # Refused for its size even so (a cluster with lower limits): a condition that says so, not
        # InvalidSpec, nor a retry that can only be refused again.
        if exc.kind != "ConfigMap":
            raise
        raise _NotStoredError(f"{_parts_summary(actions, manifest_json)}{exc}") from exc
    traffic = await _route_traffic(kube, ts, plan)

    rs = plan.status
    METRICS.set_rollout(
        namespace,
        name,
        step_index=rs.current_step_index if rs.canary_revision is not None else None,
        canary_weight=plan.weights.canary,
    )
    kept = set(plan.replicas)
    progressing = plan.condition(cond.PROGRESSING)
    degraded = plan.condition(cond.DEGRADED)
    status = build_status(
        previous,
        Observation(
            generation=seen.generation,
            now=seen.now,
            deployments=[d for d in seen.deployments if d.revision in kept],
            pods=[p for p in seen.pods if p.revision in kept],
            invalid=blocked.message if blocked else None,
            blocked_reason=blocked.reason if blocked else cond.INVALID_SPEC,
            plan=RevisionPlan(
                replicas=plan.replicas,
                delete=plan.delete,
                stable=rs.stable_revision,
                rolling=rs.canary_revision,
            ),
            replicas=ts.spec.replicas,
            repository=repository,
            endpoints=endpoints(ts),
            models=model_statuses(ts),
            rollout=rs.to_status(),
            progressing=progressing,
            rollout_degraded=degraded,
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
    await _post_events(kube, seen, plan)
    requeue = [t for t in (plan.requeue_after, traffic.retry_after if traffic else None) if t is not None]
    return Result(
        status=status,
        written=written,
        revision=revision,
        invalid=blocked.message if blocked else None,
        reason=blocked.reason if blocked else None,
        plan=plan,
        # Repository polling follows the spec that is applied, never a last valid one.
        ts=blocked.ts if blocked else ts,
        requeue_after=min(requeue) if requeue else None,
    )


async def _post_events(kube: Kube, seen: _Seen, plan: RolloutPlan) -> None:
    # Events after the status: a crash in between loses an event rather than repeating one (the
    # engine emits each event once, in the call whose status records the change).
    for event in plan.events:
        logger.info("%s/%s: %s %s: %s", seen.namespace, seen.name, event.type, event.reason, event.message)
        try:
            await kube.post_event(
                build_event(seen.metadata, event.type, event.reason, event.message, now=seen.now)
            )
        except Exception as exc:  # events are best effort: the status holds the truth
            if retry_delay(exc) is None:
                raise
            logger.warning(
                "could not post event %s for %s/%s: %s", event.reason, seen.namespace, seen.name, exc
            )


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
    if not status_changed(previous, status):
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
    API server) and, only when the pinned manifest changed, asks for a reconcile (a timer due now).

    The pause gate: kopf pauses a replica while a peer of a higher or the same priority lives
    (its watch streams close, so no handler runs), but these timers and pollers are ours. While paused
    (``pause``) no reconcile starts, whoever asks, and there is no timer and no poller: they are
    cancelled, and a reconcile asked for is only noted. ``resume`` reconciles afresh every
    TritonService this replica knows of, which brings their timers and pollers back. A reconcile
    already running when the pause comes finishes (as kopf lets a running handler finish).
    """

    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        *,
        pinner: RepositoryPinner | None = None,
        paused: bool = False,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.pinner = pinner
        self._paused = paused
        self._known: set[tuple[str, str]] = set()
        """Every TritonService a reconcile was asked for (until it is gone): resume reconciles them."""
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
        self._known.add(key)
        if self._paused:
            return None
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
                if self._paused:  # paused while it waited for the one before it
                    return None
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
        if delay is not None and not self._paused:  # paused: the reconcile at resume brings it back
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
        self._known.discard(key)
        poller = self._pollers.pop(key, None)
        if poller is not None:
            poller.cancel()
        timer = self._timers.pop(key, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        if self.pinner is not None:
            self.pinner.forget(namespace, name)
        METRICS.forget(namespace, name)

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self, reason: str = "") -> None:
        """Stop acting: cancel every timer and poller, and start no reconcile until ``resume``."""
        if self._paused:
            return
        self._paused = True
        current = asyncio.current_task()
        timers, pollers = self._timers, self._pollers
        self._timers, self._pollers = {}, {}
        for task in timers.values():
            if task is not current:
                task.cancel()
        for task in pollers.values():
            if task is not current:
                task.cancel()
        logger.info(
            "paused%s: no reconcile, timer or repository poll until resumed (%d timers, %d pollers stopped)",
            f" ({reason})" if reason else "",
            len(timers),
            len(pollers),
        )

    def resume(self, reason: str = "") -> None:
        """Act again: reconcile afresh every TritonService known here (soon, one task each)."""
        if not self._paused:
            return
        self._paused = False
        keys = sorted(self._known)
        logger.info(
            "resumed%s: reconciling %d TritonServices afresh", f" ({reason})" if reason else "", len(keys)
        )
        for key in keys:
            self.requeue(key, 0.0)

    def set_paused(self, paused: bool, reason: str = "") -> None:
        if paused:
            self.pause(reason)
        else:
            self.resume(reason)

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
        if self._paused:
            return  # the reconcile at resume starts the poller
        if self._polls(ts) and (poller is None or poller.done()):
            self._pollers[key] = asyncio.create_task(self._poll(key), name=f"poll {key[0]}/{key[1]}")

    async def _poll(self, key: tuple[str, str]) -> None:
        while True:
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts) or self.pinner is None:
                return
            await asyncio.sleep(ts.spec.repository.poll_interval_seconds)
            ts = self._specs.get(key)
            if ts is None or not self._polls(ts) or self._paused:
                return
            try:
                changed = await self.pinner.refresh(ts)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("polling the repository of %s/%s failed", *key)
                continue
            if changed and not self._paused:
                # On a timer task of its own: the poller only lists, so a pause can cancel it
                # at any time without cutting a reconcile short.
                self.requeue(key, 0.0)

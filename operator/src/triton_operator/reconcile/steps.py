"""One reconcile pass of a TritonService, as a chain of named steps: observe -> desired -> apply -> report."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from triton_operator.adapters.kube import (
    ConflictError,
    KubeAPI,
    ObjectRejectedError,
    ObjectTooLargeError,
    retry_delay,
)
from triton_operator.core import conditions as cond
from triton_operator.core.actions import Actions, RevisionPlan, plan_actions
from triton_operator.core.analysis import AnalysisResult
from triton_operator.core.autoscaling import Autoscalers, scale_replicas, scale_selector, scaled_revisions
from triton_operator.core.builders import (
    build_event,
    compute_revision,
    endpoints,
    triton_image,
)
from triton_operator.core.manifestparts import ManifestTooLarge, compress
from triton_operator.core.names import object_name, revision_object_names
from triton_operator.core.observation import (
    behind_default,
    check_body,
    last_valid,
    layout_of,
    observe_revisions,
    recorded_revisions,
    revision_image,
)
from triton_operator.core.policy import policy_errors
from triton_operator.core.rollout.clock import utcnow
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.requests import parse_control_requests
from triton_operator.core.rollout.state import RolloutStatus
from triton_operator.core.status import Observation, build_status, status_changed
from triton_operator.core.validation.errors import format_errors
from triton_operator.core.validation.spec import spec_warnings
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView, analysis_status, models_status
from triton_operator.reconcile.autoscaling import AUTOSCALER_RETRY_SECONDS
from triton_operator.reconcile.observe import (
    Seen,
    current_manifest,
    observe,
    observe_spec,
    undo_waits,
    unsyncable,
)
from triton_operator.reconcile.pinning import (
    ManifestPinner,
    PinnedManifest,
    RepositoryError,
    pinned_version_errors,
    repository_verdict,
)
from triton_operator.reconcile.routes import Traffic, route_traffic
from triton_operator.settings import Settings

logger = logging.getLogger(__name__)


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
    secret: str | None = None
    """The credentials Secret whose change may unblock the current spec (None: nothing to wait for
    but a spec or settings change): the scheduler looks again with a backoff."""


FOREIGN_RETRY_SECONDS = 2.0
"""How soon to look again while an earlier TritonService's object holds a name we need."""


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


@dataclasses.dataclass(frozen=True)
class _Blocked:
    """Why the current spec cannot be applied: its Ready reason and message (and RepositoryReady)."""

    message: str
    reason: str = cond.INVALID_SPEC
    repository: cond.Verdict | None = None
    ts: TritonService | None = None
    """The current spec when it is valid (its repository is polled, so a new pin tries again)."""
    secret: str | None = None
    """The credentials Secret whose change may unblock it (RepositoryError.secret)."""


class SupersededError(Exception):
    """The TritonService changed after this pass read it (a newer pass, another replica, a user):
    its status write was refused and nothing after it was done. The pass's decision is stale; read
    the object again and decide afresh, never write the stale status again."""

    def __init__(self, namespace: str, name: str, version: str | None) -> None:
        super().__init__(
            f"{namespace}/{name} changed since this pass read it (resourceVersion {version}): "
            "its status was not written"
        )
        self.namespace = namespace
        self.name = name
        self.version = version


class _NotStoredError(Exception):
    """The revision's manifest cannot be stored in ConfigMaps (too many parts, or refused for size)."""


async def reconcile(
    kube: KubeAPI,
    namespace: str,
    name: str,
    settings: Settings,
    *,
    pin_manifest: ManifestPinner | None = None,
    triton: TritonView | None = None,
    clock: Callable[[], datetime.datetime] = utcnow,
) -> Result:
    """Bring one TritonService's objects and status in line with its spec, as stored right now.

    Reads the object afresh (its status is the base of the next one), so callers need only
    its name: a kopf handler for the TritonService, or a watch on the pods it owns. The rollout
    engine (core.rollout) decides the replicas of every revision, the traffic and the status;
    this function carries out its plan and says when to come back (Result.requeue_after).
    A spec that cannot be applied (invalid, its repository unreadable, refused by the API server)
    changes nothing it asks for: the rollout goes on under the last valid spec (_hold).
    ``triton``: what the operator reads of Triton in the pods (status.models, canary analysis);
    a pass only takes the readings there are, it never waits for one.
    """
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    seen = await observe(kube, namespace, name, body, clock())

    async def hold(blocked: _Blocked) -> Result:
        return await _hold(kube, seen, settings, blocked, triton=triton, pin_manifest=pin_manifest)

    checked = check_body(body)
    if checked.problems or checked.ts is None:
        return await hold(_Blocked(checked.message))
    ts = checked.ts
    refused = policy_errors(ts, settings)
    if refused:
        blocked = _Blocked(format_errors(refused), cond.REFUSED_BY_POLICY)
        return await hold(blocked)
    pinned: PinnedManifest | None = None
    if pin_manifest is not None:
        try:
            pinned = await pin_manifest(ts, current_manifest(seen.owned, seen.previous))
        except RepositoryError as exc:
            listing = exc.reason == cond.REPOSITORY_LISTING  # not known yet: the listing runs
            verdict = cond.Verdict(cond.UNKNOWN if listing else cond.FALSE, exc.reason, exc.message)
            return await hold(_Blocked(exc.message, exc.reason, verdict, secret=exc.secret))
    unloadable = pinned_version_errors(ts, pinned)
    if unloadable:
        return await hold(_Blocked(format_errors(unloadable)))
    await _warn(kube, seen, ts, settings)
    # A spec that an existing revision rendered asks for that revision, under the settings it was
    # created with: a new operator default (image, scrape) applies to new revisions only.
    recorded = recorded_revisions(settings, seen.owned.deployments, seen.owned.configmaps)
    revision = compute_revision(ts, settings, checked.configs, pinned.digest if pinned else None, recorded)
    try:
        return await _carry_out(
            kube,
            seen,
            settings,
            ts,
            revision,
            configs=checked.configs,
            manifest_json=pinned.json if pinned else None,
            repository=repository_verdict(ts, pinned),
            unsyncable=unsyncable(seen, pinned),
            triton=triton,
        )
    except _NotStoredError as exc:
        message = _too_large(pinned, pinned.json if pinned else None, str(exc))
        logger.warning("%s/%s: %s", namespace, name, message)
        verdict = cond.Verdict(cond.FALSE, cond.MANIFEST_TOO_LARGE, message)
        blocked = _Blocked(message, cond.MANIFEST_TOO_LARGE, verdict, ts)
        return await hold(blocked)
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        return await hold(_Blocked(str(exc)))


async def _hold(
    kube: KubeAPI,
    seen: Seen,
    settings: Settings,
    blocked: _Blocked,
    *,
    triton: TritonView | None = None,
    pin_manifest: ManifestPinner | None = None,
) -> Result:
    """The current spec cannot be applied: go on under the last valid one, else change nothing.

    A bad spec pushed mid-rollout must not switch off rollout safety: the last valid spec (kept in
    its revision's ConfigMap) still drives aborts, deadlines, timed steps and control requests,
    and Ready=False says why the new spec waits. Its replicas are the live spec.replicas (an
    autoscaler's, or `kubectl scale`'s), and its revision is rendered with the operator settings it
    was created with (core.observation.recorded_settings). With no last valid spec, nothing is applied or
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
                    _scaled(kept.ts, seen.replicas),
                    last.revision,
                    configs=kept.configs,
                    manifest_json=last.manifest_json,
                    repository=blocked.repository,
                    blocked=blocked,
                    unsyncable=await _unsyncable_kept(seen, settings, kept.ts, pin_manifest),
                    triton=triton,
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
    written = await _write_status(kube, seen, status)
    return Result(
        status=status,
        written=written,
        invalid=blocked.message,
        reason=blocked.reason,
        ts=blocked.ts,
        secret=blocked.secret,
    )


async def _unsyncable_kept(
    seen: Seen, settings: Settings, ts: TritonService, pin_manifest: ManifestPinner | None
) -> dict[str, str]:
    """What an undo may not go back to while the spec is blocked, judged as the normal path judges
    it (observe.unsyncable): against a fresh listing of the repository of the last valid spec, the
    spec carried out. Listed only while an undo waits; a listing refused by policy or failing
    judges nothing, as when pinning is off."""
    if pin_manifest is None or not undo_waits(seen) or policy_errors(ts, settings):
        return {}
    try:
        pinned = await pin_manifest(ts, current_manifest(seen.owned, seen.previous))
    except RepositoryError as exc:
        logger.warning("%s/%s: undo not checked against the repository: %s", seen.namespace, seen.name, exc)
        return {}
    return unsyncable(seen, pinned)


def _scaled(ts: TritonService, replicas: int | None) -> TritonService:
    """The last valid spec with the live spec.replicas: scale follows an HPA, KEDA or `kubectl
    scale` (they write spec.replicas through /scale) whatever blocks the rest of the spec."""
    if replicas is None or replicas == ts.spec.replicas:
        return ts
    return ts.model_copy(update={"spec": ts.spec.model_copy(update={"replicas": replicas})})


async def _carry_out(
    kube: KubeAPI,
    seen: Seen,
    settings: Settings,
    ts: TritonService,
    revision: str,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
    repository: cond.Verdict | None,
    blocked: _Blocked | None = None,
    unsyncable: Mapping[str, str] | None = None,
    triton: TritonView | None = None,
) -> Result:
    """Plan the rollout toward ``revision`` of ``ts`` and carry it out: apply, route, status, scale,
    delete, Events. ``blocked``: ``ts`` is the last valid spec and the current one waits (why)."""
    if revision_object_names(ts, revision, sorted(seen.foreign)):
        # The same name is still held by an earlier TritonService's object that the garbage
        # collector has yet to remove: applying ours now would give it two controllers.
        logger.info(
            "%s/%s: waiting for the garbage collector to remove %s of an earlier TritonService",
            seen.namespace,
            seen.name,
            object_name(ts, revision),
        )
        return Result(status=dict(seen.previous), revision=revision, requeue_after=FOREIGN_RETRY_SECONDS)
    # Observe: everything the decision needs is read before it (no read after the decision).
    around = await observe_spec(kube, seen, ts)
    scalers = around.autoscalers
    owner = (seen.namespace, seen.name)
    before = RolloutStatus.from_status(seen.previous)
    readings = triton.look(owner, ts, before, revision, seen.pods) if triton is not None else {}
    analysis = triton.judge(owner, ts, before, readings, seen.moment) if triton is not None else None
    # Decide (pure).
    plan = _plan(seen, ts, revision, before, unsyncable=unsyncable or {}, analysis=analysis)
    actions = _desired(
        seen,
        settings,
        plan,
        ts=ts,
        revision=revision,
        configs=configs,
        manifest_json=manifest_json,
        scalers=scalers,
        stale_pdb=around.stale_disruption_budget,
    )
    # Apply.
    await _apply(kube, actions, manifest_json)
    traffic = await route_traffic(kube, ts, plan, around.routes)
    shown = analysis if analysis is not None and plan.status.canary_revision == analysis.revision else None
    applied = [o for o in actions.apply if o.get("kind") == "Deployment"]
    image = revision_image([*applied, *seen.owned.deployments], plan.status.stable_revision)
    status, written = await _report(
        kube,
        seen,
        ts,
        plan,
        images=(image, behind_default(ts, settings, image)),
        repository=repository,
        blocked=blocked,
        traffic=traffic,
        models=models_status(ts, plan.status, readings),
        analysis=analysis_status(shown, triton.window_started(owner) if triton is not None else None),
        autoscaling=scalers.verdict(ts) if scalers is not None else None,
    )
    # The status records a decision before its effects show: the other revisions are scaled (the
    # old stable down at a flip) and deleted only once it is written, so whoever sees a revision
    # scaled down also finds the status that says why.
    await _scale_and_delete(kube, seen.namespace, actions)
    await _post_events(kube, seen, plan)
    requeue = [
        t
        for t in (
            plan.requeue_after,
            traffic.retry_after if traffic else None,
            AUTOSCALER_RETRY_SECONDS if ts.spec.autoscaling is not None else None,
        )
        if t is not None
    ]
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
        secret=blocked.secret if blocked else None,
    )


def _plan(
    seen: Seen,
    ts: TritonService,
    revision: str,
    status: RolloutStatus,
    *,
    unsyncable: Mapping[str, str],
    analysis: AnalysisResult | None,
) -> RolloutPlan:
    """The rollout engine's decision for this pass (pure: core.rollout)."""
    return plan_rollout(
        RolloutInput(
            rollout=ts.spec.rollout,
            replicas=ts.spec.replicas,
            desired_revision=revision,
            now=seen.moment,
            status=status,
            revisions=observe_revisions(seen.owned.deployments, seen.owned.pods),
            gpus_per_pod=ts.spec.resources.gpus,
            requests=parse_control_requests(seen.metadata.get("annotations")),
            progress_deadline_seconds=ts.spec.progress_deadline(),
            unsyncable=unsyncable,
            analysis=analysis,
        )
    )


def _desired(
    seen: Seen,
    settings: Settings,
    plan: RolloutPlan,
    *,
    ts: TritonService,
    revision: str,
    configs: Mapping[str, str],
    manifest_json: str | None,
    scalers: Autoscalers | None,
    stale_pdb: bool,
) -> Actions:
    """What to apply, scale and delete to carry out ``plan`` (pure: core.actions.plan_actions)."""
    try:
        return plan_actions(
            ts,
            settings,
            revision,
            plan,
            configs=configs,
            manifest_json=manifest_json,
            deployments=seen.owned.deployments,
            configmaps=seen.owned.configmaps,
            revision_services=cond.find_condition(seen.previous.get("conditions") or [], cond.TRAFFIC_ROUTED)
            is not None,
            disruption_budget=stale_pdb,
            autoscaler=scalers.apply_own(ts) if scalers is not None else False,
            stale_autoscaler=scalers.delete_own(ts) if scalers is not None else False,
        )
    except ManifestTooLarge as exc:
        raise _NotStoredError(str(exc)) from exc


async def _apply(kube: KubeAPI, actions: Actions, manifest_json: str | None) -> None:
    """Server-side apply every desired object (ConfigMaps before the Deployment that mounts them)."""
    try:
        for obj in actions.apply:
            await kube.apply(obj)
    except ObjectTooLargeError as exc:
        # Refused for its size even so (a cluster with lower limits): a condition that says so, not
        # InvalidSpec, nor a retry that can only be refused again.
        if exc.kind != "ConfigMap":
            raise
        raise _NotStoredError(f"{_parts_summary(actions, manifest_json)}{exc}") from exc


async def _report(
    kube: KubeAPI,
    seen: Seen,
    ts: TritonService,
    plan: RolloutPlan,
    *,
    images: tuple[str | None, str | None],
    repository: cond.Verdict | None,
    blocked: _Blocked | None,
    traffic: Traffic | None,
    models: list[dict[str, Any]],
    analysis: dict[str, Any] | None,
    autoscaling: cond.Verdict | None,
) -> tuple[dict[str, Any], bool]:
    """Build the status from the plan and what was seen, and write it if it changed.

    ``images``: the tritonserver image the stable revision runs, and the operator's default when the
    spec names none and that image is another (status.image, status.defaultImage)."""
    rs = plan.status
    METRICS.set_rollout(
        seen.namespace,
        seen.name,
        step_index=rs.current_step_index if rs.canary_revision is not None else None,
        canary_weight=plan.weights.canary,
    )
    kept = set(plan.replicas)
    scaled = scaled_revisions(ts.spec.rollout.strategy, rs.stable_revision, rs.canary_revision, plan.replicas)
    progressing = plan.condition(cond.PROGRESSING)
    degraded = plan.condition(cond.DEGRADED)
    status = build_status(
        seen.previous,
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
            scale_replicas=scale_replicas(scaled, seen.deployments),
            scale_selector=scale_selector(ts.name, scaled),
            autoscaling=autoscaling,
            repository=repository,
            endpoints=endpoints(ts),
            models=models,
            analysis=analysis,
            image=images[0],
            default_image=images[1],
            rollout=rs.to_status(),
            progressing=progressing,
            rollout_degraded=degraded,
            aborted=degraded.message if rs.aborted_revision is not None and degraded is not None else None,
            traffic=traffic.verdict if traffic is not None else None,
        ),
    )
    written = await _write_status(kube, seen, status)
    return status, written


async def _scale_and_delete(kube: KubeAPI, namespace: str, actions: Actions) -> None:
    for deployment, replicas in sorted(actions.scale.items()):
        logger.info("scaling Deployment %s/%s to %d", namespace, deployment, replicas)
        await kube.scale(namespace, deployment, replicas)
    for kind, gone in actions.delete:
        if await kube.delete(kind, namespace, gone):
            logger.info("deleted %s %s/%s", kind, namespace, gone)


async def _warn(kube: KubeAPI, seen: Seen, ts: TritonService, settings: Settings) -> None:
    """What is likely wrong without being certain (core.validation.spec_warnings): a Warning Event,
    once per generation (the first pass that sees it, before its status records observedGeneration).
    Judged only then: most passes come from pod events and change no spec."""
    if seen.previous.get("observedGeneration") == seen.generation:
        return
    warnings = spec_warnings(ts.spec, triton_image(ts, settings))
    if not warnings:
        return
    message = format_errors(warnings)
    logger.warning("%s/%s: %s", seen.namespace, seen.name, message)
    await _post_event(kube, seen, cond.WARNING, cond.SPEC_WARNING, message)


async def _post_events(kube: KubeAPI, seen: Seen, plan: RolloutPlan) -> None:
    # Events after the status: a crash in between loses an event rather than repeating one (the
    # engine emits each event once, in the call whose status records the change).
    for event in plan.events:
        logger.info("%s/%s: %s %s: %s", seen.namespace, seen.name, event.type, event.reason, event.message)
        await _post_event(kube, seen, event.type, event.reason, event.message)


async def _post_event(kube: KubeAPI, seen: Seen, event_type: str, reason: str, message: str) -> None:
    """Post one Event about the TritonService; best effort: the status holds the truth, so an API
    error worth retrying is logged and dropped (any other is raised)."""
    try:
        await kube.post_event(build_event(seen.metadata, event_type, reason, message, now=seen.now))
    except Exception as exc:
        if retry_delay(exc) is None:
            raise
        logger.warning("could not post event %s for %s/%s: %s", reason, seen.namespace, seen.name, exc)


async def _write_status(kube: KubeAPI, seen: Seen, status: Mapping[str, Any]) -> bool:
    """Write ``status`` if it changed, on the condition that the TritonService is still the version
    this pass read: a status is decided from what was read, so a replica that lost its peering
    mid-pass, or a pass overtaken by a newer one, never writes an older status over a newer one.
    The pass writes nothing to the TritonService before this, so its version is the one read.
    SupersededError when the TritonService changed since."""
    if not status_changed(seen.previous, status):
        return False
    version = seen.metadata.get("resourceVersion")
    try:
        await kube.apply_status(
            seen.namespace, seen.name, status, resource_version=str(version) if version else None
        )
    except ConflictError as exc:
        raise SupersededError(seen.namespace, seen.name, str(version) if version else None) from exc
    return True

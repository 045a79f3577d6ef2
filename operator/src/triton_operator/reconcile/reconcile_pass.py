"""One reconcile pass of a TritonService: observe (reconcile.observe) -> decide (core.decide) -> apply
(reconcile.apply)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from triton_operator import logs
from triton_operator.adapters.kube import KubeAPI, ObjectRejectedError
from triton_operator.core import conditions as cond
from triton_operator.core.builders import compute_revision, stored_spec, triton_image
from triton_operator.core.decide import Shown, decide, decided_status, held_status
from triton_operator.core.inplace_plan import in_place_sides
from triton_operator.core.manifestparts import ManifestTooLarge
from triton_operator.core.names import object_name, revision_object_names
from triton_operator.core.observation import (
    behind_default,
    check_body,
    last_valid,
    recorded_revisions,
    revision_image,
)
from triton_operator.core.policy import policy_errors
from triton_operator.core.rollout.clock import utcnow
from triton_operator.core.rollout.inplace import InPlaceState
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.state import RolloutStatus
from triton_operator.core.validation.errors import format_errors
from triton_operator.core.validation.spec import spec_warnings
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView, analysis_status, models_status
from triton_operator.reconcile.apply import NotStoredError, apply, post_event, write_status
from triton_operator.reconcile.autoscaling import AUTOSCALER_RETRY_SECONDS
from triton_operator.reconcile.observe import (
    Absences,
    Around,
    Seen,
    current_manifest,
    observe,
    observe_agents,
    observe_specs,
    observed,
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
from triton_operator.reconcile.routes import Traffic
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


async def reconcile(
    kube: KubeAPI,
    namespace: str,
    name: str,
    settings: Settings,
    *,
    pin_manifest: ManifestPinner | None = None,
    triton: TritonView | None = None,
    clock: Callable[[], datetime.datetime] = utcnow,
    absences: Absences | None = None,
) -> Result:
    """Bring one TritonService's objects and status in line with its spec, as stored right now.

    Reads the object afresh (its status is the base of the next one), so callers need only
    its name: a kopf handler for the TritonService, or a watch on the pods it owns. The rollout
    engine (core.rollout) decides the replicas of every revision, the traffic and the status;
    this function carries out its plan and says when to come back (Result.requeue_after).
    A spec that cannot be applied (invalid, its repository unreadable, refused by the API server)
    changes nothing it asks for: the rollout goes on under the last valid spec (_hold).
    ``triton``: what the operator reads of Triton in the pods (status.models, canary analysis);
    a pass only takes the readings there are, it never waits for one. ``absences``: the
    PodDisruptionBudgets this process knows absent (reconcile.observe.Absences; None: none).
    """
    # Observe: the TritonService, what it owns, and the spec to carry out (its repository pinned).
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    seen = await observe_agents(triton, await observe(kube, namespace, name, body, clock()))
    METRICS.record_pod_starts(seen.pods)  # each pod's start once, when first seen Ready
    chosen = await _choose(seen, body, settings, pin_manifest)
    if isinstance(chosen, _Blocked):
        return await _hold(
            kube, seen, settings, chosen, triton=triton, pin_manifest=pin_manifest, absences=absences
        )
    ts, pinned = chosen.ts, chosen.pinned
    await _warn(kube, seen, ts, settings)
    # The last valid spec, when it is another: carried out instead should the API server refuse this
    # one. What it needs is observed with what this one needs, before anything is written.
    kept = await _kept(seen, settings, pin_manifest, instead_of=chosen)
    around, *others = await observe_specs(kube, seen, [ts, *([kept.ts] if kept else [])], absences)
    fallback = (kept, others[0]) if kept is not None else None
    try:
        # Decide (core.decide) and apply (reconcile.apply).
        return await _carry_out(
            kube,
            seen,
            settings,
            ts,
            chosen.revision,
            around=around,
            configs=chosen.configs,
            manifest_json=pinned.json if pinned else None,
            repository=repository_verdict(ts, pinned),
            unsyncable=unsyncable(seen, pinned),
            triton=triton,
            absences=absences,
        )
    except NotStoredError as exc:
        message = _too_large(pinned, pinned.json if pinned else None, str(exc))
        logger.warning("%s/%s: %s", namespace, name, message)
        verdict = cond.Verdict(cond.FALSE, cond.MANIFEST_TOO_LARGE, message)
        blocked = _Blocked(message, cond.MANIFEST_TOO_LARGE, verdict, ts)
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        blocked = _Blocked(str(exc))
    return await _fall_back(
        kube, seen, settings, blocked, fallback=fallback, triton=triton, absences=absences
    )


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """The current spec, valid and allowed, with its repository pinned and its revision."""

    ts: TritonService
    configs: Mapping[str, str]
    pinned: PinnedManifest | None
    revision: str


async def _choose(
    seen: Seen, body: Mapping[str, Any], settings: Settings, pin_manifest: ManifestPinner | None
) -> _Chosen | _Blocked:
    """The current spec to carry out, or why it cannot be (invalid, refused by policy, its repository
    unreadable or its pinned versions unloadable). Pins its repository (reconcile.pinning): a read."""
    checked = check_body(body)
    if checked.problems or checked.ts is None:
        return _Blocked(checked.message)
    ts = checked.ts
    refused = policy_errors(ts, settings)
    if refused:
        return _Blocked(format_errors(refused), cond.REFUSED_BY_POLICY)
    pinned: PinnedManifest | None = None
    if pin_manifest is not None:
        try:
            pinned = await pin_manifest(ts, current_manifest(seen.owned, seen.previous))
        except RepositoryError as exc:
            listing = exc.reason == cond.REPOSITORY_LISTING  # not known yet: the listing runs
            verdict = cond.Verdict(cond.UNKNOWN if listing else cond.FALSE, exc.reason, exc.message)
            return _Blocked(exc.message, exc.reason, verdict, secret=exc.secret)
    unloadable = pinned_version_errors(ts, pinned)
    if unloadable:
        return _Blocked(format_errors(unloadable))
    # A spec that an existing revision rendered asks for that revision, under the settings it was
    # created with: a new operator default (image, scrape) applies to new revisions only.
    recorded = recorded_revisions(settings, seen.owned.deployments, seen.owned.configmaps)
    revision = compute_revision(ts, settings, checked.configs, pinned.digest if pinned else None, recorded)
    logs.set_revision(revision)  # every later record of this pass names it (TRITON_OPERATOR_LOG_FORMAT=json)
    return _Chosen(ts=ts, configs=checked.configs, pinned=pinned, revision=revision)


@dataclasses.dataclass(frozen=True)
class _Kept:
    """The last valid spec, to carry out while the current one cannot be: with the live spec.replicas,
    and what an undo may not go back to."""

    ts: TritonService
    revision: str
    configs: Mapping[str, str]
    manifest_json: str | None
    unsyncable: Mapping[str, str]


async def _kept(
    seen: Seen, settings: Settings, pin_manifest: ManifestPinner | None, *, instead_of: _Chosen | None = None
) -> _Kept | None:
    """The last valid spec (kept in its revision's ConfigMap), when there is one that parses; with
    ``instead_of``, only when it is another spec or revision than that one (the same one refused
    would only be refused again). Reads the repository only to judge an undo (_unsyncable_kept)."""
    last = last_valid(seen.metadata, seen.previous, seen.owned.configmaps)
    if last is None:
        return None
    if (
        instead_of is not None
        and last.revision == instead_of.revision
        and last.body.get("spec") == json.loads(stored_spec(instead_of.ts))
    ):
        return None
    kept = check_body(last.body)
    if kept.ts is None or kept.problems:
        return None
    return _Kept(
        ts=_scaled(kept.ts, seen.replicas),
        revision=last.revision,
        configs=kept.configs,
        manifest_json=last.manifest_json,
        unsyncable=await _unsyncable_kept(seen, settings, kept.ts, pin_manifest),
    )


async def _hold(
    kube: KubeAPI,
    seen: Seen,
    settings: Settings,
    blocked: _Blocked,
    *,
    triton: TritonView | None = None,
    pin_manifest: ManifestPinner | None = None,
    absences: Absences | None = None,
) -> Result:
    """The current spec cannot be applied: go on under the last valid one, else change nothing.

    A bad spec pushed mid-rollout must not switch off rollout safety: the last valid spec (kept in
    its revision's ConfigMap) still drives aborts, deadlines, timed steps and control requests,
    and Ready=False says why the new spec waits. Its replicas are the live spec.replicas (an
    autoscaler's, or `kubectl scale`'s), and its revision is rendered with the operator settings it
    was created with (core.observation.recorded_settings). With no last valid spec, nothing is applied or
    deleted; only the status says why.
    """
    kept = await _kept(seen, settings, pin_manifest)
    fallback = (kept, (await observe_specs(kube, seen, [kept.ts], absences))[0]) if kept is not None else None
    return await _fall_back(
        kube, seen, settings, blocked, fallback=fallback, triton=triton, absences=absences
    )


async def _fall_back(
    kube: KubeAPI,
    seen: Seen,
    settings: Settings,
    blocked: _Blocked,
    *,
    fallback: tuple[_Kept, Around] | None,
    triton: TritonView | None = None,
    absences: Absences | None = None,
) -> Result:
    """Carry out the last valid spec (``fallback``: it, and what was observed for it) while the
    current one waits (``blocked``); if there is none, or it is refused too, only write the status
    that says why."""
    if fallback is not None:
        kept, around = fallback
        try:
            return await _carry_out(
                kube,
                seen,
                settings,
                kept.ts,
                kept.revision,
                around=around,
                configs=kept.configs,
                manifest_json=kept.manifest_json,
                repository=blocked.repository,
                blocked=blocked,
                unsyncable=kept.unsyncable,
                triton=triton,
                absences=absences,
            )
        except (ObjectRejectedError, NotStoredError) as exc:
            logger.warning("%s/%s: the last valid spec is refused too: %s", seen.namespace, seen.name, exc)
    status = held_status(observed(seen), blocked.message, blocked.reason, blocked.repository)
    written = await write_status(kube, seen, status)
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
    around: Around,
    configs: Mapping[str, str],
    manifest_json: str | None,
    repository: cond.Verdict | None,
    blocked: _Blocked | None = None,
    unsyncable: Mapping[str, str] | None = None,
    triton: TritonView | None = None,
    absences: Absences | None = None,
) -> Result:
    """Plan the rollout toward ``revision`` of ``ts`` and carry it out: apply, route, status, scale,
    delete, Events. ``around``: what ``ts`` needs observed beside ``seen`` (observe_specs).
    ``blocked``: ``ts`` is the last valid spec and the current one waits (why)."""
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
    # Everything the decision needs was read before it (no read after the decision; the pods'
    # model agents by observe_agents, once a pass).
    seen_now = observed(seen, around)
    owner = (seen.namespace, seen.name)
    before = RolloutStatus.from_status(seen.previous)
    sides = in_place_sides(seen.previous, seen.pods, seen.agents)
    moving = InPlaceState.from_status(seen.previous)
    in_place = moving is not None and moving.next is not None
    readings = (
        triton.look(owner, ts, before, revision, seen.pods, in_place=in_place) if triton is not None else {}
    )
    analysis = triton.judge(owner, ts, before, readings, seen.moment) if triton is not None else None
    in_place_analysis = (
        triton.judge_in_place(owner, ts, sides, readings, seen.moment) if triton is not None else None
    )
    # Decide (pure: core.decide): the rollout plan, and the objects to apply, scale and delete.
    try:
        decision = decide(
            ts,
            settings,
            revision,
            seen_now,
            configs=configs,
            manifest_json=manifest_json,
            unsyncable=unsyncable,
            analysis=analysis,
            in_place_analysis=in_place_analysis,
        )
    except ManifestTooLarge as exc:
        raise NotStoredError(str(exc)) from exc
    plan = decision.rollout
    shown = analysis if analysis is not None and plan.status.canary_revision == analysis.revision else None
    started = triton.window_started(owner) if triton is not None else None
    state = decision.in_place.plan.state if decision.in_place and decision.in_place.plan else None
    if shown is None and in_place_analysis is not None and state and state.next == in_place_analysis.revision:
        shown = in_place_analysis  # status.analysis: the in-place step's window, as a canary's
        started = triton.in_place_window_started(owner) if triton is not None else None
    applied = [o for o in decision.actions.apply if o.get("kind") == "Deployment"]
    image = revision_image([*applied, *seen.owned.deployments], plan.status.stable_revision)
    scalers = around.autoscalers

    def status(traffic: Traffic | None) -> dict[str, Any]:
        return decided_status(
            ts,
            decision,
            seen_now,
            Shown(
                images=(image, behind_default(ts, settings, image)),
                repository=repository,
                blocked=(blocked.message, blocked.reason) if blocked else None,
                traffic=traffic.verdict if traffic is not None else None,
                models=models_status(ts, plan.status, readings),
                analysis=analysis_status(shown, started),
                autoscaling=scalers.verdict(ts) if scalers is not None else None,
            ),
        )

    # Apply (reconcile.apply): objects, routes, the status, scale changes and deletions, Events.
    budget = ("PodDisruptionBudget", seen.name)
    if absences is not None and any(_key(o) == budget for o in decision.actions.apply):
        absences.present(seen.namespace, seen.name)
    done = await apply(
        kube, seen, ts, decision, routes=around.routes, manifest_json=manifest_json, status=status
    )
    if absences is not None and budget in decision.actions.delete:
        absences.absent(seen.namespace, seen.name)
    traffic = done.traffic
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
        status=done.status,
        written=done.written,
        revision=revision,
        invalid=blocked.message if blocked else None,
        reason=blocked.reason if blocked else None,
        plan=plan,
        # Repository polling follows the spec that is applied, never a last valid one.
        ts=blocked.ts if blocked else ts,
        requeue_after=min(requeue) if requeue else None,
        secret=blocked.secret if blocked else None,
    )


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("kind")), str((obj.get("metadata") or {}).get("name"))


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
    await post_event(kube, seen, cond.WARNING, cond.SPEC_WARNING, message)

"""One reconcile pass of a TritonService: observe (reconcile.observe: every read) -> decide
(core.decision.decide) -> write (reconcile.apply)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from triton_operator import logs
from triton_operator.adapters.kube import KubeAPI, ObjectRejectedError
from triton_operator.core.decision.decide import (
    Decision,
    Observed,
    Shown,
    Target,
    decide,
    decided_status,
    held_status,
)
from triton_operator.core.decision.pool_plan import pool_requeue
from triton_operator.core.objects.builders import compute_revision, stored_spec, triton_image
from triton_operator.core.objects.names import object_name, revision_object_names
from triton_operator.core.observed.observation import (
    behind_default,
    check_body,
    last_valid,
    recorded_revisions,
    revision_image,
)
from triton_operator.core.pod.policy import policy_errors
from triton_operator.core.pool.assignment import Copy
from triton_operator.core.repository.manifestparts import ManifestTooLarge
from triton_operator.core.rollout.clock import utcnow
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.spec.validation.errors import format_errors
from triton_operator.core.spec.validation.spec import spec_warnings
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import Judged, TritonSeen, TritonView, analysis_status, models_status
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


class PoolReports(Protocol):
    """The pool agents' reports, read in the background (adapters.pool_reader.PoolReader)."""

    def latest(self, namespace: str, name: str) -> Mapping[str, Mapping[str, Copy]]:
        """The latest report of each pod of the TritonService, by pod name."""
        ...

    def want(self, namespace: str, name: str, pods: Mapping[str, str | None]) -> None:
        """Read the agents of ``pods`` (name -> IP) on a task of its own (none: forget the service)."""
        ...


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
    pool_reports: PoolReports | None = None,
) -> Result:
    """Bring one TritonService's objects and status in line with its spec, as stored right now.

    Reads the object afresh (its status is the base of the next one), so callers need only
    its name: a kopf handler for the TritonService, or a watch on the pods it owns. The rollout
    engine (core.rollout) decides the replicas of every revision, the traffic and the status;
    this function carries out its plan and says when to come back (Result.requeue_after).
    A spec that cannot be applied (invalid, its repository unreadable, refused by the API server)
    changes nothing it asks for: the rollout goes on under the last valid spec (_fall_back).
    ``triton``: what the operator reads of Triton in the pods (status.models, canary analysis);
    a pass only takes the readings there are, it never waits for one. ``absences``: the
    PodDisruptionBudgets this process knows absent (reconcile.observe.Absences; None: none).
    ``pool_reports``: the pool agents' latest reports (GET :8009/v1/pool) by pod name, as read in the
    background (never in the middle of a pass; None: none read).
    """
    # Observe: every read of the pass. The TritonService, what it owns, the spec to carry out (its
    # repository pinned), the last valid one to carry out instead, and what each of them needs.
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    seen = await observe_agents(triton, await observe(kube, namespace, name, body, clock()))
    if pool_reports is not None:
        # The latest reports, and fresh ones asked for the next pass (read on a task of their own).
        seen = dataclasses.replace(seen, pool_reports=pool_reports.latest(namespace, name))
        pooled = (body.get("spec") or {}).get("pool") is not None
        # Terminating pods too: their copies stay on their routes until they answer elsewhere.
        serving = {p.name: p.ip for p in seen.pods if p.ip} if pooled else {}
        pool_reports.want(namespace, name, serving)
    METRICS.record_pod_starts(seen.pods)  # each pod's start once, when first seen Ready
    METRICS.record_in_place(seen.pods, seen.agents)  # each revision a pod's agent applied in place, once
    chosen = await _choose(seen, body, settings, pin_manifest)
    current = chosen.target if isinstance(chosen, _Chosen) else None
    kept = await _kept(seen, settings, pin_manifest, instead_of=current)
    targets = [t for t in (current, kept) if t is not None]
    around = await observe_specs(kube, seen, targets, absences, triton) if targets else []
    fallback = around[-1] if kept is not None else None
    # Decide (core.decision.decide) and write (reconcile.apply): nothing is read from here on.
    p = _Pass(kube, seen, settings, triton, absences)
    if not isinstance(chosen, _Chosen):
        return await _fall_back(p, chosen, fallback)
    ts, pinned = chosen.target.ts, chosen.pinned
    await _warn(kube, seen, ts, settings)
    try:
        return await _carry_out(p, around[0], repository=repository_verdict(ts, pinned))
    except NotStoredError as exc:
        message = _too_large(pinned, pinned.json if pinned else None, str(exc))
        logger.warning("%s/%s: %s", namespace, name, message)
        verdict = cond.Verdict(cond.FALSE, cond.MANIFEST_TOO_LARGE, message)
        blocked = _Blocked(message, cond.MANIFEST_TOO_LARGE, verdict, ts)
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        blocked = _Blocked(str(exc))
    return await _fall_back(p, blocked, fallback)


@dataclasses.dataclass(frozen=True)
class _Pass:
    """One pass, once it has read everything: where it writes, what it read, the operator's settings,
    and what the process remembers across passes (Triton's windows, absent PodDisruptionBudgets)."""

    kube: KubeAPI
    seen: Seen
    settings: Settings
    triton: TritonView | None
    absences: Absences | None


@dataclasses.dataclass(frozen=True)
class _Chosen:
    """The current spec, valid and allowed, with its repository pinned: what the pass carries out."""

    target: Target
    pinned: PinnedManifest | None


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
    target = Target(
        ts=ts,
        revision=revision,
        configs=checked.configs,
        manifest_json=pinned.json if pinned else None,
        unsyncable=unsyncable(seen, pinned),
    )
    return _Chosen(target=target, pinned=pinned)


async def _kept(
    seen: Seen, settings: Settings, pin_manifest: ManifestPinner | None, *, instead_of: Target | None = None
) -> Target | None:
    """The last valid spec (kept in its revision's ConfigMap), when there is one that parses: to carry
    out while the current one cannot be, with the live spec.replicas and what an undo may not go back
    to. With ``instead_of``, only when it is another spec or revision than that one (the same one
    refused would only be refused again). Reads the repository only to judge an undo (_unsyncable_kept).

    A bad spec pushed mid-rollout must not switch off rollout safety: the last valid spec still
    drives aborts, deadlines, timed steps and control requests, and Ready=False says why the new
    spec waits. Its replicas are the live spec.replicas (an autoscaler's, or `kubectl scale`'s),
    and its revision is rendered with the operator settings it was created with
    (core.observed.observation.recorded_settings)."""
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
    return Target(
        ts=_scaled(kept.ts, seen.replicas),
        revision=last.revision,
        configs=kept.configs,
        manifest_json=last.manifest_json,
        unsyncable=await _unsyncable_kept(seen, settings, kept.ts, pin_manifest),
    )


async def _fall_back(p: _Pass, blocked: _Blocked, fallback: Around | None) -> Result:
    """Carry out the last valid spec (``fallback``: it, and what was observed for it) while the
    current one waits (``blocked``); if there is none, or it is refused too, only write the status
    that says why (nothing is applied or deleted)."""
    if fallback is not None:
        try:
            return await _carry_out(p, fallback, repository=blocked.repository, blocked=blocked)
        except (ObjectRejectedError, NotStoredError) as exc:
            logger.warning(
                "%s/%s: the last valid spec is refused too: %s", p.seen.namespace, p.seen.name, exc
            )
    status = held_status(observed(p.seen), blocked.message, blocked.reason, blocked.repository)
    written = await write_status(p.kube, p.seen, status)
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
    p: _Pass, around: Around, *, repository: cond.Verdict | None, blocked: _Blocked | None = None
) -> Result:
    """Decide the rollout toward ``around.target`` from what was read (``p.seen``, ``around``) and
    write it: apply, route, status, scale, delete, Events. ``repository``: the RepositoryReady
    verdict shown; ``blocked``: the target is the last valid spec and the current one waits (why)."""
    seen, target = p.seen, around.target
    if revision_object_names(target.ts, target.revision, sorted(seen.foreign)):
        # The same name is still held by an earlier TritonService's object that the garbage
        # collector has yet to remove: applying ours now would give it two controllers.
        logger.info(
            "%s/%s: waiting for the garbage collector to remove %s of an earlier TritonService",
            seen.namespace,
            seen.name,
            object_name(target.ts, target.revision),
        )
        return Result(
            status=dict(seen.previous), revision=target.revision, requeue_after=FOREIGN_RETRY_SECONDS
        )
    facts = observed(seen, around)
    decision = _decide(p, around, facts)
    return await _write(p, around, decision, facts, repository=repository, blocked=blocked)


def _decide(p: _Pass, around: Around, facts: Observed) -> Decision:
    """The decision (pure: core.decision.decide) for ``around.target`` from ``facts`` (what was read, as the
    decision reads it): the rollout plan, and the objects to apply, scale and delete.
    NotStoredError when its manifest cannot be stored."""
    target, triton = around.target, around.triton or TritonSeen()
    try:
        return decide(
            target,
            p.settings,
            facts,
            analysis=triton.analysis,
            in_place_analysis=triton.in_place_analysis,
        )
    except ManifestTooLarge as exc:
        raise NotStoredError(str(exc)) from exc


async def _write(
    p: _Pass,
    around: Around,
    decision: Decision,
    facts: Observed,
    *,
    repository: cond.Verdict | None,
    blocked: _Blocked | None,
) -> Result:
    """Carry out ``decision``: Triton's pods to read and the analysis windows of the spec carried out
    (this process's memory), then (reconcile.apply) objects, routes, the status, scale changes and
    deletions, Events. Reads nothing (a route's write that conflicts reads that route again)."""
    seen, target, plan = p.seen, around.target, decision.rollout
    ts, triton = target.ts, around.triton or TritonSeen()
    if p.triton is not None and around.triton is not None:
        p.triton.keep((seen.namespace, seen.name), around.triton)
    # A pool's figures over its window are metrics, not status (status.pool says what it decided).
    METRICS.set_pool_load(seen.namespace, seen.name, facts.pool_load if ts.spec.pool is not None else None)
    applied = [o for o in decision.actions.apply if o.get("kind") == "Deployment"]
    image = revision_image([*applied, *seen.owned.deployments], plan.status.stable_revision)
    scalers = around.autoscalers
    shown = _shown_window(decision, triton)

    def status(traffic: Traffic | None) -> dict[str, Any]:
        return decided_status(
            ts,
            decision,
            facts,
            Shown(
                images=(image, behind_default(ts, p.settings, image)),
                repository=repository,
                blocked=(blocked.message, blocked.reason) if blocked else None,
                traffic=traffic.verdict if traffic is not None else None,
                models=models_status(ts, plan.status, triton.readings),
                analysis=analysis_status(shown.result, shown.started) if shown else None,
                autoscaling=scalers.verdict(ts) if scalers is not None else None,
            ),
        )

    budget = ("PodDisruptionBudget", seen.name)
    if p.absences is not None and any(_key(o) == budget for o in decision.actions.apply):
        p.absences.present(seen.namespace, seen.name)
    done = await apply(
        p.kube, seen, ts, decision, routes=around.routes, manifest_json=target.manifest_json, status=status
    )
    if p.absences is not None and budget in decision.actions.delete:
        p.absences.absent(seen.namespace, seen.name)
    traffic = done.traffic
    requeue = [
        t
        for t in (
            plan.requeue_after,
            traffic.retry_after if traffic else None,
            AUTOSCALER_RETRY_SECONDS if ts.spec.autoscaling is not None else None,
            pool_requeue(decision.pool, facts.moment.timestamp()),
        )
        if t is not None
    ]
    return Result(
        status=done.status,
        written=done.written,
        revision=target.revision,
        invalid=blocked.message if blocked else None,
        reason=blocked.reason if blocked else None,
        plan=plan,
        # Repository polling follows the spec that is applied, never a last valid one.
        ts=blocked.ts if blocked else ts,
        requeue_after=min(requeue) if requeue else None,
        secret=blocked.secret if blocked else None,
    )


def _shown_window(decision: Decision, tri: TritonSeen) -> Judged | None:
    """status.analysis: the canary's window while the plan keeps that canary, else the in-place
    step's while the plan moves to its revision."""
    canary = tri.canary
    if canary is not None and decision.rollout.status.canary_revision == canary.result.revision:
        return canary
    state = decision.in_place.plan.state if decision.in_place and decision.in_place.plan else None
    moving = tri.in_place
    if moving is not None and state is not None and state.next == moving.result.revision:
        return moving
    return None


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return str(obj.get("kind")), str((obj.get("metadata") or {}).get("name"))


async def _warn(kube: KubeAPI, seen: Seen, ts: TritonService, settings: Settings) -> None:
    """What is likely wrong without being certain (core.spec.validation.spec_warnings): a Warning Event,
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

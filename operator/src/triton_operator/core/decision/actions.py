"""The writes that carry out a rollout plan: objects to apply, Deployments to scale, objects to delete."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.core.decision.scaling import HPA_KIND, build_hpa
from triton_operator.core.objects.builders import (
    build_configmaps,
    build_deployment,
    build_labels,
    build_owner_reference,
    build_pdb,
    build_service,
    disruption_budget_enabled,
    manifest_layout,
)
from triton_operator.core.objects.names import APPLIED_ANNOTATION, LABEL_INPLACE_HOST, object_name
from triton_operator.core.objects.traffic import Role, build_revision_service, revision_service_name
from triton_operator.core.observed.observation import (
    layout_of,
    recorded_settings,
    revision_configmaps,
    revision_of,
)
from triton_operator.core.repository.revision import canonical_digest
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.models import TritonService
from triton_operator.settings import Settings

# ----------------------------------------------------------------- revisions (the rollout seam)


@dataclasses.dataclass(frozen=True)
class RevisionPlan:
    """Which revisions serve, as the status reports them (built from core.rollout's plan)."""

    replicas: Mapping[str, int]
    """Revisions to apply, with their replicas; revisions absent here and from delete stay as they are."""
    delete: tuple[str, ...] = ()
    """Revisions whose Deployment goes away."""
    stable: str | None = None
    """The promoted revision that serves."""
    rolling: str | None = None
    """The new revision not yet promoted (None when the desired revision is stable)."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What a pass carries out (reconcile.observe reads what it needs; decide and plan_actions take it):
    a spec, the revision it renders, its models' configs and its pinned manifest, and the revisions
    an undo may not go back to."""

    ts: TritonService
    revision: str
    configs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    manifest_json: str | None = None
    """The pinned manifest's JSON (None: pinning is off)."""
    unsyncable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Revisions an undo must not go back to (their pinned objects were overwritten), and why."""


# ----------------------------------------------------------------- everything at once


@dataclasses.dataclass(frozen=True)
class Actions:
    """What the reconcile writes for one rollout plan (routes and status aside), in this order."""

    apply: tuple[dict[str, Any], ...]
    """Whole objects to server-side apply: the spec's revision (its ConfigMaps not yet stored as
    built, then its Deployment), then Services."""
    scale: Mapping[str, int]
    """Deployment name -> spec.replicas for the revisions other than the spec's, where it differs,
    and for the spec's own revision where it goes down (see plan_actions)."""
    delete: tuple[tuple[str, str], ...]
    """(kind, name) to delete: Deployments and ConfigMaps of revisions let go (and manifest parts the
    spec's revision no longer has), unused revision Services."""
    annotate: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    """Pod name -> its in-place target annotation (None removes it), written after the objects (the
    in-place ConfigMap first: a pod never follows an annotation to files it cannot read yet)."""


@dataclasses.dataclass(frozen=True)
class InPlaceWrites:
    """What an in-place model update writes (core.decision.inplace_plan): its ConfigMap and pod
    annotations."""

    configmap: dict[str, Any] | None = None
    """The `<deployment>-inplace` ConfigMap wanted (None: any that exists goes)."""
    keep: tuple[str, ...] = ()
    """Revisions whose ConfigMaps stay without a Deployment (what the pods serve or load)."""
    annotations: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    history: str | None = None
    """The spec's revision when it moves in place: its own ConfigMaps are written (its record: the
    spec, the settings, the manifest, for an undo and for the next change), never its Deployment."""


def _replicas(deployment: Mapping[str, Any]) -> int:
    return int((deployment.get("spec") or {}).get("replicas", 1))


def _names(objects: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str((o.get("metadata") or {}).get("name", "")) for o in objects]


def _stored_as_built(built: Mapping[str, Any], stored: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a ConfigMap as the API server holds it already is ``built`` (content, labels, owner)."""
    name = built["metadata"]["name"]
    found = next((c for c in stored if (c.get("metadata") or {}).get("name") == name), None)
    if found is None:
        return False
    metadata = found.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return (
        (found.get("data") or {}) == (built.get("data") or {})
        and (found.get("binaryData") or {}) == (built.get("binaryData") or {})
        and all(labels.get(k) == v for k, v in built["metadata"]["labels"].items())
        and metadata.get("ownerReferences") == built["metadata"]["ownerReferences"]
    )


def applied_digest(obj: Mapping[str, Any]) -> str:
    """A digest of a desired object as the operator applies it, its APPLIED_ANNOTATION left out."""
    metadata = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != APPLIED_ANNOTATION}
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    body = {**obj, "metadata": metadata}
    return canonical_digest(body)[:16]


def stamped(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with APPLIED_ANNOTATION holding its applied_digest."""
    metadata = dict(obj.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), APPLIED_ANNOTATION: applied_digest(obj)}
    return {**obj, "metadata": metadata}


def _holds(built: Any, stored: Any) -> bool:
    """Whether ``stored`` holds every value of ``built``: maps may have more keys (the API server's
    defaults, or fields another manager added: applying ``built`` would not remove them), lists have
    as many items, each holding the built one; an empty map or list is as good as none."""
    if isinstance(built, Mapping):
        if not isinstance(stored, Mapping):
            return not built and stored is None
        return all(_holds(v, stored.get(k)) for k, v in built.items())
    if isinstance(built, list):
        if stored is None:
            return not built
        if not isinstance(stored, list) or len(stored) != len(built):
            return False
        return all(_holds(b, s) for b, s in zip(built, stored, strict=True))
    if isinstance(built, bool) or isinstance(stored, bool):
        return built is stored
    return bool(built == stored)


def applied_as_built(built: Mapping[str, Any], stored: Mapping[str, Any] | None) -> bool:
    """Whether applying ``built`` (stamped) would change nothing of ``stored`` (the object as this pass
    observed it), so that the apply can be spared.

    Both must hold: ``stored`` carries the digest of ``built`` (the operator last applied this very
    body, so there is no field it set before and no longer wants, which only an apply removes),
    and every value ``built`` sets is still there (spec.replicas after a scale, an image or a label
    somebody edited by hand: any difference, and the object is applied, as server-side apply then
    puts back what the operator owns). What others added beside the operator's fields stays either
    way. A value the API server stores in another form than the operator wrote it (a quantity
    "1000m" stored as "1") makes the object applied on every pass, as it was before this check.
    """
    if stored is None:
        return False
    annotations = (built.get("metadata") or {}).get("annotations") or {}
    digest = annotations.get(APPLIED_ANNOTATION)
    stored_annotations = (stored.get("metadata") or {}).get("annotations") or {}
    if digest is None or stored_annotations.get(APPLIED_ANNOTATION) != digest:
        return False
    return all(
        _holds(v, stored.get(k)) for k, v in built.items() if k not in ("apiVersion", "kind", "status")
    )


# ----------------------------------------------------------------- one small reconciler per owned kind


@dataclasses.dataclass(frozen=True)
class OwnedKind:
    """What one owned kind needs: its desired objects (applied, whether they exist or not: server-side
    apply creates or updates), and the (kind, name) of those that exist and are no longer wanted."""

    apply: tuple[dict[str, Any], ...] = ()
    delete: tuple[tuple[str, str], ...] = ()


def _revision(
    target: Target,
    settings: Settings,
    plan: RolloutPlan,
    *,
    deployments: Sequence[Mapping[str, Any]],
    configmaps: Sequence[Mapping[str, Any]],
    configmaps_only: bool = False,
) -> OwnedKind:
    """The spec's revision: its ConfigMaps not yet stored as built, then its Deployment (when the plan
    keeps it); manifest parts it no longer has go. ``configmaps_only``: its models move in place
    (no Deployment of its own)."""
    ts, revision = target.ts, target.revision
    configs, manifest_json = target.configs, target.manifest_json
    if revision not in plan.replicas and not configmaps_only:
        return OwnedKind()
    existing = next((d for d in deployments if revision_of(d) == revision), None)
    stored = revision_configmaps(configmaps, revision)
    # An existing revision is rendered with the operator settings it was created with, never
    # today's (a new default image or sync image applies to new revisions only): its pod
    # template never changes. A new one records today's.
    recorded = recorded_settings(settings, stored, existing)
    built = build_configmaps(
        ts,
        revision,
        configs,
        manifest_json,
        layout=layout_of(existing),
        existing=stored,
        settings=recorded,
    )
    # A revision's ConfigMaps never change (its hash names them): one stored as built is not
    # sent again, which spares the API server megabytes of manifest parts on every reconcile.
    apply = [c for c in built if not _stored_as_built(c, stored)]
    if revision not in plan.replicas:
        return OwnedKind(apply=tuple(apply))
    current = _replicas(existing) if existing is not None else 0
    deployment = stamped(
        build_deployment(
            ts,
            revision,
            recorded,
            max(plan.replicas[revision], current),
            manifest_layout(built),
        )
    )
    # A Deployment stored as built is not applied again (nor while its ConfigMaps are written: it
    # follows them, and says how the manifest is stored should they be refused).
    if apply or not applied_as_built(deployment, existing):
        apply.append(deployment)
    names = {c["metadata"]["name"] for c in built}
    return OwnedKind(
        apply=tuple(apply), delete=tuple(("ConfigMap", n) for n in _names(stored) if n not in names)
    )


def _service(ts: TritonService, plan: RolloutPlan) -> OwnedKind:
    """The Service `<name>`, selecting the revision the plan serves from."""
    return OwnedKind(apply=(stamped(build_service(ts, plan.stable_service_revision)),))


def _disruption_budget(ts: TritonService, *, exists: bool) -> OwnedKind:
    """The PodDisruptionBudget `<name>` when the spec wants one; deleted when it exists and is not wanted."""
    if disruption_budget_enabled(ts):
        return OwnedKind(apply=(build_pdb(ts),))
    return OwnedKind(delete=(("PodDisruptionBudget", ts.name),) if exists else ())


def _autoscaler(
    ts: TritonService, *, wanted: bool, exists: bool, stored: Mapping[str, Any] | None = None
) -> OwnedKind:
    """The owned HorizontalPodAutoscaler when wanted (unless ``stored``, the owned one as observed, is
    as built); deleted when the owned one exists and is not."""
    if wanted:
        hpa = stamped(build_hpa(ts))
        return OwnedKind(apply=() if applied_as_built(hpa, stored) else (hpa,))
    return OwnedKind(delete=((HPA_KIND, ts.name),) if exists else ())


def _revision_services(ts: TritonService, plan: RolloutPlan, *, exist: bool) -> OwnedKind:
    """`<name>-stable` and `<name>-canary` while the spec routes through Gateway API; deleted when they
    may exist and it no longer does."""
    routing = ts.spec.rollout.traffic_routing
    if routing is None or routing.gateway_api is None:
        return OwnedKind(
            delete=tuple(("Service", revision_service_name(ts.name, r)) for r in ROLES) if exist else ()
        )
    owner = build_owner_reference({"metadata": ts.metadata})
    roles: tuple[tuple[Role, str | None], ...] = (
        ("stable", plan.stable_service_revision),
        ("canary", plan.canary_service_revision or plan.stable_service_revision),
    )
    return OwnedKind(
        apply=tuple(
            stamped(
                build_revision_service(
                    ts.name, ts.namespace, role, selected, owner_ref=owner, labels=build_labels(ts)
                )
            )
            for role, selected in roles
            if selected
        )
    )


ROLES: tuple[Role, ...] = ("stable", "canary")


def plan_actions(
    target: Target,
    settings: Settings,
    plan: RolloutPlan,
    *,
    deployments: Sequence[Mapping[str, Any]],
    configmaps: Sequence[Mapping[str, Any]],
    revision_services: bool = False,
    disruption_budget: bool = False,
    autoscaler: bool = False,
    stale_autoscaler: bool = False,
    stored_autoscaler: Mapping[str, Any] | None = None,
    in_place: InPlaceWrites | None = None,
) -> Actions:
    """The writes that carry out ``plan`` for ``target``: its spec and the revision it renders.

    Only the spec's own revision can be rendered (ConfigMap and Deployment in full), with the
    operator settings it was created with (core.observed.observation.recorded_settings). Any other
    revision the plan keeps (the stable one being replaced, history, an undo target) was rendered
    from an earlier spec: only its Deployment's spec.replicas changes, and its ConfigMap stays as
    it is, so an undo serves the same bytes. A revision whose Deployment is gone cannot be rebuilt.
    ``revision_services``: `<name>-stable`/`<name>-canary` may exist (they are deleted when the
    spec no longer routes through Gateway API). ``disruption_budget``: the PodDisruptionBudget
    exists (it is deleted when the spec no longer wants one). ``autoscaler``: write the owned
    HorizontalPodAutoscaler (spec.autoscaling, and no other autoscaler targets the service);
    ``stale_autoscaler``: the owned one exists and is not wanted (it is deleted);
    ``stored_autoscaler``: the owned one as observed (not applied again when stored as built: the
    same rule as the spec's revision's Deployment, applied_as_built). ``in_place``: what
    an in-place model update writes (its ConfigMap after the revision's, the pods' annotations).

    Traffic moves off a revision before its pods go: the spec's revision is applied at no fewer
    replicas than it has, and a scale-down (an abort, a lower weight) is in ``scale``, which the
    reconcile carries out after the Services' selectors and the routes' weights are written, as
    it does for every other revision.
    """
    ip = in_place or InPlaceWrites()
    ts, revision = target.ts, target.revision
    owned = (
        _revision(
            target,
            settings,
            plan,
            deployments=deployments,
            configmaps=configmaps,
            configmaps_only=ip.history == revision,
        ),
        _inplace_configmap(ip, configmaps),
        _service(ts, plan),
        _disruption_budget(ts, exists=disruption_budget),
        _autoscaler(ts, wanted=autoscaler, exists=stale_autoscaler, stored=stored_autoscaler),
        _revision_services(ts, plan, exist=revision_services),
    )
    apply = [obj for kind in owned for obj in kind.apply]
    delete = [gone for kind in owned for gone in kind.delete]
    scale: dict[str, int] = {}
    for deployment in deployments:
        rev = revision_of(deployment)
        if rev is None or rev not in plan.replicas:
            continue
        current = _replicas(deployment)
        if current != plan.replicas[rev] and (rev != revision or current > plan.replicas[rev]):
            scale[str(deployment["metadata"]["name"])] = plan.replicas[rev]
    for rev in plan.delete:
        delete += [("Deployment", object_name(ts, rev)), ("ConfigMap", object_name(ts, rev))]
    kept = set(plan.replicas) | set(ip.keep) | ({ip.history} if ip.history else set())
    delete = [d for d in delete if not (d[0] == "ConfigMap" and d[1] in _names_of(ts, ip.keep))]
    for configmap in configmaps:
        rev = revision_of(configmap)
        name = str((configmap.get("metadata") or {}).get("name", ""))
        if _inplace_host(configmap) is not None:
            continue  # the in-place ConfigMap: _inplace_configmap's
        if rev not in kept and ("ConfigMap", name) not in delete:
            delete.append(("ConfigMap", name))
    return Actions(apply=tuple(apply), scale=scale, delete=tuple(delete), annotate=dict(ip.annotations))


def _inplace_host(configmap: Mapping[str, Any]) -> str | None:
    host = ((configmap.get("metadata") or {}).get("labels") or {}).get(LABEL_INPLACE_HOST)
    return str(host) if host else None


def _names_of(ts: TritonService, revisions: Sequence[str]) -> set[str]:
    return {object_name(ts, r) for r in revisions}


def _inplace_configmap(ip: InPlaceWrites, configmaps: Sequence[Mapping[str, Any]]) -> OwnedKind:
    """The `<deployment>-inplace` ConfigMap: applied while an in-place update wants it (unless stored
    as built), every other one deleted."""
    wanted = ip.configmap
    name = wanted["metadata"]["name"] if wanted is not None else None
    stored = [c for c in configmaps if _inplace_host(c) is not None]
    apply = () if wanted is None or _stored_as_built(wanted, stored) else (wanted,)
    gone = tuple(("ConfigMap", n) for n in _names(stored) if n != name)
    return OwnedKind(apply=apply, delete=gone)

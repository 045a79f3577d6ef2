"""What one reconcile writes, after it has decided: a Decision carried out in a fixed order.

1. the objects (core.decision.actions: a revision's ConfigMaps not yet stored as built, then its Deployment,
   the in-place ConfigMap, then the Service, the PodDisruptionBudget, the owned HPA, the revision
   Services), by server-side apply; then the pods' in-place target annotations (merge patches);
2. the routes' weights (merge patches carrying the resourceVersion each route was read at);
3. the status, if it changed, on the condition that the TritonService is still the version read
   (SupersededError otherwise: nothing after it is done);
4. scale changes, then deletions: traffic moves off a revision before its pods go, and whoever sees a
   revision scaled down also finds the status that says why;
5. Events (best effort): a crash before them loses an Event rather than repeating one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from triton_operator.adapters.kube import ConflictError, KubeAPI, ObjectTooLargeError, retry_delay
from triton_operator.core.decision.actions import Actions
from triton_operator.core.decision.decide import Decision
from triton_operator.core.decision.pool_plan import PoolPlan
from triton_operator.core.decision.service_status import served_events, status_changed
from triton_operator.core.objects.builders import build_event
from triton_operator.core.objects.names import INPLACE_TARGET_ANNOTATION
from triton_operator.core.observed.observation import layout_of
from triton_operator.core.repository.manifestparts import compress
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile.observe import Seen
from triton_operator.reconcile.routes import Routes, Traffic, route_traffic

logger = logging.getLogger(__name__)


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


class NotStoredError(Exception):
    """The revision's manifest cannot be stored in ConfigMaps (too many parts, or refused for size)."""


@dataclasses.dataclass(frozen=True)
class Applied:
    """What carrying out a decision wrote: the status (and whether it was written), the routes' outcome."""

    status: dict[str, Any]
    written: bool
    traffic: Traffic | None


async def apply(
    kube: KubeAPI,
    seen: Seen,
    ts: TritonService,
    decision: Decision,
    *,
    routes: Routes,
    manifest_json: str | None,
    status: Callable[[Traffic | None], dict[str, Any]],
) -> Applied:
    """Carry out ``decision`` for ``ts`` in the module's order. ``routes``: the routes as observed;
    ``status``: the decided status, given how the routes were set (the one outcome the decision
    cannot know before the writes)."""
    await apply_objects(kube, decision.actions, manifest_json)
    await annotate_pods(kube, seen.namespace, decision.actions)
    await carry_out_pool(kube, seen.namespace, decision.pool)
    traffic = await route_traffic(kube, ts, decision.rollout, routes)
    rs = decision.rollout.status
    METRICS.set_rollout(
        seen.namespace,
        seen.name,
        step_index=rs.current_step_index if rs.canary_revision is not None else None,
        canary_weight=decision.rollout.weights.canary,
    )
    written_status = status(traffic)
    written = await write_status(kube, seen, written_status)
    first = written_status.get("stableRevision")
    if written and first and not seen.previous.get("stableRevision"):
        # The first revision posts no Event (it replaces nothing; RevisionServed follows): the log says it.
        logger.info("%s/%s: first revision %s applied", seen.namespace, seen.name, first)
    await scale_and_delete(kube, seen.namespace, decision.actions)
    # A revision's time to serve is posted once: in the pass whose status first records it.
    pool_events = decision.pool.events if decision.pool is not None else ()
    for event in [*decision.rollout.events, *pool_events, *served_events(seen.previous, written_status)]:
        logger.info("%s/%s: %s %s: %s", seen.namespace, seen.name, event.type, event.reason, event.message)
        await post_event(kube, seen, event.type, event.reason, event.message)
    return Applied(status=written_status, written=written, traffic=traffic)


def _parts_summary(actions: Actions, manifest_json: str | None) -> str:
    """How the refused revision stores its manifest (its Deployment says how many parts)."""
    deployment = next((o for o in actions.apply if o.get("kind") == "Deployment"), None)
    layout = layout_of(deployment)
    if manifest_json is None or layout is None or layout.plain:
        return ""
    return f"{len(compress(manifest_json))} bytes gzipped in {layout.parts} ConfigMaps; "


async def apply_objects(kube: KubeAPI, actions: Actions, manifest_json: str | None) -> None:
    """Server-side apply every desired object (ConfigMaps before the Deployment that mounts them)."""
    try:
        for obj in actions.apply:
            await kube.apply(obj)
    except ObjectTooLargeError as exc:
        # Refused for its size even so (a cluster with lower limits): a condition that says so, not
        # InvalidSpec, nor a retry that can only be refused again.
        if exc.kind != "ConfigMap":
            raise
        raise NotStoredError(f"{_parts_summary(actions, manifest_json)}{exc}") from exc


async def annotate_pods(kube: KubeAPI, namespace: str, actions: Actions) -> None:
    """The pods' in-place target annotations (after the in-place ConfigMap:
    core.decision.actions.Actions.annotate); a pod gone meanwhile is skipped (the next pass sees it gone)."""
    for pod, target in sorted(actions.annotate.items()):
        logger.info("pod %s/%s: %s=%s", namespace, pod, INPLACE_TARGET_ANNOTATION, target)
        await kube.merge_patch(
            "Pod", namespace, pod, {"metadata": {"annotations": {INPLACE_TARGET_ANNOTATION: target}}}
        )


async def carry_out_pool(kube: KubeAPI, namespace: str, pool: PoolPlan | None) -> None:
    """spec.pool's writes: the per-model Services and routes (server-side apply, spared when stored as
    built), those no longer wanted deleted, then each pod's assignment annotation and model labels
    (merge patches on the resourceVersion read: a pod changed or gone meanwhile waits for the next
    pass, which reads it again)."""
    if pool is None:
        return
    for service in pool.services:
        await kube.apply(service)
    for kind, gone in pool.delete:
        if await kube.delete(kind, namespace, gone):
            logger.info("deleted %s %s/%s (no longer in the pool)", kind, namespace, gone)
    for patch in pool.patches:
        try:
            done = await kube.merge_patch("Pod", namespace, patch.pod, patch.body())
        except ConflictError:
            logger.info("pod %s/%s changed since it was read: its pool patch waits", namespace, patch.pod)
            continue
        if done is not None:
            logger.info("pod %s/%s: pool %s", namespace, patch.pod, patch.body()["metadata"])


async def scale_and_delete(kube: KubeAPI, namespace: str, actions: Actions) -> None:
    for deployment, replicas in sorted(actions.scale.items()):
        logger.info("scaling Deployment %s/%s to %d", namespace, deployment, replicas)
        await kube.scale(namespace, deployment, replicas)
    for kind, gone in actions.delete:
        if await kube.delete(kind, namespace, gone):
            logger.info("deleted %s %s/%s", kind, namespace, gone)


async def post_event(kube: KubeAPI, seen: Seen, event_type: str, reason: str, message: str) -> None:
    """Post one Event about the TritonService; best effort: the status holds the truth, so an API
    error worth retrying is logged and dropped (any other is raised)."""
    try:
        await kube.post_event(build_event(seen.metadata, event_type, reason, message, now=seen.now))
    except Exception as exc:
        if retry_delay(exc) is None:
            raise
        logger.warning("could not post event %s for %s/%s: %s", reason, seen.namespace, seen.name, exc)


async def write_status(kube: KubeAPI, seen: Seen, status: Mapping[str, Any]) -> bool:
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

"""Level-based reconcile of one TritonService: observe -> desired -> apply -> status (written if changed)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from triton_operator.adapters.kube import Kube, ObjectRejectedError, Owned
from triton_operator.core import conditions as cond
from triton_operator.core.objects import (
    LABEL_MANAGED_BY,
    LABEL_REVISION,
    LABEL_SERVICE,
    MANAGED_BY,
    RevisionPlan,
    build_objects,
    check_body,
    compute_revision,
    decide_revisions,
    deployment_state,
    endpoints,
    model_statuses,
    object_name,
    pod_state,
)
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.settings import Settings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PinnedManifest:
    """A repository manifest pinned for a revision: the JSON the sync container reads, and its digest."""

    json: str
    digest: str
    objects: int = 0
    total_bytes: int = 0


# The storage seam: list the repository and pin a manifest, or None to run unpinned.
# ``current`` is the manifest JSON of the revision serving now (reuse it until a re-list is due).
ManifestPinner = Callable[[TritonService, str | None], Awaitable[PinnedManifest | None]]


class InvalidSpecError(Exception):
    """The spec cannot be served; status says why and nothing running was touched."""


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
    """Why the spec is invalid (None when valid)."""
    plan: RevisionPlan | None = None


def utcnow() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def owned_selector(name: str) -> dict[str, str]:
    return {LABEL_SERVICE: name, LABEL_MANAGED_BY: MANAGED_BY}


def _current_manifest(owned: Owned, name: str, stable: str | None) -> str | None:
    if not stable:
        return None
    for configmap in owned.configmaps:
        if configmap.get("metadata", {}).get("name") == f"{name}-{stable}":
            value = (configmap.get("data") or {}).get("manifest.json")
            return str(value) if value is not None else None
    return None


def _repository_verdict(ts: TritonService, pinned: PinnedManifest | None) -> cond.Verdict:
    if ts.spec.repository.scheme == "pvc":
        return cond.Verdict(cond.TRUE, cond.VOLUME_MOUNTED, f"models are read from {ts.spec.repository.uri}")
    if pinned is None:
        return cond.Verdict(
            cond.TRUE, cond.UNPINNED, "repository not pinned: pods sync what the store holds when they start"
        )
    return cond.Verdict(
        cond.TRUE, cond.MANIFEST_PINNED, f"{pinned.objects} objects pinned (manifest {pinned.digest[:12]})"
    )


async def reconcile(
    kube: Kube,
    namespace: str,
    name: str,
    settings: Settings,
    *,
    pin_manifest: ManifestPinner | None = None,
    now: Callable[[], str] = utcnow,
) -> Result:
    """Bring one TritonService's objects and status in line with its spec, as stored right now.

    Reads the object afresh (its status is the base of the next one), so callers need only
    its name: a kopf handler for the TritonService, or a watch on the pods it owns.
    """
    body = await kube.get_tritonservice(namespace, name)
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        # Gone or going: ownerReferences let the garbage collector remove what it owned.
        METRICS.forget(namespace, name)
        return Result(status=None)
    generation = int(body.get("metadata", {}).get("generation") or 0)
    previous: Mapping[str, Any] = body.get("status") or {}
    owned = await kube.list_owned(namespace, owned_selector(name))
    deployments = [deployment_state(d) for d in owned.deployments]
    pods = [pod_state(p) for p in owned.pods]

    async def refuse(message: str) -> Result:
        # A bad spec never touches what runs: no apply, no delete; only the status says why.
        status = cond.build_status(
            previous,
            cond.Observation(
                generation=generation, now=now(), deployments=deployments, pods=pods, invalid=message
            ),
        )
        written = await _write_status(kube, namespace, name, previous, status)
        return Result(status=status, written=written, invalid=message)

    checked = check_body(body)
    if checked.problems or checked.ts is None:
        return await refuse(checked.message)

    ts = checked.ts
    stable_hint = previous.get("stableRevision")
    pinned: PinnedManifest | None = None
    if pin_manifest is not None and ts.spec.repository.scheme != "pvc":
        pinned = await pin_manifest(ts, _current_manifest(owned, name, stable_hint))
    revision = compute_revision(ts, settings, checked.configs, pinned.digest if pinned else None)
    plan = decide_revisions(revision, ts.spec.replicas, deployments, stable_hint)

    desired = build_objects(
        ts,
        settings,
        revision,
        configs=checked.configs,
        manifest_json=pinned.json if pinned else None,
        replicas=plan.replicas,
    )
    try:
        for obj in desired:
            await kube.apply(obj)
    except ObjectRejectedError as exc:
        # The schema let something through that the API server refuses (e.g. a malformed volume).
        return await refuse(str(exc))
    for gone in plan.delete:
        logger.info("deleting Deployment %s of revision %s", object_name(ts, gone), gone)
        await kube.delete("Deployment", namespace, object_name(ts, gone))

    created = {
        str(d.get("metadata", {}).get("labels", {}).get(LABEL_REVISION)): str(
            d.get("metadata", {}).get("creationTimestamp", "")
        )
        for d in owned.deployments
    }
    observed = [d for d in deployments if d.revision not in plan.delete]
    status = cond.build_status(
        previous,
        cond.Observation(
            generation=generation,
            now=now(),
            deployments=observed,
            pods=[p for p in pods if p.revision not in plan.delete],
            plan=plan,
            replicas=ts.spec.replicas,
            repository=_repository_verdict(ts, pinned),
            endpoints=endpoints(ts),
            models=model_statuses(ts),
            history_limit=ts.spec.rollout.revision_history_limit,
            created={k: v for k, v in created.items() if v},
        ),
    )
    keep = {plan.stable, plan.rolling} | {h.get("revision") for h in status.get("history", [])}
    for configmap in owned.configmaps:
        labels = configmap.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_REVISION) not in keep:
            await kube.delete("ConfigMap", namespace, str(configmap["metadata"]["name"]))
    written = await _write_status(kube, namespace, name, previous, status)
    if pinned is not None:
        METRICS.repository_objects.labels(namespace=namespace, name=name).set(pinned.objects)
        METRICS.repository_bytes.labels(namespace=namespace, name=name).set(pinned.total_bytes)
    return Result(status=status, written=written, revision=revision, plan=plan)


async def _write_status(
    kube: Kube, namespace: str, name: str, previous: Mapping[str, Any], status: Mapping[str, Any]
) -> bool:
    if not cond.status_changed(previous, status):
        return False
    await kube.apply_status(namespace, name, status)
    return True


class Reconciler:
    """Serializes reconciles per TritonService and coalesces triggers that arrive while one waits.

    A trigger while a reconcile for the same object is queued (not yet started) is dropped:
    the queued one reads the object and its pods afresh when it starts, so it sees the change.
    """

    def __init__(self, kube: Kube, settings: Settings, *, pin_manifest: ManifestPinner | None = None) -> None:
        self.kube = kube
        self.settings = settings
        self.pin_manifest = pin_manifest
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        self._queued: dict[tuple[str, str], int] = {}

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
                        self.kube, namespace, name, self.settings, pin_manifest=self.pin_manifest
                    )
                    if result.invalid:
                        outcome.fail(cond.INVALID_SPEC, outcome="invalid")
                    return result
        finally:
            if not started:
                self._dequeue(key)

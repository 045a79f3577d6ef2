"""kopf handlers only: each event names one TritonService, the reconcile does the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from triton_operator import GROUP, PLURAL, VERSION
from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.cached_kube import CachedKube
from triton_operator.adapters.kube import Kube, make_client
from triton_operator.adapters.owned_watch import OwnedCache, OwnedWatch, scopes
from triton_operator.adapters.peering import PeeringMonitor, lightkube_watch, peering_scope
from triton_operator.adapters.pool_reader import PoolReader
from triton_operator.adapters.triton_reader import TritonReader
from triton_operator.core.repository.repository_access import RepositoryAccess
from triton_operator.core.rollout.requests import pending_requests
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.scheduler import Reconciler
from triton_operator.reconcile.tuning_expiry import TuningExpiry
from triton_operator.settings import Settings


def configure(settings: kopf.OperatorSettings, operator: Settings) -> None:
    """kopf's own settings: it writes nothing to our status and adds no finalizer."""
    # kopf's progress (only ever used by change-detecting handlers; there are none) goes to
    # annotations under our group, never into .status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    # Only used if a deletion handler existed; none does: ownerReferences let the garbage collector
    # remove what a TritonService owned, so deleting one never waits for the operator.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.getLevelNamesMapping().get(operator.event_level, logging.WARNING)
    # kopf posts log records at or above that level as Events only when this is on (off by default).
    settings.posting.loggers = True
    settings.posting.reporting_component = "triton-operator"
    # Restart long watches now and then; a stuck TCP connection otherwise stops all events.
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 660
    settings.networking.request_timeout = 60


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    operator = memo.get("operator_settings") or Settings.from_env()
    configure(settings, operator)
    kube = Kube(make_client())
    access = RepositoryAccess.from_settings(operator)
    pinner = (
        RepositoryPinner(kube, access=access, max_objects=operator.max_listed_objects)
        if operator.pin_repositories
        else None
    )
    scope = peering_scope(
        settings.peering, identity=operator.peering_identity, namespaces=operator.namespaces
    )
    # With peering, kopf starts paused until it has looked at the peering object; so does ours.
    triton = (
        TritonView(
            TritonReader(period=operator.triton_read_seconds, cidrs=operator.triton_read_cidrs),
            AgentReader(cidrs=operator.triton_read_cidrs),
        )
        if operator.triton_read_seconds > 0
        else None
    )
    # A pass reads the TritonService as kopf's watch handed it and what it owns from our own
    # watches (adapters.cached_kube): no request for what is already known.
    cache = OwnedCache()
    cached = CachedKube(kube, cache)
    pool = PoolReader(cidrs=operator.triton_read_cidrs)  # the pool agents' reports (spec.pool)
    reconciler = Reconciler(
        cached, operator, pinner=pinner, triton=triton, pool=pool, paused=scope is not None
    )
    memo["reconciler"] = reconciler
    memo["cached_kube"] = cached
    memo["kube"] = kube  # the Reconciler knows it only as KubeAPI, which has no close()
    # The Deployments, pods, ConfigMaps and Services the TritonServices own: watches of our own
    # (kopf's decoded and queued every whole object per object) that keep them in the cache;
    # each event of a Deployment or pod is a reconcile of its owner.
    owned = OwnedWatch(
        kube.http(),
        reconciler.trigger,
        namespaces=operator.namespaces,
        all_namespaces=operator.all_namespaces,
        cache=cache,
    )
    await owned.start()
    memo["owned_watch"] = owned
    # What `kubectl triton tune` left past its deadline (a client killed mid-sweep): deleted.
    where, counts = scopes(operator.namespaces, operator.all_namespaces)
    expiry = TuningExpiry(kube, where=where, counts=counts, paused=lambda: reconciler.paused)
    memo["tuning_expiry"] = expiry.start()
    if scope is not None:
        monitor = PeeringMonitor(
            scope,
            lightkube_watch(kube.client, scope),
            lambda verdict: _set_paused(reconciler, cached, verdict.paused, verdict.message),
        )
        memo["peering"] = monitor.start()


def _set_paused(reconciler: Reconciler, cached: CachedKube, paused: bool, message: str) -> None:
    """kopf's watch of TritonServices stops while paused: what it handed over may go stale."""
    cached.forget_all()
    reconciler.set_paused(paused, message)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    monitor: asyncio.Task[None] | None = memo.get("peering")
    if monitor is not None:
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
    await TuningExpiry.stop(memo.get("tuning_expiry"))
    owned: OwnedWatch | None = memo.get("owned_watch")
    if owned is not None:
        await owned.close()
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.close()
    kube: Kube | None = memo.get("kube")
    if kube is not None:
        await kube.close()


def fingerprint(meta: Mapping[str, Any]) -> int:
    """What of a TritonService's metadata a reconcile acts on: which object it is (a TritonService
    deleted and made again under its name is another), its generation (bumped by every spec change,
    never by a status write) and its labels and annotations (control requests among them)."""
    labels = tuple(sorted((meta.get("labels") or {}).items()))
    annotations = tuple(sorted((meta.get("annotations") or {}).items()))
    return hash((meta.get("uid"), meta.get("generation"), labels, annotations))


@kopf.on.event(GROUP, VERSION, PLURAL)
async def tritonservice(
    *,
    type: str | None,  # noqa: A002  (kopf's name)
    body: Mapping[str, Any],
    meta: Mapping[str, Any],
    status: Mapping[str, Any],
    namespace: str | None,
    name: str | None,
    memo: Any,
    **_: Any,
) -> None:
    """A TritonService was listed (the operator started, or its watch began again), appeared,
    changed, or is gone: reconcile it, on a task of its own. Every event's body is kept for the
    passes (adapters.cached_kube: they read it instead of the API server), whether it asks for a
    pass or not (our own status writes).

    Level-based: kopf keeps no copy of the last handled spec and writes nothing to the object. A
    status write (ours) changes neither the generation nor the labels and annotations, so it wakes
    no pass; a control request (an annotation) does, and so does any event while the annotations
    hold a request the status does not record as handled yet (a pass superseded before it did).
    """
    if not namespace or not name:
        return
    reconciler: Reconciler = memo["reconciler"]
    cached: CachedKube | None = memo.get("cached_kube")
    if cached is not None:
        if type == "DELETED":
            cached.forget(namespace, name)
        else:
            cached.remember(dict(body))
    seen = reconciler.fingerprints  # dropped when a pass finds the TritonService gone
    key = (namespace, name)
    if type == "DELETED":
        seen.pop(key, None)
        reconciler.trigger(namespace, name)  # finds it gone and forgets it
        return
    now = fingerprint(meta)
    # The first event of each (the listing at start: every TritonService is reconciled) differs.
    if type == "ADDED" or seen.get(key) != now or pending_requests(meta.get("annotations") or {}, status):
        seen[key] = now
        reconciler.trigger(namespace, name, first=True)

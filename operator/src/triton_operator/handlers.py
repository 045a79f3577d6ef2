"""kopf handlers only: each event names one TritonService, the reconcile does the rest."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from triton_operator import GROUP, PLURAL, VERSION
from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.kube import Kube, make_client, retry_delay
from triton_operator.adapters.peering import PeeringMonitor, lightkube_watch, peering_scope
from triton_operator.adapters.triton_reader import TritonReader
from triton_operator.core.conditions import (
    CREDENTIALS_REQUIRED,
    ENDPOINT_NOT_ALLOWED,
    INVALID_SPEC,
    MANIFEST_TOO_LARGE,
    REFUSED_BY_POLICY,
)
from triton_operator.core.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY
from triton_operator.core.repository_access import RepositoryAccess
from triton_operator.core.rollout.requests import pending_requests
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.pinning import RepositoryPinner
from triton_operator.reconcile.scheduler import Reconciler
from triton_operator.reconcile.steps import Result
from triton_operator.settings import Settings

OWNED: dict[str, Any] = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: kopf.PRESENT}
DIFFBASE_KEY = "last-handled-configuration"
EVENT_RETRIES = 5
REPOSITORY_RETRY_SECONDS = 30.0


def configure(settings: kopf.OperatorSettings, operator: Settings) -> None:
    """kopf's own settings: it writes nothing to our status and adds no finalizer."""
    # Progress and the diff base go to annotations under our group, never into .status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key=DIFFBASE_KEY)
    # Only used if a deletion handler existed; none does: ownerReferences let the garbage collector
    # remove what a TritonService owned, so deleting one never waits for the operator.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.getLevelNamesMapping().get(operator.event_level, logging.WARNING)
    # kopf posts log records at or above that level as Events only when this is on (off by default).
    settings.posting.loggers = True
    settings.posting.reporting_component = "triton-operator"
    # Watch only our Deployments and pods: the API server filters, not this process.
    owned = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_SERVICE}"
    settings.watching.label_selectors["apps", "v1", "deployments"] = owned
    settings.watching.label_selectors["", "v1", "pods"] = owned
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
    reconciler = Reconciler(kube, operator, pinner=pinner, triton=triton, paused=scope is not None)
    memo["reconciler"] = reconciler
    memo["kube"] = kube  # the Reconciler knows it only as KubeAPI, which has no close()
    if scope is not None:
        monitor = PeeringMonitor(
            scope,
            lightkube_watch(kube.client, scope),
            lambda verdict: reconciler.set_paused(verdict.paused, verdict.message),
        )
        memo["peering"] = monitor.start()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    monitor: asyncio.Task[None] | None = memo.get("peering")
    if monitor is not None:
        monitor.cancel()
        await asyncio.gather(monitor, return_exceptions=True)
    reconciler: Reconciler | None = memo.get("reconciler")
    if reconciler is not None:
        await reconciler.close()
    kube: Kube | None = memo.get("kube")
    if kube is not None:
        await kube.close()


async def _reconcile(memo: Any, namespace: str, name: str, *, coalesce: bool) -> Result | None:
    reconciler: Reconciler = memo["reconciler"]
    try:
        return await reconciler(namespace, name, coalesce=coalesce)
    except Exception as exc:
        delay = retry_delay(exc)
        if delay is None:
            raise
        raise kopf.TemporaryError(f"{type(exc).__name__}: {exc}", delay=delay) from exc


async def _reconcile_retrying(memo: Any, namespace: str, name: str, logger: Any, *, after: str) -> None:
    """An event handler's reconcile: kopf never retries those, so a temporary failure is retried here."""
    for attempt in range(EVENT_RETRIES):
        try:
            await _reconcile(memo, namespace, name, coalesce=True)
            return
        except kopf.TemporaryError as exc:
            logger.warning("reconcile of %s/%s after %s failed: %s", namespace, name, after, exc)
            if attempt + 1 < EVENT_RETRIES:
                await asyncio.sleep(exc.delay or 5.0)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
async def tritonservice(namespace: str | None, name: str, memo: Any, **_: Any) -> None:
    """A TritonService appeared, changed, or the operator restarted: reconcile it."""
    result = await _reconcile(memo, namespace or "default", name, coalesce=False)
    if result is not None and result.invalid:
        if result.reason in (
            INVALID_SPEC,
            MANIFEST_TOO_LARGE,
            REFUSED_BY_POLICY,
            CREDENTIALS_REQUIRED,
            ENDPOINT_NOT_ALLOWED,
        ):
            # The status already says why; retrying cannot help. A manifest too large is tried
            # again when the spec changes or the repository poll pins another one; a refusal of
            # the operator's policy when the spec changes or the operator restarts with other
            # settings (its resume handler reconciles every TritonService again). A refusal for what
            # the credentials Secret holds is looked at again by the Reconciler itself, with a
            # backoff, so a fixed Secret is noticed without either (scheduler.SECRET_RETRY_*).
            raise kopf.PermanentError(result.invalid)
        # The repository could not be read: the status says why; try again later.
        raise kopf.TemporaryError(result.invalid, delay=REPOSITORY_RETRY_SECONDS)


def _has_pending_request(annotations: Mapping[str, str], status: Mapping[str, Any], **_: Any) -> bool:
    return bool(pending_requests(annotations, status))


# kopf's update handlers never see our control annotations: its diff-base drops every annotation
# under a prefix it stores its own state in (triton-operator.io/), so `kubectl triton promote`
# would go unnoticed. Every watch event is looked at instead, and a TritonService whose
# annotations hold a request its status does not record as handled yet is reconciled.
@kopf.on.event(GROUP, VERSION, PLURAL, when=_has_pending_request)
async def control_request(namespace: str | None, name: str | None, memo: Any, logger: Any, **_: Any) -> None:
    """A control request (promote, abort, pause, resume, retry, undo) was made: reconcile now."""
    if not namespace or not name:
        return
    await _reconcile_retrying(memo, namespace, name, logger, after="a control request")


@kopf.on.event("apps", "v1", "deployments", labels=OWNED)
@kopf.on.event("", "v1", "pods", labels=OWNED)
async def owned_object(
    namespace: str | None, labels: Mapping[str, str], memo: Any, logger: Any, **_: Any
) -> None:
    """A Deployment or pod of a TritonService changed: reconcile the owner so its status stays true."""
    owner = labels.get(LABEL_SERVICE)
    if not owner or not namespace:
        return
    # kopf never retries event handlers, and this event may be the last one for a while
    # (the pod that turned Ready): retry here so the status does not stay stale.
    await _reconcile_retrying(memo, namespace, owner, logger, after="an owned-object event")

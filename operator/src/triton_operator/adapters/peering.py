"""The kopf peering objects this replica's kopf follows, watched to tell when kopf pauses it.

kopf pauses a replica (closes its watch streams, so no handler runs) while a peer of a higher or
the same priority is alive, but it knows nothing of the tasks the operator runs itself: the
Reconciler's requeue timers and repository pollers. kopf exposes no pause state to an operator,
so this watches the same (Cluster)KopfPeering objects and applies kopf's rule
(core.edges.peering_rules.peering_verdict) to them: the verdict drives the Reconciler's pause gate.

Until every object kopf follows has been seen, the verdict is paused (kopf starts paused too,
until its first look at the peering object), and a missing object keeps it paused (as it does
kopf, which cannot publish its keep-alive there).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any

from lightkube import ALL_NS, AsyncClient
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from triton_operator.core.edges.backoff import Backoff, Random
from triton_operator.core.edges.peering_rules import (
    PeeringVerdict,
    is_pattern,
    match_namespace,
    peering_verdict,
)
from triton_operator.core.rollout.clock import utcnow

logger = logging.getLogger(__name__)

PEERING_GROUP = "kopf.dev"
ClusterPeeringResource: Any = create_global_resource(
    PEERING_GROUP, "v1", "ClusterKopfPeering", "clusterkopfpeerings"
)
PeeringResource: Any = create_namespaced_resource(PEERING_GROUP, "v1", "KopfPeering", "kopfpeerings")

CLUSTER = None
"""The watch of the ClusterKopfPeering (cluster-wide peering)."""
EVERY_NAMESPACE = ALL_NS
"""The watch of KopfPeerings in all namespaces, filtered by the operator's namespace patterns."""

WATCH_SERVER_TIMEOUT = 600
"""Seconds after which the API server ends a watch (lightkube resumes it where it was)."""
IDLE_SECONDS = 300.0
"""A watch that brings nothing for this long is presumed dead and restarted: every live replica,
this one included, renews its keep-alive every lifetime (60 s), so a healthy one never idles."""
RETRY_SECONDS = 5.0
"""The ceiling of the first delay before a failed (or ended) watch is started again; each failure in
a row doubles it (core.edges.backoff, full jitter), up to RETRY_CAP_SECONDS."""
RETRY_CAP_SECONDS = 30.0
RECHECK_SLACK_SECONDS = 0.1

WatchEvent = tuple[str, Mapping[str, Any]]
Watch = Callable[[str | None], AsyncGenerator[WatchEvent, None]]
"""Events (type, object as a dict) of the peering objects in one namespace, all (``ALL_NS``), or
the cluster-scoped ones (None)."""


@dataclasses.dataclass(frozen=True)
class PeeringScope:
    """Which peering objects kopf follows for this replica, and who this replica is in them."""

    name: str
    identity: str
    priority: int
    clusterwide: bool
    namespaces: tuple[str, ...] = ()
    """The operator's --namespace values (names or kopf patterns) when not cluster-wide."""

    def watches(self) -> list[str | None]:
        if self.clusterwide:
            return [CLUSTER]
        if any(is_pattern(ns) for ns in self.namespaces):
            return [EVERY_NAMESPACE]
        return list(dict.fromkeys(self.namespaces))

    def required(self) -> list[tuple[str | None, str]]:
        """The objects that must be seen before the verdict can be anything but paused."""
        if self.clusterwide:
            return [(None, self.name)]
        return [(ns, self.name) for ns in self.namespaces if not is_pattern(ns)]

    def follows(self, namespace: str | None) -> bool:
        if self.clusterwide:
            return namespace is None
        return namespace is not None and any(match_namespace(namespace, p) for p in self.namespaces)

    def describe(self) -> str:
        if self.clusterwide:
            return f"ClusterKopfPeering {self.name}"
        return f"KopfPeering {self.name} in {', '.join(self.namespaces)}"


def peering_scope(peering: Any, *, identity: str | None, namespaces: tuple[str, ...]) -> PeeringScope | None:
    """What kopf's peering follows for this replica, from kopf's settings (``OperatorSettings.peering``,
    filled by ``kopf.run``); None when the replicas do not peer, or when this replica's identity in
    the peering is unknown (kopf made its own: run by `triton-operator run` it never does)."""
    if peering.standalone or not peering.mandatory:
        return None
    if not identity:
        logger.warning("peering identity unknown: the operator's timers and pollers ignore kopf's pause")
        return None
    return PeeringScope(
        name=peering.name,
        identity=identity,
        priority=int(peering.priority),
        clusterwide=bool(peering.clusterwide),
        namespaces=tuple(namespaces),
    )


class PeeringMonitor:
    """Follows the peering objects of a scope and calls ``on_change`` whenever the verdict flips
    (and once at the start, paused until the objects are seen)."""

    def __init__(
        self,
        scope: PeeringScope,
        watch: Watch,
        on_change: Callable[[PeeringVerdict], None],
        *,
        clock: Callable[[], datetime.datetime] = utcnow,
        retry_seconds: float = RETRY_SECONDS,
        idle_seconds: float = IDLE_SECONDS,
        random: Random | None = None,
    ) -> None:
        self.scope = scope
        self.watch = watch
        self.on_change = on_change
        self.clock = clock
        self.backoff = Backoff(base=retry_seconds, cap=max(RETRY_CAP_SECONDS, retry_seconds))
        self.random = random
        self.idle_seconds = idle_seconds
        self.verdict: PeeringVerdict | None = None
        self._statuses: dict[tuple[str | None, str], Mapping[str, Any]] = {}
        self._changed = asyncio.Event()

    def current(self) -> PeeringVerdict:
        missing = [key for key in self.scope.required() if key not in self._statuses]
        if missing or not self._statuses:
            where = ", ".join(f"{ns}/{name}" if ns else name for ns, name in missing) or self.scope.describe()
            return PeeringVerdict(paused=True, reason=f"peering object not seen (yet): {where}")
        return peering_verdict(
            list(self._statuses.values()),
            identity=self.scope.identity,
            priority=self.scope.priority,
            now=self.clock(),
        )

    def record(self, kind: str, body: Mapping[str, Any]) -> None:
        """Take one watch event into account (the next verdict sees it)."""
        metadata: Mapping[str, Any] = body.get("metadata") or {}
        namespace = metadata.get("namespace") or None
        if metadata.get("name") != self.scope.name or not self.scope.follows(namespace):
            return
        key = (namespace, self.scope.name)
        if kind == "DELETED":
            logger.warning("the peering object %s was deleted: this replica pauses", key[1])
            self._statuses.pop(key, None)
        else:
            self._statuses[key] = body.get("status") or {}
        self._changed.set()

    def start(self) -> asyncio.Task[None]:
        return asyncio.create_task(self.run(), name=f"peering monitor of {self.scope.describe()}")

    async def run(self) -> None:
        followers = [
            asyncio.create_task(self._follow(where), name=f"peering watch {where or 'cluster'}")
            for where in self.scope.watches()
        ]
        try:
            while True:
                self._changed.clear()
                verdict = self.current()
                if self.verdict is None or verdict.paused != self.verdict.paused:
                    self.on_change(verdict)
                self.verdict = verdict
                timeout = (
                    None if verdict.recheck_after is None else verdict.recheck_after + RECHECK_SLACK_SECONDS
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._changed.wait()
        finally:
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)

    async def _follow(self, where: str | None) -> None:
        failures = 0
        while True:
            stream = self.watch(where)
            try:
                while True:
                    async with asyncio.timeout(self.idle_seconds):
                        kind, body = await anext(stream)
                    failures = 0
                    self.record(kind, body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: look again (the verdict stands meanwhile)
                failures += 1
                if failures == 1 or failures % 60 == 0:
                    logger.warning(
                        "watching %s failed (%s: %s); retrying with a backoff up to %.0f s",
                        self.scope.describe(),
                        type(exc).__name__,
                        exc,
                        self.backoff.cap,
                    )
            finally:
                with contextlib.suppress(Exception):
                    await stream.aclose()
            await asyncio.sleep(self.backoff.delay(max(failures - 1, 0), random=self.random))


def lightkube_watch(client: AsyncClient, scope: PeeringScope) -> Watch:
    """The peering objects' watch events through lightkube (only the object named by ``scope``)."""

    async def watch(where: str | None) -> AsyncGenerator[WatchEvent, None]:
        fields: dict[str, Any] = {"metadata.name": scope.name}
        if where is CLUSTER:
            events = client.watch(ClusterPeeringResource, fields=fields, server_timeout=WATCH_SERVER_TIMEOUT)
        else:
            events = client.watch(
                PeeringResource, namespace=where, fields=fields, server_timeout=WATCH_SERVER_TIMEOUT
            )
        async for kind, obj in events:
            yield kind, obj.to_dict()

    return watch

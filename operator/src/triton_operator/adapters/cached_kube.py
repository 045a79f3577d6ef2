"""KubeAPI that reads what the operator's watches already hold: TritonServices as kopf last handed them,
owned objects from adapters.owned_watch.OwnedCache; and sends no apply that would store nothing new.

A reconcile pass (reconcile.reconcile_pass) reads the TritonService and lists its Deployments, ConfigMaps and
pods before it decides: over the API server, four requests a pass. Here:

- ``get_tritonservice`` answers from the body kopf's watch last handed over (``remember``), or the
  result of this process's own status write when it is newer; a TritonService not known, or whose
  status write was refused as superseded (``forget``), is read from the API server;
- ``list_owned`` answers from the owned watches' cache once each of them has read its listing (before
  that, from the API server), and so does ``list_kind`` of a cached kind selected by the operator's
  labels and one owner (a pool's per-model Services);
- ``apply`` of an object that carries the operator's applied digest (core.decision.actions.stamped) and is
  stored as built (core.decision.actions.applied_as_built, against the cache) sends nothing: applying it would
  change nothing the operator owns;
- every write's result goes into the cache (a pass right after it sees its own write even before
  the watch event arrives); nothing older than what is kept replaces it.

Stale reads stay safe: the status write is conditional on the TritonService's resourceVersion (a
stale body makes it fail as superseded, and the next pass reads the object afresh), every watch
event of an owned Deployment or pod asks for a pass of its owner (which then sees it), and an
object found as built by a stale cache is one whose change is on its way to the cache, and so to
a pass that applies it again.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from triton_operator.adapters.kube import ConflictError, KubeAPI, Owned
from triton_operator.adapters.owned_watch import CACHED, OwnedCache
from triton_operator.core.decision.actions import applied_as_built
from triton_operator.core.objects.names import APPLIED_ANNOTATION, LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY


def _version(obj: Mapping[str, Any]) -> int | None:
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


class CachedKube:
    """A KubeAPI over another (``kube``) and the operator's watches (``cache``; see the module)."""

    def __init__(self, kube: KubeAPI, cache: OwnedCache) -> None:
        self.kube = kube
        self.cache = cache
        self._bodies: dict[tuple[str, str], tuple[int | None, bytes]] = {}
        self.spared = 0
        """Applies not sent: the object was stored as built."""

    # ------------------------------------------------------------- TritonServices

    def remember(self, body: Mapping[str, Any]) -> None:
        """A TritonService as a watch (kopf's) or a write returned it; kept unless the one kept is newer."""
        metadata = body.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        if not key[0] or not key[1]:
            return
        version = _version(body)
        kept = self._bodies.get(key)
        if kept is not None and kept[0] is not None and version is not None and version < kept[0]:
            return
        slim = {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {k: v for k, v in metadata.items() if k != "managedFields"},
            "spec": body.get("spec"),
            "status": body.get("status"),
        }
        self._bodies[key] = (version, zlib.compress(json.dumps(slim, separators=(",", ":")).encode(), 1))

    def forget(self, namespace: str, name: str) -> None:
        """Read this TritonService from the API server next time (deleted, or its write superseded)."""
        self._bodies.pop((namespace, name), None)

    def forget_all(self) -> None:
        """kopf's watch stops while the operator is paused: read every TritonService afresh after it."""
        self._bodies.clear()

    async def get_tritonservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        kept = self._bodies.get((namespace, name))
        if kept is not None:
            body: dict[str, Any] = json.loads(zlib.decompress(kept[1]))
            return {k: v for k, v in body.items() if v is not None}
        found = await self.kube.get_tritonservice(namespace, name)
        if found is not None:
            self.remember(found)
        return found

    # ------------------------------------------------------------- reads

    async def get_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return await self.kube.get_secret_data(namespace, name)

    async def list_owned(self, namespace: str, labels: Mapping[str, str]) -> Owned:
        owner = labels.get(LABEL_SERVICE)
        if not self.cache.synced or owner is None:
            return await self.kube.list_owned(namespace, labels)

        def kept(kind: str) -> list[dict[str, Any]]:
            return [
                o
                for o in self.cache.owned(namespace, owner, kind)
                if all(((o.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in labels.items())
            ]

        return Owned(deployments=kept("Deployment"), configmaps=kept("ConfigMap"), pods=kept("Pod"))

    async def list_kind(
        self, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """From the cache when ``labels`` select only what it keeps whole (a cached kind, managed by the
        operator, of one TritonService: a pool's per-model Services, listed every pass), once synced;
        else from the API server."""
        labels = labels or {}
        owner = labels.get(LABEL_SERVICE)
        kept = labels.get(LABEL_MANAGED_BY) == MANAGED_BY and kind in CACHED and self.cache.synced
        if owner is None or not kept:
            return await self.kube.list_kind(kind, namespace, labels or None)
        return [
            o
            for o in self.cache.owned(namespace, owner, kind)
            if all(((o.get("metadata") or {}).get("labels") or {}).get(k) == v for k, v in labels.items())
        ]

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.kube.get(kind, namespace, name)

    # ------------------------------------------------------------- writes

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        kind = str(obj.get("kind"))
        metadata = obj.get("metadata") or {}
        stamped = APPLIED_ANNOTATION in (metadata.get("annotations") or {})
        if stamped and kind in CACHED and self.cache.synced:
            stored = self.cache.get(kind, str(metadata.get("namespace") or ""), str(metadata.get("name")))
            if stored is not None and applied_as_built(obj, stored):
                self.spared += 1
                return stored
        result = await self.kube.apply(obj)
        self.cache.put(result, kind=kind)
        return result

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        result = await self.kube.merge_patch(kind, namespace, name, patch)
        if result is not None:
            self.cache.put(result, kind=kind)
        return result

    async def scale(self, namespace: str, name: str, replicas: int) -> bool:
        """A merge patch of spec.replicas (what Kube.scale sends), whose result the cache keeps."""
        patch = {"spec": {"replicas": replicas}}
        return await self.merge_patch("Deployment", namespace, name, patch) is not None

    async def post_event(self, event: Mapping[str, Any]) -> None:
        await self.kube.post_event(event)

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        gone = await self.kube.delete(kind, namespace, name)
        self.cache.drop(kind, namespace, name)
        return gone

    async def apply_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None
    ) -> dict[str, Any] | None:
        try:
            result = await self.kube.apply_status(namespace, name, status, resource_version=resource_version)
        except ConflictError:
            self.forget(namespace, name)  # the next pass reads it afresh
            raise
        if result is None:
            self.forget(namespace, name)
        else:
            self.remember(result)
        return result


_CACHED_KUBE_IS_A_KUBE_API: type[KubeAPI] = CachedKube
"""mypy checks here that CachedKube keeps KubeAPI's contract."""

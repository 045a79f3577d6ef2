"""The Deployments and pods TritonServices own, watched: each event names an owner; with an OwnedCache,
the passes read what they own from these watches instead of listing it.

Without a cache (``OwnedWatch(cache=None)``), an event of an owned object only says which
TritonService to reconcile (its namespace and its ``LABEL_SERVICE`` label) and the pass lists what
it owns: the API server is asked for PartialObjectMetadata (as client-go's metadata informers do),
and nothing is kept per object (kopf's own watch decoded every whole object and queued it per
object until its handler ran).

With an ``OwnedCache`` (the operator's), the Deployments, pods, ConfigMaps and Services carrying the
operator's labels are watched as whole objects and kept in it, each as compact JSON without its
managedFields, compressed (a pass decodes only what its TritonService owns): a pass then reads its
owned objects with no request (adapters.cached_kube). Only Deployments' and pods' events name
their owner; ConfigMaps and Services change only when the operator writes them.

Each watch lists once for a resourceVersion and watches from it, resuming where it was after a
timeout or a dropped connection (bookmarks keep the version fresh). When the version is too old
(410 Gone), or a watch could not start, events may have been missed: the listing is read in pages
and every owner in it is named again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx2

from triton_operator.core.edges.backoff import Backoff, Random, parse_retry_after
from triton_operator.core.edges.peering_rules import is_pattern, match_namespace
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY

logger = logging.getLogger(__name__)

WATCHED = (("apps/v1", "deployments"), ("v1", "pods"))
"""(apiVersion, plural) of what a TritonService owns and the operator watches."""
CACHED = {
    "Deployment": ("apps/v1", "deployments"),
    "Pod": ("v1", "pods"),
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
}
"""Kind -> (apiVersion, plural) of what an OwnedCache keeps whole."""
NAMING = frozenset({"Deployment", "Pod"})
"""The kinds whose events name their owner (a reconcile of it)."""
SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_SERVICE}"
"""Only the operator's objects: the API server filters, not this process."""
ACCEPT_OBJECT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
ACCEPT_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
SERVER_TIMEOUT_SECONDS = 600
"""The API server ends each watch after this long; it is resumed where it was."""
READ_SLACK_SECONDS = 60.0
"""A watch that brought nothing for its server timeout and this long is presumed stuck and restarted."""
RETRY_SECONDS = 5.0
"""The ceiling of the first retry's delay after a failed listing or watch; each failure in a row
doubles it (core.edges.backoff: full jitter, so the operator's streams do not retry together), up to
RETRY_CAP_SECONDS, and a Retry-After of the API server is waited out."""
RETRY_CAP_SECONDS = 60.0
PAGE = 500
"""Objects per page of a listing that names every owner."""

Owner = tuple[str, str]
"""(namespace, name) of a TritonService."""


class GoneError(Exception):
    """The resourceVersion a watch or a listing continued from is too old (410 Gone)."""


def retry_after(exc: BaseException) -> float | None:
    """The seconds an API server's answer asked to wait (its Retry-After header), if it sent one."""
    response = getattr(exc, "response", None) if isinstance(exc, httpx2.HTTPStatusError) else None
    return parse_retry_after(response.headers.get("Retry-After")) if response is not None else None


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    """The API path of a collection, in one namespace or (None) in all."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{base}/{plural}" if namespace is None else f"{base}/namespaces/{namespace}/{plural}"


def owner_of(obj: Mapping[str, Any]) -> Owner | None:
    """The TritonService an owned object's labels name, None when they name none."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    owner = (metadata.get("labels") or {}).get(LABEL_SERVICE)
    if not namespace or not owner:
        return None
    return str(namespace), str(owner)


def scopes(namespaces: Iterable[str], all_namespaces: bool) -> tuple[list[str | None], Callable[[str], bool]]:
    """What to watch for the operator's --namespace values: one watch per plain name, or one over
    every namespace (None) when cluster-wide or when a value is a kopf pattern; and which namespaces
    count (kopf's pattern match)."""
    names = list(dict.fromkeys(namespaces))
    if all_namespaces or not names:
        return [None], lambda _: True
    if any(is_pattern(ns) for ns in names):
        return [None], lambda ns: any(match_namespace(ns, pattern) for pattern in names)
    return list(names), lambda _: True


def _version(obj: Mapping[str, Any]) -> int | None:
    """An object's resourceVersion as a number (etcd's revision), None when it is not one."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else None


CacheKey = tuple[str, str, str]
"""(kind, namespace, name)"""


class OwnedCache:
    """The operator's objects of CACHED kinds, as its watches last saw them (or as its own writes
    returned them, whichever is newer), by owner.

    Each object is kept as compressed compact JSON without managedFields (a Deployment of the
    operator's about 1 KiB, a pod under 1 KiB) and decoded only when a pass of its owner reads it.
    Monotonic per object: a watch event or a write's result older than what is kept (a smaller
    resourceVersion) is ignored, so a pass never sees an object go back in time. ``synced``: each
    kind was listed once (before that, a pass lists what it owns from the API server).
    """

    def __init__(self) -> None:
        self._objects: dict[CacheKey, tuple[int | None, str, bytes]] = {}
        """key -> (resourceVersion, owner, compressed JSON)"""
        self._owners: dict[tuple[str, str], set[CacheKey]] = {}
        self._expected: set[str] = set()
        self._listed: set[str] = set()

    @property
    def synced(self) -> bool:
        """Whether every watch that fills the cache has read its whole listing once."""
        return bool(self._expected) and self._expected <= self._listed

    def expect(self, stream: str) -> None:
        """A watch (its collection's path) fills the cache."""
        self._expected.add(stream)

    def listed(self, stream: str) -> None:
        """That watch read its whole listing, or is watching again from where it was."""
        self._listed.add(stream)

    def lagging(self, stream: str) -> None:
        """That watch failed: until it lists or watches again, passes read from the API server."""
        self._listed.discard(stream)

    def __len__(self) -> int:
        return len(self._objects)

    def size(self) -> int:
        """Bytes held by the kept objects (compressed)."""
        return sum(len(data) for _, _, data in self._objects.values())

    def put(self, obj: Mapping[str, Any], *, kind: str | None = None) -> None:
        """Keep ``obj`` (a watch event's, a listing's or a write's result) unless what is kept is newer."""
        kind = kind or str(obj.get("kind") or "")
        if kind not in CACHED:
            return
        metadata = obj.get("metadata") or {}
        namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
        if not namespace or not name:
            return
        labels = metadata.get("labels") or {}
        owner = str(labels.get(LABEL_SERVICE) or "")
        version = _version(obj)
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or not owner:
            self.drop(kind, namespace, name, version)  # no longer selected: as a watch says DELETED
            return
        key = (kind, namespace, name)
        kept = self._objects.get(key)
        if kept is not None and kept[0] is not None and version is not None and version < kept[0]:
            return
        slim = {**obj, "kind": kind, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
        data = zlib.compress(json.dumps(slim, separators=(",", ":")).encode(), 1)
        self._unindex(key)
        self._objects[key] = (version, owner, data)
        self._owners.setdefault((namespace, owner), set()).add(key)

    def drop(self, kind: str, namespace: str, name: str, version: int | None = None) -> None:
        """Forget an object (deleted); with ``version``, only if what is kept is not newer."""
        key = (kind, namespace, name)
        kept = self._objects.get(key)
        if kept is None or (version is not None and kept[0] is not None and kept[0] > version):
            return
        self._unindex(key)
        del self._objects[key]

    def _unindex(self, key: CacheKey) -> None:
        kept = self._objects.get(key)
        if kept is None:
            return
        keys = self._owners.get((key[1], kept[1]))
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._owners[(key[1], kept[1])]

    def replace(self, kind: str, namespace: str | None, objects: Iterable[Mapping[str, Any]]) -> None:
        """A whole listing of ``kind`` (in ``namespace``, None: all): what it lacks is gone."""
        items = list(objects)
        fresh = {
            (str((o.get("metadata") or {}).get("namespace")), str((o.get("metadata") or {}).get("name")))
            for o in items
        }
        for key in [k for k in self._objects if k[0] == kind and (namespace is None or k[1] == namespace)]:
            if key[1:] not in fresh:
                self.drop(*key)
        for obj in items:
            self.put(obj, kind=kind)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        kept = self._objects.get((kind, namespace, name))
        if kept is None:
            return None
        obj: dict[str, Any] = json.loads(zlib.decompress(kept[2]))
        return obj

    def owned(self, namespace: str, owner: str, kind: str) -> list[dict[str, Any]]:
        """The kept objects of ``kind`` that name ``owner`` (their LABEL_SERVICE), by name."""
        keys = sorted(k for k in self._owners.get((namespace, owner), ()) if k[0] == kind)
        return [obj for obj in (self.get(*k) for k in keys) if obj is not None]


@dataclasses.dataclass
class _Stream:
    path: str
    version: str | None = None
    missed: bool = True
    """Whether events may have been missed since ``version``: the next listing names every owner."""
    kind: str | None = None
    """With a cache: the kind this stream keeps in it (whole objects); None: metadata only."""
    namespace: str | None = None


class OwnedWatch:
    """Metadata-only watches of the owned Deployments and pods; ``on_owner`` gets each event's owner.

    ``on_owner`` must not block: it is called from the watch loop (the Reconciler's ``trigger``).
    """

    def __init__(
        self,
        http: httpx2.AsyncClient,
        on_owner: Callable[[str, str], None],
        *,
        namespaces: Iterable[str] = (),
        all_namespaces: bool = True,
        retry_seconds: float = RETRY_SECONDS,
        retry_cap: float = RETRY_CAP_SECONDS,
        server_timeout: int = SERVER_TIMEOUT_SECONDS,
        page: int = PAGE,
        random: Random | None = None,
        cache: OwnedCache | None = None,
    ) -> None:
        self.http = http
        self.on_owner = on_owner
        self.backoff = Backoff(base=retry_seconds, cap=max(retry_cap, retry_seconds))
        self.random = random
        self.server_timeout = server_timeout
        self.page = page
        where, self._counts = scopes(namespaces, all_namespaces)
        self.cache = cache
        if cache is None:
            self._streams = [
                _Stream(collection_path(api_version, plural, ns))
                for api_version, plural in WATCHED
                for ns in where
            ]
        else:
            self._streams = [
                _Stream(collection_path(api_version, plural, ns), kind=kind, namespace=ns)
                for kind, (api_version, plural) in CACHED.items()
                for ns in where
            ]
            for stream in self._streams:
                cache.expect(stream.path)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Take each collection's current version (so nothing after it goes unseen), then watch on
        tasks of their own. A listing that fails here is tried again by its task, naming every owner."""
        for stream in self._streams:
            try:
                stream.version = await self._list(stream.path, name_owners=False, stream=stream)
                stream.missed = False
            except Exception as exc:  # the API server may not answer yet: its task retries
                logger.warning("listing %s failed, retrying in the background: %s", stream.path, exc)
        self._tasks = [
            asyncio.create_task(self._run(stream), name=f"watch {stream.path}") for stream in self._streams
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _name(self, obj: Mapping[str, Any]) -> None:
        owner = owner_of(obj)
        if owner is not None and self._counts(owner[0]):
            self.on_owner(*owner)

    async def _run(self, stream: _Stream) -> None:
        failures = 0
        while True:
            try:
                if stream.version is None or stream.missed:
                    stream.version = await self._list(stream.path, name_owners=stream.missed, stream=stream)
                    stream.missed = False
                stream.version = await self._watch(stream.path, stream.version, stream=stream)
                failures = 0
            except asyncio.CancelledError:
                raise
            except GoneError:
                logger.info("watch of %s: resourceVersion too old, listing again", stream.path)
                stream.version, stream.missed = None, True
                if self.cache is not None:
                    self.cache.lagging(stream.path)
            except Exception as exc:
                if self.cache is not None:
                    self.cache.lagging(stream.path)
                delay = self.backoff.delay(failures, retry_after=retry_after(exc), random=self.random)
                failures += 1
                logger.warning("watch of %s failed, resuming in %.1f s: %s", stream.path, delay, exc)
                await asyncio.sleep(delay)

    async def _list(self, path: str, *, name_owners: bool, stream: _Stream | None = None) -> str:
        """The collection's resourceVersion; with ``name_owners``, every owner in it is named (read
        in pages, one at a time), else one object is read and nothing named. A stream that fills
        the cache reads every page (whole objects) and replaces what the cache kept of it."""
        kind = stream.kind if stream is not None and self.cache is not None else None
        whole = kind is not None
        name_owners = name_owners and (kind is None or kind in NAMING)
        params = {"labelSelector": SELECTOR, "limit": str(self.page if name_owners or whole else 1)}
        accept = "application/json" if whole else ACCEPT_LIST
        owners: set[Owner] = set()
        items: list[dict[str, Any]] = []
        while True:
            response = await self.http.get(path, params=params, headers={"Accept": accept})
            if response.status_code == 410:
                raise GoneError(path)
            response.raise_for_status()
            body = response.json()
            metadata = body.get("metadata") or {}
            if name_owners:
                for item in body.get("items") or ():
                    owner = owner_of(item)
                    if owner is not None and self._counts(owner[0]):
                        owners.add(owner)
            if whole:
                items += [i for i in body.get("items") or () if self._counted(i)]
            token = metadata.get("continue")
            if not (name_owners or whole) or not token:
                break
            params["continue"] = token
        if kind is not None and stream is not None and self.cache is not None:
            self.cache.replace(kind, stream.namespace, items)
            self.cache.listed(stream.path)
        for owner in sorted(owners):
            self.on_owner(*owner)
        return str(metadata.get("resourceVersion") or "")

    async def _watch(self, path: str, version: str, *, stream: _Stream | None = None) -> str:
        """Watch from ``version`` until the server ends the watch; the last version seen. A stream
        that fills the cache gets whole objects and keeps them."""
        whole = stream is not None and stream.kind is not None and self.cache is not None
        params = {
            "labelSelector": SELECTOR,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(self.server_timeout),
        }
        timeout = httpx2.Timeout(30.0, read=self.server_timeout + READ_SLACK_SECONDS)
        accept = "application/json" if whole else ACCEPT_OBJECT
        async with self.http.stream(
            "GET", path, params=params, headers={"Accept": accept}, timeout=timeout
        ) as response:
            if response.status_code == 410:
                raise GoneError(path)
            response.raise_for_status()
            if whole and stream is not None and self.cache is not None:
                self.cache.listed(stream.path)  # resumed where it was: nothing missed
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise GoneError(path)
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                seen = (obj.get("metadata") or {}).get("resourceVersion")
                if seen:
                    version = str(seen)
                if kind not in ("ADDED", "MODIFIED", "DELETED"):
                    continue
                if stream is not None and stream.kind is not None and self.cache is not None:
                    self._keep(stream.kind, kind, obj)
                    if stream.kind not in NAMING:
                        continue
                self._name(obj)
        return version

    def _counted(self, obj: Mapping[str, Any]) -> bool:
        owner = owner_of(obj)
        return owner is not None and self._counts(owner[0])

    def _keep(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """A watch event into the cache (objects of namespaces that do not count are not kept)."""
        assert self.cache is not None
        owner = owner_of(obj)
        if owner is None or not self._counts(owner[0]):
            return
        if event == "DELETED":
            metadata = obj.get("metadata") or {}
            self.cache.drop(kind, owner[0], str(metadata.get("name") or ""), _version(obj))
        else:
            self.cache.put(obj, kind=kind)

"""The Deployments and pods TritonServices own, watched as metadata only: each event names an owner.

A pass lists what a TritonService owns afresh (reconcile.observe), so an event of an owned object
only has to say which TritonService to reconcile: its namespace and its ``LABEL_SERVICE`` label.
The API server is asked for PartialObjectMetadata (as client-go's metadata informers do): no spec,
no status, and nothing is kept per object here, neither between events nor while a reconcile runs
(kopf's own watch decoded every whole object and queued it per object until its handler ran).

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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx2

from triton_operator.core.backoff import Backoff, Random, parse_retry_after
from triton_operator.core.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY
from triton_operator.core.peering import is_pattern, match_namespace

logger = logging.getLogger(__name__)

WATCHED = (("apps/v1", "deployments"), ("v1", "pods"))
"""(apiVersion, plural) of what a TritonService owns and the operator watches."""
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
doubles it (core.backoff: full jitter, so the operator's streams do not retry together), up to
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


@dataclasses.dataclass
class _Stream:
    path: str
    version: str | None = None
    missed: bool = True
    """Whether events may have been missed since ``version``: the next listing names every owner."""


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
    ) -> None:
        self.http = http
        self.on_owner = on_owner
        self.backoff = Backoff(base=retry_seconds, cap=max(retry_cap, retry_seconds))
        self.random = random
        self.server_timeout = server_timeout
        self.page = page
        where, self._counts = scopes(namespaces, all_namespaces)
        self._streams = [
            _Stream(collection_path(api_version, plural, ns))
            for api_version, plural in WATCHED
            for ns in where
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Take each collection's current version (so nothing after it goes unseen), then watch on
        tasks of their own. A listing that fails here is tried again by its task, naming every owner."""
        for stream in self._streams:
            try:
                stream.version = await self._list(stream.path, name_owners=False)
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
                    stream.version = await self._list(stream.path, name_owners=stream.missed)
                    stream.missed = False
                stream.version = await self._watch(stream.path, stream.version)
                failures = 0
            except asyncio.CancelledError:
                raise
            except GoneError:
                logger.info("watch of %s: resourceVersion too old, listing again", stream.path)
                stream.version, stream.missed = None, True
            except Exception as exc:
                delay = self.backoff.delay(failures, retry_after=retry_after(exc), random=self.random)
                failures += 1
                logger.warning("watch of %s failed, resuming in %.1f s: %s", stream.path, delay, exc)
                await asyncio.sleep(delay)

    async def _list(self, path: str, *, name_owners: bool) -> str:
        """The collection's resourceVersion; with ``name_owners``, every owner in it is named (read
        in pages, one at a time), else one object is read and nothing named."""
        params = {"labelSelector": SELECTOR, "limit": str(self.page if name_owners else 1)}
        owners: set[Owner] = set()
        while True:
            response = await self.http.get(path, params=params, headers={"Accept": ACCEPT_LIST})
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
            token = metadata.get("continue")
            if not name_owners or not token:
                break
            params["continue"] = token
        for owner in sorted(owners):
            self.on_owner(*owner)
        return str(metadata.get("resourceVersion") or "")

    async def _watch(self, path: str, version: str) -> str:
        """Watch from ``version`` until the server ends the watch; the last version seen."""
        params = {
            "labelSelector": SELECTOR,
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(self.server_timeout),
        }
        timeout = httpx2.Timeout(30.0, read=self.server_timeout + READ_SLACK_SECONDS)
        async with self.http.stream(
            "GET", path, params=params, headers={"Accept": ACCEPT_OBJECT}, timeout=timeout
        ) as response:
            if response.status_code == 410:
                raise GoneError(path)
            response.raise_for_status()
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
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._name(obj)
        return version

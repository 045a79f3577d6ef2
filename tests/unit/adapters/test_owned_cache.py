"""adapters.owned_watch with an OwnedCache, over a scripted API server: the listings fill the cache
(whole objects, read page by page), watch events keep it current, only Deployments' and pods'
events name their owner, and a failing watch makes the cache count as not synced until it
watches again (passes then list from the API server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest

from triton_operator.adapters.owned_watch import CACHED, OwnedCache, OwnedWatch, collection_path
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY

NS = "ml"


def obj(kind: str, name: str, version: int, owner: str = "svc", **extra: Any) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: owner}
    metadata = {
        "name": name,
        "namespace": NS,
        "resourceVersion": str(version),
        "labels": labels,
        "managedFields": [{"manager": "x"}],
    }
    return {"kind": kind, "metadata": metadata, **extra}


class Api:
    """Listings per path (in pages of one: the continue token is followed), then scripted watch lines."""

    def __init__(self, listings: dict[str, list[dict[str, Any]]]) -> None:
        self.listings = listings
        self.watch_lines: dict[str, list[dict[str, Any]]] = {}
        self.watch_status = 200
        self.accepts: list[str] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.accepts.append(request.headers.get("Accept", ""))
        path = request.url.path
        if request.url.params.get("watch") == "true":
            if self.watch_status != 200:
                return httpx2.Response(self.watch_status, json={"kind": "Status"})
            lines = "".join(json.dumps(e) + "\n" for e in self.watch_lines.get(path, []))
            return httpx2.Response(200, content=lines.encode())
        items = self.listings.get(path, [])
        start = int(request.url.params.get("continue") or 0)
        page = items[start : start + 1]
        metadata: dict[str, Any] = {"resourceVersion": "10"}
        if start + 1 < len(items):
            metadata["continue"] = str(start + 1)
        return httpx2.Response(200, json={"items": page, "metadata": metadata})


def path(kind: str) -> str:
    return collection_path(*CACHED[kind], NS)


async def test_listings_fill_the_cache_and_watch_events_keep_it_current() -> None:
    api = Api(
        {
            path("Deployment"): [
                obj("Deployment", "svc-a", 3),
                obj("Deployment", "other-a", 4, owner="other"),
            ],
            path("ConfigMap"): [obj("ConfigMap", "svc-a", 2, data={"k": "v"})],
        }
    )
    named: list[tuple[str, str]] = []
    cache = OwnedCache()
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(api), base_url="https://api")
    watch = OwnedWatch(
        http,
        lambda ns, name: named.append((ns, name)),
        namespaces=[NS],
        all_namespaces=False,
        page=1,
        cache=cache,
    )
    assert not cache.synced
    for stream in watch._streams:  # what start() does, without the watch tasks
        stream.version = await watch._list(stream.path, name_owners=False, stream=stream)
    assert cache.synced
    assert named == []  # the first listing names nobody
    assert all(a == "application/json" for a in api.accepts)  # whole objects, not metadata
    assert [d["metadata"]["name"] for d in cache.owned(NS, "svc", "Deployment")] == ["svc-a"]
    kept = cache.get("ConfigMap", NS, "svc-a")
    assert kept is not None and kept["data"] == {"k": "v"} and "managedFields" not in kept["metadata"]

    pods = next(s for s in watch._streams if s.kind == "Pod")
    configmaps = next(s for s in watch._streams if s.kind == "ConfigMap")
    api.watch_lines = {
        pods.path: [
            {"type": "ADDED", "object": obj("Pod", "svc-a-1", 11, status={"phase": "Pending"})},
            {"type": "MODIFIED", "object": obj("Pod", "svc-a-1", 12, status={"phase": "Running"})},
            {"type": "ADDED", "object": obj("Pod", "svc-a-2", 13)},
            {"type": "DELETED", "object": obj("Pod", "svc-a-2", 14)},
        ],
        configmaps.path: [{"type": "MODIFIED", "object": obj("ConfigMap", "svc-a", 15, data={"k": "w"})}],
    }
    assert await watch._watch(pods.path, "10", stream=pods) == "14"
    assert named == [(NS, "svc")] * 4
    assert [p["status"]["phase"] for p in cache.owned(NS, "svc", "Pod")] == ["Running"]
    await watch._watch(configmaps.path, "10", stream=configmaps)
    assert named == [(NS, "svc")] * 4  # a ConfigMap's event names nobody: the operator wrote it
    kept = cache.get("ConfigMap", NS, "svc-a")
    assert kept is not None and kept["data"] == {"k": "w"}

    # A listing after missed events: what it lacks is gone.
    api.listings[path("Deployment")] = [obj("Deployment", "other-a", 20, owner="other")]
    deployments = next(s for s in watch._streams if s.kind == "Deployment")
    await watch._list(deployments.path, name_owners=True, stream=deployments)
    assert cache.owned(NS, "svc", "Deployment") == []
    assert (NS, "other") in named
    await http.aclose()


async def test_a_failing_watch_makes_passes_read_from_the_api_server_until_it_watches_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = Api({})
    cache = OwnedCache()
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(api), base_url="https://api")
    watch = OwnedWatch(http, lambda ns, name: None, namespaces=[NS], all_namespaces=False, cache=cache)
    for stream in watch._streams:
        stream.version = await watch._list(stream.path, name_owners=False, stream=stream)
        stream.missed = False
    assert cache.synced
    pods = next(s for s in watch._streams if s.kind == "Pod")
    api.watch_status = 500
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        assert not cache.synced  # while it waits to retry
        api.watch_status = 200
        api.watch_lines = {pods.path: [{"type": "ADDED", "object": obj("Pod", "p", 30)}]}

    monkeypatch.setattr("triton_operator.adapters.owned_watch.asyncio.sleep", sleep)

    calls = 0
    original = watch._watch

    async def watch_twice(p: str, version: str, *, stream: Any = None) -> str:
        nonlocal calls
        calls += 1
        if calls > 2:
            raise asyncio.CancelledError  # ends the loop (a stop of the operator)
        return await original(p, version, stream=stream)

    monkeypatch.setattr(watch, "_watch", watch_twice)

    with pytest.raises(asyncio.CancelledError):
        await watch._run(pods)
    assert sleeps and cache.synced
    assert cache.get("Pod", NS, "p") is not None
    await http.aclose()

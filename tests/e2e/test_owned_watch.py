"""adapters.owned_watch against a real API server: metadata-only events name the owning TritonService,
objects without the operator's labels are never named, a listing names every owner, page by page, and
with an OwnedCache the watches keep the owned objects whole and current."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from triton_operator.adapters.kube import Kube, make_client
from triton_operator.adapters.owned_watch import WATCHED, OwnedCache, OwnedWatch, collection_path
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def pod(namespace: str, labels: dict[str, str]) -> Any:
    """A pod no node runs (its node name names none): only its object and its events matter here."""
    return Pod.from_dict(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "namespace": namespace, "labels": labels},
            "spec": {
                "nodeName": "no-such-node",
                "containers": [{"name": "c", "image": "registry.invalid/none:1"}],
            },
        }
    )


def owned_by(service: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: service}


async def until(check: Any, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.05)


async def test_events_of_owned_pods_name_their_owner_and_nothing_else_is_named(
    kube: Client, namespace: str, cluster: Path
) -> None:
    named: list[tuple[str, str]] = []
    client = Kube(make_client(cluster))
    watch = OwnedWatch(
        client.http(), lambda ns, name: named.append((ns, name)), namespaces=[namespace], all_namespaces=False
    )
    await watch.start()
    try:
        assert named == []  # the first listing only takes the version to watch from
        kube.create(pod(namespace, {LABEL_MANAGED_BY: MANAGED_BY}))  # no owner label: not selected
        kube.create(pod(namespace, {LABEL_SERVICE: "foreign"}))  # not the operator's: not selected
        owned = kube.create(pod(namespace, owned_by("svc")))
        await until(lambda: (namespace, "svc") in named)
        seen = len(named)
        # A change of the pod (a new label, as a status change would be) is an event too.
        kube.patch(Pod, owned.metadata.name, {"metadata": {"labels": {"x": "y"}}}, namespace=namespace)
        await until(lambda: len(named) > seen)
        kube.delete(Pod, owned.metadata.name, namespace=namespace, grace_period=0)
        await until(lambda: named.count((namespace, "svc")) >= 3)
        await asyncio.sleep(0.5)
        assert set(named) == {(namespace, "svc")}
    finally:
        await watch.close()
        await client.close()


async def test_a_listing_after_missed_events_names_every_owner_once_reading_page_by_page(
    kube: Client, namespace: str, cluster: Path
) -> None:
    for service in ("a", "b", "b", "c"):
        kube.create(pod(namespace, owned_by(service)))
    kube.create(pod(namespace, {"app": "other"}))
    named: list[tuple[str, str]] = []
    client = Kube(make_client(cluster))
    # Pages of one object: the continue token is followed to the end.
    watch = OwnedWatch(
        client.http(),
        lambda ns, name: named.append((ns, name)),
        namespaces=[namespace],
        all_namespaces=False,
        page=1,
    )
    try:
        pods = collection_path(*WATCHED[1], namespace)
        version = await watch._list(pods, name_owners=True)
        assert version.isdigit()
        assert named == [(namespace, "a"), (namespace, "b"), (namespace, "c")]
    finally:
        await client.close()


async def test_the_cache_holds_the_owned_objects_as_stored_and_follows_their_changes(
    kube: Client, namespace: str, cluster: Path
) -> None:
    """With an OwnedCache: the listing at start fills it with whole objects (without managedFields),
    and the watches' events change and remove them; objects without the operator's labels are
    not kept. A pass reading it (adapters.cached_kube) gets what a listing would."""
    before = kube.create(pod(namespace, owned_by("svc")))
    kube.create(pod(namespace, {"app": "other"}))
    named: list[tuple[str, str]] = []
    cache = OwnedCache()
    client = Kube(make_client(cluster))
    watch = OwnedWatch(
        client.http(),
        lambda ns, name: named.append((ns, name)),
        namespaces=[namespace],
        all_namespaces=False,
        cache=cache,
    )
    await watch.start()
    try:
        assert cache.synced
        kept = cache.owned(namespace, "svc", "Pod")
        assert [p["metadata"]["name"] for p in kept] == [before.metadata.name]
        assert kept[0]["spec"]["nodeName"] == "no-such-node" and "managedFields" not in kept[0]["metadata"]
        assert len(cache) == 1
        name = before.metadata.name
        kube.patch(Pod, name, {"metadata": {"labels": {"x": "y"}}}, namespace=namespace)
        await until(
            lambda: (
                (cache.get("Pod", namespace, name) or {}).get("metadata", {}).get("labels", {}).get("x")
                == "y"
            )
        )
        kube.delete(Pod, name, namespace=namespace, grace_period=0)
        await until(lambda: cache.get("Pod", namespace, name) is None)
        assert set(named) == {(namespace, "svc")}
    finally:
        await watch.close()
        await client.close()

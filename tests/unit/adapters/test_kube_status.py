"""adapters.kube.Kube's status write over fakeapi.FakeClient: it carries the resourceVersion the
status was decided from, so the API server refuses it (409) once the TritonService changed."""

from __future__ import annotations

from typing import Any

import pytest

from fakeapi import FakeClient
from triton_operator import KIND
from triton_operator.adapters.kube import ConflictError, Kube

NS = "ml"


def stored(version: str) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": KIND,
        "metadata": {"name": "s", "namespace": NS, "resourceVersion": version},
        "spec": {},
        "status": {"observedGeneration": 1},
    }


async def test_a_status_write_carries_the_version_read_and_a_409_is_a_conflict() -> None:
    api = FakeClient()
    api.put(stored("5"))
    kube = Kube(api)  # type: ignore[arg-type]
    written = await kube.apply_status(NS, "s", {"observedGeneration": 2}, resource_version="5")
    assert written is not None and written["metadata"]["resourceVersion"] == "6"
    # a pass that read version 5 too, and decided an older status: refused, nothing written
    with pytest.raises(ConflictError):
        await kube.apply_status(NS, "s", {"observedGeneration": 1}, resource_version="5")
    found = api.find(KIND, NS, "s")
    assert found is not None and found["status"] == {"observedGeneration": 2}
    assert api.writes == [("status", KIND, "s")]
    assert await kube.apply_status(NS, "gone", {}, resource_version="5") is None  # 404: None

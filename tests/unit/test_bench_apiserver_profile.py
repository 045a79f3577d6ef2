"""bench/control_plane/apiserver_profile.py's table from stacks (the symbolized perf samples it reads
from a real API server are not needed here): each sample counted once under its request kind, the
resource named where its registry is on the stack, places counted wherever they appear."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from testkit import bench_module

HANDLERS = "k8s.io/apiserver/pkg/endpoints/handlers"


@pytest.fixture(scope="module")
def profile() -> Iterator[ModuleType]:
    with bench_module("bench/control_plane/apiserver_profile.py", "apiserver_profile") as module:
        yield module


def test_each_sample_counts_once_under_its_request_and_places_wherever_they_are(profile: ModuleType) -> None:
    service_create = [
        "k8s.io/kubernetes/pkg/registry/core/service/ipallocator.(*Allocator).Used",
        "k8s.io/kubernetes/pkg/registry/core/service/storage.(*REST).beginCreate",
        "k8s.io/apiserver/pkg/storage/etcd3.(*store).GuaranteedUpdate",
        f"{HANDLERS}.(*patcher).patchResource.func2",
    ]
    listing = [
        "k8s.io/apiserver/pkg/storage.(*SelectionPredicate).MatchesObjectAttributes",
        f"{HANDLERS}.handleList",
        "k8s.io/apiserver/pkg/server/filters.(*timeoutHandler).ServeHTTP.func1",  # lists run under it too
    ]
    filters_only = ["k8s.io/apiserver/pkg/server/filters.(*timeoutHandler).ServeHTTP.func1"]
    gc = ["runtime.scanSpan", "runtime.gcBgMarkWorker"]
    samples = [service_create, service_create, listing, filters_only, gc, ["[kernel]"]]
    rows = dict(profile.table(samples))
    assert rows["apply or patch (PATCH): service"] == pytest.approx(2 / 6)
    assert rows["list"] == pytest.approx(1 / 6)  # not also under the filters it ran in
    assert rows[
        "request filters before a handler (authentication, authorization, fairness)"
    ] == pytest.approx(1 / 6)
    assert rows["garbage collector"] == pytest.approx(1 / 6)
    assert rows["other"] == pytest.approx(1 / 6)
    kinds = [share for name, share in rows.items() if not name.startswith("within")]
    assert sum(kinds) == pytest.approx(1.0)
    assert rows["within the above: ClusterIP allocation (Service create)"] == pytest.approx(2 / 6)
    assert rows["within the above: label selectors matched by lists"] == pytest.approx(1 / 6)
    assert rows["within the above: writing to etcd"] == pytest.approx(2 / 6)

"""The API requests of a TritonService's passes when the operator reads what its watches hold
(adapters.cached_kube.CachedKube over MemKube, which logs every request it gets): a new
TritonService until Ready, a pass that changes nothing, a restart; and what a stale view may not do.

The watches are played here: ``watched`` loads what MemKube stores into the cache as the owned
watches' events would, and ``kopf_event`` hands the TritonService over as kopf's watch does.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from e2e_helpers import tritonservice
from memkube import Call, MemKube, run_kubelet
from pod_bodies import started_pod
from triton_operator.adapters.cached_kube import CachedKube
from triton_operator.adapters.owned_watch import CACHED, OwnedCache
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_SERVICE, MANAGED_BY
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile.apply import SupersededError
from triton_operator.reconcile.observe import Absences
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

NS = "ml"
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def watched(kube: MemKube, cache: OwnedCache) -> None:
    """The owned watches caught up with what the API server stores (a listing of each kind)."""
    for kind in CACHED:
        cache.expect(kind)
        cache.replace(kind, None, kube.of_kind(kind))
        cache.listed(kind)


def kopf_event(kube: MemKube, cached: CachedKube, name: str = "svc") -> None:
    stored = kube.find("TritonService", NS, name)
    assert stored is not None
    cached.remember(stored)


def sent(calls: list[Call]) -> list[tuple[str, str]]:
    return [(c.method, c.kind) for c in calls]


async def one_pass(kube: MemKube, cached: CachedKube, absences: Absences) -> list[Call]:
    mark = len(kube.calls)
    await reconcile(cached, NS, "svc", Settings(), clock=lambda: NOW, absences=absences)
    return kube.calls[mark:]


def setup(replicas: int = 1) -> tuple[MemKube, CachedKube, Absences]:
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=replicas))
    cached = CachedKube(kube, OwnedCache())
    watched(kube, cached.cache)  # the operator started: its watches listed (nothing yet)
    kopf_event(kube, cached)  # kopf hands the new TritonService over
    return kube, cached, Absences()


async def test_a_new_tritonservice_takes_six_requests_until_ready_and_an_unchanged_pass_none() -> None:
    """Created: ConfigMap, Deployment, Service, status (4; the first revision replaces nothing, so no
    Event: on main RevisionDeployed made it 5); its pod Ready and counted by its Deployment: the status
    and RevisionServed (2). Read from the API server: nothing. A pass that changes nothing sends
    nothing (over the API server directly: get, 3 lists and a Service apply; tests/unit/reconcile/
    test_requests_per_pass.py)."""
    kube, cached, absences = setup()
    first = await one_pass(kube, cached, absences)
    assert sent(first) == [
        ("apply", "ConfigMap"),
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply_status", "TritonService"),
    ]
    # The watch events of what the pass wrote, and of the Deployment's pod turning Ready.
    (deployment,) = kube.of_kind("Deployment")
    revision = deployment["metadata"]["labels"]["triton-operator.io/revision"]
    kube.put(started_pod(revision, "a", ready=9))
    deployment_counts(kube, replicas=1, ready=1)
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    ready = await one_pass(kube, cached, absences)
    assert sent(ready) == [("apply_status", "TritonService"), ("post_event", "Event")]
    stored = kube.find("TritonService", NS, "svc")
    assert stored is not None
    assert cond.find_condition(stored["status"]["conditions"], cond.READY)["status"] == cond.TRUE  # type: ignore[index]
    assert [e["reason"] for e in kube.events] == [cond.REVISION_SERVED]
    assert revision in kube.events[0]["message"]  # it names the revision
    assert len(first) + len(ready) == 6
    kopf_event(kube, cached)
    for _ in range(3):
        assert sent(await one_pass(kube, cached, absences)) == []
    assert cached.spared >= 3  # the Service, found as built


def deployment_counts(kube: MemKube, replicas: int, ready: int) -> None:
    """The Deployment controller's status of the one Deployment: ``ready`` of ``replicas`` pods."""
    (deployment,) = kube.of_kind("Deployment")
    status = {"observedGeneration": deployment["metadata"]["generation"], "replicas": replicas}
    kube.edit(
        "Deployment",
        NS,
        deployment["metadata"]["name"],
        lambda d: d.update(status=status | {"readyReplicas": ready}),
    )


async def test_a_pod_ready_before_its_deployment_counts_it_is_one_status_write_with_ready() -> None:
    """Created, then its pod starting (status.replicas 1: a write), then Ready: the pod's Ready event
    comes a moment before its Deployment's readyReplicas, and the pass that sees the pod Ready first
    writes nothing (on main it wrote status.timeToServe alone, Ready still False),
    the next writes timeToServe and Ready True together and posts RevisionServed: one status write for
    the pod turning Ready, where there were two."""
    kube, cached, absences = setup()
    first = await one_pass(kube, cached, absences)
    assert ("apply_status", "TritonService") in sent(first)
    (deployment,) = kube.of_kind("Deployment")
    revision = deployment["metadata"]["labels"]["triton-operator.io/revision"]
    kube.put(started_pod(revision, "a", ready=None))  # its pod, starting
    deployment_counts(kube, replicas=1, ready=0)
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    assert sent(await one_pass(kube, cached, absences)) == [("apply_status", "TritonService")]
    kube.put(started_pod(revision, "a", ready=9))
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    pod_ready = await one_pass(kube, cached, absences)
    assert sent(pod_ready) == []
    deployment_counts(kube, replicas=1, ready=1)
    watched(kube, cached.cache)
    counted = await one_pass(kube, cached, absences)
    assert sent(counted) == [("apply_status", "TritonService"), ("post_event", "Event")]
    stored = kube.find("TritonService", NS, "svc")
    assert stored is not None
    assert cond.find_condition(stored["status"]["conditions"], cond.READY)["status"] == cond.TRUE  # type: ignore[index]
    (entry,) = stored["status"]["timeToServe"]
    assert (entry["revision"], entry["seconds"]) == (revision, 9)
    (event,) = [e for e in kube.events if e["reason"] == cond.REVISION_SERVED]
    assert event["message"].startswith(f"revision {revision} served in 9 s: ")


async def test_a_new_pod_before_its_deployment_counts_it_is_one_status_write() -> None:
    """The new pod's event comes a moment before its Deployment's status.replicas: the pass that sees
    the pod first writes nothing (on main it wrote PodsScheduled "1 pod(s) scheduled" while
    status.replicas still said 0), the next writes both together."""
    kube, cached, absences = setup()
    await one_pass(kube, cached, absences)
    (deployment,) = kube.of_kind("Deployment")
    revision = deployment["metadata"]["labels"]["triton-operator.io/revision"]
    kube.put(started_pod(revision, "a", ready=None))
    deployment_counts(kube, replicas=0, ready=0)
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    assert sent(await one_pass(kube, cached, absences)) == []
    deployment_counts(kube, replicas=1, ready=0)
    watched(kube, cached.cache)
    assert sent(await one_pass(kube, cached, absences)) == [("apply_status", "TritonService")]
    stored = kube.find("TritonService", NS, "svc")
    assert stored is not None and stored["status"]["replicas"] == 1
    scheduled = cond.find_condition(stored["status"]["conditions"], cond.PODS_SCHEDULED)
    assert scheduled is not None
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        cond.TRUE,
        cond.SCHEDULED,
        "1 pod(s) scheduled",
    )


async def test_after_a_restart_a_pass_that_changes_nothing_sends_one_request_then_none() -> None:
    """A new process: its watches list what exists and kopf lists the TritonServices; each pass
    finds everything as built and the status as decided. The first looks up once whether a
    PodDisruptionBudget it no longer wants is left (reconcile.observe.Absences), the next nothing."""
    kube, cached, absences = setup()
    await one_pass(kube, cached, absences)
    run_kubelet(kube, NS)
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    await one_pass(kube, cached, absences)
    restarted = CachedKube(kube, OwnedCache())
    watched(kube, restarted.cache)
    kopf_event(kube, restarted)
    absences = Absences()
    assert sent(await one_pass(kube, restarted, absences)) == [("get", "PodDisruptionBudget")]
    assert sent(await one_pass(kube, restarted, absences)) == []


async def test_a_service_edited_by_hand_is_applied_again() -> None:
    kube, cached, absences = setup()
    await one_pass(kube, cached, absences)
    run_kubelet(kube, NS)
    kube.edit("Service", NS, "svc", lambda svc: svc["spec"].update(selector={"app": "other"}))
    watched(kube, cached.cache)
    kopf_event(kube, cached)
    again = await one_pass(kube, cached, absences)
    assert ("apply", "Service") in sent(again)
    stored = kube.find("Service", NS, "svc")
    assert stored is not None and stored["spec"]["selector"] != {"app": "other"}


async def test_a_stale_tritonservice_writes_no_status_and_the_next_pass_reads_it_afresh() -> None:
    """kopf's last body is older than the object (a change on its way): the status write, conditional
    on the version read, is refused; the next pass reads the TritonService from the API server."""
    kube, cached, absences = setup()
    await one_pass(kube, cached, absences)
    run_kubelet(kube, NS)
    watched(kube, cached.cache)
    kube.edit("TritonService", NS, "svc", lambda ts: ts["metadata"].setdefault("labels", {}).update(x="y"))
    with pytest.raises(SupersededError):
        await one_pass(kube, cached, absences)
    assert ("get_tritonservice", "TritonService") in sent(await one_pass(kube, cached, absences))


async def test_before_the_watches_listed_a_pass_lists_from_the_api_server() -> None:
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=1))
    cached = CachedKube(kube, OwnedCache())
    cached.cache.expect("Deployment")  # its watch has not listed yet
    kopf_event(kube, cached)
    first = await one_pass(kube, cached, Absences())
    assert ("list_owned", "") in sent(first)


def test_the_cache_never_goes_back_in_time_and_forgets_what_is_no_longer_selected() -> None:
    cache = OwnedCache()
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_SERVICE: "svc"}
    metadata: dict[str, Any] = {"name": "p", "namespace": NS, "resourceVersion": "7", "labels": labels}
    newer: dict[str, Any] = {"kind": "Pod", "metadata": metadata}
    cache.put(newer)
    cache.put({**newer, "metadata": {**metadata, "resourceVersion": "5"}, "spec": {"old": True}})  # late
    kept = cache.get("Pod", NS, "p")
    assert kept is not None and "spec" not in kept
    assert [p["metadata"]["name"] for p in cache.owned(NS, "svc", "Pod")] == ["p"]
    cache.put({**newer, "metadata": {**metadata, "resourceVersion": "8", "labels": {}}})
    assert cache.get("Pod", NS, "p") is None and cache.owned(NS, "svc", "Pod") == []

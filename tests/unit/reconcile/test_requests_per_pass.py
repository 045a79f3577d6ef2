"""How many API requests a reconcile pass sends (reconcile.reconcile_pass over MemKube, a fake of KubeAPI that
logs every call): a new TritonService's passes until Ready, then a pass with nothing to do.

The API server's CPU is what bounds 5,000 TritonServices created at once (docs/benchmarks.md): a
Deployment found stored as built is not applied again (core.decision.actions.applied_as_built), and a
PodDisruptionBudget known absent (reconcile.observe.Absences), or that cannot exist yet
(core.observed.observation.nothing_applied_yet), is not looked up.
"""

from __future__ import annotations

import datetime

import pytest

from e2e_helpers import tritonservice
from memkube import Call, MemKube, run_kubelet
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile.observe import Absences
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

NS = "ml"
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
LISTS_PER_LIST_OWNED = 3
"""The real adapter lists Deployments, ConfigMaps and pods: three requests for one call here."""


def requests(calls: list[Call]) -> int:
    return sum(LISTS_PER_LIST_OWNED if c.method == "list_owned" else 1 for c in calls)


def sent(calls: list[Call]) -> list[tuple[str, str]]:
    return [(c.method, c.kind) for c in calls if c.method != "post_event"]


async def one_pass(kube: MemKube, absences: Absences) -> list[Call]:
    mark = len(kube.calls)
    await reconcile(kube, NS, "svc", Settings(), clock=lambda: NOW, absences=absences)
    return kube.calls[mark:]


async def test_a_new_tritonservices_passes_until_ready_and_an_idle_pass() -> None:
    """One replica (no PodDisruptionBudget wanted), as in the 5,000 benchmark. The first pass creates
    (ConfigMap, Deployment, Service, status); the pass after the pods turn Ready sends the Service and
    the status only; a pass with nothing to do writes nothing but the Service, and reads the
    TritonService and what it owns. Requests (a list_owned is 3): 8, 6, 5 (9 while the first posted a
    RevisionDeployed Event); before
    core.observed.observation.nothing_applied_yet, Absences and core.decision.actions.applied_as_built: 10, 8,
    7 (a PodDisruptionBudget GET in each pass, a Deployment apply in each after the first)."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=1))
    absences = Absences()
    first = await one_pass(kube, absences)
    assert sent(first) == [
        ("get_tritonservice", "TritonService"),
        ("list_owned", ""),
        ("apply", "ConfigMap"),
        ("apply", "Deployment"),
        ("apply", "Service"),
        ("apply_status", "TritonService"),
    ]
    run_kubelet(kube, NS)
    ready = await one_pass(kube, absences)
    stored = kube.find("TritonService", NS, "svc")
    assert stored is not None
    assert cond.find_condition(stored["status"]["conditions"], cond.READY)["status"] == cond.TRUE  # type: ignore[index]
    assert sent(ready) == [
        ("get_tritonservice", "TritonService"),
        ("list_owned", ""),
        ("apply", "Service"),
        ("apply_status", "TritonService"),
    ]
    idle = await one_pass(kube, absences)
    assert sent(idle) == [("get_tritonservice", "TritonService"), ("list_owned", ""), ("apply", "Service")]
    assert [requests(p) for p in (first, ready, idle)] == [8, 6, 5]  # the first posts no Event


async def test_a_budget_no_longer_wanted_is_looked_up_until_it_is_deleted_then_no_more() -> None:
    """From two replicas (a PodDisruptionBudget applied) to one: the pass that carries out one
    replica looks it up and deletes it; the passes after it look it up no more."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=2))
    absences = Absences()
    assert ("get", "PodDisruptionBudget") not in sent(await one_pass(kube, absences))
    assert kube.find("PodDisruptionBudget", NS, "svc") is not None
    kube.edit("TritonService", NS, "svc", lambda ts: ts["spec"].update(replicas=1))
    down = await one_pass(kube, absences)
    assert ("get", "PodDisruptionBudget") in sent(down) and ("delete", "PodDisruptionBudget") in sent(down)
    assert kube.find("PodDisruptionBudget", NS, "svc") is None
    after = await one_pass(kube, absences)
    assert ("get", "PodDisruptionBudget") not in sent(after)
    # A spec that wants one again applies it, and forgets it was absent.
    kube.edit("TritonService", NS, "svc", lambda ts: ts["spec"].update(replicas=2))
    up = await one_pass(kube, absences)
    assert ("apply", "PodDisruptionBudget") in sent(up)
    kube.edit("TritonService", NS, "svc", lambda ts: ts["spec"].update(replicas=1))
    again = await one_pass(kube, absences)
    assert ("delete", "PodDisruptionBudget") in sent(again)
    assert kube.find("PodDisruptionBudget", NS, "svc") is None


async def test_a_deployment_edited_by_hand_is_applied_again_in_the_next_pass() -> None:
    """A user sets another image on the Deployment: the next pass applies it again (and the one
    after it, finding it as built, does not)."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=1))
    absences = Absences()
    await one_pass(kube, absences)
    name = next(k[2] for k in kube.objects if k[0] == "Deployment")
    image = kube.objects[("Deployment", NS, name)]["spec"]["template"]["spec"]["containers"][0]["image"]

    def edit(obj: dict[str, object]) -> None:
        obj["spec"]["template"]["spec"]["containers"][0]["image"] = "example.com/other:1"  # type: ignore[index]

    kube.edit("Deployment", NS, name, edit)
    fixed = await one_pass(kube, absences)
    assert ("apply", "Deployment") in sent(fixed)
    stored = kube.find("Deployment", NS, name)
    assert stored is not None and stored["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert ("apply", "Deployment") not in sent(await one_pass(kube, absences))


async def test_the_owned_hpa_stored_as_built_is_not_applied_again_and_a_hand_edit_is() -> None:
    """The owned HPA is listed with the namespace's HPAs while spec.autoscaling is set: found as
    built, it is not sent again; its maxReplicas edited by hand, it is."""
    kube = MemKube()
    body = tritonservice(
        "svc", NS, autoscaling={"maxReplicas": 6, "metrics": [{"queueTime": {"averageMicroseconds": 5000}}]}
    )
    body["metadata"]["uid"] = "u-1"
    kube.put(body)
    absences = Absences()
    assert ("apply", "HorizontalPodAutoscaler") in sent(await one_pass(kube, absences))
    run_kubelet(kube, NS)
    assert ("apply", "HorizontalPodAutoscaler") not in sent(await one_pass(kube, absences))
    kube.edit("HorizontalPodAutoscaler", NS, "svc", lambda hpa: hpa["spec"].update(maxReplicas=60))
    assert ("apply", "HorizontalPodAutoscaler") in sent(await one_pass(kube, absences))
    stored = kube.find("HorizontalPodAutoscaler", NS, "svc")
    assert stored is not None and stored["spec"]["maxReplicas"] == 6


async def test_a_budget_left_by_a_pass_that_wrote_no_status_is_still_found() -> None:
    """A first pass that applied its objects (a PodDisruptionBudget among them) but whose status
    write failed: the next pass, its spec at one replica, finds the ConfigMap and Deployment it
    left, so it looks the PodDisruptionBudget up and deletes it."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, replicas=2))
    absences = Absences()
    kube.fail_next("apply_status", RuntimeError("the API server went away"))
    with pytest.raises(RuntimeError):
        await one_pass(kube, absences)
    assert kube.find("PodDisruptionBudget", NS, "svc") is not None
    kube.edit("TritonService", NS, "svc", lambda ts: ts["spec"].update(replicas=1))
    down = await one_pass(kube, absences)
    assert ("delete", "PodDisruptionBudget") in sent(down)
    assert kube.find("PodDisruptionBudget", NS, "svc") is None

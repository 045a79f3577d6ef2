"""Whole passes of a pool one of whose pods stays Pending (no room on a node, a cordoned node, a quota):
it is given no copy, the Running pods take what fits, every model keeps answering, status.pool says
why a model is short, an in-place update of one model completes without it, and once it is scheduled
it takes the copies that were short and nothing else moves.

Faked as in test_pool_reconcile: MemKube, the kubelet (a pod edited to Pending: no IP, no node,
PodScheduled False/Unschedulable) and the agents (each reports READY what its assignment asks).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from test_pool_reconcile import (  # type: ignore[import-not-found,unused-ignore]
    MODELS,
    NS,
    T0,
    agents_from,
    answering,
    assigned,
    entries,
    pin,
    pods,
    pooled,
    ready_labels,
    run,
    start_pods,
)

from memkube import MemKube
from triton_operator.core.vocabulary import conditions as cond

UNSCHEDULABLE = "0/1 nodes are available: 1 node(s) were unschedulable."


def make_pending(kube: MemKube, name: str) -> None:
    """``name`` as the scheduler leaves a pod it cannot place: no node, no IP, PodScheduled False."""

    def pending(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {}).pop("nodeName", None)
        obj["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": UNSCHEDULABLE,
                }
            ],
        }

    kube.edit("Pod", NS, name, pending)


def schedule(kube: MemKube, name: str, ip: str, node: str) -> None:
    """The node uncordoned: the pod scheduled, started, given an IP (Ready: its readiness is the agent's)."""

    def running(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {})["nodeName"] = node
        obj["status"] = {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        }

    kube.edit("Pod", NS, name, running)


def pool_status(kube: MemKube) -> dict[str, Any]:
    return kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index,no-any-return]


def by_model(kube: MemKube) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in pool_status(kube)["pool"]["models"]}


def condition(kube: MemKube, kind: str) -> Mapping[str, Any]:
    return next(c for c in pool_status(kube)["conditions"] if c["type"] == kind)


async def passes(kube: MemKube, count: int, at: datetime.datetime, **kw: Any) -> datetime.datetime:
    """``count`` passes 30 s apart, the agents reporting what they are asked; every model answering
    (READY and labelled on a pod) before each pass once it first answered."""
    for _ in range(count):
        reports = agents_from(kube)
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at, **kw)
    return at


async def test_a_pending_pod_gets_no_copy_status_says_why_and_takes_the_short_copies_once_scheduled() -> None:
    """Three models of 400Mi, two copies each, on pods of 1000Mi need three pods; the third stays
    Pending: the two Running pods hold two models each (every model answers), the Pending pod is
    given nothing, the two models left with one copy say the Pending pod is why, and PodsScheduled is False
    with the scheduler's message. Scheduled, the pod takes their second copies and nothing else
    moves: no copy is unloaded anywhere."""
    kube = MemKube()
    kube.put(pooled(replicas=3))
    await run(kube)
    start_pods(kube)
    stuck = sorted(pods(kube))[2]
    make_pending(kube, stuck)
    at = await passes(kube, 4, T0)
    assert assigned(pods(kube)[stuck]) == {}  # nothing given to a pod that cannot load it
    running = {n: assigned(p) for n, p in pods(kube).items() if n != stuck}
    assert all(len(held) == 2 for held in running.values()), running  # the Running pods full
    where = answering(kube, agents_from(kube))
    assert all(where.values()), where  # every model answers
    models = by_model(kube)
    short = [m for m in MODELS if models[m]["copies"] < 2]
    assert len(short) == 2, models  # four copies on two pods: one model has both, two have one
    for model in short:
        entry = models[model]
        assert entry["reason"] == "BudgetFull", entry
        assert stuck in entry["message"] and "Pending" in entry["message"], entry
        assert UNSCHEDULABLE in entry["message"], entry
    scheduled = condition(kube, cond.PODS_SCHEDULED)
    assert scheduled["status"] == "False" and UNSCHEDULABLE in scheduled["message"], scheduled

    before = {n: set(assigned(p)) for n, p in pods(kube).items()}
    schedule(kube, stuck, "10.0.0.9", "node-9")
    for _ in range(4):
        reports = agents_from(kube)
        where = answering(kube, reports)
        assert all(where.values()), where  # every model answers at every pass
        for name, held in before.items():
            assert held <= set(assigned(pods(kube)[name])), name  # nothing unloaded, nothing moved
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at)
    assert set(assigned(pods(kube)[stuck])) == set(short)
    assert {n: set(assigned(p)) for n, p in pods(kube).items() if n != stuck} == {
        n: h for n, h in before.items() if n != stuck
    }
    models = by_model(kube)
    for model in MODELS:
        assert models[model]["copies"] == 2 and models[model]["readyCopies"] == 2, models[model]
        assert models[model]["reason"] == "Wanted", models[model]
    assert ready_labels(pods(kube)[stuck]) == set(short)


async def test_a_new_model_goes_on_a_running_pod_with_room_while_another_pod_stays_pending() -> None:
    """Four pods, the fourth Pending: the three Running ones hold the six copies with 200Mi to spare
    each. A new model of 150Mi is placed on a Running pod and answers; the Pending pod is given
    nothing and its models' status does not blame it."""
    kube = MemKube()
    kube.put(pooled(replicas=4))
    await run(kube)
    start_pods(kube)
    stuck = sorted(pods(kube))[3]
    make_pending(kube, stuck)
    at = await passes(kube, 3, T0)

    def add_model(obj: dict[str, Any]) -> None:
        extra = dict(obj["spec"]["models"][0], name="d", memory="150Mi", minCopies=1)
        obj["spec"]["models"].append(extra)

    kube.edit("TritonService", NS, "pool", add_model)
    at = await passes(kube, 3, at)
    holders = [n for n, p in pods(kube).items() if "d" in assigned(p)]
    assert len(holders) == 1 and stuck not in holders, holders
    assert "d" in ready_labels(pods(kube)[holders[0]])
    assert assigned(pods(kube)[stuck]) == {}
    models = by_model(kube)
    assert all(models[m]["reason"] == "Wanted" for m in [*MODELS, "d"]), models


async def test_an_in_place_update_of_one_model_completes_while_a_pool_pod_stays_pending() -> None:
    """modelUpdates: InPlace with a fourth pod Pending (it holds nothing): a new version of model a
    moves on the Running pods that hold it and the update completes (servedRevision is the new one);
    every model answers at every pass."""
    kube = MemKube()
    body = pooled(replicas=4)
    body["spec"]["rollout"] = {"modelUpdates": "InPlace"}
    body["spec"]["repository"] = {"uri": "s3://models/repo", "credentialsSecret": "store"}
    kube.put(body)
    await run(kube, pin=pin)
    start_pods(kube)
    stuck = sorted(pods(kube))[3]
    make_pending(kube, stuck)
    at = await passes(kube, 3, T0, pin=pin)
    before = {n: entries(p) for n, p in pods(kube).items()}
    holders = {n for n, e in before.items() if "a" in e}
    assert len(holders) == 2 and stuck not in holders

    def new_config(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["parameters"] = {"note": {"stringValue": "v2"}}

    kube.edit("TritonService", NS, "pool", new_config)
    for _ in range(30):
        reports = agents_from(kube)
        where = answering(kube, reports)
        assert all(where.values()), where
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at, pin=pin)
    status = pool_status(kube)
    assert len(kube.of_kind("Deployment")) == 1, status.get("rolloutKindReason")
    served = status.get("servedRevision")
    assert served and served != status["stableRevision"], (status.get("inPlace"), status.get("conditions"))
    for name in holders:
        entry = entries(pods(kube)[name])["a"]
        assert entry.version != before[name]["a"].version and entry.revision == served
    assert entries(pods(kube)[stuck]) == {}

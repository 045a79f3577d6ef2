"""Whole reconcile passes of a pooled TritonService (spec.pool) over MemKube: per-model Services, each
pod's assignment annotation as placement says, model labels following the agents' reports, status.pool,
a pod deleted re-placing its models; and nothing of it for a service without spec.pool.

Faked: the API server (MemKube), the Deployment controller and kubelet (run_kubelet once, then pods
given an IP and a node), and the pods' model agents (``agents_from``: each pod reports READY what its
assignment annotation asks, as docs/pool.md's contract says, or nothing for a pod told to lag).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from e2e_helpers import PYTHON_MODEL, tritonservice
from memkube import MemKube, run_kubelet
from triton_operator.adapters.triton_reader import Owner, PodReading, PodTarget, TritonReader
from triton_operator.core.decision.pool_plan import POOL_LOAD_SECONDS, POOL_LOADING_SECONDS
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION, Copy, parse_assignment
from triton_operator.core.pool.labels import MODEL_LABEL_PREFIX, READY, model_label_key, model_object_name
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    model_sources,
    select_objects,
)
from triton_operator.core.rollout.canary_analysis import Counters
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.pinning import PinnedManifest, summarize
from triton_operator.reconcile.reconcile_pass import reconcile
from triton_operator.settings import Settings

NS = "ml"
SETTINGS = Settings()
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
MODELS = ("a", "b", "c")


def pooled(name: str = "pool", replicas: int = 3) -> dict[str, Any]:
    """Three models of 400Mi, two copies each at least, on pods of 1000Mi: two models a pod."""
    return tritonservice(
        name,
        NS,
        replicas=replicas,
        pool={"memoryPerPod": "1000Mi"},
        models=[
            {"name": m, "config": copy.deepcopy(PYTHON_MODEL), "memory": "400Mi", "minCopies": 2}
            for m in MODELS
        ],
    )


def pods(kube: MemKube) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.of_kind("Pod")}


def start_pods(kube: MemKube) -> None:
    """The Deployment's pods, Ready, each with an IP and on its own node."""
    run_kubelet(kube, NS)
    for i, name in enumerate(sorted(pods(kube))):

        def place(obj: dict[str, Any], i: int = i) -> None:
            obj["status"]["podIP"] = f"10.0.0.{i + 1}"
            obj.setdefault("spec", {})["nodeName"] = f"node-{i}"

        kube.edit("Pod", NS, name, place)


def assigned(pod: Mapping[str, Any]) -> dict[str, str]:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    return {m: w.version for m, w in parse_assignment(text).models.items()} if text else {}


def ready_labels(pod: Mapping[str, Any]) -> set[str]:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return {
        k.removeprefix(MODEL_LABEL_PREFIX)
        for k, v in labels.items()
        if k.startswith(MODEL_LABEL_PREFIX) and v == READY
    }


def agents_from(kube: MemKube, lagging: frozenset[str] = frozenset()) -> dict[str, dict[str, Copy]]:
    """What each pod's agent reports: READY at the assigned version for every model its annotation
    asks (the pods in ``lagging`` report nothing loaded yet)."""
    out: dict[str, dict[str, Copy]] = {}
    for name, pod in pods(kube).items():
        text = (pod["metadata"].get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
        wanted = parse_assignment(text).models if text and name not in lagging else {}
        out[name] = {m: Copy(state="READY", version=w.version, attempt=w.attempt) for m, w in wanted.items()}
    return out


class Reports:
    """The pool reader's side a pass sees: the latest reports, and the pods it asks to read next."""

    def __init__(self, reports: Mapping[str, Mapping[str, Copy]] | None) -> None:
        self.reports = dict(reports or {})
        self.wanted: dict[str, str | None] = {}

    def latest(self, namespace: str, name: str) -> Mapping[str, Mapping[str, Copy]]:
        return self.reports

    def want(self, namespace: str, name: str, pods: Mapping[str, str | None]) -> None:
        self.wanted = dict(pods)


async def run(
    kube: MemKube,
    reports: Mapping[str, Mapping[str, Copy]] | None = None,
    name: str = "pool",
    at: datetime.datetime = T0,
    pin: Any = None,
) -> Reports:
    seen = Reports(reports)
    await reconcile(kube, NS, name, SETTINGS, clock=lambda: at, pool_reports=seen, pin_manifest=pin)
    return seen


async def pin(ts: TritonService, current: str | None) -> PinnedManifest:
    """A listed (pinned) repository holding one file a model: in-place updates need its object list."""
    listing = [ObjectInfo(f"{m}/1/model.py", 10, etag=f"e-{m}", generation=f"e-{m}") for m in MODELS]
    selection = select_objects(model_sources(ts.spec.models), listing)
    return summarize(build_manifest(StoreRef.from_repository(ts.spec.repository), selection), versioned=True)


async def test_a_pool_gets_model_services_assignments_labels_and_status() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    asked = await run(kube)  # placement: each pod's assignment annotation
    assert asked.wanted == {n: p["status"]["podIP"] for n, p in pods(kube).items()}  # reports read next
    held = {name: assigned(p) for name, p in pods(kube).items()}
    assert len(held) == 3
    for model in MODELS:
        assert sum(model in h for h in held.values()) == 2, held  # minCopies, each on its own pod
    assert all(len(h) <= 2 for h in held.values())  # 1000Mi holds two of 400Mi
    for model in MODELS:
        service = kube.find("Service", NS, model_object_name("pool", model))
        assert service is not None
        assert service["spec"]["selector"][model_label_key(model)] == READY
    assert not any(ready_labels(p) for p in pods(kube).values())  # nothing READY yet: no label

    await run(kube, agents_from(kube))  # the agents report READY: labels follow
    for name, pod in pods(kube).items():
        assert ready_labels(pod) == set(assigned(pod)), name
    await run(kube, agents_from(kube))
    status = kube.find("TritonService", NS, "pool")["status"]["pool"]  # type: ignore[index]
    by_model = {m["name"]: m for m in status["models"]}
    assert set(by_model) == set(MODELS)
    for model in MODELS:
        assert by_model[model]["readyCopies"] == 2
        assert by_model[model]["endpoints"]["http"].startswith(
            f"{model_object_name('pool', model)}.{NS}.svc:"
        )
        assert sorted(by_model[model]["pods"]) == sorted(
            n for n, p in pods(kube).items() if model in assigned(p)
        )


async def test_labels_wait_for_the_pods_agent() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    lagging = sorted(pods(kube))[0]
    await run(kube, agents_from(kube, frozenset({lagging})))
    assert ready_labels(pods(kube)[lagging]) == set()
    assert all(ready_labels(p) for n, p in pods(kube).items() if n != lagging)


async def test_a_deleted_pod_has_its_models_placed_again() -> None:
    kube = MemKube()
    kube.put(pooled(replicas=4))
    await run(kube)
    start_pods(kube)
    await run(kube)
    await run(kube, agents_from(kube))
    gone = next(n for n, p in sorted(pods(kube).items()) if assigned(p))
    lost = set(assigned(pods(kube)[gone]))
    del kube.objects[("Pod", NS, gone)]
    await run(kube, agents_from(kube))
    for model in lost:
        holders = [n for n, p in pods(kube).items() if model in assigned(p)]
        assert len(holders) == 2, (model, holders)  # back to its least copies on the pods left
    status = kube.find("TritonService", NS, "pool")["status"]["pool"]  # type: ignore[index]
    assert all(gone not in m["pods"] for m in status["models"])


async def test_a_pod_changed_since_read_waits_for_the_next_pass() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    victim = sorted(pods(kube))[0]

    def touch(*_args: Any) -> None:
        kube.edit("Pod", NS, victim, lambda obj: obj["metadata"].setdefault("annotations", {}).update(x="1"))

    kube.before("merge_patch", touch, kind="Pod")
    await run(kube)  # the first pod changed between the read and its patch: a conflict, skipped
    assert assigned(pods(kube)[victim]) == {}
    await run(kube)
    assert assigned(pods(kube)[victim]) != {}


async def test_no_pool_no_pool_writes() -> None:
    kube = MemKube()
    kube.put(tritonservice("plain", NS))
    await run(kube, name="plain")
    run_kubelet(kube, NS)
    asked = await run(kube, name="plain")
    assert asked.wanted == {}
    assert not any(p["kind"] == "Service" and "-m-" in p["metadata"]["name"] for p in kube.of_kind("Service"))
    assert all(
        ASSIGNMENT_ANNOTATION not in (p["metadata"].get("annotations") or {}) for p in pods(kube).values()
    )
    assert "pool" not in kube.find("TritonService", NS, "plain")["status"]  # type: ignore[index]


def model_services(kube: MemKube) -> set[str]:
    return {s["metadata"]["name"] for s in kube.of_kind("Service") if "-m-" in s["metadata"]["name"]}


async def test_model_services_are_spared_once_stored_and_go_with_their_model() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    key = ("Service", NS, model_object_name("pool", "a"))
    applied = kube.applied.count(key)
    await run(kube)
    assert kube.applied.count(key) == applied  # stored as built: not applied again

    def drop_c(obj: dict[str, Any]) -> None:
        obj["spec"]["models"] = [m for m in obj["spec"]["models"] if m["name"] != "c"]

    kube.edit("TritonService", NS, "pool", drop_c)
    await run(kube)
    assert model_services(kube) == {model_object_name("pool", m) for m in ("a", "b")}


async def test_a_pool_removed_leaves_no_model_services_nor_status() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    assert len(model_services(kube)) == 3

    def unpool(obj: dict[str, Any]) -> None:
        del obj["spec"]["pool"]
        for model in obj["spec"]["models"]:
            del model["minCopies"]

    kube.edit("TritonService", NS, "pool", unpool)
    await run(kube)
    assert model_services(kube) == set()
    assert "pool" not in kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]


async def test_model_routes_attach_to_the_users_gateway() -> None:
    kube = MemKube()
    parent = {"name": "gw", "sectionName": "http"}
    kube.put(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "users", "namespace": NS},
            "spec": {
                "parentRefs": [parent],
                "rules": [{"backendRefs": [{"name": "pool-stable", "port": 8000}]}],
            },
        }
    )
    body = pooled()
    body["spec"]["rollout"] = {"strategy": "Canary", "trafficRouting": {"gatewayAPI": {"httpRoute": "users"}}}
    kube.put(body)
    await run(kube)
    start_pods(kube)
    await run(kube)
    route = kube.find("HTTPRoute", NS, "pool-models-0")
    assert route is not None
    assert route["spec"]["parentRefs"] == [parent]
    backends = {r["backendRefs"][0]["name"] for r in route["spec"]["rules"]}
    assert backends == {model_object_name("pool", m) for m in MODELS}


async def test_a_model_removed_loses_its_labels_before_it_is_unloaded() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    await run(kube, agents_from(kube))
    holders = {n for n, p in pods(kube).items() if "c" in ready_labels(p)}
    assert len(holders) == 2

    def drop_c(obj: dict[str, Any]) -> None:
        obj["spec"]["models"] = [m for m in obj["spec"]["models"] if m["name"] != "c"]

    kube.edit("TritonService", NS, "pool", drop_c)
    await run(kube, agents_from(kube))
    assert not any("c" in ready_labels(p) for p in pods(kube).values())  # off its routes at once
    assert all("c" in assigned(pods(kube)[n]) for n in holders)  # still loaded while it drains
    later = T0 + datetime.timedelta(seconds=600)  # past the drain
    await run(kube, agents_from(kube), at=later)
    assert not any("c" in assigned(p) for p in pods(kube).values())  # unloaded after the drain
    status = kube.find("TritonService", NS, "pool")["status"]["pool"]  # type: ignore[index]
    assert {m["name"] for m in status["models"]} == {"a", "b"}


async def test_a_failed_load_is_an_event_once_and_asked_again_after_its_backoff() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    reports = agents_from(kube)
    pod = next(n for n, copies in sorted(reports.items()) if "a" in copies)
    failed = reports[pod]["a"]
    reports[pod]["a"] = Copy(state="UNAVAILABLE", version=failed.version, attempt=1, error="out of memory")
    await run(kube, reports)
    await run(kube, reports)
    warnings = [e for e in kube.events if e.get("reason") == "PoolLoadFailed"]
    assert len(warnings) == 1, warnings  # once per attempt, not once per pass
    assert "model a" in warnings[0]["message"] and pod in warnings[0]["message"]
    assert "a" not in ready_labels(pods(kube)[pod])
    text = pods(kube)[pod]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
    assert parse_assignment(text).models["a"].attempt == 1
    await run(kube, reports, at=T0 + datetime.timedelta(seconds=600))  # past the backoff's cap
    text = pods(kube)[pod]["metadata"]["annotations"][ASSIGNMENT_ANNOTATION]
    assert parse_assignment(text).models["a"].attempt == 2  # asked again


# ---------------------------------------------------------------- copies follow load


class PoolMetrics(TritonReader):
    """The operator's Triton reader with Triton's per-model counters made here (no pod here has a metrics
    port; tests/e2e reads real ones): ``advance`` lets time pass, each pod serving the models its
    assignment annotation names, ``busy`` ones at 100 requests a second waiting 50 ms in the queue, the
    others at 5 a second waiting 1 ms (both times ``load``)."""

    def __init__(self, kube: MemKube, busy: frozenset[str]) -> None:
        super().__init__(period=3600, ports=(1, 1))
        self.kube, self.busy = kube, busy
        self.at = 0.0
        self.load = 1.0
        self.targets: list[PodTarget] = []
        self.every: float | None = None
        self.totals: dict[str, dict[str, Counters]] = {}

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        self.targets, self.every = list(targets), metrics_every

    def advance(self, seconds: float) -> None:
        self.at += seconds
        for target in self.targets:
            held = assigned(self.kube.find("Pod", NS, target.name) or {})
            totals = self.totals.setdefault(target.uid, {})
            for model in held:
                rate, queue = (100.0, 50_000.0) if model in self.busy else (5.0, 1_000.0)
                rate, queue = rate * self.load, queue * self.load
                served = Counters(success=rate * seconds, queue_us=rate * seconds * queue)
                totals[model] = totals.get(model, Counters()) + served

    def readings(self, owner: Owner) -> dict[str, PodReading]:
        return {
            t.uid: PodReading(
                t.uid,
                t.revision,
                t.restarts,
                read_at=self.at,
                index=(),
                counters=dict(self.totals.get(t.uid, {})),
                counters_at=self.at,
            )
            for t in self.targets
        }


def one_copy_each() -> dict[str, Any]:
    """Three models of 400Mi, one least copy each, on three pods of 1000Mi; one more copy after 30 s busy."""
    return tritonservice(
        "pool",
        NS,
        replicas=3,
        pool={"memoryPerPod": "1000Mi", "scaling": {"scaleUpStabilizationSeconds": 30, "windowSeconds": 30}},
        models=[{"name": m, "config": copy.deepcopy(PYTHON_MODEL), "memory": "400Mi"} for m in MODELS],
    )


async def test_the_pass_feeds_tritons_figures_into_the_copies_decision() -> None:
    """Load concentrated on model a: the pass reads Triton's per-model counters over the window (through
    TritonView, before it decides), finds a busy, writes busySince, and gives a a second copy once it has
    been busy for scaleUpStabilizationSeconds, and not before; the calm models keep their one copy."""
    kube = MemKube()
    kube.put(one_copy_each())
    metrics = PoolMetrics(kube, busy=frozenset({"a"}))
    view = TritonView(metrics)

    async def at(seconds: float) -> dict[str, Any]:
        moment = T0 + datetime.timedelta(seconds=seconds)
        await reconcile(
            kube,
            NS,
            "pool",
            SETTINGS,
            clock=lambda: moment,
            pool_reports=Reports(agents_from(kube)),
            triton=view,
        )
        status = kube.find("TritonService", NS, "pool")["status"]["pool"]  # type: ignore[index]
        return {m["name"]: m for m in status["models"]}

    await at(0)
    start_pods(kube)
    await at(0)
    first = await at(0)  # READY and labelled: one copy each; one reading of each pod, no window yet
    assert first["a"]["copiesReason"] == "NoReadings" and first["a"]["wantedCopies"] == 1
    assert metrics.every == 10.0  # a pool's pods' metrics are read, every 10 s
    metrics.advance(10)
    busy = await at(10)  # two readings 10 s apart: a is busy
    assert busy["a"]["copiesReason"] == "BusyWaiting" and busy["a"]["busySince"] == "2026-01-01T12:00:10Z"
    assert busy["b"]["copiesReason"] in {"Steady", "MinCopies"}
    # The window's figures are the operator's metrics, not status.
    assert gauge("inferences_per_second", "a") == 100 and gauge("queue_microseconds", "a") == 50_000
    assert gauge("inferences_per_second", "b") == 5
    assert "inferencesPerSecond" not in busy["a"] and "queueMicroseconds" not in busy["a"]
    assert busy["a"]["lastUsed"] == "2026-01-01T12:00:00Z"  # to 5 minutes
    metrics.advance(29)
    early = await at(39)
    assert early["a"]["wantedCopies"] == 1 and sum("a" in assigned(p) for p in pods(kube).values()) == 1
    metrics.advance(1)
    added = await at(40)
    assert added["a"]["copiesReason"] == "Busy" and added["a"]["wantedCopies"] == 2
    assert sum("a" in assigned(p) for p in pods(kube).values()) == 2  # placed on a second pod
    assert added["b"]["wantedCopies"] == 1 and added["c"]["wantedCopies"] == 1


def gauge(figure: str, model: str) -> float | None:
    """A pooled model's figure as the operator's /metrics publishes it (the process-wide registry)."""
    return METRICS.registry.get_sample_value(
        f"triton_operator_pool_model_{figure}", {"namespace": NS, "name": "pool", "model": model}
    )


async def test_a_pass_whose_figures_moved_and_whose_decisions_did_not_writes_no_status() -> None:
    """Two windows of different load (a busy both times, b and c calm), nothing else changed: the second
    pass publishes the new figures as metrics and writes no status (status.pool held each window's
    inferencesPerSecond and queueMicroseconds, and a message quoting them: a write every window)."""
    kube = MemKube()
    kube.put(one_copy_each())
    metrics = PoolMetrics(kube, busy=frozenset({"a"}))
    view = TritonView(metrics)

    async def at(seconds: float) -> int:
        """The pass at ``seconds``; its status writes."""
        moment = T0 + datetime.timedelta(seconds=seconds)
        mark = len(kube.writes)
        await reconcile(
            kube,
            NS,
            "pool",
            SETTINGS,
            clock=lambda: moment,
            pool_reports=Reports(agents_from(kube)),
            triton=view,
        )
        return sum(1 for w in kube.writes[mark:] if w.method == "apply_status")

    await at(0)
    start_pods(kube)
    await at(0)
    await at(0)
    metrics.advance(10)
    assert await at(10) == 1  # a busy: BusyWaiting, busySince
    before = kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]
    first = gauge("inferences_per_second", "a")
    metrics.load = 1.5
    metrics.advance(10)
    assert await at(20) == 0
    assert kube.find("TritonService", NS, "pool")["status"] == before  # type: ignore[index]
    assert first == 100
    assert gauge("inferences_per_second", "a") == pytest.approx(125)  # (1000 + 1500) over the 20 s window
    assert gauge("queue_microseconds", "b") is not None
    assert {m["name"]: m["copiesReason"] for m in before["pool"]["models"]}["a"] == "BusyWaiting"


async def test_the_pools_pods_follow_its_copies_above_spec_replicas_up_to_max_replicas() -> None:
    """Under spec.autoscaling, spec.replicas (the HPA's, through /scale) is the pool's floor: the least
    copies of three models of 400Mi, two each, need three pods of 1000Mi, so the Deployment runs three
    while spec.replicas says two, and the HPA is still the operator's, on the TritonService's /scale."""
    kube = MemKube()
    body = pooled(replicas=2)
    body["spec"]["autoscaling"] = {
        "maxReplicas": 5,
        "metrics": [{"queueTime": {"averageMicroseconds": 5000}}],
    }
    kube.put(body)
    await run(kube)
    await run(kube)
    deployments = kube.of_kind("Deployment")
    assert [d["spec"]["replicas"] for d in deployments] == [3]
    status = kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]
    assert status["pool"]["podsNeeded"] == 3
    hpa = kube.find("HorizontalPodAutoscaler", NS, "pool")
    assert hpa is not None and hpa["spec"]["scaleTargetRef"]["kind"] == "TritonService"
    assert kube.find("TritonService", NS, "pool")["spec"]["replicas"] == 2  # type: ignore[index]


def revision_of(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["labels"]["triton-operator.io/revision"])


def start_new_pods(kube: MemKube) -> None:
    """The kubelet for Deployments without pods yet: their pods, Ready, with an IP and a node; the pods
    already there kept as they are (annotations, labels)."""
    kept = {name: copy.deepcopy(p) for name, p in pods(kube).items()}
    run_kubelet(kube, NS)
    for pod in kept.values():
        kube.put(pod)
    for i, name in enumerate(sorted(set(pods(kube)) - set(kept))):

        def place(obj: dict[str, Any], i: int = i) -> None:
            obj["status"]["podIP"] = f"10.0.1.{i + 1}"
            obj.setdefault("spec", {})["nodeName"] = f"node-{i}"

        kube.edit("Pod", NS, name, place)


def answering(kube: MemKube, reports: Mapping[str, Mapping[str, Copy]]) -> dict[str, set[str]]:
    """Each model's pods that are labelled ready for it and report it READY."""
    out: dict[str, set[str]] = {m: set() for m in MODELS}
    for name, pod in pods(kube).items():
        for model in ready_labels(pod):
            copy_ = reports.get(name, {}).get(model)
            if copy_ is not None and copy_.state == "READY":
                out[model].add(name)
    return out


async def test_a_new_revision_of_a_pool_takes_the_models_onto_its_pods_before_the_old_ones_let_go() -> None:
    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)
    await run(kube, agents_from(kube))
    await run(kube, agents_from(kube))
    old = set(pods(kube))
    assert all(ready_labels(p) for p in pods(kube).values())

    def new_config(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["parameters"] = {"note": {"stringValue": "v2"}}

    kube.edit("TritonService", NS, "pool", new_config)
    await run(kube, agents_from(kube))  # the new revision's Deployment
    start_new_pods(kube)
    new = set(pods(kube)) - old
    assert len(new) == 3 and len({revision_of(pods(kube)[n]) for n in new}) == 1
    at = T0
    for _ in range(12):  # the agents report what they are asked; the drains end as time goes on
        reports = agents_from(kube)
        for model, where in answering(kube, reports).items():
            assert where, f"{model} has no copy on its routes"
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at)
    for model in MODELS:
        holders = {n for n, p in pods(kube).items() if model in assigned(p)}
        assert holders <= new and len(holders) == 2, (model, holders)  # on the new revision's pods only
        assert {n for n, p in pods(kube).items() if model in ready_labels(p)} == holders
    assert not any(assigned(pods(kube)[n]) or ready_labels(pods(kube)[n]) for n in old)  # let go


def entries(pod: Mapping[str, Any]) -> dict[str, Any]:
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(ASSIGNMENT_ANNOTATION)
    return dict(parse_assignment(text).models) if text else {}


async def test_in_place_a_new_version_of_one_model_moves_on_the_pods_that_hold_it_one_at_a_time() -> None:
    """modelUpdates: InPlace: a change of model a's config keeps the pool's pods (no new Deployment);
    the rollout engine asks the pods step by step, and the pool's moves reload a on the pods asked that
    hold it, from the new revision's files (named in the entry), one copy off its route at a time; b's
    and c's entries are never rewritten; the update completes once every pod serves the new revision."""
    kube = MemKube()
    body = pooled()
    body["spec"]["rollout"] = {"modelUpdates": "InPlace"}
    body["spec"]["repository"] = {"uri": "s3://models/repo", "credentialsSecret": "store"}
    kube.put(body)
    await run(kube, pin=pin)
    start_pods(kube)
    await run(kube, pin=pin)
    await run(kube, agents_from(kube), pin=pin)
    await run(kube, agents_from(kube), pin=pin)
    before = {n: entries(p) for n, p in pods(kube).items()}
    holders = {n for n, e in before.items() if "a" in e}
    assert len(holders) == 2 and all(ready_labels(p) for p in pods(kube).values())

    def new_config(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["parameters"] = {"note": {"stringValue": "v2"}}

    kube.edit("TritonService", NS, "pool", new_config)
    at = T0
    off, mixed = 0, 0
    for _ in range(30):
        reports = agents_from(kube)
        where = answering(kube, reports)
        assert all(where.values()), where  # every model answers at every pass
        assert len(holders - where["a"]) <= 1  # one copy of a off its route at a time
        off += len(holders - where["a"])
        mixed += len({entries(pods(kube)[n])["a"].version for n in holders}) == 2
        for name, pod in pods(kube).items():
            assert {m: w for m, w in entries(pod).items() if m != "a"} == {
                m: w for m, w in before[name].items() if m != "a"
            }  # b and c untouched
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at, pin=pin)
    status = kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]
    assert len(kube.of_kind("Deployment")) == 1, (status.get("rolloutKind"), status.get("rolloutKindReason"))
    assert set(pods(kube)) == set(before)  # the same pods
    status = kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]
    served = status.get("servedRevision")
    assert served and served != status["stableRevision"], status.get("inPlace")
    assert off >= 2 and mixed >= 1  # each copy of a left its route in turn, the other serving meanwhile
    for name in holders:
        entry = entries(pods(kube)[name])["a"]
        assert entry.version != before[name]["a"].version and entry.revision == served
        assert "a" in ready_labels(pods(kube)[name])


async def test_in_place_a_failed_new_version_rolls_back_and_the_old_version_keeps_serving() -> None:
    """The new version of a fails to load (Triton keeps the old one READY): a PoolLoadFailed Warning,
    the rollout engine rolls the update back (status.inPlace aborted), the pod goes back to the old
    version's files, and a answers on its routes at every pass."""
    kube = MemKube()
    body = pooled()
    body["spec"]["rollout"] = {"modelUpdates": "InPlace"}
    body["spec"]["repository"] = {"uri": "s3://models/repo", "credentialsSecret": "store"}
    kube.put(body)
    await run(kube, pin=pin)
    start_pods(kube)
    await run(kube, pin=pin)
    for _ in range(2):
        await run(kube, agents_from(kube), pin=pin)
    before = {n: entries(p) for n, p in pods(kube).items()}

    def failing() -> dict[str, dict[str, Copy]]:
        """Each pod's agent: a load of a from another revision fails, its old version staying READY."""
        out = agents_from(kube)
        for name, pod in pods(kube).items():
            entry = entries(pod).get("a")
            if entry is not None and entry.revision is not None:
                old = before[name]["a"].version
                out[name]["a"] = Copy("READY", old, entry.attempt, "load of model 'a' failed: bad config")
        return out

    def new_config(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["parameters"] = {"note": {"stringValue": "v2"}}

    kube.edit("TritonService", NS, "pool", new_config)
    at = T0
    tried = False
    for _ in range(20):
        reports = failing()
        tried = tried or any(e.get("a") and e["a"].revision for e in map(entries, pods(kube).values()))
        assert all(answering(kube, reports).values())
        at += datetime.timedelta(seconds=30)
        await run(kube, reports, at=at, pin=pin)
    status = kube.find("TritonService", NS, "pool")["status"]  # type: ignore[index]
    assert tried and status["inPlace"].get("abortedRevision"), status["inPlace"]
    assert any(e["reason"] == "PoolLoadFailed" and "model a" in e["message"] for e in kube.events), [
        e.get("reason") for e in kube.events
    ]
    for name, pod in pods(kube).items():
        entry = entries(pod).get("a")
        assert entry is None or entry.revision is None, (name, entry)  # back on the pods' own files


async def test_a_terminating_pods_only_copies_stay_routed_until_they_answer_elsewhere() -> None:
    kube = MemKube()
    body = pooled(replicas=3)
    for model in body["spec"]["models"]:
        model["minCopies"] = 1  # one copy each: a pod deleted holds its models' only copies
    kube.put(body)
    await run(kube)
    start_pods(kube)
    await run(kube)
    await run(kube, agents_from(kube))
    before = agents_from(kube)  # READY where assigned; copies placed from now on are still loading
    leaving = next(n for n, p in sorted(pods(kube).items()) if assigned(p))
    lost = set(assigned(pods(kube)[leaving]))
    assert ready_labels(pods(kube)[leaving]) == lost
    kube.edit(
        "Pod", NS, leaving, lambda obj: obj["metadata"].update(deletionTimestamp="2026-01-01T12:00:00Z")
    )

    asked = await run(kube, before)
    assert leaving in asked.wanted  # its agent is still read while it terminates
    assert ready_labels(pods(kube)[leaving]) == lost  # the only copies that answer: still routed
    for model in lost:
        holders = [n for n, p in pods(kube).items() if n != leaving and model in assigned(p)]
        assert len(holders) == 1, (model, holders)  # placed again on a live pod
    status = kube.find("TritonService", NS, "pool")["status"]["pool"]  # type: ignore[index]
    by_model = {m["name"]: m for m in status["models"]}
    assert all(by_model[m]["readyCopies"] == 1 for m in lost)  # clients keep sending to it
    assert all(leaving not in m["pods"] for m in status["models"])

    await run(kube, agents_from(kube))  # READY elsewhere: labelled there; the leaving pod's stay
    assert ready_labels(pods(kube)[leaving]) == lost
    for model in lost:
        assert any(model in ready_labels(p) for n, p in pods(kube).items() if n != leaving)
    await run(kube, agents_from(kube))  # every wanted copy answers: the leaving pod comes off
    assert ready_labels(pods(kube)[leaving]) == set()


async def test_a_leaving_pods_models_are_looked_at_again_within_a_second_while_they_load_elsewhere() -> None:
    """A pool pod deleted holding its models' only copies: while their new copies load, each pass asks
    for the next within POOL_LOADING_SECONDS (the agents read again), so a copy is labelled about a
    second after its load ends; once every copy answers, passes go back to POOL_LOAD_SECONDS."""
    kube = MemKube()
    body = pooled(replicas=3)
    for model in body["spec"]["models"]:
        model["minCopies"] = 1
    kube.put(body)
    await run(kube)
    start_pods(kube)
    await run(kube)
    await run(kube, agents_from(kube))
    before = agents_from(kube)
    leaving = next(n for n, p in sorted(pods(kube).items()) if assigned(p))
    lost = set(assigned(pods(kube)[leaving]))
    kube.edit(
        "Pod", NS, leaving, lambda obj: obj["metadata"].update(deletionTimestamp="2026-01-01T12:00:00Z")
    )

    async def requeue(reports: Mapping[str, Mapping[str, Copy]], at: datetime.datetime = T0) -> float | None:
        result = await reconcile(kube, NS, "pool", SETTINGS, clock=lambda: at, pool_reports=Reports(reports))
        return result.requeue_after

    assert (await requeue(before) or 99.0) <= POOL_LOADING_SECONDS  # placed again: asked to load
    assert (await requeue(before) or 99.0) <= POOL_LOADING_SECONDS  # still loading (no READY reported)
    loading = dict(before)
    for name, pod in pods(kube).items():  # the agents report LOADING what they were asked
        loading[name] = {
            m: Copy(state="LOADING", version=v)
            for m, v in assigned(pod).items()
            if m not in before.get(name, {})
        } | dict(before.get(name, {}))
    assert (await requeue(loading) or 99.0) <= POOL_LOADING_SECONDS
    assert ready_labels(pods(kube)[leaving]) == lost  # meanwhile its copies answer

    await requeue(agents_from(kube))  # READY elsewhere: labelled there in this pass
    for model in lost:
        assert any(model in ready_labels(p) for n, p in pods(kube).items() if n != leaving)
    del kube.objects[("Pod", NS, leaving)]
    later = T0
    for _ in range(10):
        later += datetime.timedelta(seconds=30)
        due = await requeue(agents_from(kube), later)
        if due == POOL_LOAD_SECONDS:
            break
    assert due == POOL_LOAD_SECONDS  # nothing loads: no faster than the look at the load


async def test_a_pass_while_a_copy_loads_sends_the_api_server_nothing() -> None:
    """The cost of a pass each second while copies load (docs/pool.md, "What a load costs the operator"):
    over the operator's watches (adapters.cached_kube), a pass that finds a copy still LOADING reads
    nothing from the API server (the per-model Services come from the watches: on main it listed the
    namespace's Services) and writes only what every pass of a service of 2 pods or more writes; it asks
    for each pod's agent report once."""
    from triton_operator.adapters.cached_kube import CachedKube  # noqa: PLC0415
    from triton_operator.adapters.owned_watch import CACHED, OwnedCache  # noqa: PLC0415
    from triton_operator.reconcile.observe import Absences  # noqa: PLC0415

    kube = MemKube()
    kube.put(pooled())
    await run(kube)
    start_pods(kube)
    await run(kube)  # placed: every pod asked for its models
    loading = {
        name: {m: Copy(state="LOADING", version=v) for m, v in assigned(pod).items()}
        for name, pod in pods(kube).items()
    }
    await run(kube, loading)  # status.pool as it stands while they load
    cached = CachedKube(kube, OwnedCache())
    for kind in CACHED:  # the watches caught up
        cached.cache.expect(kind)
        cached.cache.replace(kind, None, kube.of_kind(kind))
        cached.cache.listed(kind)
    stored = kube.find("TritonService", NS, "pool")
    assert stored is not None
    cached.remember(stored)
    for _ in range(3):
        mark = len(kube.calls)
        seen = Reports(loading)
        result = await reconcile(
            cached, NS, "pool", SETTINGS, clock=lambda: T0, pool_reports=seen, absences=Absences()
        )
        # Nothing read; sent: only the PodDisruptionBudget's apply, as every pass of 2 pods or more.
        assert [(c.method, c.kind) for c in kube.calls[mark:]] == [("apply", "PodDisruptionBudget")]
        assert seen.wanted == {n: p["status"]["podIP"] for n, p in pods(kube).items()}  # one read a pod
        assert result.requeue_after == POOL_LOADING_SECONDS
    mark = len(kube.calls)
    every = await cached.list_kind("Service", NS)  # not selected by owner: the cache cannot answer
    assert [(c.method, c.kind) for c in kube.calls[mark:]] == [("list_kind", "Service")]
    assert {model_object_name("pool", m) for m in MODELS} <= {o["metadata"]["name"] for o in every}

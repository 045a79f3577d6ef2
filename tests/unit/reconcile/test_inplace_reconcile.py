"""Whole reconcile passes of a TritonService with spec.rollout.modelUpdates: InPlace, over MemKube:
which changes move in place (no new Deployment, the `<deployment>-inplace` ConfigMap, the pods'
annotations, status and Events) and which make new pods, with the reasons.

Faked, because no real part can run here: the API server (MemKube; tests/e2e runs the same against a
real one), the Deployment controller and kubelet (``Kubelet``: pods that stay, with IPs on the
loopback), and the pods' model-agents (``FakeAgents``: a stdlib HTTP server answering
GET :port/v1/inplace for every pod IP as the agent contract says, from the pod's annotation and the
in-place ConfigMap as MemKube holds them). The operator's side is real: the reconcile pass, the
agent reader's HTTP reads, core.rollout.rollout_kind's rules, the engine.
"""

from __future__ import annotations

import copy
import datetime
import http.server
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from e2e_helpers import PYTHON_MODEL, tritonservice
from memkube import MemKube
from triton_operator import KIND
from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.kube import ObjectRejectedError
from triton_operator.adapters.triton_reader import Owner, PodReading, PodTarget, TritonReader
from triton_operator.core.objects.names import INPLACE_TARGET_ANNOTATION, LABEL_REVISION
from triton_operator.core.observed import observation
from triton_operator.core.pod import agent_plan as agent_core
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    manifest_from_json,
    model_sources,
    select_objects,
)
from triton_operator.core.rollout.canary_analysis import Counters
from triton_operator.core.rollout.requests import request_revision
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.kubectl_plugin import render_status, render_table
from triton_operator.models import TritonService
from triton_operator.reconcile import observe as observe_module
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.pinning import PinnedManifest, summarize
from triton_operator.reconcile.reconcile_pass import Result, reconcile
from triton_operator.settings import Settings

NS = "ml"
SETTINGS = Settings()
T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


class FakeAgents:
    """Stands in for every pod's model-agent (the real one: `triton-operator agent`, tests/e2e): the
    pod at the IP a request reached serves its target revision as the contract resolves it."""

    def __init__(self, kube: MemKube) -> None:
        self.kube = kube
        self.failing: set[str] = set()
        """Revisions whose load fails."""
        self.stuck: set[str] = set()
        """Revisions that never finish loading."""
        self.reads = 0
        agents = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                agents.reads += 1
                body = json.dumps(agents.status(self.connection.getsockname()[0])).encode()
                self.send_response(200 if self.path == "/v1/inplace" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def status(self, ip: str) -> dict[str, Any]:
        pod = next(p for p in self.kube.of_kind("Pod") if p["status"].get("podIP") == ip)
        base = pod["metadata"]["labels"][LABEL_REVISION]
        target = base
        for cm in self.kube.of_kind("ConfigMap"):
            if cm["metadata"]["name"] == f"svc-{base}-inplace":
                state = json.loads(cm["data"]["state.json"])
                wanted = (pod["metadata"].get("annotations") or {}).get(INPLACE_TARGET_ANNOTATION)
                target = wanted if wanted and wanted in (state["stable"], state["next"]) else state["stable"]
        applied = pod.setdefault("applied", base)
        if target in self.failing:
            return {"base": base, "revision": applied, "target": target, "state": "Failed", "message": "boom"}
        if target in self.stuck:
            return {"base": base, "revision": applied, "target": target, "state": "Applying", "message": ""}
        pod["applied"] = target
        models = {"add": "READY", "sub": "READY"}
        return {"base": base, "revision": target, "target": target, "state": "Applied", "models": models}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def kubelet(kube: MemKube) -> None:
    """The Deployment controller and the kubelet, faked: each Deployment has its replicas' pods,
    Ready, each with a loopback IP; a pod once made stays (its annotations with it)."""
    used = {p["status"].get("podIP") for p in kube.of_kind("Pod")}
    for deployment in kube.of_kind("Deployment"):
        name = deployment["metadata"]["name"]
        replicas = int(deployment["spec"].get("replicas", 1))
        status = {
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
            "observedGeneration": deployment["metadata"]["generation"],
        }

        def set_status(d: dict[str, Any], status: dict[str, Any] = status) -> None:
            d["status"] = status

        kube.edit("Deployment", NS, name, set_status)
        for i in range(replicas, 20):
            kube.objects.pop(("Pod", NS, f"{name}-{i}"), None)
        for i in range(replicas):
            if kube.find("Pod", NS, f"{name}-{i}") is not None:
                continue
            ip = next(f"127.0.0.{n}" for n in range(2, 250) if f"127.0.0.{n}" not in used)
            used.add(ip)
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            kube.put(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{i}",
                        "namespace": NS,
                        "labels": labels,
                        "uid": f"uid-{ip}",
                    },
                    "status": {
                        "podIP": ip,
                        "conditions": [
                            {"type": "PodScheduled", "status": "True"},
                            {"type": "Ready", "status": "True"},
                        ],
                    },
                }
            )


class Service:
    """One TritonService over MemKube, its bucket listing, the fake agents, and the clock."""

    def __init__(self, agents: FakeAgents, kube: MemKube, **spec: Any) -> None:
        self.kube = kube
        self.agents = agents
        self.now = T0
        self.bucket = {"add/1/model.py": "e1", "sub/1/model.py": "s1"}
        body = tritonservice(
            "svc",
            NS,
            replicas=4,
            repository={"uri": "s3://models/repo", "credentialsSecret": "store"},
            models=[
                {"name": "add", "config": copy.deepcopy(PYTHON_MODEL)},
                {"name": "sub", "config": copy.deepcopy(PYTHON_MODEL)},
            ],
            rollout={"modelUpdates": "InPlace"},
        )
        body["metadata"]["uid"] = "svc-uid"
        body["spec"].update(spec)
        kube.put(body)
        self.view = TritonView(
            TritonReader(period=3600, ports=(1, 1)), AgentReader(port=agents.port, timeout=5)
        )

    async def pin(self, ts: TritonService, current: str | None) -> PinnedManifest:
        listing = [
            ObjectInfo(key, 10, etag=etag, generation=etag) for key, etag in sorted(self.bucket.items())
        ]
        selection = select_objects(model_sources(ts.spec.models), listing)
        return summarize(
            build_manifest(StoreRef.from_repository(ts.spec.repository), selection), versioned=True
        )

    async def run(self) -> Result:
        result = await reconcile(
            self.kube, NS, "svc", SETTINGS, pin_manifest=self.pin, triton=self.view, clock=lambda: self.now
        )
        kubelet(self.kube)
        return result

    def status(self) -> dict[str, Any]:
        found = self.kube.find(KIND, NS, "svc")
        assert found is not None
        return dict(found["status"])

    def condition(self, kind: str) -> dict[str, Any]:
        found = cond.find_condition(self.status()["conditions"], kind)
        assert found is not None
        return dict(found)

    def edit(self, change: Any) -> None:
        self.kube.edit(KIND, NS, "svc", lambda ts: change(ts["spec"]))

    def deployments(self) -> list[str]:
        return sorted(d["metadata"]["name"] for d in self.kube.of_kind("Deployment"))

    def pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in self.kube.of_kind("Pod")}

    def annotated(self) -> dict[str, str]:
        return {
            name: p["metadata"]["annotations"][INPLACE_TARGET_ANNOTATION]
            for name, p in self.pods().items()
            if (p["metadata"].get("annotations") or {}).get(INPLACE_TARGET_ANNOTATION)
        }

    def inplace_configmap(self) -> dict[str, Any] | None:
        return next(
            (c for c in self.kube.of_kind("ConfigMap") if c["metadata"]["name"].endswith("-inplace")), None
        )

    def events(self) -> list[tuple[str, str, str]]:
        return [(e["type"], e["reason"], e["message"]) for e in self.kube.events]

    def request(self, action: str, revision: str) -> None:
        def annotate(ts: dict[str, Any]) -> None:
            annotations = ts["metadata"].setdefault("annotations", {})
            annotations[f"triton-operator.io/{action}"] = f"req-{action}-{len(self.kube.events)}"
            annotations[f"triton-operator.io/{action}-revision"] = revision

        self.kube.edit(KIND, NS, "svc", annotate)

    async def close(self) -> None:
        await self.view.reader.close()
        if self.view.agents is not None:
            await self.view.agents.close()


@pytest.fixture
def kube() -> MemKube:
    return MemKube()


@pytest.fixture
def agents(kube: MemKube) -> Iterator[FakeAgents]:
    fake = FakeAgents(kube)
    yield fake
    fake.close()


async def serving(svc: Service) -> str:
    """Deploy the service and run passes until its first revision is stable and Ready."""
    for _ in range(3):
        await svc.run()
    stable = svc.status()["stableRevision"]
    assert svc.condition(cond.READY)["status"] == cond.TRUE
    return str(stable)


def new_model_version(spec: dict[str, Any], svc: Service) -> None:
    """A new `add` object and a config change of `add` (both in place)."""
    svc.bucket["add/1/model.py"] = "e2"
    spec["models"][0]["config"]["maxBatchSize"] = 16


async def moved_in_place(svc: Service) -> tuple[str, str]:
    """Serve the first revision, then move a new model version into its pods in place and let the
    rollout complete: (the host revision, the revision its pods now serve)."""
    host = await serving(svc)
    svc.edit(lambda spec: new_model_version(spec, svc))
    moved = (await svc.run()).revision
    assert moved is not None
    await until(svc, lambda: svc.status().get("servedRevision") == moved and not svc.annotated())
    return host, moved


async def until(svc: Service, done: Callable[[], bool], limit: int = 12) -> int:
    """Passes until ``done`` (pods reload in batches, a pass at a time): how many it took."""
    for passes in range(limit):
        if done():
            return passes
        before = set(svc.annotated())
        await svc.run()
        asked = set(svc.annotated()) - before
        assert len(asked) <= max(1, len(svc.pods()) // 4), f"{asked} asked at once"
    raise AssertionError(f"not done after {limit} passes: {svc.status()}")


# ---------------------------------------------------------------- in place, step by step


async def test_a_model_change_moves_in_place_step_by_step_with_no_new_pod(
    kube: MemKube, agents: FakeAgents
) -> None:
    svc = Service(
        agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 25}, {"pause": {}}]}
    )
    try:
        host = await serving(svc)
        pods_before = {n: p["metadata"]["uid"] for n, p in svc.pods().items()}
        svc.edit(lambda spec: new_model_version(spec, svc))
        result = await svc.run()
        new = result.revision
        assert new is not None and new != host
        status = svc.status()
        assert svc.deployments() == [f"svc-{host}"]  # no Deployment of the new revision
        assert status["rolloutKind"] == "InPlace"
        assert status["rolloutKindReason"].startswith("in place: reload add (1 objects, 10 bytes to fetch)")
        assert status["inPlace"]["host"] == host and status["inPlace"]["next"] == new
        assert status["inPlace"]["stable"] == host
        assert "canaryRevision" not in status
        assert svc.condition(cond.PROGRESSING)["reason"] == cond.IN_PLACE_UPDATING
        assert svc.condition(cond.READY)["reason"] == cond.ROLLOUT_IN_PROGRESS
        # the ConfigMap: state.json and both revisions' files; the new revision's own ConfigMap too
        cm = svc.inplace_configmap()
        assert cm is not None and cm["metadata"]["name"] == f"svc-{host}-inplace"
        assert json.loads(cm["data"]["state.json"]) == {"stable": host, "next": new}
        assert {
            f"{host}.manifest.json",
            f"{new}.manifest.json",
            f"{new}.add.config.pbtxt",
            f"{host}.sub.config.pbtxt",
        } <= set(cm["data"])
        assert "max_batch_size: 16" in cm["data"][f"{new}.add.config.pbtxt"]
        assert kube.find("ConfigMap", NS, f"svc-{new}") is not None
        assert svc.annotated() == {f"svc-{host}-0": new}  # 25% of 4 pods
        # what the pod's agent makes of it (core.pod.agent_plan: the contract's other side)
        state = agent_core.parse_inplace_state(cm["data"]["state.json"])
        present = agent_core.revisions_named(cm["data"])
        assert present == {host, new}
        for revision in present:
            manifest = manifest_from_json(cm["data"][f"{revision}.manifest.json"])
            assert set(agent_core.revision_keys(revision, manifest)) <= set(cm["data"])
        assert agent_core.resolve_target(new, state, present, host) == new
        assert agent_core.resolve_target(None, state, present, host) == host
        assert any(r == cond.ROLLOUT_STARTED and "in place" in m for _, r, m in svc.events())

        printed = render_status(kube.find(KIND, NS, "svc") or {}, T0)
        assert f"In place:  {new} loading in the pods of {host} (from {host}; step 0)" in printed
        assert "Rollout:   InPlace - in place: reload add" in printed
        assert "->  0  setWeight 25" in printed
        table = render_table([kube.find(KIND, NS, "svc") or {}], T0)
        assert f"{new} (in place)" in table and "in place 0/2" in table

        await svc.run()  # the pod loaded it: step 0 done, the pause step holds (a canary of one pod)
        progressing = svc.condition(cond.PROGRESSING)
        assert progressing["reason"] == cond.STEP_PAUSED and "until promoted" in progressing["message"]
        assert len(svc.annotated()) == 1

        svc.request("promote", new)
        await svc.run()
        # every pod, in batches (was: all 4 in this pass): one of 4 at a time, a pass each
        assert len(svc.annotated()) == 2
        assert await until(svc, lambda: len(svc.annotated()) == 4) == 2
        assert set(svc.annotated().values()) == {new} and len(svc.annotated()) == 4
        await svc.run()  # every pod loaded it
        status = svc.status()
        assert status["servedRevision"] == new and "next" not in status["inPlace"]
        assert json.loads(svc.inplace_configmap()["data"]["state.json"]) == {"stable": new, "next": None}  # type: ignore[index]
        assert any(r == cond.ROLLOUT_COMPLETED and "in place" in m for _, r, m in svc.events())
        await svc.run()  # the ConfigMap says stable: new, so the annotations go
        assert svc.annotated() == {}
        assert svc.condition(cond.READY)["status"] == cond.TRUE
        assert svc.condition(cond.PROGRESSING)["reason"] == cond.ROLLOUT_COMPLETED
        printed = render_status(kube.find(KIND, NS, "svc") or {}, T0)
        assert f"Serving:   revision {new} in place, in the pods of {host}" in printed
        assert "Status:    Healthy" in printed
        assert {n: p["metadata"]["uid"] for n, p in svc.pods().items()} == pods_before  # the same pods
        assert svc.deployments() == [f"svc-{host}"]
        writes = len(kube.writes)
        await svc.run()
        steady = {(w.method, w.kind) for w in kube.writes[writes:]}
        assert steady == {("apply", "Service"), ("apply", "PodDisruptionBudget")}, (
            steady
        )  # as ever, nothing else
    finally:
        await svc.close()


async def test_a_failed_load_rolls_back_in_place(kube: MemKube, agents: FakeAgents) -> None:
    svc = Service(agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 50}]})
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        agents.failing.add(new)
        await svc.run()  # the agents say Failed
        degraded = svc.condition(cond.DEGRADED)
        assert degraded["status"] == cond.TRUE and degraded["reason"] == cond.IN_PLACE_LOAD_FAILED
        assert "boom" in degraded["message"]
        assert svc.annotated() == {}
        assert svc.status()["inPlace"]["rollingBack"] == cond.IN_PLACE_LOAD_FAILED
        assert any(t == cond.WARNING and r == cond.ROLLOUT_ABORTED for t, r, _ in svc.events())
        await svc.run()  # back on the stable revision: next cleared, the revision held
        status = svc.status()
        assert "next" not in status["inPlace"] and status["inPlace"]["abortedRevision"] == new
        assert svc.condition(cond.READY)["reason"] == cond.ROLLOUT_ABORTED
        assert svc.condition(cond.PROGRESSING)["reason"] == cond.ROLLOUT_ABORTED
        printed = render_status(kube.find(KIND, NS, "svc") or {}, T0)
        assert f"Aborted:   {new} in place (InPlaceLoadFailed): pod svc-{host}-0: boom" in printed
        assert request_revision(svc.status()) == new  # kubectl triton retry/abort name it
        assert svc.deployments() == [f"svc-{host}"]  # and no new pods tried instead
        await svc.run()
        assert svc.deployments() == [f"svc-{host}"] and "next" not in svc.status()["inPlace"]
        # a retry tries the same revision in place again
        agents.failing.clear()
        svc.request("retry", new)
        await svc.run()
        assert svc.status()["inPlace"]["next"] == new
    finally:
        await svc.close()


async def test_the_progress_deadline_rolls_back_in_place(kube: MemKube, agents: FakeAgents) -> None:
    rollout = {"modelUpdates": "InPlace", "progressDeadlineSeconds": 120}
    svc = Service(agents, kube, rollout=rollout, startupTimeoutSeconds=60)
    try:
        await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        agents.stuck.add(new)
        await svc.run()
        svc.now += datetime.timedelta(seconds=121)
        await svc.run()
        assert svc.condition(cond.DEGRADED)["reason"] == cond.PROGRESS_DEADLINE_EXCEEDED
        assert svc.annotated() == {}
    finally:
        await svc.close()


async def test_kubectl_triton_abort_rolls_back_and_promote_goes_to_every_pod(
    kube: MemKube, agents: FakeAgents
) -> None:
    rollout = {
        "modelUpdates": "InPlace",
        "steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}, {"pause": {}}],
    }
    svc = Service(agents, kube, rollout=rollout)
    try:
        await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        await svc.run()
        svc.request("promote", new)
        await svc.run()
        await until(svc, lambda: len(svc.annotated()) == 4)  # in batches (was: in this pass)
        svc.request("abort", new)
        await svc.run()
        assert svc.condition(cond.DEGRADED)["reason"] == cond.ABORTED
        await until(svc, lambda: svc.annotated() == {})  # back in batches too (was: in this pass)
    finally:
        await svc.close()


async def test_a_pod_gone_mid_update_rolls_back(kube: MemKube, agents: FakeAgents) -> None:
    svc = Service(
        agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 25}, {"pause": {}}]}
    )
    try:
        await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        await svc.run()
        (updated,) = svc.annotated()
        del kube.objects[("Pod", NS, updated)]
        await svc.run()
        assert svc.condition(cond.DEGRADED)["reason"] == cond.IN_PLACE_POD_LOST
    finally:
        await svc.close()


# ---------------------------------------------------------------- new pods, and why


def gpu_model(spec: dict[str, Any]) -> None:
    """A config change of a model on the pods' GPU (its instances KIND_AUTO in a pod with a GPU)."""
    spec["models"][0]["config"]["maxBatchSize"] = 16


def backend_change(spec: dict[str, Any]) -> None:
    spec["models"][0]["config"]["backend"] = "onnxruntime"
    spec["models"][0]["config"].pop("instanceGroup")


def pod_change(spec: dict[str, Any]) -> None:
    spec["env"] = [{"name": "X", "value": "1"}]
    spec["models"][0]["config"]["maxBatchSize"] = 16


def in_place_off(spec: dict[str, Any]) -> None:
    spec["rollout"] = {"modelUpdates": "NewPods"}
    spec["models"][0]["config"]["maxBatchSize"] = 16


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (gpu_model, "model add: on a GPU, a reload holds the old and the new copy in GPU memory at once"),
        (backend_change, "model add: backend changed (python -> onnxruntime)"),
        (pod_change, "spec.env changed"),
        (in_place_off, "modelUpdates changed"),
    ],
)
async def test_what_in_place_cannot_take_makes_new_pods_and_says_why(
    kube: MemKube, agents: FakeAgents, change: Any, reason: str
) -> None:
    gpu = {"resources": {"cpu": "1", "memory": "1Gi", "gpus": 1}} if change is gpu_model else {}
    svc = Service(agents, kube, **gpu)
    if change is gpu_model:
        for model in kube.find(KIND, NS, "svc")["spec"]["models"]:  # type: ignore[index]
            model["config"]["instanceGroup"] = [{"kind": "KIND_AUTO", "count": 1}]
    try:
        host = await serving(svc)
        svc.edit(change)
        new = (await svc.run()).revision
        assert new is not None
        status = svc.status()
        assert svc.deployments() == sorted([f"svc-{host}", f"svc-{new}"])  # new pods
        assert status.get("canaryRevision") == new and "inPlace" not in status
        if change is not in_place_off:
            assert status["rolloutKind"] == "NewPods"
            assert reason in status["rolloutKindReason"]
            assert any(r == cond.NEW_PODS_REQUIRED and reason in m for _, r, m in svc.events())
        assert svc.inplace_configmap() is None
    finally:
        await svc.close()


async def test_a_change_whose_files_do_not_fit_the_configmap_makes_new_pods(
    kube: MemKube, agents: FakeAgents
) -> None:
    """Both revisions' manifests of 3,000 objects each (well over CONFIGMAP_BUDGET together; each
    revision's own ConfigMaps hold it gzipped) cannot go in one in-place ConfigMap."""
    svc = Service(agents, kube)
    svc.bucket.update({f"sub/1/part-{i:05d}.bin": f"etag-{i:05d}-{'x' * 40}" for i in range(3000)})
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert svc.status()["rolloutKindReason"] == "new pods: manifest too large for an in-place update"
        assert svc.deployments() == sorted([f"svc-{host}", f"svc-{new}"])
    finally:
        await svc.close()


async def test_a_pod_change_after_models_moved_in_place_rolls_out_new_pods_of_their_own(
    kube: MemKube, agents: FakeAgents
) -> None:
    svc = Service(agents, kube)
    try:
        host, moved = await moved_in_place(svc)
        assert svc.status()["servedRevision"] == moved and svc.annotated() == {}
        svc.edit(lambda spec: spec.__setitem__("env", [{"name": "X", "value": "1"}]))
        new = (await svc.run()).revision
        assert new not in (host, moved)
        status = svc.status()
        assert status["canaryRevision"] == new and status["rolloutKind"] == "NewPods"
        assert status["servedRevision"] == moved  # the host's pods still serve the moved models
        deployment = kube.find("Deployment", NS, f"svc-{new}")
        assert deployment is not None
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes["triton-operator-config"]["configMap"]["name"] == f"svc-{new}"  # its own manifest
        inplace = volumes["inplace"]["projected"]["sources"][0]  # with the target annotation
        assert inplace["configMap"]["name"] == f"svc-{new}-inplace"
        for _ in range(3):
            await svc.run()
        status = svc.status()
        assert status["stableRevision"] == new
        assert "servedRevision" not in status and "inPlace" not in status
        assert svc.inplace_configmap() is None  # the old host's went with its in-place state
    finally:
        await svc.close()


async def test_an_invalid_spec_after_an_in_place_move_keeps_the_moved_models(
    kube: MemKube, agents: FakeAgents
) -> None:
    """The last valid spec is the one the pods serve in place (servedRevision), not the host's own:
    a broken spec never loads the host's old models back; and the manifest the pinner reuses until
    its listing ends (after an operator restart) is the served one too."""
    svc = Service(agents, kube)
    try:
        _, moved = await moved_in_place(svc)
        assert svc.status()["servedRevision"] == moved
        svc.edit(lambda spec: spec["models"][0]["config"].__setitem__("maxBatchSize", -3))
        result = await svc.run()
        assert result.reason == cond.INVALID_SPEC
        status = svc.status()
        assert status["servedRevision"] == moved and "next" not in status.get("inPlace", {})
        assert svc.annotated() == {}
        seen = await observe_module.observe(kube, NS, "svc", kube.find(KIND, NS, "svc") or {}, T0)
        assert observe_module.current_manifest(seen.owned, status) == observation.revision_manifest(
            seen.owned.configmaps, str(moved)
        )
    finally:
        await svc.close()


async def test_pods_added_by_a_scale_mid_update_are_updated_too(kube: MemKube, agents: FakeAgents) -> None:
    """spec.replicas (an HPA, kubectl scale) grows the host mid-update: its Deployment is scaled, the
    new pods start on the stable revision (state.json), and the last step asks them as well."""
    svc = Service(
        agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        await svc.run()
        assert len(svc.annotated()) == 2
        svc.edit(lambda spec: spec.__setitem__("replicas", 6))
        await svc.run()  # the host scaled to 6; its new pods serve the stable revision
        assert len(svc.pods()) == 6 and svc.deployments() == [f"svc-{host}"]
        svc.request("promote", str(new))
        await until(svc, lambda: svc.status().get("servedRevision") == new)  # was: 3 passes
        assert all(p.get("applied") == new for p in svc.pods().values())
    finally:
        await svc.close()


# ---------------------------------------------------------------- spec.rollout.analysis gates in-place steps


class Metrics(TritonReader):
    """The operator's Triton reader with its readings made here (a stand-in for tritonserver's
    metrics port, which no pod here has; tests/e2e reads real ones): at every pass each pod has
    answered 20 more requests of `add`, in 2 ms each, or in 10 ms on the pods whose agent serves
    ``slow`` (the revision loaded in place)."""

    def __init__(self, kube: MemKube) -> None:
        super().__init__(period=3600, ports=(1, 1))
        self.kube = kube
        self.slow: str | None = None
        self.every: float | None = None
        self.targets: list[PodTarget] = []
        self.totals: dict[str, Counters] = {}

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        self.targets, self.every = list(targets), metrics_every

    def readings(self, owner: Owner) -> dict[str, PodReading]:
        out = {}
        for target in self.targets:
            pod = self.kube.find("Pod", NS, target.name) or {}
            slow = self.slow is not None and pod.get("applied") == self.slow
            more = Counters(success=20, request_us=20 * (10_000 if slow else 2_000))
            self.totals[target.uid] = self.totals.get(target.uid, Counters()) + more
            counters = {"add": self.totals[target.uid]}
            out[target.uid] = PodReading(
                target.uid, target.revision, target.restarts, read_at=0.0, index=(), counters=counters
            )
        return out


def analysed(agents: FakeAgents, kube: MemKube) -> tuple[Service, Metrics]:
    rollout = {
        "modelUpdates": "InPlace",
        "steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 3600}}],
        "analysis": {"intervalSeconds": 5, "minRequests": 20, "models": ["add"]},
    }
    svc = Service(agents, kube, rollout=rollout)
    metrics = Metrics(kube)
    svc.view = TritonView(metrics, AgentReader(port=agents.port, timeout=5))
    return svc, metrics


async def test_a_failed_analysis_rolls_the_in_place_step_back_as_a_failed_canary_analysis(
    kube: MemKube, agents: FakeAgents
) -> None:
    """The pods a step moved answer 5 x slower than the pods not asked yet (maxLatencyRatio 1.5):
    rolled back in place on every updated pod, with the Events, conditions, status.analysis and
    status.analysisRuns a failed canary analysis gives."""
    svc, metrics = analysed(agents, kube)
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        await svc.run()  # the step's 2 pods are asked one at a time (was: both in the first pass)
        assert new is not None and len(svc.annotated()) == 2
        metrics.slow = new
        await svc.run()  # the 2 pods asked load it: the window starts (20 of 20 requests not yet)
        assert metrics.every == 5.0  # the pods' metrics are read at the analysis' interval
        assert svc.status()["inPlace"]["stepIndex"] == 1 and svc.annotated()
        window = svc.status()["analysis"]
        assert window["revision"] == new and window["weight"] == 50 and window["verdict"] == "Inconclusive"
        await svc.run()  # 20 requests more on each pod: 10 ms against 2 ms
        degraded = svc.condition(cond.DEGRADED)
        assert (degraded["status"], degraded["reason"]) == (cond.TRUE, cond.ANALYSIS_FAILED)
        assert "request latency 10000us = 5.00 x stable 2000us > 1.5 x" in degraded["message"]
        assert len(svc.annotated()) == 1  # every updated pod goes back, as after a failed load,
        status = svc.status()  # one at a time (was: both in this pass)
        assert status["inPlace"]["rollingBack"] == cond.ANALYSIS_FAILED
        assert status["analysis"]["verdict"] == "Failed"
        assert [(r["revision"], r["verdict"], r["weight"]) for r in status["analysisRuns"]] == [
            (new, "Failed", 50)
        ]
        aborted = [m for t, r, m in svc.events() if (t, r) == (cond.WARNING, cond.ROLLOUT_ABORTED)]
        assert len(aborted) == 1 and "analysis failed after 0s at weight 50" in aborted[0]
        await svc.run()
        assert svc.annotated() == {}
        await svc.run()  # every pod serves the stable revision again
        status = svc.status()
        assert "next" not in status["inPlace"] and status["inPlace"]["abortedReason"] == cond.ANALYSIS_FAILED
        assert all(p.get("applied") == host for p in svc.pods().values())
        assert svc.condition(cond.PROGRESSING)["reason"] == cond.ROLLOUT_ABORTED
        printed = render_status(kube.find(KIND, NS, "svc") or {}, T0)
        assert f"Aborted:   {new} in place (AnalysisFailed): analysis failed" in printed
        assert svc.deployments() == [f"svc-{host}"]
    finally:
        await svc.close()


async def test_a_passing_analysis_lets_the_in_place_update_ask_every_pod(
    kube: MemKube, agents: FakeAgents
) -> None:
    svc, _ = analysed(agents, kube)
    try:
        await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        await svc.run()
        await svc.run()  # the step's 2 pods one at a time (was: both in the first pass)
        svc.now += datetime.timedelta(seconds=3601)  # the pause runs out: the last step would ask every pod
        await svc.run()  # and does, on a passing analysis of the 2 pods updated against the 2 others
        assert len(svc.annotated()) == 3  # in batches (was: all 4 in this pass), no analysis in between
        assert any(r == cond.ANALYSIS_PASSED and "in place" in m for _, r, m in svc.events())
        await until(svc, lambda: svc.status().get("servedRevision") == new)
    finally:
        await svc.close()


async def test_a_pass_reads_each_pods_agent_once_even_when_the_spec_is_refused(
    kube: MemKube, agents: FakeAgents
) -> None:
    """The agents are read in the observe stage: a pass that falls back to the last valid spec after
    the API server refused the current one's objects does not read them a second time."""
    svc = Service(agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 50}]})
    try:
        await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        await svc.run()
        before = agents.reads
        await svc.run()
        assert agents.reads - before == 4  # an in-place update moves: each of the 4 pods once
        svc.edit(lambda spec: spec["models"][1]["config"].__setitem__("maxBatchSize", 4))
        kube.fail_next(
            "apply", ObjectRejectedError("ConfigMap", "svc-x", "data: Invalid value"), kind="ConfigMap"
        )
        before = agents.reads
        result = await svc.run()
        assert result.invalid is not None and "Invalid value" in result.invalid  # the fallback ran
        assert agents.reads - before == 4
    finally:
        await svc.close()


# ---------------------------------------------------------------- undo of revisions served in place


def undo(svc: Service, to_revision: str | None = None) -> None:
    """What `kubectl triton undo [--to-revision REV]` writes (adapters.control.request)."""

    def annotate(ts: dict[str, Any]) -> None:
        annotations = ts["metadata"].setdefault("annotations", {})
        annotations["triton-operator.io/undo"] = f"req-undo-{len(svc.kube.events)}"
        annotations.pop("triton-operator.io/undo-to-revision", None)
        if to_revision:
            annotations["triton-operator.io/undo-to-revision"] = to_revision

    svc.kube.edit(KIND, NS, "svc", annotate)


async def test_undo_goes_back_in_place_to_a_revision_served_only_in_place(
    kube: MemKube, agents: FakeAgents
) -> None:
    """An in-place rollout records the revision the pods served before in status.history (inPlaceHost):
    `kubectl triton undo` loads it back into the same pods, in place and step by step (gated as any
    in-place rollout), and an undo of the undo goes forward again; never a Deployment of either."""
    svc = Service(agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 50}]})
    try:
        host, moved = await moved_in_place(svc)
        status = svc.status()
        assert status["servedRevision"] == moved
        assert status["history"] == [{"revision": host, "inPlaceHost": host}]
        printed = render_status(kube.find(KIND, NS, "svc") or {}, T0)
        assert f"  {host} (in place, in the pods of {host})" in printed

        undo(svc)  # no --to-revision: the last entry of history
        await svc.run()
        status = svc.status()
        assert status["inPlace"]["next"] == host and status["inPlace"]["pinned"] == host
        assert status["inPlace"]["pinnedFor"] == moved and status["rolloutKind"] == "InPlace"
        assert len(svc.annotated()) == 1  # setWeight 50: gated step by step as any in-place rollout,
        await svc.run()  # its 2 pods one at a time (was: both in the first pass)
        assert len(svc.annotated()) == 2
        assert any(r == cond.UNDO_REQUESTED and "in place" in m for _, r, m in svc.events())
        await until(svc, lambda: "next" not in svc.status()["inPlace"])  # was: 3 passes
        status = svc.status()
        assert "servedRevision" not in status and "next" not in status["inPlace"]
        assert all(p.get("applied") == host for p in svc.pods().values())
        assert status["history"] == [{"revision": moved, "inPlaceHost": host}]
        assert kube.find("ConfigMap", NS, f"svc-{moved}") is not None  # kept for the next undo
        await svc.run()  # the spec's revision waits while the undo holds
        assert "servedRevision" not in svc.status()
        assert svc.deployments() == [f"svc-{host}"]

        undo(svc, str(moved))  # and forward again, in place
        await until(svc, lambda: svc.status().get("servedRevision") == moved)  # was: 4 passes
        status = svc.status()
        assert status["servedRevision"] == moved and status["history"] == [
            {"revision": host, "inPlaceHost": host}
        ]
        assert all(p.get("applied") == moved for p in svc.pods().values())
        assert svc.deployments() == [f"svc-{host}"]
        rejected = [m for _, r, m in svc.events() if r == cond.UNDO_REJECTED]
        assert not rejected, rejected
    finally:
        await svc.close()


async def test_a_retry_after_an_in_place_undo_rolls_the_spec_forward(
    kube: MemKube, agents: FakeAgents
) -> None:
    svc = Service(agents, kube)
    try:
        host, moved = await moved_in_place(svc)
        undo(svc)
        await until(svc, lambda: "servedRevision" not in svc.status())  # was: 4 passes
        assert "servedRevision" not in svc.status()
        svc.request("retry", "")
        await until(svc, lambda: svc.status().get("servedRevision") == moved)  # was: 4 passes
        status = svc.status()
        assert status["servedRevision"] == moved and "pinned" not in status["inPlace"]
        assert status["history"] == [{"revision": host, "inPlaceHost": host}]
    finally:
        await svc.close()


async def test_an_undo_the_pods_cannot_load_in_place_is_rejected_and_says_why(
    kube: MemKube, agents: FakeAgents
) -> None:
    """A revision served only in place whose host no longer serves (new pods took over) cannot be
    reached: no Deployment of its own to scale up, nor pods of its host to load it into."""
    svc = Service(agents, kube)
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        first = (await svc.run()).revision
        await until(svc, lambda: svc.status().get("servedRevision") == first)  # was: 3 passes
        svc.edit(lambda spec: spec["models"][1]["config"].__setitem__("maxBatchSize", 4))
        second = (await svc.run()).revision
        await until(svc, lambda: svc.status().get("servedRevision") == second)  # was: 3 passes
        assert svc.status()["servedRevision"] == second
        assert svc.status()["history"] == [
            {"revision": host, "inPlaceHost": host},
            {"revision": first, "inPlaceHost": host},
        ]
        svc.edit(lambda spec: spec.__setitem__("env", [{"name": "X", "value": "1"}]))  # new pods
        for _ in range(4):
            await svc.run()
        assert svc.status()["stableRevision"] not in (host, first, second)
        undo(svc, str(first))
        await svc.run()
        rejected = [m for _, r, m in svc.events() if r == cond.UNDO_REJECTED]
        assert rejected == [
            f"undo: revision {first} was served only in place, in the pods of revision {host}: it can "
            "be loaded back only in place, into those pods (spec.rollout.modelUpdates: InPlace, while "
            "they serve and no rollout of new pods runs)"
        ]
    finally:
        await svc.close()


# ---------------------------------------------------------------- pods that cannot serve (evicted, Pending)

EVICTED = {
    "phase": "Failed",
    "reason": "Evicted",
    "message": 'Usage of EmptyDir volume "models" exceeds the limit "64Mi". ',
    "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
}
PENDING = {
    "phase": "Pending",
    "conditions": [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient cpu.",
        }
    ],
}


def host_pod(svc: Service, host: str, suffix: str, status: dict[str, Any]) -> str:
    """A pod of the host revision left beside the Deployment's live ones: an evicted one (phase
    Failed, reason Evicted, no deletionTimestamp: it stays until deleted, while its ReplicaSet
    starts another), or one the scheduler cannot place."""
    labels = next(p for p in svc.pods().values() if p["metadata"]["labels"][LABEL_REVISION] == host)
    name = f"svc-{host}-{suffix}"
    svc.kube.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NS,
                "labels": dict(labels["metadata"]["labels"]),
                "uid": f"uid-{suffix}",
            },
            "status": copy.deepcopy(status),
        }
    )
    return name


async def test_an_evicted_pod_neither_wedges_an_in_place_rollout_nor_its_rollback(
    kube: MemKube, agents: FakeAgents
) -> None:
    """Before: the evicted pod counted as live, the last step waited for it for ever, and so did
    the rollback after the deadline (InPlaceRollingBack for days, a new spec.image and an abort
    ignored). Now it is not counted: the rollout completes, and so does a rollback."""
    svc = Service(
        agents, kube, rollout={"modelUpdates": "InPlace", "steps": [{"setWeight": 50}, {"pause": {}}]}
    )
    try:
        host = await serving(svc)
        evicted = host_pod(svc, host, "evicted", EVICTED)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        await until(svc, lambda: svc.condition(cond.PROGRESSING)["reason"] == cond.STEP_PAUSED)
        assert len(svc.annotated()) == 2 and evicted not in svc.annotated()  # 50% of the 4 live pods
        svc.request("abort", new)
        await svc.run()
        assert svc.status()["inPlace"]["rollingBack"] == cond.ABORTED
        await until(svc, lambda: "next" not in svc.status()["inPlace"])
        assert svc.condition(cond.PROGRESSING)["reason"] == cond.ROLLOUT_ABORTED
        assert any(r == cond.IN_PLACE_ROLLED_BACK for _, r, _ in svc.events())
        assert svc.annotated() == {}

        svc.request("retry", new)  # and once retried, the rollout completes without it
        await svc.run()
        svc.request("promote", new)
        await until(svc, lambda: svc.status().get("servedRevision") == new)
        assert "next" not in svc.status()["inPlace"]
        done = [m for _, r, m in svc.events() if r == cond.ROLLOUT_COMPLETED and "in place" in m]
        assert done and "by all 4 pods" in done[-1]
        assert evicted not in svc.annotated()
        scheduled = svc.condition(cond.PODS_SCHEDULED)  # the evicted pod is none of the pods serving
        assert scheduled["status"] == cond.TRUE and scheduled["message"] == "4 pod(s) scheduled"
    finally:
        await svc.close()


async def test_a_newer_spec_image_and_an_abort_win_over_a_rollback_with_an_evicted_pod(
    kube: MemKube, agents: FakeAgents
) -> None:
    """The update passes its deadline (a pod never loads it) and rolls back while an evicted pod
    is there: an abort during the rollback is acknowledged, and a newer spec.image rolls out new
    pods instead of waiting behind a rollback that cannot end."""
    rollout = {"modelUpdates": "InPlace", "progressDeadlineSeconds": 120}
    svc = Service(agents, kube, rollout=rollout, startupTimeoutSeconds=60)
    try:
        host = await serving(svc)
        host_pod(svc, host, "evicted", EVICTED)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        agents.stuck.add(new)
        await svc.run()
        svc.now += datetime.timedelta(seconds=121)
        await svc.run()
        assert svc.condition(cond.DEGRADED)["reason"] == cond.PROGRESS_DEADLINE_EXCEEDED
        agents.stuck.clear()
        svc.request("abort", new)
        await svc.run()
        acknowledged = [m for _, r, m in svc.events() if r == cond.ABORTED]
        assert acknowledged and "already rolling back" in acknowledged[-1]
        svc.edit(lambda spec: spec.__setitem__("image", "nvcr.io/nvidia/tritonserver:24.09-py3"))
        await until(svc, lambda: len(svc.deployments()) == 2)
        assert svc.status()["rolloutKind"] == "NewPods"
        assert "next" not in svc.status().get("inPlace", {})
    finally:
        await svc.close()


async def test_the_status_names_each_pod_an_in_place_step_waits_for_and_why(
    kube: MemKube, agents: FakeAgents
) -> None:
    svc = Service(agents, kube, rollout={"modelUpdates": "InPlace"})
    try:
        host = await serving(svc)
        pending = host_pod(svc, host, "pending", PENDING)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        assert new is not None
        agents.stuck.add(new)
        await svc.run()
        message = svc.condition(cond.PROGRESSING)["message"]
        (asked,) = svc.annotated()
        assert f"waiting for pod {asked}: agent reports Applying" in message
        assert "3 pods wait their turn (at most 1 reloading at once)" in message
        assert (
            f"not counted (cannot serve): pod {pending}: Pending (Unschedulable: 0/3 nodes are available: "
            "3 Insufficient cpu.)" in message
        )
        agents.stuck.clear()
        await until(svc, lambda: svc.status().get("servedRevision") == new)
        assert pending not in svc.annotated()
    finally:
        await svc.close()


async def test_one_replica_takes_new_pods_instead_of_a_gap(kube: MemKube, agents: FakeAgents) -> None:
    """A pod leaves the Service while its models reload: with one replica that is a gap, so a change
    in-place could take makes new pods (a surge), and says why."""
    svc = Service(agents, kube, rollout={"modelUpdates": "InPlace"}, replicas=1)
    try:
        host = await serving(svc)
        svc.edit(lambda spec: new_model_version(spec, svc))
        new = (await svc.run()).revision
        status = svc.status()
        assert status["rolloutKind"] == "NewPods"
        assert status["rolloutKindReason"] == (
            "new pods: in place needs at least 2 pods: a pod leaves the Service while it reloads; "
            "with 1 replica new pods take over instead"
        )
        assert sorted(svc.deployments()) == sorted([f"svc-{host}", f"svc-{new}"])
        assert svc.annotated() == {} and "inPlace" not in status
        assert any(r == cond.NEW_PODS_REQUIRED and "at least 2 pods" in m for _, r, m in svc.events())
    finally:
        await svc.close()

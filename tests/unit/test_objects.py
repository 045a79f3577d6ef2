"""Desired objects of a TritonService: labels, owner references, ConfigMap, Deployment, Service, revisions."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from triton_operator.core import objects as o
from triton_operator.core.manifest import manifest_from_json
from triton_operator.core.rollout import RolloutPlan, RolloutStatus
from triton_operator.core.traffic import TrafficWeights
from triton_operator.models import TritonService
from triton_operator.settings import DEFAULT_TRITON_IMAGE, Settings

SETTINGS = Settings()
UID = "0c3d6c2e-8d54-4bb8-9d1b-3c7a1f1e2a10"
CONFIG = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "IN", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}


def body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
            "models": [{"name": "m1", "config": copy.deepcopy(CONFIG)}],
        },
    }
    base["spec"].update(spec)
    return base


def ts_of(**spec: Any) -> TritonService:
    return TritonService.model_validate(body(**spec))


def configs_of(ts: TritonService) -> dict[str, str]:
    checked = o.check_body(ts.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert not checked.problems, checked.problems
    return dict(checked.configs)


def deployment(ts: TritonService, revision: str = "abc1234567", replicas: int = 1) -> dict[str, Any]:
    return o.build_deployment(ts, revision, SETTINGS, replicas)


def triton_container(dep: dict[str, Any]) -> dict[str, Any]:
    containers = dep["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == o.TRITON_CONTAINER)


def volume(dep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


# ----------------------------------------------------------------- labels, owners


def test_labels_with_and_without_revision() -> None:
    ts = ts_of()
    assert o.build_labels(ts, "r1") == {
        "app.kubernetes.io/name": "tritonserver",
        "app.kubernetes.io/instance": "svc",
        "app.kubernetes.io/managed-by": "triton-operator",
        "app.kubernetes.io/component": "inference-server",
        "triton-operator.io/service": "svc",
        "triton-operator.io/revision": "r1",
    }
    assert "triton-operator.io/revision" not in o.build_labels(ts)


def test_owner_reference_is_controller_with_uid() -> None:
    ref = o.build_owner_reference(body())
    assert ref == {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "name": "svc",
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    no_uid = body()
    del no_uid["metadata"]["uid"]
    assert o.build_owner_reference(no_uid)["uid"] == o.PLACEHOLDER_UID


@pytest.mark.parametrize("kind", ["configmap", "deployment", "service"])
def test_every_object_is_owned_and_labelled(kind: str) -> None:
    ts = ts_of()
    obj = {
        "configmap": lambda: o.build_configmap(ts, "r1", configs_of(ts), None),
        "deployment": lambda: deployment(ts, "r1"),
        "service": lambda: o.build_service(ts),
    }[kind]()
    assert obj["metadata"]["namespace"] == "ml"
    assert obj["metadata"]["ownerReferences"] == [o.build_owner_reference(body())]
    assert obj["metadata"]["labels"]["triton-operator.io/service"] == "svc"
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "triton-operator"


# ----------------------------------------------------------------- ConfigMap


def test_configmap_keys_and_items_place_config_pbtxt_per_model() -> None:
    models = [{"name": "m1", "config": CONFIG}, {"name": "m2", "config": CONFIG}]
    ts = ts_of(models=models)
    configs = configs_of(ts)
    cm = o.build_configmap(ts, "r1", configs, '{"pinned": true}')
    assert cm["metadata"]["name"] == "svc-r1"
    assert set(cm["data"]) == {"m1.config.pbtxt", "m2.config.pbtxt", "manifest.json", "spec.json"}
    assert 'name: "m2"' in cm["data"]["m2.config.pbtxt"]
    assert cm["data"]["manifest.json"] == '{"pinned": true}'
    items = volume(deployment(ts, "r1"), o.CONFIG_VOLUME)["configMap"]["items"]
    assert {"key": "m1.config.pbtxt", "path": "configs/m1/config.pbtxt"} in items
    assert {"key": "m2.config.pbtxt", "path": "configs/m2/config.pbtxt"} in items
    assert "spec.json" not in {item["key"] for item in items}  # kept for the operator, never mounted
    assert {"key": "manifest.json", "path": "manifest.json"} in items
    # every key an item names exists in the ConfigMap (else the pod cannot start)
    assert {i["key"] for i in items} <= set(cm["data"])


def test_configmap_without_pinned_manifest_carries_an_unpinned_one() -> None:
    ts = ts_of()
    cm = o.build_configmap(ts, "r1", configs_of(ts), None)
    manifest = manifest_from_json(cm["data"]["manifest.json"])  # what the sync container reads
    assert manifest.pinned is False
    assert manifest.repository.uri == "s3://models/prod"
    assert manifest.repository.endpoint == "http://minio:9000"
    assert [m.name for m in manifest.models] == ["m1"]


# ----------------------------------------------------------------- Deployment


def test_deployment_name_selector_and_replicas() -> None:
    ts = ts_of(replicas=5)
    dep = deployment(ts, "r1", replicas=2)
    assert dep["metadata"]["name"] == "svc-r1"
    assert dep["spec"]["replicas"] == 2  # the rollout decides, not spec.replicas
    assert dep["spec"]["selector"] == {
        "matchLabels": {"triton-operator.io/service": "svc", "triton-operator.io/revision": "r1"}
    }
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert dep["spec"]["revisionHistoryLimit"] == 0


def test_triton_args_load_each_model_then_server_args() -> None:
    ts = ts_of(
        models=[{"name": "a", "config": CONFIG}, {"name": "b", "config": CONFIG}],
        serverArgs=["--log-verbose=1"],
    )
    container = triton_container(deployment(ts))
    assert container["command"] == ["tritonserver"]
    assert container["args"] == [
        "--model-repository=/models",
        "--model-control-mode=explicit",
        "--load-model=a",
        "--load-model=b",
        "--http-port=8000",
        "--grpc-port=8001",
        "--metrics-port=8002",
        "--log-verbose=1",
    ]
    assert [(p["name"], p["containerPort"]) for p in container["ports"]] == [
        ("http", 8000),
        ("grpc", 8001),
        ("metrics", 8002),
    ]
    assert container["image"] == DEFAULT_TRITON_IMAGE


@pytest.mark.parametrize("timeout", [10, 11, 600, 1800, 3601])
def test_startup_probe_covers_startup_timeout(timeout: int) -> None:
    container = triton_container(deployment(ts_of(startupTimeoutSeconds=timeout)))
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert startup["failureThreshold"] * startup["periodSeconds"] >= timeout
    assert (startup["failureThreshold"] - 1) * startup["periodSeconds"] < timeout
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


@pytest.mark.parametrize(
    ("resources", "requests", "limits"),
    [
        ({}, None, None),
        ({"cpu": "2"}, {"cpu": "2"}, None),
        (
            {"cpu": "2", "cpuLimit": "4", "memory": "8Gi"},
            {"cpu": "2", "memory": "8Gi"},
            {"cpu": "4", "memory": "8Gi"},
        ),
        ({"gpus": 2}, {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "2"}),
        (
            {"gpus": 1, "gpuResourceName": "nvidia.com/mig-1g.10gb", "memory": "16Gi"},
            {"nvidia.com/mig-1g.10gb": "1", "memory": "16Gi"},
            {"nvidia.com/mig-1g.10gb": "1", "memory": "16Gi"},
        ),
        ({"gpus": 0, "gpuResourceName": "nvidia.com/gpu"}, None, None),
    ],
)
def test_resources(
    resources: dict[str, Any], requests: dict[str, str] | None, limits: dict[str, str] | None
) -> None:
    models = [{"name": "m1", "config": {**CONFIG, "instanceGroup": [{"kind": "KIND_AUTO"}]}}]
    container = triton_container(deployment(ts_of(resources=resources, models=models)))
    assert container.get("resources", {}).get("requests") == requests
    assert container.get("resources", {}).get("limits") == limits


@pytest.mark.parametrize("size", ["64Mi", "1Gi", "8Gi"])
def test_shm_is_memory_emptydir_of_shm_size(size: str) -> None:
    dep = deployment(ts_of(shmSize=size))
    assert volume(dep, o.SHM_VOLUME) == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in triton_container(dep)["volumeMounts"]


def test_object_store_runs_sync_init_container_with_credentials() -> None:
    ts = ts_of(
        repository={"uri": "s3://models/prod", "endpoint": "http://minio:9000", "credentialsSecret": "creds"}
    )
    dep = deployment(ts)
    pod = dep["spec"]["template"]["spec"]
    (sync,) = pod["initContainers"]
    assert sync["image"] == SETTINGS.sync_image
    assert sync["command"] + sync["args"] == [
        "triton-operator",
        "sync",
        "--manifest",
        "/etc/triton-operator/manifest.json",
        "--configs",
        "/etc/triton-operator/configs",
        "--dest",
        "/models",
    ]
    assert sync["envFrom"] == [{"secretRef": {"name": "creds"}}]
    assert {"name": "models", "mountPath": "/models"} in sync["volumeMounts"]
    assert volume(dep, "models") == {"name": "models", "emptyDir": {}}
    assert volume(dep, o.CONFIG_VOLUME)["configMap"]["name"] == "svc-abc1234567"


def test_object_store_without_secret_has_no_env_from() -> None:
    (sync,) = deployment(ts_of())["spec"]["template"]["spec"]["initContainers"]
    assert "envFrom" not in sync


@pytest.mark.parametrize(
    ("uri", "claim"),
    [("pvc://models-claim/triton/prod", "models-claim"), ("pvc://models-claim", "models-claim")],
)
def test_pvc_claim_is_linked_by_sync_at_the_same_path_in_both_containers(uri: str, claim: str) -> None:
    ts = ts_of(repository={"uri": uri, "credentialsSecret": "unused"})
    dep = deployment(ts)
    pod = dep["spec"]["template"]["spec"]
    (sync,) = pod["initContainers"]
    assert sync["args"][-2:] == ["--pvc-root", "/repository"]
    assert "envFrom" not in sync  # a claim needs no store credentials
    assert volume(dep, "repository") == {
        "name": "repository",
        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
    }
    assert volume(dep, "models") == {"name": "models", "emptyDir": {}}
    mount = {"name": "repository", "mountPath": "/repository", "readOnly": True}
    assert mount in sync["volumeMounts"]
    assert mount in triton_container(dep)["volumeMounts"]  # links resolve in tritonserver too
    cm = o.build_configmap(ts, "abc1234567", configs_of(ts), None)
    manifest = json.loads(cm["data"]["manifest.json"])
    assert manifest["pinned"] is False
    assert manifest["repository"]["uri"] == uri


def test_object_store_has_no_claim_volume() -> None:
    dep = deployment(ts_of())
    assert all(v["name"] != "repository" for v in dep["spec"]["template"]["spec"]["volumes"])
    assert all(m["name"] != "repository" for m in triton_container(dep)["volumeMounts"])


def test_scheduling_and_extras_pass_through() -> None:
    ts = ts_of(
        nodeSelector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
        },
        env=[{"name": "FOO", "value": "bar"}],
        volumes=[{"name": "extra", "emptyDir": {}}],
        volumeMounts=[{"name": "extra", "mountPath": "/extra"}],
        podAnnotations={"a": "b", "prometheus.io/path": "/custom"},
        podLabels={"team": "ml", "triton-operator.io/service": "hijack"},
        serviceAccountName="triton",
        priorityClassName="high",
        imagePullSecrets=["ngc"],
        imagePullPolicy="IfNotPresent",
        image="my/triton:1",
    )
    dep = deployment(ts, "r1")
    template = dep["spec"]["template"]
    pod = template["spec"]
    container = triton_container(dep)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "nodeAffinity" in pod["affinity"]
    assert pod["serviceAccountName"] == "triton"
    assert pod["priorityClassName"] == "high"
    assert pod["imagePullSecrets"] == [{"name": "ngc"}]
    assert container["env"] == [{"name": "FOO", "value": "bar"}]
    assert container["image"] == "my/triton:1"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert {"name": "extra", "emptyDir": {}} in pod["volumes"]
    assert {"name": "extra", "mountPath": "/extra"} in container["volumeMounts"]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8002"
    assert annotations["prometheus.io/path"] == "/custom"  # the user's annotation wins
    assert annotations["a"] == "b"
    labels = template["metadata"]["labels"]
    assert labels["team"] == "ml"
    assert labels["triton-operator.io/service"] == "svc"  # ours win: selectors depend on them


def test_no_scrape_annotations_when_disabled() -> None:
    dep = o.build_deployment(ts_of(), "r1", Settings(prometheus_scrape=False), 1)
    assert "prometheus.io/scrape" not in dep["spec"]["template"]["metadata"].get("annotations", {})


# ----------------------------------------------------------------- Service


def test_service_selects_all_revisions() -> None:
    svc = o.build_service(ts_of(service={"type": "LoadBalancer", "annotations": {"x": "y"}}))
    assert svc["metadata"]["name"] == "svc"
    assert svc["metadata"]["annotations"] == {"x": "y"}
    assert svc["spec"]["type"] == "LoadBalancer"
    assert svc["spec"]["selector"] == {"triton-operator.io/service": "svc"}
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert {n: p["port"] for n, p in ports.items()} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert {n: p["targetPort"] for n, p in ports.items()} == {
        "http": "http",
        "grpc": "grpc",
        "metrics": "metrics",
    }
    assert ports["grpc"]["appProtocol"] == "kubernetes.io/h2c"


# ----------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"serverArgs": ["--model-repository=/x"]}, "spec.serverArgs[0]"),
        ({"serverArgs": ["--not-a-flag"]}, "spec.serverArgs[0]"),
        ({"models": [{"name": "m1", "config": {**CONFIG, "maxBatchSizee": 4}}]}, "spec.models[0].config"),
        (
            {
                "models": [
                    {
                        "name": "ens",
                        "config": {
                            "platform": "ensemble",
                            "input": [{"name": "I", "dataType": "TYPE_FP32", "dims": ["4"]}],
                            "output": [{"name": "O", "dataType": "TYPE_FP32", "dims": ["4"]}],
                            "ensembleScheduling": {
                                "step": [
                                    {
                                        "modelName": "missing",
                                        "inputMap": {"IN": "I"},
                                        "outputMap": {"OUT": "O"},
                                    }
                                ]
                            },
                        },
                    }
                ]
            },
            "spec.models[0].config.ensembleScheduling.step[0].modelName",
        ),
    ],
)
def test_check_body_names_the_field(spec: dict[str, Any], field: str) -> None:
    checked = o.check_body(body(**spec))
    assert checked.problems
    assert any(p.startswith(field) for p in checked.problems), checked.problems


@pytest.mark.parametrize("name", ["Upper", "1abc", "a.b", "x" * 64])
def test_check_body_refuses_names_that_cannot_name_a_service(name: str) -> None:
    doc = body()
    doc["metadata"]["name"] = name
    checked = o.check_body(doc)
    assert any(p.startswith("metadata.name") for p in checked.problems)


def test_check_body_renders_configs_of_a_valid_spec() -> None:
    checked = o.check_body(body())
    assert checked.problems == ()
    assert checked.ts is not None
    assert 'backend: "python"' in checked.configs["m1"]


# ----------------------------------------------------------------- revisions


def revision_of(doc: dict[str, Any], settings: Settings = SETTINGS, digest: str | None = None) -> str:
    checked = o.check_body(doc)
    assert checked.ts is not None and not checked.problems, checked.problems
    return o.compute_revision(checked.ts, settings, checked.configs, digest)


SAME_REVISION = [
    ("replicas", lambda s: s.update(replicas=7)),
    ("rollout steps", lambda s: s.update(rollout={"steps": [{"setWeight": 10}, {"pause": {}}]})),
    ("service", lambda s: s.update(service={"type": "NodePort"})),
    ("poll interval", lambda s: s["repository"].update(pollIntervalSeconds=5)),
    ("default spelled out", lambda s: s.update(shmSize="1Gi")),
]
NEW_REVISION = [
    ("image", lambda s: s.update(image="my/triton:2")),
    ("server args", lambda s: s.update(serverArgs=["--log-verbose=1"])),
    ("gpus", lambda s: s.update(resources={"gpus": 1})),
    ("shm", lambda s: s.update(shmSize="2Gi")),
    ("model config", lambda s: s["models"][0]["config"].update(maxBatchSize=4)),
    ("model path", lambda s: s["models"][0].update(path="elsewhere")),
    ("uri", lambda s: s["repository"].update(uri="s3://models/other")),
    ("node selector", lambda s: s.update(nodeSelector={"a": "b"})),
    ("env", lambda s: s.update(env=[{"name": "X", "value": "1"}])),
    ("pod annotations", lambda s: s.update(podAnnotations={"a": "b"})),
    ("startup timeout", lambda s: s.update(startupTimeoutSeconds=60)),
]


def test_revision_hash_is_short_hex_and_stable() -> None:
    first = revision_of(body())
    assert len(first) == 10
    assert int(first, 16) >= 0
    assert revision_of(body()) == first
    assert revision_of(copy.deepcopy(body())) == first


@pytest.mark.parametrize(("what", "change"), SAME_REVISION, ids=[w for w, _ in SAME_REVISION])
def test_revision_ignores_what_pods_do_not_serve(what: str, change: Any) -> None:
    doc = body()
    change(doc["spec"])
    assert revision_of(doc) == revision_of(body())


@pytest.mark.parametrize(("what", "change"), NEW_REVISION, ids=[w for w, _ in NEW_REVISION])
def test_revision_changes_with_what_pods_serve(what: str, change: Any) -> None:
    doc = body()
    change(doc["spec"])
    assert revision_of(doc) != revision_of(body())


def test_revision_changes_with_manifest_and_default_image() -> None:
    base = revision_of(body())
    assert revision_of(body(), digest="d1") != base
    assert revision_of(body(), digest="d1") != revision_of(body(), digest="d2")
    assert revision_of(body(), settings=Settings(default_image="other:1")) != base
    # an explicit image makes the operator's default irrelevant
    explicit = body(image="my/triton:1")
    assert revision_of(explicit, settings=Settings(default_image="other:1")) == revision_of(explicit)


# ----------------------------------------------------------------- plan_actions (a rollout plan -> writes)


def rollout_plan(replicas: dict[str, int], delete: tuple[str, ...] = (), **kw: Any) -> RolloutPlan:
    return RolloutPlan(
        replicas=replicas,
        delete=delete,
        weights=TrafficWeights(),
        header_route=None,
        stable_service_revision=kw.pop("stable", None),
        canary_service_revision=kw.pop("canary", None),
        status=RolloutStatus(),
        conditions={},
        events=(),
        requeue_after=None,
    )


def observed_deployment(revision: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{revision}", "labels": {o.LABEL_REVISION: revision}},
        "spec": {"replicas": replicas},
    }


def observed_configmap(revision: str) -> dict[str, Any]:
    return {"metadata": {"name": f"svc-{revision}", "labels": {o.LABEL_REVISION: revision}}}


def actions(ts: TritonService, revision: str, plan: RolloutPlan, **kw: Any) -> o.Actions:
    return o.plan_actions(ts, SETTINGS, revision, plan, configs=configs_of(ts), manifest_json=None, **kw)


def test_only_the_specs_revision_is_rendered_others_only_scale() -> None:
    ts = ts_of()
    plan = rollout_plan({"old": 4, "new": 1, "hist": 0}, delete=("gone",))
    out = actions(
        ts,
        "new",
        plan,
        deployments=[
            observed_deployment("old", 4),  # already at 4: no write
            observed_deployment("hist", 2),  # a history revision goes to 0
            observed_deployment("gone", 1),
        ],
        configmaps=[observed_configmap(r) for r in ("old", "hist", "gone", "stray", "new")],
    )
    assert [(x["kind"], x["metadata"]["name"]) for x in out.apply] == [
        ("ConfigMap", "svc-new"),
        ("Deployment", "svc-new"),
        ("Service", "svc"),
    ]
    assert out.apply[1]["spec"]["replicas"] == 1
    assert out.scale == {"svc-hist": 0}
    # kept revisions keep their ConfigMaps (an undo serves the same bytes); others go
    assert out.delete == (
        ("Deployment", "svc-gone"),
        ("ConfigMap", "svc-gone"),
        ("ConfigMap", "svc-stray"),
    )


def test_spec_revision_not_planned_is_not_created() -> None:
    ts = ts_of()
    out = actions(ts, "new", rollout_plan({"old": 2}), deployments=[], configmaps=[])
    assert [x["kind"] for x in out.apply] == ["Service"]
    assert out.scale == {} and out.delete == ()


def test_gateway_api_adds_revision_services_and_removing_it_deletes_them() -> None:
    ts = ts_of(rollout={"trafficRouting": {"gatewayAPI": {"httpRoute": "r"}}})
    plan = rollout_plan({"old": 2, "new": 1}, stable="old", canary="new")
    out = actions(ts, "new", plan, deployments=[], configmaps=[])
    services = {x["metadata"]["name"]: x for x in out.apply if x["kind"] == "Service"}
    assert set(services) == {"svc", "svc-stable", "svc-canary"}
    assert services["svc-stable"]["spec"]["selector"][o.LABEL_REVISION] == "old"
    assert services["svc-canary"]["spec"]["selector"][o.LABEL_REVISION] == "new"
    assert services["svc-canary"]["metadata"]["ownerReferences"][0]["uid"] == UID
    plain = ts_of()
    kept = actions(plain, "new", plan, deployments=[], configmaps=[], revision_services=False)
    assert not any(kind == "Service" for kind, _ in kept.delete)
    dropped = actions(plain, "new", plan, deployments=[], configmaps=[], revision_services=True)
    assert ("Service", "svc-stable") in dropped.delete and ("Service", "svc-canary") in dropped.delete


def test_build_event_names_the_tritonservice() -> None:
    metadata = {"name": "svc", "namespace": "ml", "uid": UID, "resourceVersion": "42"}
    event = o.build_event(metadata, "Warning", "RolloutAborted", "x" * 2000, now="2026-01-01T00:00:00Z")
    assert event["metadata"] == {"generateName": "svc.", "namespace": "ml"}
    assert event["involvedObject"] == {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "name": "svc",
        "namespace": "ml",
        "uid": UID,
        "resourceVersion": "42",
    }
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "RolloutAborted", 1)
    assert len(event["message"]) == o.EVENT_MESSAGE_MAX
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:00:00Z"


# ----------------------------------------------------------------- observed state


def test_deployment_state_from_api_dict() -> None:
    obj = {
        "metadata": {"name": "svc-r1", "generation": 3, "labels": {"triton-operator.io/revision": "r1"}},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 3,
            "readyReplicas": 2,
            "updatedReplicas": 2,
            "availableReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
        },
    }
    s = o.deployment_state(obj)
    assert (s.name, s.revision, s.replicas, s.ready_replicas, s.generation) == ("svc-r1", "r1", 2, 2, 3)
    assert s.deadline_exceeded
    assert s.complete(2) and not s.complete(3)


def test_pod_state_unschedulable_and_failing() -> None:
    pending = {
        "metadata": {"name": "p1", "labels": {"triton-operator.io/revision": "r1"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    }
    p = o.pod_state(pending)
    assert p.unschedulable == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert not p.ready
    crashing = {
        "metadata": {"name": "p2", "labels": {"triton-operator.io/revision": "r1"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "tritonserver",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                }
            ],
        },
    }
    c = o.pod_state(crashing)
    assert c.waiting_reason == "CrashLoopBackOff"
    assert c.unschedulable is None
    ready = {"metadata": {"name": "p3"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert o.pod_state(ready).ready


def test_the_actions_render_only_the_desired_revision() -> None:
    ts = ts_of()
    out = actions(ts, "b", rollout_plan({"b": 2}), deployments=[], configmaps=[])
    assert [(x["kind"], x["metadata"]["name"]) for x in out.apply] == [
        ("ConfigMap", "svc-b"),
        ("Deployment", "svc-b"),
        ("Service", "svc"),
    ]
    only_service = actions(ts, "b", rollout_plan({}), deployments=[], configmaps=[])
    assert [x["kind"] for x in only_service.apply] == ["Service"]


# ----------------------------------------------------------------- settings feeding the builders


def test_settings_from_env() -> None:
    env = {
        "TRITON_OPERATOR_DEFAULT_IMAGE": "reg/triton:1",
        "TRITON_OPERATOR_SYNC_IMAGE": "reg/op:2",
        "TRITON_OPERATOR_NAMESPACES": "a, b,,c",
        "TRITON_OPERATOR_PEERING_NAME": "triton",
        "TRITON_OPERATOR_PEERING_PRIORITY": "7",
        "TRITON_OPERATOR_PROMETHEUS_SCRAPE": "false",
        "TRITON_OPERATOR_PIN_REPOSITORIES": "0",
        "TRITON_OPERATOR_LOG_LEVEL": "debug",
    }
    s = Settings.from_env(env)
    assert (s.default_image, s.sync_image) == ("reg/triton:1", "reg/op:2")
    assert s.namespaces == ("a", "b", "c")
    assert (s.peering_name, s.peering_priority) == ("triton", 7)
    assert s.prometheus_scrape is False and s.pin_repositories is False
    assert s.log_level == "DEBUG"
    defaults = Settings.from_env({})
    assert defaults == Settings()
    assert defaults.default_image == "nvcr.io/nvidia/tritonserver:25.01-py3"
    assert defaults.sync_image.startswith("ghcr.io/triton-operator/triton-operator:")
    assert defaults.peering_name is None and defaults.pin_repositories is True


@pytest.mark.parametrize(
    ("spec", "drain", "grace"),
    [
        ({}, 5, 5 + 30 + 5),
        ({"drainSeconds": 0}, None, 0 + 30 + 5),
        ({"drainSeconds": 20, "serverArgs": ["--exit-timeout-secs=10"]}, 20, 20 + 10 + 5),
        ({"serverArgs": ["--exit-timeout-secs", "7", "--log-verbose=0"]}, 5, 5 + 7 + 5),
        ({"serverArgs": ["--exit-timeout-secs=1", "--exit-timeout-secs=3"]}, 5, 5 + 3 + 5),
    ],
)
def test_termination_drains_then_lets_triton_finish(
    spec: dict[str, Any], drain: int | None, grace: int
) -> None:
    dep = deployment(ts_of(**spec))
    container = triton_container(dep)
    if drain is None:
        assert "lifecycle" not in container
    else:
        assert container["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", str(drain)]}}}
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace


@pytest.mark.parametrize("seconds", [-1, 601])
def test_drain_seconds_out_of_range_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match=r"drainSeconds|drain_seconds"):
        ts_of(drainSeconds=seconds)


# ----------------------------------------------------------------- PodDisruptionBudget


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ({"replicas": 1}, False),
        ({"replicas": 2}, True),
        ({"replicas": 0}, False),
        ({"replicas": 1, "disruptionBudget": {"enabled": True}}, True),
        ({"replicas": 4, "disruptionBudget": {"enabled": False}}, False),
    ],
)
def test_a_disruption_budget_by_default_when_more_than_one_replica_serves(
    spec: dict[str, Any], wanted: bool
) -> None:
    ts = ts_of(**spec)
    plan = rollout_plan({"new": ts.spec.replicas})
    out = actions(ts, "new", plan, deployments=[], configmaps=[])
    pdbs = [x for x in out.apply if x["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == int(wanted)
    assert o.disruption_budget_enabled(ts) is wanted
    rendered = actions(ts, "new", rollout_plan({}), deployments=[], configmaps=[])
    assert [x["kind"] for x in rendered.apply].count("PodDisruptionBudget") == int(wanted)


def test_the_disruption_budget_covers_every_revision_and_lets_unready_pods_go() -> None:
    ts = ts_of(replicas=3, disruptionBudget={"maxUnavailable": 2})
    pdb = o.build_pdb(ts)
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["name"] == "svc"
    assert pdb["spec"]["maxUnavailable"] == 2
    # the same pods as Service `svc`: every revision's
    assert pdb["spec"]["selector"]["matchLabels"] == o.build_service(ts)["spec"]["selector"]
    assert o.LABEL_REVISION not in pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID


def test_a_disruption_budget_no_longer_wanted_is_deleted_only_when_it_exists() -> None:
    ts = ts_of(replicas=1)
    plan = rollout_plan({"new": 1})
    assert ("PodDisruptionBudget", "svc") not in actions(
        ts, "new", plan, deployments=[], configmaps=[]
    ).delete
    gone = actions(ts, "new", plan, deployments=[], configmaps=[], disruption_budget=True)
    assert ("PodDisruptionBudget", "svc") in gone.delete


@pytest.mark.parametrize("value", [0, -1])
def test_max_unavailable_below_one_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match=r"maxUnavailable|max_unavailable"):
        ts_of(replicas=2, disruptionBudget={"maxUnavailable": value})


# ----------------------------------------------------------------- who Service `<name>` reaches


@pytest.mark.parametrize(
    ("rollout", "only_stable"),
    [
        ({}, False),
        ({"strategy": "Canary", "steps": [{"setWeight": 20}]}, False),
        ({"strategy": "Recreate"}, False),
        ({"strategy": "BlueGreen"}, True),
        ({"strategy": "Canary", "trafficRouting": {"gatewayAPI": {"httpRoute": "r"}}}, True),
    ],
)
def test_the_service_reaches_only_the_revisions_meant_to_serve(
    rollout: dict[str, Any], only_stable: bool
) -> None:
    ts = ts_of(rollout=rollout)
    plan = rollout_plan({"blue": 2, "green": 2}, stable="blue", canary="green")
    (svc,) = [
        x
        for x in actions(ts, "green", plan, deployments=[], configmaps=[]).apply
        if x["metadata"]["name"] == "svc"
    ]
    selector = svc["spec"]["selector"]
    assert selector.get(o.LABEL_REVISION) == ("blue" if only_stable else None)
    assert selector[o.LABEL_SERVICE] == "svc"
    # before any revision is stable (the first one rolling out) it reaches every revision
    first = rollout_plan({"green": 2}, stable=None, canary="green")
    (svc,) = [
        x
        for x in actions(ts, "green", first, deployments=[], configmaps=[]).apply
        if x["metadata"]["name"] == "svc"
    ]
    assert o.LABEL_REVISION not in svc["spec"]["selector"]


# ----------------------------------------------------------------- operator upgrades


def test_the_sync_image_is_not_part_of_the_revision() -> None:
    ts = ts_of()
    configs = configs_of(ts)
    old = Settings(sync_image="ghcr.io/triton-operator/triton-operator:0.1.0")
    new = Settings(
        sync_image="ghcr.io/triton-operator/triton-operator:0.2.0", sync_image_pull_policy="Always"
    )
    assert o.compute_revision(ts, old, configs, None) == o.compute_revision(ts, new, configs, None)
    # what a pod serves still makes a new revision
    other_triton = Settings(default_image="nvcr.io/nvidia/tritonserver:25.02-py3")
    assert o.compute_revision(ts, old, configs, None) != o.compute_revision(ts, other_triton, configs, None)


def test_an_existing_revision_keeps_its_sync_image_and_a_new_one_gets_the_operators() -> None:
    ts = ts_of()
    running = deployment(ts, "rev1")  # created by the old operator

    def sync_of(dep: dict[str, Any]) -> dict[str, Any]:
        return next(
            c for c in dep["spec"]["template"]["spec"]["initContainers"] if c["name"] == o.SYNC_CONTAINER
        )

    sync_of(running)["image"] = "ghcr.io/triton-operator/triton-operator:0.1.0"
    sync_of(running)["imagePullPolicy"] = "Always"  # set by the old operator's settings
    upgraded = Settings(
        sync_image="ghcr.io/triton-operator/triton-operator:0.2.0", sync_image_pull_policy="Never"
    )

    out = o.plan_actions(
        ts,
        upgraded,
        "rev1",
        rollout_plan({"rev1": 1}),
        configs=configs_of(ts),
        manifest_json=None,
        deployments=[{**running, "metadata": {**running["metadata"]}}],
        configmaps=[],
    )
    (dep,) = [x for x in out.apply if x["kind"] == "Deployment"]
    assert dep["spec"]["template"] == running["spec"]["template"]  # no pod restarts
    fresh = o.plan_actions(
        ts,
        upgraded,
        "rev2",
        rollout_plan({"rev1": 1, "rev2": 1}),
        configs=configs_of(ts),
        manifest_json=None,
        deployments=[running],
        configmaps=[],
    )
    (dep2,) = [x for x in fresh.apply if x["kind"] == "Deployment"]
    assert sync_of(dep2)["image"].endswith(":0.2.0") and sync_of(dep2)["imagePullPolicy"] == "Never"


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("ghcr.io/triton-operator/triton-operator:0.1.0", "IfNotPresent"),
        ("ghcr.io/triton-operator/triton-operator:latest", "Always"),
        ("ghcr.io/triton-operator/triton-operator", "Always"),
        ("localhost:5000/op", "Always"),
        ("localhost:5000/op:1", "IfNotPresent"),
        ("reg/op@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_default_pull_policy_is_kubernetes_own(image: str, policy: str) -> None:
    assert o.default_pull_policy(image) == policy


def test_reapplying_a_revision_with_a_defaulted_pull_policy_leaves_the_template_as_written() -> None:
    """The API server adds imagePullPolicy to what the operator wrote without one: re-rendering the
    running revision must not claim that field (a write to a Deployment that should stay untouched)."""
    ts = ts_of()
    written = deployment(ts, "rev1")
    stored = copy.deepcopy(written)
    for c in stored["spec"]["template"]["spec"]["initContainers"]:
        c["imagePullPolicy"] = "IfNotPresent"  # the API server's default for a tagged image
    out = o.plan_actions(
        ts,
        SETTINGS,
        "rev1",
        rollout_plan({"rev1": 1}),
        configs=configs_of(ts),
        manifest_json=None,
        deployments=[stored],
        configmaps=[],
    )
    (dep,) = [x for x in out.apply if x["kind"] == "Deployment"]
    assert dep["spec"]["template"] == written["spec"]["template"]


# ----------------------------------------------------------------- adoption by owner


def owned_by(uid: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [{"uid": uid, "controller": True, "kind": "TritonService"}]
    return out


def pod_of(revision: str) -> dict[str, Any]:
    return {"metadata": {"name": f"svc-{revision}-x", "labels": {o.LABEL_REVISION: revision}}}


def test_objects_of_a_deleted_tritonservice_with_the_same_name_are_not_adopted() -> None:
    old_uid, new_uid = "old-uid", UID
    deployments = [
        owned_by(old_uid, observed_deployment("a", 2)),
        owned_by(new_uid, observed_deployment("b", 1)),
    ]
    configmaps = [owned_by(old_uid, observed_configmap("a")), owned_by(new_uid, observed_configmap("b"))]
    adoption = o.split_by_owner(new_uid, deployments, configmaps, [pod_of("a"), pod_of("a"), pod_of("b")])
    assert [o._revision_of(d) for d in adoption.deployments] == ["b"]
    assert [o._revision_of(c) for c in adoption.configmaps] == ["b"]
    assert [p["metadata"]["labels"][o.LABEL_REVISION] for p in adoption.pods] == ["b"]
    assert adoption.foreign == ("svc-a", "svc-a")
    # a non-controller reference is not ownership either
    weak = copy.deepcopy(deployments[1])
    weak["metadata"]["ownerReferences"][0]["controller"] = False
    assert o.split_by_owner(new_uid, [weak], [], []).deployments == []


# ----------------------------------------------------------------- the last valid spec


def test_the_stored_spec_renders_the_same_revision_and_configs() -> None:
    ts = ts_of(
        replicas=3,
        rollout={"steps": [{"setWeight": 20}, {"pause": {"durationSeconds": 30}}]},
        resources={"cpu": 2},
    )
    configs = configs_of(ts)
    cm = o.build_configmap(ts, "r1", configs, None)
    last = o.last_valid(ts.metadata, {"stableRevision": "r1"}, [cm])
    assert last is not None
    assert last.revision == "r1"
    kept = o.check_body(last.body)
    assert kept.ts is not None and not kept.problems
    assert kept.ts.spec == ts.spec
    assert kept.configs == configs
    assert o.compute_revision(kept.ts, SETTINGS, kept.configs, None) == o.compute_revision(
        ts, SETTINGS, configs, None
    )
    assert last.manifest_json == cm["data"]["manifest.json"]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"stableRevision": "a"}, "a"),
        ({"stableRevision": "a", "canaryRevision": "b"}, "b"),
        ({"stableRevision": "a", "abortedRevision": "c"}, "c"),
        # An undo pin waits for "d", whose ConfigMap is gone: the rollback target's spec is next.
        ({"stableRevision": "a", "canaryRevision": "b", "pinnedFor": "d"}, "b"),
        ({"stableRevision": "x"}, None),
        ({}, None),
    ],
)
def test_last_valid_follows_the_revision_the_last_spec_asked_for(
    status: dict[str, str], expected: str | None
) -> None:
    maps = [o.build_configmap(ts_of(replicas=i + 1), rev, {}, None) for i, rev in enumerate("abc")]
    last = o.last_valid({"name": "svc"}, status, maps)
    assert (last.revision if last else None) == expected
    if last is not None:
        assert last.body["metadata"] == {"name": "svc"}
        assert last.body["spec"]["replicas"] == "abc".index(expected) + 1  # type: ignore[arg-type]


def test_last_valid_skips_a_configmap_without_a_spec() -> None:
    old = o.build_configmap(ts_of(), "b", {}, None)
    del old["data"]["spec.json"]  # rendered by an operator that did not keep specs
    stable = o.build_configmap(ts_of(), "a", {}, None)
    last = o.last_valid({}, {"stableRevision": "a", "canaryRevision": "b"}, [old, stable])
    assert last is not None and last.revision == "a"

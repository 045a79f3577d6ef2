"""core.objects.builders: labels, owner references, ConfigMaps, Deployment and pod template, Service, PDB,
Events."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from triton_operator.core.objects.builders import (
    EVENT_MESSAGE_MAX,
    PLAIN,
    ManifestLayout,
    build_configmap,
    build_event,
    build_labels,
    build_owner_reference,
    build_pdb,
    build_pod_metadata,
    build_pod_security,
    build_pod_template,
    build_scheduling,
    build_service,
    build_sync_container,
    build_triton_container,
    build_volumes,
    compute_revision,
    read_settings_record,
    settings_record,
    termination_grace_seconds,
)
from triton_operator.core.objects.names import CONFIG_VOLUME, LABEL_REVISION, PLACEHOLDER_UID, SHM_VOLUME
from triton_operator.core.observed.observation import check_body
from triton_operator.core.repository.manifest import manifest_from_json
from triton_operator.settings import DEFAULT_TRITON_IMAGE, Settings
from tritonservice_bodies import (
    CONFIG,
    OLDER_SHAPE,
    UID,
    body,
    configs_of,
    deployment,
    triton_container,
    ts_of,
    volume,
)

SETTINGS = OLDER_SHAPE
"""The sync init container's pod, which revisions made before one pod shape keep (tests/unit/core/
test_one_pod_shape.py has the pod of revisions made now)."""

# ----------------------------------------------------------------- labels, owners


def test_labels_with_and_without_revision() -> None:
    ts = ts_of()
    assert build_labels(ts, "r1") == {
        "app.kubernetes.io/name": "tritonserver",
        "app.kubernetes.io/instance": "svc",
        "app.kubernetes.io/managed-by": "triton-operator",
        "app.kubernetes.io/component": "inference-server",
        "triton-operator.io/service": "svc",
        "triton-operator.io/revision": "r1",
    }
    assert "triton-operator.io/revision" not in build_labels(ts)


def test_owner_reference_is_controller_with_uid() -> None:
    ref = build_owner_reference(body())
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
    assert build_owner_reference(no_uid)["uid"] == PLACEHOLDER_UID


@pytest.mark.parametrize("kind", ["configmap", "deployment", "service"])
def test_every_object_is_owned_and_labelled(kind: str) -> None:
    ts = ts_of()
    obj = {
        "configmap": lambda: build_configmap(ts, "r1", configs_of(ts), None),
        "deployment": lambda: deployment(ts, "r1"),
        "service": lambda: build_service(ts),
    }[kind]()
    assert obj["metadata"]["namespace"] == "ml"
    assert obj["metadata"]["ownerReferences"] == [build_owner_reference(body())]
    assert obj["metadata"]["labels"]["triton-operator.io/service"] == "svc"
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "triton-operator"


# ----------------------------------------------------------------- ConfigMap


def test_configmap_keys_and_items_place_config_pbtxt_per_model() -> None:
    models = [{"name": "m1", "config": CONFIG}, {"name": "m2", "config": CONFIG}]
    ts = ts_of(models=models)
    configs = configs_of(ts)
    cm = build_configmap(ts, "r1", configs, '{"pinned": true}')
    assert cm["metadata"]["name"] == "svc-r1"
    assert set(cm["data"]) == {"m1.config.pbtxt", "m2.config.pbtxt", "manifest.json", "spec.json"}
    assert 'name: "m2"' in cm["data"]["m2.config.pbtxt"]
    assert cm["data"]["manifest.json"] == '{"pinned": true}'
    items = volume(deployment(ts, "r1"), CONFIG_VOLUME)["configMap"]["items"]
    assert {"key": "m1.config.pbtxt", "path": "configs/m1/config.pbtxt"} in items
    assert {"key": "m2.config.pbtxt", "path": "configs/m2/config.pbtxt"} in items
    assert "spec.json" not in {item["key"] for item in items}  # kept for the operator, never mounted
    assert {"key": "manifest.json", "path": "manifest.json"} in items
    # every key an item names exists in the ConfigMap (else the pod cannot start)
    assert {i["key"] for i in items} <= set(cm["data"])


def test_configmap_without_pinned_manifest_carries_an_unpinned_one() -> None:
    ts = ts_of()
    cm = build_configmap(ts, "r1", configs_of(ts), None)
    manifest = manifest_from_json(cm["data"]["manifest.json"])  # what the sync container reads
    assert manifest.pinned is False
    assert manifest.repository.uri == "s3://models/prod"
    assert manifest.repository.endpoint == "http://minio:9000"
    assert [m.name for m in manifest.models] == ["m1"]


@pytest.mark.parametrize("uri", ["pvc://models-claim/triton/prod", "pvc://models-claim"])
def test_a_claims_configmap_carries_an_unpinned_manifest_of_the_claim(uri: str) -> None:
    ts = ts_of(repository={"uri": uri, "credentialsSecret": "unused"})
    cm = build_configmap(ts, "abc1234567", configs_of(ts), None)
    manifest = json.loads(cm["data"]["manifest.json"])
    assert manifest["pinned"] is False
    assert manifest["repository"]["uri"] == uri


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


# ----------------------------------------------------------------- the pod template, piece by piece

REVISION = "abc1234567"
CLAIMS = [("pvc://models-claim/triton/prod", "models-claim"), ("pvc://models-claim", "models-claim")]
CLAIM_MOUNT = {"name": "repository", "mountPath": "/repository", "readOnly": True}
"""Both containers mount a pvc:// repository at the same path: sync's links resolve in tritonserver."""
EXTRAS: dict[str, Any] = {
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    },
    "env": [{"name": "FOO", "value": "bar"}],
    "volumes": [{"name": "extra", "emptyDir": {}}],
    "volumeMounts": [{"name": "extra", "mountPath": "/extra"}],
    "podAnnotations": {"a": "b", "prometheus.io/path": "/custom"},
    "podLabels": {"team": "ml", "triton-operator.io/service": "hijack"},
    "serviceAccountName": "triton",
    "priorityClassName": "high",
    "imagePullSecrets": ["ngc"],
    "imagePullPolicy": "IfNotPresent",
    "image": "my/triton:1",
}
"""A spec setting every field the pod template passes through."""


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


class TestVolumes:
    """build_volumes: /models, shared memory, configs and manifest, the claim, the spec's volumes."""

    @pytest.mark.parametrize("size", ["64Mi", "1Gi", "8Gi"])
    def test_shm_is_memory_emptydir_of_shm_size(self, size: str) -> None:
        volumes = build_volumes(ts_of(shmSize=size), REVISION, PLAIN)
        assert named(volumes, SHM_VOLUME) == {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": size},
        }

    def test_object_store_fills_an_empty_dir_and_mounts_the_revisions_configmap(self) -> None:
        volumes = build_volumes(ts_of(), REVISION, PLAIN)
        assert named(volumes, "models") == {"name": "models", "emptyDir": {}}
        assert named(volumes, CONFIG_VOLUME)["configMap"]["name"] == "svc-abc1234567"
        assert all(v["name"] != "repository" for v in volumes)  # no claim

    @pytest.mark.parametrize(
        ("model_volume", "empty_dir"),
        [
            ({"sizeLimit": "40Gi"}, {"sizeLimit": "40Gi"}),
            ({"sizeLimit": "2Gi", "medium": "Memory"}, {"medium": "Memory", "sizeLimit": "2Gi"}),
            ({}, {}),
        ],
    )
    def test_model_volume_sizes_the_models_empty_dir_and_tells_sync(
        self, model_volume: dict[str, str], empty_dir: dict[str, str]
    ) -> None:
        ts = ts_of(modelVolume=model_volume)
        assert named(build_volumes(ts, REVISION, PLAIN), "models") == {
            "name": "models",
            "emptyDir": empty_dir,
        }
        args = build_sync_container(ts, SETTINGS, PLAIN)["args"]
        limit = model_volume.get("sizeLimit")
        if limit:
            assert args[args.index("--volume-limit") + 1] == limit
        else:
            assert "--volume-limit" not in args

    @pytest.mark.parametrize(
        ("value", "error"),
        [
            ({"sizeLimit": "0"}, "spec.modelVolume.sizeLimit: '0' must be more than 0 bytes"),
            ({"sizeLimit": "20GB"}, "spec.modelVolume.sizeLimit: String should match pattern"),
            ({"sizeLimit": "1.2.3"}, "spec.modelVolume.sizeLimit: '1.2.3' is not a quantity of bytes"),
            ({"medium": "Disk"}, "spec.modelVolume.medium: Input should be 'Memory'"),
        ],
    )
    def test_a_bad_model_volume_is_refused_naming_the_field(self, value: dict[str, str], error: str) -> None:
        doc = body()
        doc["spec"]["modelVolume"] = value
        problems = check_body(doc).problems
        assert len(problems) == 1 and problems[0].startswith(error), problems

    @pytest.mark.parametrize(("uri", "claim"), CLAIMS)
    def test_pvc_claim_is_mounted_read_only(self, uri: str, claim: str) -> None:
        volumes = build_volumes(
            ts_of(repository={"uri": uri, "credentialsSecret": "unused"}), REVISION, PLAIN
        )
        assert named(volumes, "repository") == {
            "name": "repository",
            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
        }
        assert named(volumes, "models") == {"name": "models", "emptyDir": {}}

    def test_the_specs_volumes_pass_through(self) -> None:
        assert {"name": "extra", "emptyDir": {}} in build_volumes(ts_of(**EXTRAS), REVISION, PLAIN)


class TestTritonContainer:
    """build_triton_container: command, ports, probes, resources, mounts and the spec's extras."""

    def test_triton_args_load_each_model_then_server_args(self) -> None:
        ts = ts_of(
            models=[{"name": "a", "config": CONFIG}, {"name": "b", "config": CONFIG}],
            serverArgs=["--log-verbose=1"],
        )
        container = build_triton_container(ts, SETTINGS)
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
    def test_startup_probe_covers_startup_timeout(self, timeout: int) -> None:
        container = build_triton_container(ts_of(startupTimeoutSeconds=timeout), SETTINGS)
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
        self, resources: dict[str, Any], requests: dict[str, str] | None, limits: dict[str, str] | None
    ) -> None:
        models = [{"name": "m1", "config": {**CONFIG, "instanceGroup": [{"kind": "KIND_AUTO"}]}}]
        container = build_triton_container(ts_of(resources=resources, models=models), SETTINGS)
        assert container.get("resources", {}).get("requests") == requests
        assert container.get("resources", {}).get("limits") == limits

    def test_shared_memory_is_mounted_at_dev_shm(self) -> None:
        assert {"name": "dshm", "mountPath": "/dev/shm"} in build_triton_container(ts_of(), SETTINGS)[
            "volumeMounts"
        ]

    @pytest.mark.parametrize(("uri", "claim"), CLAIMS)
    def test_pvc_claim_is_mounted_where_sync_links_into_it(self, uri: str, claim: str) -> None:
        container = build_triton_container(ts_of(repository={"uri": uri}), SETTINGS)
        assert CLAIM_MOUNT in container["volumeMounts"]  # links resolve in tritonserver too

    def test_object_store_has_no_claim_mount(self) -> None:
        assert all(
            m["name"] != "repository" for m in build_triton_container(ts_of(), SETTINGS)["volumeMounts"]
        )

    def test_the_specs_extras_pass_through(self) -> None:
        container = build_triton_container(ts_of(**EXTRAS), SETTINGS)
        assert container["env"] == [{"name": "FOO", "value": "bar"}]
        assert container["image"] == "my/triton:1"
        assert container["imagePullPolicy"] == "IfNotPresent"
        assert {"name": "extra", "mountPath": "/extra"} in container["volumeMounts"]


class TestSyncContainer:
    """build_sync_container: `triton-operator sync` with the manifest, the configs and the store's access."""

    def test_object_store_runs_sync_init_container_with_credentials(self) -> None:
        ts = ts_of(
            repository={
                "uri": "s3://models/prod",
                "endpoint": "http://minio:9000",
                "credentialsSecret": "creds",
            }
        )
        sync = build_sync_container(ts, SETTINGS, PLAIN)
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

    def test_object_store_without_secret_has_no_env_from(self) -> None:
        assert "envFrom" not in build_sync_container(ts_of(), SETTINGS, PLAIN)

    @pytest.mark.parametrize(("uri", "claim"), CLAIMS)
    def test_pvc_claim_is_linked_by_sync(self, uri: str, claim: str) -> None:
        sync = build_sync_container(
            ts_of(repository={"uri": uri, "credentialsSecret": "unused"}), SETTINGS, PLAIN
        )
        assert sync["args"][-2:] == ["--pvc-root", "/repository"]
        assert "envFrom" not in sync  # a claim needs no store credentials
        assert CLAIM_MOUNT in sync["volumeMounts"]


class TestScheduling:
    """build_scheduling: service account, priority, pull secrets, node selector, tolerations, affinity."""

    def test_scheduling_passes_through(self) -> None:
        pod = build_scheduling(ts_of(**EXTRAS))
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert "nodeAffinity" in pod["affinity"]
        assert pod["serviceAccountName"] == "triton"
        assert pod["priorityClassName"] == "high"
        assert pod["imagePullSecrets"] == [{"name": "ngc"}]

    def test_only_what_the_spec_sets(self) -> None:
        assert build_scheduling(ts_of()) == {}


class TestPodMetadata:
    """build_pod_metadata: our labels over the spec's; scrape hints under the spec's annotations."""

    def test_the_specs_labels_and_annotations_pass_through_and_ours_win(self) -> None:
        metadata = build_pod_metadata(ts_of(**EXTRAS), "r1", SETTINGS)
        annotations = metadata["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "8002"
        assert annotations["prometheus.io/path"] == "/custom"  # the user's annotation wins
        assert annotations["a"] == "b"
        labels = metadata["labels"]
        assert labels["team"] == "ml"
        assert labels["triton-operator.io/service"] == "svc"  # ours win: selectors depend on them

    def test_no_scrape_annotations_when_disabled(self) -> None:
        metadata = build_pod_metadata(ts_of(), "r1", Settings(prometheus_scrape=False))
        assert "prometheus.io/scrape" not in metadata.get("annotations", {})


class TestPodSecurity:
    """build_pod_security and the containers' securityContext: Pod Security `restricted` by default,
    the spec's own contexts for images that need them, and nothing new for an older revision."""

    def test_restricted_by_default(self) -> None:
        ts = ts_of()
        pod = build_pod_security(ts, SETTINGS)
        assert pod == {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "automountServiceAccountToken": False,
        }
        triton = build_triton_container(ts, SETTINGS)["securityContext"]
        assert triton == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
        sync = build_sync_container(ts, SETTINGS, PLAIN)["securityContext"]
        assert sync == {**triton, "readOnlyRootFilesystem": True}

    def test_the_spec_replaces_the_defaults(self) -> None:
        ts = ts_of(
            podSecurityContext={"runAsUser": 0, "runAsNonRoot": False},
            securityContext={"privileged": False, "runAsUser": 0},
            automountServiceAccountToken=True,
        )
        pod = build_pod_security(ts, SETTINGS)
        assert pod == {
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            "automountServiceAccountToken": True,
        }
        assert build_triton_container(ts, SETTINGS)["securityContext"] == {
            "privileged": False,
            "runAsUser": 0,
        }
        # the sync container is the operator's: it stays restricted
        assert build_sync_container(ts, SETTINGS, PLAIN)["securityContext"]["capabilities"] == {
            "drop": ["ALL"]
        }

    def test_the_defaults_are_not_shared_objects(self) -> None:
        first = build_pod_security(ts_of(), SETTINGS)
        first["securityContext"]["seccompProfile"]["type"] = "Unconfined"
        assert build_pod_security(ts_of(), SETTINGS)["securityContext"]["seccompProfile"] == {
            "type": "RuntimeDefault"
        }

    def test_an_older_revision_keeps_its_pods_as_they_were(self) -> None:
        """Settings(pod_security_defaults=False) is what kept_pod_security gives a revision made
        before the defaults: its template gets none, so an operator upgrade restarts no pod."""
        ts = ts_of()
        older = Settings(pod_security_defaults=False)
        assert build_pod_security(ts, older) == {}
        assert "securityContext" not in build_triton_container(ts, older)
        assert "securityContext" not in build_sync_container(ts, older, PLAIN)

    def test_the_defaults_do_not_change_the_revision_hash(self) -> None:
        """Added with defaults, the new fields keep every existing revision's hash."""
        assert compute_revision(ts_of(), SETTINGS, {}, None) == compute_revision(
            ts_of(), Settings(pod_security_defaults=False, agent_pods=False), {}, None
        )
        assert compute_revision(ts_of(), SETTINGS, {}, None) != compute_revision(
            ts_of(automountServiceAccountToken=True), SETTINGS, {}, None
        )


class TestPodTemplate:
    """build_pod_template: the pieces put together, and the termination that spans them."""

    @pytest.mark.parametrize("layout", [PLAIN, ManifestLayout(3)], ids=["plain", "parts"])
    @pytest.mark.parametrize(
        "spec", [{}, {**EXTRAS, "repository": {"uri": "pvc://models-claim"}}], ids=["s3", "pvc"]
    )
    def test_is_made_of_the_pieces(self, spec: dict[str, Any], layout: ManifestLayout) -> None:
        ts = ts_of(**spec)
        template = build_pod_template(ts, "r1", SETTINGS, layout)
        assert template == {
            "metadata": build_pod_metadata(ts, "r1", SETTINGS),
            "spec": {
                "containers": [build_triton_container(ts, SETTINGS)],
                "volumes": build_volumes(ts, "r1", layout),
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": termination_grace_seconds(ts),
                "initContainers": [build_sync_container(ts, SETTINGS, layout)],
                **build_pod_security(ts, SETTINGS),
                **build_scheduling(ts),
            },
        }
        assert deployment(ts, "r1", settings=SETTINGS)["spec"]["template"] == build_pod_template(
            ts, "r1", SETTINGS
        )

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
        self, spec: dict[str, Any], drain: int | None, grace: int
    ) -> None:
        dep = deployment(ts_of(**spec))
        container = triton_container(dep)
        if drain is None:
            assert "lifecycle" not in container
        else:
            assert container["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", str(drain)]}}}
        assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace


# ----------------------------------------------------------------- Service


def test_service_selects_all_revisions() -> None:
    svc = build_service(ts_of(service={"type": "LoadBalancer", "annotations": {"x": "y"}}))
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


# ----------------------------------------------------------------- revisions


def revision_of(doc: dict[str, Any], settings: Settings = SETTINGS, digest: str | None = None) -> str:
    checked = check_body(doc)
    assert checked.ts is not None and not checked.problems, checked.problems
    return compute_revision(checked.ts, settings, checked.configs, digest)


def _pooled(spec: dict[str, Any]) -> None:
    """A pool switched on: its pods' agents read their assignment (a volume item and a flag), so new
    pods; where it places models is decided per pass (test_pool_pod: repacking makes none)."""
    spec["pool"] = {"memoryPerPod": "4Gi"}
    for model in spec["models"]:
        model.update(memory="100Mi", minCopies=1, maxCopies=1)


SAME_REVISION = [
    ("replicas", lambda s: s.update(replicas=7)),
    ("rollout steps", lambda s: s.update(rollout={"steps": [{"setWeight": 10}, {"pause": {}}]})),
    ("service", lambda s: s.update(service={"type": "NodePort"})),
    ("poll interval", lambda s: s["repository"].update(pollIntervalSeconds=5)),
    ("default spelled out", lambda s: s.update(shmSize="1Gi")),
    ("model volume unset", lambda s: s.update(modelVolume=None)),
    ("model volume empty", lambda s: s.update(modelVolume={})),
]

NEW_REVISION = [
    ("image", lambda s: s.update(image="my/triton:2")),
    ("server args", lambda s: s.update(serverArgs=["--log-verbose=1"])),
    ("gpus", lambda s: s.update(resources={"gpus": 1})),
    ("shm", lambda s: s.update(shmSize="2Gi")),
    ("model volume size", lambda s: s.update(modelVolume={"sizeLimit": "40Gi"})),
    ("model config", lambda s: s["models"][0]["config"].update(maxBatchSize=4)),
    ("model path", lambda s: s["models"][0].update(path="elsewhere")),
    ("uri", lambda s: s["repository"].update(uri="s3://models/other")),
    ("node selector", lambda s: s.update(nodeSelector={"a": "b"})),
    ("env", lambda s: s.update(env=[{"name": "X", "value": "1"}])),
    ("pod annotations", lambda s: s.update(podAnnotations={"a": "b"})),
    ("startup timeout", lambda s: s.update(startupTimeoutSeconds=60)),
    ("pool switched on", _pooled),
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
    assert revision_of(body(), settings=Settings(default_image="other:1", agent_pods=False)) != base
    # an explicit image makes the operator's default irrelevant
    explicit = body(image="my/triton:1")
    assert revision_of(explicit, settings=Settings(default_image="other:1", agent_pods=False)) == revision_of(
        explicit
    )


# ----------------------------------------------------------------- Events


def test_build_event_names_the_tritonservice() -> None:
    metadata = {"name": "svc", "namespace": "ml", "uid": UID, "resourceVersion": "42"}
    event = build_event(metadata, "Warning", "RolloutAborted", "x" * 2000, now="2026-01-01T00:00:00Z")
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
    assert len(event["message"]) == EVENT_MESSAGE_MAX
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-01-01T00:00:00Z"


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


@pytest.mark.parametrize("seconds", [-1, 601])
def test_drain_seconds_out_of_range_is_refused(seconds: int) -> None:
    with pytest.raises(ValueError, match=r"drainSeconds|drain_seconds"):
        ts_of(drainSeconds=seconds)


# ----------------------------------------------------------------- PodDisruptionBudget


def test_the_disruption_budget_covers_every_revision_and_lets_unready_pods_go() -> None:
    ts = ts_of(replicas=3, disruptionBudget={"maxUnavailable": 2})
    pdb = build_pdb(ts)
    assert pdb["apiVersion"] == "policy/v1" and pdb["metadata"]["name"] == "svc"
    assert pdb["spec"]["maxUnavailable"] == 2
    # the same pods as Service `svc`: every revision's
    assert pdb["spec"]["selector"]["matchLabels"] == build_service(ts)["spec"]["selector"]
    assert LABEL_REVISION not in pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == UID


@pytest.mark.parametrize("value", [0, -1])
def test_max_unavailable_below_one_is_refused(value: int) -> None:
    with pytest.raises(ValueError, match=r"maxUnavailable|max_unavailable"):
        ts_of(replicas=2, disruptionBudget={"maxUnavailable": value})


# ----------------------------------------------------------------- operator upgrades


def test_the_sync_image_is_not_part_of_the_revision() -> None:
    ts = ts_of()
    configs = configs_of(ts)
    old = Settings(sync_image="ghcr.io/triton-operator/triton-operator:0.1.0")
    new = Settings(
        sync_image="ghcr.io/triton-operator/triton-operator:0.2.0", sync_image_pull_policy="Always"
    )
    assert compute_revision(ts, old, configs, None) == compute_revision(ts, new, configs, None)
    # what a pod serves still makes a new revision
    other_triton = Settings(default_image="nvcr.io/nvidia/tritonserver:25.02-py3")
    assert compute_revision(ts, old, configs, None) != compute_revision(ts, other_triton, configs, None)


def test_the_sync_container_keeps_its_log_tail_when_it_dies_without_a_message() -> None:
    """A sync killed before writing /dev/termination-log (OOM, SIGKILL) still says why, as
    tritonserver does; a revision recorded before the operator set it renders without (no restart)."""
    ts = ts_of()
    sync = build_sync_container(ts, SETTINGS, PLAIN)
    assert sync["terminationMessagePolicy"] == "FallbackToLogsOnError"
    record = json.loads(settings_record(SETTINGS))
    assert record["syncLogOnExit"] is True
    del record["syncLogOnExit"]  # a record written before the operator set it
    older = read_settings_record(json.dumps(record), SETTINGS)
    assert older is not None
    assert "terminationMessagePolicy" not in build_sync_container(ts, older, PLAIN)

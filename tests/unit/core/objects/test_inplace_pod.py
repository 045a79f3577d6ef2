"""The pod of a TritonService with spec.rollout.modelUpdates: InPlace: `agent --once` as the init
container, the model-agent sidecar, the three volumes, `--load-model=*`; restricted, no API token; and
switching it is a pod change (a new revision, new pods)."""

from __future__ import annotations

from typing import Any

from triton_operator.cli import build_parser
from triton_operator.core.objects.builders import (
    build_deployment,
    compute_revision,
    pod_template_inputs,
    triton_args,
)
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    AGENT_PORT,
    AGENT_STATUS_PATH,
    INPLACE_TARGET_ANNOTATION,
    MANIFEST_PATH,
)
from triton_operator.core.rollout.rollout_kind import NewPods, RevisionParts, rollout_kind
from tritonservice_bodies import OLDER_SHAPE, configs_of, ts_of

SETTINGS = OLDER_SHAPE  # the two shapes of pods made before one pod shape (their revisions keep them)

IN_PLACE = {"rollout": {"modelUpdates": "InPlace"}}


def pod(**spec: Any) -> dict[str, Any]:
    ts = ts_of(**spec)
    template: dict[str, Any] = build_deployment(ts, "rev1", SETTINGS, 2)["spec"]["template"]["spec"]
    return template


def by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["name"]: i for i in items}


def test_the_contract_constants() -> None:
    assert (AGENT_PORT, AGENT_STATUS_PATH) == (8009, "/v1/inplace")
    assert INPLACE_TARGET_ANNOTATION == "triton-operator.io/inplace-target"


def test_without_in_place_the_pod_is_as_before() -> None:
    spec = pod()
    assert [c["name"] for c in spec["containers"]] == ["tritonserver"]
    assert spec["initContainers"][0]["command"] == ["triton-operator", "sync"]
    assert {v["name"] for v in spec["volumes"]} == {"models", "dshm", "triton-operator-config"}


def test_the_init_container_runs_agent_once_and_the_sidecar_follows_the_target() -> None:
    spec = pod(**IN_PLACE)
    (init,) = spec["initContainers"]
    assert init["name"] == "sync"  # the same container name: status reads its failures as before
    assert init["command"] == ["triton-operator", "agent"]
    args = init["args"]
    assert args[:6] == [
        "--manifest",
        MANIFEST_PATH,
        "--configs",
        "/etc/triton-operator/configs",
        "--dest",
        "/models",
    ]
    assert args[6:] == [
        "--inplace-dir",
        "/etc/triton-operator-inplace",
        "--target-file",
        "/etc/triton-operator-inplace/target",
        "--state-dir",
        "/var/run/triton-operator",
        "--base-revision",
        "rev1",
        "--once",
    ]
    containers = by_name(spec["containers"])
    assert list(containers) == ["tritonserver", AGENT_CONTAINER]
    agent = containers[AGENT_CONTAINER]
    assert agent["command"] == ["triton-operator", "agent"]
    assert agent["args"] == [
        *args[:-1],
        "--triton",
        "http://127.0.0.1:8000",
        "--listen",
        "0.0.0.0:8009",
        "--drain-seconds",
        "9",  # the readiness probe's 2 s x 2 failures, then drainSeconds (5)
    ]
    assert agent["ports"] == [{"name": "agent", "containerPort": 8009, "protocol": "TCP"}]
    assert agent["image"] == init["image"] == SETTINGS.sync_image
    assert agent["resources"] == {"requests": {"cpu": "10m", "memory": "96Mi"}}  # no limits
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts == {m["name"]: m for m in init["volumeMounts"]}
    assert mounts["inplace"] == {
        "name": "inplace",
        "mountPath": "/etc/triton-operator-inplace",
        "readOnly": True,
    }
    assert "podinfo" not in mounts  # the target annotation is in the in-place volume
    assert mounts["agent-state"] == {"name": "agent-state", "mountPath": "/var/run/triton-operator"}
    assert mounts["models"] == {"name": "models", "mountPath": "/models"}


def test_the_two_volumes() -> None:
    """The in-place ConfigMap and the pod's target annotation in ONE projected volume (one atomic
    payload of the kubelet), and the agent's bookkeeping."""
    volumes = by_name(pod(**IN_PLACE)["volumes"])
    assert volumes["inplace"] == {
        "name": "inplace",
        "projected": {
            "sources": [
                {"configMap": {"name": "svc-rev1-inplace", "optional": True}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "target",
                                "fieldRef": {
                                    "fieldPath": "metadata.annotations['triton-operator.io/inplace-target']"
                                },
                            }
                        ]
                    }
                },
            ]
        },
    }
    assert "podinfo" not in volumes
    assert volumes["agent-state"] == {"name": "agent-state", "emptyDir": {}}


def test_the_pods_readiness_is_the_agents_and_it_sees_the_stub_processes() -> None:
    spec = pod(**IN_PLACE)
    probe = by_name(spec["containers"])["tritonserver"]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/v1/ready", "port": 8009}
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (2, 2)
    assert spec["shareProcessNamespace"] is True
    before = pod()
    assert by_name(before["containers"])["tritonserver"]["readinessProbe"]["httpGet"]["path"] == (
        "/v2/health/ready"
    )
    assert "shareProcessNamespace" not in before


def test_tritonserver_reads_models_read_only() -> None:
    """/models is the agent's: the Python backend's __pycache__ never lands there."""
    triton = by_name(pod(**IN_PLACE)["containers"])["tritonserver"]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in triton["volumeMounts"]
    before = by_name(pod()["containers"])["tritonserver"]
    assert {"name": "models", "mountPath": "/models"} in before["volumeMounts"]  # unchanged without


def test_tritonserver_loads_what_models_holds() -> None:
    args = triton_args(ts_of(**IN_PLACE))
    assert "--load-model=*" in args
    assert not [a for a in args if a.startswith("--load-model=") and a != "--load-model=*"]
    assert "--model-control-mode=explicit" in args
    # Triton's own readiness stays strict (the pod's readiness is the agent's): no in-place load
    # goes over a loaded model, so a failed one never leaves Triton unready for good
    assert not [a for a in args if a.startswith("--strict-readiness")]
    assert "--strict-readiness=false" not in triton_args(ts_of())


def test_credentials_reach_the_agent_too() -> None:
    spec = pod(
        rollout={"modelUpdates": "InPlace"}, repository={"uri": "s3://b/p", "credentialsSecret": "store"}
    )
    agent = by_name(spec["containers"])[AGENT_CONTAINER]
    assert agent["envFrom"] == [{"secretRef": {"name": "store"}}] == spec["initContainers"][0]["envFrom"]


def test_restricted_posture_for_the_new_containers_and_no_token() -> None:
    spec = pod(**IN_PLACE)
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    # a user of their own: tritonserver's processes (same process namespace) cannot read theirs
    restricted["runAsUser"] = 65532
    assert by_name(spec["containers"])[AGENT_CONTAINER]["securityContext"] == restricted
    assert spec["initContainers"][0]["securityContext"] == restricted
    assert spec["securityContext"]["runAsUser"] == 1000  # tritonserver's
    assert "runAsUser" not in by_name(spec["containers"])["tritonserver"].get("securityContext", {})
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the restricted level forbids these on any container
    for container in [*spec["containers"], *spec["initContainers"]]:
        assert "hostPort" not in str(container.get("ports"))
        assert not container.get("securityContext", {}).get("privileged")


def test_switching_in_place_on_or_off_is_a_new_revision_and_needs_new_pods() -> None:
    off, on = ts_of(), ts_of(**IN_PLACE)
    assert compute_revision(off, SETTINGS, configs_of(off), "d") != compute_revision(
        on, SETTINGS, configs_of(on), "d"
    )
    kind = rollout_kind(
        RevisionParts(pod_template_inputs(off, SETTINGS), {}, {}, None),
        RevisionParts(pod_template_inputs(on, SETTINGS), {}, {}, None),
    )
    assert isinstance(kind, NewPods) and "modelUpdates changed" in kind.reasons


def test_the_default_keeps_existing_revision_hashes() -> None:
    """modelUpdates: NewPods (the default) renders what no field did: the hash of every existing
    revision stays."""
    plain, explicit = ts_of(), ts_of(rollout={"modelUpdates": "NewPods"})
    assert compute_revision(plain, SETTINGS, configs_of(plain), "d") == compute_revision(
        explicit, SETTINGS, configs_of(explicit), "d"
    )


def test_what_the_pod_runs_parses_with_the_agents_own_command_line() -> None:
    """The init container's and the sidecar's arguments, as `triton-operator agent` reads them."""
    spec = pod(rollout={"modelUpdates": "InPlace"}, modelVolume={"sizeLimit": "2Gi"})
    parser = build_parser()
    for container in (spec["initContainers"][0], by_name(spec["containers"])[AGENT_CONTAINER]):
        assert container["command"][0] == "triton-operator"
        args = parser.parse_args([*container["command"][1:], *container["args"]])
        assert args.base_revision == "rev1" and str(args.dest) == "/models"
        assert str(args.target_file) == "/etc/triton-operator-inplace/target"
        assert args.target_file.parent == args.inplace_dir  # one payload: read together
        assert args.once is (container is spec["initContainers"][0])
        assert args.volume_limit is not None

"""The operator's policy (core.pod.policy): allowed tritonserver images and forbidden volume types,
from its settings to the reconcile that holds a refused spec while the serving revision stays."""

from __future__ import annotations

import doctest
import io
from typing import Any

import pytest
import yaml

from fakeapi import FakeClient
from testkit import REPO
from triton_operator.adapters.kube import Kube
from triton_operator.commands import render
from triton_operator.core.observed.observation import check_body
from triton_operator.core.pod import policy
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.reconcile import reconcile_pass
from triton_operator.settings import DEFAULT_FORBIDDEN_VOLUME_TYPES, Settings

EXAMPLES = REPO / "examples"
UID = "0b4f3c2e-0000-4000-8000-000000000001"


def tritonservice(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "replicas": 1,
            "repository": {"uri": "pvc://models/triton"},
            "models": [{"name": "add"}],
            **spec,
        },
    }


def parsed(**spec: Any) -> Any:
    checked = check_body(tritonservice(**spec))
    assert not checked.problems, checked.problems
    return checked.ts


HOST_PATH = {"name": "node", "hostPath": {"path": "/etc"}}
EMPTY_DIR = {"name": "scratch", "emptyDir": {}}


def test_the_docstring_examples_hold() -> None:
    assert doctest.testmod(policy).failed == 0


@pytest.mark.parametrize(
    ("image", "prefixes", "allowed"),
    [
        ("nvcr.io/nvidia/tritonserver:25.01-py3", [], True),
        ("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia"], True),
        ("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia/"], True),
        ("nvcr.io/nvidia/tritonserver@sha256:abc", ["nvcr.io/nvidia/tritonserver"], True),
        ("nvcr.io/nvidia", ["nvcr.io/nvidia"], True),
        # a prefix matches at a reference boundary only
        ("nvcr.io/nvidia-evil/tritonserver:1", ["nvcr.io/nvidia"], False),
        ("nvcr.io/nvidiax", ["nvcr.io/nvidia"], False),
        ("docker.io/library/busybox", ["nvcr.io/nvidia", "registry.local/ml"], False),
        ("registry.local/ml/triton:1", ["nvcr.io/nvidia", "registry.local/ml"], True),
        # the tag is part of what a prefix may pin
        ("nvcr.io/nvidia/tritonserver:24.01-py3", ["nvcr.io/nvidia/tritonserver:25."], False),
    ],
)
def test_image_allowed(image: str, prefixes: list[str], allowed: bool) -> None:
    assert policy.image_allowed(image, prefixes) is allowed


def test_host_path_is_refused_by_default_and_names_the_field() -> None:
    errors = policy.policy_errors(parsed(volumes=[EMPTY_DIR, HOST_PATH]), Settings())
    assert [e.field for e in errors] == ["spec.volumes[1].hostPath"]
    assert "TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES" in errors[0].message


def test_other_volume_types_and_an_emptied_list_are_allowed() -> None:
    assert policy.policy_errors(parsed(volumes=[EMPTY_DIR]), Settings()) == []
    assert policy.policy_errors(parsed(volumes=[HOST_PATH]), Settings(forbidden_volume_types=())) == []


def test_an_image_outside_the_prefixes_is_refused() -> None:
    settings = Settings(allowed_image_prefixes=("registry.local/ml",))
    errors = policy.policy_errors(parsed(image="docker.io/evil/triton:1"), settings)
    assert [e.field for e in errors] == ["spec.image"]
    assert "'registry.local/ml'" in errors[0].message
    assert policy.policy_errors(parsed(image="registry.local/ml/triton:1"), settings) == []


def test_the_default_image_is_checked_when_the_spec_names_none() -> None:
    """A default image outside the allowed prefixes is an operator misconfiguration: it shows."""
    settings = Settings(allowed_image_prefixes=("registry.local/ml",))
    errors = policy.policy_errors(parsed(), settings)
    assert [e.field for e in errors] == ["spec.image (the operator's default image)"]


@pytest.mark.parametrize(
    ("env", "prefixes", "forbidden"),
    [
        ({}, (), DEFAULT_FORBIDDEN_VOLUME_TYPES),
        ({"TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": ""}, (), ()),
        ({"TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": "none"}, (), ()),  # what the chart sets for []
        (
            {
                "TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES": "hostPath, nfs",
                "TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES": "nvcr.io/nvidia, registry.local/ml",
            },
            ("nvcr.io/nvidia", "registry.local/ml"),
            ("hostPath", "nfs"),
        ),
    ],
)
def test_settings_from_the_environment(
    env: dict[str, str], prefixes: tuple[str, ...], forbidden: tuple[str, ...]
) -> None:
    settings = Settings.from_env(env)
    assert settings.allowed_image_prefixes == prefixes
    assert settings.forbidden_volume_types == forbidden


def test_render_refuses_what_the_policy_refuses() -> None:
    doc = yaml.safe_load((EXAMPLES / "tiny.yaml").read_text())
    doc["spec"]["volumes"] = [HOST_PATH]
    out, err = io.StringIO(), io.StringIO()
    assert render.render([doc], Settings(), out=out, err=err) == 1
    assert "refused by the operator's policy: spec.volumes[0].hostPath" in err.getvalue()
    assert out.getvalue() == ""


async def test_a_refused_spec_is_held_and_the_serving_revision_stays() -> None:
    """Through the reconcile (an in-memory API, tests/support/fakeapi.py): a serving TritonService
    whose spec gains a hostPath volume keeps its Deployment as it was; Ready says why."""
    api = FakeClient()
    api.put(tritonservice())
    kube = Kube(api)  # type: ignore[arg-type]
    first = await reconcile_pass.reconcile(kube, "ml", "svc", Settings())
    assert first.invalid is None, first.invalid
    deployments = api.of_kind("Deployment")
    assert [d["metadata"]["name"] for d in deployments] == [f"svc-{first.revision}"]
    before = [dict(d["spec"]) for d in deployments]

    body = api.find("TritonService", "ml", "svc")
    assert body is not None
    body["spec"]["volumes"] = [HOST_PATH]
    body["metadata"]["generation"] = 2
    held = await reconcile_pass.reconcile(kube, "ml", "svc", Settings())

    assert held.reason == cond.REFUSED_BY_POLICY
    assert held.invalid is not None and "spec.volumes[0].hostPath" in held.invalid
    assert [dict(d["spec"]) for d in api.of_kind("Deployment")] == before
    ready = next(c for c in body["status"]["conditions"] if c["type"] == cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.REFUSED_BY_POLICY)
    assert "spec.volumes[0].hostPath" in ready["message"]


# --- privileges and identity: the hostPath ban is moot if the same spec may run privileged or as root


@pytest.mark.parametrize(
    ("spec", "fields"),
    [
        ({"securityContext": {"privileged": True, "runAsUser": 1000}}, ["spec.securityContext.privileged"]),
        (
            {"securityContext": {"allowPrivilegeEscalation": True}},
            ["spec.securityContext.allowPrivilegeEscalation"],
        ),
        (
            {"securityContext": {"windowsOptions": {"hostProcess": True}}},
            ["spec.securityContext.windowsOptions.hostProcess"],
        ),
        (
            {"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE", "SYS_ADMIN", "cap_net_raw"]}}},
            ["spec.securityContext.capabilities.add[1]", "spec.securityContext.capabilities.add[2]"],
        ),
        ({"securityContext": {"runAsUser": 0}}, ["spec.securityContext.runAsUser"]),
        ({"podSecurityContext": {"runAsUser": 0}}, ["spec.podSecurityContext.runAsUser"]),
        # a pod context without a user leaves it to the image: NGC's tritonserver runs as root
        ({"podSecurityContext": {"fsGroup": 2000}}, ["spec.podSecurityContext"]),
        ({"podSecurityContext": {"runAsNonRoot": False}}, ["spec.podSecurityContext"]),
        ({"serviceAccountName": "cluster-builder"}, ["spec.serviceAccountName"]),
    ],
)
def test_privileges_root_and_other_service_accounts_are_refused_by_default(
    spec: dict[str, Any], fields: list[str]
) -> None:
    errors = policy.policy_errors(parsed(**spec), Settings())
    assert [e.field for e in errors] == fields
    assert all("refused by the operator's policy" in e.message for e in errors)
    assert all("chart value policy." in e.message for e in errors)


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}},
        {"securityContext": {"privileged": False, "allowPrivilegeEscalation": False}},
        {"podSecurityContext": {"runAsUser": 1001, "fsGroup": 1001}},
        {"podSecurityContext": {"runAsNonRoot": True}},
        {"podSecurityContext": {"fsGroup": 1}, "securityContext": {"runAsUser": 1001}},
        {"securityContext": {"runAsNonRoot": True}},  # the pod keeps the operator's uid 1000
        {"serviceAccountName": "default"},
    ],
)
def test_unprivileged_non_root_specs_pass(spec: dict[str, Any]) -> None:
    assert policy.policy_errors(parsed(**spec), Settings()) == []


def test_the_settings_allow_what_they_name() -> None:
    spec = {
        "securityContext": {"privileged": True, "runAsUser": 0, "capabilities": {"add": ["SYS_PTRACE"]}},
        "serviceAccountName": "triton",
    }
    assert len(policy.policy_errors(parsed(**spec), Settings())) == 4
    permissive = Settings(
        allow_privileged=True,
        allow_root=True,
        allowed_capabilities=("SYS_PTRACE",),
        allowed_service_accounts=("ml/triton",),
    )
    assert policy.policy_errors(parsed(**spec), permissive) == []
    elsewhere = Settings(allowed_service_accounts=("other/triton",))
    assert [e.field for e in policy.policy_errors(parsed(serviceAccountName="triton"), elsewhere)] == [
        "spec.serviceAccountName"
    ]
    anyone = Settings(allowed_service_accounts=("*",))
    assert policy.policy_errors(parsed(serviceAccountName="x"), anyone) == []


def test_privilege_settings_from_the_environment() -> None:
    default = Settings.from_env({})
    assert (default.allow_privileged, default.allow_root) == (False, False)
    assert default.allowed_capabilities == ("NET_BIND_SERVICE",)
    assert default.allowed_service_accounts == ()
    custom = Settings.from_env(
        {
            "TRITON_OPERATOR_ALLOW_PRIVILEGED": "true",
            "TRITON_OPERATOR_ALLOW_ROOT": "true",
            "TRITON_OPERATOR_ALLOWED_CAPABILITIES": "sys_ptrace, NET_ADMIN",
            "TRITON_OPERATOR_ALLOWED_SERVICE_ACCOUNTS": "ml/triton,reader",
        }
    )
    assert (custom.allow_privileged, custom.allow_root) == (True, True)
    assert custom.allowed_capabilities == ("SYS_PTRACE", "NET_ADMIN")
    assert custom.allowed_service_accounts == ("ml/triton", "reader")
    assert Settings.from_env({"TRITON_OPERATOR_ALLOWED_CAPABILITIES": "none"}).allowed_capabilities == ()


# Pod Security "baseline": one rule a case, each refused by default naming its field and the setting
# that allows it (TRITON_OPERATOR_ALLOW_PRIVILEGED, chart value policy.allowPrivileged), each passed
# by that setting. On main, each of these specs passed the default policy.
BASELINE_REFUSED = [
    pytest.param(
        {"podSecurityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}}},
        "spec.podSecurityContext.seccompProfile.type",
        id="pod-seccomp-unconfined",
    ),
    pytest.param(
        {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
        "spec.securityContext.seccompProfile.type",
        id="container-seccomp-unconfined",
    ),
    pytest.param(
        {"podSecurityContext": {"runAsNonRoot": True, "appArmorProfile": {"type": "Unconfined"}}},
        "spec.podSecurityContext.appArmorProfile.type",
        id="pod-apparmor-unconfined",
    ),
    pytest.param(
        {"securityContext": {"appArmorProfile": {"type": "Unconfined"}}},
        "spec.securityContext.appArmorProfile.type",
        id="container-apparmor-unconfined",
    ),
    pytest.param(
        {"podAnnotations": {"container.apparmor.security.beta.kubernetes.io/triton": "unconfined"}},
        "spec.podAnnotations['container.apparmor.security.beta.kubernetes.io/triton']",
        id="apparmor-annotation-unconfined",
    ),
    pytest.param(
        {"securityContext": {"seLinuxOptions": {"type": "spc_t"}}},
        "spec.securityContext.seLinuxOptions.type",
        id="selinux-spc_t",
    ),
    pytest.param(
        {"podSecurityContext": {"runAsNonRoot": True, "seLinuxOptions": {"type": "unconfined_t"}}},
        "spec.podSecurityContext.seLinuxOptions.type",
        id="pod-selinux-unconfined_t",
    ),
    pytest.param(
        {"securityContext": {"seLinuxOptions": {"user": "system_u"}}},
        "spec.securityContext.seLinuxOptions.user",
        id="selinux-user",
    ),
    pytest.param(
        {"securityContext": {"seLinuxOptions": {"role": "system_r"}}},
        "spec.securityContext.seLinuxOptions.role",
        id="selinux-role",
    ),
    pytest.param(
        {"securityContext": {"procMount": "Unmasked"}},
        "spec.securityContext.procMount",
        id="procmount-unmasked",
    ),
    pytest.param(
        {"podSecurityContext": {"runAsNonRoot": True, "sysctls": [{"name": "kernel.msgmax", "value": "1"}]}},
        "spec.podSecurityContext.sysctls[0].name",
        id="unsafe-sysctl",
    ),
    pytest.param(
        {"podSecurityContext": {"runAsNonRoot": True, "windowsOptions": {"hostProcess": True}}},
        "spec.podSecurityContext.windowsOptions.hostProcess",
        id="pod-host-process",
    ),
]


@pytest.mark.parametrize(("spec", "field"), BASELINE_REFUSED)
def test_what_pod_security_baseline_refuses_is_refused_by_default(spec: dict[str, Any], field: str) -> None:
    errors = policy.policy_errors(parsed(**spec), Settings())
    assert [e.field for e in errors] == [field]
    assert "TRITON_OPERATOR_ALLOW_PRIVILEGED" in errors[0].message
    assert "policy.allowPrivileged" in errors[0].message
    assert policy.policy_errors(parsed(**spec), Settings(allow_privileged=True)) == []


def test_a_git_repo_volume_is_refused_by_default() -> None:
    """CVE-2024-10220: a gitRepo volume runs git on the node with the spec's arguments."""
    git = {"name": "code", "gitRepo": {"repository": "https://example.com/x.git"}}
    errors = policy.policy_errors(parsed(volumes=[git]), Settings())
    assert [e.field for e in errors] == ["spec.volumes[0].gitRepo"]
    assert "TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES" in errors[0].message
    assert policy.policy_errors(parsed(volumes=[git]), Settings(forbidden_volume_types=("hostPath",))) == []


@pytest.mark.parametrize(
    "spec",
    [
        {
            "podSecurityContext": {
                "runAsNonRoot": True,
                "seccompProfile": {"type": "Localhost", "localhostProfile": "triton.json"},
            }
        },
        {
            "securityContext": {
                "seccompProfile": {"type": "RuntimeDefault"},
                "appArmorProfile": {"type": "RuntimeDefault"},
            }
        },
        {"securityContext": {"seLinuxOptions": {"type": "container_t", "level": "s0:c123,c456"}}},
        {"securityContext": {"seLinuxOptions": {"type": "container_init_t"}, "procMount": "Default"}},
        {
            "podSecurityContext": {
                "runAsNonRoot": True,
                "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}],
            }
        },
        {
            "podAnnotations": {
                "container.apparmor.security.beta.kubernetes.io/triton": "localhost/triton",
                "other": "unconfined",
            }
        },
    ],
)
def test_what_pod_security_baseline_allows_passes(spec: dict[str, Any]) -> None:
    assert policy.policy_errors(parsed(**spec), Settings()) == []


async def test_a_privileged_spec_is_held_and_the_serving_revision_stays() -> None:
    """Through the reconcile: a serving TritonService whose spec turns privileged and names another
    ServiceAccount keeps its Deployment; Ready names both fields."""
    api = FakeClient()
    api.put(tritonservice())
    kube = Kube(api)  # type: ignore[arg-type]
    first = await reconcile_pass.reconcile(kube, "ml", "svc", Settings())
    assert first.invalid is None, first.invalid
    before = [dict(d["spec"]) for d in api.of_kind("Deployment")]

    body = api.find("TritonService", "ml", "svc")
    assert body is not None
    body["spec"]["securityContext"] = {"privileged": True}
    body["spec"]["serviceAccountName"] = "node-admin"
    body["metadata"]["generation"] = 2
    held = await reconcile_pass.reconcile(kube, "ml", "svc", Settings())

    assert held.reason == cond.REFUSED_BY_POLICY
    assert [dict(d["spec"]) for d in api.of_kind("Deployment")] == before
    ready = next(c for c in body["status"]["conditions"] if c["type"] == cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.REFUSED_BY_POLICY)
    assert "spec.securityContext.privileged" in ready["message"]
    assert "spec.serviceAccountName" in ready["message"]

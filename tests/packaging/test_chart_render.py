"""The Helm chart renders what the operator needs: args, env, security, peering, monitoring, labels."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from packaging_helpers import Render, chartlib, container, env, find, one, render_error
from triton_operator.settings import ENV_SETTINGS, Settings


def test_helm_lint_strict_default_and_ci_values(helm: Path) -> None:
    chartlib.helm_lint(helm=helm)
    scenarios = chartlib.ci_values_files()
    assert len(scenarios) >= 3
    for values in scenarios:
        chartlib.helm_lint([values], helm=helm)


def test_default_render_is_cluster_wide(render: Render) -> None:
    docs = render()
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment"]
    )
    c = container(docs)
    assert c["command"] == ["triton-operator"]
    assert c["args"] == ["run", "--all-namespaces"]
    assert c["image"] == "ghcr.io/triton-operator/triton-operator:0.1.0"
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["namespace"] == "triton-operator"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"] == "triton-operator"


def test_operator_settings_as_env(render: Render) -> None:
    e = env(render())
    assert e["TRITON_OPERATOR_DEFAULT_IMAGE"] == "nvcr.io/nvidia/tritonserver:25.01-py3"
    # The sync init container runs the operator's own image unless told otherwise.
    assert e["TRITON_OPERATOR_SYNC_IMAGE"] == "ghcr.io/triton-operator/triton-operator:0.1.0"
    assert e["TRITON_OPERATOR_LOG_LEVEL"] == "INFO"
    assert e["TRITON_OPERATOR_METRICS_PORT"] == "8080"
    assert e["TRITON_OPERATOR_LIVENESS_ENDPOINT"] == "http://0.0.0.0:8081/healthz"
    assert e["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "TRITON_OPERATOR_PEERING_NAME" not in e
    # The policy: any image, hostPath and gitRepo refused (core.pod.policy); lists joined with commas.
    # An empty list is left out: an env var of value "" is stored without one, and `kubectl apply`
    # would then find the Deployment changed on every run.
    assert "TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES" not in e
    assert all(v != "" for v in e.values())
    assert e["TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES"] == "hostPath,gitRepo"
    # privileges: none, root refused, NET_BIND_SERVICE only, the namespace's default ServiceAccount
    assert (e["TRITON_OPERATOR_ALLOW_PRIVILEGED"], e["TRITON_OPERATOR_ALLOW_ROOT"]) == ("false", "false")
    assert e["TRITON_OPERATOR_ALLOWED_CAPABILITIES"] == "NET_BIND_SERVICE"
    assert "TRITON_OPERATOR_ALLOWED_SERVICE_ACCOUNTS" not in e
    lax = env(
        render(
            {
                "policy": {
                    "allowPrivileged": True,
                    "allowRoot": True,
                    "allowedCapabilities": [],
                    "allowedServiceAccounts": ["ml/triton", "reader"],
                }
            }
        )
    )
    assert (lax["TRITON_OPERATOR_ALLOW_PRIVILEGED"], lax["TRITON_OPERATOR_ALLOW_ROOT"]) == ("true", "true")
    assert lax["TRITON_OPERATOR_ALLOWED_CAPABILITIES"] == "none"
    assert lax["TRITON_OPERATOR_ALLOWED_SERVICE_ACCOUNTS"] == "ml/triton,reader"
    strict = env(
        render(
            {
                "policy": {
                    "allowedImagePrefixes": ["nvcr.io/nvidia", "reg.local/ml"],
                    "forbiddenVolumeTypes": [],
                }
            }
        )
    )
    assert strict["TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES"] == "nvcr.io/nvidia,reg.local/ml"
    assert strict["TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES"] == "none"

    custom = env(
        render(
            {
                "image": {"repository": "reg.local/op", "tag": "dev"},
                "operator": {"logLevel": "DEBUG", "extraEnv": [{"name": "X", "value": "1"}]},
            }
        )
    )
    assert custom["TRITON_OPERATOR_SYNC_IMAGE"] == "reg.local/op:dev"
    assert custom["TRITON_OPERATOR_LOG_LEVEL"] == "DEBUG"
    assert custom["X"] == "1"
    assert env(render({"operator": {"syncImage": "reg.local/sync:1"}}))["TRITON_OPERATOR_SYNC_IMAGE"] == (
        "reg.local/sync:1"
    )


def test_repository_access_policy_as_env(render: Render) -> None:
    """By default no namespace may use the operator's identity and any endpoint may be listed;
    the values name namespaces and endpoints as Settings.from_env reads them."""
    e = env(render())
    default = Settings.from_env({k: v for k, v in e.items() if isinstance(v, str)})
    assert (default.ambient_credentials_namespaces, default.allowed_endpoints) == ((), ())
    values = {
        "operator": {
            "ambientCredentialsNamespaces": ["ml", "team-a"],
            "allowedRepositoryEndpoints": ["minio.minio:9000", "*.s3.example.com"],
        }
    }
    e = env(render(values))
    custom = Settings.from_env({k: v for k, v in e.items() if isinstance(v, str)})
    assert custom.ambient_credentials_namespaces == ("ml", "team-a")
    assert custom.allowed_endpoints == ("minio.minio:9000", "*.s3.example.com")


def test_settings_env_names_are_read_by_the_operator(render: Render) -> None:
    """Every TRITON_OPERATOR_* variable the chart sets is one the operator reads."""
    sources = (chartlib.REPO_ROOT / "operator" / "src" / "triton_operator").rglob("*.py")
    text = "\n".join(p.read_text() for p in sources)
    known = set(ENV_SETTINGS)  # what Settings.from_env reads
    known |= {m[len("TRITON_OPERATOR_") :] for m in re.findall(r"TRITON_OPERATOR_[A-Z_]+", text)}
    values = {"peering": {"enabled": True}}
    chart_vars = [k for k in env(render(values)) if k.startswith("TRITON_OPERATOR_")]
    assert chart_vars
    unknown = [k for k in chart_vars if k[len("TRITON_OPERATOR_") :] not in known]
    assert not unknown, f"the chart sets variables the operator never reads: {unknown}"


def test_ports_probe_and_metrics_service(render: Render) -> None:
    docs = render()
    c = container(docs)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 8080, "healthz": 8081}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    svc = one(docs, "Service", "triton-operator-metrics")
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert not find(render({"metrics": {"service": {"enabled": False}}}), "Service")
    assert "livenessProbe" not in container(render({"livenessProbe": {"enabled": False}}))


def test_security_context_and_writable_tmp(render: Render) -> None:
    docs = render()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(docs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]


def test_scheduling_values_reach_the_pod(render: Render) -> None:
    values: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {}},
        "resources": {"limits": {"cpu": "1"}},
        "imagePullSecrets": ["regcred"],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"a": "b"},
    }
    template = one(render(values), "Deployment")["spec"]["template"]
    pod = template["spec"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    # Helm merges maps: the default requests stay, the limit is the one given.
    assert pod["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "512Mi"}
    assert template["metadata"]["annotations"] == {"a": "b"}


def test_watch_namespaces_args(render: Render) -> None:
    docs = render({"watchNamespaces": ["ml", "ab", "ml"]})
    assert container(docs)["args"] == ["run", "--namespace=ab", "--namespace=ml"]


def test_watch_namespaces_rejects_bad_names(helm: Path) -> None:
    assert "is not a namespace name" in render_error(helm, "watchNamespaces={Bad_NS}")


def test_more_than_one_replica_needs_peering(helm: Path) -> None:
    assert "needs peering.enabled=true" in render_error(helm, "replicaCount=2")


def test_peering_cluster_wide(render: Render) -> None:
    docs = render({"replicaCount": 3, "peering": {"enabled": True, "name": "tp"}})
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert env(docs)["TRITON_OPERATOR_PEERING_NAME"] == "tp"
    peering = one(docs, "ClusterKopfPeering")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert peering["metadata"]["name"] == "tp"
    assert not find(docs, "KopfPeering")


def test_peering_namespaced(render: Render) -> None:
    docs = render({"watchNamespaces": ["a", "b"], "peering": {"enabled": True}})
    peerings = find(docs, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("a", "triton-operator"),
        ("b", "triton-operator"),
    ]
    assert not find(docs, "ClusterKopfPeering")


def test_peering_crds_ship_in_crds_dir() -> None:
    docs = [
        d for d in yaml.safe_load_all((chartlib.CHART_DIR / "crds" / "kopfpeerings.yaml").read_text()) if d
    ]
    names = {d["metadata"]["name"]: d["spec"]["scope"] for d in docs}
    assert names == {"clusterkopfpeerings.kopf.dev": "Cluster", "kopfpeerings.kopf.dev": "Namespaced"}


def test_service_monitor(render: Render) -> None:
    assert not find(render(), "ServiceMonitor")
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    svc = one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


def test_pod_monitor_selects_triton_pods(render: Render) -> None:
    assert not find(render(), "PodMonitor")
    pm = one(render({"tritonMetrics": {"podMonitor": {"enabled": True}}}), "PodMonitor")
    assert pm["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "triton-operator"}}
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    scoped = one(
        render({"watchNamespaces": ["ml"], "tritonMetrics": {"podMonitor": {"enabled": True}}}), "PodMonitor"
    )
    assert scoped["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}


def test_triton_pods_carry_the_label_and_port_the_pod_monitor_selects() -> None:
    """The reconcile side: Triton pods carry managed-by=triton-operator and a port named `metrics`."""
    core = chartlib.REPO_ROOT / "operator" / "src" / "triton_operator" / "core"
    objects = (core / "objects" / "names.py").read_text() + (core / "objects" / "builders.py").read_text()
    assert 'LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"' in objects
    assert '{"name": "metrics", "containerPort": METRICS_PORT' in objects
    assert (
        'FIELD_MANAGER = "triton-operator"'
        in (chartlib.REPO_ROOT / "operator" / "src" / "triton_operator" / "__init__.py").read_text()
    )


@pytest.mark.parametrize("scenario", ["default", *[p.name for p in chartlib.ci_values_files()]])
def test_standard_labels_on_every_object(helm: Path, scenario: str) -> None:
    files = [] if scenario == "default" else [chartlib.CHART_DIR / "ci" / scenario]
    docs = [d for d in yaml.safe_load_all(chartlib.helm_template(files, helm=helm)) if d]
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version"):
            assert labels.get(key), f"{doc['kind']}/{doc['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "triton-operator-0.1.0"


def test_values_are_camel_case_and_commented() -> None:
    text = (chartlib.CHART_DIR / "values.yaml").read_text()
    values = yaml.safe_load(text)
    camel = re.compile(r"^[a-z][a-zA-Z0-9]*$")

    def keys(node: Any, path: str = "") -> list[str]:
        out = []
        if isinstance(node, dict):
            for k, v in node.items():
                out.append(f"{path}{k}")
                out += keys(v, f"{path}{k}.")
        return out

    bad = [k for k in keys(values) if not camel.match(k.rsplit(".", 1)[-1])]
    assert not bad, f"not camelCase: {bad}"
    for top in values:
        # Each top-level key is preceded by a comment line (block comment or section comment).
        lines = text.splitlines()
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{top}:"))
        block = lines[index - 1] if index else ""
        first_child = lines[index + 1] if index + 1 < len(lines) else ""
        assert block.startswith("#") or first_child.strip().startswith("#") or top in _SELF_EXPLAINING, top
    chart = yaml.safe_load((chartlib.CHART_DIR / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == "0.1.0"


_SELF_EXPLAINING = {
    "resources",
    "podSecurityContext",
    "securityContext",
    "nodeSelector",
    "tolerations",
    "affinity",
    "livenessProbe",
}


def test_the_listing_cap_as_env(render: Render) -> None:
    """operator.maxListedObjects reaches the operator as Settings.max_listed_objects."""
    default = env(render())
    assert default["TRITON_OPERATOR_MAX_LISTED_OBJECTS"] == "100000"
    assert (
        Settings.from_env({k: v for k, v in default.items() if isinstance(v, str)}).max_listed_objects
        == 100_000
    )
    e = env(render({"operator": {"maxListedObjects": 5000}}))
    assert Settings.from_env({k: v for k, v in e.items() if isinstance(v, str)}).max_listed_objects == 5000


def test_one_log_format_value_reaches_the_operator_and_the_node_cache(render: Render) -> None:
    from triton_operator import logs  # noqa: PLC0415

    assert env(render())[logs.ENV] == "text"
    docs = render({"operator": {"logFormat": "json"}, "nodeCache": {"enabled": True}})
    assert logs.log_format({logs.ENV: env(docs)[logs.ENV]}) == "json"
    (daemonset,) = find(docs, "DaemonSet")
    (cache,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert {e["name"]: e.get("value") for e in cache["env"]}[logs.ENV] == "json"

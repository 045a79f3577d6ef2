"""The chart's RBAC is least privilege: exact rules per mode, no wildcards, get-only secrets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from packaging_helpers import Render, chartlib, find, one

Perms = dict[tuple[str, str], set[str]]

# What the operator does in each namespace it serves (the reconcile, and kopf itself).
NAMESPACED: Perms = {
    ("triton-operator.io", "tritonservices"): {"get", "list", "watch", "patch", "update"},
    ("triton-operator.io", "tritonservices/status"): {"get", "patch", "update"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch", "patch"},  # patch: in-place target, pool assignment, labels
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    ("autoscaling", "horizontalpodautoscalers"): {"list", "create", "patch", "delete"},
    ("", "secrets"): {"get"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # patch: the canary weights of the user's route; create, delete: spec.pool's per-model routes
    ("gateway.networking.k8s.io", "httproutes"): {"get", "list", "watch", "create", "patch", "delete"},
    ("gateway.networking.k8s.io", "grpcroutes"): {"get", "list", "watch", "patch"},
    ("batch", "jobs"): {"list", "delete"},  # perf Jobs of `kubectl triton tune` past their deadline
}
CRD_WATCH: Perms = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
NAMESPACE_WATCH: Perms = {("", "namespaces"): {"list", "watch"}}
READ_ONLY = {"get", "list", "watch"}


def perms(role: dict[str, Any]) -> Perms:
    out: Perms = {}
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def bound(docs: list[dict[str, Any]], binding_kind: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(binding, role) pairs whose subject is the operator's ServiceAccount."""
    role_kind = "ClusterRole" if binding_kind == "ClusterRoleBinding" else "Role"
    out = []
    for binding in find(docs, binding_kind):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "triton-operator", "namespace": "triton-operator"}
        ]
        assert binding["roleRef"]["kind"] in (role_kind, "ClusterRole")
        ns = binding["metadata"].get("namespace")
        role = next(
            d
            for d in docs
            if d["kind"] == binding["roleRef"]["kind"]
            and d["metadata"]["name"] == binding["roleRef"]["name"]
            and d["metadata"].get("namespace") == (ns if d["kind"] == "Role" else None)
        )
        out.append((binding, role))
    return out


def test_cluster_mode_is_exactly_what_is_needed(render: Render) -> None:
    docs = render()
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    [(_, role)] = bound(docs, "ClusterRoleBinding")
    assert perms(role) == {**NAMESPACED, **CRD_WATCH}


def test_cluster_mode_with_peering_adds_only_the_cluster_peering(render: Render) -> None:
    docs = render({"replicaCount": 2, "peering": {"enabled": True}})
    [(_, role)] = bound(docs, "ClusterRoleBinding")
    expected = {
        **NAMESPACED,
        **CRD_WATCH,
        ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch"},
    }
    assert perms(role) == expected


def test_namespaced_mode_grants_roles_in_those_namespaces_only(render: Render) -> None:
    docs = render({"watchNamespaces": ["ml", "ml-staging"]})
    pairs = bound(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b, _ in pairs) == ["ml", "ml-staging"]
    for binding, role in pairs:
        assert role["kind"] == "Role"
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]
        assert perms(role) == NAMESPACED
    # The only cluster-scoped grant: kopf's read-only discovery of CRDs and namespaces.
    [(_, cluster_role)] = bound(docs, "ClusterRoleBinding")
    assert perms(cluster_role) == {**CRD_WATCH, **NAMESPACE_WATCH}
    assert all(verbs <= READ_ONLY for verbs in perms(cluster_role).values())


def test_namespaced_mode_with_peering(render: Render) -> None:
    docs = render({"watchNamespaces": ["ml"], "peering": {"enabled": True}})
    [(_, role)] = bound(docs, "RoleBinding")
    assert perms(role) == {**NAMESPACED, ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"}}
    [(_, cluster_role)] = bound(docs, "ClusterRoleBinding")
    assert ("kopf.dev", "clusterkopfpeerings") not in perms(cluster_role)


def test_namespaced_mode_without_cluster_discovery_has_no_cluster_scope(render: Render) -> None:
    docs = render({"watchNamespaces": ["ml"], "rbac": {"clusterDiscovery": False}})
    assert not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding")
    assert len(find(docs, "Role")) == 1


def test_rbac_create_false_renders_no_rbac(render: Render) -> None:
    docs = render({"rbac": {"create": False}})
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]


@pytest.mark.parametrize("scenario", ["default", *[p.name for p in chartlib.ci_values_files()]])
def test_no_wildcards_no_escalation_secrets_get_only(helm: Path, scenario: str) -> None:
    files = [] if scenario == "default" else [chartlib.CHART_DIR / "ci" / scenario]
    docs = [d for d in yaml.safe_load_all(chartlib.helm_template(files, helm=helm)) if d]
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        assert "aggregationRule" not in role
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"wildcard {field} in {role['metadata']['name']}: {rule}"
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"]), rule
            assert "rbac.authorization.k8s.io" not in rule["apiGroups"], rule
            assert not {"pods/exec", "pods/attach", "nodes", "serviceaccounts/token"} & set(
                rule["resources"]
            ), rule
        for (group, resource), verbs in perms(role).items():
            if resource == "secrets":
                assert (group, verbs) == ("", {"get"}), f"secrets must be get-only, got {verbs}"
            if resource == "pods":
                # patch: the in-place target annotation (spec.rollout.modelUpdates: InPlace); never
                # create, delete, exec or attach
                assert verbs <= READ_ONLY | {"patch"}
        if role["kind"] == "ClusterRole" and scenario != "default" and "namespaced" in scenario:
            assert all(v <= READ_ONLY for v in perms(role).values())


def test_service_account_is_the_deployments(render: Render) -> None:
    docs = render({"serviceAccount": {"name": "custom-sa"}})
    assert one(docs, "ServiceAccount")["metadata"]["name"] == "custom-sa"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "custom-sa"
    for binding in find(docs, "ClusterRoleBinding"):
        assert binding["subjects"][0]["name"] == "custom-sa"

"""The chart's node cache: off by default; on, a DaemonSet in the operator's namespace holds the only
hostPath and the operator tells new revisions' pods its port (TRITON_OPERATOR_NODE_CACHE_PORT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packaging_helpers import Render, env, find, one, render_error
from triton_operator.commands.node_cache import DEFAULT_PORT
from triton_operator.settings import Settings

ON = {"nodeCache": {"enabled": True}}


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def test_off_by_default(render: Render) -> None:
    docs = render()
    assert not find(docs, "DaemonSet")
    assert "TRITON_OPERATOR_NODE_CACHE_PORT" not in env(docs)
    volumes = [
        v
        for d in docs
        for v in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes", [])
    ]
    assert volumes and not [v for v in volumes if "hostPath" in v]


def test_on_a_daemonset_serves_the_cache_on_a_host_port_and_the_operator_knows_it(render: Render) -> None:
    docs = render(ON)
    daemonset = one(docs, "DaemonSet", "triton-operator-node-cache")
    assert daemonset["metadata"]["namespace"] == "triton-operator"
    pod = pod_of(docs)
    [cache] = pod["containers"]
    assert cache["command"] == ["triton-operator"]
    assert cache["args"] == [
        "node-cache",
        "--root=/cache",
        "--size-limit=100Gi",
        f"--port={DEFAULT_PORT}",
        "--lease-seconds=86400",
        "--signing-key=/etc/node-cache-key/signing-key",
    ]
    assert cache["ports"] == [
        {"name": "http", "containerPort": DEFAULT_PORT, "hostPort": DEFAULT_PORT, "protocol": "TCP"}
    ]
    assert cache["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["volumes"][0] == {
        "name": "cache",
        "hostPath": {"path": "/var/cache/triton-operator", "type": "DirectoryOrCreate"},
    }
    assert [v["name"] for v in pod["volumes"]] == ["cache", "signing-key"]
    # Its metrics (hits, misses, bytes, evictions) are scraped from the same port.
    annotations = daemonset["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(DEFAULT_PORT),
        "prometheus.io/path": "/metrics",
    }
    # The operator reads the port the chart gives the DaemonSet: the pods' sync finds the cache there.
    port = env(docs)["TRITON_OPERATOR_NODE_CACHE_PORT"]
    assert Settings.from_env({"TRITON_OPERATOR_NODE_CACHE_PORT": port}).node_cache_port == DEFAULT_PORT


def test_values_reach_the_daemonset(render: Render) -> None:
    values = {
        "nodeCache": {
            "enabled": True,
            "port": 9123,
            "sizeLimit": "500Gi",
            "hostPath": "/mnt/nvme/triton-cache",
            "leaseSeconds": 3600,
            "oneDownload": True,
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [],
        }
    }
    docs = render(values)
    pod = pod_of(docs)
    [cache] = pod["containers"]
    assert "--size-limit=500Gi" in cache["args"]
    assert "--port=9123" in cache["args"]
    assert "--lease-seconds=3600" in cache["args"]
    assert "--one-download" in cache["args"]  # off by default (the args above)
    assert cache["ports"][0]["hostPort"] == 9123
    assert pod["volumes"][0]["hostPath"]["path"] == "/mnt/nvme/triton-cache"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "tolerations" not in pod
    assert env(docs)["TRITON_OPERATOR_NODE_CACHE_PORT"] == "9123"


def test_on_the_nodes_network_the_cache_listens_on_the_nodes_address_only(render: Render) -> None:
    """For a CNI without the portmap plugin (hostPort): the node's network, bound to status.hostIP."""
    assert "hostNetwork" not in pod_of(render(ON))
    pod = pod_of(render({"nodeCache": {"enabled": True, "hostNetwork": True}}))
    assert (pod["hostNetwork"], pod["dnsPolicy"]) == (True, "ClusterFirstWithHostNet")
    [cache] = pod["containers"]
    assert "--address=$(HOST_IP)" in cache["args"]
    assert cache["env"] == [
        {"name": "TRITON_OPERATOR_LOG_FORMAT", "value": "text"},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]
    assert cache["ports"][0]["hostPort"] == cache["ports"][0]["containerPort"] == DEFAULT_PORT


def test_the_cache_runs_with_least_privilege(render: Render) -> None:
    docs = render(ON)
    pod = pod_of(docs)
    # Its own ServiceAccount, whose one right is to review its callers' tokens (TokenReview).
    assert pod["serviceAccountName"] == "triton-operator-node-cache"
    assert pod["automountServiceAccountToken"] is True
    assert one(docs, "ServiceAccount", "triton-operator-node-cache")["metadata"]["namespace"] == (
        "triton-operator"
    )
    role = one(docs, "ClusterRole", "triton-operator-node-cache")
    assert role["rules"] == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}
    ]
    binding = one(docs, "ClusterRoleBinding", "triton-operator-node-cache")
    assert binding["roleRef"]["name"] == "triton-operator-node-cache"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "triton-operator-node-cache", "namespace": "triton-operator"}
    ]
    [cache] = pod["containers"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in cache["env"]
    [cache] = pod["containers"]
    sc = cache["securityContext"]
    assert (sc["runAsNonRoot"], sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"]) == (
        True,
        True,
        False,
    )
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod and "privileged" not in repr(pod)
    # Only the one-shot init container runs as root, to hand kubelet's new folder to the cache's user.
    [init] = pod["initContainers"]
    assert init["command"] == ["chown", "65532:65532", "/cache"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False


def test_nothing_that_selects_the_operator_selects_the_cache(render: Render) -> None:
    docs = render(ON)
    cache_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for selector in (
        one(docs, "Service", "triton-operator-metrics")["spec"]["selector"],
        one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
    ):
        assert not selector.items() <= cache_labels.items()
    assert not find(docs, "Role")
    # The operator's ClusterRole is not the cache's, and the cache's names only its own ServiceAccount.
    binding = one(docs, "ClusterRoleBinding", "triton-operator-node-cache")
    assert [s["name"] for s in binding["subjects"]] == ["triton-operator-node-cache"]


def test_bad_values_are_refused(helm: Path) -> None:
    assert "is not a port" in render_error(helm, "nodeCache.enabled=true", "nodeCache.port=70000")
    assert "absolute path" in render_error(helm, "nodeCache.enabled=true", "nodeCache.hostPath=cache")


def signing_key_of(docs: list[dict[str, Any]]) -> Path:
    """The chart-made key, written where the operator's setting reads it (tests run outside a pod)."""
    import base64  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    secret = one(docs, "Secret", "triton-operator-node-cache-key")
    path = Path(tempfile.mkdtemp()) / "signing-key"
    path.write_bytes(base64.b64decode(secret["data"]["signing-key"]))
    return path


def test_the_cache_signs_with_a_key_the_chart_makes_and_the_operator_knows_its_public_key(
    render: Render,
) -> None:
    """One Ed25519 key a release, in a Secret kept across upgrades: the cache mounts it
    as a file (never an argument's value or an env var) and signs with it; the operator reads the same
    file and gives new revisions' pods the public key that checks those signatures."""
    from triton_operator.adapters.nodecache.statements import Signer  # noqa: PLC0415

    docs = render(ON)
    secret = one(docs, "Secret", "triton-operator-node-cache-key")
    assert secret["metadata"]["namespace"] == "triton-operator"
    assert set(secret["data"]) == {"signing-key"}
    pod = pod_of(docs)
    [cache] = pod["containers"]
    flag = "--signing-key=/etc/node-cache-key/signing-key"
    assert flag in cache["args"]
    assert {"name": "signing-key", "mountPath": "/etc/node-cache-key", "readOnly": True} in cache[
        "volumeMounts"
    ]
    volume = next(v for v in pod["volumes"] if v["name"] == "signing-key")
    assert volume["secret"]["secretName"] == "triton-operator-node-cache-key"
    assert "PRIVATE" not in repr(cache) and "PRIVATE" not in repr(env(docs))
    # The operator: the same Secret as a file, the path in its setting.
    operator = one(docs, "Deployment")["spec"]["template"]["spec"]
    op_volume = next(v for v in operator["volumes"] if v["name"] == "node-cache-key")
    assert op_volume["secret"] == volume["secret"]
    key_file = env(docs)["TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE"]
    assert key_file == "/etc/node-cache-key/signing-key"
    [container] = operator["containers"]
    assert {"name": "node-cache-key", "mountPath": "/etc/node-cache-key", "readOnly": True} in container[
        "volumeMounts"
    ]
    # What the operator derives from the key is what the cache signs with.
    path = signing_key_of(docs)
    settings = Settings.from_env({"TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE": str(path)})
    assert settings.node_cache_public_key == Signer.from_file(path).public_key()


def test_a_secret_of_ones_own_replaces_the_chart_made_key(render: Render) -> None:
    """Where the chart is rendered without the cluster (Argo CD, helm template), `lookup` finds no
    key and each render would make a new one: there the key comes from a Secret made outside."""
    docs = render({"nodeCache": {"enabled": True, "signingKey": {"existingSecret": "my-cache-key"}}})
    assert not find(docs, "Secret")
    names = {
        v["secret"]["secretName"]
        for d in (one(docs, "DaemonSet"), one(docs, "Deployment"))
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert names == {"my-cache-key"}


def test_without_signing_nothing_of_a_key_is_rendered(render: Render) -> None:
    docs = render({"nodeCache": {"enabled": True, "signingKey": {"enabled": False}}})
    assert not find(docs, "Secret")
    assert "signing-key" not in repr(docs) and "node-cache-key" not in repr(docs)
    assert "TRITON_OPERATOR_NODE_CACHE_SIGNING_KEY_FILE" not in env(docs)
    assert "TRITON_OPERATOR_NODE_CACHE_PORT" in env(docs)


SHARED = {"nodeCache": {"enabled": True, "sharedFiles": {"enabled": True}}}


def test_shared_files_make_the_cache_a_csi_driver_and_the_operator_give_pods_its_volume(
    render: Render,
) -> None:
    """With nodeCache.sharedFiles: the CSIDriver (ephemeral inline volumes, the pod's identity from
    the kubelet, no attach), the cache's args name the kubelet's folder, which it mounts at the same
    path with Bidirectional propagation, privileged (its bind mounts must reach the host); the
    operator gives new revisions' pods the volume."""
    docs = render(SHARED)
    driver = one(docs, "CSIDriver", "files.node-cache.triton-operator.io")
    assert driver["spec"] == {
        "attachRequired": False,
        "podInfoOnMount": True,
        "volumeLifecycleModes": ["Ephemeral"],
        "fsGroupPolicy": "None",
    }
    pod = pod_of(docs)
    [cache] = pod["containers"]
    assert "--shared-files=/var/lib/kubelet" in cache["args"]
    assert {"name": "kubelet", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"} in (
        cache["volumeMounts"]
    )
    assert {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"}} in pod[
        "volumes"
    ]
    assert cache["securityContext"] == {"privileged": True, "runAsUser": 0, "runAsNonRoot": False}
    value = env(docs)["TRITON_OPERATOR_NODE_CACHE_SHARED_FILES"]
    assert Settings.from_env({"TRITON_OPERATOR_NODE_CACHE_SHARED_FILES": value}).node_cache_shared_files
    # Another kubelet root, its trailing slash dropped.
    docs = render(
        {"nodeCache": {"enabled": True, "sharedFiles": {"enabled": True, "kubeletRoot": "/data/kubelet/"}}}
    )
    assert "--shared-files=/data/kubelet" in pod_of(docs)["containers"][0]["args"]
    # Off (the default): none of it.
    docs = render(ON)
    assert not find(docs, "CSIDriver")
    assert "TRITON_OPERATOR_NODE_CACHE_SHARED_FILES" not in env(docs)
    assert "Bidirectional" not in repr(docs) and "--shared-files" not in repr(docs)


def test_bad_shared_files_values_are_refused(helm: Path) -> None:
    on = ("nodeCache.enabled=true", "nodeCache.sharedFiles.enabled=true")
    assert "kubeletRoot" in render_error(helm, *on, "nodeCache.sharedFiles.kubeletRoot=var/lib/kubelet")
    assert "needs nodeCache.signingKey.enabled" in render_error(
        helm, *on, "nodeCache.signingKey.enabled=false"
    )

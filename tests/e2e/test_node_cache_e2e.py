"""The node cache on the real node: `helm install` with nodeCache.enabled runs the cache as a DaemonSet
in the operator's namespace; a TritonService in a namespace enforcing Pod Security `restricted`
serves, and a scale-up pod on the now warm node reads 0 bytes from the store while a client counting
answers through the Service gets every one, its sync checking the cache's bytes by the SHA-256 the
cache signed with the key the chart made (the operator gave the pod its public key). The pods prove
who they are with their projected token, which the cache checks with the real API server's
TokenReview; a caller without one, or with a token for the API server or bound to no pod, gets 401.

Needs the real node of e2e/cluster.py and the images built from the project's files; without them
every test here skips, saying why. The cache runs on the node's network (nodeCache.hostNetwork): the
e2e node's CNI (bridge, host-local, loopback) has no portmap plugin for a hostPort.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, Service

from e2e_helpers import agent_summary, apply, get_ts, kubectl_scale, wait_condition
from inference import LoadClient
from real_pods import adder_source, answering, on_real_node, placement, restricted_with_adder
from testkit import load_chartlib, wait_for
from triton_operator.core.objects.names import AGENT_CONTAINER
from triton_operator.core.repository.cache_rules import PUBLIC_KEY_ENV

ROOT = Path(__file__).resolve().parents[2]


pytestmark = [pytest.mark.cluster]


def sync_summary(pod: Any) -> Any:
    """What the pod's model agent fetched for its first revision (one pod shape: no init container)."""
    summary = agent_summary(pod)
    assert summary is not None, pod.metadata.name
    return summary


def cache_status(host: str, path: str, token: str | None) -> int:
    """The node cache's answer to a GET of ``path`` with ``token`` (None: no Authorization)."""
    conn = http.client.HTTPConnection(host, 8790, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def kubectl_token(kubectl: str, cluster: Path, namespace: str, *audience: str) -> str:
    args = [kubectl, f"--kubeconfig={cluster}", "create", "token", "default", "-n", namespace]
    args += [f"--audience={a}" for a in audience]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_a_scale_up_pod_on_a_warm_node_reads_nothing_from_the_store(  # noqa: PLR0917 (fixtures)
    kube: Client,
    namespace: str,
    store: Any,
    cluster: Path,
    kubectl: str | None,
    tmp_path: Path,
) -> None:
    helm = load_chartlib().find_tool("helm")
    if helm is None or kubectl is None:
        pytest.skip("no helm or kubectl binary (python3 e2e/cluster.py build provides them)")
    # The Triton pods' namespace enforces `restricted`; the operator and its cache live elsewhere.
    bucket = restricted_with_adder(kube, namespace, store, "nc")
    system = f"nc-op-{uuid.uuid4().hex[:6]}"
    kube.create(Namespace(metadata=ObjectMeta(name=system)))
    cache_dir = tmp_path / "node-cache"  # the real node is this machine: its hostPath is here
    values = {
        "watchNamespaces": [namespace],
        **placement(),
        "nodeCache": {"enabled": True, "hostNetwork": True, "hostPath": str(cache_dir), **placement()},
    }
    (tmp_path / "values.json").write_text(json.dumps(values))

    def helm_run(*args: str) -> str:
        proc = subprocess.run(
            [str(helm), f"--kubeconfig={cluster}", *args],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
        return proc.stdout

    release = f"nc-{uuid.uuid4().hex[:6]}"
    chart = str(ROOT / "charts" / "triton-operator")
    helm_run("install", release, chart, "-n", system, "-f", str(tmp_path / "values.json"), "--wait")
    try:
        apply(kube, on_real_node("cached", namespace, bucket=bucket, endpoint=store.endpoint))
        wait_condition(kube, namespace, "cached", "Ready", "True", timeout=180)
        pods: list[Any] = list(
            kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": "cached"})
        )
        (first,) = pods
        assert not [v for v in first.spec.volumes or [] if v.hostPath is not None]
        cold = sync_summary(first)
        assert (cold.fetched, cold.node_cache_hits, cold.node_cache_misses) == (len(adder_source(0)), 0, 1)
        assert cold.node_cache_vouched == 0
        # The chart made the cache's key; the cache signs with it and the operator gave the pod its
        # public key (the cache logs the public key it signs with at start).
        (sync_container,) = [c for c in first.spec.containers if c.name == AGENT_CONTAINER]
        public_key = {e.name: e.value for e in sync_container.env or []}.get(PUBLIC_KEY_ENV)
        assert public_key, "the operator gave the pod no public key of the node cache"
        name_label = "app.kubernetes.io/name"
        (cache_pod,) = kube.list(Pod, namespace=system, labels={name_label: "triton-operator-node-cache"})
        assert cache_pod.spec is not None and cache_pod.metadata is not None and cache_pod.metadata.name
        assert "--signing-key=/etc/node-cache-key/signing-key" in (cache_pod.spec.containers[0].args or [])
        cache_log = "".join(kube.log(cache_pod.metadata.name, namespace=system))
        assert f"its public key is {public_key}" in cache_log, cache_log[-2000:]
        # The first pod gave the node its object: kept once (named by its SHA-256), reached by this
        # namespace's index only.
        (entry,) = (cache_dir / "index" / namespace / "md5").iterdir()
        assert list((cache_dir / "blobs").iterdir())
        assert not [p for p in (cache_dir / "index").iterdir() if p.name != namespace]

        # Callers that are not a pod of a TritonService get 401 (the real API server's TokenReview).
        node = str(first.status.hostIP)
        path = f"/v1/objects/md5/{entry.name}"
        assert cache_status(node, "/healthz", None) == 200
        assert cache_status(node, path, None) == 401
        assert cache_status(node, path, kubectl_token(kubectl, cluster, namespace)) == 401
        unbound = kubectl_token(kubectl, cluster, namespace, "triton-operator-node-cache")
        assert cache_status(node, path, unbound) == 401

        service = kube.get(Service, "cached", namespace=namespace)
        assert service.spec is not None and service.spec.clusterIP
        host = str(service.spec.clusterIP)
        answering(host, 0)  # Ready: kube-proxy may not have the endpoints yet (CI: refused once)
        client = LoadClient(host, max_seconds=300).start()
        kubectl_scale(kubectl, cluster, namespace, "cached", 2)

        def synced(pod: Any) -> bool:
            return agent_summary(pod) is not None

        def second() -> Any:
            now: list[Any] = list(
                kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": "cached"})
            )
            found = [p for p in now if p.metadata.uid != first.metadata.uid and synced(p)]
            return found[0] if found else None

        try:
            warm = sync_summary(wait_for(second, timeout=120, what="the scale-up pod's sync to finish"))
            wait_condition(kube, namespace, "cached", "Ready", "True", timeout=180)
        finally:
            client.stop()
        assert (warm.fetched, warm.node_cache_hits, warm.node_cache_misses) == (0, 1, 0)
        # Its sync checked the cache's bytes against the SHA-256 the cache signed, not its MD5 pin.
        assert warm.node_cache_vouched == 1
        # Serving went on all along: every request answered, all by the model it pinned.
        assert client.sent > 0 and not client.failures, client.summary()
        assert set(client.answers) == {0.0}, client.summary()
        served = wait_for(
            lambda: [t for t in get_ts(kube, namespace, "cached")["status"].get("timeToServe") or []],
            timeout=30,
            what="status.timeToServe",
        )
        assert served
    finally:
        helm_run("uninstall", release, "-n", system, "--wait", "--timeout", "120s")
        kube.delete(Namespace, system)

"""The node cache on the real node: `helm install` with nodeCache.enabled runs the cache as a DaemonSet
in the operator's namespace; a TritonService in a namespace enforcing Pod Security `restricted`
serves, and a scale-up pod on the now warm node reads 0 bytes from the store.

Needs the real node of e2e/cluster.py and the images built from the project's files; without them
every test here skips, saying why. The cache runs on the node's network (nodeCache.hostNetwork): the
e2e node's CNI (bridge, host-local, loopback) has no portmap plugin for a hostPort.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from e2e_helpers import apply, create_store_secret, get_ts, kubectl_scale, wait_condition
from real_pods import adder_source, on_real_node, placement
from testkit import load_chartlib, wait_for
from triton_operator.core.startup import parse_summary

ROOT = Path(__file__).resolve().parents[2]
MODEL_KEY = "models/add_sub/1/model.py"

pytestmark = [pytest.mark.cluster]


def sync_summary(pod: Any) -> Any:
    (sync,) = pod.status.initContainerStatuses
    assert sync.state.terminated.exitCode == 0
    summary = parse_summary(sync.state.terminated.message)
    assert summary is not None, sync.state.terminated.message
    return summary


def test_a_scale_up_pod_on_a_warm_node_reads_nothing_from_the_store(  # noqa: PLR0917 (fixtures)
    kube: Client,
    namespace: str,
    store: Any,
    cluster: Path,
    kubectl: str | None,
    tmp_path: Path,
) -> None:
    import storage_servers  # noqa: PLC0415

    helm = load_chartlib().find_tool("helm")
    if helm is None or kubectl is None:
        pytest.skip("no helm or kubectl binary (python3 e2e/cluster.py build provides them)")
    bucket = f"nc-{uuid.uuid4().hex[:8]}"
    store.extra["s3"].create_bucket(Bucket=bucket)
    store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY, Body=adder_source(0))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    # The Triton pods' namespace enforces `restricted`; the operator and its cache live elsewhere.
    kube.patch(
        Namespace, namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
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
        assert list((cache_dir / "objects" / "md5").iterdir())  # the first pod gave the node its object

        kubectl_scale(kubectl, cluster, namespace, "cached", 2)

        def synced(pod: Any) -> bool:
            statuses = (pod.status.initContainerStatuses if pod.status else None) or []
            return (
                bool(statuses) and statuses[0].state is not None and statuses[0].state.terminated is not None
            )

        def second() -> Any:
            now: list[Any] = list(
                kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": "cached"})
            )
            found = [p for p in now if p.metadata.uid != first.metadata.uid and synced(p)]
            return found[0] if found else None

        warm = sync_summary(wait_for(second, timeout=120, what="the scale-up pod's sync to finish"))
        assert (warm.fetched, warm.node_cache_hits, warm.node_cache_misses) == (0, 1, 0)
        served = wait_for(
            lambda: [t for t in get_ts(kube, namespace, "cached")["status"].get("timeToServe") or []],
            timeout=30,
            what="status.timeToServe",
        )
        assert served
    finally:
        helm_run("uninstall", release, "-n", system, "--wait", "--timeout", "120s")
        kube.delete(Namespace, system)

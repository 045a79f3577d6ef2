"""Checks that the local test cluster (e2e/cluster.py) behaves like a real Kubernetes.

Uses the cluster named by $KUBECONFIG when set (e.g. `eval "$(e2e/cluster env)"`),
otherwise starts one with cluster.up() for this module and stops it afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import cluster  # e2e/cluster.py (e2e/ is on pytest's pythonpath)

pytestmark = pytest.mark.cluster

GPU_NODES = set(cluster.GPU_NODES)


@dataclass
class Kube:
    kubectl: str
    kubeconfig: str
    namespace: str

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        return proc

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def apply(self, obj: dict[str, Any], *extra: str) -> None:
        self.run(
            "apply", "--server-side", "--field-manager=e2e-test", *extra, "-f", "-", stdin=json.dumps(obj)
        )

    def pod(self, name: str) -> Any:
        return self.json("get", "pod", name, "-n", self.namespace)


def wait_for(what: str, fn: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions", []) or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    started = False
    env_kc = os.environ.get("KUBECONFIG")
    if env_kc:
        kubeconfig = env_kc
        kubectl = str(cluster.bin_dir() / "kubectl")
        if not os.path.exists(kubectl):
            kubectl = shutil.which("kubectl") or ""
        if not kubectl:
            pytest.skip("KUBECONFIG is set but no kubectl found (run `e2e/cluster build`)")
    else:
        try:
            bins = cluster.build()
        except Exception as e:  # any build failure means: no cluster here
            pytest.skip(f"local cluster binaries could not be built (e2e/cluster build): {e}")
        kubectl = str(bins / "kubectl")
        kubeconfig = str(cluster.up())
        started = True
    ns = f"e2e-cluster-{uuid.uuid4().hex[:6]}"
    k = Kube(kubectl, kubeconfig, ns)
    try:
        k.run("create", "namespace", ns)
        wait_for(
            "default ServiceAccount in " + ns,
            lambda: k.run("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
        )
        yield k
    finally:
        k.run("delete", "namespace", ns, "--wait=false", check=False)
        if started:
            cluster.down()


@pytest.fixture(scope="module")
def fake_nodes(kube: Kube) -> None:
    names = {n["metadata"]["name"] for n in kube.json("get", "nodes")["items"]}
    if not names >= GPU_NODES:
        pytest.skip(f"cluster has no kwok GPU nodes {sorted(GPU_NODES)} (not an e2e/cluster cluster)")


def pod_manifest(name: str, gpus: int = 0, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {"name": "main", "image": "registry.invalid/triton-e2e:fake", "resources": resources}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def test_version_is_pinned(kube: Kube) -> None:
    v = json.loads(kube.run("version", "-o", "json").stdout)
    assert v["serverVersion"]["gitVersion"] == cluster.KUBERNETES_VERSION
    assert v["serverVersion"]["minor"] == cluster.KUBERNETES_VERSION.split(".")[1]


def test_default_service_account_exists(kube: Kube) -> None:
    sa = kube.json("get", "serviceaccount", "default", "-n", "default")
    assert sa["metadata"]["name"] == "default"


def test_server_side_apply(kube: Kube) -> None:
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ssa", "namespace": kube.namespace},
        "data": {"a": "1"},
    }
    kube.apply(cm)
    cm["data"] = {"a": "2", "b": "3"}
    kube.apply(cm)
    got = kube.json("get", "configmap", "ssa", "-n", kube.namespace, "--show-managed-fields")
    assert got["data"] == {"a": "2", "b": "3"}
    managers = {(m["manager"], m["operation"]) for m in got["metadata"]["managedFields"]}
    assert ("e2e-test", "Apply") in managers
    # a second manager claiming the same field conflicts
    cm2 = {**cm, "data": {"a": "other"}}
    proc = kube.run(
        "apply",
        "--server-side",
        "--field-manager=someone-else",
        "-f",
        "-",
        stdin=json.dumps(cm2),
        check=False,
    )
    assert proc.returncode != 0
    assert "conflict" in (proc.stdout + proc.stderr).lower()


def test_gpu_pod_is_scheduled_and_ready(kube: Kube, fake_nodes: None) -> None:
    kube.apply(pod_manifest("gpu-2", gpus=2), f"--namespace={kube.namespace}")

    def ready() -> Any:
        p = kube.pod("gpu-2")
        c = condition(p, "Ready")
        return p if c and c["status"] == "True" else None

    pod = wait_for("gpu-2 Ready", ready)
    assert pod["spec"]["nodeName"] in GPU_NODES
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["ready"] is True


def test_too_many_gpus_stays_pending(kube: Kube, fake_nodes: None) -> None:
    kube.apply(pod_manifest("gpu-5", gpus=5), f"--namespace={kube.namespace}")

    def unschedulable() -> Any:
        c = condition(kube.pod("gpu-5"), "PodScheduled")
        return c if c and c["status"] == "False" and c.get("reason") == "Unschedulable" else None

    c = wait_for("gpu-5 Unschedulable", unschedulable)
    assert "nvidia.com/gpu" in c.get("message", "")
    time.sleep(2)
    pod = kube.pod("gpu-5")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_never_ready_pod(kube: Kube, fake_nodes: None) -> None:
    kube.apply(
        pod_manifest("never-ready", gpus=1, annotations={cluster.NEVER_READY_ANNOTATION: "true"}),
        f"--namespace={kube.namespace}",
    )
    wait_for("never-ready Running", lambda: kube.pod("never-ready")["status"].get("phase") == "Running")
    time.sleep(4)
    pod = kube.pod("never-ready")
    assert pod["status"]["phase"] == "Running"
    ready = condition(pod, "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    assert all(not cs["ready"] for cs in pod["status"]["containerStatuses"])


def test_crash_loop_pod(kube: Kube, fake_nodes: None) -> None:
    kube.apply(
        pod_manifest("crasher", annotations={cluster.CRASH_ANNOTATION: "true"}),
        f"--namespace={kube.namespace}",
    )

    def crashing() -> Any:
        for cs in kube.pod("crasher")["status"].get("containerStatuses") or []:
            waiting = cs.get("state", {}).get("waiting") or {}
            if waiting.get("reason") == "CrashLoopBackOff":
                return cs
        return None

    cs = wait_for("crasher in CrashLoopBackOff", crashing)
    assert cs["restartCount"] > 0
    assert cs["ready"] is False
    ready = condition(kube.pod("crasher"), "Ready")
    assert ready is not None
    assert ready["status"] == "False"
    time.sleep(3)
    assert crashing(), "CrashLoopBackOff state must persist"


def test_owner_reference_garbage_collection(kube: Kube) -> None:
    ns = kube.namespace
    kube.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": ns}, "data": {}}
    )
    owner_uid = kube.json("get", "configmap", "owner", "-n", ns)["metadata"]["uid"]
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "dependent",
                "namespace": ns,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}
                ],
            },
            "data": {},
        }
    )
    kube.run("delete", "configmap", "owner", "-n", ns)
    wait_for(
        "dependent ConfigMap garbage-collected",
        lambda: kube.run("get", "configmap", "dependent", "-n", ns, check=False).returncode != 0,
        timeout=60,
    )


def test_gateway_api_crds_established(kube: Kube) -> None:
    for name in ("httproutes.gateway.networking.k8s.io", "grpcroutes.gateway.networking.k8s.io"):
        crd = kube.json("get", "crd", name)
        c = condition(crd, "Established")
        assert c is not None
        assert c["status"] == "True", name
    # the API is served: listing HTTPRoutes works
    kube.run("get", "httproutes.gateway.networking.k8s.io", "-n", kube.namespace)

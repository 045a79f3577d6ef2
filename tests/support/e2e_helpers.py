"""Helpers of the cluster tests: TritonService bodies, applying them, reading their conditions.

Imported by basename (tests/support is on pytest's `pythonpath`): ``from e2e_helpers import tritonservice``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Pod, Secret, Service
from lightkube.types import PatchType

import cluster as local_cluster  # e2e/cluster.py (e2e/ is on pytest's pythonpath)
from testkit import REPO, free_port, stop_process, wait_for, wait_healthy

TS = create_namespaced_resource("triton-operator.io", "v1alpha1", "TritonService", "tritonservices")
SERVICE_LABEL = "triton-operator.io/service"
REVISION_LABEL = "triton-operator.io/revision"
NEVER_READY = "triton-operator.io/e2e-never-ready"
CRASH = "triton-operator.io/e2e-crash"

PYTHON_MODEL = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}
UNPINNED_REPOSITORY = {"uri": "s3://models/tiny", "endpoint": "http://seaweedfs.storage:8333"}

# A model the CRD admits and the operator refuses: an ensemble step naming a model that is not there.
ENSEMBLE_OF_A_MISSING_MODEL = {
    "name": "pipeline",
    "config": {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [{"name": "IN", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": "missing",
                    "inputMap": {"INPUT0": "IN"},
                    "outputMap": {"OUTPUT0": "OUT"},
                }
            ]
        },
    },
}


def tritonservice(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """A TritonService of two replicas serving the Python model `add` from the unpinned repository;
    ``spec`` fields replace those (copied, so the body shares nothing with the caller)."""
    body: dict[str, Any] = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "resources": {"cpu": "500m", "memory": "1Gi"},
            "repository": dict(UNPINNED_REPOSITORY),
            "models": [{"name": "add", "config": copy.deepcopy(PYTHON_MODEL)}],
        },
    }
    body["spec"].update(copy.deepcopy(spec))
    return body


SMALL = {"cpu": "100m", "memory": "256Mi"}
"""What the kwok rollout and autoscaling tests' pods ask for (many fit the fake nodes)."""


def small_tritonservice(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """``tritonservice`` with SMALL resources unless ``spec`` names others."""
    return tritonservice(name, namespace, **{"resources": SMALL, **spec})


def as_dict(obj: Any) -> dict[str, Any]:
    """A lightkube object as the API returns it (camelCase dict)."""
    out: dict[str, Any] = obj.to_dict()
    return out


def apply(kube: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of a TritonService as the user `e2e-user`; the stored object."""
    result = kube.patch(
        TS,
        body["metadata"]["name"],
        body,
        namespace=body["metadata"]["namespace"],
        patch_type=PatchType.APPLY,
        field_manager="e2e-user",
        force=True,
    )
    return as_dict(result)


def get_ts(kube: Client, namespace: str, name: str) -> dict[str, Any]:
    return as_dict(kube.get(TS, name, namespace=namespace))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """Condition ``kind`` of ``obj``'s status; {} when there is none."""
    return next((dict(c) for c in obj.get("status", {}).get("conditions") or [] if c["type"] == kind), {})


def observed(obj: dict[str, Any]) -> bool:
    """Whether the status speaks of the object's current generation."""
    return bool(obj.get("status", {}).get("observedGeneration") == obj["metadata"]["generation"])


def wait_condition(
    kube: Client,
    namespace: str,
    name: str,
    kind: str,
    status: str,
    *,
    reason: str | None = None,
    timeout: float = 90,
) -> dict[str, Any]:
    """Wait until condition ``kind`` has ``status`` (and ``reason``) for the current generation."""

    def probe() -> dict[str, Any] | None:
        obj = get_ts(kube, namespace, name)
        c = condition(obj, kind)
        ok = observed(obj) and c.get("status") == status and (reason is None or c.get("reason") == reason)
        return obj if ok else None

    what = f"{namespace}/{name} {kind}={status}" + (f" ({reason})" if reason else "")
    return wait_for(probe, timeout=timeout, what=what)


def owned(kube: Client, resource: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    """The objects of ``resource`` labelled as the TritonService ``name``'s."""
    return [as_dict(o) for o in kube.list(resource, namespace=namespace, labels={SERVICE_LABEL: name})]


def names(objects: list[dict[str, Any]]) -> set[str]:
    return {o["metadata"]["name"] for o in objects}


# Kubernetes' own controllers write the status (and revision annotation) of a Deployment long after
# the operator is done with it, e.g. when the last pod of a scaled-down revision is gone.
CONTROLLER_MANAGERS = frozenset({"kube-controller-manager"})


def written_version(obj: dict[str, Any]) -> str:
    """What changes when anyone but Kubernetes' own controllers writes the object.

    The resourceVersion, except for a Deployment, whose status the deployment controller keeps
    writing: there, its generation (any spec change) and the managedFields entries of every other
    field manager (whose times move on any write that changes what they own).
    """
    meta = obj["metadata"]
    if obj.get("kind") != "Deployment":
        return str(meta["resourceVersion"])
    others = [
        {k: e.get(k) for k in ("manager", "operation", "subresource", "time")}
        for e in meta.get("managedFields") or []
        if e.get("manager") not in CONTROLLER_MANAGERS
    ]
    return json.dumps({"generation": meta.get("generation"), "managedFields": others}, sort_keys=True)


def versions(kube: Client, namespace: str, name: str) -> dict[str, str]:
    """What each of the TritonService, its Deployments, ConfigMaps and Services was last written as.

    Equal before and after means nobody but Kubernetes' own controllers wrote any of them
    (see `written_version`).
    """
    out = {"TritonService": get_ts(kube, namespace, name)["metadata"]["resourceVersion"]}
    for resource in (Deployment, ConfigMap, Service):
        for o in owned(kube, resource, namespace, name):
            out[f"{o['kind']}/{o['metadata']['name']}"] = written_version(o)
    return out


def kubectl_scale(kubectl: str, cluster: Path, namespace: str, name: str, replicas: int) -> str:
    """`kubectl scale tsvc/NAME --replicas=N`: through the TritonService's /scale subresource."""
    out = subprocess.run(
        [
            kubectl,
            f"--kubeconfig={cluster}",
            "-n",
            namespace,
            "scale",
            f"tsvc/{name}",
            f"--replicas={replicas}",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return out.stdout.strip()


def kubectl_triton(cluster: Path, *args: str) -> str:
    """Run the `kubectl-triton` console script (as kubectl runs a plugin) against the cluster."""
    script = shutil.which("kubectl-triton", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "triton_operator.kubectl_plugin"]
    proc = subprocess.run(
        [*command, *args],
        env={**os.environ, "KUBECONFIG": str(cluster)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl triton {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def events(kube: Client, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the operator's Events about the TritonService, oldest first."""
    found = [
        e
        for e in kube.list(Event, namespace=namespace)
        if e.involvedObject.kind == "TritonService"
        and e.involvedObject.name == name
        and (e.source is not None and e.source.component == "triton-operator")
    ]
    found.sort(key=lambda e: int(e.metadata.resourceVersion or 0))
    return [(str(e.type), str(e.reason), str(e.message)) for e in found]


def store_repository(server: Any, bucket: str, **extra: Any) -> dict[str, Any]:
    """spec.repository for s3://BUCKET/models on a seaweedfs ``server``, read with the Secret
    create_store_secret makes; ``extra`` adds fields (pollIntervalSeconds, ...)."""
    return {
        "uri": f"s3://{bucket}/models",
        "endpoint": server.endpoint,
        "credentialsSecret": "store",
        **extra,
        "s3": {"addressingStyle": "path"},
    }


def create_store_secret(kube: Client, namespace: str, access: str, secret: str, name: str = "store") -> None:
    """The credentials Secret a TritonService's repository.credentialsSecret names (S3 keys)."""
    metadata = ObjectMeta(name=name, namespace=namespace)
    kube.create(
        Secret(metadata=metadata, stringData={"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret})
    )


# ----------------------------------------------------------------- operators and stores of a test's own


def write_token_kubeconfig(admin: Path, token: str, out: Path) -> Path:
    """The admin kubeconfig's cluster (server, CA) with ``token`` as the only user."""
    config = yaml.safe_load(admin.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    out.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "operator-sa", "user": {"token": token}}],
                "contexts": [
                    {"name": "operator-sa", "context": {"cluster": cluster["name"], "user": "operator-sa"}}
                ],
                "current-context": "operator-sa",
            }
        )
    )
    out.chmod(0o600)
    return out


@dataclass
class LocalOperator:
    """`triton-operator run ARGS` as a subprocess, authenticated by ``kubeconfig`` alone."""

    kubeconfig: Path
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "triton_operator.cli",
            "run",
            *self.args,
            "--metrics-port",
            "0",
            "--liveness",
            f"http://127.0.0.1:{port}/healthz",
        ]
        # Nothing of the test's own environment may authenticate the operator: only the kubeconfig.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "TRITON_OPERATOR_"))}
        env.update({"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", **self.env})
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )
        wait_healthy(self.process, port, self.log, timeout=60)

    def stop(self) -> None:
        stop_process(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def s3_client(server: Any) -> Any:
    import storage_servers  # noqa: PLC0415 (boto3 is loaded only by the tests that need a store)

    return storage_servers.s3_client(server.endpoint)


# ----------------------------------------------------------------- the cluster's custom metrics API


def metrics_write_url(kubeconfig: Path) -> str | None:
    """Where the metrics adapter of the cluster of ``kubeconfig`` takes values, or None if it has none.

    $TRITON_E2E_METRICS_WRITE_URL (`e2e/cluster.py env` exports it with KUBECONFIG), else the URL that
    e2e/cluster.py recorded when ``kubeconfig`` is its own.
    """
    url = os.environ.get(local_cluster.METRICS_WRITE_URL_ENV)
    if url:
        return url
    if kubeconfig.resolve() == local_cluster.kubeconfig_path().resolve():
        return local_cluster.metrics_write_url()
    return None


@dataclass(frozen=True)
class CustomMetrics:
    """The custom metrics API of an e2e/cluster.py cluster: values written to its adapter
    (sigs.k8s.io/custom-metrics-apiserver's test provider), read back through kube-apiserver."""

    write_url: str
    kubeconfig: Path

    def write(self, namespace: str, resource: str, name: str, metric: str, value: int | str) -> None:
        """Set ``metric`` of the object ``resource``/``name`` (e.g. "pods"/"web-0") to ``value``, a
        Kubernetes quantity (``3``, ``"300m"``). The adapter keeps it until it is written again."""
        parts = [namespace, resource, name, metric]
        for what, part in zip(("namespace", "resource", "name", "metric"), parts, strict=True):
            if not part or "/" in part:
                raise ValueError(f"metric {what} must be a non-empty path segment, got {part!r}")
        path = "/".join(urllib.parse.quote(x, safe="") for x in parts)
        request = urllib.request.Request(
            f"{self.write_url}/namespaces/{path}",
            data=json.dumps(str(value)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def write_all(
        self, kube: Client, namespace: str, selector: dict[str, str], metric: str, value: int | str
    ) -> list[str]:
        """Set ``metric`` to ``value`` for every pod of ``namespace`` that ``selector`` matches (an HPA counts
        a pod without a value as missing); the pods' names."""
        labels: dict[str, Any] = dict(selector)
        listed = kube.list(Pod, namespace=namespace, labels=labels)
        pods = sorted(p.metadata.name for p in listed if p.metadata is not None and p.metadata.name)
        for pod in pods:
            self.write(namespace, "pods", pod, metric, value)
        return pods

    def read(
        self,
        namespace: str,
        resource: str,
        metric: str,
        *,
        name: str = "*",
        selector: str = "",
        version: str = "v1beta2",
    ) -> dict[str, str]:
        """``metric`` of ``resource``/``name`` (``*``: every object ``selector`` matches) as kube-apiserver
        serves it from /apis/custom.metrics.k8s.io/<version>: described object name -> value."""
        path = f"/apis/custom.metrics.k8s.io/{version}/namespaces/{namespace}/{resource}/{name}/{metric}"
        if selector:
            path += "?" + urllib.parse.urlencode({"labelSelector": selector})
        body = self.get_raw(path)
        items = body["items"] if body.get("kind") == "MetricValueList" else [body]
        return {i["describedObject"]["name"]: i["value"] for i in items}

    def get_raw(self, path: str) -> dict[str, Any]:
        """GET ``path`` from kube-apiserver with the kubeconfig (kubectl get --raw)."""
        kubectl = local_cluster.bin_dir() / "kubectl"
        command = str(kubectl) if kubectl.exists() else shutil.which("kubectl")
        assert command, "no kubectl (python3 e2e/cluster.py build provides one)"
        return get_raw(command, self.kubeconfig, path)


def get_raw(kubectl: str, kubeconfig: Path, path: str) -> dict[str, Any]:
    """``kubectl get --raw PATH`` against the cluster of ``kubeconfig``, parsed; fails the test with
    kubectl's stderr when it exits non-zero."""
    proc = subprocess.run(
        [kubectl, f"--kubeconfig={kubeconfig}", "get", "--raw", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl get --raw {path}: {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def agent_summary(pod: Any) -> Any:
    """What a pod of the one shape fetched for its first revision: the summary its model agent serves
    in its status (GET <pod IP>:8009/v1/inplace), as a sync init container would have left it as its
    termination message (core.pod.startup.SyncSummary); None until its first fill is done."""
    from triton_operator.core.pod.startup import parse_summary  # noqa: PLC0415 - the operator's own parser

    ip = pod.status.podIP if pod.status else None
    if not ip:
        return None
    try:
        with urllib.request.urlopen(f"http://{ip}:8009/v1/inplace", timeout=5) as reply:
            status = json.loads(reply.read())
    except OSError:
        return None
    return parse_summary(status.get("summary"))

#!/usr/bin/env python3
"""Control-plane benchmark: the operator against a real API server (kwok pods); prints one markdown table.

What it measures, with `triton-operator run -A` as a subprocess (metrics on, repositories unpinned):

* apply -> Deployment: a spec change of one TritonService makes a new revision; the time from the
  apply call returning to the new Deployment's ADDED event on this script's own watch. ``--changes``
  changes in a row (each waits until the rollout it started has settled), with 1 TritonService and
  again with ``--count`` present.
* ``--count`` TritonServices created at once (``--connections`` concurrent requests): the time from
  the first create until every one has its Deployment, ConfigMap and Service and a status whose
  observedGeneration is its generation (all seen on watches).
* the operator's peak RSS: VmHWM of its process, read at the end.
* the operator's API requests over ``--idle-seconds`` of quiet, with 1 and with ``--count``
  TritonServices. The operator authenticates as its own ServiceAccount, and one FlowSchema per
  (verb, resource) matches only that account (API Priority and Fairness, priority level ``exempt``:
  the same treatment as the admin identity the tests use), so the API server's own
  ``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` counts exactly its requests,
  whatever else talks to the API server; nothing sits between the operator and the API server.
* a canary with steps [setWeight 50, setWeight 100]: the time from a canary pod turning Ready (its
  watch event) to the next step being taken (status.currentStepIndex advancing, or the canary
  Deployment being scaled, whichever is seen first). While the rollout engine is not wired into
  the reconcile, the equivalent: the new revision's last pod Ready -> the stable revision switching
  or the old Deployment being deleted; the table says which it measured.

Cluster: $KUBECONFIG when set, else e2e/cluster.py's (reused when up, else started and stopped;
set TRITON_OPERATOR_CLUSTER_DIR for a private one). kwok nodes are added so that every pod fits.

  .venv/bin/python bench/control_plane/run.py                        # the full run (~25 min)
  .venv/bin/python bench/control_plane/run.py --count 100 --changes 20 --idle-seconds 20   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx2
import yaml

from triton_operator import GROUP, PLURAL, VERSION
from triton_operator.core.objects.names import LABEL_MANAGED_BY, LABEL_REVISION, LABEL_SERVICE, MANAGED_BY

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = REPO / "e2e"
CRD_FILE = REPO / "crds" / "tritonservices.yaml"

FIELD_MANAGER = "cp-bench"
RUN_LABEL = "cp-bench.triton-operator.io/run"
WATCH_LABEL = "cp-bench.triton-operator.io/watch"
"""Pods this script watches (those of the probe and the canary; not the --count ones)."""
CHANGE_ANNOTATION = "cp-bench.triton-operator.io/change"
SYSTEM_NAMESPACE = "cp-bench-system"
OPERATOR_ACCOUNT = "triton-operator"
FLOW_PREFIX = "cp-bench-op-"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_PREFIX = "cp-bench-node-"
OWNED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
READ_VERBS = frozenset({"get", "list", "watch"})
FLOW_RESOURCES = (
    f"{PLURAL}",
    f"{PLURAL}/status",
    "deployments",
    "pods",
    "configmaps",
    "services",
    "events",
)

PYTHON_MODEL: dict[str, Any] = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "INPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUTPUT0", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}

# Targets of issue 7.
TARGET_P50_S = 0.050
TARGET_P99_S = 0.250
TARGET_SCALE_S = 60.0
TARGET_RSS_MB = 200.0
TARGET_STEP_S = 1.0
READ_SLACK = 5
"""Idle reads at --count may exceed those at 1 by this many (a watch reconnecting) and still pass."""

Key = tuple[str, str]


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# ===================================================================================== API access


class ApiError(Exception):
    def __init__(self, method: str, path: str, code: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {code}: {text[:400]}")
        self.code = code


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where the API server is and how the admin identity of the kubeconfig talks to it."""

    server: str
    verify: ssl.SSLContext
    headers: dict[str, str]
    ca_data: bytes | None
    insecure: bool


def _pick(items: Iterable[Mapping[str, Any]], name: str, field: str) -> dict[str, Any]:
    for item in items:
        if item.get("name") == name:
            return dict(item.get(field) or {})
    raise ValueError(f"kubeconfig names no {field} {name!r}")


def read_kubeconfig(path: Path) -> Endpoint:
    cfg = yaml.safe_load(path.read_text())
    context = _pick(cfg.get("contexts") or [], cfg.get("current-context", ""), "context")
    cluster = _pick(cfg.get("clusters") or [], context.get("cluster", ""), "cluster")
    user = _pick(cfg.get("users") or [], context.get("user", ""), "user") if context.get("user") else {}
    base = path.parent
    ca: bytes | None = None
    if cluster.get("certificate-authority-data"):
        ca = base64.b64decode(cluster["certificate-authority-data"])
    elif cluster.get("certificate-authority"):
        ca = (base / cluster["certificate-authority"]).read_bytes()
    insecure = bool(cluster.get("insecure-skip-tls-verify"))
    verify = ssl.create_default_context(cadata=ca.decode() if ca else None)
    if insecure:
        verify.check_hostname = False
        verify.verify_mode = ssl.CERT_NONE
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    if cert and key:
        folder = Path(tempfile.mkdtemp(prefix="cp-bench-cert-"))
        (folder / "c.crt").write_bytes(base64.b64decode(cert))
        (folder / "c.key").write_bytes(base64.b64decode(key))
        verify.load_cert_chain(str(folder / "c.crt"), str(folder / "c.key"))
    elif user.get("client-certificate") and user.get("client-key"):
        verify.load_cert_chain(str(base / user["client-certificate"]), str(base / user["client-key"]))
    headers: dict[str, str] = {}
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = (base / user["tokenFile"]).read_text().strip()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return Endpoint(str(cluster["server"]).rstrip("/"), verify, headers, ca, insecure)


WATCH_TIMEOUT = httpx2.Timeout(connect=10.0, read=None, write=10.0, pool=None)


class Api:
    """A lean async client: JSON in and out, server-side apply, and watch streams."""

    def __init__(self, endpoint: Endpoint, connections: int) -> None:
        self.endpoint = endpoint
        self.http = httpx2.AsyncClient(
            base_url=endpoint.server,
            verify=endpoint.verify,
            headers=endpoint.headers,
            limits=httpx2.Limits(max_connections=connections + 16, max_keepalive_connections=connections),
            timeout=httpx2.Timeout(120.0),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
        exists_ok: bool = False,
    ) -> Any:
        headers = {"Content-Type": content_type} if body is not None else None
        content = json.dumps(body).encode() if body is not None else None
        resp = await self.http.request(method, path, content=content, params=params, headers=headers)
        if (resp.status_code == 404 and missing_ok) or (resp.status_code == 409 and exists_ok):
            return None
        if resp.status_code >= 400:
            raise ApiError(method, path, resp.status_code, resp.text)
        return resp.json() if resp.content else None

    async def apply(self, path: str, body: Mapping[str, Any], *, manager: str = FIELD_MANAGER) -> Any:
        """Server-side apply (as `kubectl apply --server-side --force-conflicts`)."""
        return await self.call(
            "PATCH",
            path,
            body,
            params={"fieldManager": manager, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def text(self, path: str) -> str:
        resp = await self.http.get(path)
        if resp.status_code >= 400:
            raise ApiError("GET", path, resp.status_code, resp.text)
        return resp.text


def ts_path(namespace: str, name: str | None = None) -> str:
    base = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    return f"{base}/{name}" if name else base


# ========================================================================= watches and waiting

Predicate = Callable[[str, str, dict[str, Any]], bool]
Listener = Callable[[str, str, dict[str, Any], float], None]


class Bus:
    """Every watch event of every informer: listeners, one-shot expectations, store conditions."""

    def __init__(self) -> None:
        self._tick = asyncio.Event()
        self._expect: list[tuple[Predicate, asyncio.Future[tuple[float, dict[str, Any]]]]] = []
        self.listeners: list[Listener] = []

    def publish(self, source: str, kind: str, obj: dict[str, Any], when: float) -> None:
        for listener in self.listeners:
            listener(source, kind, obj, when)
        if self._expect:
            for predicate, future in self._expect:
                if not future.done() and predicate(source, kind, obj):
                    future.set_result((when, obj))
            self._expect = [(p, f) for p, f in self._expect if not f.done()]
        self._tick.set()
        self._tick = asyncio.Event()

    def expect(self, predicate: Predicate) -> asyncio.Future[tuple[float, dict[str, Any]]]:
        future: asyncio.Future[tuple[float, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._expect.append((predicate, future))
        return future

    async def until(self, check: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``check()`` holds, re-checked after every event; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            tick = self._tick
            if check():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), min(left, 1.0))


def slim(source: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the benchmark keeps of an object: identity, labels, replicas and the status it reads."""
    meta = obj.get("metadata") or {}
    out: dict[str, Any] = {
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "labels", "generation", "resourceVersion", "deletionTimestamp")
            if k in meta
        }
    }
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if source == "deployments":
        out["spec"] = {"replicas": spec.get("replicas")}
        out["status"] = {
            k: status[k]
            for k in ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas")
            if k in status
        }
    elif source == "pods":
        out["status"] = {"conditions": status.get("conditions") or [], "phase": status.get("phase")}
    elif source == PLURAL:
        out["status"] = {k: v for k, v in status.items() if k not in ("history", "models", "conditions")}
    return out


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def obj_generation(obj: Mapping[str, Any]) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


class Informer:
    """List + watch of one collection (all namespaces), a slim store, events onto the bus."""

    def __init__(self, api: Api, bus: Bus, source: str, path: str, selector: str | None = None) -> None:
        self.api = api
        self.bus = bus
        self.source = source
        self.path = path
        self.selector = selector
        self.objects: dict[Key, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.events = 0

    def _params(self) -> dict[str, str]:
        return {"labelSelector": self.selector} if self.selector else {}

    def _deliver(self, kind: str, obj: dict[str, Any], when: float) -> None:
        kept = slim(self.source, obj)
        key = key_of(kept)
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = kept
        self.events += 1
        self.bus.publish(self.source, kind, kept, when)

    async def _list(self) -> str:
        body = await self.api.call("GET", self.path, params=self._params())
        when = time.monotonic()
        fresh = {key_of(item): item for item in body.get("items") or []}
        for key in list(self.objects):
            if key not in fresh:
                self._deliver("DELETED", self.objects[key], when)
        for key, item in fresh.items():
            old = self.objects.get(key)
            if old is None:
                self._deliver("ADDED", item, when)
            elif old["metadata"].get("resourceVersion") != (item.get("metadata") or {}).get(
                "resourceVersion"
            ):
                self._deliver("MODIFIED", item, when)
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, version: str) -> str | None:
        """Follow the watch from ``version``; the version to resume from, or None to list again."""
        params = {
            **self._params(),
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "900",
        }
        async with self.api.http.stream("GET", self.path, params=params, timeout=WATCH_TIMEOUT) as resp:
            if resp.status_code != 200:
                await resp.aread()
                raise ApiError("WATCH", self.path, resp.status_code, resp.text)
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                when = time.monotonic()
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    return None
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind == "BOOKMARK":
                    continue
                self._deliver(str(kind), obj, when)
        return version

    async def run(self) -> None:
        while True:
            try:
                version: str | None = await self._list()
                self.synced.set()
                while version is not None:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except (httpx2.HTTPError, ApiError, ValueError, KeyError) as exc:
                log(f"watch of {self.source} broke ({type(exc).__name__}: {exc}); listing again")
                await asyncio.sleep(1.0)


# ============================================================================ cluster and setup


@dataclasses.dataclass
class Cluster:
    kubeconfig: Path
    stop: Callable[[], list[str]] | None
    """Tears down a cluster this run started (None: leave it running); what failed or remains."""
    local: Any = None
    """e2e/cluster.py when the cluster is the local one (its signal helpers), else None."""


def reachable(kubeconfig: Path) -> str | None:
    try:
        endpoint = read_kubeconfig(kubeconfig)
        req = urllib.request.Request(endpoint.server + "/readyz", headers=endpoint.headers)
        with urllib.request.urlopen(req, context=endpoint.verify, timeout=5) as resp:
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
        return f"{type(exc).__name__}: {exc}"


def get_cluster(keep: bool) -> Cluster:
    env = os.environ.get("KUBECONFIG")
    if env:
        path = Path(env)
        why = reachable(path)
        if why is not None:
            raise SystemExit(f"$KUBECONFIG={env} does not answer: {why}")
        return Cluster(path, None)
    sys.path.insert(0, str(E2E_DIR))
    import cluster as local  # noqa: PLC0415  (e2e/cluster.py, on the path only from here on)

    if local.is_up():
        log(f"reusing the running local cluster ({local.state_dir()})")
        return Cluster(Path(local.kubeconfig_path()), None, local)
    log(f"starting the local cluster in {local.state_dir()}")
    stop = None if keep else local.down_reporting
    try:
        with local.stop_signals_interrupt():
            kubeconfig = Path(local.up())
    except BaseException:
        if stop is not None:  # what a failed or interrupted up started
            for line in stop(quiet=True):
                log(line)
        raise
    return Cluster(kubeconfig, stop, local)


async def apply_crd(api: Api) -> None:
    doc = yaml.safe_load(CRD_FILE.read_text())
    name = doc["metadata"]["name"]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    await api.apply(path, doc)
    for _ in range(120):
        obj = await api.call("GET", path)
        conditions = (obj.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        await asyncio.sleep(0.25)
    raise RuntimeError(f"CRD {name} not Established")


async def ensure_namespace(api: Api, name: str, labels: Mapping[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}}
    await api.call("POST", "/api/v1/namespaces", body, exists_ok=True)


async def delete_leftover_namespaces(api: Api) -> None:
    """Namespaces of earlier runs on a cluster that stayed up."""
    body = await api.call("GET", "/api/v1/namespaces", params={"labelSelector": RUN_LABEL})
    names = [
        str(n["metadata"]["name"])
        for n in body.get("items") or []
        if not (n.get("metadata") or {}).get("deletionTimestamp")
    ]
    for name in names:
        log(f"deleting namespace {name} of an earlier run")
        await api.call("DELETE", f"/api/v1/namespaces/{name}", missing_ok=True)
    # Wait for them to be gone: the operator watches every namespace and would work on their objects.
    for waited in range(900):
        body = await api.call("GET", "/api/v1/namespaces", params={"labelSelector": RUN_LABEL})
        left = len(body.get("items") or [])
        if not left:
            return
        if waited % 30 == 0:
            log(f"waiting for {left} namespace(s) of an earlier run to be deleted")
        await asyncio.sleep(1.0)
    raise RuntimeError("namespaces of an earlier run are still terminating after 900 s")


def flow_schema_name(verb: str, resource: str | None) -> str:
    return f"{FLOW_PREFIX}{verb}-{(resource or 'other').replace('/', '-')}"


def flow_schemas() -> dict[str, tuple[str, str]]:
    """FlowSchema name -> (verb, resource) that it counts."""
    out = {flow_schema_name(v, r): (v, r) for v in VERBS for r in FLOW_RESOURCES}
    out.update({flow_schema_name(v, None): (v, "other") for v in VERBS})
    out[f"{FLOW_PREFIX}nonresource"] = ("nonresource", "-")
    return out


async def operator_requests(api: Api) -> Counter[tuple[str, str]]:
    """The requests the API server dispatched for the operator so far, by (verb, resource), from its
    per-FlowSchema counters (apiserver_flowcontrol_dispatched_requests_total; see flow_schemas)."""
    text = await api.text("/metrics")
    schemas = flow_schemas()
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            continue
        labels = line.split("{", 1)[1].split("}", 1)[0]
        fields = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
        schema = fields.get("flow_schema", "").strip('"')
        if schema in schemas:
            counts[schemas[schema]] += int(float(line.rsplit(" ", 1)[1]))
    return counts


async def setup_identity(api: Api, work: Path) -> Path:
    """The operator's ServiceAccount (cluster-admin), FlowSchemas counting its requests, its kubeconfig."""
    await ensure_namespace(api, SYSTEM_NAMESPACE)
    await api.call(
        "POST",
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_ACCOUNT}},
        exists_ok=True,
    )
    await api.apply(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/cp-bench-operator",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "cp-bench-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": SYSTEM_NAMESPACE}],
        },
    )
    subject = {
        "kind": "ServiceAccount",
        "serviceAccount": {"name": OPERATOR_ACCOUNT, "namespace": SYSTEM_NAMESPACE},
    }
    everywhere = {"apiGroups": ["*"], "namespaces": ["*"], "clusterScope": True}
    for name, (verb, resource) in flow_schemas().items():
        if verb == "nonresource":
            rule: dict[str, Any] = {
                "subjects": [subject],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }
            precedence = 60
        else:
            resources = ["*"] if resource == "other" else [resource]
            rule = {
                "subjects": [subject],
                "resourceRules": [{"verbs": [verb], "resources": resources, **everywhere}],
            }
            precedence = 60 if resource == "other" else 50
        await api.apply(
            f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}",
            {
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": name},
                "spec": {
                    "matchingPrecedence": precedence,
                    "priorityLevelConfiguration": {"name": "exempt"},
                    "distinguisherMethod": {"type": "ByUser"},
                    "rules": [rule],
                },
            },
        )
    token = await api.call(
        "POST",
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/{OPERATOR_ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86400},
        },
    )
    cluster: dict[str, Any] = {"server": api.endpoint.server}
    if api.endpoint.ca_data:
        cluster["certificate-authority-data"] = base64.b64encode(api.endpoint.ca_data).decode()
    if api.endpoint.insecure:
        cluster["insecure-skip-tls-verify"] = True
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bench", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "operator"}}],
        "current-context": "bench",
    }
    path = work / "operator.kubeconfig"
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


async def teardown_identity(api: Api) -> None:
    for name in flow_schemas():
        await api.call("DELETE", f"/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas/{name}", missing_ok=True)
    await api.call(
        "DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/cp-bench-operator", missing_ok=True
    )
    await api.call("DELETE", f"/api/v1/namespaces/{SYSTEM_NAMESPACE}", missing_ok=True)


def _node_ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


async def ensure_pod_capacity(api: Api, pods_needed: int) -> list[str]:
    """Add kwok nodes (cloned from the cluster's CPU fake node) until ``pods_needed`` more pods fit."""
    nodes = (await api.call("GET", "/api/v1/nodes")).get("items") or []
    fake = [n for n in nodes if (n["metadata"].get("annotations") or {}).get(FAKE_NODE_ANNOTATION) == "fake"]
    if not fake:
        log("no kwok nodes (annotation kwok.x-k8s.io/node=fake): adding none; pods may stay Pending")
        return []
    pods = (await api.call("GET", "/api/v1/pods", params={"limit": "1"})).get("metadata", {})
    used = int(pods.get("remainingItemCount", 0)) + 1
    capacity = sum(int((n.get("status") or {}).get("allocatable", {}).get("pods", "0")) for n in fake)
    template = next(
        (n for n in fake if "nvidia.com/gpu.present" not in n["metadata"].get("labels", {})), fake[0]
    )
    per_node = int(template["status"]["allocatable"].get("pods", "110"))
    short = math.ceil(pods_needed * 1.1) - (capacity - used)
    existing = {n["metadata"]["name"] for n in nodes}
    added: list[str] = []
    index = 0
    while short > 0:
        name = f"{NODE_PREFIX}{index}"
        index += 1
        if name in existing:
            continue
        labels = {**template["metadata"].get("labels", {}), "kubernetes.io/hostname": name}
        labels.pop("nvidia.com/gpu.present", None)
        resources = {
            k: v for k, v in template["status"]["capacity"].items() if not k.startswith("nvidia.com/")
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {},
            "status": {"capacity": resources, "allocatable": dict(resources)},
        }
        await api.call("POST", "/api/v1/nodes", body)
        added.append(name)
        short -= per_node
    for _ in range(240):
        ready = {
            n["metadata"]["name"]
            for n in (await api.call("GET", "/api/v1/nodes")).get("items") or []
            if _node_ready(n)
        }
        if set(added) <= ready:
            break
        await asyncio.sleep(0.5)
    else:
        log(f"warning: added nodes not all Ready: {sorted(set(added))}")
    return added


# ============================================================================== the operator


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Operator:
    """`triton-operator run -A` as a subprocess under its own identity."""

    def __init__(
        self,
        kubeconfig: Path,
        work: Path,
        source: Path | None,
        *,
        extra_args: Iterable[str] = (),
        tracemalloc_frames: int = 0,
        kopf_settings: Mapping[str, Any] | None = None,
        scope: Iterable[str] = ("-A",),
    ) -> None:
        self.scope = list(scope)
        """`run`'s namespace arguments: every namespace by default."""
        self.kubeconfig = kubeconfig
        self.log_path = work / "operator.log"
        self.tracemalloc_path = work / "tracemalloc.txt"
        self.source = source
        self.extra_args = list(extra_args)
        self.tracemalloc_frames = tracemalloc_frames
        self.kopf_settings = dict(kopf_settings or {})
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self, timeout: float = 120.0) -> None:
        wrapper: dict[str, Any] = {}
        if self.tracemalloc_frames:
            wrapper.update(tracemalloc=self.tracemalloc_frames, dump=str(self.tracemalloc_path))
        if self.kopf_settings:
            wrapper["kopf"] = self.kopf_settings
        if wrapper:
            entry = [sys.executable, "-c", RUNNER, json.dumps(wrapper)]
        else:
            entry = [sys.executable, "-m", "triton_operator.cli"]
        cmd = [
            *entry,
            "run",
            *self.scope,
            "--standalone",
            "--metrics-port",
            str(self.metrics_port),
            "--liveness",
            f"http://127.0.0.1:{self.liveness_port}/healthz",
            *self.extra_args,
        ]
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONUNBUFFERED": "1",
            "TRITON_OPERATOR_PIN_REPOSITORIES": "false",
        }
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(self.source), env.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            )
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{self.tail()}")
            try:
                url = f"http://127.0.0.1:{self.liveness_port}/healthz"
                with urllib.request.urlopen(url, timeout=1) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the operator did not become live in {timeout:.0f}s:\n{self.tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def dump_allocations(self) -> list[str]:
        """With --tracemalloc: where the operator's live Python memory was allocated (top sites)."""
        if not self.tracemalloc_frames or not self.alive():
            return []
        self.tracemalloc_path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        for _ in range(600):
            time.sleep(0.5)
            if self.tracemalloc_path.exists() and self.tracemalloc_path.read_text().endswith("END\n"):
                return self.tracemalloc_path.read_text().splitlines()[:-1]
        return ["tracemalloc: no dump in 300 s"]

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    def memory_kb(self) -> dict[str, int]:
        out: dict[str, int] = {}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                field, _, value = line.partition(":")
                if field in ("VmHWM", "VmRSS"):
                    out[field] = int(value.split()[0])
        return out

    def cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def reconciles(self) -> tuple[float, float]:
        """(count, total seconds) of reconciles, from the operator's own /metrics."""
        count = total = 0.0
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
                text = resp.read().decode()
        except (OSError, urllib.error.URLError):
            return count, total
        for line in text.splitlines():
            if line.startswith("triton_operator_reconcile_duration_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
            elif line.startswith("triton_operator_reconcile_duration_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
        return count, total

    def tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# `triton-operator` with what the benchmark adds (argv[1]: JSON; the rest: the CLI's arguments):
# {"tracemalloc": frames, "dump": file} traces allocations and writes the top sites on SIGUSR1;
# {"kopf": {"queueing.worker_limit": 64}} sets kopf settings after the operator's own startup
# handler (experiments with configuration-only fixes; the operator code is not touched).
RUNNER = """
import json, signal, sys
config = json.loads(sys.argv[1])
if config.get("tracemalloc"):
    import tracemalloc
    tracemalloc.start(int(config["tracemalloc"]))

    def dump(*_):
        frames = int(config["tracemalloc"])
        ours = tracemalloc.Filter(False, tracemalloc.__file__)
        snapshot = tracemalloc.take_snapshot().filter_traces([ours])
        now, peak = tracemalloc.get_traced_memory()
        lines = [f"traced Python memory now {now / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB; top by file:line"]
        for stat in snapshot.statistics("lineno")[:25]:
            lines.append(f"  {stat.size / 1e6:8.2f} MB {stat.count:9,d} blocks  {stat.traceback[0]}")
        lines.append("top by traceback (innermost last)")
        for stat in snapshot.statistics("traceback")[:8]:
            lines.append(f"  {stat.size / 1e6:8.2f} MB {stat.count:9,d} blocks")
            lines += ["      " + line.strip() for line in stat.traceback.format()[-2 * frames:][::2]]
        lines.append("END")
        with open(config["dump"], "w") as out:
            out.write("\\n".join(lines) + "\\n")

    signal.signal(signal.SIGUSR1, dump)
if config.get("kopf"):
    import kopf
    from triton_operator import handlers  # noqa: F401  (its startup handler registers first)

    @kopf.on.startup()
    async def bench_settings(settings, logger, **_):
        for dotted, value in config["kopf"].items():
            target = settings
            *path, last = dotted.split(".")
            for part in path:
                target = getattr(target, part)
            setattr(target, last, value)
            logger.info(f"benchmark: kopf setting {dotted} = {value!r}")

from triton_operator.cli import main
sys.exit(main(sys.argv[2:]))
"""


def parse_setting(text: str) -> tuple[str, Any]:
    """`queueing.worker_limit=64` -> ("queueing.worker_limit", 64); values are JSON, else strings."""
    name, _, value = text.partition("=")
    try:
        return name.strip(), json.loads(value)
    except ValueError:
        return name.strip(), value


def describe_source(ref: str | None) -> str:
    """The operator code that ran: a ref and its commit, or the working tree (and whether it is dirty)."""
    git = ["git", "-C", str(REPO)]
    commit = subprocess.run(
        [*git, "rev-parse", "--short", ref or "HEAD"], check=False, capture_output=True, text=True
    )
    if ref:
        return f"{ref} ({commit.stdout.strip()})"
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "operator/src"], check=False, capture_output=True, text=True
    )
    return f"working tree at {commit.stdout.strip()}" + (" with changes" if dirty.stdout.strip() else "")


def export_source(ref: str, work: Path) -> Path:
    """operator/src of a git ref, extracted under ``work`` (so others' uncommitted edits do not run)."""
    target = work / "src"
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "operator/src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "operator" / "src"


class Profiler:
    """py-spy record of the operator over a phase (raw collapsed stacks), when asked for."""

    def __init__(self, folder: Path | None, pid: int) -> None:
        self.folder = folder
        self.pid = pid
        self.exe = shutil_which("py-spy")
        self.process: subprocess.Popen[bytes] | None = None
        self.path: Path | None = None

    def start(self, phase: str) -> None:
        if self.folder is None or self.exe is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{phase}.txt"
        cmd = [
            self.exe,
            "record",
            "--pid",
            str(self.pid),
            "--rate",
            "100",
            "--format",
            "raw",
            "--nonblocking",
        ]
        self.process = subprocess.Popen(
            [*cmd, "--output", str(self.path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> Path | None:
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process = None
        return self.path


def shutil_which(name: str) -> str | None:
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    import shutil  # noqa: PLC0415

    return shutil.which(name)


def summarize_profile(path: Path, top: int = 12) -> list[str]:
    """Top functions by self samples and by inclusive samples (operator code only) of a raw profile."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            if "triton_operator" in frame or "kopf/" in frame or "lightkube" in frame:
                inclusive[frame] += count
    if not total:
        return [f"{path.name}: no samples"]
    lines = [f"{path.name}: {total} samples; self:"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append("  inclusive (operator, kopf, lightkube frames):")
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in inclusive.most_common(top)]
    return lines


# ========================================================================== the measurements


def tritonservice(
    name: str,
    namespace: str,
    replicas: int,
    *,
    change: str | None = None,
    canary: bool = False,
    watched: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "repository": {"uri": "s3://models/bench", "endpoint": "http://store.invalid:9000"},
        "models": [{"name": "add", "config": PYTHON_MODEL}],
    }
    if change is not None:
        spec["podAnnotations"] = {CHANGE_ANNOTATION: change}
    if watched:
        spec["podLabels"] = {WATCH_LABEL: "true"}
    if canary:
        spec["rollout"] = {"strategy": "Canary", "steps": [{"setWeight": 50}, {"setWeight": 100}]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonService",
        "metadata": {"name": name, "namespace": namespace, "labels": {RUN_LABEL: "true"}},
        "spec": spec,
    }


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclasses.dataclass
class Latencies:
    values: list[float]
    missed: int
    unsettled: int
    reconciles: float
    seconds: float
    configmap: list[float]
    """apply returned -> the new revision's ConfigMap ADDED (the reconcile's first write)."""
    spec_seen: list[float]
    """apply returned -> the TritonService's new generation on this script's watch (delivery)."""

    @property
    def p50(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def p99(self) -> float | None:
        return percentile(self.values, 0.99) if self.values else None


@dataclasses.dataclass
class Bench:
    args: argparse.Namespace
    api: Api
    bus: Bus
    informers: dict[str, Informer]
    operator: Operator
    namespaces: list[str]
    profiler: Profiler
    notes: list[str] = dataclasses.field(default_factory=list)
    last_event: dict[Key, float] = dataclasses.field(default_factory=dict)
    """(namespace, TritonService) -> when this script last saw an event of it or of what it owns."""

    def __post_init__(self) -> None:
        self.bus.listeners.append(self._activity)

    def _activity(self, source: str, kind: str, obj: dict[str, Any], when: float) -> None:
        namespace, name = key_of(obj)
        owner = name if source == PLURAL else labels_of(obj).get(LABEL_SERVICE)
        if owner:
            self.last_event[(namespace, owner)] = when

    async def quiet(self, name: str, seconds: float, timeout: float = 15.0) -> bool:
        """Until nothing of ``name`` changed for ``seconds`` (its rollout's tail: old pods going)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            idle = time.monotonic() - self.last_event.get((self.ns, name), 0.0)
            if idle >= seconds:
                return True
            await asyncio.sleep(seconds - idle)
        return False

    @property
    def ns(self) -> str:
        return self.namespaces[0]

    def deployments_of(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        return {
            key[1]: obj
            for key, obj in self.informers["deployments"].objects.items()
            if key[0] == namespace
            and labels_of(obj).get(LABEL_SERVICE) == name
            and not obj["metadata"].get("deletionTimestamp")
        }

    def ts(self, namespace: str, name: str) -> dict[str, Any]:
        return self.informers[PLURAL].objects.get((namespace, name)) or {}

    def observed(self, namespace: str, name: str, generation: int) -> bool:
        obj = self.ts(namespace, name)
        return int((obj.get("status") or {}).get("observedGeneration") or 0) >= generation

    def settled(self, namespace: str, name: str, generation: int, revision: str | None = None) -> bool:
        """The spec of ``generation`` was observed and its revision (``revision`` when given) is
        stable, no canary runs, and the stable Deployment has all its replicas Ready."""
        if not self.observed(namespace, name, generation):
            return False
        status = self.ts(namespace, name).get("status") or {}
        stable = status.get("stableRevision")
        if not stable or status.get("canaryRevision") or (revision is not None and stable != revision):
            return False
        deployment = self.deployments_of(namespace, name).get(f"{name}-{stable}") or {}
        wanted = int((deployment.get("spec") or {}).get("replicas") or 0)
        return int((deployment.get("status") or {}).get("readyReplicas") or 0) >= wanted

    # ------------------------------------------------------------------ apply -> Deployment

    async def change_latencies(self, name: str, count: int, label: str) -> Latencies:
        """``count`` spec changes of ``name``, each timed from the apply returning to its new Deployment."""
        values: list[float] = []
        configmap_values: list[float] = []
        spec_values: list[float] = []
        missed = unsettled = 0
        reconciles_before = self.operator.reconciles()[0]
        started = time.monotonic()
        generation = obj_generation(self.ts(self.ns, name))
        for i in range(count):
            before = set(self.deployments_of(self.ns, name))

            def new_deployment(
                source: str, kind: str, obj: dict[str, Any], before: set[str] = before
            ) -> bool:
                return (
                    source == "deployments"
                    and kind == "ADDED"
                    and key_of(obj)[0] == self.ns
                    and labels_of(obj).get(LABEL_SERVICE) == name
                    and key_of(obj)[1] not in before
                )

            def new_configmap(source: str, kind: str, obj: dict[str, Any]) -> bool:
                return (
                    source == "configmaps"
                    and kind == "ADDED"
                    and key_of(obj)[0] == self.ns
                    and labels_of(obj).get(LABEL_SERVICE) == name
                )

            def new_generation(source: str, kind: str, obj: dict[str, Any], old: int = generation) -> bool:
                return source == PLURAL and key_of(obj) == (self.ns, name) and obj_generation(obj) > old

            seen = self.bus.expect(new_deployment)
            seen_configmap = self.bus.expect(new_configmap)
            seen_spec = self.bus.expect(new_generation)
            body = tritonservice(name, self.ns, self.args.replicas, change=f"{label}-{i}", watched=True)
            result = await self.api.apply(ts_path(self.ns, name), body)
            returned = time.monotonic()
            generation = int(result["metadata"]["generation"])
            try:
                when, obj = await asyncio.wait_for(seen, timeout=30)
            except TimeoutError:
                missed += 1
                continue
            values.append(when - returned)
            for future, into in ((seen_configmap, configmap_values), (seen_spec, spec_values)):
                if future.done():
                    into.append(future.result()[0] - returned)
                else:
                    future.cancel()

            revision = labels_of(obj).get(LABEL_REVISION, "")

            def settled_check(revision: str = revision, generation: int = generation) -> bool:
                return self.settled(self.ns, name, generation, revision)

            settled = await self.bus.until(settled_check, timeout=60)
            unsettled += not settled
            await self.quiet(name, self.args.quiet_seconds)
        reconciles = self.operator.reconciles()[0] - reconciles_before
        return Latencies(
            values, missed, unsettled, reconciles, time.monotonic() - started, configmap_values, spec_values
        )

    async def create_settled(self, name: str, replicas: int, *, canary: bool = False) -> None:
        body = tritonservice(name, self.ns, replicas, change="initial", canary=canary, watched=True)
        result = await self.api.apply(ts_path(self.ns, name), body)
        generation = int(result["metadata"]["generation"])

        def ready() -> bool:
            return self.settled(self.ns, name, generation)

        if not await self.bus.until(ready, timeout=120):
            raise RuntimeError(f"{self.ns}/{name} did not settle:\n{self.operator.tail()}")

    # ------------------------------------------------------------------ many at once

    async def create_many(self) -> tuple[float | None, int, float, float, dict[str, float]]:
        """Create --count TritonServices at once: (seconds to all reconciled, how many, seconds to
        create, reconciles, seconds to every pod Ready)."""
        count = self.args.count
        names = [(self.namespaces[i % len(self.namespaces)], f"svc-{i:05d}") for i in range(count)]
        expected = set(names)
        firsts: dict[str, dict[Key, float]] = {
            "deployments": {},
            "configmaps": {},
            "services": {},
            "status": {},
        }
        done: dict[Key, float] = {}
        ready: dict[Key, float] = {}

        def track(source: str, kind: str, obj: dict[str, Any], when: float) -> None:
            if kind == "DELETED":
                return
            if source == PLURAL:
                key = key_of(obj)
                status = obj.get("status") or {}
                generation = int(obj["metadata"].get("generation") or 1)
                if key in expected and int(status.get("observedGeneration") or 0) >= generation:
                    firsts["status"].setdefault(key, when)
            elif source in firsts:
                key = (key_of(obj)[0], labels_of(obj).get(LABEL_SERVICE, ""))
                if key not in expected:
                    return
                firsts[source].setdefault(key, when)
                if source == "deployments":
                    status = obj.get("status") or {}
                    if int(status.get("readyReplicas") or 0) >= self.args.replicas:
                        ready.setdefault(key, when)
            else:
                return
            if key not in done and all(key in seen for seen in firsts.values()):
                done[key] = max(seen[key] for seen in firsts.values())

        self.bus.listeners.append(track)
        semaphore = asyncio.Semaphore(self.args.connections)

        async def create(namespace: str, name: str) -> None:
            async with semaphore:
                body = tritonservice(name, namespace, self.args.replicas, change="initial")
                await self.api.call("POST", ts_path(namespace), body)

        reconciles_before = self.operator.reconciles()[0]
        self.profiler.start("scale")
        started = time.monotonic()
        await asyncio.gather(*(create(ns, name) for ns, name in names))
        created = time.monotonic() - started
        log(f"created {count} TritonServices in {created:.1f}s")
        complete = await self.bus.until(lambda: len(done) >= count, timeout=self.args.scale_timeout)
        total = (max(done.values()) - started) if complete else None
        log(
            f"{len(done)}/{count} reconciled"
            + (
                f" in {total:.1f}s"
                if total is not None
                else f" after {self.args.scale_timeout:.0f}s (timeout)"
            )
        )
        if self.args.replicas > 0:
            all_ready = await self.bus.until(lambda: len(ready) >= count, timeout=self.args.scale_timeout)
            log(f"{len(ready)}/{count} Deployments fully Ready" + ("" if all_ready else " (timeout)"))
        self.profiler.stop()
        self.bus.listeners.remove(track)
        reconciles = self.operator.reconciles()[0] - reconciles_before
        extra = {
            "first_deployment": (min(firsts["deployments"].values()) - started)
            if firsts["deployments"]
            else -1,
            "median_done": (statistics.median(done.values()) - started) if done else -1,
            "all_ready": (max(ready.values()) - started) if len(ready) >= count else -1,
        }
        return total, len(done), created, reconciles, extra

    # ------------------------------------------------------------------ idle requests

    async def operator_requests(self) -> Counter[tuple[str, str]]:
        return await operator_requests(self.api)

    async def wait_quiet(self, window: float = 5.0, timeout: float = 900.0) -> bool:
        """Until the operator has sent no request for ``window`` seconds."""
        deadline = time.monotonic() + timeout
        last = await self.operator_requests()
        since = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            now = await self.operator_requests()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= window:
                return True
        return False

    async def idle_requests(self, seconds: float) -> Counter[tuple[str, str]]:
        if not await self.wait_quiet():
            self.notes.append("the operator never went quiet for 5 s before an idle window")
        before = await self.operator_requests()
        await asyncio.sleep(seconds)
        after = await self.operator_requests()
        after.subtract(before)
        return Counter({k: v for k, v in after.items() if v})

    # ------------------------------------------------------------------ canary step

    async def canary_steps(self, trials: int) -> tuple[list[float], list[float], str]:
        """(Ready -> step seconds, Ready -> Deployment status seconds, what was measured)."""
        name = "canary"
        await self.create_settled(name, 2, canary=True)
        samples: list[float] = []
        controller: list[float] = []
        modes: set[str] = set()
        for trial in range(trials):
            status = self.ts(self.ns, name).get("status") or {}
            stable = str(status.get("stableRevision") or "")
            timeline = CanaryTimeline(self.ns, name, stable, {f"{name}-{stable}"})
            self.bus.listeners.append(timeline.on_event)
            try:
                body = tritonservice(name, self.ns, 2, change=f"canary-{trial}", canary=True, watched=True)
                result = await self.api.apply(ts_path(self.ns, name), body)
                generation = int(result["metadata"]["generation"])

                def promoted(generation: int = generation, stable: str = timeline.stable) -> bool:
                    st = self.ts(self.ns, name).get("status") or {}
                    return (
                        self.observed(self.ns, name, generation)
                        and bool(st.get("stableRevision"))
                        and st.get("stableRevision") != stable
                        and not st.get("canaryRevision")
                    )

                if not await self.bus.until(promoted, timeout=120):
                    self.notes.append(f"canary trial {trial} did not finish in 120 s")
                    continue
                await asyncio.sleep(0.5)
            finally:
                self.bus.listeners.remove(timeline.on_event)
            mode, steps, shares = timeline.measure()
            if mode:
                modes.add(mode)
            samples += steps
            controller += shares
        if modes == {"step"}:
            mode = "canary pod Ready → next step (currentStepIndex / canary scaled)"
        elif modes == {"switch"}:
            mode = (
                "new revision's last pod Ready → stable switched / old Deployment deleted "
                "(the canary engine is not wired into the reconcile)"
            )
        else:
            mode = f"mixed ({', '.join(sorted(modes)) or 'nothing measured'})"
        return samples, controller, mode


@dataclasses.dataclass
class CanaryTimeline:
    """When (on this script's watches) one rollout's pods turned Ready and its steps were taken."""

    namespace: str
    name: str
    stable: str
    old: set[str]
    pod_ready: dict[str, float] = dataclasses.field(default_factory=dict)
    steps: dict[int, float] = dataclasses.field(default_factory=dict)
    scaled: dict[int, float] = dataclasses.field(default_factory=dict)
    dep_ready: dict[int, float] = dataclasses.field(default_factory=dict)
    switched: list[float] = dataclasses.field(default_factory=list)

    def on_event(self, source: str, kind: str, obj: dict[str, Any], when: float) -> None:
        key = key_of(obj)
        labels = labels_of(obj)
        if key[0] != self.namespace:
            return
        if source == "pods" and labels.get(LABEL_SERVICE) == self.name and kind != "DELETED":
            conditions = (obj.get("status") or {}).get("conditions") or []
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
            if labels.get(LABEL_REVISION) != self.stable and ready:
                self.pod_ready.setdefault(key[1], when)
        elif source == "deployments" and labels.get(LABEL_SERVICE) == self.name:
            replicas = (obj.get("spec") or {}).get("replicas")
            if key[1] in self.old:
                if kind == "DELETED" or obj["metadata"].get("deletionTimestamp") or replicas == 0:
                    self.switched.append(when)
            elif kind != "DELETED":
                self.scaled.setdefault(int(replicas or 0), when)
                ready_replicas = int((obj.get("status") or {}).get("readyReplicas") or 0)
                self.dep_ready.setdefault(ready_replicas, when)
        elif source == PLURAL and key[1] == self.name:
            status = obj.get("status") or {}
            if status.get("canaryRevision") and status.get("currentStepIndex") is not None:
                self.steps.setdefault(int(status["currentStepIndex"]), when)
            if status.get("stableRevision") and status.get("stableRevision") != self.stable:
                self.switched.append(when)

    def measure(self) -> tuple[str | None, list[float], list[float]]:
        """(mode, Ready -> step seconds, Ready -> Deployment readyReplicas seconds)."""
        ready = sorted(self.pod_ready.values())
        samples: list[float] = []
        shares: list[float] = []
        if not ready:
            return None, samples, shares
        if len(self.steps) > 1:
            # setWeight 50 of 2 replicas is 1 canary pod: its Ready completes step 0 (index -> 1, the
            # canary scaled to 2); the second pod's Ready completes step 1 (index -> 2, promotion).
            advance = [t for i, t in self.steps.items() if i >= 1] + [self.scaled.get(2, math.inf)]
            if math.isfinite(min(advance)):
                samples.append(min(advance) - ready[0])
                if 1 in self.dep_ready:
                    shares.append(self.dep_ready[1] - ready[0])
            if len(ready) >= 2:
                second = [t for i, t in self.steps.items() if i >= 2]
                second += [t for t in self.switched if t >= ready[1]]
                if second:
                    samples.append(min(second) - ready[1])
                    if 2 in self.dep_ready:
                        shares.append(self.dep_ready[2] - ready[1])
            return "step", samples, shares
        after = [t for t in self.switched if t >= ready[-1]]
        if after:
            samples.append(min(after) - ready[-1])
            full = max(self.dep_ready, default=0)
            if full:
                shares.append(self.dep_ready[full] - ready[-1])
        return "switch", samples, shares


# ================================================================================ the report


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def ms(value: float | None) -> str:
    return "—" if value is None else f"{value * 1000:,.0f} ms"


def verdict(ok: bool | None) -> str:
    return "—" if ok is None else ("PASS" if ok else "MISS")


def requests_text(counts: Counter[tuple[str, str]], verbs: Iterable[str]) -> str:
    wanted = set(verbs)
    parts = [f"{verb} {resource} {n}" for (verb, resource), n in sorted(counts.items()) if verb in wanted]
    return ", ".join(parts) if parts else "none"


def total(counts: Counter[tuple[str, str]], verbs: Iterable[str]) -> int:
    wanted = set(verbs)
    return sum(n for (verb, _), n in counts.items() if verb in wanted)


# ==================================================================================== main


async def run(args: argparse.Namespace, cluster: Cluster, work: Path) -> list[str]:
    endpoint = read_kubeconfig(cluster.kubeconfig)
    api = Api(endpoint, args.connections)
    run_id = uuid.uuid4().hex[:6]
    namespaces = [f"cp-bench-{run_id}-{i}" for i in range(args.namespaces)]
    bus = Bus()
    informers: dict[str, Informer] = {}
    tasks: list[asyncio.Task[None]] = []
    operator: Operator | None = None
    added_nodes: list[str] = []
    loads = [loadavg()]
    try:
        await delete_leftover_namespaces(api)
        await apply_crd(api)
        operator_kubeconfig = await setup_identity(api, work)
        pods = (args.count + 1) * args.replicas + 4
        added_nodes = await ensure_pod_capacity(api, pods)
        if added_nodes:
            log(f"added {len(added_nodes)} kwok nodes for {pods} pods")
        for namespace in namespaces:
            await ensure_namespace(api, namespace, {RUN_LABEL: "true"})

        specs = {
            PLURAL: (f"/apis/{GROUP}/{VERSION}/{PLURAL}", f"{RUN_LABEL}=true"),
            "deployments": ("/apis/apps/v1/deployments", OWNED_SELECTOR),
            "configmaps": ("/api/v1/configmaps", OWNED_SELECTOR),
            "services": ("/api/v1/services", OWNED_SELECTOR),
            "pods": ("/api/v1/pods", f"{WATCH_LABEL}=true"),
        }
        for source, (path, selector) in specs.items():
            informers[source] = Informer(api, bus, source, path, selector)
            tasks.append(asyncio.create_task(informers[source].run(), name=f"watch {source}"))
        await asyncio.wait_for(asyncio.gather(*(i.synced.wait() for i in informers.values())), 60)

        source_dir = export_source(args.operator_ref, work) if args.operator_ref else None
        operator = Operator(
            operator_kubeconfig,
            work,
            source_dir,
            extra_args=args.operator_arg or (),
            tracemalloc_frames=args.tracemalloc,
            kopf_settings=dict(parse_setting(text) for text in args.kopf_setting or ()),
        )
        operator.start()
        log(f"operator pid {operator.pid}, log {operator.log_path}")
        await asyncio.sleep(2.0)
        rss_marks = [("started", operator.memory_kb().get("VmRSS", 0))]
        profiler = Profiler(Path(args.profile) if args.profile else None, operator.pid)
        bench = Bench(args, api, bus, informers, operator, namespaces, profiler)

        # 1 TritonService
        await bench.create_settled("probe", args.replicas)
        log(f"idle {args.idle_seconds:.0f}s with 1 TritonService")
        idle_one = await bench.idle_requests(args.idle_seconds)
        log(f"idle requests with 1: {dict(idle_one)}")
        log(f"{args.changes} changes with 1 TritonService")
        lat_one = await bench.change_latencies("probe", args.changes, "one")
        rss_marks.append(("1 TritonService", operator.memory_kb().get("VmRSS", 0)))
        log(f"p50 {ms(lat_one.p50)} p99 {ms(lat_one.p99)}; {lat_one.reconciles:.0f} reconciles")
        loads.append(loadavg())

        # --count at once
        scale_total, scale_done, created, scale_reconciles, scale_extra = await bench.create_many()
        rss_marks.append((f"{args.count:,} reconciled", operator.memory_kb().get("VmRSS", 0)))
        loads.append(loadavg())
        log(f"idle {args.idle_seconds:.0f}s with {args.count} TritonServices")
        idle_many = await bench.idle_requests(args.idle_seconds)
        rss_marks.append(("after the idle window", operator.memory_kb().get("VmRSS", 0)))
        log(f"idle requests with {args.count}: {dict(idle_many)}")
        log(f"{args.changes} changes with {args.count} TritonServices")
        profiler.start("changes")
        lat_many = await bench.change_latencies("probe", args.changes, "many")
        profiler.stop()
        log(f"p50 {ms(lat_many.p50)} p99 {ms(lat_many.p99)}; {lat_many.reconciles:.0f} reconciles")
        loads.append(loadavg())

        log(f"canary: {args.canary_trials} rollouts with steps [setWeight 50, setWeight 100]")
        steps, controller, step_mode = await bench.canary_steps(args.canary_trials)
        log(f"Ready -> step: {[round(s * 1000) for s in steps]} ms ({step_mode})")

        memory = operator.memory_kb()
        cpu = operator.cpu_seconds()
        for line in operator.dump_allocations():
            print(line, file=sys.stderr)
        loads.append(loadavg())
        alive = operator.alive()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if operator is not None:
            operator.stop()
        if cluster.stop is None and not args.keep:
            for namespace in namespaces:
                with contextlib.suppress(ApiError, httpx2.HTTPError):
                    await api.call("DELETE", f"/api/v1/namespaces/{namespace}", missing_ok=True)
            with contextlib.suppress(ApiError, httpx2.HTTPError):
                await teardown_identity(api)
            for node in added_nodes:
                with contextlib.suppress(ApiError, httpx2.HTTPError):
                    await api.call("DELETE", f"/api/v1/nodes/{node}", missing_ok=True)
        await api.close()

    # ---------------------------------------------------------------- the table
    n = f"{args.count:,}"
    rss_mb = memory.get("VmHWM", 0) * 1024 / 1e6
    idle_writes = total(idle_many, WRITE_VERBS) + total(idle_one, WRITE_VERBS)
    reads_one, reads_many = total(idle_one, READ_VERBS), total(idle_many, READ_VERBS)
    idle = f"{args.idle_seconds:.0f} s"
    rows = [
        (
            "apply → Deployment p50",
            f"1 TritonService, {len(lat_one.values)} changes",
            ms(lat_one.p50),
            "—",
            None,
        ),
        (
            "apply → Deployment p99",
            f"1 TritonService, {len(lat_one.values)} changes",
            ms(lat_one.p99),
            "—",
            None,
        ),
        (
            "apply → Deployment p50",
            f"{n} TritonServices, {len(lat_many.values)} changes",
            ms(lat_many.p50),
            "< 50 ms",
            lat_many.p50 is not None and lat_many.p50 < TARGET_P50_S and not lat_many.missed,
        ),
        (
            "apply → Deployment p99",
            f"{n} TritonServices, {len(lat_many.values)} changes",
            ms(lat_many.p99),
            "< 250 ms",
            lat_many.p99 is not None and lat_many.p99 < TARGET_P99_S and not lat_many.missed,
        ),
        (
            f"{n} created at once → all reconciled",
            f"{args.connections} concurrent creates; Deployment + ConfigMap + Service + observedGeneration",
            f"{scale_total:.1f} s"
            if scale_total is not None
            else f"> {args.scale_timeout:.0f} s ({scale_done:,} done)",
            "< 60 s",
            scale_total is not None and scale_total < TARGET_SCALE_S,
        ),
        (
            "operator peak RSS (VmHWM)",
            f"{n} TritonServices, {args.replicas} pod each",
            f"{rss_mb:.0f} MB",
            "< 200 MB",
            0 < rss_mb < TARGET_RSS_MB,
        ),
        (
            "operator writes while idle",
            f"{idle} with 1, {idle} with {n}",
            f"{total(idle_one, WRITE_VERBS)} / {total(idle_many, WRITE_VERBS)}",
            "0",
            idle_writes == 0,
        ),
        (
            "operator reads while idle (get/list/watch)",
            f"{idle} with 1 → {idle} with {n}",
            f"{reads_one} → {reads_many}",
            "not growing",
            reads_many <= reads_one + READ_SLACK,
        ),
        (
            "canary pod Ready → next step, p50 / max",
            f"{len(steps)} steps: {step_mode}",
            f"{ms(statistics.median(steps) if steps else None)} / {ms(max(steps) if steps else None)}",
            "< 1 s",
            bool(steps) and max(steps) < TARGET_STEP_S,
        ),
    ]
    out = ["| measure | setting | result | target | |", "|---|---|---:|---|---|"]
    out += [f"| {a} | {b} | {c} | {d} | {verdict(e)} |" for a, b, c, d, e in rows]
    out.append("")
    per_change = (lat_one.reconciles / max(1, args.changes), lat_many.reconciles / max(1, args.changes))
    all_ready = scale_extra["all_ready"]
    share = (
        f"p50 {ms(statistics.median(controller))}, max {ms(max(controller))}"
        if controller
        else "not measured"
    )
    out += [
        f"- load average (1/5/15 min) at start, after the 1-object phase, after the scale phase, after "
        f"the {n}-object changes, at the end: {' | '.join(loads)}; {os.cpu_count()} CPUs",
        f"- operator: {'alive' if alive else 'DIED'} at the end, {cpu:.0f} s CPU in all, RSS now "
        f"{memory.get('VmRSS', 0) / 1024:.0f} MiB, VmHWM {memory.get('VmHWM', 0) / 1024:.0f} MiB; "
        f"source: {describe_source(args.operator_ref)}"
        + "".join(f", kopf {text}" for text in args.kopf_setting or ())
        + "; RSS "
        + ", ".join(f"{kb / 1024:.0f} MiB {label}" for label, kb in rss_marks),
        "- apply → Deployment: server-side apply of a changed podAnnotation (a new revision) until the "
        "new Deployment's ADDED event on this script's watch; each change waits for its rollout to "
        f"settle and then for {args.quiet_seconds:g} s without events of the object. Missed (no "
        f"Deployment in 30 s): {lat_one.missed} / {lat_many.missed}; unsettled in "
        f"60 s: {lat_one.unsettled} / {lat_many.unsettled}; operator reconciles per change: "
        f"{per_change[0]:.1f} / {per_change[1]:.1f}; p50 of apply → TritonService event on this "
        f"script's watch {ms(median(lat_one.spec_seen))} / {ms(median(lat_many.spec_seen))}, → ConfigMap "
        f"(first write of the reconcile) {ms(median(lat_one.configmap))} / {ms(median(lat_many.configmap))}",
        f"- scale: {scale_done:,}/{args.count:,} reconciled; the creates took {created:.1f} s; first "
        f"Deployment after {scale_extra['first_deployment']:.1f} s; half reconciled after "
        f"{scale_extra['median_done']:.1f} s; every Deployment Ready after "
        + (f"{all_ready:.1f} s" if all_ready >= 0 else "(not reached)")
        + f"; {scale_reconciles:,.0f} reconciles ({scale_reconciles / max(1, args.count):.1f} per "
        f"TritonService); {args.namespaces} namespace(s); replicas {args.replicas}; "
        f"{len(added_nodes)} kwok nodes added",
        f"- idle requests with 1: {requests_text(idle_one, VERBS)}; with {n}: "
        f"{requests_text(idle_many, VERBS)} (counted by the API server per FlowSchema matching only "
        f"the operator's ServiceAccount; reads pass when they grow by at most {READ_SLACK})",
        f"- canary: controller-manager share (pod Ready → Deployment readyReplicas on the watch): {share}",
    ]
    out += [f"- note: {note}" for note in bench.notes]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--count", type=int, default=1000, help="TritonServices created at once (default 1000)"
    )
    parser.add_argument("--changes", type=int, default=200, help="timed spec changes per phase (default 200)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=300.0,
        help="each idle window, with 1 and with --count (default 300)",
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas of every TritonService (default 1)")
    parser.add_argument("--connections", type=int, default=64, help="concurrent creates (default 64)")
    parser.add_argument(
        "--namespaces", type=int, default=1, help="spread the TritonServices over N namespaces"
    )
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=1.0,
        help="before each timed change, wait until the object saw no event for this long (default 1)",
    )
    parser.add_argument("--canary-trials", type=int, default=5, help="canary rollouts timed (default 5)")
    parser.add_argument(
        "--scale-timeout",
        type=float,
        default=900.0,
        help="give up waiting for --count after this (default 900 s)",
    )
    parser.add_argument(
        "--operator-ref", help="run the operator from this git ref's operator/src (default: working tree)"
    )
    parser.add_argument(
        "--profile", metavar="DIR", help="py-spy record the operator (scale, changes) into DIR"
    )
    parser.add_argument(
        "--operator-arg", action="append", metavar="ARG", help="extra argument of `triton-operator run`"
    )
    parser.add_argument(
        "--tracemalloc",
        type=int,
        default=0,
        metavar="FRAMES",
        help="run the operator under tracemalloc (slower) and print where its memory went at the end",
    )
    parser.add_argument(
        "--kopf-setting",
        action="append",
        metavar="NAME=VALUE",
        help="set a kopf setting in the operator process (an experiment), e.g. queueing.worker_limit=64",
    )
    parser.add_argument("--keep", action="store_true", help="keep the cluster and the benchmark's objects")
    parser.add_argument("--work-dir", help="where the operator's log and kubeconfig go (default: a temp dir)")
    args = parser.parse_args()
    if args.count < 1 or args.changes < 1 or args.namespaces < 1:
        parser.error("--count, --changes and --namespaces must be at least 1")

    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="cp-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log(f"work dir {work}; load average {loadavg()}")
    cluster = get_cluster(args.keep)
    problems: list[str] = []
    # SIGTERM and SIGHUP stop it as Ctrl-C does, so that a cluster started here comes down
    signals = cluster.local.stop_signals_interrupt() if cluster.stop else contextlib.nullcontext()
    try:
        with signals:
            table = asyncio.run(run(args, cluster, work))
        print_results(args, table)  # the figures first, then the teardown
    finally:
        if cluster.stop is not None:
            log("stopping the local cluster")
            with cluster.local.signals_deferred():
                problems = cluster.stop()
            for line in problems:
                log(line)
    if problems:
        log("the figures above stand; bringing the local cluster down FAILED (see above)")
        return 3
    return 0


def print_results(args: argparse.Namespace, table: list[str]) -> None:
    if args.profile:
        for path in sorted(Path(args.profile).glob("*.txt")):
            for line in summarize_profile(path):
                print(line, file=sys.stderr)
    print()
    print(
        f"Control plane: {args.count:,} TritonServices, {args.changes} changes, "
        f"{args.idle_seconds:.0f} s idle windows, replicas {args.replicas} (kwok pods)"
    )
    print()
    print("\n".join(table), flush=True)


if __name__ == "__main__":
    sys.exit(main())

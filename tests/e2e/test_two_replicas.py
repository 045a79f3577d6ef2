"""Two operator replicas in one kopf peering: the paused one writes nothing, and takes over.

Each replica runs as its own ServiceAccount of the test's namespace, and the API server counts
each one's writes as the control-plane benchmark does (bench/control_plane/run.py): one
FlowSchema per replica that matches only its writes in the test's namespace, so
``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` is exactly that replica's
writes, whatever other tests do meanwhile. A third FlowSchema takes the replicas' kopf
keep-alives (patches of the KopfPeering), which a paused replica goes on making.

The TritonService pins a real S3 bucket polled every 2 s and rolls out with a timed pause step,
so the low-priority replica holds a repository poller and a requeue timer when the
high-priority one starts and kopf pauses it.

The handover test holds the low-priority replica mid-pass instead: its repository is read through
a proxy on loopback (HoldingProxy) that stops forwarding requests on demand, so the pass that
read the TritonService waits in its bucket listing while the high-priority replica takes over
and writes a newer status; then the held pass goes on to its status write. A `kubectl get
--watch` of the TritonService (StatusWatch) sees every version the API server stores.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import ServiceAccount
from lightkube.resources.flowcontrol_apiserver_v1 import FlowSchema
from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding
from lightkube.types import PatchType

from e2e_helpers import (
    LocalOperator,
    apply,
    create_store_secret,
    get_ts,
    s3_client,
    store_repository,
    tritonservice,
    wait_condition,
    write_token_kubeconfig,
)
from testkit import REPO, sh, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(480)]

PEERING_CRDS = REPO / "charts" / "triton-operator" / "crds" / "kopfpeerings.yaml"
KopfPeering = create_namespaced_resource("kopf.dev", "v1", "KopfPeering", "kopfpeerings")
PEERING = "triton-operator"
MANAGER = "triton-operator-tests"
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
PAUSE_SECONDS = 20
STEPS = [{"setWeight": 50}, {"pause": {"durationSeconds": PAUSE_SECONDS}}]
PAUSED = "Pausing operations in favour of"  # kopf's own line when a peer outranks it
GATE_CLOSED = "no reconcile, timer or repository poll until resumed"  # the Reconciler's pause line
SUPERSEDED = "changed since this pass read it"  # a pass whose status write was refused (409)


def peering_crds(kube: Client) -> None:
    """kopf's peering CRDs from the chart, applied (never deleted: shared by the whole cluster)."""
    for doc in yaml.safe_load_all(PEERING_CRDS.read_text()):
        if not doc:
            continue
        name = doc["metadata"]["name"]
        kube.patch(
            CustomResourceDefinition, name, doc, patch_type=PatchType.APPLY, field_manager=MANAGER, force=True
        )

        def established(name: str = name) -> bool:
            conditions = (
                kube.get(CustomResourceDefinition, name).to_dict().get("status", {}).get("conditions", [])
            )
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, timeout=30, what=f"CRD {name} to be Established")


class Replica:
    """One `triton-operator run --namespace NS` in the peering, as ServiceAccount ``name``."""

    def __init__(self, name: str, priority: int, namespace: str, work: Path) -> None:
        self.name, self.priority, self.namespace = name, priority, namespace
        self.flow_schema = f"{namespace}-{name}-writes"
        self.kubeconfig = work / f"{name}.kubeconfig"
        self.log_path = work / f"{name}.log"
        self.operator: LocalOperator | None = None

    def subject(self) -> dict[str, Any]:
        return {"kind": "ServiceAccount", "serviceAccount": {"name": self.name, "namespace": self.namespace}}

    def start(self) -> None:
        env = {
            "TRITON_OPERATOR_PEERING_NAME": PEERING,
            "TRITON_OPERATOR_PEERING_PRIORITY": str(self.priority),
            "TRITON_OPERATOR_PIN_REPOSITORIES": "true",
            "POD_ID": self.name,  # its identity in the peering object, as the chart sets it
        }
        self.operator = LocalOperator(
            self.kubeconfig, [f"--namespace={self.namespace}"], self.log_path, env=env
        )
        self.operator.start()

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()

    def log(self) -> str:
        return self.operator.log() if self.operator is not None else "(not started)"


@dataclass
class Pair:
    low: Replica
    high: Replica
    kubectl: str
    cluster: Path

    def writes(self) -> dict[str, int]:
        """Write requests of each replica so far, as the API server counted them."""
        counts = dispatched(self.kubectl, self.cluster)
        return {r.name: counts.get(r.flow_schema, 0) for r in (self.low, self.high)}


def flow_schema(
    name: str, precedence: int, subjects: list[dict[str, Any]], rule: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "matchingPrecedence": precedence,
            "priorityLevelConfiguration": {"name": "exempt"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": subjects, "resourceRules": [rule]}],
        },
    }


def dispatched(kubectl: str, cluster: Path) -> dict[str, int]:
    """Requests the API server has dispatched per FlowSchema (its own /metrics)."""
    counts: dict[str, int] = {}
    for line in sh(kubectl, f"--kubeconfig={cluster}", "get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_flowcontrol_dispatched_requests_total{"):
            schema = re.search(r'flow_schema="([^"]*)"', line)
            if schema:
                counts[schema.group(1)] = counts.get(schema.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


@pytest.fixture
def replicas(
    kube: Client, namespace: str, cluster: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Pair]:
    """Two replicas (priorities 100 and 200) with their ServiceAccounts, kubeconfigs and write
    counters, not started; stopped and their FlowSchemas deleted afterwards."""
    kubectl: str | None = request.getfixturevalue("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl binary (python3 e2e/cluster.py build provides one)")
    peering_crds(kube)
    kube.create(KopfPeering.from_dict({"metadata": {"name": PEERING, "namespace": namespace}}))
    low = Replica("replica-low", 100, namespace, tmp_path)
    high = Replica("replica-high", 200, namespace, tmp_path)
    schemas = [
        # kopf's keep-alives (a paused replica goes on making them): counted apart
        flow_schema(
            f"{namespace}-peering",
            40,
            [low.subject(), high.subject()],
            {"verbs": ["*"], "apiGroups": ["kopf.dev"], "resources": ["*"], "namespaces": [namespace]},
        ),
        *(
            flow_schema(
                r.flow_schema,
                50,
                [r.subject()],
                {"verbs": WRITE_VERBS, "apiGroups": ["*"], "resources": ["*"], "namespaces": [namespace]},
            )
            for r in (low, high)
        ),
    ]
    # cluster-admin, cluster-wide: kopf lists namespaces and CRDs at start (without, it retries
    # for about a minute before it carries on); the FlowSchemas count only the test's namespace
    binding: dict[str, Any] = {
        "metadata": {"name": f"{namespace}-replicas"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": r.name, "namespace": namespace} for r in (low, high)],
    }
    try:
        kube.create(cast(ClusterRoleBinding, ClusterRoleBinding.from_dict(binding)))
        for r in (low, high):
            kube.create(ServiceAccount(metadata=ObjectMeta(name=r.name, namespace=namespace)))
            token = sh(kubectl, f"--kubeconfig={cluster}", "create", "token", r.name, "-n", namespace)
            write_token_kubeconfig(cluster, token.stdout.strip(), r.kubeconfig)
        for schema in schemas:
            kube.create(cast(FlowSchema, FlowSchema.from_dict(schema)))
        yield Pair(low, high, kubectl, cluster)
    finally:
        for r in (high, low):
            r.stop()
        leftovers: list[tuple[Any, str]] = [
            (ClusterRoleBinding, binding["metadata"]["name"]),
            *((FlowSchema, schema["metadata"]["name"]) for schema in schemas),
        ]
        for resource, name in leftovers:
            try:
                kube.delete(resource, name)
            except Exception as exc:  # not created, or gone
                print(f"{resource.__name__} {name}: {exc}")
        report = getattr(request.node, "rep_call", None)
        if report is None or report.failed:
            for r in (low, high):
                print(f"\n----- {r.name} (priority {r.priority}) -----\n{r.log()[-12000:]}")


def test_a_paused_replica_writes_nothing_and_takes_over_when_the_active_one_stops(
    kube: Client, namespace: str, seaweedfs: Any, replicas: Pair
) -> None:
    low, high, writes = replicas.low, replicas.high, replicas.writes
    s3 = s3_client(seaweedfs)
    bucket = f"ha-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)

    def upload(version: int) -> None:
        s3.put_object(
            Bucket=bucket, Key=f"models/add/{version}/model.py", Body=f"# version {version}\n".encode()
        )

    def status() -> dict[str, Any]:
        return dict(get_ts(kube, namespace, "ha").get("status") or {})

    def in_timed_pause(previous: str) -> dict[str, Any] | None:
        """The rollout of a new revision waiting in its timed pause step."""
        s = status()
        canary = s.get("canaryRevision")
        return s if canary and canary != previous and s.get("currentStepIndex") == 1 else None

    def promoted(revision: str) -> bool:
        s = status()
        return s.get("stableRevision") == revision and not s.get("canaryRevision")

    upload(1)
    create_store_secret(kube, namespace, seaweedfs.extra["access"], seaweedfs.extra["secret"])
    body = tritonservice(
        "ha",
        namespace,
        repository=store_repository(seaweedfs, bucket, pollIntervalSeconds=2),
        rollout={"strategy": "Canary", "steps": STEPS},
    )

    # 1. the low-priority replica alone: it is active, and serves a first revision
    low.start()
    apply(kube, body)
    rev1 = wait_condition(kube, namespace, "ha", "Ready", "True", timeout=120)["status"]["stableRevision"]
    assert writes()[low.name] > 0 and writes()[high.name] == 0

    # 2. a new upload (its poller) starts a rollout that waits in a timed pause (its timer)
    upload(2)
    rev2 = wait_for(lambda: in_timed_pause(rev1), timeout=90, what="the canary of v2 in its pause")[
        "canaryRevision"
    ]

    # 3. the high-priority replica starts: kopf pauses the low one
    high.start()
    wait_for(lambda: PAUSED in low.log(), timeout=60, what="kopf to pause the low-priority replica")
    time.sleep(2)  # a reconcile the low one had started before the pause may finish
    before = writes()
    assert in_timed_pause(rev1), "the pause step ended before the handover: nothing was timed"

    # 4. the high one does the work: it promotes v2 when the pause is over (the low one's timer
    #    was due then too), and a new upload (both replicas' pollers would see it) rolls out
    wait_for(lambda: promoted(rev2), timeout=PAUSE_SECONDS + 60, what=f"{rev2} to be promoted")
    upload(3)
    rev3 = wait_for(lambda: in_timed_pause(rev2), timeout=90, what="the canary of v3 in its pause")[
        "canaryRevision"
    ]
    time.sleep(3)  # a few more polls of the bucket
    during = writes()
    assert during[high.name] > before[high.name], "the active replica did nothing"
    assert during[low.name] == before[low.name], (
        f"the paused replica made {during[low.name] - before[low.name]} write requests"
    )

    # 5. the high one stops (kopf takes its keep-alive out): the low one resumes, finishes the
    #    rollout of v3 (its timer), and rolls out the next upload (its poller)
    high.stop()
    # Its last writes (a pass it was in, its keep-alive taken out) are counted once it has exited:
    # between `during` and here it was still the active replica.
    stopped = writes()
    wait_for(
        lambda: promoted(rev3),
        timeout=PAUSE_SECONDS + 60,
        what=f"{rev3} promoted by the low-priority replica",
    )
    upload(4)
    rev4 = wait_for(lambda: in_timed_pause(rev3), timeout=90, what="the canary of v4 in its pause")[
        "canaryRevision"
    ]
    wait_for(lambda: promoted(rev4), timeout=PAUSE_SECONDS + 60, what=f"{rev4} to be promoted")
    after = writes()
    assert after[low.name] > during[low.name]
    assert after[high.name] == stopped[high.name]  # stopped: nothing more from it


class HoldingProxy:
    """A TCP proxy on loopback to an HTTP ``endpoint``: while held (``hold``) it forwards no request,
    whatever a client sends waits in it until ``release``, as a store that stops answering. After
    ``pass_new`` the connections held so far stay held and new ones are forwarded (another client
    of the same store gets its answers). A client gives up after its own read timeout (the
    operator's S3 client: 60 s, 3 attempts)."""

    def __init__(self, endpoint: str) -> None:
        url = urllib.parse.urlsplit(endpoint)
        self._target = (url.hostname or "127.0.0.1", url.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._new_open = True  # whether a connection accepted now is forwarded
        self._gates: list[threading.Event] = []
        self._lock = threading.Lock()
        self._waiting = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="HoldingProxy", daemon=True).start()

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._listener.close()
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.close()

    def hold(self) -> None:
        with self._lock:
            self._new_open = False
            for gate in self._gates:
                gate.clear()

    def pass_new(self) -> None:
        """Forward connections made from now on; those held stay held."""
        with self._lock:
            self._new_open = True

    def waiting(self) -> int:
        """Requests held now."""
        with self._lock:
            return self._waiting

    def release(self) -> int:
        """Forward what was held, and all from now on; how many requests were held."""
        held = self.waiting()
        with self._lock:
            self._new_open = True
            for gate in self._gates:
                gate.set()
        return held

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            gate = threading.Event()
            with self._lock:
                if self._new_open:
                    gate.set()
                self._gates.append(gate)
            for src, dst, requests in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, requests, gate), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, requests: bool, gate: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if requests and not gate.is_set():
                    with self._lock:
                        self._waiting += 1
                    gate.wait()
                    with self._lock:
                        self._waiting -= 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)


class StatusWatch:
    """`kubectl get --watch` of one TritonService: the resourceVersion and status.observedGeneration
    of every version the API server stored from the start of the watch on, in order."""

    TEMPLATE = '{.metadata.resourceVersion} {.status.observedGeneration}{"\\n"}'

    def __init__(self, kubectl: str, cluster: Path, namespace: str, name: str) -> None:
        self.seen: list[tuple[int, int]] = []
        self._process = subprocess.Popen(
            [
                kubectl,
                f"--kubeconfig={cluster}",
                "get",
                "tritonservices.triton-operator.io",
                name,
                "-n",
                namespace,
                "--watch",
                "-o",
                f"jsonpath={self.TEMPLATE}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, name="StatusWatch", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            fields = line.split()
            if fields and fields[0].isdigit():
                generation = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
                self.seen.append((int(fields[0]), generation))

    def generations(self) -> list[int]:
        return [generation for _, generation in self.seen]

    def went_back(self) -> list[tuple[int, int]]:
        """(from, to) of every observedGeneration that a later version of the status lowered."""
        gens = self.generations()
        highest = [max(gens[: i + 1]) for i in range(len(gens))]
        return [(highest[i - 1], g) for i, g in enumerate(gens) if i > 0 and g < highest[i - 1]]

    def close(self) -> None:
        self._process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        self._thread.join(timeout=10)


@pytest.mark.timeout(720)
def test_a_replica_that_loses_its_peering_mid_pass_never_writes_an_older_status(
    kube: Client, namespace: str, seaweedfs: Any, replicas: Pair
) -> None:
    """The low-priority replica reads generation 1 of a new TritonService and waits in its bucket
    listing (nothing of it runs yet, so its pass lists the repository itself); generation 2 comes,
    the high-priority replica starts, takes over and writes the status of generation 2; then the
    low one's pass goes on. Its status write is conditional on the version it read, so the API
    server refuses it: the status never goes back to generation 1. (With the status written
    unconditionally, as server-side apply with force does, it would.)"""
    low, high = replicas.low, replicas.high
    assert replicas.kubectl is not None
    s3 = s3_client(seaweedfs)
    bucket = f"hand-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="models/add/1/model.py", Body=b"# add\n")
    create_store_secret(kube, namespace, seaweedfs.extra["access"], seaweedfs.extra["secret"])

    def generation_of_status() -> int:
        return int((get_ts(kube, namespace, "handover").get("status") or {}).get("observedGeneration") or 0)

    with HoldingProxy(seaweedfs.endpoint) as proxy:
        repository = {
            **store_repository(seaweedfs, bucket, pollIntervalSeconds=0),
            "endpoint": proxy.endpoint,
        }
        body = tritonservice("handover", namespace, repository=repository)

        # 1. the low-priority replica alone; its first pass of generation 1 lists the bucket through
        #    the proxy, which holds the listing
        low.start()
        proxy.hold()
        assert apply(kube, body)["metadata"]["generation"] == 1
        wait_for(proxy.waiting, timeout=60, what="the low replica's listing of generation 1 to be held")
        watch = StatusWatch(replicas.kubectl, replicas.cluster, namespace, "handover")
        try:
            # 2. generation 2, and the handover: the high-priority replica starts (its own listing
            #    is forwarded), kopf and the Reconciler pause the low one, and the high one writes
            #    the status of generation 2
            body["spec"]["replicas"] = 3
            assert apply(kube, body)["metadata"]["generation"] == 2
            proxy.pass_new()
            high.start()
            wait_for(lambda: PAUSED in low.log() and GATE_CLOSED in low.log(), timeout=60, what="low paused")
            wait_for(
                lambda: generation_of_status() == 2, timeout=90, what="the high replica's status of gen 2"
            )
            assert 1 not in watch.generations(), "the low replica's pass ended before the handover"

            # 3. the low replica's listing goes on: its pass reaches its status write, decided
            #    from generation 1, after the newer status was written
            assert proxy.release() > 0, "the low replica's listing was no longer held"
            wait_for(
                lambda: SUPERSEDED in low.log() or watch.went_back(),
                timeout=90,
                what="the low replica's pass of generation 1 to reach its status write",
            )
            time.sleep(3)  # what the high replica does about the low one's last writes
        finally:
            watch.close()
    assert not watch.went_back(), (
        f"the status went back to an older generation (from, to): {watch.went_back()}; "
        f"observedGeneration of each version: {watch.generations()}"
    )
    assert SUPERSEDED in low.log()  # the low replica's write was tried, and refused
    assert generation_of_status() == 2
    wait_condition(kube, namespace, "handover", "Ready", "True", timeout=120)

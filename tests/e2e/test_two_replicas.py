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
"""

from __future__ import annotations

import re
import time
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
    assert after[high.name] == during[high.name]  # stopped: nothing more from it

"""Real pods on the local cluster's real node: a real `triton-operator sync` init container and a real
CPU tritonserver, with a client counting answers through the TritonService's Service.

Needs the real node of e2e/cluster.py (kubelet, containerd, runc, CNI bridge, kube-proxy) and the
images built from the project's own files (e2e/images.py); without them every test here skips,
saying why. The S3 store (seaweedfs) listens on the pod bridge's gateway so pods can reach it.
"""

from __future__ import annotations

import collections
import re
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.resources.core_v1 import Namespace, Pod, Service
from prometheus_client.parser import text_string_to_metric_families

from e2e_helpers import (
    TS,
    agent_summary,
    apply,
    condition,
    create_store_secret,
    events,
    get_ts,
    kubectl_scale,
    kubectl_triton,
    owned,
    wait_condition,
)
from inference import LoadClient, infer_add_sub, offset_of
from real_pods import (
    REAL_NODE_LABEL,
    TRITON_CPU_IMAGE,
    adder_source,
    answering,
    behaving_source,
    on_real_node,
    placement,
    raising_source,
)
from testkit import Repeating, wait_for
from triton_operator.adapters.control import KubeControl
from triton_operator.client import InputError, TritonClient
from triton_operator.core.pod.startup import describe_phases
from triton_operator.models import INFERENCE_RATE_METRIC

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]
MODEL_KEY = "models/add_sub/{version}/model.py"


# ----------------------------------------------------------------- fixtures


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket holding add_sub version 1 (offset 0), and the Secret `store` to read it."""
    import storage_servers  # noqa: PLC0415

    name = f"real-{uuid.uuid4().hex[:8]}"
    store.extra["s3"].create_bucket(Bucket=name)
    store.extra["s3"].put_object(Bucket=name, Key=MODEL_KEY.format(version=1), Body=adder_source(0))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


# ----------------------------------------------------------------- helpers


def cluster_ip(kube: Client, namespace: str, name: str) -> str:
    svc = kube.get(Service, name, namespace=namespace)
    assert svc.spec is not None and svc.spec.clusterIP
    return str(svc.spec.clusterIP)


def pods(kube: Client, namespace: str, name: str) -> list[Any]:
    return list(kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": name}))


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def revision_gone(kube: Client, namespace: str, name: str, revision: str, timeout: float = 90) -> None:
    """Wait until no pod of ``revision`` is left (drained and terminated)."""
    wait_for(
        lambda: not [p for p in pods(kube, namespace, name) if revision in p.metadata.name],
        timeout=timeout,
        what=f"the pods of revision {revision} to go",
    )


def no_request_failed(client: LoadClient, what: str) -> None:
    """Stop the client, print what it counted, and fail on any failed request."""
    client.stop()
    print(f"\n{what}: {client.summary()}")
    assert client.sent > 50, client.summary()
    assert not client.failures, client.failures[:5]


def serving(kube: Client, namespace: str, name: str, timeout: float = 150) -> dict[str, Any]:
    return wait_condition(kube, namespace, name, "Ready", "True", timeout=timeout)


# ----------------------------------------------------------------- tests


def test_apply_serves_an_inference_through_the_service_and_delete_removes_the_pods(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, node: dict[str, Any], store: Any, bucket: str
) -> None:
    apply(kube, on_real_node("tiny", namespace, bucket=bucket, endpoint=store.endpoint))
    obj = serving(kube, namespace, "tiny")
    assert condition(obj, "RepositoryReady")["reason"] == "ManifestPinned"
    # an unversioned bucket: the status says that a rollback would not be exact
    assert "rollback is not exact" in condition(obj, "RepositoryReady")["message"]
    assert obj["status"]["endpoints"]["http"].startswith(f"tiny.{namespace}.svc")

    # Ready came from Triton's real probes on a real pod: containerd ran both containers.
    (pod,) = pods(kube, namespace, "tiny")
    assert pod.spec.nodeName == node["name"] and ready(pod)
    # One pod shape: no init container; the model agent fetched and loaded the model beside tritonserver.
    assert not pod.status.initContainerStatuses
    triton, agent = sorted(pod.status.containerStatuses, key=lambda c: c.name != "tritonserver")
    assert (triton.name, agent.name) == ("tritonserver", "model-agent")
    assert triton.ready and triton.containerID.startswith("containerd://")
    assert agent.ready and agent.containerID.startswith("containerd://") and agent.restartCount == 0

    # status.timeToServe: that pod's start, phase by phase, read from its own status; what the agent
    # fetched (one object: model.py) is the summary in its status.
    summary = agent_summary(pod)
    assert summary is not None and summary.objects == 1, summary
    served = wait_for(
        lambda: (get_ts(kube, namespace, "tiny")["status"].get("timeToServe") or [None])[0],
        timeout=15,
        what="status.timeToServe",
    )
    assert served["revision"] == obj["status"]["stableRevision"] and served["pod"] == pod.metadata.name
    # The download overlaps tritonserver's start and the loads: the agent's fill says when the last
    # byte was in (core.pod.startup: sync = the agent's start -> the last byte, tritonserverLoad the
    # rest until Ready, no tritonserverStart phase), and the bytes it fetched from the store.
    assert set(served["phases"]) == {"scheduling", "imageAndSandbox", "sync", "tritonserverLoad"}, served
    assert served["phases"]["sync"] > 0 and served["phases"]["tritonserverLoad"] > 0, served
    assert served["bytesFetched"] == len(adder_source(0)), served
    assert summary.fetched == len(adder_source(0)), summary
    # the RevisionServed Event, posted once, right after the status write that recorded it
    announced = wait_for(
        lambda: [m for t, r, m in events(kube, namespace, "tiny") if (t, r) == ("Normal", "RevisionServed")],
        timeout=10,
        what="the RevisionServed Event",
    )
    expected = f"revision {served['revision']} served in {describe_phases(served)} (pod {pod.metadata.name})"
    assert announced == [expected], announced

    # An inference through the TritonService's Service: OUTPUT0 = a + b, OUTPUT1 = a - b. Ready
    # comes from the pods; the Service's endpoints and kube-proxy follow within about a second.
    host = cluster_ip(kube, namespace, "tiny")
    answering(host, 0, timeout=15)
    out = infer_add_sub(host)
    assert out == {"OUTPUT0": [11.0, 22.0, 33.0, 44.0], "OUTPUT1": [-9.0, -18.0, -27.0, -36.0]}

    kube.delete(TS, "tiny", namespace=namespace)
    wait_for(lambda: not pods(kube, namespace, "tiny"), timeout=60, what="the pods to be removed")
    assert not owned(kube, Deployment, namespace, "tiny")


def test_client_calls_the_tritonservice_served_by_a_real_pod(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, cluster: Path, store: Any, bucket: str, tmp_path: Path
) -> None:
    """TritonClient.for_service and `kubectl triton infer` reach the pod through the Service's IP (the
    status endpoint, <name>.<namespace>.svc, resolves only in the cluster)."""
    apply(kube, on_real_node("called", namespace, bucket=bucket, endpoint=store.endpoint))
    serving(kube, namespace, "called")
    host = cluster_ip(kube, namespace, "called")
    answering(host, 0, timeout=15)
    a = np.array([[1, 2, 3, 4]], np.float32)
    for protocol in ("grpc", "http"):
        with TritonClient.for_service(
            "called", namespace, protocol=protocol, host=host, control=KubeControl(kube)
        ) as client:
            assert client.model_names() == ["add_sub"] and client.url.endswith(
                f"{host}:{8001 if protocol == 'grpc' else 8000}"
            )
            result = client.add_sub.run(a, [[10, 20, 30, 40]])
            assert result.as_numpy("OUTPUT0").tolist() == [[11.0, 22.0, 33.0, 44.0]]
            with pytest.raises(InputError, match="model add_sub, input INPUT1: shape"):
                client.add_sub.run(INPUT0=a, INPUT1=a[0])
    np.save(tmp_path / "a.npy", a)
    printed = kubectl_triton(
        cluster, "infer", "called", "add_sub", "-n", namespace, "--host", host,
        "--input", f"INPUT0=@{tmp_path / 'a.npy'}", "--input", "INPUT1=[[10, 20, 30, 40]]",
    )  # fmt: skip
    assert "OUTPUT1  FP32 [1, 4]  [[-9.0, -18.0, -27.0, -36.0]]" in printed


def test_canary_triton_refuses_crash_loops_and_is_rolled_back_while_stable_answers(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    # tritonserver exits when a model fails to load (the operator refuses --exit-on-error=false,
    # which would leave the pod running but never Ready): the canary's pod crash-loops, which the
    # operator sees long before the default progress deadline.
    timing: dict[str, Any] = {"rollout": {"steps": [{"setWeight": 50}, {"pause": {}}]}}
    body = on_real_node("refused", namespace, bucket=bucket, endpoint=store.endpoint, **timing)
    apply(kube, body)
    stable = serving(kube, namespace, "refused")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "refused")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        # Valid for protobuf, the CRD and the operator (a backend the image lacks is only a
        # warning: custom images add their own), refused by Triton: this image has no onnxruntime.
        bad = on_real_node("refused", namespace, bucket=bucket, endpoint=store.endpoint, **timing)
        bad["spec"]["models"][0]["config"]["backend"] = "onnxruntime"
        apply(kube, bad)
        obj = wait_condition(
            kube, namespace, "refused", "Degraded", "True", reason="CanaryCrashLooping", timeout=120
        )
        canary = obj["status"]["abortedRevision"]
        assert obj["status"]["stableRevision"] == stable and canary != stable
        revision_gone(kube, namespace, "refused", canary, timeout=60)
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "refused canary")
    assert set(client.answers) == {0.0}  # only the stable revision ever answered
    warnings = [(r, m) for t, r, m in events(kube, namespace, "refused") if t == "Warning"]
    assert any(r == "RolloutAborted" and canary in m for r, m in warnings), warnings


def test_canary_whose_model_raises_at_import_crash_loops_and_is_rolled_back(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}]}
    apply(kube, on_real_node("crashy", namespace, bucket=bucket, endpoint=store.endpoint, rollout=rollout))
    stable = serving(kube, namespace, "crashy")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "crashy")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        # Version 2 raises at import: the poll pins it, Triton fails to load it and exits.
        store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY.format(version=2), Body=raising_source())
        obj = wait_condition(
            kube, namespace, "crashy", "Degraded", "True", reason="CanaryCrashLooping", timeout=150
        )
        assert obj["status"]["stableRevision"] == stable
        assert "canary pods are crash-looping" in condition(obj, "Degraded")["message"]
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "crash-looping canary")
    assert set(client.answers) == {0.0}
    # Triton's own words, from the log tail Kubernetes kept when tritonserver exited
    triton = "model 'add_sub' version 2: Internal: RuntimeError: this model.py fails at import"
    assert triton in condition(obj, "Degraded")["message"], condition(obj, "Degraded")
    aborted = [m for t, r, m in events(kube, namespace, "crashy") if r == "RolloutAborted"]
    assert aborted and triton in aborted[0], aborted
    assert triton in kubectl_triton(cluster, "status", "crashy", "-n", namespace)


def test_a_canary_whose_repository_does_not_fit_its_volume_is_rolled_back_naming_the_bytes(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    """spec.modelVolume.sizeLimit too small for the repository: the canary's sync refuses before
    writing anything (exit 7), its one-line reason (bytes needed and free) comes back through the
    container's termination message into Degraded and the rollback Event, and the stable revision
    answers every request meanwhile."""
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}]}
    apply(kube, on_real_node("cramped", namespace, bucket=bucket, endpoint=store.endpoint, rollout=rollout))
    stable = serving(kube, namespace, "cramped")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "cramped")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        small = on_real_node(
            "cramped", namespace, bucket=bucket, endpoint=store.endpoint, rollout=rollout,
            modelVolume={"sizeLimit": "1Ki"},
        )  # fmt: skip
        apply(kube, small)
        obj = wait_condition(
            kube, namespace, "cramped", "Degraded", "True", reason="CanaryCrashLooping", timeout=150
        )
        assert obj["status"]["stableRevision"] == stable
        message = condition(obj, "Degraded")["message"]
        assert "sync: the model repository needs" in message and "nothing was written" in message, message
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "a canary whose repository does not fit")
    assert set(client.answers) == {0.0}
    aborted = [m for t, r, m in events(kube, namespace, "cramped") if r == "RolloutAborted"]
    assert aborted and "sync: the model repository needs" in aborted[0], aborted


def test_full_canary_rollout_drops_no_request(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    rollout = {"steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 4}}]}
    apply(
        kube,
        on_real_node(
            "smooth", namespace, bucket=bucket, endpoint=store.endpoint, replicas=2, rollout=rollout
        ),
    )
    first = serving(kube, namespace, "smooth")
    old = first["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "smooth")
    answering(host, 0)

    client = LoadClient(host, max_seconds=300).start()
    try:
        store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY.format(version=2), Body=adder_source(100))

        def promoted() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "smooth")
            new = obj["status"].get("stableRevision")
            done = new not in (None, old) and not obj["status"].get("canaryRevision")
            return obj if done and condition(obj, "Ready").get("status") == "True" else None

        wait_for(promoted, timeout=180, what="the canary to be promoted")
        # the old stable is scaled down and its pods drain and terminate
        revision_gone(kube, namespace, "smooth", old, timeout=90)
        answering(host, 100)
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "full canary rollout")
    assert client.answers[0.0] > 0 and client.answers[100.0] > 0, client.summary()
    assert set(client.answers) == {0.0, 100.0}
    steps = [m for t, r, m in events(kube, namespace, "smooth") if r == "StepCompleted"]
    assert steps, events(kube, namespace, "smooth")


def test_in_place_upload_rolls_out_new_answers_and_undo_brings_back_the_old(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    s3 = store.extra["s3"]
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket=bucket, Key=MODEL_KEY.format(version=1), Body=adder_source(0))
    apply(kube, on_real_node("inplace", namespace, bucket=bucket, endpoint=store.endpoint))
    pinned = serving(kube, namespace, "inplace")
    first = pinned["status"]["stableRevision"]
    assert "not exact" not in condition(pinned, "RepositoryReady")["message"]  # versions pinned
    host = cluster_ip(kube, namespace, "inplace")
    answering(host, 0)

    # the same key, new bytes: a new revision pinned to the new object version
    s3.put_object(Bucket=bucket, Key=MODEL_KEY.format(version=1), Body=adder_source(7))

    def rolled() -> str | None:
        obj = get_ts(kube, namespace, "inplace")
        rev = obj["status"].get("stableRevision")
        ok = rev not in (None, first) and condition(obj, "Ready").get("status") == "True"
        return str(rev) if ok else None

    wait_for(rolled, timeout=150, what="the in-place upload to roll out")
    answering(host, 7)

    # undo: the first revision's pods start again and sync the first version's exact bytes
    kubectl_triton(cluster, "undo", "inplace", "-n", namespace)
    wait_for(
        lambda: get_ts(kube, namespace, "inplace")["status"].get("stableRevision") == first,
        timeout=150,
        what="the undo",
    )
    answering(host, 0, timeout=120)
    assert {p.spec.nodeSelector[REAL_NODE_LABEL] for p in pods(kube, namespace, "inplace")} == {"true"}


def test_undo_to_a_revision_an_unversioned_upload_broke_is_refused_and_nothing_stops_serving(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    """Recreate scales the serving revision down before the new one starts: an undo to a revision
    whose pinned object was overwritten in an unversioned bucket would stop serving for good."""
    s3 = store.extra["s3"]
    body = on_real_node("brittle", namespace, bucket=bucket, endpoint=store.endpoint)
    body["spec"]["rollout"] = {"strategy": "Recreate"}
    apply(kube, body)
    first = serving(kube, namespace, "brittle")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "brittle")
    answering(host, 0)
    s3.put_object(Bucket=bucket, Key=MODEL_KEY.format(version=1), Body=adder_source(7))  # in place

    def rolled() -> dict[str, Any] | None:
        obj = get_ts(kube, namespace, "brittle")
        rev = obj["status"].get("stableRevision")
        ok = rev not in (None, first) and condition(obj, "Ready").get("status") == "True"
        return obj if ok else None

    second = wait_for(rolled, timeout=150, what="the in-place upload to roll out")["status"]["stableRevision"]
    assert (
        "rollback is not exact" in condition(get_ts(kube, namespace, "brittle"), "RepositoryReady")["message"]
    )
    answering(host, 7)

    client = LoadClient(host, max_seconds=60).start()
    try:
        kubectl_triton(cluster, "undo", "brittle", "-n", namespace)
        wait_for(
            lambda: any(r == "UndoRejected" for _, r, _ in events(kube, namespace, "brittle")),
            timeout=30,
            what="the undo to be rejected",
        )
        time.sleep(5)  # long enough for a Recreate to have scaled the serving revision down
    finally:
        no_request_failed(client, "undo to a revision that cannot sync")
    (message,) = [m for _, r, m in events(kube, namespace, "brittle") if r == "UndoRejected"]
    assert f"undo: revision {first} cannot sync any more" in message, message
    assert "models/add_sub/1/model.py was overwritten" in message, message
    obj = get_ts(kube, namespace, "brittle")
    assert obj["status"]["stableRevision"] == second and "pinnedRevision" not in obj["status"]
    assert offset_of(infer_add_sub(host, timeout=3)) == 7


def test_the_chart_runs_the_operator_as_a_pod_on_the_real_node_and_its_service_answers(  # noqa: PLR0917
    kube: Client, namespace: str, store: Any, bucket: str, cluster: Path, tmp_path: Path
) -> None:
    """`helm install` with the image built from the Dockerfile: the operator runs in a pod (its
    ServiceAccount, RBAC, read-only root filesystem and probes as shipped), reaches the API server
    through the `kubernetes` Service, and reconciles a TritonService whose pods then serve."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    from testkit import load_chartlib  # noqa: PLC0415

    helm = load_chartlib().find_tool("helm")
    if helm is None:
        pytest.skip("no helm binary (python3 e2e/cluster.py build provides one)")
    release = f"rp-{uuid.uuid4().hex[:6]}"
    values = {
        "watchNamespaces": [namespace],
        "operator": {"defaultTritonImage": TRITON_CPU_IMAGE, "logLevel": "DEBUG"},
        **placement(),
    }
    (tmp_path / "values.json").write_text(json.dumps(values))
    chart = ROOT / "charts" / "triton-operator"

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

    helm_run(
        "install",
        release,
        str(chart),
        "-n",
        namespace,
        "-f",
        str(tmp_path / "values.json"),
        "--wait",
        "--timeout",
        "180s",
    )
    try:
        (op,) = [
            p for p in kube.list(Pod, namespace=namespace, labels={"app.kubernetes.io/instance": release})
        ]
        assert op.spec is not None and op.status is not None and op.status.containerStatuses is not None
        assert op.spec.nodeName and ready(op)
        (container,) = op.status.containerStatuses
        assert container.image.endswith("triton-operator/triton-operator:0.1.0") and container.ready
        security = op.spec.containers[0].securityContext
        assert security is not None and security.readOnlyRootFilesystem is True

        body = on_real_node("charted", namespace, bucket=bucket, endpoint=store.endpoint)
        del body["spec"]["image"]  # the chart's defaultTritonImage
        apply(kube, body)
        serving(kube, namespace, "charted", timeout=180)
        answering(cluster_ip(kube, namespace, "charted"), 0)
        (pod,) = pods(kube, namespace, "charted")
        assert pod.spec.containers[0].image == TRITON_CPU_IMAGE
    finally:
        helm_run("uninstall", release, "-n", namespace, "--wait", "--timeout", "120s")


def test_a_node_drain_evicts_one_pod_at_a_time_and_no_request_fails(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, kubectl: str | None, cluster: Path
) -> None:
    """The PodDisruptionBudget (on by default with 2 replicas) lets an eviction (what `kubectl drain`
    sends) take one serving pod, refuses the second until a replacement is Ready; the drained pod
    finishes its requests (preStop drain, then Triton's exit timeout)."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    from lightkube.resources.policy_v1 import PodDisruptionBudget  # noqa: PLC0415

    if kubectl is None:
        pytest.skip("no kubectl")
    apply(kube, on_real_node("drained", namespace, bucket=bucket, endpoint=store.endpoint, replicas=2))
    serving(kube, namespace, "drained")
    host = cluster_ip(kube, namespace, "drained")
    answering(host, 0)

    def one_disruption_allowed() -> bool:
        status = kube.get(PodDisruptionBudget, "drained", namespace=namespace).status
        return status is not None and status.disruptionsAllowed == 1

    wait_for(one_disruption_allowed, timeout=30, what="the PodDisruptionBudget to allow one disruption")

    def evict(pod: str) -> subprocess.CompletedProcess[str]:
        body = json.dumps(
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        )
        return subprocess.run(
            [
                kubectl,
                f"--kubeconfig={cluster}",
                "create",
                "--raw",
                f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
                "-f",
                "-",
            ],
            input=body,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    first, second = sorted(p.metadata.name for p in pods(kube, namespace, "drained"))
    client = LoadClient(host, max_seconds=180).start()
    try:
        time.sleep(1)
        assert evict(first).returncode == 0
        refused = evict(second)
        assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
        # a replacement comes up and is Ready; then the second pod may go too
        wait_for(
            lambda: sum(ready(p) for p in pods(kube, namespace, "drained") if p.metadata.name != first) == 2,
            timeout=90,
            what="a Ready replacement of the evicted pod",
        )
        wait_for(lambda: evict(second).returncode == 0, timeout=60, what="the second eviction to be allowed")
        wait_for(
            lambda: (
                sum(
                    ready(p)
                    for p in pods(kube, namespace, "drained")
                    if p.metadata.name not in (first, second)
                )
                == 2
            ),
            timeout=90,
            what="two Ready pods again",
        )
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "node drain")


def test_blue_green_sends_nothing_to_green_before_promotion(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    rollout = {"strategy": "BlueGreen", "steps": [{"pause": {}}]}
    apply(kube, on_real_node("bg", namespace, bucket=bucket, endpoint=store.endpoint, rollout=rollout))
    blue = serving(kube, namespace, "bg")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "bg")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY.format(version=2), Body=adder_source(100))

        def green_ready() -> str | None:
            obj = get_ts(kube, namespace, "bg")
            green = obj["status"].get("canaryRevision")
            pods_ready = [
                p for p in pods(kube, namespace, "bg") if green and green in p.metadata.name and ready(p)
            ]
            return str(green) if pods_ready else None

        green = wait_for(green_ready, timeout=120, what="the green revision's pod to be Ready")
        time.sleep(4)  # green Ready and waiting at its pause: it must get nothing
        before = dict(client.answers)
        assert set(before) == {0.0}, client.summary()
        kubectl_triton(cluster, "promote", "bg", "-n", namespace)
        wait_for(
            lambda: get_ts(kube, namespace, "bg")["status"].get("stableRevision") == green,
            timeout=60,
            what="the promotion",
        )
        answering(host, 100)
        revision_gone(kube, namespace, "bg", blue, timeout=90)
        time.sleep(1)
    finally:
        client.stop()
    no_request_failed(client, "blue/green")
    assert client.answers[100.0] > 0


def test_an_abort_under_traffic_moves_answers_back_to_the_stable_and_no_request_fails(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    """`kubectl triton abort` of a canary taking half the traffic: traffic moves back to the stable
    revision before the canary goes (its pods drain as they terminate), and no request fails."""
    rollout = {"steps": [{"setWeight": 50}, {"pause": {}}]}
    body = on_real_node(
        "halted", namespace, bucket=bucket, endpoint=store.endpoint, replicas=2, rollout=rollout
    )
    apply(kube, body)
    stable = serving(kube, namespace, "halted")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "halted")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY.format(version=2), Body=adder_source(100))
        wait_for(lambda: client.answers.get(100.0, 0) >= 20, timeout=150, what="the canary to answer")
        canary = get_ts(kube, namespace, "halted")["status"]["canaryRevision"]
        assert canary and canary != stable
        kubectl_triton(cluster, "abort", "halted", "-n", namespace)
        obj = wait_condition(kube, namespace, "halted", "Degraded", "True", reason="Aborted", timeout=60)
        assert obj["status"]["stableRevision"] == stable and obj["status"]["abortedRevision"] == canary
        revision_gone(kube, namespace, "halted", canary, timeout=90)
        answering(host, 0)
        time.sleep(1)
    finally:
        client.stop()
    no_request_failed(client, "abort under traffic")
    assert set(client.answers) == {0.0, 100.0}, client.summary()


def test_a_blocked_spec_keeps_the_serving_pods_and_kubectl_scale_still_resizes_them(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path, kubectl: str | None
) -> None:
    """A spec the operator refuses (a value-less serverArgs flag) is held: the serving pod is not
    touched (same pod, no restart), and `kubectl scale` still adds a pod of the serving revision
    while the spec waits; no request fails throughout."""
    if kubectl is None:
        pytest.skip("no kubectl binary")
    apply(kube, on_real_node("held", namespace, bucket=bucket, endpoint=store.endpoint))
    stable = serving(kube, namespace, "held")["status"]["stableRevision"]
    (first,) = pods(kube, namespace, "held")
    host = cluster_ip(kube, namespace, "held")
    answering(host, 0)

    client = LoadClient(host, max_seconds=240).start()
    try:
        bad = on_real_node("held", namespace, bucket=bucket, endpoint=store.endpoint)
        bad["spec"]["serverArgs"] = ["--log-verbose"]
        apply(kube, bad)
        obj = wait_condition(kube, namespace, "held", "Ready", "False", reason="InvalidSpec", timeout=60)
        assert "spec.serverArgs[0]" in condition(obj, "Ready")["message"]
        kubectl_scale(kubectl, cluster, namespace, "held", 2)

        def two_ready() -> list[Any] | None:
            found = [p for p in pods(kube, namespace, "held") if ready(p)]
            return found if len(found) == 2 else None

        both = wait_for(two_ready, timeout=120, what="a second Ready pod of the serving revision")
        assert all(stable in p.metadata.name for p in both)
        kept = next(p for p in both if p.metadata.uid == first.metadata.uid)
        assert all(c.restartCount == 0 for c in kept.status.containerStatuses)
        assert get_ts(kube, namespace, "held")["status"]["stableRevision"] == stable
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, "a blocked spec, scaled")
    assert set(client.answers) == {0.0}


def test_a_namespace_enforcing_pod_security_restricted_serves_and_refuses_a_root_pod(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    """The API server's own PodSecurity admission, level `restricted`, on the test's namespace: the
    operator's default pods pass it, become Ready on the real node and answer; a spec whose pod
    securityContext drops runAsNonRoot and the seccomp profile (a non-root uid, so the operator's own
    policy lets it through: it refuses root itself, tests/unit/core/pod/test_policy.py) is refused by the
    same admission (so the label is really enforced)."""
    kube.patch(
        Namespace,
        namespace,
        {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
    )
    apply(kube, on_real_node("secure", namespace, bucket=bucket, endpoint=store.endpoint))
    serving(kube, namespace, "secure")
    (pod,) = pods(kube, namespace, "secure")
    assert ready(pod)
    assert pod.spec.securityContext.runAsNonRoot is True and pod.spec.automountServiceAccountToken is False
    agent = next(c for c in pod.status.containerStatuses if c.name == "model-agent")
    assert agent.ready and agent.restartCount == 0  # the agent fetched as uid 65532 on a read-only root
    host = cluster_ip(kube, namespace, "secure")
    answering(host, 0, timeout=15)
    assert infer_add_sub(host) == {
        "OUTPUT0": [11.0, 22.0, 33.0, 44.0],
        "OUTPUT1": [-9.0, -18.0, -27.0, -36.0],
    }

    root = on_real_node(
        "root",
        namespace,
        bucket=bucket,
        endpoint=store.endpoint,
        podSecurityContext={"runAsUser": 1000},
    )
    apply(kube, root)

    def refused() -> str | None:
        for rs in kube.list(ReplicaSet, namespace=namespace, labels={"triton-operator.io/service": "root"}):
            for c in (rs.status.conditions if rs.status else None) or []:
                if c.type == "ReplicaFailure" and "violates PodSecurity" in (c.message or ""):
                    return str(c.message)
        return None

    message = wait_for(refused, timeout=60, what="the root pod to be refused by PodSecurity admission")
    assert "restricted" in str(message)
    assert not pods(kube, namespace, "root")


# ----------------------------------------------------------------- canary analysis on Triton's metrics

ANALYSIS: dict[str, Any] = {"intervalSeconds": 2, "minRequests": 40, "maxLatencyRatio": 1.5}
STABLE_DELAY = 0.01


def analysed_service(name: str, namespace: str, bucket: str, store: Any, **analysis: Any) -> dict[str, Any]:
    """A TritonService whose canary takes 50% of the traffic, then waits for its analysis to promote."""
    rollout = {"steps": [{"setWeight": 50}], "analysis": {**ANALYSIS, **analysis}}
    return on_real_node(name, namespace, bucket=bucket, endpoint=store.endpoint, rollout=rollout)


def upload(store: Any, bucket: str, version: int, source: bytes) -> None:
    store.extra["s3"].put_object(Bucket=bucket, Key=MODEL_KEY.format(version=version), Body=source)


def triton_versions(obj: dict[str, Any], side: str) -> list[dict[str, Any]]:
    """status.models[0].<side>.versions: Triton's own view of add_sub in that revision."""
    (model,) = obj["status"].get("models") or [{}]
    return list((model.get(side) or {}).get("versions") or [])


def test_a_healthy_canary_passes_its_analysis_and_is_promoted_and_status_models_follows_triton(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    upload(store, bucket, 1, behaving_source(0, delay=STABLE_DELAY))
    apply(kube, analysed_service("healthy", namespace, bucket, store))
    first = serving(kube, namespace, "healthy")
    old = first["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "healthy")
    answering(host, 0)
    # Triton's repository index, read from the pod: version 1 of add_sub is loaded and READY. A pod of
    # the one shape starts tritonserver empty and its agent loads the model after, so a reading
    # taken during that load (LOADING) may come first: status.models follows Triton to READY.
    ready = [{"version": "1", "state": "READY"}]
    seen = wait_for(
        lambda: triton_versions(get_ts(kube, namespace, "healthy"), "serving") == ready or None,
        timeout=30,
        what="Triton's view of the serving revision in status.models: version 1 READY",
    )
    assert seen
    assert get_ts(kube, namespace, "healthy")["status"]["models"][0]["serving"]["revision"] == old

    client = LoadClient(host, max_seconds=300).start()
    try:
        upload(store, bucket, 2, behaving_source(100, delay=STABLE_DELAY))

        def promoted() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "healthy")
            new = obj["status"].get("stableRevision")
            return obj if new not in (None, old) and not obj["status"].get("canaryRevision") else None

        done = wait_for(promoted, timeout=180, what="the canary to pass its analysis and be promoted")
        answering(host, 100, timeout=90)
    finally:
        client.stop()
    print(f"\nhealthy canary: {client.summary()}")
    assert not client.failures, client.failures[:5]
    assert client.answers[0.0] > 0 and client.answers[100.0] > 0, client.summary()
    (run,) = done["status"]["analysisRuns"]
    assert run["verdict"] == "Passed" and run["weight"] == 50, run
    assert "success ratio 1.0000" in run["message"] and "x stable" in run["message"], run
    passed = [m for t, r, m in events(kube, namespace, "healthy") if r == "AnalysisPassed"]
    assert passed and "analysis passed" in passed[0], events(kube, namespace, "healthy")
    status = kubectl_triton(cluster, "status", "healthy", "-n", namespace)
    assert "Passed" in status and "add_sub" in status, status
    wait_for(
        lambda: (
            triton_versions(get_ts(kube, namespace, "healthy"), "serving")
            == [{"version": "2", "state": "READY"}]
        ),
        timeout=30,
        what="status.models to show version 2 served",
    )


@pytest.mark.parametrize(
    ("canary", "what"),
    [
        # 3 in every 10 fail, but a window starts mid-cycle: its ratio is about 0.7, not exactly
        (
            behaving_source(100, delay=STABLE_DELAY, fail_in_ten=3),
            r"success ratio 0\.(6[5-9]|7[0-5])\d* over \d+ requests < 0\.99",
        ),
        (
            behaving_source(100, delay=STABLE_DELAY * 3),
            r"request latency \d+us = [\d.]+ x stable \d+us > 1\.5 x",
        ),
    ],
    ids=["fails-30-percent", "three-times-slower"],
)
def test_a_bad_canary_fails_its_analysis_under_traffic_and_is_rolled_back(  # noqa: PLR0917 (fixtures)
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, canary: bytes, what: str
) -> None:
    upload(store, bucket, 1, behaving_source(0, delay=STABLE_DELAY))
    apply(kube, analysed_service("judged", namespace, bucket, store))
    stable = serving(kube, namespace, "judged")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "judged")
    answering(host, 0)

    client = LoadClient(host, max_seconds=300).start()
    try:
        upload(store, bucket, 2, canary)
        obj = wait_condition(
            kube, namespace, "judged", "Degraded", "True", reason="AnalysisFailed", timeout=180
        )
        aborted = obj["status"]["abortedRevision"]
        revision_gone(kube, namespace, "judged", aborted, timeout=60)
        # only the stable answers now: a request sent after the canary's pods went never fails
        after = LoadClient(host, max_seconds=10, max_requests=100).start()
        time.sleep(3)
        after.stop()
    finally:
        client.stop()
    print(f"\nbad canary ({what}): {client.summary()}")
    assert obj["status"]["stableRevision"] == stable and aborted != stable
    message = condition(obj, "Degraded")["message"]
    assert "analysis failed" in message and re.search(what, message), message
    assert client.answers[100.0] > 0, client.summary()  # the canary did take traffic
    assert set(after.answers) == {0.0} and not after.failures, after.summary()
    (run,) = obj["status"]["analysisRuns"]
    assert run["verdict"] == "Failed" and run["revision"] == aborted, run
    warnings = [m for t, r, m in events(kube, namespace, "judged") if (t, r) == ("Warning", "RolloutAborted")]
    assert warnings and re.search(what, warnings[0]), events(kube, namespace, "judged")


def test_a_canary_without_traffic_is_inconclusive_and_pauses(
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str
) -> None:
    upload(store, bucket, 1, behaving_source(0, delay=STABLE_DELAY))
    body = analysed_service("quiet", namespace, bucket, store, inconclusiveAfterSeconds=8)
    apply(kube, body)
    stable = serving(kube, namespace, "quiet")["status"]["stableRevision"]
    upload(store, bucket, 2, behaving_source(100, delay=STABLE_DELAY))  # no client: no request at all
    obj = wait_condition(
        kube, namespace, "quiet", "Progressing", "False", reason="RolloutPaused", timeout=180
    )
    assert obj["status"]["pausedByUser"] is True
    assert obj["status"]["stableRevision"] == stable and obj["status"]["canaryRevision"] != stable
    (run,) = obj["status"]["analysisRuns"]
    assert run["verdict"] == "Paused" and "0 of 40 requests needed" in run["message"], run
    assert obj["status"]["analysis"]["verdict"] == "Inconclusive"

    # status.models: Triton's own view of both revisions while the canary runs
    def canary_seen() -> dict[str, Any] | None:
        current = get_ts(kube, namespace, "quiet")
        return current if triton_versions(current, "canary") else None

    both = wait_for(canary_seen, timeout=30, what="Triton's view of the canary in status.models")
    assert triton_versions(both, "serving") == [{"version": "1", "state": "READY"}]
    assert triton_versions(both, "canary") == [{"version": "2", "state": "READY"}]
    assert both["status"]["models"][0]["canary"]["revision"] == obj["status"]["canaryRevision"]
    warnings = [
        m for t, r, m in events(kube, namespace, "quiet") if (t, r) == ("Warning", "AnalysisInconclusive")
    ]
    assert warnings and "rollout paused" in warnings[0], warnings
    # paused, not aborted: the canary keeps its pods and nothing is rolled back
    time.sleep(4)
    again = get_ts(kube, namespace, "quiet")
    assert again["status"].get("canaryRevision") == obj["status"]["canaryRevision"]
    assert condition(again, "Degraded")["status"] == "False"


# ----------------------------------------------------------------- autoscaling real pods


class TritonRateBridge(Repeating):
    """Stands in for Prometheus + prometheus-adapter, which cannot run here (no image can be fetched):
    every 0.5 s it reads each pod's real Triton metrics (:8002/metrics) and writes the pod's
    inferences a second to the cluster's custom metrics API, as examples/autoscaling's rule
    ``sum by (pod) (rate(nv_inference_count[1m]))`` would, over a 4 s window instead of a minute.
    The numbers are tritonserver's own: the HPA scales on the load the pods really served."""

    WINDOW = 4.0

    def __init__(self, kube: Client, metrics: Any, namespace: str, name: str) -> None:
        super().__init__()
        self.kube, self.metrics, self.namespace, self.name = kube, metrics, namespace, name
        self.samples: dict[str, collections.deque[tuple[float, float]]] = collections.defaultdict(
            collections.deque
        )
        self.rates: dict[str, float] = {}

    @staticmethod
    def served(pod_ip: str) -> float:
        """nv_inference_count summed over the models and versions of one tritonserver."""
        with urllib.request.urlopen(f"http://{pod_ip}:8002/metrics", timeout=3) as response:
            text = response.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            if family.name == "nv_inference_count"
            for s in family.samples
        )

    def step(self) -> None:
        now = time.monotonic()
        for pod in pods(self.kube, self.namespace, self.name):
            name = pod.metadata.name
            if pod.metadata.deletionTimestamp is not None:
                continue
            rate = 0.0
            if ready(pod) and pod.status.podIP:
                window = self.samples[name]
                window.append((now, self.served(pod.status.podIP)))
                while window and now - window[0][0] > self.WINDOW:
                    window.popleft()
                (t0, c0), (t1, c1) = window[0], window[-1]
                rate = (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0
            self.rates[name] = rate
            self.metrics.write(self.namespace, "pods", name, INFERENCE_RATE_METRIC, f"{round(rate * 1000)}m")


def test_the_hpa_scales_real_tritonserver_pods_on_their_served_rate_and_no_request_fails(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, metrics: Any
) -> None:
    """spec.autoscaling's HPA, run by kube-controller-manager, scales real tritonserver pods on the
    inferences a second they serve (Triton's nv_inference_count, through TritonRateBridge): a busy
    client (about 40 requests a second against a target of 10 a pod) brings a second pod, which
    takes requests through the Service; when only a slow client is left (4 a second) the service
    goes back to one pod. Neither client sees a failed request, scale-down included."""
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metrics": [{"inferencesPerSecond": {"averagePerPod": "10"}}],
        "behavior": {
            "scaleUp": {"stabilizationWindowSeconds": 0},
            "scaleDown": {
                "stabilizationWindowSeconds": 0,
                "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
            },
        },
    }
    body = on_real_node("elastic", namespace, bucket=bucket, endpoint=store.endpoint, autoscaling=autoscaling)
    body["spec"].pop("replicas")  # the HPA owns it (README: Autoscaling, GitOps)
    apply(kube, body)
    stable = serving(kube, namespace, "elastic")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "elastic")
    answering(host, 0)

    def serving_pods(count: int) -> list[str] | None:
        obj = get_ts(kube, namespace, "elastic")
        live = [p for p in pods(kube, namespace, "elastic") if p.metadata.deletionTimestamp is None]
        names = sorted(p.metadata.name for p in live if ready(p))
        status = obj.get("status") or {}
        settled = (
            len(live) == count and status.get("replicas") == count and obj["spec"].get("replicas") == count
        )
        return names if settled and len(names) == count else None

    slow = LoadClient(host, interval=0.25, max_seconds=400).start()
    try:
        with TritonRateBridge(kube, metrics, namespace, "elastic") as bridge:
            (first,) = wait_for(lambda: serving_pods(1), timeout=60, what="one pod")
            active = wait_for(
                lambda: (
                    (c := condition(get_ts(kube, namespace, "elastic"), "Autoscaling"))
                    and c.get("reason") == "AutoscalerActive"
                    and c
                ),
                timeout=120,
                what="Autoscaling=True/AutoscalerActive (the HPA read the pods' rate)",
            )
            assert f"1 to 2 replicas on {INFERENCE_RATE_METRIC} 10" in active["message"], active

            busy = LoadClient(host, interval=0.01, max_seconds=300).start()
            try:
                both = wait_for(lambda: serving_pods(2), timeout=180, what="a second Ready pod")
                (second,) = set(both) - {first}
                # the Service sends the busy client's requests to the new pod too
                wait_for(
                    lambda: bridge.rates.get(second, 0) > 1,
                    timeout=30,
                    what=f"pod {second} to serve requests ({bridge.rates})",
                )
                # both pods share the busy client's requests: each serves over its target, and
                # together what the client sent (Triton's counts against the client's)
                sent, since = busy.sent + slow.sent, time.monotonic()
                time.sleep(TritonRateBridge.WINDOW + 0.5)
                sent_rate = (busy.sent + slow.sent - sent) / (time.monotonic() - since)
                shared = {pod: bridge.rates.get(pod, 0.0) for pod in both}
            finally:
                no_request_failed(busy, "autoscaling: busy client")
            # only the slow client now: about 4 a second, under one pod's target
            (left,) = wait_for(lambda: serving_pods(1), timeout=180, what="back to one pod")
            # the slow client goes on until the other pod has drained and is gone
            wait_for(
                lambda: len(pods(kube, namespace, "elastic")) == 1, timeout=60, what="the other pod to go"
            )
            time.sleep(1)
    finally:
        no_request_failed(slow, "autoscaling: slow client")
    print(f"two pods served (inferences/s): {shared}; the clients sent {sent_rate:.1f}/s")
    assert all(rate > 10 for rate in shared.values()), shared
    assert 0.6 * sent_rate < sum(shared.values()) < 1.4 * sent_rate, (shared, sent_rate)
    assert not bridge.errors, bridge.errors[:5]
    assert left in (first, second)
    obj = get_ts(kube, namespace, "elastic")
    assert obj["status"]["stableRevision"] == stable and set(slow.answers) == {0.0}

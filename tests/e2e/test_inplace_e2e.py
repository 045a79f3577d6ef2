"""In-place model updates on the real node (spec.rollout.modelUpdates: InPlace): real pods with the
`triton-operator agent` init container and model-agent sidecar, a real CPU tritonserver, and a client
counting answers through the TritonService's Service.

(a) a new version of one model that also changes its config goes live in the running pods, step by
    step, in a namespace enforcing Pod Security `restricted`: no request fails, the answers switch from
    the old to the new, the pods are the same pods (names, uids, no restart), no Deployment of the new
    revision exists, the other model is not reloaded (its per-pod inference count goes on from where
    it was), and status and Events say in place;
(b) a new version that fails to load is rolled back in place: no request fails, the answers stay old;
(c) a new version three times slower than the old fails spec.rollout.analysis (the updated pod against
    the pod not asked yet, on Triton's own metrics): rolled back in place, no request fails, the
    answers go back to the old version, the Events and conditions those of a failed canary analysis;
(d) `kubectl triton undo` of an in-place rollout loads the revision served before back into the same
    pods, in place: no request fails, the answers go back to the old version;
(e) a pod evicted by the kubelet mid-rollout (its /models past modelVolume.sizeLimit: phase Failed,
    reason Evicted, left in place) neither wedges the rollout nor counts: it completes on the pods
    that can serve, the ReplicaSet's new pod included, and no request fails outside the eviction.
(f) a model whose Python backend stub is killed (kubectl exec) takes its pod out of the Service's
    endpoints (the agent's readiness; tritonserver 2.51 still reports it ready), and no request
    through the Service fails once it is out;
(g) one rollout paused at its first step through the operator killed and started again, a newer
    spec, `kubectl triton abort`, then a newer version whose updated pod is deleted mid-step while
    its replacement is held Pending (the node cordoned): no request fails.
In every pod the agent unloads a model only once it has answered the kubelet's readiness probe (every
second, out at its first failure) 503 failureThreshold times, then waited drainSeconds (however late
the probe comes): (a) to (d) and (g) count 0 failed with it.

Needs the real node of e2e/cluster.py and the images built from this tree (e2e/images.py); without
them every test here skips, saying why.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Namespace, Node, Pod, Service
from lightkube.resources.discovery_v1 import EndpointSlice

from e2e_helpers import (
    apply,
    condition,
    create_store_secret,
    events,
    get_ts,
    kubectl_triton,
    owned,
    wait_condition,
)
from inference import LoadClient, infer_add_sub, offset_of
from real_pods import (
    ADD_SUB_CONFIG,
    adder_source,
    answering,
    behaving_source,
    on_real_node,
    proxied_to,
    raising_source,
)
from testkit import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]
KEY = "models/{model}/{version}/model.py"
ANNOTATION = "triton-operator.io/inplace-target"


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket: add_sub version 1 (offset 0) and `other` version 1 (offset 7)."""
    import storage_servers  # noqa: PLC0415

    name = f"inplace-{uuid.uuid4().hex[:8]}"
    s3 = store.extra["s3"]
    s3.create_bucket(Bucket=name)
    s3.put_object(Bucket=name, Key=KEY.format(model="add_sub", version=1), Body=adder_source(0))
    s3.put_object(Bucket=name, Key=KEY.format(model="other", version=1), Body=adder_source(7))
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


def service(
    name: str,
    namespace: str,
    bucket: str,
    store: Any,
    add_sub_version: int,
    *,
    analysis: dict[str, Any] | None = None,
    **config: Any,
) -> dict[str, Any]:
    """Two replicas serving add_sub (the version named, through its version policy) and `other`;
    in-place updates with a canary of one pod (50%) for 4 s, then every pod (``analysis``: judged)."""
    add_sub = {
        **copy.deepcopy(ADD_SUB_CONFIG),
        "versionPolicy": {"specific": {"versions": [str(add_sub_version)]}},
    }
    add_sub.update(config)
    body = on_real_node(
        name,
        namespace,
        bucket=bucket,
        endpoint=store.endpoint,
        replicas=2,
        rollout={
            "modelUpdates": "InPlace",
            "steps": [{"setWeight": 50}, {"pause": {"durationSeconds": 4}}],
            "progressDeadlineSeconds": 240,
            **({"analysis": analysis} if analysis is not None else {}),
        },
        startupTimeoutSeconds=120,
    )
    body["spec"]["models"] = [
        {"name": "add_sub", "config": add_sub},
        {"name": "other", "config": copy.deepcopy(ADD_SUB_CONFIG)},
    ]
    return body


def cluster_ip(kube: Client, namespace: str, name: str) -> str:
    svc = kube.get(Service, name, namespace=namespace)
    assert svc.spec is not None and svc.spec.clusterIP
    return str(svc.spec.clusterIP)


def pods(kube: Client, namespace: str, name: str) -> list[Any]:
    return list(kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": name}))


def identity(kube: Client, namespace: str, name: str) -> dict[str, tuple[str, int]]:
    """Each pod's uid and its tritonserver's restarts, by name."""
    out = {}
    for pod in pods(kube, namespace, name):
        triton = next(c for c in pod.status.containerStatuses or [] if c.name == "tritonserver")
        out[pod.metadata.name] = (pod.metadata.uid, triton.restartCount)
    return out


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def inference_count(ip: str, model: str) -> int:
    """Triton's own count of the model's inferences in one pod (from 0 again after a reload)."""
    stats = get_json(f"http://{ip}:8000/v2/models/{model}/stats")
    return sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats") or [])


def agent(ip: str) -> dict[str, Any]:
    status: dict[str, Any] = get_json(f"http://{ip}:8009/v1/inplace")
    return status


def no_request_failed(client: LoadClient, what: str) -> None:
    client.stop()
    print(f"\n{what}: {client.summary()}")
    assert client.sent > 50, client.summary()
    assert not client.failures, client.failures[:5]


def serving(kube: Client, namespace: str, name: str) -> dict[str, Any]:
    return wait_condition(kube, namespace, name, "Ready", "True", timeout=180)


def test_a_new_version_with_a_new_config_goes_live_in_place_with_no_failed_request_and_no_new_pod(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    # The API server's PodSecurity admission at `restricted`: the in-place pods (agent init container
    # and sidecar) pass it as they are.
    kube.patch(
        Namespace, namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    apply(kube, service("live", namespace, bucket, store, 1))
    host_revision = serving(kube, namespace, "live")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "live")
    answering(host, 0)
    before = identity(kube, namespace, "live")
    ips = {p.metadata.name: p.status.podIP for p in pods(kube, namespace, "live")}
    for ip in ips.values():  # `other` has answered in every pod: its count shows a reload
        for _ in range(3):
            assert offset_of(infer_add_sub(ip, model="other")) == 7
    counts = {name: inference_count(ip, "other") for name, ip in ips.items()}
    assert all(n >= 3 for n in counts.values()), counts

    store.extra["s3"].put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=2), Body=adder_source(100)
    )
    client = LoadClient(host, max_seconds=400).start()
    started = time.monotonic()
    try:
        # version 2 (offset 100) and a config change together: one revision
        apply(kube, service("live", namespace, bucket, store, 2, parameters={"note": {"stringValue": "v2"}}))

        def moved() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "live")
            status = obj["status"]
            done = status.get("servedRevision") and not (status.get("inPlace") or {}).get("next")
            return obj if done and condition(obj, "Ready").get("status") == "True" else None

        seen_in_place = wait_for(
            lambda: (get_ts(kube, namespace, "live")["status"].get("inPlace") or {}).get("next"),
            timeout=60,
            what="an in-place rollout to start",
        )
        obj = wait_for(moved, timeout=300, interval=1, what="the new revision served in place by every pod")
        took = time.monotonic() - started
        answering(host, 100, timeout=30)
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, f"in-place rollout ({took:.1f} s from apply to every pod)")
    assert client.answers[0.0] > 0 and client.answers[100.0] > 0, client.summary()  # old, then new
    assert set(client.answers) == {0.0, 100.0}
    status = obj["status"]
    new = status["servedRevision"]
    assert seen_in_place == new and status["stableRevision"] == host_revision and new != host_revision
    assert status["rolloutKind"] == "InPlace"
    assert status["rolloutKindReason"].startswith("in place: reload add_sub"), status["rolloutKindReason"]
    # the same pods, never restarted; no Deployment of the new revision; its ConfigMap kept
    assert identity(kube, namespace, "live") == before
    assert {d["metadata"]["name"] for d in owned(kube, Deployment, namespace, "live")} == {
        f"live-{host_revision}"
    }
    wait_for(
        lambda: (
            not any((p.metadata.annotations or {}).get(ANNOTATION) for p in pods(kube, namespace, "live"))
        ),
        timeout=30,
        what="the pods' in-place annotations to be removed",
    )
    for name, ip in ips.items():
        reported = agent(ip)
        assert reported["revision"] == new and reported["state"] == "Applied", reported
        # The pod's readiness is the agent's, probed every second and out at its first failure (as
        # the API server stored it: a timeout longer than the period is accepted), and the agent
        # unloaded only once it had answered the kubelet's own probe 503 that many times in a row.
        pod = kube.get(Pod, name, namespace=namespace)
        assert pod.spec is not None
        triton = next(c for c in pod.spec.containers if c.name == "tritonserver")
        probe = triton.readinessProbe
        assert probe is not None and probe.httpGet is not None, triton
        assert probe.httpGet.path == "/v1/ready" and probe.httpGet.port == 8009, probe
        assert (probe.periodSeconds, probe.failureThreshold, probe.timeoutSeconds) == (1, 1, 5), probe
        logged = "".join(kube.log(name, namespace=namespace, container="model-agent"))
        assert re.search(r"probe was answered 503 \d+ times in a row \(its failureThreshold: 1\)", logged), (
            logged
        )
        assert "probes late or not at all" not in logged, logged[-2000:]
        assert inference_count(ip, "other") >= counts[name]  # `other` was not reloaded
        assert offset_of(infer_add_sub(ip)) == 100
    said = events(kube, namespace, "live")
    assert any(r == "RolloutStarted" and "in place" in m for _, r, m in said), said
    assert any(r == "RolloutCompleted" and "in place" in m for _, r, m in said), said
    printed = kubectl_triton(cluster, "status", "live", "-n", namespace)
    assert f"Serving:   revision {new} in place" in printed and "Rollout:   InPlace" in printed, printed
    print(f"\nin place: apply -> every pod on revision {new}: {took:.1f} s")


def test_a_new_version_that_fails_to_load_is_rolled_back_in_place_with_no_failed_request(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    apply(kube, service("held", namespace, bucket, store, 1))
    host_revision = serving(kube, namespace, "held")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "held")
    answering(host, 0)
    before = identity(kube, namespace, "held")

    store.extra["s3"].put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=3), Body=raising_source()
    )
    client = LoadClient(host, max_seconds=400).start()
    started = time.monotonic()
    try:
        apply(kube, service("held", namespace, bucket, store, 3))
        obj = wait_condition(
            kube, namespace, "held", "Degraded", "True", reason="InPlaceLoadFailed", timeout=300
        )
        failed = obj["status"]["inPlace"]["abortedRevision"]

        def back() -> dict[str, Any] | None:
            found = get_ts(kube, namespace, "held")
            in_place = found["status"].get("inPlace") or {}
            return found if in_place.get("abortedRevision") and not in_place.get("next") else None

        obj = wait_for(back, timeout=300, interval=1, what="every pod back on the stable revision")
        took = time.monotonic() - started
        time.sleep(3)
    finally:
        client.stop()
    no_request_failed(client, f"in-place rollback ({took:.1f} s from apply to every pod back)")
    assert set(client.answers) == {0.0}, client.summary()  # only the old version ever answered
    assert identity(kube, namespace, "held") == before
    assert obj["status"]["stableRevision"] == host_revision and failed != host_revision
    assert condition(obj, "Ready")["reason"] == "RolloutAborted"
    warnings = [(r, m) for t, r, m in events(kube, namespace, "held") if t == "Warning"]
    assert any(r == "RolloutAborted" and failed in m and "in-place" in m for r, m in warnings), warnings
    assert not any((p.metadata.annotations or {}).get(ANNOTATION) for p in pods(kube, namespace, "held"))
    assert {d["metadata"]["name"] for d in owned(kube, Deployment, namespace, "held")} == {
        f"held-{host_revision}"
    }
    printed = kubectl_triton(cluster, "status", "held", "-n", namespace)
    assert f"Aborted:   {failed} in place (InPlaceLoadFailed)" in printed, printed
    print(f"\nin-place rollback: apply -> every pod back: {took:.1f} s")


ANALYSIS: dict[str, Any] = {
    "intervalSeconds": 2,
    "minRequests": 40,
    "maxLatencyRatio": 1.5,
    "models": ["add_sub"],
}
DELAY = 0.01


def test_a_new_version_that_fails_its_analysis_is_rolled_back_in_place_with_no_failed_request(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    s3 = store.extra["s3"]
    s3.put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=1), Body=behaving_source(0, delay=DELAY)
    )
    apply(kube, service("judged", namespace, bucket, store, 1, analysis=ANALYSIS))
    host_revision = serving(kube, namespace, "judged")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "judged")
    answering(host, 0)
    before = identity(kube, namespace, "judged")

    # version 2: the same adder (offset 100), three times slower
    s3.put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=2), Body=behaving_source(100, delay=DELAY * 3)
    )
    client = LoadClient(host, max_seconds=400).start()
    started = time.monotonic()
    try:
        apply(kube, service("judged", namespace, bucket, store, 2, analysis=ANALYSIS))
        obj = wait_condition(
            kube, namespace, "judged", "Degraded", "True", reason="AnalysisFailed", timeout=300
        )
        failed = obj["status"]["inPlace"]["abortedRevision"]

        def back() -> dict[str, Any] | None:
            found = get_ts(kube, namespace, "judged")
            in_place = found["status"].get("inPlace") or {}
            return found if in_place.get("abortedRevision") and not in_place.get("next") else None

        obj = wait_for(back, timeout=300, interval=1, what="every pod back on the stable revision")
        took = time.monotonic() - started
        answering(host, 0, timeout=30)
        after = LoadClient(host, max_seconds=10, max_requests=100).start()
        time.sleep(3)
        after.stop()
    finally:
        client.stop()
    no_request_failed(
        client, f"in-place rollback on a failed analysis ({took:.1f} s from apply to every pod back)"
    )
    assert client.answers[100.0] > 0, client.summary()  # the updated pod did answer with version 2
    assert set(after.answers) == {0.0} and not after.failures, after.summary()
    assert identity(kube, namespace, "judged") == before
    status = obj["status"]
    assert status["stableRevision"] == host_revision and failed != host_revision
    assert status["inPlace"]["abortedReason"] == "AnalysisFailed"
    message = condition(obj, "Degraded")["message"]
    assert "analysis failed" in message and re.search(
        r"request latency \d+us = [\d.]+ x stable \d+us > 1\.5 x", message
    ), message
    run = status["analysisRuns"][-1]
    assert run["verdict"] == "Failed" and run["revision"] == failed and run["weight"] == 50, run
    warnings = [(r, m) for t, r, m in events(kube, namespace, "judged") if t == "Warning"]
    assert any(r == "RolloutAborted" and "analysis failed" in m and "in-place" in m for r, m in warnings), (
        warnings
    )
    assert not any((p.metadata.annotations or {}).get(ANNOTATION) for p in pods(kube, namespace, "judged"))
    assert {d["metadata"]["name"] for d in owned(kube, Deployment, namespace, "judged")} == {
        f"judged-{host_revision}"
    }
    printed = kubectl_triton(cluster, "status", "judged", "-n", namespace)
    assert f"Aborted:   {failed} in place (AnalysisFailed)" in printed, printed
    print(f"\nin-place rollback on a failed analysis: apply -> every pod back: {took:.1f} s; {message}")


def test_undo_of_an_in_place_rollout_goes_back_in_place_with_no_failed_request(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    apply(kube, service("undone", namespace, bucket, store, 1))
    host_revision = serving(kube, namespace, "undone")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "undone")
    answering(host, 0)
    before = identity(kube, namespace, "undone")
    store.extra["s3"].put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=2), Body=adder_source(100)
    )
    apply(kube, service("undone", namespace, bucket, store, 2))

    def moved() -> dict[str, Any] | None:
        obj = get_ts(kube, namespace, "undone")
        status = obj["status"]
        done = status.get("servedRevision") and not (status.get("inPlace") or {}).get("next")
        return obj if done else None

    new = wait_for(moved, timeout=300, interval=1, what="the new revision served in place")["status"][
        "servedRevision"
    ]
    answering(host, 100, timeout=30)
    client = LoadClient(host, max_seconds=400).start()
    started = time.monotonic()
    try:
        said = kubectl_triton(cluster, "undo", "undone", "-n", namespace)
        assert "undo requested" in said, said

        def undone() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "undone")
            status = obj["status"]
            in_place = status.get("inPlace") or {}
            back = not status.get("servedRevision") and in_place.get("pinned") == host_revision
            return obj if back and not in_place.get("next") else None

        obj = wait_for(
            undone, timeout=300, interval=1, what="the undo to load the old revision back in place"
        )
        took = time.monotonic() - started
        answering(host, 0, timeout=30)
        time.sleep(2)
    finally:
        client.stop()
    no_request_failed(client, f"in-place undo ({took:.1f} s from the request to every pod back)")
    assert client.answers[100.0] > 0 and client.answers[0.0] > 0, client.summary()
    assert set(client.answers) == {0.0, 100.0}
    assert identity(kube, namespace, "undone") == before  # the same pods, never restarted
    status = obj["status"]
    assert status["history"] == [{"revision": new, "inPlaceHost": host_revision}], status["history"]
    assert {d["metadata"]["name"] for d in owned(kube, Deployment, namespace, "undone")} == {
        f"undone-{host_revision}"
    }
    said_events = events(kube, namespace, "undone")
    assert any(r == "UndoRequested" and "in place" in m for _, r, m in said_events), said_events
    printed = kubectl_triton(cluster, "status", "undone", "-n", namespace)
    assert f"Undo:      serving {host_revision} in place" in printed, printed
    print(f"\nin-place undo: request -> every pod back: {took:.1f} s")


class PodTimeline:
    """Every change of the service's pods (phase, Ready, IP) and of the Service's endpoints, on the
    load client's clock, read every 0.5 s: what a failed request lines up with."""

    def __init__(self, kube: Client, namespace: str, name: str, client: LoadClient) -> None:
        self.kube, self.namespace, self.name, self.client = kube, namespace, name, client
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> PodTimeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        last = ""
        while not self._stop.wait(0.5):
            try:
                now = []
                for p in pods(self.kube, self.namespace, self.name):
                    status = p.status
                    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []))
                    now.append(
                        f"{p.metadata.name[-5:]} {status.phase} {'R' if ready else '-'} {status.podIP}"
                    )
                state = (
                    "; ".join(sorted(now))
                    + f" | endpoints {sorted(serving_ips(self.kube, self.namespace, self.name))}"
                )
            except Exception as exc:  # a read that fails is a line too
                state = f"read failed: {exc}"
            if state != last:
                self.lines.append(f"{time.monotonic() - self.client._t0:7.2f}  {state}")
                last = state


UNREACHABLE = "No route to host"


def conntrack_to(ip: str) -> list[tuple[str, int]]:
    """The node's conntrack entries of connections DNATed to ``ip`` (a Service's endpoint): each
    one's TCP state and seconds left; [] when the table cannot be read (then no failure is excused)."""
    try:
        lines = Path("/proc/net/nf_conntrack").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        sources = [f for f in fields if f.startswith("src=")]
        if len(fields) > 5 and fields[2] == "tcp" and len(sources) == 2 and sources[1] == f"src={ip}":
            out.append((fields[5], int(fields[4])))
    return out


def serving_ips(kube: Client, namespace: str, name: str) -> set[str]:
    """The addresses the Service sends requests to now (its EndpointSlices' ready endpoints)."""
    out: set[str] = set()
    for eps in kube.list(EndpointSlice, namespace=namespace, labels={"kubernetes.io/service-name": name}):
        for ep in eps.endpoints or []:
            if ep.conditions is None or ep.conditions.ready is not False:
                out.update(ep.addresses or [])
    return out


def test_a_pod_evicted_mid_rollout_neither_wedges_it_nor_fails_a_request_outside_the_eviction(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path, kubectl: str | None
) -> None:
    """The kubelet evicts the pod not asked yet (a file past its /models sizeLimit, written from its
    model-agent container): the pod stays, phase Failed, reason Evicted, with no deletionTimestamp.
    Before, it counted as live: the last step waited for it for ever, then so did the rollback.
    Now the rollout goes on with the pods that can serve (while one alone serves, it asks none, as a
    pod leaves the Service while it reloads) and completes; the ReplicaSet's new pod counts once it
    can serve, and one still starting then follows the stable revision on its own.

    Requests: the kubelet kills the evicted pod at once (grace period 0), so requests in flight to it,
    or sent to it before the Service drops its address, can fail; none may fail outside that window
    (from the write to a few seconds after its address left the endpoints)."""
    if kubectl is None:
        pytest.skip("no kubectl")
    body = service("evict", namespace, bucket, store, 1)
    body["spec"]["modelVolume"] = {"sizeLimit": "32Mi"}
    body["spec"]["rollout"]["steps"] = [{"setWeight": 50}, {"pause": {}}]
    apply(kube, body)
    host_revision = serving(kube, namespace, "evict")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "evict")
    answering(host, 0)

    store.extra["s3"].put_object(
        Bucket=bucket, Key=KEY.format(model="add_sub", version=2), Body=adder_source(100)
    )
    client = LoadClient(host, max_seconds=500).start()
    window: list[float] = []
    timeline = PodTimeline(kube, namespace, "evict", client).start()
    try:
        body = service("evict", namespace, bucket, store, 2)
        body["spec"]["modelVolume"] = {"sizeLimit": "32Mi"}
        body["spec"]["rollout"]["steps"] = [{"setWeight": 50}, {"pause": {}}]
        apply(kube, body)

        def paused() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "evict")
            return obj if condition(obj, "Progressing").get("reason") == "StepPaused" else None

        obj = wait_for(paused, timeout=180, interval=1, what="the first pod to serve the new revision")
        new = obj["status"]["inPlace"]["next"]
        (asked,) = obj["status"]["inPlace"]["pods"]
        victim = next(p for p in pods(kube, namespace, "evict") if p.metadata.name != asked)
        victim_name, victim_ip = victim.metadata.name, victim.status.podIP

        window.append(time.monotonic() - client._t0)
        fill = "f = open('/models/.fill', 'wb')\nfor _ in range(64): f.write(bytes(1 << 20))\nf.close()"
        proc = subprocess.run(
            [kubectl, f"--kubeconfig={cluster}", "-n", namespace, "exec", victim_name, "-c", "model-agent",
             "--", "python", "-c", fill],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert proc.returncode in (0, 137, 143) or "terminated" in proc.stderr, proc.stderr

        def evicted() -> Any:
            pod = kube.get(Pod, victim_name, namespace=namespace)
            return pod if pod.status is not None and pod.status.phase == "Failed" else None

        gone = wait_for(evicted, timeout=240, interval=1, what=f"the kubelet to evict {victim_name}")
        assert gone.status.reason == "Evicted" and gone.metadata.deletionTimestamp is None, gone.status
        wait_for(
            lambda: victim_ip not in serving_ips(kube, namespace, "evict"),
            timeout=60,
            interval=0.5,
            what="the evicted pod's address to leave the Service",
        )
        window.append(time.monotonic() - client._t0 + 5)
        # Connections the client opened to the killed pod's address stay in the node's conntrack table
        # (kube-proxy clears UDP entries only): a later connection from the same source port is sent
        # there, and fails "No route to host", until the entry times out.
        stale = conntrack_to(victim_ip)
        stale_until = window[1] + max((left for _, left in stale), default=0)

        kubectl_triton(cluster, "promote", "evict", "-n", namespace)

        def moved() -> dict[str, Any] | None:
            got = get_ts(kube, namespace, "evict")
            status = got["status"]
            done = status.get("servedRevision") == new and not (status.get("inPlace") or {}).get("next")
            return got if done else None

        obj = wait_for(moved, timeout=300, interval=1, what="the rollout to complete without the evicted pod")

        def converged() -> list[Any] | None:
            # The ReplicaSet's new pod counts once it can serve; one still starting when the rollout
            # completed follows the stable revision of the in-place ConfigMap on its own.
            live = [p for p in pods(kube, namespace, "evict") if p.status and p.status.phase == "Running"]
            ready = [
                p for p in live if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions)
            ]
            try:
                on = [p for p in ready if agent(p.status.podIP)["revision"] == new]
            except OSError:
                return None
            return on if len(on) == 2 else None

        wait_for(converged, timeout=180, interval=1, what="both live pods Ready on the new revision")
        answering(host, 100, timeout=60)
        time.sleep(2)
    finally:
        client.stop()
        timeline.stop()
    print("\npods (seconds on the client's clock: name, phase, Ready, IP, endpoints):")
    print("\n".join(timeline.lines))
    inside = [f for f in client.failures if len(window) == 2 and window[0] <= f[0] <= window[1]]
    # after the window: only a connection sent to the killed pod's address by a stale conntrack entry
    late = [
        f
        for f in client.failures
        if len(window) == 2 and window[1] < f[0] <= stale_until and UNREACHABLE in f[1]
    ]
    print(
        f"\nin-place rollout with a pod evicted mid-way: {client.summary()}; eviction window "
        f"{window[0]:.1f}-{window[1]:.1f} s: {len(inside)} failed in it"
        + (f" ({inside[0][0]:.2f}-{inside[-1][0]:.2f} s)" if inside else "")
        + f"; kinds: {dict(Counter(f[1].split(':')[1].strip() for f in inside))}"
        + f"; conntrack entries to the killed pod's address after it: {stale}"
        + f"; {len(late)} failed later, sent there by them: {late}"
    )
    assert client.sent > 50, client.summary()
    outside = [f for f in client.failures if f not in inside and f not in late]
    assert not outside, outside[:5]
    assert client.answers[0.0] > 0 and client.answers[100.0] > 0, client.summary()
    status = obj["status"]
    assert status["stableRevision"] == host_revision and status["rolloutKind"] == "InPlace"
    live = [p for p in pods(kube, namespace, "evict") if p.status.phase != "Failed"]
    assert len(live) == 2 and victim_name not in {p.metadata.name for p in live}
    for pod in live:
        assert agent(pod.status.podIP)["revision"] == new
        assert offset_of(infer_add_sub(pod.status.podIP)) == 100
    left = kube.get(Pod, victim_name, namespace=namespace)  # still there, never counted
    assert left.status is not None and left.status.phase == "Failed" and left.status.reason == "Evicted"
    said = events(kube, namespace, "evict")
    done = [m for _, r, m in said if r == "RolloutCompleted" and "in place" in m]
    # the pods that could serve then: the one left, and the ReplicaSet's new pod if it was up by then
    # (one still starting follows the stable revision of the in-place ConfigMap on its own)
    counted = re.search(r"by all (\d+) pods", done[-1]) if done else None
    assert counted is not None and counted.group(1) in ("1", "2"), said


KILL_STUB = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if argv[0].endswith(b"triton_python_backend_stub") and argv[1].startswith(b"/models/add_sub/"):
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""
"""Run in the tritonserver container: SIGKILL to add_sub's Python backend stub."""


def ready_endpoints(kube: Client, namespace: str, name: str) -> set[str]:
    """The addresses the Service's EndpointSlices hold as ready."""
    out: set[str] = set()
    for piece in kube.list(EndpointSlice, namespace=namespace, labels={"kubernetes.io/service-name": name}):
        for endpoint in piece.endpoints or []:
            if endpoint.conditions is None or endpoint.conditions.ready is not False:
                out.update(endpoint.addresses)
    return out


def http_status(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read() or b"null")


def test_a_model_whose_backend_stub_dies_takes_its_pod_out_of_the_service_endpoints(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, kubectl: str | None, cluster: Path
) -> None:
    """tritonserver 2.51 keeps reporting a Python model READY once its stub process died, and every
    request to it fails; the agent's readiness takes the pod out of the Service's endpoints."""
    if kubectl is None:
        pytest.skip("no kubectl binary")
    apply(kube, service("dies", namespace, bucket, store, 1))
    serving(kube, namespace, "dies")
    host = cluster_ip(kube, namespace, "dies")
    answering(host, 0)
    victim, survivor = sorted(pods(kube, namespace, "dies"), key=lambda p: p.metadata.name)
    both = {victim.status.podIP, survivor.status.podIP}
    wait_for(
        lambda: ready_endpoints(kube, namespace, "dies") == both, timeout=60, what="both pods as endpoints"
    )
    code, ready = http_status(f"http://{victim.status.podIP}:8009/v1/ready")
    assert code == 200 and ready["models"] == {"add_sub": "READY", "other": "READY"}, ready

    client = LoadClient(host, max_seconds=200).start()
    try:
        time.sleep(1)
        killed = subprocess.run(
            [kubectl, f"--kubeconfig={cluster}", "-n", namespace, "exec", victim.metadata.name,
             "-c", "tritonserver", "--", "python3", "-c", KILL_STUB],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert killed.returncode == 0 and killed.stdout.strip(), killed
        started = time.monotonic()
        wait_for(
            lambda: ready_endpoints(kube, namespace, "dies") == {survivor.status.podIP},
            timeout=60,
            interval=0.2,
            what=f"pod {victim.metadata.name} out of the Service's endpoints",
        )
        out_after = time.monotonic() - started
        # The EndpointSlice has dropped the pod; kube-proxy rewrites its rules from it a moment later
        # (a request in between still reaches the dead model: one did 2 s after, in a CI run).
        wait_for(
            lambda: not proxied_to(victim.status.podIP),
            timeout=60,
            interval=0.2,
            what=f"kube-proxy's rules without pod {victim.metadata.name}",
        )
        # from here no request may reach the dead model (one sent just before may still be failing:
        # a request to a dead stub can take a second to fail, so failures count by when they were sent)
        since, sent = time.monotonic() - client._t0, client.sent
        time.sleep(8)
        failed_after = [f for f, at in zip(client.failures, client.failures_sent, strict=True) if at >= since]
        sent_after = client.sent - sent
    finally:
        client.stop()
    print(f"\nstub killed: out of the endpoints after {out_after:.1f} s; {client.summary()}")
    print(f"after that (from {since:.2f} s): {sent_after} requests, {len(failed_after)} failed;")
    print(f"failures sent at {client.failures_sent}, failed at {[t for t, _ in client.failures]}")
    assert sent_after > 50 and failed_after == [], failed_after[:3]
    code, ready = http_status(f"http://{victim.status.podIP}:8009/v1/ready")
    assert code == 503 and "add_sub" in ready["reason"] and "stub" in ready["models"]["add_sub"], ready
    # what Triton itself says meanwhile: ready (it cannot be what the pod's readiness rests on)
    assert http_status(f"http://{victim.status.podIP}:8000/v2/models/add_sub/ready")[0] == 200
    assert identity(kube, namespace, "dies")[victim.metadata.name][1] == 0  # not restarted


def cordon(kube: Client, node: str, on: bool) -> None:
    """Mark ``node`` unschedulable (``on``) or schedulable again."""
    kube.patch(Node, node, {"spec": {"unschedulable": on}})


def test_a_restart_a_newer_spec_an_abort_and_a_pod_deleted_mid_rollout_fail_no_request(  # noqa: PLR0917
    kube: Client, namespace: str, operator: Any, store: Any, bucket: str, cluster: Path
) -> None:
    """(g) One service, one counting client, the faults of an in-place rollout paused at its first
    step (one pod of two asked) one after another: the operator killed and started again (the step
    holds: same next revision, same pod, same start); a newer spec (version 3) applied mid-rollout
    (it replaces version 2 and pauses at its first step); `kubectl triton abort` (every pod back on
    the stable revision, in place); a fourth version, then its updated pod deleted mid-step with the
    node cordoned (the rollout goes back on the pod left; the ReplicaSet's new pod, Pending, does not
    count, and once the node is uncordoned it starts on the stable revision). No request fails."""
    steps = [{"setWeight": 50}, {"pause": {}}]

    def body(version: int) -> dict[str, Any]:
        out = service("faults", namespace, bucket, store, version)
        out["spec"]["rollout"]["steps"] = steps
        return out

    apply(kube, body(1))
    host_revision = serving(kube, namespace, "faults")["status"]["stableRevision"]
    host = cluster_ip(kube, namespace, "faults")
    answering(host, 0)
    s3 = store.extra["s3"]
    for version, offset in ((2, 100), (3, 200), (4, 300)):
        s3.put_object(
            Bucket=bucket, Key=KEY.format(model="add_sub", version=version), Body=adder_source(offset)
        )

    def paused(after: str | None = None) -> Any:
        def probe() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "faults")
            in_place = obj["status"].get("inPlace") or {}
            step = condition(obj, "Progressing").get("reason") == "StepPaused"
            moved = in_place.get("next") and in_place.get("next") != after and in_place.get("pods")
            return obj if step and moved and not in_place.get("rollingBack") else None

        return probe

    def back(aborted: str) -> Any:
        def probe() -> dict[str, Any] | None:
            obj = get_ts(kube, namespace, "faults")
            in_place = obj["status"].get("inPlace") or {}
            done = in_place.get("abortedRevision") == aborted and not in_place.get("next")
            return obj if done else None

        return probe

    client = LoadClient(host, max_seconds=600).start()
    timeline = PodTimeline(kube, namespace, "faults", client).start()
    cordoned: list[str] = []
    try:
        apply(kube, body(2))
        at_pause = wait_for(paused(), timeout=180, interval=1, what="version 2 paused at its first step")
        second = at_pause["status"]["inPlace"]

        # the operator killed at the pause and started again: the same step, the same pod
        assert operator.process is not None
        operator.process.kill()
        operator.process.wait(timeout=10)
        operator.start()
        time.sleep(8)
        held = get_ts(kube, namespace, "faults")
        kept = held["status"]["inPlace"]
        for key in ("next", "pods", "stepIndex", "stepStartedAt"):
            assert kept.get(key) == second.get(key), (key, kept, second)
        assert condition(held, "Progressing").get("reason") == "StepPaused"

        # a newer spec mid-rollout: version 3 replaces version 2, and pauses at its first step
        apply(kube, body(3))
        third = wait_for(paused(second["next"]), timeout=240, interval=1, what="version 3 paused")
        third_revision = third["status"]["inPlace"]["next"]
        (asked,) = third["status"]["inPlace"]["pods"]
        ip = next(p.status.podIP for p in pods(kube, namespace, "faults") if p.metadata.name == asked)
        assert offset_of(infer_add_sub(ip)) == 200

        # an abort: every pod back on the stable revision, in place
        kubectl_triton(cluster, "abort", "faults", "-n", namespace)
        wait_for(back(third_revision), timeout=240, interval=1, what="the abort to load version 1 back")
        answering(host, 0, timeout=60)

        # a fourth version, then its updated pod deleted mid-step: the rollout goes back
        apply(kube, body(4))
        fourth = wait_for(paused(third_revision), timeout=240, interval=1, what="version 4 paused")
        fourth_revision = fourth["status"]["inPlace"]["next"]
        (deleted,) = fourth["status"]["inPlace"]["pods"]
        # the node cordoned first: the ReplicaSet's new pod stays Pending while the rollout goes back
        spec = kube.get(Pod, deleted, namespace=namespace).spec
        node = str(spec.nodeName if spec is not None else "")
        cordon(kube, node, True)
        cordoned.append(node)
        kube.delete(Pod, deleted, namespace=namespace)
        obj = wait_for(back(fourth_revision), timeout=300, interval=1, what="version 4 rolled back")
        pending = [p for p in pods(kube, namespace, "faults") if p.status.phase == "Pending"]
        assert len(pending) == 1 and pending[0].metadata.name != deleted, [p.metadata.name for p in pending]
        answering(host, 0, timeout=60)  # the pod left serves version 1, the Pending one not counted
        cordon(kube, node, False)
        cordoned.clear()

        def converged() -> list[Any] | None:
            live = [p for p in pods(kube, namespace, "faults") if p.metadata.deletionTimestamp is None]
            ready = [
                p
                for p in live
                if p.status
                and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            ]
            try:
                on = [p for p in ready if agent(p.status.podIP)["revision"] == host_revision]
            except OSError:
                return None
            return on if len(on) == 2 == len(live) else None

        again = wait_for(converged, timeout=240, interval=1, what="both pods Ready on version 1 again")
        answering(host, 0, timeout=60)
        time.sleep(2)
    finally:
        for node in cordoned:  # the node is shared by every test: never left cordoned
            cordon(kube, node, False)
        client.stop()
        timeline.stop()
    print("\npods (seconds on the client's clock: name, phase, Ready, IP, endpoints):")
    print("\n".join(timeline.lines))
    no_request_failed(client, "in-place rollout through a restart, a newer spec, an abort and a deleted pod")
    assert client.answers[0.0] > 0 and client.answers[100.0] > 0 and client.answers[200.0] > 0, (
        client.summary()
    )
    assert set(client.answers) <= {0.0, 100.0, 200.0, 300.0}, client.summary()
    assert deleted not in {p.metadata.name for p in again}
    assert obj["status"]["stableRevision"] == host_revision
    assert obj["status"]["inPlace"]["abortedReason"] == "InPlacePodLost", obj["status"]["inPlace"]
    for pod in again:
        assert offset_of(infer_add_sub(pod.status.podIP)) == 0
    reasons_said = [r for _, r, _ in events(kube, namespace, "faults")]
    assert reasons_said.count("RolloutAborted") >= 2, reasons_said

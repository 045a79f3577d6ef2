"""kube-controller-manager's HPA controller scaling a pool of real tritonserver pods (spec.pool with
spec.autoscaling) through /scale, with clients counting every answer.

test_pool_e2e's six models (100Mi declared, two least copies each; m0 here answers in 50 ms a request,
at most three copies), in pods of 600Mi: two pods hold every copy. The owned HPA (2 to 3 replicas, on
the queue-time Pods metric, no stabilization windows) reads values this test writes to the real custom
metrics API server (test_autoscaling_e2e's LoadWriter): a load that needs 3 pods makes spec.replicas 3,
and a third pool pod comes up. Placement is stable: the HPA's pod gets the copies the pool's models ask
for next, here m0's third copy once eight clients keep m0 busy (its queue time in Triton over
busyQueueMicroseconds). A low load brings the HPA to 2; once m0 is idle the pool needs 2 pods again and
the ReplicaSet removes the pod of lowest pod-deletion-cost, the one given the fewest copies (the
third): the copies it held are placed on the pods that stay, while their other copies serve, and it
exits.
Throughout, test_pool_e2e's clients send requests to every model (each model's Service, and the pooled
TritonClient over gRPC): none fails.

Needs the real node of e2e/cluster.py, its custom metrics API server and the images built from this tree
(e2e/images.py); without them every test here skips, saying why.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod
from test_autoscaling_e2e import LoadWriter  # type: ignore[import-not-found,unused-ignore]
from test_pool_copies_e2e import Clients  # type: ignore[import-not-found,unused-ignore]
from test_pool_e2e import (  # type: ignore[import-not-found,unused-ignore]
    HOLD_MIB,
    KEY,
    MODEL_LABEL,
    NAME,
    OFFSETS,
    PoolLoad,
    held,
    loaded,
    no_request_failed,
    placed,
    pool_pods,
    pooled,
    wait_settled,
)

import e2e_helpers
from e2e_helpers import apply, create_store_secret, get_ts
from inference import infer_add_sub, offset_of
from real_pods import behaving_source, stamped_holding_source
from testkit import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(600),
    pytest.mark.operator_env(TRITON_OPERATOR_PIN_REPOSITORIES="true"),
]

AUTOSCALING: dict[str, Any] = {
    "minReplicas": 2,
    "maxReplicas": 3,
    "metrics": [{"queueTime": {"averageMicroseconds": 4000}}],
    "behavior": {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
    },
}
LOW, HIGH = 2000, 12000
"""Queue-time microseconds summed over the pods against 4000 a pod: ceil(2000 / 4000) = 1, held at
minReplicas 2; ceil(12000 / 4000) = 3."""


@pytest.fixture
def bucket(store: Any, kube: Client, namespace: str) -> str:
    """A fresh bucket: test_pool_e2e's six models, m0 slow (50 ms a request), each adding its offset."""
    import storage_servers  # noqa: PLC0415

    name = f"poolhpa-{uuid.uuid4().hex[:8]}"
    s3 = store.extra["s3"]
    s3.create_bucket(Bucket=name)
    for model, offset in OFFSETS.items():
        source = (
            behaving_source(offset, delay=0.05) if model == "m0" else stamped_holding_source(offset, HOLD_MIB)
        )
        s3.put_object(Bucket=name, Key=KEY.format(model=model), Body=source)
    create_store_secret(kube, namespace, storage_servers.S3_ACCESS_KEY, storage_servers.S3_SECRET_KEY)
    return name


def autoscaled(namespace: str, bucket: str, store: Any) -> dict[str, Any]:
    """test_pool_e2e's pool in pods of 600Mi (two hold every least copy), m0 at most 3 copies, copies
    following Triton's queue time, spec.replicas owned by the HPA of spec.autoscaling."""
    body = pooled(namespace, bucket, store, copies=2, drain=30)
    spec = body["spec"]
    spec.pop("replicas")  # the HPA owns it (README: GitOps)
    spec["autoscaling"] = AUTOSCALING
    spec["pool"] = {
        "memoryPerPod": "600Mi",
        "scaling": {
            "busyQueueMicroseconds": 20_000,
            # Not busy is idle here: m0's extra copy goes 5 s after its busy clients stop.
            "idleInferencesPerSecond": "1000",
            "scaleUpStabilizationSeconds": 10,
            "scaleDownStabilizationSeconds": 5,
            "windowSeconds": 10,
        },
    }
    spec["models"][0]["maxCopies"] = 3
    return dict(body)


def replicas(kube: Client, namespace: str) -> int | None:
    value = get_ts(kube, namespace, NAME)["spec"].get("replicas")
    return int(value) if value is not None else None


def live_pods(kube: Client, namespace: str) -> dict[str, str]:
    """The pool's pods that are not leaving and run tritonserver Ready: name -> IP."""
    out = {}
    for pod in pool_pods(kube, namespace):
        conditions = pod.status.conditions or [] if pod.status is not None else []
        if pod.status.podIP and any(c.type == "Ready" and c.status == "True" for c in conditions):
            out[str(pod.metadata.name)] = str(pod.status.podIP)
    return out


def every_pod(kube: Client, namespace: str) -> list[str]:
    """The pool's pods, a leaving one included (it serves until it exits)."""
    listed = kube.list(Pod, namespace=namespace, labels={"triton-operator.io/service": NAME})
    return [str(p.metadata.name) for p in listed if p.metadata is not None]


def pods_at(kube: Client, namespace: str, count: int) -> dict[str, str] | None:
    """live_pods once they are ``count``."""
    pods = live_pods(kube, namespace)
    return pods if len(pods) == count else None


@pytest.fixture
def load(kube: Client, namespace: str, operator: Any, store: Any, bucket: str) -> Iterator[PoolLoad]:
    """The pool applied and settled on 2 pods, both of test_pool_e2e's clients sending to every model."""
    apply(kube, autoscaled(namespace, bucket, store))
    yield from loaded(kube, namespace, store, bucket, copies=2, timeout=300)


def test_the_hpa_scales_a_pool_up_and_down_with_no_failed_request(
    kube: Client, namespace: str, operator: Any, metrics: e2e_helpers.CustomMetrics, load: PoolLoad
) -> None:
    started = time.monotonic()
    with LoadWriter(kube, metrics, namespace, NAME) as writer:
        writer.load = LOW
        first = wait_for(
            lambda: pods_at(kube, namespace, 2) if replicas(kube, namespace) == 2 else None,
            timeout=120,
            what="the HPA at minReplicas 2, two pool pods",
        )
        time.sleep(3)
        sent = no_request_failed(load, "two pods under the HPA", 0, kube, namespace)

        # A load that needs 3 pods: the HPA writes spec.replicas 3 through /scale, a third pod comes up.
        writer.load = HIGH
        wait_for(lambda: replicas(kube, namespace) == 3, timeout=120, what="the HPA asking for 3 replicas")
        pods = wait_for(
            lambda: pods_at(kube, namespace, 3),
            timeout=240,
            what="a third pool pod Ready",
        )
        (third,) = set(pods) - set(first)
        print(
            f"\nthe HPA's third pod {third} Ready {time.monotonic() - started:.0f}s in: {held(pods[third])}"
        )
        assert set(first) < set(pods)

        # m0 kept busy: its third copy goes on the only pod with room and without it, the HPA's.
        clients = Clients({m: ip for m, ip in load.services.items() if m in ("m0", "m1", "m2")})
        clients.start()
        try:

            def on_third() -> dict[str, set[str]] | None:
                where = placed(kube, namespace)
                pod = next((p for p in pool_pods(kube, namespace) if p.metadata.name == third), None)
                labels = (pod.metadata.labels or {}) if pod is not None else {}
                if len(where.get("m0", ())) == 3 and labels.get(MODEL_LABEL.format(model="m0")) == "ready":
                    return dict(where)
                return None

            where = wait_for(on_third, timeout=180, interval=1, what="m0's third copy READY on the third pod")
            print(f"m0's third copy on {third} {time.monotonic() - started:.0f}s in: {sorted(where['m0'])}")
            assert third in where["m0"]
            assert held(pods[third]).get("m0") == "READY"
            assert offset_of(infer_add_sub(pods[third], model="m0")) == OFFSETS["m0"]
            assert replicas(kube, namespace) == 3 and len(live_pods(kube, namespace)) == 3
            before = {name: {m for m, names in where.items() if name in names} for name in pods}

            # The load drops: the HPA goes back to 2, m0 back to 2 copies, and one pod goes.
            writer.load = LOW
            clients.calm()
            wait_for(lambda: replicas(kube, namespace) == 2, timeout=120, what="the HPA back to 2 replicas")
            after = wait_settled(kube, namespace, timeout=240, copies=2)
            wait_for(lambda: len(every_pod(kube, namespace)) == 2, timeout=120, what="the leaving pod gone")
        finally:
            clients.stop()
        now = live_pods(kube, namespace)
        (gone,) = set(pods) - set(now)
        print(f"{gone} went {time.monotonic() - started:.0f}s in, holding {sorted(before[gone])}: {after}")
        assert len(now) == 2 and replicas(kube, namespace) == 2
        assert before[gone], f"{gone} held no copy"
        # the pod given the fewest copies goes (its pod-deletion-cost): the third, holding m0 alone
        assert gone == third, (gone, before)
        assert gone not in set().union(*after.values())
        assert all(len(names) == 2 and names <= set(now) for names in after.values()), after
        time.sleep(3)
        no_request_failed(load, "3 pods under the HPA, then 2", sent, kube, namespace)
    print(clients.summary())
    assert not clients.failures, clients.failures[:5]
    assert not [e for e in writer.errors if "NotFound" not in e], writer.errors[:5]

"""The local cluster's custom/external metrics API (e2e/cluster.py's custom-metrics-adapter) and a real
HorizontalPodAutoscaler of kube-controller-manager scaling a Deployment of kwok pods on it.

Values are written to the adapter (sigs.k8s.io/custom-metrics-apiserver's test provider) and read back
through kube-apiserver's aggregation layer, as the HPA controller reads them.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import Client
from lightkube.resources.apiregistration_v1 import APIService
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
from lightkube.resources.core_v1 import Pod, Service

import cluster as local_cluster  # e2e/cluster.py (e2e/ is on pytest's pythonpath)
from e2e_helpers import CustomMetrics, as_dict, condition
from testkit import wait_for

pytestmark = pytest.mark.cluster

METRIC = "requests_per_second"
LABELS = {"app": "metrics-e2e"}
SELECTOR = "app=metrics-e2e"
KWOK = {"type": "kwok"}  # the fake nodes' label (e2e/cluster.py _node_manifest)


def pod_spec() -> dict[str, Any]:
    return {
        "nodeSelector": KWOK,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.invalid/metrics-e2e:fake"}],
    }


def pod(name: str, labels: dict[str, str]) -> Pod:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": pod_spec(),
    }
    return cast(Pod, Pod.from_dict(body))


def deployment(name: str) -> Deployment:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": LABELS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS}, "spec": pod_spec()},
        },
    }
    return cast(Deployment, Deployment.from_dict(body))


def hpa(name: str, target: str) -> HorizontalPodAutoscaler:
    """Scale ``name`` between 1 and 4 replicas on the pods' average METRIC, with no stabilization
    window and periods of a second, so that each HPA sync (5 s, e2e/cluster.py) acts at once."""
    metric = {"name": METRIC}
    body = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {"metric": metric, "target": {"type": "AverageValue", "averageValue": target}},
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 1}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
                },
            },
        },
    }
    return cast(HorizontalPodAutoscaler, HorizontalPodAutoscaler.from_dict(body))


def test_metrics_apiservices_are_available(kube: Client, cluster: Path, metrics: CustomMetrics) -> None:
    ca = base64.b64encode((local_cluster.state_dir() / "pki" / "ca.crt").read_bytes()).decode()
    for group, version in local_cluster.METRICS_APISERVICES:
        api = as_dict(kube.get(APIService, f"{version}.{group}"))
        assert condition(api, "Available").get("status") == "True", api.get("status")
        spec = api["spec"]
        assert spec["service"] == {
            "namespace": local_cluster.METRICS_NAMESPACE,
            "name": local_cluster.METRICS_SERVICE,
            "port": spec["service"]["port"],
        }
        assert not spec.get("insecureSkipTLSVerify")
        if (local_cluster.state_dir() / "kubeconfig").resolve() == cluster.resolve():
            assert spec["caBundle"] == ca
    svc = kube.get(Service, local_cluster.METRICS_SERVICE, namespace=local_cluster.METRICS_NAMESPACE)
    assert svc.spec is not None
    assert (svc.spec.type, svc.spec.externalName) == ("ExternalName", "localhost")
    # discovery through the aggregator answers from the adapter
    for group, version in local_cluster.METRICS_APISERVICES:
        discovery = metrics.get_raw(f"/apis/{group}/{version}")
        assert discovery["groupVersion"] == f"{group}/{version}"
        assert discovery["resources"], discovery


def test_written_pod_metric_reads_back_through_the_apiserver(
    kube: Client, namespace: str, metrics: CustomMetrics
) -> None:
    kube.create(pod("a", LABELS), namespace=namespace)
    kube.create(pod("b", LABELS), namespace=namespace)
    kube.create(pod("other", {"app": "other"}), namespace=namespace)
    metrics.write(namespace, "pods", "a", METRIC, "300m")
    metrics.write(namespace, "pods", "b", METRIC, 2)
    metrics.write(namespace, "pods", "other", METRIC, 7)

    assert metrics.read(namespace, "pods", METRIC, selector=SELECTOR) == {"a": "300m", "b": "2"}
    assert metrics.read(namespace, "pods", METRIC, selector=SELECTOR, version="v1beta1") == {
        "a": "300m",
        "b": "2",
    }
    assert metrics.read(namespace, "pods", METRIC, name="other") == {"other": "7"}
    # a later value replaces the earlier one
    metrics.write(namespace, "pods", "a", METRIC, 5)
    assert metrics.read(namespace, "pods", METRIC, selector=SELECTOR) == {"a": "5", "b": "2"}
    # a metric nobody wrote has no value
    assert metrics.read(namespace, "pods", "never_written", selector=SELECTOR) == {}
    # the external metrics API answers through the aggregator too (the test provider's fixed values)
    external = metrics.get_raw(
        f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/my-external-metric?labelSelector=foo%3Dbar"
    )
    assert [(i["metricName"], i["value"]) for i in external["items"]] == [("my-external-metric", "42")]


def test_write_rejects_a_bad_path_segment(metrics: CustomMetrics) -> None:
    with pytest.raises(ValueError, match="metric name must be a non-empty path segment"):
        metrics.write("default", "pods", "a/b", METRIC, 1)


def replicas(kube: Client, namespace: str, name: str) -> int:
    scale = kube.get(Deployment.Scale, name, namespace=namespace)
    assert scale.spec is not None
    return int(scale.spec.replicas or 0)


def hpa_current_average(kube: Client, namespace: str, name: str) -> str | None:
    """The pods' average of METRIC the HPA controller last read through the metrics API."""
    status = as_dict(kube.get(HorizontalPodAutoscaler, name, namespace=namespace)).get("status", {})
    for m in status.get("currentMetrics") or []:
        if m.get("type") == "Pods":
            return str(m["pods"]["current"]["averageValue"])
    return None


def scale_while_writing(
    kube: Client, metrics: CustomMetrics, namespace: str, name: str, *, value: int, want: int, timeout: float
) -> float:
    """Keep writing ``value`` for each pod of the Deployment until it has ``want`` replicas; seconds taken."""
    t0 = time.monotonic()

    def reached() -> bool:
        metrics.write_all(kube, namespace, LABELS, METRIC, value)
        return replicas(kube, namespace, name) == want

    wait_for(
        reached, timeout=timeout, interval=0.5, what=f"{name} scaled to {want} replicas (metric {value})"
    )
    return time.monotonic() - t0


def test_hpa_scales_a_deployment_on_a_pod_metric(
    kube: Client, namespace: str, metrics: CustomMetrics
) -> None:
    name = "web"
    kube.create(deployment(name), namespace=namespace)
    wait_for(
        lambda: metrics.write_all(kube, namespace, LABELS, METRIC, 5),
        timeout=30,
        what="the Deployment's first pod",
    )
    kube.create(hpa(name, "10"), namespace=namespace)

    # Below the target (5 per pod < 10): the HPA reads the value and keeps one replica.
    def read_low() -> bool:
        metrics.write_all(kube, namespace, LABELS, METRIC, 5)
        return hpa_current_average(kube, namespace, name) == "5"

    wait_for(read_low, timeout=60, interval=0.5, what="the HPA to read the pods' metric (5)")
    time.sleep(11)  # two more HPA syncs
    assert replicas(kube, namespace, name) == 1
    assert hpa_current_average(kube, namespace, name) == "5"

    # Above the target (30 per pod): 1 -> ceil(1 * 30/10) = 3 -> 4 (maxReplicas).
    up = scale_while_writing(kube, metrics, namespace, name, value=30, want=4, timeout=60)

    def limited() -> bool:  # the HPA writes its status just after the scale
        metrics.write_all(kube, namespace, LABELS, METRIC, 30)
        scaled = as_dict(kube.get(HorizontalPodAutoscaler, name, namespace=namespace))
        reason = condition(scaled, "ScalingLimited").get("reason")
        return scaled["status"].get("desiredReplicas") == 4 and reason == "TooManyReplicas"

    wait_for(limited, timeout=20, interval=0.5, what="the HPA's status: 4 replicas desired, TooManyReplicas")

    # Back below (1 per pod): ceil(4 * 1/10) = 1.
    down = scale_while_writing(kube, metrics, namespace, name, value=1, want=1, timeout=60)

    def read_one() -> bool:
        metrics.write_all(kube, namespace, LABELS, METRIC, 1)
        return hpa_current_average(kube, namespace, name) == "1"

    wait_for(read_one, timeout=20, interval=0.5, what="the HPA's status: the pods' metric read as 1")
    print(f"scaled up in {up:.1f}s, down in {down:.1f}s")

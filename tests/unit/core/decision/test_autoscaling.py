"""Autoscaling, pure: spec.autoscaling validated and rendered as an owned HPA, the /scale subresource's
status, and a user's or KEDA's HPA told apart from the operator's. Whole passes over MemKube are in
test_reconcile_pass.py; tests/e2e/test_autoscaling_e2e.py runs the real HPA controller."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from e2e_helpers import tritonservice
from triton_operator import KIND
from triton_operator.core.decision import scaling as auto
from triton_operator.core.observed.observation import DeploymentState
from triton_operator.core.spec.validation.spec import check_spec
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import Autoscaling, Strategy, TritonService

NS = "ml"

QUEUE = {"queueTime": {"averageMicroseconds": 5000}}
RATE = {"inferencesPerSecond": {"averagePerPod": "40"}}
CPU = {"cpu": {"averageUtilization": 70}}


def spec(**fields: Any) -> dict[str, Any]:
    return dict(tritonservice("svc", NS, **fields)["spec"])


def errors(**fields: Any) -> list[str]:
    _, found = check_spec(spec(**fields))
    return [str(e) for e in found]


def ts(**fields: Any) -> TritonService:
    return TritonService.model_validate(
        {"metadata": {"name": "svc", "namespace": NS, "uid": "u-1"}, "spec": spec(**fields)}
    )


def test_the_worked_examples_in_the_docstrings_hold() -> None:
    result = doctest.testmod(auto)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("autoscaling", "extra", "expected"),
    [
        ({"maxReplicas": 4}, {}, "spec.autoscaling.metrics: is required"),
        ({"maxReplicas": 4, "metrics": []}, {}, "spec.autoscaling.metrics: List should have at least 1 item"),
        (
            {"maxReplicas": 4, "metrics": [{**QUEUE, **CPU}]},
            {},
            "spec.autoscaling.metrics[0]: a metric sets exactly one of queueTime, inferencesPerSecond, cpu,"
            " memory, pods",
        ),
        (
            {"maxReplicas": 4, "metrics": [{}]},
            {},
            "spec.autoscaling.metrics[0]: a metric sets exactly one of",
        ),
        (
            {"maxReplicas": 4, "metrics": [{"cpu": {"averageUtilization": 70, "averageValue": "2"}}]},
            {},
            "spec.autoscaling.metrics[0].cpu: set exactly one of averageUtilization, averageValue",
        ),
        (
            {"maxReplicas": 4, "metrics": [{"queueTime": {"averageMicroseconds": 0}}]},
            {},
            "spec.autoscaling.metrics[0].queueTime.averageMicroseconds: Input should be greater than or equal"
            " to 1",
        ),
        (
            {"maxReplicas": 4, "metrics": [{"inferencesPerSecond": {"averagePerPod": "lots"}}]},
            {},
            "spec.autoscaling.metrics[0].inferencesPerSecond.averagePerPod: String should match pattern",
        ),
        (
            {"maxReplicas": 4, "metrics": [QUEUE], "minReplicas": 0},
            {},
            "spec.autoscaling.minReplicas: Input should be greater than or equal to 1",
        ),
        (
            {"maxReplicas": 2, "minReplicas": 3, "metrics": [QUEUE]},
            {},
            "spec.autoscaling.minReplicas: 3 is more than maxReplicas (2)",
        ),
        (
            {"maxReplicas": 5, "metrics": [QUEUE]},
            {"resources": {"gpus": 2}, "rollout": {"gpuBudget": 8}},
            "spec.autoscaling.maxReplicas: 5 pods of 2 GPU(s) need 10 GPUs, more than spec.rollout.gpuBudget"
            " (8): the stable revision alone could outgrow the budget; lower it to at most 4",
        ),
        (
            {"maxReplicas": 4, "metrics": [CPU]},
            {"resources": {"memory": "1Gi"}},
            "spec.autoscaling.metrics[0].cpu.averageUtilization: a utilization is a share of the tritonserver"
            " container's cpu request, and spec.resources.cpu sets none",
        ),
        (
            {"maxReplicas": 4, "metrics": [{"memory": {"averageUtilization": 80}}]},
            {"resources": {"cpu": "1"}},
            "spec.autoscaling.metrics[0].memory.averageUtilization: a utilization is a share of the"
            " tritonserver container's memory request",
        ),
        (
            {"maxReplicas": 4, "metrics": [QUEUE], "behavior": {"scaleUp": {"policies": [{"type": "Pod"}]}}},
            {},
            "spec.autoscaling.behavior.scaleUp.policies[0].type: Input should be 'Pods' or 'Percent'",
        ),
        (
            {"maxReplicas": 4, "metrics": [{"pods": {"metricName": "bad name", "averageValue": "1"}}]},
            {},
            "spec.autoscaling.metrics[0].pods.metricName: String should match pattern",
        ),
    ],
)
def test_a_bad_autoscaling_spec_names_the_field_and_what_is_wrong(
    autoscaling: dict[str, Any], extra: dict[str, Any], expected: str
) -> None:
    found = errors(autoscaling=autoscaling, **extra)
    assert any(e.startswith(expected) for e in found), found


@pytest.mark.parametrize(
    ("autoscaling", "extra"),
    [
        ({"maxReplicas": 4, "metrics": [QUEUE, RATE, CPU]}, {}),
        ({"maxReplicas": 4, "metrics": [{"cpu": {"averageValue": "2"}}]}, {"resources": {}}),
        ({"maxReplicas": 4, "metrics": [QUEUE]}, {"resources": {"gpus": 1}, "rollout": {"gpuBudget": 5}}),
        ({"minReplicas": 4, "maxReplicas": 4, "metrics": [{"memory": {"averageUtilization": 90}}]}, {}),
    ],
)
def test_a_good_autoscaling_spec_is_accepted(autoscaling: dict[str, Any], extra: dict[str, Any]) -> None:
    assert errors(autoscaling=autoscaling, **extra) == []


# ----------------------------------------------------------------- the owned HPA


def test_the_hpa_targets_the_tritonservice_with_every_kind_of_metric_and_the_behaviour() -> None:
    behavior = {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 15}],
        },
        "scaleDown": {
            "selectPolicy": "Min",
            "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
        },
    }
    metrics = [
        QUEUE,
        {"inferencesPerSecond": {"averagePerPod": "2500m", "metricName": "my_rate"}},
        CPU,
        {"memory": {"averageValue": "12Gi"}},
        {"pods": {"metricName": "gpu_util", "averageValue": "80"}},
    ]
    hpa = auto.build_hpa(
        ts(autoscaling={"minReplicas": 2, "maxReplicas": 8, "metrics": metrics, "behavior": behavior})
    )
    assert (hpa["apiVersion"], hpa["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    assert hpa["metadata"]["name"] == "svc" and hpa["metadata"]["namespace"] == NS
    (owner,) = hpa["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (KIND, "svc", "u-1", True)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": KIND,
        "name": "svc",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["behavior"] == behavior
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "triton_queue_time_per_request_microseconds"},
                "target": {"type": "AverageValue", "averageValue": "5000"},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "my_rate"},
                "target": {"type": "AverageValue", "averageValue": "2500m"},
            },
        },
        {
            "type": "ContainerResource",
            "containerResource": {
                "name": "cpu",
                "container": "tritonserver",
                "target": {"type": "Utilization", "averageUtilization": 70},
            },
        },
        {
            "type": "ContainerResource",
            "containerResource": {
                "name": "memory",
                "container": "tritonserver",
                "target": {"type": "AverageValue", "averageValue": "12Gi"},
            },
        },
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "gpu_util"},
                "target": {"type": "AverageValue", "averageValue": "80"},
            },
        },
    ]


def test_without_behaviour_the_hpa_keeps_the_controllers_defaults() -> None:
    hpa = auto.build_hpa(ts(autoscaling={"maxReplicas": 3, "metrics": [RATE]}))
    assert "behavior" not in hpa["spec"] and hpa["spec"]["minReplicas"] == 1


@pytest.mark.parametrize(
    ("rules", "sent"),
    [
        ({"stabilizationWindowSeconds": 0}, {"stabilizationWindowSeconds": 0}),
        ({"policies": [], "selectPolicy": "Max"}, {"selectPolicy": "Max"}),
        ({}, {}),
    ],
)
def test_a_direction_without_policies_leaves_them_to_the_api_servers_defaults(
    rules: dict[str, Any], sent: dict[str, Any]
) -> None:
    """kube-apiserver refuses `policies: []` ("must specify at least one Policy") but defaults an
    absent list: the HPA never carries an empty one."""
    behavior = {
        "scaleUp": rules,
        "scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]},
    }
    hpa = auto.build_hpa(ts(autoscaling={"maxReplicas": 3, "metrics": [RATE], "behavior": behavior}))
    assert hpa["spec"]["behavior"]["scaleUp"] == sent
    assert hpa["spec"]["behavior"]["scaleDown"] == behavior["scaleDown"]


def test_build_hpa_refuses_a_spec_without_autoscaling() -> None:
    with pytest.raises(ValueError, match=r"spec\.autoscaling is not set"):
        auto.build_hpa(ts())


# ----------------------------------------------------------------- the /scale subresource's status


@pytest.mark.parametrize(
    ("strategy", "replicas", "expected"),
    [
        (Strategy.CANARY, {"a": 4}, ["a"]),  # steady: no canary
        (Strategy.CANARY, {"a": 4, "b": 2}, ["a", "b"]),
        (Strategy.CANARY, {"a": 4, "b": 0}, ["a"]),  # aborted, or a step at weight 0
        (Strategy.BLUE_GREEN, {"a": 4, "b": 4}, ["a"]),  # green takes no traffic before the flip
        (Strategy.RECREATE, {"a": 0, "b": 4}, ["a", "b"]),
    ],
)
def test_the_selector_picks_the_revisions_taking_traffic(
    strategy: Strategy, replicas: dict[str, int], expected: list[str]
) -> None:
    canary = "b" if "b" in replicas else None
    assert auto.scaled_revisions(strategy, "a", canary, replicas) == expected


def test_status_replicas_counts_the_selected_revisions_pods_only() -> None:
    states = [
        DeploymentState(name="svc-a", revision="a", replicas=4, status_replicas=4),
        DeploymentState(name="svc-b", revision="b", replicas=2, status_replicas=1),  # one pod still to come
        DeploymentState(name="svc-c", revision="c", replicas=0, status_replicas=0),
    ]
    assert auto.scale_replicas(["a", "b"], states) == 5
    assert auto.scale_replicas(["a"], states) == 4
    assert auto.scale_replicas([], states) == 0


# ----------------------------------------------------------------- who scales the service


def hpa(name: str, target: str = "svc", *, owner_uid: str | None = None, kind: str = KIND) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": NS}
    if owner_uid is not None:
        metadata["ownerReferences"] = [{"kind": KIND, "name": target, "uid": owner_uid, "controller": True}]
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "triton-operator.io/v1alpha1", "kind": kind, "name": target},
            "maxReplicas": 3,
        },
    }


def test_foreign_autoscalers_are_those_on_the_service_that_are_not_ours() -> None:
    hpas = [
        hpa("svc", owner_uid="u-1"),  # ours
        hpa("keda-hpa-svc"),  # KEDA's, for a ScaledObject
        hpa("mine"),  # a user's
        hpa("other", target="other-svc"),  # another service's
        hpa("deploy", kind="Deployment"),  # a Deployment named svc
        hpa("svc-old", owner_uid="u-0"),  # an earlier TritonService's (another uid)
    ]
    assert auto.foreign_autoscalers(hpas, "svc", "u-1") == ["keda-hpa-svc", "mine", "svc-old"]
    own = auto.own_autoscaler(hpas, "svc", "u-1")
    assert own is not None and own["metadata"]["name"] == "svc"
    assert auto.own_autoscaler(hpas, "svc", "u-9") is None


def scaling(**fields: Any) -> Autoscaling:
    return Autoscaling.model_validate({"maxReplicas": 8, "metrics": [QUEUE], **fields})


def with_status(conditions: list[dict[str, str]], desired: int | None = None) -> dict[str, Any]:
    obj = hpa("svc", owner_uid="u-1")
    obj["status"] = {"conditions": conditions}
    if desired is not None:
        obj["status"]["desiredReplicas"] = desired
    return obj


@pytest.mark.parametrize(
    ("foreign", "own", "expected", "words"),
    [
        (["keda-hpa-svc"], None, (cond.FALSE, cond.FOREIGN_AUTOSCALER), "keda-hpa-svc already targets"),
        ([], None, (cond.UNKNOWN, cond.AUTOSCALER_PENDING), "1 to 8 replicas on"),
        ([], with_status([]), (cond.UNKNOWN, cond.AUTOSCALER_PENDING), "written"),
        (
            [],
            with_status(
                [
                    {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale", "message": "ok"},
                    {
                        "type": "ScalingActive",
                        "status": "False",
                        "reason": "FailedGetPodsMetric",
                        "message": "unable to get metric triton_queue_time_per_request_microseconds",
                    },
                ]
            ),
            (cond.FALSE, cond.AUTOSCALER_NOT_SCALING),
            "ScalingActive is False, FailedGetPodsMetric: unable to get metric triton_queue_time",
        ),
        (
            [],
            with_status(
                [
                    {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": ""},
                    {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": ""},
                ],
                desired=5,
            ),
            (cond.TRUE, cond.AUTOSCALER_ACTIVE),
            "it last asked for 5",
        ),
    ],
)
def test_the_autoscaling_condition(
    foreign: list[str], own: dict[str, Any] | None, expected: tuple[str, str], words: str
) -> None:
    verdict = auto.autoscaling_verdict(scaling(), foreign, own)
    assert (verdict.status, verdict.reason) == expected
    assert words in verdict.message

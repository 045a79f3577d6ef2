"""Autoscaling, pure: the /scale subresource's status, the owned HPA, and who else scales the service.

The scale subresource (CRD ``subresources.scale``) exposes ``spec.replicas``, ``status.replicas`` and
``status.selector``; ``kubectl scale``, an HPA and a KEDA ScaledObject all go through it.

How an HPA sizes a TritonService, and why a canary does not inflate it
(``k8s.io/kubernetes/pkg/controller/podautoscaler/replica_calculator.go``, Pods metrics):

    desired = ceil(usageRatio * podsWithMetrics),  usageRatio = average(metric over pods) / target

``status.selector`` picks the pods that take traffic: the stable revision's and a canary's with
replicas (a BlueGreen green revision takes none before the flip and is left out). For a metric that
adds up over pods (inferences per second; queue time behaves alike to first order), the sum of the
pods' values is the service's load L whatever the number of pods, so

    desired = ceil(L / target)

the pods the whole load needs at the target: the same with or without a canary. The operator uses
it as spec.replicas, the stable revision's size, and sizes the canary from it (ceil(r * w / 100)),
so their ratio holds while the HPA moves r; the stable alone stays sized for all the traffic, as a
rollback needs. Counting the canary's pods into spec.replicas instead (Argo Rollouts' trap) would
grow r by the canary's share each time the HPA looks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from triton_operator import GROUP, KIND, VERSION
from triton_operator.core.objects.builders import build_labels, build_owner_reference
from triton_operator.core.objects.names import LABEL_REVISION, LABEL_SERVICE, TRITON_CONTAINER
from triton_operator.core.observed.observation import DeploymentState
from triton_operator.core.vocabulary.conditions import (
    AUTOSCALER_ACTIVE,
    AUTOSCALER_NOT_SCALING,
    AUTOSCALER_PENDING,
    AUTOSCALER_REMOVED,
    AUTOSCALING,
    FALSE,
    FOREIGN_AUTOSCALER,
    TRUE,
    UNKNOWN,
    Verdict,
    find_condition,
)
from triton_operator.models import (
    Autoscaling,
    AutoscalingMetric,
    ResourceTarget,
    Strategy,
    TritonService,
)

HPA_API_VERSION = "autoscaling/v2"
HPA_KIND = "HorizontalPodAutoscaler"

# ----------------------------------------------------------------- the scale subresource's status


def scaled_revisions(
    strategy: Strategy, stable: str | None, canary: str | None, replicas: Mapping[str, int]
) -> list[str]:
    """The revisions whose pods take traffic, which ``status.selector`` selects.

    >>> scaled_revisions(Strategy.CANARY, "a", "b", {"a": 4, "b": 1})
    ['a', 'b']
    >>> scaled_revisions(Strategy.CANARY, "a", "b", {"a": 4, "b": 0})  # an aborted canary
    ['a']
    >>> scaled_revisions(Strategy.BLUE_GREEN, "a", "b", {"a": 4, "b": 4})  # green: no traffic yet
    ['a']
    """
    revisions = [stable] if stable else []
    if canary and canary != stable and strategy != Strategy.BLUE_GREEN and replicas.get(canary, 0) > 0:
        revisions.append(canary)
    return revisions


def scale_selector(name: str, revisions: Sequence[str]) -> str | None:
    """``status.selector``: a label selector string (the form the /scale subresource carries).

    >>> scale_selector("resnet", ["b", "a"])
    'triton-operator.io/revision in (a,b),triton-operator.io/service=resnet'
    >>> scale_selector("resnet", ["a"])
    'triton-operator.io/revision=a,triton-operator.io/service=resnet'
    >>> scale_selector("resnet", []) is None
    True
    """
    if not revisions:
        return None
    chosen = sorted(set(revisions))
    revision = (
        f"{LABEL_REVISION}={chosen[0]}" if len(chosen) == 1 else f"{LABEL_REVISION} in ({','.join(chosen)})"
    )
    return f"{revision},{LABEL_SERVICE}={name}"


def scale_replicas(revisions: Iterable[str], deployments: Iterable[DeploymentState]) -> int:
    """``status.replicas``: the selected revisions' pods, as their Deployments count them (terminating
    ones left out)."""
    chosen = set(revisions)
    return sum(d.status_replicas for d in deployments if d.revision in chosen)


# ----------------------------------------------------------------- the owned HPA


def _resource(name: str, target: ResourceTarget) -> dict[str, Any]:
    # ContainerResource: the tritonserver container's usage against its own request, so the sync
    # init container (or a sidecar a policy injects) neither needs a request nor blurs the ratio.
    if target.average_utilization is not None:
        goal: dict[str, Any] = {"type": "Utilization", "averageUtilization": target.average_utilization}
    else:
        goal = {"type": "AverageValue", "averageValue": target.average_value}
    return {
        "type": "ContainerResource",
        "containerResource": {"name": name, "container": TRITON_CONTAINER, "target": goal},
    }


def _pods(metric_name: str, average_value: str) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": metric_name},
            "target": {"type": "AverageValue", "averageValue": average_value},
        },
    }


def build_metric(metric: AutoscalingMetric) -> dict[str, Any]:
    """One autoscaling/v2 MetricSpec."""
    if metric.queue_time is not None:
        return _pods(metric.queue_time.metric_name, str(metric.queue_time.average_microseconds))
    if metric.inferences_per_second is not None:
        return _pods(metric.inferences_per_second.metric_name, metric.inferences_per_second.average_per_pod)
    if metric.pods is not None:
        return _pods(metric.pods.metric_name, metric.pods.average_value)
    if metric.cpu is not None:
        return _resource("cpu", metric.cpu)
    assert metric.memory is not None  # the model validator allows exactly one
    return _resource("memory", metric.memory)


def build_hpa(ts: TritonService) -> dict[str, Any]:
    """HorizontalPodAutoscaler `<name>` (autoscaling/v2) on the TritonService's /scale subresource."""
    autoscaling = ts.spec.autoscaling
    if autoscaling is None:
        raise ValueError("spec.autoscaling is not set")
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": ts.name},
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": [build_metric(m) for m in autoscaling.metrics],
    }
    if autoscaling.behavior is not None:
        behavior = autoscaling.behavior.to_api()
        for rules in behavior.values():
            # The API server fills in its default policies only for a direction that names none:
            # `policies: []` is refused ("must specify at least one Policy").
            if not rules.get("policies"):
                rules.pop("policies", None)
        if behavior:
            spec["behavior"] = behavior
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": HPA_KIND,
        "metadata": {
            "name": ts.name,
            "namespace": ts.namespace,
            "labels": build_labels(ts),
            "ownerReferences": [build_owner_reference({"metadata": ts.metadata})],
        },
        "spec": spec,
    }


def describe(autoscaling: Autoscaling) -> str:
    """The HPA's range and metrics in a few words, for the condition.

    >>> from triton_operator.models import Autoscaling
    >>> describe(Autoscaling.model_validate(
    ...     {"maxReplicas": 8, "metrics": [{"queueTime": {"averageMicroseconds": 5000}},
    ...                                    {"cpu": {"averageUtilization": 70}}]}))
    '1 to 8 replicas on triton_queue_time_per_request_microseconds 5000, cpu 70%'
    """
    parts = []
    for metric in autoscaling.metrics:
        spec = build_metric(metric)
        if spec["type"] == "Pods":
            pods = spec["pods"]
            parts.append(f"{pods['metric']['name']} {pods['target']['averageValue']}")
        else:
            resource = spec["containerResource"]
            target = resource["target"]
            figure = (
                f"{target['averageUtilization']}%"
                if "averageUtilization" in target
                else target["averageValue"]
            )
            parts.append(f"{resource['name']} {figure}")
    return f"{autoscaling.min_replicas} to {autoscaling.max_replicas} replicas on {', '.join(parts)}"


# ----------------------------------------------------------------- who scales the service


def _is_ours(hpa: Mapping[str, Any], uid: str | None) -> bool:
    refs = (hpa.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("kind") == KIND and uid and r.get("uid") == uid for r in refs)


def targets(hpa: Mapping[str, Any], name: str) -> bool:
    """Whether an HPA scales TritonService ``name`` (its own namespace's)."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    group = str(ref.get("apiVersion", "")).split("/")[0]
    return bool(ref.get("kind") == KIND and ref.get("name") == name and group == GROUP)


def foreign_autoscalers(hpas: Iterable[Mapping[str, Any]], name: str, uid: str | None) -> list[str]:
    """Names of the HPAs that target TritonService ``name`` and are not the operator's (a user's, or
    the one KEDA makes for a ScaledObject), sorted."""
    return sorted(
        str((h.get("metadata") or {}).get("name", ""))
        for h in hpas
        if targets(h, name) and not _is_ours(h, uid)
    )


def own_autoscaler(hpas: Iterable[Mapping[str, Any]], name: str, uid: str | None) -> Mapping[str, Any] | None:
    """The operator's HPA `<name>`, if it exists."""
    return next(
        (h for h in hpas if (h.get("metadata") or {}).get("name") == name and _is_ours(h, uid)),
        None,
    )


def autoscaling_verdict(
    autoscaling: Autoscaling, foreign: Sequence[str], own: Mapping[str, Any] | None
) -> Verdict:
    """The Autoscaling condition: another autoscaler wins (nothing is written), or the owned HPA's state.

    The owned HPA's own conditions say why it cannot scale (ScalingActive False: the metrics API
    has no such metric, a pod lacks a CPU request): that reason goes into the message.
    """
    if foreign:
        return Verdict(
            FALSE,
            FOREIGN_AUTOSCALER,
            f"HorizontalPodAutoscaler {', '.join(foreign)} already targets this TritonService, so"
            " spec.autoscaling is not applied (two autoscalers would fight over spec.replicas): remove"
            " spec.autoscaling, or that autoscaler (for KEDA, its ScaledObject)",
        )
    what = describe(autoscaling)
    status = (own or {}).get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    for kind in ("AbleToScale", "ScalingActive"):
        found = conditions.get(kind)
        if found is not None and found.get("status") == FALSE:
            return Verdict(
                FALSE,
                AUTOSCALER_NOT_SCALING,
                f"HorizontalPodAutoscaler {autoscaling_name(own)}: {kind} is False,"
                f" {found.get('reason', '')}: {found.get('message', '')}",
            )
    if own is None or not conditions:
        return Verdict(UNKNOWN, AUTOSCALER_PENDING, f"HorizontalPodAutoscaler written: {what}")
    desired = status.get("desiredReplicas")
    wants = f"; it last asked for {desired}" if desired is not None else ""
    return Verdict(TRUE, AUTOSCALER_ACTIVE, f"HorizontalPodAutoscaler scales {what}{wants}")


def autoscalers_wanted(ts: TritonService, previous_status: Mapping[str, Any]) -> bool:
    """Whether a pass reads the namespace's HPAs: spec.autoscaling is set, or the status's Autoscaling
    condition says the operator may still own an HPA to delete. A service that never asked costs
    no request."""
    had = find_condition(previous_status.get("conditions") or [], AUTOSCALING) is not None
    return ts.spec.autoscaling is not None or had


@dataclasses.dataclass(frozen=True)
class Autoscalers:
    """The HPAs that target one TritonService."""

    foreign: tuple[str, ...]
    """Names of the HPAs that are not the operator's (a user's, KEDA's): they win."""
    own: Mapping[str, Any] | None
    """The operator's HPA `<name>` as stored, if it exists."""

    @classmethod
    def of(cls, hpas: Iterable[Mapping[str, Any]], name: str, uid: str | None) -> Autoscalers:
        """Sorted out from the HPAs of the TritonService's namespace."""
        listed = list(hpas)
        return cls(
            foreign=tuple(foreign_autoscalers(listed, name, uid)), own=own_autoscaler(listed, name, uid)
        )

    def verdict(self, ts: TritonService) -> Verdict | None:
        """The Autoscaling condition; None removes it (spec.autoscaling unset and the owned HPA gone).

        While an owned HPA the spec no longer asks for still exists, the condition stays and says
        so: the status keeps the record that an HPA may need deleting until it is seen gone.
        """
        if ts.spec.autoscaling is None:
            if self.own is None:
                return None
            return Verdict(
                FALSE,
                AUTOSCALER_REMOVED,
                f"spec.autoscaling is unset: HorizontalPodAutoscaler {ts.name} is deleted, and"
                f" spec.replicas stays at {ts.spec.replicas}",
            )
        return autoscaling_verdict(ts.spec.autoscaling, self.foreign, self.own)

    def apply_own(self, ts: TritonService) -> bool:
        """Whether the owned HPA is to be written: spec.autoscaling asks and nothing else scales it."""
        return ts.spec.autoscaling is not None and not self.foreign

    def delete_own(self, ts: TritonService) -> bool:
        """Whether the owned HPA exists and is no longer wanted."""
        return self.own is not None and not self.apply_own(ts)


def autoscaling_name(hpa: Mapping[str, Any] | None) -> str:
    return str(((hpa or {}).get("metadata") or {}).get("name", ""))

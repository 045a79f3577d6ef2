"""A TritonService body, and helpers the tests of core's builders, observation and actions share."""

from __future__ import annotations

import copy
from typing import Any

from triton_operator.core.objects.builders import build_deployment
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    LABEL_REVISION,
    SYNC_CONTAINER,
    TRITON_CONTAINER,
)
from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.observed.observation import check_body
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.state import RolloutStatus
from triton_operator.models import TritonService
from triton_operator.settings import Settings

SETTINGS = Settings()
OLDER_SHAPE = Settings(agent_pods=False, quick_agent_probe=False)
"""The settings a revision made before one pod shape is rendered with (its sync init container)."""
UID = "0c3d6c2e-8d54-4bb8-9d1b-3c7a1f1e2a10"
CONFIG = {
    "backend": "python",
    "maxBatchSize": 8,
    "input": [{"name": "IN", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "OUT", "dataType": "TYPE_FP32", "dims": ["4"]}],
    "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
}


def body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "apiVersion": "triton-operator.io/v1alpha1",
        "kind": "TritonService",
        "metadata": {"name": "svc", "namespace": "ml", "uid": UID, "generation": 1},
        "spec": {
            "repository": {"uri": "s3://models/prod", "endpoint": "http://minio:9000"},
            "models": [{"name": "m1", "config": copy.deepcopy(CONFIG)}],
        },
    }
    base["spec"].update(spec)
    return base


def ts_of(**spec: Any) -> TritonService:
    return TritonService.model_validate(body(**spec))


def configs_of(ts: TritonService) -> dict[str, str]:
    checked = check_body(ts.model_dump(by_alias=True, exclude_none=True, mode="json"))
    assert not checked.problems, checked.problems
    return dict(checked.configs)


def deployment(
    ts: TritonService, revision: str = "abc1234567", replicas: int = 1, *, settings: Settings = SETTINGS
) -> dict[str, Any]:
    return build_deployment(ts, revision, settings, replicas)


def fetcher(pod: dict[str, Any]) -> dict[str, Any]:
    """The container of a pod spec that fetches its models: the sync init container of a revision
    made before one pod shape, else the model agent."""
    inits = [c for c in pod.get("initContainers") or [] if c["name"] == SYNC_CONTAINER]
    return inits[0] if inits else next(c for c in pod["containers"] if c["name"] == AGENT_CONTAINER)


def triton_container(dep: dict[str, Any]) -> dict[str, Any]:
    containers = dep["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == TRITON_CONTAINER)


def volume(dep: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == name)


def rollout_plan(replicas: dict[str, int], delete: tuple[str, ...] = (), **kw: Any) -> RolloutPlan:
    return RolloutPlan(
        replicas=replicas,
        delete=delete,
        weights=TrafficWeights(),
        header_route=None,
        stable_service_revision=kw.pop("stable", None),
        canary_service_revision=kw.pop("canary", None),
        status=RolloutStatus(),
        conditions={},
        events=(),
        requeue_after=None,
    )


def observed_deployment(revision: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{revision}", "labels": {LABEL_REVISION: revision}},
        "spec": {"replicas": replicas},
    }


def observed_configmap(revision: str) -> dict[str, Any]:
    return {"metadata": {"name": f"svc-{revision}", "labels": {LABEL_REVISION: revision}}}

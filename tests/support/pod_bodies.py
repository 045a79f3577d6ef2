"""Pod bodies as the API server returns them for a revision's pod: the shape kubelet (1.29 and later)
writes for a pod with the `sync` init container and the `tritonserver` container, with times
relative to its creation. Imported by basename: ``from pod_bodies import started_pod``.

Every field is one the real API returns (conditions with lastProbeTime null, containerIDs, imageIDs,
the terminated init container's reason Completed); times are whole seconds, as Kubernetes writes them.
"""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from triton_operator.core.pod.startup import FillTimeline

if TYPE_CHECKING:
    from triton_operator.core.decision.pool_plan import PoolPlan

CREATED = datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC)
SUMMARY = "synced 3 objects, 536870912 bytes fetched from the store, 0 bytes already present, in 1.84 s\n"


def at(seconds: float | None) -> str | None:
    """CREATED plus ``seconds``, as Kubernetes writes a time (None stays None)."""
    if seconds is None:
        return None
    return (CREATED + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, when: float | None, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": at(when)}


def started_pod(
    revision: str = "r1",
    suffix: str = "x2x9k",
    *,
    service: str = "svc",
    scheduled: float | None = 0,
    sandbox: float | None = 1,
    sync_started: float | None = 1,
    sync_finished: float | None = 3,
    triton_started: float | None = 4,
    ready: float | None = 9,
    summary: str | None = SUMMARY,
    sync_name: str = "sync",
    sync_restarts: int = 0,
    triton_restarts: int = 0,
    uid: str | None = None,
) -> dict[str, Any]:
    """A pod of ``revision``, created at CREATED, each step ``seconds`` after it (None: not reached).

    ``ready`` None: not Ready yet (the Ready condition False, tritonserver running but not ready).
    ``sync_restarts``: the sync init container failed that many times before it succeeded (its
    lastState holds the last failure, exit 5, with the store's reason as its message).
    """
    name = f"{service}-{revision}-7d9c8b6f5-{suffix}"
    image_id = "sha256:4b1f1e0a9c7d8e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
    conditions = []
    if sandbox is not None:
        conditions.append(_condition("PodReadyToStartContainers", sandbox))
    if sync_finished is not None:
        conditions.append(_condition("Initialized", sync_finished))
    else:
        conditions.append(_condition("Initialized", 0, "False") | {"reason": "ContainersNotInitialized"})
    is_ready = ready is not None
    conditions.append(
        _condition("Ready", ready if is_ready else 0, "True" if is_ready else "False")
        | (
            {}
            if is_ready
            else {"reason": "ContainersNotReady", "message": "containers with unready status: [tritonserver]"}
        )
    )
    conditions.append(
        _condition("ContainersReady", ready if is_ready else 0, "True" if is_ready else "False")
    )
    if scheduled is not None:
        conditions.append(_condition("PodScheduled", scheduled))
    else:
        conditions.append(
            _condition("PodScheduled", 0, "False")
            | {"reason": "Unschedulable", "message": "0/2 nodes are available: 2 Insufficient cpu."}
        )

    sync: dict[str, Any] = {
        "name": sync_name,
        "image": "triton-operator:e2e",
        "imageID": f"docker.io/library/triton-operator@{image_id}",
        "ready": sync_finished is not None,
        "restartCount": sync_restarts,
        "started": False,
        "lastState": {},
        "state": {"waiting": {"reason": "PodInitializing"}},
        "volumeMounts": [{"name": "models", "mountPath": "/models"}],
    }
    if sync_started is not None and sync_finished is not None:
        terminated: dict[str, Any] = {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": at(sync_started),
            "finishedAt": at(sync_finished),
            "containerID": "containerd://9f2c1a7e5b3d",
        }
        if summary is not None:
            terminated["message"] = summary
        sync["state"] = {"terminated": terminated}
        sync["containerID"] = "containerd://9f2c1a7e5b3d"
    elif sync_started is not None:
        sync["state"] = {"running": {"startedAt": at(sync_started)}}
        sync["started"] = True
    if sync_restarts:
        sync["lastState"] = {
            "terminated": {
                "exitCode": 5,
                "reason": "Error",
                "message": "s3://models/llm: the store is unavailable: connection refused\n",
                "startedAt": at(max((sync_started or 1) - 2, 0)),
                "finishedAt": at(max((sync_started or 1) - 1, 0)),
                "containerID": "containerd://1b7e4c2d9a0f",
            }
        }

    triton: dict[str, Any] = {
        "name": "tritonserver",
        "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
        "imageID": f"nvcr.io/nvidia/tritonserver@{image_id}",
        "ready": is_ready,
        "restartCount": triton_restarts,
        "started": is_ready,
        "lastState": {},
        "state": {"waiting": {"reason": "PodInitializing"}},
    }
    if triton_started is not None:
        triton["state"] = {"running": {"startedAt": at(triton_started)}}
        triton["containerID"] = "containerd://3c8d0e6f2a1b"
    if triton_restarts:
        triton["lastState"] = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": at(max((triton_started or 4) - 3, 0)),
                "finishedAt": at(max((triton_started or 4) - 1, 0)),
                "containerID": "containerd://5e0a2b4c6d8f",
            }
        }

    status: dict[str, Any] = {
        "phase": "Running" if triton_started is not None else "Pending",
        "conditions": conditions,
        "qosClass": "Burstable",
    }
    if scheduled is not None:  # a pod the scheduler has not placed has no node, address or containers
        status |= {
            "hostIP": "10.88.0.1",
            "hostIPs": [{"ip": "10.88.0.1"}],
            "podIP": "10.88.0.17",
            "podIPs": [{"ip": "10.88.0.17"}],
            "startTime": at(scheduled),
            "initContainerStatuses": [sync],
            "containerStatuses": [triton],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": f"{service}-{revision}-7d9c8b6f5-",
            "namespace": "ml",
            "uid": uid or f"6f1d2c3b-{revision}-{suffix}",
            "resourceVersion": "48213",
            "creationTimestamp": at(0),
            "labels": {
                "app.kubernetes.io/managed-by": "triton-operator",
                "triton-operator.io/service": service,
                "triton-operator.io/revision": revision,
                "pod-template-hash": "7d9c8b6f5",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{service}-{revision}-7d9c8b6f5",
                    "uid": "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"nodeName": "real-node"} if scheduled is not None else {},
        "status": status,
    }


def edited(pod: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of ``pod`` with metadata fields changed (e.g. deletionTimestamp)."""
    out = copy.deepcopy(pod)
    out["metadata"].update(changes)
    return out


def agent_pod(
    revision: str = "r1",
    suffix: str = "a7k2p",
    *,
    agent_started: float = 2,
    triton_started: float = 2,
    ready: float | None = 12,
    uid: str | None = None,
    ip: str = "10.88.0.18",
) -> dict[str, Any]:
    """A pod of the one shape (no sync init container): started_pod's, with the `model-agent`
    container running beside tritonserver from ``agent_started`` (ready with the pod)."""
    pod = started_pod(
        revision,
        suffix,
        sync_started=None,
        sync_finished=None,
        triton_started=triton_started,
        ready=ready,
        uid=uid,
    )
    status = pod["status"]
    status.pop("initContainerStatuses", None)
    status["podIP"], status["podIPs"] = ip, [{"ip": ip}]
    status["conditions"] = [c for c in status["conditions"] if c["type"] != "Initialized"]
    status["conditions"].append(_condition("Initialized", agent_started))
    agent = {
        "name": "model-agent",
        "image": "triton-operator:e2e",
        "ready": ready is not None,
        "restartCount": 0,
        "started": True,
        "lastState": {},
        "state": {"running": {"startedAt": at(agent_started)}},
        "containerID": "containerd://7a0c2e4b6d8f",
    }
    status["containerStatuses"] = [*status["containerStatuses"], agent]
    return pod


MiB = 1024 * 1024
AGENT_FILL = FillTimeline(
    "r1",
    started=CREATED + timedelta(seconds=2.4),
    fetched=CREATED + timedelta(seconds=9.5),
    loaded=CREATED + timedelta(seconds=10.8),
    objects=7,
    fetched_bytes=512 * MiB,
    node_cache_bytes=1536 * MiB,
    present_bytes=512 * MiB,
)
"""The agent's record of agent_pod's fill (its defaults): begun at 2.4 s, by the agent's own clock,
its last byte in at 9.5 s, every model loaded at 10.8 s; 512 MiB from the store, 1.5 GiB from the
node cache, 512 MiB already present."""


def applied(pods: list[dict[str, Any]], plan: PoolPlan) -> None:
    """A pool plan's pod patches (``pods``: their bodies, changed in place), merged as the API server
    would: a label or annotation set to None is removed."""
    by_name = {p["metadata"]["name"]: p for p in pods}
    for patch in plan.patches:
        metadata = by_name[patch.pod]["metadata"]
        for key, values in (("labels", patch.labels), ("annotations", patch.annotations)):
            for k, v in values.items():
                if v is None:
                    metadata[key].pop(k, None)
                else:
                    metadata[key][k] = v

"""One pod shape: every new revision's pod runs the model agent beside a tritonserver started with no
model, whatever spec.rollout.modelUpdates says; a revision made before keeps its recorded shape."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from triton_operator.core.objects.builders import (
    FILL_FLAG,
    build_deployment,
    compute_revision,
    read_settings_record,
    settings_record,
)
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    AGENT_PORT,
    AGENT_READY_PATH,
    MODELS_DIR,
    TRITON_CONTAINER,
)
from triton_operator.core.observed.observation import pod_state, recorded_settings, sync_container_status
from triton_operator.core.pod.startup import pod_start
from triton_operator.core.vocabulary.triton_state import describe_failures
from triton_operator.settings import Settings
from tritonservice_bodies import OLDER_SHAPE, SETTINGS, configs_of, ts_of


def pod_of(settings: Settings = SETTINGS, **spec: Any) -> dict[str, Any]:
    template: dict[str, Any] = build_deployment(ts_of(**spec), "r1", settings, 1)["spec"]["template"]["spec"]
    return template


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod["containers"] if c["name"] == name)


@pytest.mark.parametrize("updates", ["NewPods", "InPlace"])
def test_every_new_pod_runs_the_agent_beside_an_empty_tritonserver(updates: str) -> None:
    pod = pod_of(rollout={"modelUpdates": updates})
    assert "initContainers" not in pod  # nothing waits for the last byte before tritonserver starts
    assert [c["name"] for c in pod["containers"]] == [TRITON_CONTAINER, AGENT_CONTAINER]
    triton, agent = container(pod, TRITON_CONTAINER), container(pod, AGENT_CONTAINER)
    assert "--model-control-mode=explicit" in triton["args"]
    assert not [a for a in triton["args"] if a.startswith("--load-model")]  # no model at its start
    assert triton["readinessProbe"]["httpGet"] == {"path": AGENT_READY_PATH, "port": AGENT_PORT}
    assert triton["startupProbe"]["httpGet"]["path"] == "/v2/health/live"  # its own start only
    assert {"name": "models", "mountPath": MODELS_DIR, "readOnly": True} in triton["volumeMounts"]
    assert agent["command"] == ["triton-operator", "agent"]
    assert FILL_FLAG in agent["args"] and "--once" not in agent["args"]
    assert agent["terminationMessagePolicy"] == "FallbackToLogsOnError"  # why a fill failed
    assert pod["shareProcessNamespace"] is True
    # The agent drains by the kubelet's probe: it counts the probe's failureThreshold of 503s it
    # answered, then waits the spec's drainSeconds (5) for the endpoints.
    at = agent["args"].index("--probe-failures")
    assert agent["args"][at : at + 4] == [
        "--probe-failures",
        str(triton["readinessProbe"]["failureThreshold"]),
        "--drain-seconds",
        "5",
    ]


def test_model_updates_is_only_a_rollout_choice_now() -> None:
    """Switching NewPods <-> InPlace renders the same pod and keeps the revision."""
    new, inplace = ts_of(), ts_of(rollout={"modelUpdates": "InPlace"})
    assert pod_of() == pod_of(rollout={"modelUpdates": "InPlace"})
    assert compute_revision(new, SETTINGS, configs_of(new), None) == compute_revision(
        inplace, SETTINGS, configs_of(inplace), None
    )


@pytest.mark.parametrize("updates", ["NewPods", "InPlace"])
def test_a_revision_made_before_keeps_its_hash_and_its_pods(updates: str) -> None:
    """An operator upgrade restarts no serving pod: the revision recorded before one pod shape is
    found again and its Deployment is rendered as it was (sync init container)."""
    ts = ts_of(rollout={"modelUpdates": updates})
    configs = configs_of(ts)
    before = compute_revision(ts, OLDER_SHAPE, configs, None)
    old = build_deployment(ts, before, OLDER_SHAPE, 2)
    assert [c["name"] for c in old["spec"]["template"]["spec"]["initContainers"]] == ["sync"]
    # what the revision's ConfigMap recorded (a record without agentPods: made before)
    record = json.loads(settings_record(OLDER_SHAPE))
    record.pop("agentPods")
    kept = read_settings_record(json.dumps(record), SETTINGS)
    assert kept is not None and kept.agent_pods is False
    assert compute_revision(ts, SETTINGS, configs, None, recorded={before: kept}) == before
    assert build_deployment(ts, before, kept, 2) == old
    # a revision made before the record: its Deployment says
    assert recorded_settings(SETTINGS, [], old).agent_pods is False
    assert build_deployment(ts, before, recorded_settings(SETTINGS, [], old), 2) == old
    # a new revision of the same spec under today's operator: the one shape, another hash
    assert compute_revision(ts, SETTINGS, configs, None) != before


def test_a_new_revision_records_its_shape() -> None:
    record = read_settings_record(settings_record(SETTINGS), dataclasses.replace(SETTINGS, agent_pods=False))
    assert record is not None and record.agent_pods is True
    dep = build_deployment(ts_of(), "r1", SETTINGS, 1)
    assert recorded_settings(OLDER_SHAPE, [], dep).agent_pods is True


def test_the_agents_status_stands_for_the_sync_in_the_pods_start_and_failures() -> None:
    """status.timeToServe: imageAndSandbox ends when the agent starts; the download and the loads
    overlap in tritonserverLoad (no sync or tritonserverStart phase: the pod's status has no time
    for the last byte). A failed fill is the agent's termination message, until it is ready again."""
    failed = {"terminated": {"exitCode": 1, "message": "load of model 'm1' failed: boom"}}
    agent = {
        "name": AGENT_CONTAINER,
        "ready": False,
        "state": {"running": {"startedAt": "2026-01-01T00:00:03Z"}},
        "lastState": failed,
    }
    triton = {"name": TRITON_CONTAINER, "state": {"running": {"startedAt": "2026-01-01T00:00:03Z"}}}
    status = {
        "containerStatuses": [triton, agent],
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:01Z"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:10Z"},
        ],
    }
    assert sync_container_status(status)["lastState"] == failed
    start = pod_start(
        {"creationTimestamp": "2026-01-01T00:00:00Z"}, status, sync_container_status(status), triton
    )
    assert start.phases() == {"scheduling": 1.0, "imageAndSandbox": 2.0, "tritonserverLoad": 7.0}
    ready = {**status, "containerStatuses": [triton, {**agent, "ready": True}]}
    assert "lastState" not in sync_container_status(ready)


def test_a_model_that_fails_to_load_is_named_with_tritons_reason() -> None:
    """The agent exits with Triton's answer to the load as its termination message: the pod's state
    has it as a sync failure and as Triton's load failure, as a crashed tritonserver's log tail was."""
    message = (
        "load of model 'm1' failed: load failed for model 'm1': version 2 is at UNAVAILABLE state: "
        "Internal: RuntimeError: boom at import"
    )
    agent = {
        "name": AGENT_CONTAINER,
        "ready": False,
        "restartCount": 2,
        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
        "lastState": {"terminated": {"exitCode": 1, "message": message}},
    }
    triton = {"name": TRITON_CONTAINER, "ready": False, "state": {"running": {}}}
    pod = {"metadata": {"name": "p", "labels": {}}, "status": {"containerStatuses": [triton, agent]}}
    state = pod_state(pod)
    assert state.sync_failure == message
    assert (
        describe_failures(state.triton_failures)
        == "model 'm1' version 2: Internal: RuntimeError: boom at import"
    )
    assert state.waiting_reason == "CrashLoopBackOff"

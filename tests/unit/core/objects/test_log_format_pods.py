"""TRITON_OPERATOR_LOG_FORMAT in the pods the operator makes: the sync and agent containers of new
revisions log JSON naming their TritonService and revision; existing revisions keep text (recorded)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from triton_operator import logs
from triton_operator.core.objects.builders import (
    PLAIN,
    build_configmaps,
    build_deployment,
    build_sync_container,
    compute_revision,
)
from triton_operator.core.objects.names import AGENT_CONTAINER
from triton_operator.core.observed.observation import recorded_settings
from triton_operator.settings import Settings, SettingsError
from tritonservice_bodies import SETTINGS, configs_of, ts_of

JSON = dataclasses.replace(SETTINGS, log_format="json")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_json_tells_the_sync_and_agent_their_service_and_revision() -> None:
    ts = ts_of(rollout={"modelUpdates": "InPlace"})
    # a revision made before one pod shape (init container and sidecar); test_one_pod_shape has the pod of now
    pod = build_deployment(ts, "r1", dataclasses.replace(JSON, agent_pods=False), 1)["spec"]["template"][
        "spec"
    ]
    (init,) = pod["initContainers"]
    agent = next(c for c in pod["containers"] if c["name"] == AGENT_CONTAINER)
    expected = {logs.ENV: "json", logs.SERVICE_ENV: f"{ts.namespace}/{ts.name}", logs.REVISION_ENV: "r1"}
    assert env_of(init) == env_of(agent) == expected
    assert logs.env_service(expected) == {
        "namespace": ts.namespace,
        "tritonservice": ts.name,
        "revision": "r1",
    }
    assert "env" not in build_sync_container(ts_of(), SETTINGS, PLAIN)  # text: the pods as before


@pytest.mark.parametrize(
    ("before", "after"), [(SETTINGS, JSON), (JSON, SETTINGS)], ids=["to-json", "to-text"]
)
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "live-deployment"])
def test_changing_the_format_restarts_no_serving_pod(
    before: Settings, after: Settings, recorded: bool
) -> None:
    ts = ts_of()
    configs = configs_of(ts)
    revision = compute_revision(ts, before, configs, None)
    assert compute_revision(ts, after, configs, None) == revision
    configmaps = build_configmaps(ts, revision, configs, None, settings=before if recorded else None)
    deployment = build_deployment(ts, revision, before, 2)
    assert build_deployment(ts, revision, recorded_settings(after, configmaps, deployment), 2) == deployment
    assert recorded_settings(after, [], None).log_format == after.log_format


def test_the_operator_reads_the_format_from_its_environment_strictly() -> None:
    assert Settings.from_env({}).log_format == "text"
    assert Settings.from_env({logs.ENV: "json"}).log_format == "json"
    with pytest.raises(SettingsError, match=logs.ENV):  # with every other setting it cannot read
        Settings.from_env({logs.ENV: "Json"})

"""The agent's readiness probe: every second, out of the Service at its first failure, in new revisions'
pods with the model agent (a pod leaves its Service within a second of an in-place change beginning);
tritonserver's own readiness and the revisions recorded before keep theirs (no pod restarted)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from triton_operator.core.objects.builders import (
    agent_drain_args,
    agent_drain_seconds,
    build_deployment,
    compute_revision,
    read_settings_record,
    settings_record,
)
from triton_operator.core.objects.names import AGENT_CONTAINER, AGENT_READY_PATH, TRITON_CONTAINER
from triton_operator.core.observed.observation import recorded_settings
from triton_operator.settings import Settings
from tritonservice_bodies import OLDER_SHAPE, SETTINGS, configs_of, ts_of

BEFORE = dataclasses.replace(SETTINGS, quick_agent_probe=False)
"""A revision of the one pod shape recorded before the quick probe."""


def containers(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def timing(probe: dict[str, Any]) -> tuple[int, int, int]:
    return probe["periodSeconds"], probe["failureThreshold"], probe["timeoutSeconds"]


@pytest.mark.parametrize("updates", ["NewPods", "InPlace"])
def test_a_new_revisions_agent_probe_runs_every_second_and_its_drain_counts_one_failure(updates: str) -> None:
    ts = ts_of(rollout={"modelUpdates": updates})
    pod = containers(build_deployment(ts, "r1", SETTINGS, 2))
    probe = pod[TRITON_CONTAINER]["readinessProbe"]
    assert probe["httpGet"]["path"] == AGENT_READY_PATH
    # out at the first failure, within a second; a probe slower than 5 s fails (the agent's own
    # readiness goes stale after 5 s without a check)
    assert timing(probe) == (1, 1, 5)
    args = pod[AGENT_CONTAINER]["args"]
    at = args.index("--probe-failures")
    assert args[at : at + 4] == ["--probe-failures", "1", "--drain-seconds", "5"]
    # the fixed wait a pod of a revision made before would wait on this probe: 1 s + drainSeconds
    assert agent_drain_seconds(ts, SETTINGS) == 6
    assert agent_drain_seconds(ts) == 9  # the longer probe's (the pool's bound for any pod)


def test_tritonservers_own_readiness_keeps_its_probe() -> None:
    """A pod without the model agent (a revision made before one pod shape, NewPods): Triton's strict
    /v2/health/ready, every 2 s, out at the second failure, as before (its readiness is not cheap)."""
    pod = containers(build_deployment(ts_of(), "r1", OLDER_SHAPE, 2))
    probe = pod[TRITON_CONTAINER]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/v2/health/ready"
    assert timing(probe) == (2, 2, 3)
    assert timing(
        containers(build_deployment(ts_of(), "r1", SETTINGS, 2))[TRITON_CONTAINER]["livenessProbe"]
    ) == (
        10,
        3,
        5,
    )


@pytest.mark.parametrize("settings", [BEFORE, OLDER_SHAPE], ids=["one-shape", "older-shape"])
def test_a_revision_recorded_before_keeps_its_probe_its_drain_and_its_pods(settings: Settings) -> None:
    """An operator upgrade restarts no serving pod: the revision's record (without quickAgentProbe),
    or its Deployment alone, renders its template as it was, and its hash is the same."""
    ts = ts_of(rollout={"modelUpdates": "InPlace"})
    configs = configs_of(ts)
    revision = compute_revision(ts, settings, configs, None)
    old = build_deployment(ts, revision, settings, 2)
    pod = containers(old)
    assert timing(pod[TRITON_CONTAINER]["readinessProbe"]) == (2, 2, 3)
    assert pod[TRITON_CONTAINER]["readinessProbe"]["httpGet"]["path"] == AGENT_READY_PATH
    if settings.agent_pods:
        assert "--probe-failures" in pod[AGENT_CONTAINER]["args"]
        assert pod[AGENT_CONTAINER]["args"][pod[AGENT_CONTAINER]["args"].index("--probe-failures") + 1] == "2"
    else:  # the older shape's fixed wait: 2 s x 2 + drainSeconds
        assert agent_drain_args(ts, settings) == ["--drain-seconds", "9"]
    # its ConfigMap's record, as written before the quick probe: no key
    record = json.loads(settings_record(settings))
    assert "quickAgentProbe" not in record
    kept = read_settings_record(json.dumps(record), SETTINGS)
    assert kept is not None and kept.quick_agent_probe is False
    assert compute_revision(ts, SETTINGS, configs, None, recorded={revision: kept}) == revision
    assert build_deployment(ts, revision, kept, 2) == old
    # a revision made before the record: its Deployment says
    live = recorded_settings(SETTINGS, [], old)
    assert live.quick_agent_probe is False
    assert build_deployment(ts, revision, live, 2) == old


def test_a_new_revision_records_the_quick_probe() -> None:
    record = read_settings_record(settings_record(SETTINGS), BEFORE)
    assert record is not None and record.quick_agent_probe is True
    assert json.loads(settings_record(SETTINGS))["quickAgentProbe"] is True
    dep = build_deployment(ts_of(rollout={"modelUpdates": "InPlace"}), "r1", SETTINGS, 1)
    assert recorded_settings(BEFORE, [], dep).quick_agent_probe is True
    assert (
        build_deployment(
            ts_of(rollout={"modelUpdates": "InPlace"}), "r1", recorded_settings(BEFORE, [], dep), 1
        )
        == dep
    )

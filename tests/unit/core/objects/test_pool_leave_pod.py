"""A pool pod's leave: the agent's preStop waits the drain, then (`triton-operator leave`) while a model it
holds READY is answered through its Service by this pod alone, at most spec.pool.leaveSeconds; tritonserver's
preStop waits on the file it writes; the grace period covers both; a pod without a pool is unchanged."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from pydantic import ValidationError
from test_pool_pod import pod_of, pooled  # type: ignore[import-not-found,unused-ignore]

from triton_operator.cli import build_parser
from triton_operator.core.objects.builders import (
    build_deployment,
    compute_revision,
    read_settings_record,
    settings_record,
    termination_grace_seconds,
)
from triton_operator.core.objects.names import (
    AGENT_CONTAINER,
    LEAVE_DONE_FILE,
    LEAVE_VOLUME,
    POD_NAME_ENV,
    POOL_ASSIGNMENT_FILE,
    TRITON_CONTAINER,
)
from triton_operator.core.observed.observation import recorded_settings
from tritonservice_bodies import SETTINGS, configs_of, ts_of


def containers(**spec: Any) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_of(**spec)["containers"]}


def test_a_pool_pods_agent_waits_the_drain_then_while_its_models_are_answered_by_it_alone() -> None:
    found = containers(**pooled(), drainSeconds=2)
    command = found[AGENT_CONTAINER]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["triton-operator", "leave"]
    args = build_parser().parse_args(command[1:])
    assert (args.after, args.seconds) == (2.0, 60.0)  # drainSeconds, then leaveSeconds' default
    assert str(args.assignment) == POOL_ASSIGNMENT_FILE
    assert str(args.done) == LEAVE_DONE_FILE
    env = {e["name"]: e for e in found[AGENT_CONTAINER]["env"]}
    assert env[POD_NAME_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    mounts = {m["name"]: m for m in found[AGENT_CONTAINER]["volumeMounts"]}
    assert "readOnly" not in mounts[LEAVE_VOLUME]


def test_tritonserver_waits_the_drain_then_for_the_agents_word_at_most_leave_seconds() -> None:
    spec = pooled()
    found = containers(**{**spec, "pool": {**spec["pool"], "leaveSeconds": 45}}, drainSeconds=3)
    command = found[TRITON_CONTAINER]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"]
    assert command[2].startswith("sleep 3; ")
    assert f"[ ! -e {LEAVE_DONE_FILE} ]" in command[2]
    assert "[ $n -lt 45 ]" in command[2]
    mounts = {m["name"]: m for m in found[TRITON_CONTAINER]["volumeMounts"]}
    assert mounts[LEAVE_VOLUME]["readOnly"] is True  # only the agent writes the word
    volumes = {v["name"]: v for v in pod_of(**pooled())["volumes"]}
    assert volumes[LEAVE_VOLUME] == {"name": LEAVE_VOLUME, "emptyDir": {}}


def test_the_grace_period_covers_the_drain_and_the_leave() -> None:
    spec = pooled()
    plain = ts_of(drainSeconds=5)
    pool = ts_of(**{**spec, "pool": {**spec["pool"], "leaveSeconds": 45}}, drainSeconds=5)
    assert termination_grace_seconds(pool) == termination_grace_seconds(plain) + 45
    assert pod_of(**{**spec, "pool": {**spec["pool"], "leaveSeconds": 45}}, drainSeconds=5)[
        "terminationGracePeriodSeconds"
    ] == termination_grace_seconds(pool)


def test_a_pod_without_a_pool_keeps_its_shape() -> None:
    found = containers(drainSeconds=5)
    assert found[TRITON_CONTAINER]["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert "lifecycle" not in found[AGENT_CONTAINER]
    assert POD_NAME_ENV not in {e["name"] for e in found[AGENT_CONTAINER].get("env", [])}
    assert LEAVE_VOLUME not in {v["name"] for v in pod_of()["volumes"]}
    assert LEAVE_VOLUME not in {m["name"] for m in found[TRITON_CONTAINER]["volumeMounts"]}


@pytest.mark.parametrize("value", [-1, 3601])
def test_leave_seconds_out_of_range_is_refused_naming_the_field(value: int) -> None:
    spec = pooled()
    with pytest.raises(ValidationError) as info:
        ts_of(**{**spec, "pool": {**spec["pool"], "leaveSeconds": value}})
    assert [tuple(e["loc"]) for e in info.value.errors()] == [("spec", "pool", "leaveSeconds")]
    assert "spec.pool.leaveSeconds" in str(info.value)


def test_a_pool_revision_recorded_before_the_wait_keeps_its_pods_and_its_hash() -> None:
    """A pool revision made by an operator before the leave wait: found again under today's operator
    (its record has no poolLeave, or its Deployment's agent names no pod) and rendered as it was (both
    preStops drainSeconds alone), so an operator upgrade restarts no pool pod; a new revision of the
    same spec gets the wait, and another leaveSeconds is another revision."""
    ts = ts_of(**pooled())
    configs = configs_of(ts)
    before_settings = dataclasses.replace(SETTINGS, pool_leave=False)
    before = compute_revision(ts, before_settings, configs, None)
    old = build_deployment(ts, before, before_settings, 2)
    pod = old["spec"]["template"]["spec"]
    drain = {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert [c.get("lifecycle") for c in pod["containers"]] == [drain, drain]
    assert LEAVE_VOLUME not in {v["name"] for v in pod["volumes"]}
    record = json.loads(settings_record(before_settings))
    assert "poolLeave" not in record  # as a record written before
    kept = read_settings_record(json.dumps(record), SETTINGS)
    assert kept is not None and kept.pool_leave is False
    assert compute_revision(ts, SETTINGS, configs, None, recorded={before: kept}) == before
    assert build_deployment(ts, before, kept, 2) == old
    assert recorded_settings(SETTINGS, [], old).pool_leave is False  # no record: its Deployment says
    new = compute_revision(ts, SETTINGS, configs, None)
    assert new != before
    fresh = build_deployment(ts, new, SETTINGS, 2)
    assert recorded_settings(before_settings, [], fresh).pool_leave is True
    now = read_settings_record(settings_record(SETTINGS), before_settings)
    assert now is not None and now.pool_leave is True
    spec = pooled()
    other = ts_of(**{**spec, "pool": {**spec["pool"], "leaveSeconds": 30}})
    assert compute_revision(other, SETTINGS, configs_of(other), None) != new

"""A pod of the one shape's start with its model agent's record of its fill (core.pod.startup.FillTimeline):
the phases the bench measures (sync = the agent's start -> the last byte in; tritonserverLoad = the
last byte -> Ready), in PHASES' order, the bytes of the fill, the same in status.timeToServe, the
RevisionServed words and the metrics; a pod of the sync init container keeps its phases."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pod_bodies import AGENT_FILL, CREATED, MiB, agent_pod, started_pod
from triton_operator.core.observed.observation import pod_state
from triton_operator.core.pod.startup import (
    PHASES,
    FillTimeline,
    describe_phases,
    parse_timeline,
    served_entry,
)
from triton_operator.metrics import OperatorMetrics


def after(seconds: float) -> FillTimeline:
    """A fill of r1 begun ``seconds`` after the pod's creation, by the agent's own clock."""
    return FillTimeline("r1", CREATED + timedelta(seconds=seconds))


FILL = AGENT_FILL


def test_the_agents_fill_gives_the_sync_and_what_is_left_after_the_last_byte() -> None:
    pod = pod_state(agent_pod()).with_fill(FILL)
    phases = pod.start.phases()
    assert phases == {"scheduling": 0.0, "imageAndSandbox": 2.0, "sync": 7.5, "tritonserverLoad": 2.5}
    assert [p for p in PHASES if p in phases] == list(phases)  # PHASES' order, no tritonserverStart
    assert sum(phases.values()) == pod.start.total == 12.0  # one chain: nothing counted twice


def test_the_status_entry_the_event_and_the_bytes_are_the_fills() -> None:
    entry = served_entry("r1", "p", pod_state(agent_pod()).with_fill(FILL).start)
    assert entry is not None
    phases = {"scheduling": 0.0, "imageAndSandbox": 2.0, "sync": 7.5, "tritonserverLoad": 2.5}
    assert entry["phases"] == phases
    assert (entry["objects"], entry["bytesFetched"], entry["bytesPresent"]) == (7, 512 * MiB, 2048 * MiB)
    assert describe_phases(entry) == (
        "12 s: scheduling 0 s, image and sandbox 2 s, sync 7.5 s (512 MiB fetched, 2 GiB already present), "
        "tritonserver load 2.5 s"
    )


def test_the_sync_is_at_least_what_the_agent_measured() -> None:
    """The container's start is in whole seconds (and another clock's): the agent's own start ->
    last byte bounds the sync from below, as a sync container's summary does."""
    fill = dataclasses.replace(after(1.2), fetched=CREATED + timedelta(seconds=2.7))  # 1.5 s its own
    phases = pod_state(agent_pod(agent_started=3)).with_fill(fill).start.phases()
    assert phases["sync"] == 1.5


def test_without_the_agents_record_the_phases_are_the_pods_status_alone() -> None:
    """An agent that did not answer, predates the record, or whose last byte is not in yet: no sync,
    tritonserverLoad from tritonserver's start (as before the record); no bytes."""
    expected = {"scheduling": 0.0, "imageAndSandbox": 2.0, "tritonserverLoad": 10.0}
    for pod in (pod_state(agent_pod()), pod_state(agent_pod()).with_fill(after(2.4))):
        assert pod.start.phases() == expected
        entry = served_entry("r1", "p", pod.start)
        assert entry is not None and "bytesFetched" not in entry


def test_a_pod_with_the_sync_init_container_keeps_its_phases() -> None:
    pod = pod_state(started_pod())
    assert pod.with_fill(FILL) is pod  # its sync container's summary says it all
    assert pod.start.phases() == {
        "scheduling": 0,
        "imageAndSandbox": 1,
        "sync": 2,
        "tritonserverStart": 1,
        "tritonserverLoad": 5,
    }


def test_the_timeline_reads_back_what_it_writes_and_refuses_the_rest() -> None:
    done = dataclasses.replace(FILL, drained=CREATED + timedelta(seconds=9.9))
    assert parse_timeline(done.to_json()) == done
    assert done.to_json()["fetchedAt"] == "2026-11-27T10:00:09.500Z"  # to the millisecond
    no_revision = {"startedAt": "2026-11-27T10:00:00Z"}
    for bad in (None, "x", {}, {"revision": "r1", "startedAt": "yesterday"}, no_revision):
        assert parse_timeline(bad) is None
    counts = parse_timeline({**FILL.to_json(), "fetchedBytes": -1, "objects": True})
    assert counts is not None and (counts.fetched_bytes, counts.objects) == (0, 0)


@pytest.mark.parametrize("with_fill", [True, False], ids=["fill-read", "no-fill"])
def test_the_metrics_observe_the_same_phases_and_bytes(with_fill: bool) -> None:
    m = OperatorMetrics(CollectorRegistry(), since=CREATED)
    pod = pod_state(agent_pod())
    assert m.record_pod_starts([pod.with_fill(FILL) if with_fill else pod]) == 1
    samples = {
        (s.name, s.labels.get("phase")): s.value
        for family in text_string_to_metric_families(m.render().decode())
        for s in family.samples
    }
    name = "triton_operator_time_to_serve_seconds_sum"
    sync, load = samples[(name, "sync")], samples[(name, "tritonserverLoad")]
    fetched = samples[("triton_operator_time_to_serve_fetched_bytes_sum", None)]
    count = samples[("triton_operator_time_to_serve_fetched_bytes_count", None)]
    if with_fill:
        assert (sync, load, fetched, count) == (7.5, 2.5, 512 * MiB, 1)
    else:
        assert (sync, load, fetched, count) == (0, 10.0, 0, 0)

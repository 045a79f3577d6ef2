"""A revision applied in place: the agent records when it began, when the last byte was in, when the pod
was out of its Service and when every model was loaded (its status's ``inPlace``, kept across a
restart); served by its real status server, read by the operator's reader during the update, and
observed once per pod and revision in the in-place metrics (sync, drain, tritonserverLoad, total)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from test_agent_drain import FakeTriton, agent_of, go, revision  # type: ignore[import-not-found,unused-ignore]

from triton_operator.adapters.agent.runner import Agent
from triton_operator.adapters.agent.status import StatusServer
from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.core.pod.startup import in_place_phases, parse_timeline
from triton_operator.metrics import OperatorMetrics


async def test_a_change_in_place_is_recorded_read_and_observed_once(tmp_path: Path) -> None:
    triton, waits = FakeTriton(), list[float]()
    agent_of(tmp_path, triton, waits).once()  # the init container: r1
    agent = agent_of(tmp_path, triton, waits, drain=0.3)  # the sidecar; a real drain of 0.3 s
    assert "inPlace" not in agent.status() and "fill" not in agent.status()  # nothing applied in place
    began = datetime.now(UTC)
    go(agent, revision("r2", 10))
    assert agent.status()["state"] == "Applied"
    record = parse_timeline(agent.status()["inPlace"])
    assert record is not None and record.revision == "r2"
    assert record.fetched is not None and record.drained is not None and record.loaded is not None
    assert began <= record.started <= record.fetched <= record.drained <= record.loaded
    phases = in_place_phases(record)
    assert list(phases) == ["sync", "drain", "tritonserverLoad", "total"]
    # The drain waited out from the fetch's start: what was left of it after the last byte, before the loads.
    assert phases["sync"] + phases["drain"] >= 0.29 and phases["drain"] < 5
    assert abs(sum(phases[p] for p in ("sync", "drain", "tritonserverLoad")) - phases["total"]) < 0.01
    assert Agent(agent.options).status()["inPlace"] == agent.status()["inPlace"]  # kept over a restart

    server = StatusServer("127.0.0.1:0", agent.status).start()
    reader = AgentReader(port=server.port)
    try:
        read = await reader.read({"svc-r1-7d9c8b6f5-x2x9k": "127.0.0.1"})
    finally:
        await reader.close()
        server.stop()
    metrics = OperatorMetrics(CollectorRegistry(), since=began - timedelta(seconds=1))
    assert metrics.record_in_place([], read) == 1
    assert metrics.record_in_place([], read) == 0  # once per pod and revision
    samples = {
        (s.name, s.labels.get("phase")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    name = "triton_operator_in_place_update_seconds"
    for phase in ("sync", "drain", "tritonserverLoad", "total"):
        assert samples[(f"{name}_count", phase)] == 1
        assert abs(samples[(f"{name}_sum", phase)] - phases[phase]) < 0.002  # to the millisecond
    assert samples[("triton_operator_in_place_update_fetched_bytes_count", None)] == 1

    # A change applied before this operator started is not one it saw.
    later = OperatorMetrics(CollectorRegistry(), since=datetime.now(UTC) + timedelta(seconds=1))
    assert later.record_in_place([], read) == 0


def test_a_pod_of_the_one_shape_keeps_its_fill_beside_its_change_in_place(tmp_path: Path) -> None:
    triton, waits = FakeTriton(loaded={}), list[float]()
    agent = agent_of(tmp_path, triton, waits)
    agent.options = dataclasses.replace(agent.options, fills=True)
    go(agent, revision("r1", 0))  # the first fill
    fill = parse_timeline(agent.status()["fill"])
    assert fill is not None and fill.revision == "r1" and fill.loaded is not None and fill.drained is None
    assert "inPlace" not in agent.status()
    go(agent, revision("r2", 10))
    change = parse_timeline(agent.status()["inPlace"])
    assert change is not None and change.revision == "r2" and change.loaded is not None
    assert parse_timeline(agent.status()["fill"]) == fill  # the pod's start stays as it was

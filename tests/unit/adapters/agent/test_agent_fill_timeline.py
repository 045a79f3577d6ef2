"""The agent's record of its first fill (core.pod.startup.FillTimeline) in its status, served by its real
status server (GET /v1/inplace on a loopback socket) and kept across a restart; the operator's reader
asks each new Ready pod's agent for it once (adapters.agent_reader.AgentReader.read_fills) and
reconcile.observe.observe_starts gives the pod its sync phase and bytes from it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_fill_overlap import FILES, pod  # type: ignore[import-not-found,unused-ignore]

from pod_bodies import AGENT_FILL as FILL
from pod_bodies import CREATED, agent_pod
from triton_operator.adapters.agent.runner import Agent
from triton_operator.adapters.agent.status import StatusServer
from triton_operator.adapters.agent_reader import AgentReader
from triton_operator.adapters.kube import Owned
from triton_operator.core.observed.observation import pod_state
from triton_operator.reconcile.observe import Seen, observe_starts


@pytest.fixture
def status() -> Iterator[tuple[StatusServer, list[dict[str, Any]]]]:
    served: list[dict[str, Any]] = [{}]
    server = StatusServer("127.0.0.1:0", lambda: served[-1]).start()
    yield server, served
    server.stop()


async def test_a_filled_agent_serves_its_fill_and_the_reader_asks_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: tuple[StatusServer, list[dict[str, Any]]]
) -> None:
    server, served = status
    agent, _triton, _store, files = pod(tmp_path, monkeypatch)
    before = datetime.datetime.now(datetime.UTC)
    agent.apply(files)
    after = datetime.datetime.now(datetime.UTC)
    served.append(agent.status())
    reader = AgentReader(port=server.port)
    try:
        await reader.read_fills({"uid-1": "127.0.0.1"})
        await reader.read_fills({"uid-1": "127.0.0.1"})  # asked once: no second request
    finally:
        await reader.close()
    assert reader.requests == 1
    fill = reader.fill("uid-1")
    assert fill is not None and fill.revision == "r1"
    assert fill.fetched is not None and fill.loaded is not None
    # to the millisecond, the agent's clock: began, then the last byte, then every model loaded
    assert before - datetime.timedelta(milliseconds=1) <= fill.started <= fill.fetched <= fill.loaded <= after
    # every byte from the store (no node cache here, nothing in /models before)
    assert (fill.objects, fill.fetched_bytes, fill.node_cache_bytes, fill.present_bytes) == (
        len(FILES),
        sum(FILES.values()),
        0,
        0,
    )
    # a restarted agent (its container restarted: the same state folder) says the same fill
    again = Agent(agent.options)
    assert again.status()["fill"] == agent.status()["fill"]


def seen(*pods: dict[str, Any], previous: dict[str, Any] | None = None) -> Seen:
    return Seen(
        namespace="ml",
        name="svc",
        metadata={},
        generation=1,
        previous=previous or {},
        moment=CREATED,
        owned=Owned(deployments=[], configmaps=[], pods=list(pods)),
        foreign=frozenset(),
        deployments=[],
        pods=[pod_state(p) for p in pods],
    )


async def test_each_new_ready_pod_of_the_one_shape_gets_its_fill_once(
    status: tuple[StatusServer, list[dict[str, Any]]],
) -> None:
    server, served = status
    served.append({"state": "Applied", "revision": "r1", "fill": FILL.to_json()})
    reader = AgentReader(port=server.port)
    reader.since = CREATED  # the pods became Ready while this operator ran
    new = agent_pod(uid="new", ip="127.0.0.1")
    loading = agent_pod("r1", "b", ready=None, uid="loading", ip="127.0.0.1")
    try:
        got = await observe_starts(reader, seen(new, loading))
        again = await observe_starts(reader, seen(new, loading))
    finally:
        await reader.close()
    assert reader.requests == 1  # the Ready pod's agent, once; not the one still loading
    for view in (got, again):
        ready = next(p for p in view.pods if p.uid == "new")
        assert ready.start.phases() == {
            "scheduling": 0.0,
            "imageAndSandbox": 2.0,
            "sync": 7.5,
            "tritonserverLoad": 2.5,
        }
        assert ready.start.bytes() == (7, FILL.fetched_bytes, FILL.node_cache_bytes + FILL.present_bytes)


async def test_a_start_already_recorded_is_not_asked_for(
    status: tuple[StatusServer, list[dict[str, Any]]],
) -> None:
    """A pod Ready before this operator started whose revision's time to serve the status holds (an
    operator restart): its agent is not asked; nor are any without a reader."""
    server, served = status
    served.append({"fill": FILL.to_json()})
    reader = AgentReader(port=server.port)
    reader.since = CREATED + datetime.timedelta(hours=1)
    recorded = {"timeToServe": [{"revision": "r1", "pod": "svc-r1-7d9c8b6f5-a7k2p"}]}
    try:
        got = await observe_starts(reader, seen(agent_pod(uid="old", ip="127.0.0.1"), previous=recorded))
    finally:
        await reader.close()
    assert reader.requests == 0
    assert "sync" not in got.pods[0].start.phases()
    plain = seen(agent_pod(uid="old", ip="127.0.0.1"))
    assert await observe_starts(None, plain) is plain

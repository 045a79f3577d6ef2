"""status.timeToServe of a revision loaded in place (core.decision.service_status with
core.pod.startup.InPlaceRecords): the first host pod's agent's change, in the in-place update's phases,
in the order and by the names of triton_operator_in_place_update_seconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pod_bodies import started_pod
from triton_operator.core.decision import decide
from triton_operator.core.decision import service_status as s
from triton_operator.core.decision.actions import RevisionPlan
from triton_operator.core.observed.observation import DeploymentState, pod_state
from triton_operator.core.pod.startup import IN_PLACE_PHASES, FillTimeline, InPlaceRecords, in_place_phases
from triton_operator.core.rollout.hostpods import AgentStatus
from triton_operator.models import TimeToServe

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
STEADY = RevisionPlan(replicas={"h1": 2}, stable="h1")


def timeline(
    revision: str, start: float, fetched: float, drained: float, loaded: float | None
) -> FillTimeline:
    def at(s: float) -> datetime:
        return T0 + timedelta(seconds=s)

    return FillTimeline(
        revision,
        at(start),
        fetched=at(fetched),
        drained=at(drained),
        loaded=at(loaded) if loaded is not None else None,
        objects=4,
        fetched_bytes=524288000,
        node_cache_bytes=1000,
        present_bytes=24,
    )


def observe(in_place: InPlaceRecords | None) -> s.Observation:
    return s.Observation(
        generation=1,
        now="2026-11-29T10:01:00Z",
        deployments=[DeploymentState("svc-h1", "h1", 2, ready_replicas=2)],
        pods=[pod_state(started_pod("h1", "a"))],
        plan=STEADY,
        replicas=2,
        in_place=in_place,
    )


def served(status: dict[str, Any]) -> dict[str, Any]:
    return {e["revision"]: e for e in status.get("timeToServe") or []}


def test_the_first_pod_to_load_the_revision_in_place_is_recorded_in_the_metric_phases() -> None:
    second = timeline("n2", 14.0, 15.5, 24.6, 27.5)
    first = timeline("n2", 0.5, 2.0, 11.1, 14.1)
    records = InPlaceRecords("h1", ("n2",), {"pod-b": second, "pod-a": first})
    status = s.build_status({}, observe(records))
    entry = served(status)["n2"]
    assert entry["pod"] == "pod-a" and entry["host"] == "h1"
    assert entry["phases"] == {"sync": 1.5, "drain": 9.1, "tritonserverLoad": 3.0}
    # The metric's phases, in its order, with the same figures (rounded to tenths).
    metric = in_place_phases(first)
    assert list(entry["phases"]) == list(IN_PLACE_PHASES)
    assert entry["phases"] == {p: round(metric[p], 1) for p in IN_PLACE_PHASES}
    assert entry["seconds"] == round(metric["total"], 1) == 13.6
    assert (entry["objects"], entry["bytesFetched"], entry["bytesPresent"]) == (4, 524288000, 1024)
    assert entry["readyAt"] == "2026-11-29T10:00:14Z"
    # The host's own entry (its first pod's start) stays, first.
    assert [e["revision"] for e in status["timeToServe"]] == ["h1", "n2"]
    TimeToServe.model_validate(entry)  # the CRD's schema has every field (drain, host)


def test_nothing_is_recorded_until_an_agent_has_loaded_the_revision() -> None:
    records = InPlaceRecords(
        "h1", ("n2",), {"pod-a": timeline("n2", 0.5, 2.0, 11.1, None), "pod-b": timeline("s1", 0, 1, 2, 3)}
    )
    assert "n2" not in served(s.build_status({}, observe(records)))


def test_recorded_once_then_kept_while_served_in_place_and_dropped_after() -> None:
    loaded = InPlaceRecords("h1", ("n2",), {"pod-a": timeline("n2", 0.5, 2.0, 11.1, 14.1)})
    first = s.build_status({}, observe(loaded))
    # Later passes: the agents no longer read (the update completed), or another pod loaded it later.
    later = InPlaceRecords("h1", ("n2",), {"pod-b": timeline("n2", 20, 21, 30, 33)})
    for records in (InPlaceRecords("h1", ("n2",)), later):
        again = s.build_status(first, observe(records))
        assert again["timeToServe"] == first["timeToServe"]
    # The next in-place revision loads: n2 (still served) and n3 each keep or get their entry.
    moving = InPlaceRecords("h1", ("n2", "n3"), {"pod-a": timeline("n3", 40, 41, 42, 45)})
    both = s.build_status(first, observe(moving))
    assert list(served(both)) == ["h1", "n2", "n3"] and served(both)["n2"] == served(first)["n2"]
    # n3 served, n2 no longer: n2 drops out; without an in-place update only the host's entry stays.
    after = s.build_status(both, observe(InPlaceRecords("h1", ("n3",))))
    assert list(served(after)) == ["h1", "n3"]
    assert list(served(s.build_status(after, observe(None)))) == ["h1"]


def test_the_revision_served_event_says_in_place_and_the_drain() -> None:
    records = InPlaceRecords("h1", ("n2",), {"pod-a": timeline("n2", 0.5, 2.0, 11.1, 14.1)})
    status = s.build_status({}, observe(records))
    events = s.served_events({"timeToServe": [served(status)["h1"]]}, status)
    assert [e.message for e in events] == [
        "revision n2 served in place (in the pods of revision h1) in 13.6 s: sync 1.5 s (500 MiB fetched, "
        "1 KiB already present), drain 9.1 s, tritonserver load 3 s (pod pod-a)"
    ]


def test_the_records_come_from_the_in_place_status_and_the_agents_read() -> None:
    agents = {
        "pod-a": AgentStatus(revision="n2", in_place=timeline("n2", 0.5, 2.0, 11.1, 14.1).to_json()),
        "pod-b": AgentStatus(revision="h1"),  # no in-place change yet
        "pod-c": AgentStatus(error="timed out"),
    }
    rollout = {"servedRevision": "n1", "inPlace": {"host": "h1", "stable": "n1", "next": "n2"}}
    records = decide.in_place_records(rollout, agents)
    assert records is not None
    assert (records.host, records.revisions, set(records.timelines)) == ("h1", ("n1", "n2"), {"pod-a"})
    assert records.timelines["pod-a"].loaded == T0 + timedelta(seconds=14.1)
    assert decide.in_place_records({"servedRevision": "n1"}, agents) is None  # no in-place update

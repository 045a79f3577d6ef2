"""status.timeToServe and the RevisionServed Event (core.decision.service_status): a serving revision's first
Ready pod's start, recorded once and kept, so that the status changes only when a revision first serves."""

from __future__ import annotations

from typing import Any

from pod_bodies import edited, started_pod
from triton_operator.core.decision import service_status as s
from triton_operator.core.decision.actions import RevisionPlan
from triton_operator.core.observed.observation import DeploymentState, PodState, pod_state
from triton_operator.core.vocabulary import conditions as c

STEADY = RevisionPlan(replicas={"r1": 2}, stable="r1")
ROLLING = RevisionPlan(replicas={"r1": 2, "r2": 1}, stable="r1", rolling="r2")


def observe(pods: list[dict[str, Any]], plan: RevisionPlan | None = STEADY, **kw: Any) -> s.Observation:
    deployments = [
        DeploymentState(f"svc-{r}", r, n, ready_replicas=n) for r, n in (plan or STEADY).replicas.items()
    ]
    return s.Observation(
        generation=1,
        now="2026-11-27T10:01:00Z",
        deployments=deployments,
        pods=[pod_state(p) for p in pods],
        plan=plan,
        replicas=2,
        **kw,
    )


def served(status: dict[str, Any]) -> dict[str, Any]:
    return {e["revision"]: e for e in status.get("timeToServe") or []}


def test_the_first_ready_pod_of_each_serving_revision_is_recorded() -> None:
    pods = [
        started_pod("r1", "late", ready=15, triton_started=5),
        started_pod("r1", "first"),  # Ready at 9 s
        started_pod("r1", "loading", ready=None),
        started_pod("r2", "canary", sync_finished=33, triton_started=34, ready=40),
    ]
    status = s.build_status({}, observe(pods, ROLLING))
    r1, r2 = served(status)["r1"], served(status)["r2"]
    assert r1["pod"] == "svc-r1-7d9c8b6f5-first" and r1["seconds"] == 9 and r1["bytesFetched"] == 536870912
    assert r1["phases"] == {
        "scheduling": 0, "imageAndSandbox": 1, "sync": 2, "tritonserverStart": 1, "tritonserverLoad": 5,
    }  # fmt: skip
    assert r2["seconds"] == 40 and r2["phases"]["sync"] == 32
    assert [e["revision"] for e in status["timeToServe"]] == ["r1", "r2"]  # stable first


def test_recorded_once_then_kept_so_the_status_does_not_change() -> None:
    first = s.build_status({}, observe([started_pod("r1", "a")]))
    # Later passes: the pod replaced by a slower one, a second pod Ready, the first one restarted.
    for pods in (
        [started_pod("r1", "b", ready=30)],
        [started_pod("r1", "a"), started_pod("r1", "b", ready=3, triton_started=2)],
        [started_pod("r1", "a", triton_restarts=1, ready=50)],
        [],
    ):
        again = s.build_status(first, observe(pods))
        assert again["timeToServe"] == first["timeToServe"]
        if len(pods) == 1:  # (PodsScheduled counts the pods: with one pod, nothing else changes)
            assert not s.status_changed(first, again)
    # A spec that cannot be applied (nothing planned) keeps it too.
    held = s.build_status(first, s.Observation(generation=2, now="2026-11-27T10:02:00Z", invalid="bad"))
    assert held["timeToServe"] == first["timeToServe"]


def test_a_revision_that_no_longer_serves_drops_out() -> None:
    both = s.build_status({}, observe([started_pod("r1"), started_pod("r2")], ROLLING))
    promoted = s.build_status(
        both, observe([started_pod("r2")], RevisionPlan(replicas={"r2": 2}, stable="r2"))
    )
    assert list(served(promoted)) == ["r2"] and served(promoted)["r2"] == served(both)["r2"]
    assert s.status_changed(both, promoted)


def test_nothing_is_recorded_without_a_ready_pod_with_its_times() -> None:
    no_times = started_pod("r1")
    del no_times["metadata"]["creationTimestamp"]
    for pods in (
        [],
        [started_pod("r1", ready=None)],
        [edited(started_pod("r1"), deletionTimestamp="2026-11-27T10:00:30Z")],  # terminating
        [no_times],
        [started_pod("r9")],  # a revision that does not serve
    ):
        status = s.build_status({}, observe(pods))
        assert "timeToServe" not in status
        assert not s.status_changed(status, s.build_status(status, observe(pods)))


def test_a_revision_served_event_once_naming_the_phases() -> None:
    before = s.build_status({}, observe([started_pod("r1", ready=None)]))
    assert s.served_events({}, before) == []
    after = s.build_status(before, observe([started_pod("r1")]))
    (event,) = s.served_events(before, after)
    assert (event.type, event.reason) == (c.NORMAL, c.REVISION_SERVED)
    assert event.message == (
        "revision r1 served in 9 s: scheduling 0 s, image and sandbox 1 s, sync 2 s (512 MiB fetched), "
        "tritonserver start 1 s, tritonserver load 5 s (pod svc-r1-7d9c8b6f5-x2x9k)"
    )
    again = s.build_status(after, observe([started_pod("r1"), started_pod("r1", "other")]))
    assert s.served_events(after, again) == []
    # the canary's first Ready pod: one Event, for it only
    rolling = s.build_status(again, observe([started_pod("r1"), started_pod("r2")], ROLLING))
    assert [e.message.split(" served")[0] for e in s.served_events(again, rolling)] == ["revision r2"]


def test_the_pod_state_default_start_records_nothing() -> None:
    # PodState built without a status (as other tests build them) has no start: no entry, no error.
    obs = s.Observation(
        generation=1,
        now="2026-11-27T10:01:00Z",
        plan=STEADY,
        replicas=2,
        deployments=[DeploymentState("svc-r1", "r1", 2, ready_replicas=2)],
        pods=[PodState(name="p", revision="r1", ready=True)],
    )
    status = s.build_status({}, obs)
    assert "timeToServe" not in status

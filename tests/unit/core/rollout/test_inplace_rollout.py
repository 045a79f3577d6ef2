"""core.rollout.inplace: the in-place update's steps, completion, and every way it rolls back (pure)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

import pytest

from triton_operator.core import conditions as cond
from triton_operator.core.rollout.inplace import (
    AgentStatus,
    HostPod,
    InPlaceInput,
    InPlacePlan,
    InPlaceRequests,
    InPlaceState,
    parse_agent_status,
    plan_in_place,
    step_pods,
)
from triton_operator.models import Rollout

T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
H, S, N = "host", "host", "next"
PODS = ("p0", "p1", "p2", "p3")


def rollout(*steps: dict[str, Any], **extra: Any) -> Rollout:
    return Rollout.model_validate({"steps": list(steps), "modelUpdates": "InPlace", **extra})


def on(revision: str, state: str = "Applied", **models: str) -> AgentStatus:
    return AgentStatus(revision=revision, target=revision, state=state, models=models or {"add": "READY"})


class World:
    """Pods whose agents do what the plan asks, one pass later (as the kubelet and the agent would)."""

    def __init__(
        self, steps: Sequence[dict[str, Any]] = (), pods: Sequence[str] = PODS, **extra: Any
    ) -> None:
        self.rollout = rollout(*steps, **extra)
        self.pods = {p: HostPod(p, ready=True, agent=on(S)) for p in pods}
        self.state = InPlaceState(host=H, stable=S, next=N)
        self.now = T0
        self.failing: set[str] = set()
        self.stuck: set[str] = set()
        self.configmap_stable: str | None = None
        self.last: InPlacePlan | None = None
        self.events: list[tuple[str, str]] = []

    def run(self, requests: InPlaceRequests | None = None, replaced_by: str | None = None) -> InPlacePlan:
        requests = requests or InPlaceRequests()
        assert self.state is not None
        plan = plan_in_place(
            InPlaceInput(
                rollout=self.rollout,
                state=self.state,
                models=("add",),
                pods=list(self.pods.values()),
                now=self.now,
                deadline_seconds=600,
                paused=self.rollout.paused,
                requests=requests,
                configmap_stable=self.configmap_stable,
                describe="reload add",
                replaced_by=replaced_by,
            )
        )
        self.last = plan
        self.events += [(e.reason, e.message) for e in plan.events]
        self.apply(plan)
        return plan

    def apply(self, plan: InPlacePlan) -> None:
        """The writes, then the agents: each pod loads what its annotation and the ConfigMap say."""
        for name, target in plan.annotations.items():
            self.pods[name] = dataclasses.replace(self.pods[name], target=target)
        self.configmap_stable = plan.configmap[0] if plan.configmap else None
        nxt = plan.configmap[1] if plan.configmap else None
        if plan.state is not None:
            self.state = plan.state
        for name, pod in self.pods.items():
            stable = plan.configmap[0] if plan.configmap else H
            target = pod.target if pod.target is not None and pod.target in (stable, nxt) else stable
            if name in self.stuck and target == N:
                agent = AgentStatus(revision=S, target=N, state="Applying")
            elif name in self.failing and target == N:
                agent = AgentStatus(revision=S, target=N, state="Failed", message="load of add failed: boom")
            else:
                agent = on(target)
            self.pods[name] = dataclasses.replace(pod, agent=agent)

    def annotated(self) -> list[str]:
        return sorted(n for n, p in self.pods.items() if p.target == N)

    def reasons(self) -> list[str]:
        return [r for r, _ in self.events]


# ---------------------------------------------------------------- steps maths


@pytest.mark.parametrize(
    ("weight", "pods", "updated"),
    [
        (25, 4, 1),
        (50, 4, 2),
        (10, 4, 1),
        (1, 100, 1),
        (34, 3, 2),
        (100, 3, 3),
        (0, 4, 0),
        (50, 1, 1),
        (60, 5, 3),
    ],
)
def test_a_set_weight_step_updates_ceil_of_its_percent_of_the_pods(
    weight: int, pods: int, updated: int
) -> None:
    assert step_pods(weight, pods) == updated


def test_steps_update_pods_a_step_at_a_time_then_all_and_complete() -> None:
    world = World([{"setWeight": 25}, {"setWeight": 50}])
    plan = world.run()
    assert world.annotated() == ["p0"]
    assert plan.configmap == (S, N)
    assert plan.progressing.reason == cond.IN_PLACE_UPDATING
    assert "0/1 pods asked" in plan.progressing.message
    assert plan.in_flight and plan.requeue_after == 2.0
    world.run()  # p0 reports next: step 0 done, step 1 asks a second pod
    assert world.annotated() == ["p0", "p1"]
    world.run()  # step 1 done: every pod
    assert world.annotated() == list(PODS)
    plan = world.run()  # all on next: complete
    assert plan.state is not None and plan.state.stable == N and plan.state.next is None
    assert plan.configmap == (N, None)
    assert plan.progressing.reason == cond.ROLLOUT_COMPLETED
    assert plan.annotations == {}  # kept until the ConfigMap says stable: next
    assert world.reasons() == [
        cond.ROLLOUT_STARTED,
        cond.STEP_COMPLETED,
        cond.STEP_COMPLETED,
        cond.ROLLOUT_COMPLETED,
    ]
    plan = world.run()  # the ConfigMap now says stable: next -> the annotations go
    assert sorted(plan.annotations) == list(PODS) and set(plan.annotations.values()) == {None}
    assert all(p.agent is not None and p.agent.revision == N for p in world.pods.values())


def test_no_steps_updates_every_pod_at_once() -> None:
    world = World()
    world.run()
    assert world.annotated() == list(PODS)
    plan = world.run()
    assert plan.state is not None and plan.state.stable == N


def test_a_pod_counts_only_with_its_changed_models_ready() -> None:
    world = World()
    world.run()
    for name, pod in world.pods.items():
        world.pods[name] = dataclasses.replace(pod, agent=on(N, add="UNAVAILABLE"))
    plan = plan_in_place(
        InPlaceInput(
            rollout=world.rollout,
            state=world.state,
            models=("add",),
            pods=list(world.pods.values()),
            now=T0,
            deadline_seconds=600,
        )
    )
    assert plan.state is not None and plan.state.next == N
    assert plan.progressing.reason == cond.IN_PLACE_UPDATING


def test_a_pause_step_is_a_canary_until_promoted_and_a_timed_one_runs_out() -> None:
    world = World([{"setWeight": 25}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50}, {"pause": {}}])
    world.run()
    plan = world.run()  # step 0 done: the timed pause holds one pod as a canary
    assert plan.progressing.reason == cond.STEP_PAUSED and plan.requeue_after == 60
    assert world.annotated() == ["p0"]
    world.now += datetime.timedelta(seconds=61)
    world.run()
    assert world.annotated() == ["p0", "p1"]
    plan = world.run()  # the pause {}: until promoted, for as long as it takes (no deadline)
    assert plan.progressing.reason == cond.STEP_PAUSED and plan.progressing.status == cond.FALSE
    world.now += datetime.timedelta(hours=2)
    plan = world.run()
    assert plan.state is not None and plan.state.next == N and plan.state.rolling_back is None
    assert world.annotated() == ["p0", "p1"]


@pytest.mark.parametrize("request_", [InPlaceRequests(promote=True), InPlaceRequests(promote_full=True)])
def test_promote_goes_to_every_pod_and_still_waits_for_them(request_: InPlaceRequests) -> None:
    world = World([{"setWeight": 25}, {"pause": {}}, {"setWeight": 50}])
    world.stuck = {"p0"}
    world.run()
    plan = world.run(request_)
    assert world.annotated() == list(PODS)
    assert plan.state is not None and plan.state.step_index == 3 and plan.state.next == N  # not complete
    world.stuck = set()
    world.run()
    plan = world.run()
    assert plan.state is not None and plan.state.stable == N and plan.state.next is None


def test_a_set_weight_step_counts_the_ready_pods() -> None:
    world = World([{"setWeight": 50}])
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False)
    world.pods["p2"] = dataclasses.replace(world.pods["p2"], ready=False)
    world.run()
    assert world.annotated() == ["p0"]  # ceil(50% of 2 Ready pods)


def test_paused_holds_and_stops_the_deadline_clock() -> None:
    world = World([{"setWeight": 50}], paused=True)
    plan = world.run()
    assert plan.progressing.reason == cond.ROLLOUT_PAUSED
    assert world.annotated() == []
    assert plan.state is not None and plan.state.waiting_since is None


# ---------------------------------------------------------------- rollback


def rolled_back(world: World, reason: str) -> None:
    plan = world.last
    assert plan is not None and plan.state is not None
    assert plan.state.rolling_back == reason and plan.state.aborted_reason == reason
    assert plan.degraded.status == cond.TRUE and plan.degraded.reason == reason
    assert plan.progressing.reason == cond.IN_PLACE_ROLLING_BACK
    assert cond.ROLLOUT_ABORTED in world.reasons()
    assert plan.configmap == (S, N)  # next stays until every pod is back
    assert all(p.target is None for p in world.pods.values())  # annotations removed
    plan = world.run()  # the agents load stable again
    assert plan.state is not None and plan.state.next is None and plan.state.aborted_revision == N
    assert plan.progressing.reason == cond.ROLLOUT_ABORTED and plan.degraded.reason == reason
    assert cond.IN_PLACE_ROLLED_BACK in world.reasons()
    assert plan.configmap == (S, None) or plan.state.stable == H


def test_a_failed_load_rolls_back() -> None:
    world = World([{"setWeight": 50}])
    world.failing = {"p0"}
    world.run()
    world.run()
    rolled_back(world, cond.IN_PLACE_LOAD_FAILED)
    assert "load of add failed: boom" in (world.last.degraded.message if world.last else "")


def test_the_progress_deadline_rolls_back() -> None:
    world = World([{"setWeight": 50}])
    world.stuck = {"p0", "p1"}
    world.run()
    world.now += datetime.timedelta(seconds=599)
    assert world.run().state.rolling_back is None  # type: ignore[union-attr]
    world.now += datetime.timedelta(seconds=2)
    world.run()
    rolled_back(world, cond.PROGRESS_DEADLINE_EXCEEDED)


def test_an_abort_request_rolls_back() -> None:
    world = World([{"setWeight": 50}, {"pause": {}}])
    world.run()
    world.run()
    world.run(InPlaceRequests(abort=True))
    rolled_back(world, cond.ABORTED)


def test_a_pod_gone_mid_update_rolls_back() -> None:
    world = World([{"setWeight": 50}])
    world.stuck = {"p0"}
    world.run()
    del world.pods["p0"]
    world.run()
    rolled_back(world, cond.IN_PLACE_POD_LOST)


def test_a_newer_spec_rolls_the_update_in_progress_back_first() -> None:
    world = World([{"setWeight": 50}])
    world.stuck = {"p0"}
    world.run()
    world.run(replaced_by="newer")
    rolled_back(world, cond.ABORTED)
    assert "replaced by revision newer" in world.events[-2][1] or any("newer" in m for _, m in world.events)


def test_a_pod_whose_agent_cannot_be_read_waits() -> None:
    world = World()
    world.run()
    for name, pod in world.pods.items():
        world.pods[name] = dataclasses.replace(pod, agent=AgentStatus(error="no complete answer within 2s"))
    plan = plan_in_place(
        InPlaceInput(
            rollout=world.rollout,
            state=world.state,
            models=("add",),
            pods=list(world.pods.values()),
            now=T0,
            deadline_seconds=600,
        )
    )
    assert plan.state is not None and plan.state.next == N and plan.state.rolling_back is None


# ---------------------------------------------------------------- the state and the agent's JSON


def test_the_state_survives_the_status() -> None:
    state = InPlaceState(host=H, stable="a", next="b", step_index=2, step_started_at=T0, pods=("p0", "p1"))
    assert InPlaceState.from_status({"inPlace": state.to_status()}) == state
    assert InPlaceState.from_status({}) is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (
            {
                "base": "a",
                "revision": "b",
                "target": "b",
                "state": "Applied",
                "message": "",
                "models": {"m": "READY"},
            },
            AgentStatus(revision="b", target="b", state="Applied", models={"m": "READY"}),
        ),
        (
            {"state": "Failed", "message": "x" * 5000, "target": "b"},
            AgentStatus(target="b", state="Failed", message="x" * 1024),
        ),
        (["not", "a", "map"], AgentStatus(error="not an agent status")),
    ],
)
def test_the_agent_status_is_read_as_the_contract_has_it(payload: Any, expected: AgentStatus) -> None:
    assert parse_agent_status(payload) == expected

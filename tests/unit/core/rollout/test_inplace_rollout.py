"""core.rollout.inplace: the in-place update's steps, completion, and every way it rolls back (pure)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

import pytest

from triton_operator.core.rollout.canary_analysis import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    AnalysisResult,
    AnalysisVerdict,
)
from triton_operator.core.rollout.inplace import (
    AgentStatus,
    AnalysisSides,
    HostPod,
    InPlaceInput,
    InPlacePlan,
    InPlaceRequests,
    InPlaceState,
    analysis_sides,
    batch_size,
    parse_agent_status,
    plan_in_place,
    step_pods,
)
from triton_operator.core.rollout.state import RolloutStatus
from triton_operator.core.vocabulary import conditions as cond
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
        self.analysis: AnalysisResult | None = None
        """The verdict reconcile.analysis hands the next call (None: no reading)."""
        self.slow = False
        """A pod takes a pass to reload, un-Ready meanwhile (out of the Service, as the agent has it)."""
        self.holds: dict[str, frozenset[str]] = {}
        """A pool's pods: the models each holds (its agent's AgentStatus.holds); empty: not a pool."""

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
                analysis=self.analysis,
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
            elif (
                self.slow
                and pod.agent is not None
                and pod.agent.revision != target
                and (pod.agent.target != target or pod.agent.state != "Applying")
            ):
                agent = AgentStatus(revision=pod.agent.revision, target=target, state="Applying")
            else:
                agent = on(target)
            agent = dataclasses.replace(agent, holds=self.holds.get(name))
            ready = pod.ready if not self.slow else agent.state == "Applied"
            self.pods[name] = dataclasses.replace(pod, agent=agent, ready=ready)

    def annotated(self) -> list[str]:
        return sorted(n for n, p in self.pods.items() if p.target == N)

    def settle(self, limit: int = 12) -> None:
        """Passes until a pass changes neither the pods asked nor the step (the batches all asked)."""
        for _ in range(limit):
            before = (self.annotated(), self.state.step_index if self.state else None)
            self.run()
            if (self.annotated(), self.state.step_index if self.state else None) == before:
                return
        raise AssertionError("never settled")

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
    # step 1 done: every pod, in batches of max(1, 25% of 4) = 1 (a pod reloading is out of the Service)
    world.run()
    assert world.annotated() == ["p0", "p1", "p2"]
    world.run()
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


def test_in_a_pool_a_step_is_a_share_of_the_changed_models_copies_asked_first() -> None:
    """In a pool, a setWeight step counts the pods holding the changed model (its copies), and asks
    them before the pods that have nothing to reload; the last step asks every pod."""
    pods = tuple(f"p{i}" for i in range(8))
    world = World([{"setWeight": 50}, {"pause": {}}], pods=pods)
    world.holds = {p: frozenset({"add"} if p in ("p3", "p6") else {"other"}) for p in pods}
    world.pods = {
        p: dataclasses.replace(h, agent=dataclasses.replace(on(S), holds=world.holds[p]))
        for p, h in world.pods.items()
    }
    world.run()
    world.run()
    assert world.annotated() == ["p3"]  # 50% of add's 2 copies: one, a pod holding it
    assert world.state.step_index == 1  # paused, one copy of add on the next revision
    world.run()
    assert world.annotated() == ["p3"]
    world.run(InPlaceRequests(promote=True))
    world.settle()
    # the last step asked every pod, holders or not, and the update completed
    assert world.state.next is None and world.state.stable == N
    assert all(p.agent is not None and p.agent.revision == N for p in world.pods.values())


def test_no_steps_updates_every_pod_in_batches_never_all_at_once() -> None:
    """No steps: every pod, but (as before the batches, when every pod was asked at once) in batches
    of at most max(1, 25%) of the pods that can serve, never all: a pod leaves the Service while its
    models reload, so one pod at least serves throughout."""
    world = World(pods=tuple(f"p{i}" for i in range(8)))
    seen = []
    while world.state.next is not None:
        world.run()
        seen.append(len(world.annotated()))
        assert len(seen) < 20
    assert seen == [2, 4, 6, 8, 8]  # 25% of 8 = 2 at a time; the last pass completes
    plan = world.last
    assert plan is not None and plan.state is not None and plan.state.stable == N


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
    # every pod is asked, in batches: p0 still loads, so no other pod is asked yet (1 of 4 at a time)
    assert world.annotated() == ["p0"]
    assert plan.state is not None and plan.state.step_index == 3 and plan.state.next == N  # not complete
    assert "pod p0: agent reports Applying" in plan.progressing.message
    assert "3 pods wait their turn (at most 1 reloading at once)" in plan.progressing.message
    world.stuck = set()
    for asked in (["p0"], ["p0", "p1"], ["p0", "p1", "p2"], list(PODS)):
        world.run()
        assert world.annotated() == asked
    plan = world.run()
    assert plan.state is not None and plan.state.stable == N and plan.state.next is None


def test_a_set_weight_step_counts_the_pods_that_can_serve() -> None:
    """Was: the Ready pods. A pod is un-Ready while its models reload (it leaves the Service), so a
    step counts the pods that can serve, Ready or not; a pod that has not started (or is Pending,
    crash looping) is not counted, and is never asked."""
    world = World([{"setWeight": 50}])
    not_started = "not started (tritonserver is not running)"
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False, problem=not_started)
    world.pods["p2"] = dataclasses.replace(world.pods["p2"], ready=False, problem=PENDING)
    world.run()
    assert world.annotated() == ["p0"]  # ceil(50% of the 2 pods that can serve)
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], problem=None)  # running, still un-Ready
    world.run()
    # p0 serves next, step 0 done; the last step wants the 3 that can serve; p3 does not serve
    # anyway (un-Ready) so it is asked at no cost, p1 after it
    assert world.annotated() == ["p0", "p3"]


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
    # The annotations go in batches (was: all at once): a pod not serving next at once, the others
    # at most max(1, 25%) at a time, so that a pod serves throughout
    for _ in range(len(world.pods)):
        if not world.annotated():
            break
        assert world.last is not None and world.last.progressing.reason == cond.IN_PLACE_ROLLING_BACK
        before = len(world.annotated())
        world.run()
        assert before - len(world.annotated()) <= max(1, len(world.pods) // 4)
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
    world = World([{"setWeight": 50}], pods=tuple(f"p{i}" for i in range(8)))  # was 4: asks 2 at once
    world.stuck = {"p0"}
    world.run()
    del world.pods["p0"]
    world.run()
    rolled_back(world, cond.IN_PLACE_POD_LOST)


def test_a_newer_spec_rolls_the_update_in_progress_back_first() -> None:
    world = World([{"setWeight": 50}, {"pause": {}}])
    world.run()
    world.run()  # p0 and p1 serve next; the pause holds
    world.run(replaced_by="newer")
    # Was: rolled back in full before the newer revision started. Now the newer spec wins as soon
    # as no pod is asked for next any more: the pods go back in batches (1 of 4 at a time)
    plan = world.last
    assert plan is not None and plan.state is not None and plan.state.rolling_back == cond.ABORTED
    assert world.annotated() == ["p1"] and plan.progressing.reason == cond.IN_PLACE_ROLLING_BACK
    assert "revision newer starts once no pod is asked for next any more" in plan.progressing.message
    assert any("replaced by revision newer" in m for _, m in world.events)
    plan = world.run(replaced_by="newer")
    assert world.annotated() == []
    plan = world.run(replaced_by="newer")  # no pod asked: the newer revision may start
    assert plan.state is not None and plan.state.next is None and plan.state.rolling_back is None
    assert cond.IN_PLACE_ROLLED_BACK in world.reasons()


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


# ---------------------------------------------------------------- spec.rollout.analysis, as for a canary

ANALYSED = {"intervalSeconds": 5, "minRequests": 10}


def verdict(world: World, outcome: AnalysisVerdict, window: float = 30) -> AnalysisResult:
    """The verdict reconcile.analysis would hand over for the world's current sides."""
    sides = analysis_sides(world.state, list(world.pods.values()), ("add",))
    assert sides is not None, "nothing is judged now"
    return AnalysisResult(
        revision=sides.revision, weight=sides.weight, verdict=outcome, window_seconds=window
    )


def analysed(*steps: dict[str, Any], **analysis: Any) -> World:
    return World(steps, analysis={**ANALYSED, **analysis})


def test_the_first_step_is_not_judged_and_the_next_waits_for_a_reading() -> None:
    world = analysed({"setWeight": 25}, {"setWeight": 50})
    world.run()  # step 0 asks its pod: nothing updated yet, nothing to judge (a canary at weight 0)
    assert world.annotated() == ["p0"]
    plan = world.run()  # p0 on next: step 0 done; step 1 would ask more: it waits for the analysis
    assert world.annotated() == ["p0"]
    assert plan.progressing.reason == cond.WAITING_FOR_ANALYSIS
    assert "waiting for the first reading" in plan.progressing.message
    assert plan.requeue_after == 5.0  # judged at the analysis' interval
    world.analysis = verdict(world, PASSED)
    world.run()
    assert world.annotated() == ["p0", "p1"]
    assert cond.ANALYSIS_PASSED in world.reasons()
    assert world.last is not None and [r.verdict for r in world.last.analysis_runs] == ["Passed"]


@pytest.mark.parametrize(
    ("steps", "before"),
    [
        # failed while the step's pods are held by a pause step
        ([{"setWeight": 50}, {"pause": {}}], ["p0", "p1"]),
        # failed at the gate before the next setWeight
        ([{"setWeight": 25}, {"setWeight": 75}], ["p0"]),
        # failed at the gate before the last step (every pod)
        ([{"setWeight": 50}], ["p0", "p1"]),
        # no pod left on the stable revision (setWeight 100, then a pause): judged as a canary at 100
        ([{"setWeight": 100}, {"pause": {}}], list(PODS)),
    ],
)
def test_a_failed_analysis_rolls_back_in_place_on_every_updated_pod(
    steps: list[dict[str, Any]], before: list[str]
) -> None:
    world = analysed(*steps)
    world.settle()  # was two passes: pods are asked in batches now
    assert world.annotated() == before
    world.analysis = dataclasses.replace(verdict(world, FAILED), window_seconds=40)
    world.run()
    rolled_back(world, cond.ANALYSIS_FAILED)
    detail = world.last.degraded.message if world.last else ""
    assert "analysis failed after 40s" in detail
    aborted = [m for r, m in world.events if r == cond.ROLLOUT_ABORTED]
    assert aborted and "analysis failed after 40s" in aborted[0]


def test_a_verdict_of_other_sides_is_not_this_steps() -> None:
    world = analysed({"setWeight": 25}, {"setWeight": 50})
    world.run()
    world.run()
    world.analysis = dataclasses.replace(verdict(world, FAILED), weight=50)  # another share of the pods
    plan = world.run()
    assert plan.state is not None and plan.state.rolling_back is None
    assert world.annotated() == ["p0"] and plan.progressing.reason == cond.WAITING_FOR_ANALYSIS
    world.analysis = dataclasses.replace(verdict(world, PASSED), revision="other")
    world.run()
    assert world.annotated() == ["p0"]


@pytest.mark.parametrize(
    ("policy", "reason", "pause"),
    [("Abort", cond.ANALYSIS_INCONCLUSIVE, False), ("Pause", None, True), ("Wait", None, False)],
)
def test_too_little_traffic_follows_on_inconclusive(policy: str, reason: str | None, pause: bool) -> None:
    world = analysed({"setWeight": 25}, {"setWeight": 50}, onInconclusive=policy, inconclusiveAfterSeconds=60)
    world.run()
    world.run()
    world.analysis = verdict(world, INCONCLUSIVE, window=59)
    plan = world.run()
    assert plan.state is not None and plan.state.rolling_back is None and not plan.pause
    world.analysis = verdict(world, INCONCLUSIVE, window=60)
    plan = world.run()
    assert plan.pause is pause
    assert (cond.ANALYSIS_INCONCLUSIVE in world.reasons()) is pause
    if reason is not None:
        rolled_back(world, reason)
    else:
        assert plan.state is not None and plan.state.rolling_back is None
        assert world.annotated() == ["p0"]


def test_a_promote_request_goes_on_without_the_analysis() -> None:
    world = analysed({"setWeight": 25}, {"setWeight": 50})
    world.run()
    world.run()
    world.run(InPlaceRequests(promote=True))
    for _ in range(2):  # every pod, in batches (was: at once), none held by the analysis
        assert world.last is not None and world.last.progressing.reason == cond.IN_PLACE_UPDATING
        world.run()
    assert world.annotated() == list(PODS)


def test_at_the_last_step_every_pod_completes_without_a_pass_as_a_canary_at_100() -> None:
    """No pod is left on the stable revision to compare with: the rollout completes once every pod
    has loaded it (a canary's promotion at weight 100 does not wait for a pass either); a failed
    verdict in the meantime still rolls back (the test above)."""
    world = analysed({"setWeight": 100})
    world.settle()  # was one pass: in batches now
    plan = world.run()
    assert plan.state is not None and plan.state.stable == N and plan.state.next is None


@pytest.mark.parametrize(
    ("asked", "agents", "expected"),
    [
        ((), {}, None),  # nothing asked yet
        (("p0",), {"p0": on(N)}, AnalysisSides(N, ("p0",), ("p1", "p2", "p3"))),
        (("p0", "p1"), {"p0": on(N), "p1": on(S)}, None),  # p1 still loads: the step's window waits
        (("p0",), {"p0": on(N, add="UNAVAILABLE")}, None),  # its changed model not READY
        (PODS, {p: on(N) for p in PODS}, AnalysisSides(N, PODS, ())),
    ],
)
def test_the_sides_an_in_place_analysis_judges(
    asked: tuple[str, ...], agents: dict[str, AgentStatus], expected: AnalysisSides | None
) -> None:
    pods = [HostPod(p, ready=True, agent=agents.get(p, on(S))) for p in PODS]
    state = InPlaceState(host=H, stable=S, next=N, step_index=0, pods=asked)
    assert analysis_sides(state, pods, ("add",)) == expected
    assert analysis_sides(dataclasses.replace(state, rolling_back="x"), pods, ("add",)) is None


@pytest.mark.parametrize(
    ("updated", "baseline", "weight"), [(1, 3, 25), (1, 2, 33), (1, 299, 1), (4, 0, 100)]
)
def test_the_weight_of_the_sides_is_the_share_of_pods_updated(
    updated: int, baseline: int, weight: int
) -> None:
    sides = AnalysisSides(N, tuple(f"u{i}" for i in range(updated)), tuple(f"b{i}" for i in range(baseline)))
    assert sides.weight == weight


@pytest.mark.parametrize(
    "history",
    [
        [{"revision": "a", "inPlaceHost": "h"}],
        [{"revision": "h", "created": "2026-01-01T12:00:00Z"}, {"revision": "a", "inPlaceHost": "h"}],
        [{"revision": "b"}],
    ],
)
def test_history_entries_served_in_place_survive_the_status(history: list[dict[str, Any]]) -> None:
    assert RolloutStatus.from_status({"history": history}).to_status()["history"] == history


# ---------------------------------------------------------------- pods that cannot serve; batches


PENDING = "Pending (Unschedulable: 0/3 nodes are available: 3 Insufficient cpu)"
CRASHING = "CrashLoopBackOff (container tritonserver: back-off 5m0s restarting failed container)"


@pytest.mark.parametrize("problem", [PENDING, CRASHING])
def test_a_pod_that_cannot_serve_is_neither_asked_nor_waited_for_and_is_named(problem: str) -> None:
    """Before: every live pod was waited for (wanted = all of them), so one Pending or crash-looping
    pod held the last step for ever, and its rollback too."""
    world = World()
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False, problem=problem, agent=None)
    world.run()
    plan = world.run()
    assert world.annotated() == ["p0", "p1"]
    assert f"not counted (cannot serve): pod p3: {problem}" in plan.progressing.message
    assert "(3 pods in all)" in plan.progressing.message
    world.settle()
    assert world.state.next is None and world.state.stable == N and "p3" not in world.annotated()
    assert any(r == cond.ROLLOUT_COMPLETED and "all 3 pods" in m for r, m in world.events)


@pytest.mark.parametrize("problem", [PENDING, CRASHING])
def test_a_rollback_clears_with_a_pod_that_cannot_serve(problem: str) -> None:
    world = World([{"setWeight": 50}, {"pause": {}}])
    world.run()
    world.run()
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False, problem=problem, agent=None)
    world.run(InPlaceRequests(abort=True))
    assert world.last is not None and f"pod p3: {problem}" in world.last.progressing.message
    rolled_back(world, cond.ABORTED)


def test_an_abort_while_rolling_back_is_acknowledged() -> None:
    world = World([{"setWeight": 50}, {"pause": {}}])
    world.run()
    world.run()
    world.run(InPlaceRequests(abort=True))
    plan = world.run(InPlaceRequests(abort=True))
    assert plan.state is not None and plan.state.rolling_back == cond.ABORTED
    acknowledged = [m for r, m in world.events if r == cond.ABORTED]
    assert acknowledged and "already rolling back" in acknowledged[0]


def test_a_pod_asked_that_starts_crash_looping_rolls_back_and_is_named() -> None:
    world = World([{"setWeight": 50}])
    world.stuck = {"p0"}
    world.run()
    world.pods["p0"] = dataclasses.replace(world.pods["p0"], ready=False, problem=CRASHING)
    world.run()
    assert world.last is not None and world.last.state is not None
    # the others serve the stable revision: rolled back at once, p0 not waited for
    assert world.last.state.next is None and world.last.state.aborted_reason == cond.IN_PLACE_POD_LOST
    assert f"pod p0: {CRASHING}" in world.last.degraded.message
    assert world.annotated() == []


def test_a_pod_that_starts_serving_mid_update_is_asked_too() -> None:
    world = World()
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False, problem=PENDING, agent=None)
    world.run()
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=True, problem=None, agent=on(S))
    world.settle()
    assert world.state.stable == N
    assert any(r == cond.ROLLOUT_COMPLETED and "all 4 pods" in m for r, m in world.events)
    assert world.pods["p3"].agent is not None and world.pods["p3"].agent.revision == N


@pytest.mark.parametrize(
    ("servable", "batch"), [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1), (7, 1), (8, 2), (12, 3), (100, 25)]
)
def test_at_most_a_quarter_of_the_pods_reload_at_once_and_never_all(servable: int, batch: int) -> None:
    assert batch_size(servable) == batch


@pytest.mark.parametrize("pods", [2, 3, 5, 9])
@pytest.mark.parametrize("steps", [(), ({"setWeight": 50},), ({"setWeight": 100},)])
def test_reloading_pods_leave_the_service_but_one_always_serves(
    pods: int, steps: tuple[dict[str, Any], ...]
) -> None:
    """Each pod is un-Ready while it reloads: a step's count does not shrink for it, no more than a
    batch reload at once, and at every pass a pod serves (Ready)."""
    world = World(steps, pods=tuple(f"p{i}" for i in range(pods)))
    world.slow = True
    for _ in range(6 * pods):
        if world.state.next is None:
            break
        world.run()
        unready = [n for n, p in world.pods.items() if not p.ready]
        assert len(unready) <= max(1, pods // 4) and len(unready) < pods, unready
    assert world.state.next is None and world.state.stable == N
    assert all(p.ready and p.agent is not None and p.agent.revision == N for p in world.pods.values())


def test_a_rollback_moves_the_pods_back_in_batches_too() -> None:
    world = World(pods=tuple(f"p{i}" for i in range(4)))
    world.slow = True
    for _ in range(8):  # every pod serves next (the last step), then an abort
        world.run()
        if world.annotated() == list(PODS) and all(p.ready for p in world.pods.values()):
            break
    world.state = dataclasses.replace(world.state, step_index=0)  # held before completing
    world.run(InPlaceRequests(abort=True))
    for _ in range(12):
        unready = [n for n, p in world.pods.items() if not p.ready]
        assert len(unready) <= 1, unready
        if world.state.next is None:
            break
        world.run()
    assert world.state.next is None and world.state.aborted_revision == N
    assert all(p.agent is not None and p.agent.revision == S for p in world.pods.values())


def test_the_deadline_counts_from_the_last_batch_asked() -> None:
    """Batches in a row (one of 4 pods at a time) each taking 400 s of a 600 s deadline: progress
    each time, no rollback (the deadline of a Deployment's progressDeadlineSeconds, per batch)."""
    world = World()
    for _ in range(12):
        if world.state.next is None:
            break
        world.stuck = set(world.annotated()[-1:])
        world.run()
        world.now += datetime.timedelta(seconds=400)
        world.stuck = set()
        world.run()
    assert world.state.next is None and world.state.stable == N
    assert cond.ROLLOUT_ABORTED not in world.reasons()


def test_a_pod_never_asked_and_un_ready_holds_no_rollback() -> None:
    world = World([{"setWeight": 50}, {"pause": {}}])
    world.settle()
    assert world.annotated() == ["p0", "p1"]
    unread = AgentStatus(error="timed out")
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], ready=False, agent=unread)
    world.run(InPlaceRequests(abort=True))
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], agent=AgentStatus(error="timed out"))
    assert world.last is not None and "pod p3" not in world.last.progressing.message
    plan = world.run()  # p0 back (p1 serves next, held: at most 1 reloading); p3 no business of it
    assert plan.progressing.reason == cond.IN_PLACE_ROLLING_BACK and "pod p3" not in plan.progressing.message
    assert "1/2 pods asked of revision host serve revision host again" in plan.progressing.message
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], agent=AgentStatus(error="timed out"))
    world.run()
    world.pods["p3"] = dataclasses.replace(world.pods["p3"], agent=AgentStatus(error="timed out"))
    plan = world.run()
    assert plan.state is not None and plan.state.next is None and world.annotated() == []

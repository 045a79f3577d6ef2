"""Tests of the pure rollout engine: replica maths, step chains, aborts, undo, budget, restart safety."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from testkit import REPO
from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.replicas import canary_replicas, gpu_split
from triton_operator.core.rollout.requests import (
    Action,
    ControlRequest,
    control_annotations,
    parse_control_requests,
    pending_requests,
    request_revision,
)
from triton_operator.core.rollout.state import HistoryEntry, RevisionState, RolloutStatus
from triton_operator.core.rollout.texts import describe_step
from triton_operator.core.vocabulary.conditions import Verdict
from triton_operator.models import Rollout

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def make_rollout(**spec: Any) -> Rollout:
    """A Rollout from its wire form (camelCase), as the API server hands it over."""
    return Rollout.model_validate(spec)


CHAIN = [{"setWeight": 10}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50}, {"pause": {}}]


def ready_state(n: int) -> RevisionState:
    return RevisionState(spec_replicas=n, replicas=n, ready_replicas=n, available_replicas=n, pods=n)


@dataclasses.dataclass
class Sim:
    """A fake cluster driven by the plans; every plan is checked for restart safety on the way."""

    rollout: Rollout
    replicas: int = 4
    gpus: int = 0
    desired: str = "A"
    now: datetime = T0
    status: RolloutStatus = dataclasses.field(default_factory=RolloutStatus)
    cluster: dict[str, RevisionState] = dataclasses.field(default_factory=dict)
    never_ready: set[str] = dataclasses.field(default_factory=set)
    crashing: set[str] = dataclasses.field(default_factory=set)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    lag: bool = False
    """Scaled-down pods terminate one reconcile later (they still hold GPUs meanwhile)."""
    tuning: int = 0
    """Pods of a tuning sweep (kubectl triton tune) that hold GPUs of the budget."""
    plans: list[RolloutPlan] = dataclasses.field(default_factory=list)

    def input(self) -> RolloutInput:
        return RolloutInput(
            rollout=self.rollout,
            replicas=self.replicas,
            desired_revision=self.desired,
            now=self.now,
            status=self.status,
            revisions=dict(self.cluster),
            gpus_per_pod=self.gpus,
            requests=parse_control_requests(self.annotations),
            tuning_pods=self.tuning,
        )

    def plan(self) -> RolloutPlan:
        inp = self.input()
        plan = plan_rollout(inp)
        # Restart safety: the status goes through JSON as it does through the API server, and a
        # second call with it and the same observations takes no new step.
        status = RolloutStatus.from_status(json.loads(json.dumps(plan.status.to_status())))
        assert status == plan.status
        again = plan_rollout(dataclasses.replace(inp, status=status))
        assert again.status == plan.status
        assert again.events == ()
        assert again.replicas == plan.replicas
        assert again.delete == plan.delete
        assert again.weights == plan.weights
        assert again.header_route == plan.header_route
        assert again.conditions == plan.conditions
        assert again.requeue_after == plan.requeue_after
        self.status = status
        self.plans.append(plan)
        return plan

    def apply(self, plan: RolloutPlan) -> None:
        for revision in plan.delete:
            self.cluster.pop(revision, None)
        for revision, n in plan.replicas.items():
            old = self.cluster.get(revision)
            pods = n
            if self.lag and old is not None and old.spec_replicas > n:
                pods = max(n, old.pods or 0)
            self.cluster[revision] = RevisionState(
                spec_replicas=n,
                replicas=n,
                ready_replicas=0 if revision in self.never_ready else n,
                available_replicas=0 if revision in self.never_ready else n,
                pods=pods,
                crash_looping=revision in self.crashing,
            )
        budget = self.rollout.gpu_budget
        if budget is not None and self.gpus > 0:
            held = sum(state.gpu_pods for state in self.cluster.values()) + self.tuning
            assert held * self.gpus <= budget, f"{held} pods of {self.gpus} GPUs over a budget of {budget}"

    def terminate(self) -> None:
        for revision, state in self.cluster.items():
            self.cluster[revision] = dataclasses.replace(state, pods=state.spec_replicas)

    def reconcile(self, after: float = 0) -> RolloutPlan:
        """One reconcile: plan on what is there (pods a previous scale-down left still terminating), apply."""
        self.now += timedelta(seconds=after)
        plan = self.plan()
        self.terminate()
        self.apply(plan)
        return plan

    def request(self, action: Action, to_revision: str | None = None, *, revision: str | None = None) -> None:
        request_id = self.now.isoformat()
        made_for = {"revision": revision} if revision else {}  # (unset: as a request made without one)
        for key, value in control_annotations(action, request_id, to_revision, **made_for).items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value


def reasons(plan: RolloutPlan) -> list[str]:
    return [e.reason for e in plan.events]


def cond(plan: RolloutPlan, condition_type: str) -> tuple[str, str]:
    c = plan.condition(condition_type)
    assert c is not None
    return c.status, c.reason


def deployed(rollout: Rollout, replicas: int = 4, **kw: Any) -> Sim:
    """A sim with revision A stable and Ready, then asked to serve B."""
    sim = Sim(rollout=rollout, replicas=replicas, **kw)
    sim.reconcile()
    sim.reconcile()
    sim.desired = "B"
    return sim


# ----------------------------------------------------------------- replica maths


@pytest.mark.parametrize(
    ("replicas", "weight", "expected"),
    [
        (0, 0, 0),
        (0, 50, 0),
        (0, 100, 0),
        (1, 0, 0),
        (1, 1, 1),
        (1, 10, 1),
        (1, 50, 1),
        (1, 100, 1),
        (3, 0, 0),
        (3, 1, 1),
        (3, 10, 1),
        (3, 33, 1),
        (3, 34, 2),
        (3, 50, 2),
        (3, 66, 2),
        (3, 67, 3),
        (3, 100, 3),
        (4, 25, 1),
        (4, 26, 2),
        (10, 10, 1),
        (10, 11, 2),
        (10, 15, 2),
        (10, 90, 9),
        (10, 91, 10),
        (10, 99, 10),
        (1000, 1, 10),
        (7, 50, 4),
    ],
)
def test_canary_replicas_is_the_ceiling_of_the_share(replicas: int, weight: int, expected: int) -> None:
    assert canary_replicas(replicas, weight) == expected


@pytest.mark.parametrize(("replicas", "weight"), [(3, -1), (3, 101), (-1, 10)])
def test_canary_replicas_rejects_out_of_range(replicas: int, weight: int) -> None:
    with pytest.raises(ValueError):
        canary_replicas(replicas, weight)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        # no budget, or no GPUs: the canary adds on top
        ((4, 1, 1, None, ready_state(4), None, 0), (4, 1, 4, 1, False)),
        ((4, 1, 0, 2, ready_state(4), None, 0), (4, 1, 4, 1, False)),
        # budget large enough: nothing changes
        ((4, 1, 1, 5, ready_state(4), None, 0), (4, 1, 4, 1, False)),
        ((4, 2, 2, 12, ready_state(4), None, 0), (4, 2, 4, 2, False)),
        # budget of exactly replicas: stable gives one pod first, canary waits for its GPU
        ((4, 1, 1, 4, ready_state(4), None, 0), (3, 0, 3, 1, False)),
        ((4, 1, 1, 4, ready_state(3), None, 0), (3, 1, 3, 1, False)),
        # 2 GPUs per pod, budget 9 -> 4 pods
        ((4, 2, 2, 9, ready_state(4), None, 0), (2, 0, 2, 2, False)),
        ((4, 2, 2, 9, ready_state(2), ready_state(0), 0), (2, 2, 2, 2, False)),
        # stable pods still terminating hold their GPUs: the canary waits
        (
            (4, 2, 1, 4, RevisionState(spec_replicas=2, replicas=2, ready_replicas=2, pods=4), None, 0),
            (2, 0, 2, 2, False),
        ),
        # promotion (goal = replicas) under a budget of replicas + 0: canary stops at r - 1
        ((4, 4, 1, 4, ready_state(1), ready_state(1), 0), (1, 3, 1, 3, False)),
        # one spare pod: stable 4 -> the canary may use 1 at a time beside stable
        ((4, 4, 1, 5, ready_state(4), None, 0), (1, 1, 1, 4, False)),
        # budget too small for one canary pod beside a serving stable
        ((1, 1, 1, 1, ready_state(1), None, 0), (1, 0, 1, 0, True)),
        ((4, 1, 1, 2, ready_state(4), None, 0), (4, 0, 4, 0, True)),
        # other revisions' pods (a deleted canary still terminating) count against the budget
        ((4, 1, 1, 5, ready_state(4), None, 1), (4, 0, 4, 1, False)),
        # a single revision alone is never capped below replicas
        ((4, 0, 1, 2, ready_state(0), None, 0), (4, 0, 4, 0, False)),
        # after an abort: stable grows back as the canary's pods go
        ((4, 0, 1, 4, ready_state(2), RevisionState(spec_replicas=0, pods=2), 0), (2, 0, 4, 0, False)),
        ((4, 0, 1, 4, ready_state(2), RevisionState(spec_replicas=0, pods=0), 0), (4, 0, 4, 0, False)),
    ],
)
def test_gpu_split(case: tuple[Any, ...], expected: tuple[int, int, int, int, bool]) -> None:
    replicas, goal, gpus, budget, stable, canary, other = case
    split = gpu_split(replicas, goal, gpus, budget, stable=stable, canary=canary, other_pods=other)
    assert (split.stable, split.canary, split.stable_goal, split.canary_goal, split.too_small) == expected


# ----------------------------------------------------------------- first deploy and steady state


def test_first_deploy_is_stable_at_once_at_full_replicas() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN), replicas=3)
    plan = sim.reconcile()
    assert plan.replicas == {"A": 3}
    assert plan.status.stable_revision == "A"
    assert plan.status.canary_revision is None
    assert plan.weights == TrafficWeights(100, 0)
    assert reasons(plan) == []  # the first revision replaces nothing: no Event (RevisionServed comes later)
    assert cond(plan, "Progressing") == ("True", "WaitingForStableReady")
    assert plan.stable_service_revision == plan.canary_service_revision == "A"


def test_steady_state_does_nothing() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN), replicas=3)
    sim.reconcile()
    for after in (0, 60, 3600):
        plan = sim.reconcile(after)
        assert plan.replicas == {"A": 3}
        assert plan.delete == ()
        assert plan.events == ()
        assert plan.requeue_after is None
        assert cond(plan, "Progressing") == ("False", "RolloutCompleted")
        assert cond(plan, "Degraded") == ("False", "AsExpected")


def test_steady_state_deletes_strays_but_keeps_history() -> None:
    status = RolloutStatus(stable_revision="A", history=(HistoryEntry("H"),))
    plan = plan_rollout(
        RolloutInput(
            rollout=make_rollout(),
            replicas=2,
            desired_revision="A",
            now=T0,
            status=status,
            revisions={"A": ready_state(2), "H": ready_state(0), "X": ready_state(1)},
        )
    )
    assert plan.replicas == {"A": 2, "H": 0}
    assert plan.delete == ("X",)


# ----------------------------------------------------------------- the full canary chain


def test_canary_chain_10_pause60_50_pause_promote() -> None:
    sim = deployed(make_rollout(steps=CHAIN, progressDeadlineSeconds=600), replicas=4)

    p = sim.reconcile()  # the canary starts at step 0: setWeight 10 -> 1 pod
    assert p.replicas == {"A": 4, "B": 1}
    assert p.weights == TrafficWeights(100, 0)
    assert (p.status.canary_revision, p.status.current_step_index, p.status.canary_weight) == ("B", 0, 0)
    assert p.status.step_started_at == T0
    assert p.status.waiting_since == T0
    assert reasons(p) == ["RolloutStarted"]
    assert cond(p, "Progressing") == ("True", "NewRevision")
    assert p.requeue_after == 600
    assert (p.stable_service_revision, p.canary_service_revision) == ("A", "B")

    p = sim.reconcile(5)  # 1 canary pod Ready: weight 10, then the 60s pause starts
    assert p.replicas == {"A": 4, "B": 1}
    assert p.weights == TrafficWeights(90, 10)
    assert (p.status.current_step_index, p.status.canary_weight) == (1, 10)
    assert p.status.step_started_at == T0 + timedelta(seconds=5)
    assert p.status.waiting_since is None
    assert reasons(p) == ["StepCompleted"]
    assert "step 0/4 (setWeight 10)" in p.events[0].message
    assert cond(p, "Progressing") == ("True", "StepPaused")
    assert p.requeue_after == 60

    p = sim.reconcile(30)  # half-way through the pause: nothing moves
    assert p.events == ()
    assert p.status.current_step_index == 1
    assert p.requeue_after == 30

    p = sim.reconcile(30)  # pause over: setWeight 50 -> 2 pods; weight stays 10 until they are Ready
    assert p.replicas == {"A": 4, "B": 2}
    assert p.weights == TrafficWeights(90, 10)
    assert (p.status.current_step_index, p.status.canary_weight) == (2, 10)
    assert reasons(p) == ["StepCompleted"]
    assert cond(p, "Progressing") == ("True", "WaitingForCanaryReady")
    assert p.requeue_after == 600

    p = sim.reconcile(10)  # 2 Ready: weight 50, then pause{} holds
    assert p.replicas == {"A": 4, "B": 2}
    assert p.weights == TrafficWeights(50, 50)
    assert (p.status.current_step_index, p.status.canary_weight) == (3, 50)
    assert cond(p, "Progressing") == ("False", "StepPaused")
    assert p.requeue_after is None

    p = sim.reconcile(100_000)  # an indefinite pause waits, however long, and never aborts
    assert p.events == ()
    assert p.status.current_step_index == 3
    assert cond(p, "Degraded") == ("False", "AsExpected")

    sim.request("promote")
    p = sim.reconcile(1)  # promote: last step done, canary to full replicas, stable untouched
    assert p.replicas == {"A": 4, "B": 4}
    assert p.weights == TrafficWeights(50, 50)
    assert p.status.promoting is True
    assert p.status.current_step_index == 4
    assert reasons(p) == ["StepCompleted", "RolloutPromoting"]
    assert "by promote request" in p.events[0].message
    assert cond(p, "Progressing") == ("True", "Promoting")
    assert p.status.handled_requests["promote"] == sim.annotations["triton-operator.io/promote"]

    p = sim.reconcile(10)  # fully Ready: flip; the old stable goes to 0 and into history
    assert p.replicas == {"B": 4, "A": 0}
    assert p.weights == TrafficWeights(100, 0)
    assert p.status.stable_revision == "B"
    assert p.status.canary_revision is None
    assert p.status.current_step_index is None
    assert p.status.history == (HistoryEntry("A", "2026-01-01T12:00:00Z"),)
    assert reasons(p) == ["RolloutCompleted"]
    assert cond(p, "Progressing") == ("False", "RolloutCompleted")
    assert (p.stable_service_revision, p.canary_service_revision) == ("B", "B")

    p = sim.reconcile(10)
    assert p.events == ()
    assert p.replicas == {"B": 4, "A": 0}

    # The stable revision was never scaled down before the flip.
    flip = next(i for i, plan in enumerate(sim.plans) if "RolloutCompleted" in reasons(plan))
    for plan in sim.plans[2:flip]:
        assert plan.replicas["A"] == 4


def test_a_timed_pause_past_any_date_from_an_old_object_neither_crashes_nor_ends() -> None:
    """Issue 22 item 11: durationSeconds 3e11 (stored before the schema's bound) raised
    OverflowError on every reconcile, freezing the service. The engine takes it as a pause
    that ends past any calendar date."""
    huge = 300_000_000_000
    steps = [{"setWeight": 10}, {"pause": {"durationSeconds": 60}}]
    rollout = make_rollout(steps=steps)
    stored = rollout.steps[1].pause
    assert stored is not None
    old = stored.model_copy(update={"duration_seconds": huge})  # unvalidated, as stored before the bound
    rollout = rollout.model_copy(
        update={"steps": [rollout.steps[0], rollout.steps[1].model_copy(update={"pause": old})]}
    )
    sim = deployed(rollout)
    sim.reconcile()
    p = sim.reconcile(1)
    assert p.status.current_step_index == 1
    progressing = p.condition("Progressing")
    assert progressing is not None and progressing.reason == "StepPaused"
    assert "pause 300000000000s): paused past any calendar date" in progressing.message
    assert p.requeue_after is not None and p.requeue_after > 0
    assert sim.reconcile(10**8).status.current_step_index == 1  # three years on: still paused
    sim.request("promote")
    assert sim.reconcile(1).status.promoting


def test_promote_request_is_applied_once() -> None:
    sim = deployed(make_rollout(steps=[{"pause": {}}, {"pause": {}}, {"pause": {}}]))
    sim.reconcile()
    sim.request("promote")
    assert sim.reconcile().status.current_step_index == 1
    for _ in range(3):
        assert sim.reconcile(5).status.current_step_index == 1
    sim.request("promote")
    assert sim.reconcile().status.current_step_index == 2


def test_promote_made_while_nothing_runs_does_not_skip_a_later_step() -> None:
    sim = Sim(rollout=make_rollout(steps=[{"pause": {}}, {"setWeight": 50}]))
    sim.reconcile()
    sim.request("promote")
    sim.reconcile()
    sim.desired = "B"
    p = sim.reconcile()
    assert p.status.current_step_index == 0


def test_promote_full_jumps_to_promotion_but_waits_for_ready() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.never_ready.add("B")
    sim.request("promote-full")
    p = sim.reconcile(1)
    assert p.status.promoting is True
    assert p.replicas == {"A": 4, "B": 4}
    p = sim.reconcile(10)
    assert p.status.stable_revision == "A"  # not Ready: no flip
    sim.never_ready.clear()
    sim.apply(p)
    p = sim.reconcile(10)
    assert p.status.stable_revision == "B"


def test_empty_steps_promote_when_the_canary_is_fully_ready() -> None:
    sim = deployed(make_rollout(steps=[]), replicas=3)
    p = sim.reconcile()
    assert p.replicas == {"A": 3, "B": 3}
    assert p.status.promoting is True
    assert p.weights == TrafficWeights(100, 0)
    p = sim.reconcile(20)
    assert p.status.stable_revision == "B"
    assert p.replicas == {"B": 3, "A": 0}


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_weight_steps_with_equal_pod_counts_complete_in_one_reconcile(replicas: int) -> None:
    sim = deployed(
        make_rollout(steps=[{"setWeight": 10}, {"setWeight": 20}, {"pause": {}}]), replicas=replicas
    )
    sim.reconcile()
    p = sim.reconcile(1)
    # ceil(r*0.1) == ceil(r*0.2) for these r: both weight steps complete on the same observation.
    assert p.status.current_step_index == 2
    assert p.status.canary_weight == 20
    assert reasons(p) == ["StepCompleted", "StepCompleted"]


def test_a_lower_weight_lowers_traffic_when_the_step_starts() -> None:
    sim = deployed(make_rollout(steps=[{"setWeight": 50}, {"setWeight": 20}, {"pause": {}}]), replicas=10)
    sim.reconcile()
    p = sim.reconcile(1)
    assert p.status.current_step_index == 1
    assert p.weights == TrafficWeights(80, 20)  # before the canary shrinks to 2 pods
    assert p.replicas["B"] == 2
    p = sim.reconcile(1)
    assert p.status.current_step_index == 2
    assert p.weights == TrafficWeights(80, 20)


def test_timed_pause_requeues_for_the_remaining_time() -> None:
    sim = deployed(make_rollout(steps=[{"pause": {"durationSeconds": 90}}, {"pause": {}}]))
    p = sim.reconcile()
    assert p.status.current_step_index == 0
    assert p.requeue_after == 90
    assert sim.reconcile(40).requeue_after == 50
    p = sim.reconcile(50)
    assert p.status.current_step_index == 1


def test_steps_shortened_mid_rollout_go_to_promotion() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.reconcile(1)
    sim.reconcile(60)
    sim.reconcile(1)  # at step 3
    assert sim.status.current_step_index == 3
    sim.rollout = make_rollout(steps=CHAIN[:1])
    p = sim.reconcile(1)
    assert p.status.promoting is True
    assert p.replicas["B"] == 4


# ----------------------------------------------------------------- automatic rollback


def test_never_ready_canary_rolls_back_at_the_deadline_with_stable_untouched() -> None:
    sim = deployed(make_rollout(steps=CHAIN, progressDeadlineSeconds=600), replicas=4)
    sim.never_ready.add("B")
    p = sim.reconcile()
    for after, left in ((100, 500), (200, 300), (299, 1)):
        p = sim.reconcile(after)
        assert p.replicas == {"A": 4, "B": 1}
        assert p.weights == TrafficWeights(100, 0)
        assert p.events == ()
        assert p.requeue_after == left
        assert cond(p, "Degraded") == ("False", "AsExpected")
    p = sim.reconcile(1)  # 600s
    assert p.replicas == {"A": 4, "B": 0}
    assert p.delete == ()
    assert p.weights == TrafficWeights(100, 0)
    assert p.status.canary_revision is None
    assert p.status.aborted_revision == "B"
    assert p.status.aborted_step_index == 0
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "RolloutAborted")]
    degraded = p.condition("Degraded")
    assert degraded is not None
    assert (degraded.status, degraded.reason) == ("True", "ProgressDeadlineExceeded")
    assert "step 0" in degraded.message
    assert cond(p, "Progressing") == ("False", "RolloutAborted")
    assert p.requeue_after is None
    # The same revision is not retried in a loop.
    for after in (10, 600, 6000):
        p = sim.reconcile(after)
        assert p.replicas == {"A": 4, "B": 0}
        assert p.events == ()
        assert cond(p, "Degraded") == ("True", "ProgressDeadlineExceeded")


@pytest.mark.parametrize("fail_at", [0, 2])
def test_deadline_names_the_step_it_failed_at(fail_at: int) -> None:
    sim = deployed(make_rollout(steps=CHAIN, progressDeadlineSeconds=600), replicas=4)
    sim.reconcile()
    if fail_at == 2:
        sim.reconcile(1)  # step 0 done
        sim.never_ready.add("B")
        p = sim.reconcile(60)  # pause done -> step 2 waits for 2 pods that never get Ready
        assert p.status.current_step_index == 2
    else:
        sim.never_ready.add("B")
        sim.apply(sim.plans[-1])
    p = sim.reconcile(599)
    assert p.status.aborted_revision is None
    p = sim.reconcile(1)
    assert p.status.aborted_step_index == fail_at
    degraded = p.condition("Degraded")
    assert degraded is not None
    assert f"aborted at step {fail_at}:" in degraded.message
    assert "stable revision A serves all traffic" in degraded.message


def test_a_pod_dying_during_a_long_pause_gets_the_full_deadline() -> None:
    sim = deployed(
        make_rollout(
            steps=[{"setWeight": 50}, {"pause": {"durationSeconds": 7200}}, {"pause": {}}],
            progressDeadlineSeconds=600,
        )
    )
    sim.reconcile()
    sim.reconcile(1)  # step 1: long pause
    sim.reconcile(3000)
    sim.never_ready.add("B")
    sim.cluster["B"] = dataclasses.replace(sim.cluster["B"], ready_replicas=1)
    p = sim.reconcile(1)
    assert p.status.waiting_since == sim.now
    assert p.status.aborted_revision is None
    p = sim.reconcile(599)
    assert p.status.aborted_revision is None
    p = sim.reconcile(1)
    assert p.status.aborted_revision == "B"
    assert p.status.aborted_step_index == 1


def test_crash_looping_canary_aborts_at_once() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.crashing.add("B")
    sim.apply(sim.plans[-1])
    p = sim.reconcile(1)
    assert p.status.aborted_revision == "B"
    assert cond(p, "Degraded") == ("True", "CanaryCrashLooping")
    assert p.replicas == {"A": 4, "B": 0}
    assert "crash-looping" in p.events[0].message


def test_a_canary_whose_sync_fails_aborts_with_the_sync_s_reason() -> None:
    reason = (
        "the model repository needs 2.4 GiB (2576986112 bytes), /models has 1.1 GiB (1181116006 bytes) free"
    )
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.crashing.add("B")
    sim.apply(sim.plans[-1])
    sim.cluster["B"] = dataclasses.replace(sim.cluster["B"], sync_failure=reason)
    p = sim.reconcile(1)
    assert p.status.aborted_revision == "B"
    degraded = p.condition("Degraded")
    assert degraded is not None and degraded.reason == "CanaryCrashLooping"
    assert f"canary pods are crash-looping: sync: {reason};" in degraded.message
    assert f"sync: {reason}" in p.events[0].message


@pytest.mark.parametrize(
    ("unschedulable_for", "aborts", "requeue"),
    [(0, False, 120.0), (60, False, 60.0), (119, False, 1.0), (120, True, None), (500, True, None)],
)
def test_unschedulable_canary_aborts_after_the_grace(
    unschedulable_for: int, aborts: bool, requeue: float | None
) -> None:
    sim = deployed(make_rollout(steps=CHAIN, progressDeadlineSeconds=3600, unschedulableGraceSeconds=120))
    sim.reconcile()
    sim.reconcile(1000)  # step 0 done, the 60s pause starts
    sim.reconcile(60)  # step 2 waits for 2 pods
    assert sim.status.current_step_index == 2
    since = sim.now
    sim.cluster["B"] = RevisionState(
        spec_replicas=2, replicas=2, ready_replicas=1, pods=2, unschedulable_since=since
    )
    sim.now = since + timedelta(seconds=unschedulable_for)
    p = sim.plan()
    assert (p.status.aborted_revision == "B") is aborts
    if aborts:
        assert cond(p, "Degraded") == ("True", "CanaryUnschedulable")
        assert p.status.aborted_step_index == 2
    else:
        assert p.requeue_after == requeue
        assert p.replicas == {"A": 4, "B": 2}


@pytest.mark.parametrize("at_step", [0, 1, 3])
def test_abort_request_in_the_middle(at_step: int) -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    for after in (1, 60, 1):
        if sim.status.current_step_index == at_step:
            break
        sim.reconcile(after)
    assert sim.status.current_step_index == at_step
    sim.request("abort")
    p = sim.reconcile(1)
    assert p.status.aborted_revision == "B"
    assert p.status.aborted_step_index == at_step
    assert cond(p, "Degraded") == ("True", "Aborted")
    assert p.replicas == {"A": 4, "B": 0}
    assert p.weights == TrafficWeights(100, 0)
    assert p.header_route is None
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "RolloutAborted")]


def test_abort_during_promotion() -> None:
    sim = deployed(make_rollout(steps=[{"setWeight": 50}]))
    sim.reconcile()
    sim.never_ready.add("B")
    sim.request("promote")
    p = sim.reconcile(1)
    assert p.status.promoting
    sim.request("abort")
    p = sim.reconcile(1)
    assert p.status.aborted_step_index == 1
    degraded = p.condition("Degraded")
    assert degraded is not None
    assert "step 1 (promotion)" in degraded.message


def test_retry_restarts_an_aborted_revision_from_step_0() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.request("abort")
    sim.reconcile(1)
    sim.request("retry")
    p = sim.reconcile(1)
    assert p.status.aborted_revision is None
    assert (p.status.canary_revision, p.status.current_step_index) == ("B", 0)
    assert reasons(p) == ["RolloutRetried", "RolloutStarted"]
    assert cond(p, "Degraded") == ("False", "AsExpected")


def test_promote_after_an_abort_retries_without_skipping_a_step() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.request("abort")
    sim.reconcile(1)
    sim.request("promote")
    p = sim.reconcile(1)
    assert (p.status.canary_revision, p.status.current_step_index) == ("B", 0)


def test_a_new_spec_after_an_abort_deletes_the_aborted_revision() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.request("abort")
    sim.reconcile(1)
    sim.desired = "C"
    p = sim.reconcile(1)
    assert p.delete == ("B",)
    assert p.status.aborted_revision is None
    assert p.replicas == {"A": 4, "C": 1}


# ----------------------------------------------------------------- replacing and cancelling


def test_a_third_revision_replaces_the_canary() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.reconcile(1)
    sim.reconcile(60)
    assert sim.status.current_step_index == 2
    sim.desired = "C"
    p = sim.reconcile(1)
    assert p.delete == ("B",)
    assert p.replicas == {"A": 4, "C": 1}
    assert (p.status.canary_revision, p.status.current_step_index, p.status.canary_weight) == ("C", 0, 0)
    assert p.weights == TrafficWeights(100, 0)
    assert reasons(p) == ["CanaryReplaced", "RolloutStarted"]


@pytest.mark.parametrize("made_for", [None, "B"])
@pytest.mark.parametrize(
    ("action", "steps"),
    [
        ("promote", [{"pause": {}}, {"setWeight": 50}]),
        ("promote", [{"setWeight": 50}, {"pause": {}}]),
        ("promote-full", [{"setWeight": 50}, {"pause": {}}]),
        ("abort", [{"setWeight": 50}, {"pause": {}}]),
    ],
)
def test_a_request_made_for_a_canary_never_applies_to_the_one_replacing_it(
    action: Action, steps: list[Any], made_for: str | None
) -> None:
    """Issue 22 item 2: a promote (or abort) made for canary B, taken in the pass where C replaces
    B, must not complete a step of C (which has no pods yet), promote it, or abort it. Made without
    a revision (an old request) it is taken as made for the canary in progress, B."""
    sim = deployed(make_rollout(steps=steps))
    sim.never_ready.add("B")
    sim.reconcile()
    assert (sim.status.canary_revision, sim.status.current_step_index) == ("B", 0)
    sim.request(action, revision=made_for)
    sim.desired = "C"
    p = sim.reconcile(1)
    assert (p.status.canary_revision, p.status.current_step_index, p.status.canary_weight) == ("C", 0, 0)
    assert not p.status.promoting and p.status.aborted_revision is None
    assert p.weights == TrafficWeights(100, 0)
    assert p.replicas == {"A": 4, "C": canary_replicas(4, steps[0].get("setWeight", 0))}
    assert reasons(p) == ["CanaryReplaced", "RolloutStarted"]
    assert f"the {action} request made for it is dropped" in p.events[0].message
    assert p.status.handled_requests[action] == sim.annotations[f"triton-operator.io/{action}"]


@pytest.mark.parametrize("action", ["promote", "promote-full", "abort"])
def test_a_request_made_for_a_revision_not_in_progress_is_ignored_and_says_so(action: Action) -> None:
    sim = deployed(make_rollout(steps=[{"pause": {}}, {"setWeight": 50}]))
    sim.reconcile()
    sim.request(action, revision="Z")
    p = sim.reconcile(1)
    assert (p.status.canary_revision, p.status.current_step_index) == ("B", 0)
    assert not p.status.promoting and p.status.aborted_revision is None
    assert [(e.type, e.reason) for e in p.events] == [("Normal", "RequestIgnored")]
    assert "made for revision Z; revision B is in progress" in p.events[0].message
    sim.request(action, revision="B")  # made for the canary: applies
    p = sim.reconcile(1)
    applied = {
        "promote": (1, False, None),
        "promote-full": (len(sim.rollout.steps), True, None),
        "abort": (None, False, "B"),
    }
    assert (p.status.current_step_index, p.status.promoting, p.status.aborted_revision) == applied[action]


def test_a_promote_on_a_set_weight_step_waits_for_the_canarys_ready_pods() -> None:
    """Issue 22 item 2: a promote on a setWeight step whose pods are not Ready gave the canary the
    step's weight (with Gateway API, 50 % of traffic to a Service with no Ready endpoint)."""
    sim = deployed(make_rollout(steps=[{"setWeight": 50}, {"pause": {}}]))
    sim.never_ready.add("B")
    sim.reconcile()
    sim.request("promote")
    p = sim.reconcile(1)
    assert (p.status.current_step_index, p.status.canary_weight) == (0, 0)
    assert p.weights == TrafficWeights(100, 0)
    assert p.replicas == {"A": 4, "B": 2}
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "RequestIgnored")]
    assert "once 2 of its pods are Ready (0 now)" in p.events[0].message
    sim.never_ready.clear()
    sim.apply(p)
    p = sim.reconcile(1)  # Ready at the weight's replicas: the step completes, the weight follows
    assert (p.status.current_step_index, p.status.canary_weight) == (1, 50)
    assert p.weights == TrafficWeights(50, 50)


@pytest.mark.parametrize("made_for", [None, "B"])
def test_a_promote_made_for_an_aborted_revision_does_not_step_the_next_rollout(made_for: str | None) -> None:
    """Issue 22 item 2, the RolloutStarted side: a promote made for aborted B, taken in the pass
    where a new spec starts C, must not complete C's first step."""
    sim = deployed(make_rollout(steps=[{"pause": {}}, {"setWeight": 50}]))
    sim.reconcile()
    sim.request("abort")
    assert sim.reconcile(1).status.aborted_revision == "B"
    sim.request("promote", revision=made_for)
    sim.desired = "C"
    p = sim.reconcile(1)
    assert (p.status.canary_revision, p.status.current_step_index) == ("C", 0)
    assert reasons(p) == ["RolloutStarted"]


def test_a_promote_made_for_an_aborted_revision_retries_it() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.request("abort", revision="B")
    assert sim.reconcile(1).status.aborted_revision == "B"
    sim.request("promote", revision=request_revision(sim.status.to_status()))
    p = sim.reconcile(1)
    assert (p.status.canary_revision, p.status.current_step_index) == ("B", 0)
    assert reasons(p) == ["RolloutRetried", "RolloutStarted"]


def test_going_back_to_the_stable_revision_cancels_the_canary() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.desired = "A"
    p = sim.reconcile(1)
    assert p.delete == ("B",)
    assert p.replicas == {"A": 4}
    assert p.status.canary_revision is None
    assert reasons(p) == ["RolloutCancelled"]


# ----------------------------------------------------------------- pausing


def test_spec_paused_holds_the_step_and_the_deadline() -> None:
    sim = deployed(make_rollout(steps=CHAIN, progressDeadlineSeconds=100))
    sim.reconcile()
    sim.never_ready.add("B")
    sim.rollout = make_rollout(steps=CHAIN, progressDeadlineSeconds=100, paused=True)
    for after in (50, 500, 5000):
        p = sim.reconcile(after)
        assert p.status.current_step_index == 0
        assert p.status.aborted_revision is None
        assert p.status.waiting_since is None
        assert cond(p, "Progressing") == ("False", "RolloutPaused")
        assert p.requeue_after is None
    sim.rollout = make_rollout(steps=CHAIN, progressDeadlineSeconds=100)
    p = sim.reconcile(1)
    assert p.status.waiting_since == sim.now  # the clock restarts on resume
    assert sim.reconcile(99).status.aborted_revision is None
    assert sim.reconcile(1).status.aborted_revision == "B"


def test_paused_holds_even_a_ready_canary() -> None:
    sim = deployed(make_rollout(steps=CHAIN, paused=True))
    sim.rollout = make_rollout(steps=CHAIN)
    sim.reconcile()
    sim.rollout = make_rollout(steps=CHAIN, paused=True)
    p = sim.reconcile(10)
    assert p.status.current_step_index == 0
    assert p.replicas == {"A": 4, "B": 1}


def test_pause_and_resume_requests() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.request("pause")
    p = sim.reconcile(1)
    assert p.status.paused_by_user is True
    assert p.status.current_step_index == 0
    assert reasons(p) == ["RolloutPaused"]
    p = sim.reconcile(1000)
    assert p.status.current_step_index == 0
    sim.request("resume")
    p = sim.reconcile(1)
    assert p.status.paused_by_user is False
    assert reasons(p) == ["RolloutResumed", "StepCompleted"]


def test_a_paused_service_does_not_start_a_new_canary() -> None:
    sim = deployed(make_rollout(steps=CHAIN, paused=True))
    p = sim.reconcile()
    assert p.replicas == {"A": 4}
    assert p.status.canary_revision is None
    assert cond(p, "Progressing") == ("False", "RolloutPaused")
    sim.rollout = make_rollout(steps=CHAIN)
    assert sim.reconcile().status.canary_revision == "B"


def test_promote_takes_one_step_while_paused_by_request() -> None:
    sim = deployed(make_rollout(steps=[{"pause": {}}, {"pause": {}}, {"pause": {}}]))
    sim.reconcile()
    sim.request("pause")
    sim.reconcile(1)
    sim.request("promote")
    p = sim.reconcile(1)
    assert p.status.current_step_index == 1
    assert p.status.paused_by_user is False


# ----------------------------------------------------------------- BlueGreen and Recreate


def test_blue_green_sequence() -> None:
    sim = deployed(make_rollout(strategy="BlueGreen", steps=[{"setWeight": 20}, {"pause": {}}]), replicas=3)
    p = sim.reconcile()
    assert p.replicas == {"A": 3, "B": 3}  # the green one at full replicas at once
    assert p.weights == TrafficWeights(100, 0)
    assert p.status.current_step_index == 1  # setWeight is meaningless for BlueGreen: skipped
    p = sim.reconcile(30)
    assert p.weights == TrafficWeights(100, 0)
    assert cond(p, "Progressing") == ("False", "StepPaused")
    sim.request("promote")
    p = sim.reconcile(1)
    assert p.status.stable_revision == "B"  # already fully Ready: 100% at once
    assert p.weights == TrafficWeights(100, 0)
    assert (p.stable_service_revision, p.canary_service_revision) == ("B", "B")
    assert p.replicas == {"B": 3, "A": 0}
    assert reasons(p) == ["StepCompleted", "RolloutPromoting", "RolloutCompleted"]


def test_blue_green_without_steps_switches_when_ready() -> None:
    sim = deployed(make_rollout(strategy="BlueGreen"), replicas=2)
    sim.never_ready.add("B")
    p = sim.reconcile()
    assert p.replicas == {"A": 2, "B": 2}
    p = sim.reconcile(10)
    assert p.status.stable_revision == "A"
    assert p.weights == TrafficWeights(100, 0)
    sim.never_ready.clear()
    sim.apply(p)
    p = sim.reconcile(10)
    assert p.status.stable_revision == "B"


def test_recreate_sequence() -> None:
    sim = deployed(make_rollout(strategy="Recreate", steps=CHAIN), replicas=3, lag=True)
    p = sim.reconcile()
    assert p.replicas == {"A": 0, "B": 0}  # old first, new waits for its pods to go
    assert p.weights == TrafficWeights(0, 100)
    assert p.status.promoting is True
    assert "terminate" in (p.condition("Progressing") or Verdict("", "", "")).message
    p = sim.reconcile(5)  # A's pods are still terminating
    assert p.replicas == {"A": 0, "B": 0}
    p = sim.reconcile(5)  # now they are gone
    assert p.replicas == {"A": 0, "B": 3}
    assert p.weights == TrafficWeights(0, 100)
    p = sim.reconcile(5)
    assert p.status.stable_revision == "B"
    assert p.replicas == {"B": 3, "A": 0}
    assert p.weights == TrafficWeights(100, 0)


def test_recreate_abort_scales_the_old_one_back() -> None:
    sim = deployed(make_rollout(strategy="Recreate", progressDeadlineSeconds=60), replicas=3)
    sim.never_ready.add("B")
    sim.reconcile()
    p = sim.reconcile(5)
    assert p.replicas == {"A": 0, "B": 3}
    p = sim.reconcile(60)
    assert p.status.aborted_revision == "B"
    assert p.replicas == {"A": 3, "B": 0}


# ----------------------------------------------------------------- gpuBudget


@pytest.mark.parametrize(
    ("budget", "gpus", "replicas", "steps"),
    [
        (4, 1, 4, CHAIN),
        (5, 1, 4, CHAIN),
        (8, 2, 4, CHAIN),
        (9, 2, 4, [{"setWeight": 25}, {"setWeight": 75}]),
        (6, 1, 5, [{"setWeight": 100}, {"pause": {}}]),
        (3, 1, 3, []),
    ],
)
def test_gpu_budget_holds_at_every_moment(budget: int, gpus: int, replicas: int, steps: list[Any]) -> None:
    sim = deployed(make_rollout(steps=steps, gpuBudget=budget), replicas=replicas, gpus=gpus, lag=True)
    # Sim.apply checks (pods that exist, terminating ones too) * gpus <= budget after every plan.
    for _ in range(40):
        p = sim.reconcile(61)
        if p.status.stable_revision != "A":
            break
        assert p.replicas["A"] >= 1  # the stable keeps serving until the flip
        assert cond(p, "Degraded") == ("False", "AsExpected")
        if cond(p, "Progressing") == ("False", "StepPaused"):
            sim.request("promote")
    assert sim.status.stable_revision == "B"
    for _ in range(3):
        p = sim.reconcile(5)
    assert p.replicas == {"B": replicas, "A": 0}


def test_gpu_budget_scales_stable_down_as_the_canary_scales_up() -> None:
    sim = deployed(
        make_rollout(steps=[{"setWeight": 50}, {"pause": {}}], gpuBudget=4), replicas=4, gpus=1, lag=True
    )
    p = sim.reconcile()
    assert p.replicas == {"A": 2, "B": 0}  # stable first gives back 2 GPUs
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2, "B": 0}  # its 2 pods are still terminating
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2, "B": 2}  # they are gone: the canary takes their GPUs
    p = sim.reconcile(1)
    assert p.status.current_step_index == 1
    assert p.weights == TrafficWeights(50, 50)


def test_gpu_budget_too_small_holds_without_aborting() -> None:
    sim = deployed(make_rollout(steps=CHAIN, gpuBudget=1, progressDeadlineSeconds=60), replicas=1, gpus=1)
    for after in (0, 100, 1000):
        p = sim.reconcile(after)
        assert p.replicas == {"A": 1, "B": 0}
        assert p.status.aborted_revision is None
        assert cond(p, "Degraded") == ("True", "GpuBudgetTooSmall")
        assert cond(p, "Progressing") == ("False", "GpuBudgetTooSmall")


def test_gpu_budget_abort_brings_stable_back_as_canary_pods_go() -> None:
    sim = deployed(
        make_rollout(steps=[{"setWeight": 50}, {"pause": {}}], gpuBudget=4), replicas=4, gpus=1, lag=True
    )
    for _ in range(4):
        sim.reconcile(1)
    assert (sim.cluster["A"].spec_replicas, sim.cluster["B"].spec_replicas) == (2, 2)
    sim.request("abort")
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2, "B": 0}  # the canary's GPUs are not free yet
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2, "B": 0}  # its pods are still terminating
    p = sim.reconcile(1)
    assert p.replicas == {"A": 4, "B": 0}


def test_tuning_pods_count_against_the_gpu_budget_a_canary_waits_for_them_to_go() -> None:
    sim = deployed(make_rollout(steps=[{"setWeight": 50}, {"pause": {}}], gpuBudget=4), replicas=2, gpus=1)
    sim.tuning = 2  # a sweep's two tuning pods hold the rest of the budget (Sim.apply checks the sum)
    for after in (1, 1000, 5000):  # beyond the progress deadline: a sweep's pods are no canary failure
        p = sim.reconcile(after)
        assert p.replicas == {"A": 2, "B": 0}  # no GPU is free for the canary
        assert p.status.aborted_revision is None
        assert cond(p, "Progressing") == ("True", "WaitingForCanaryReady")
        assert "2 tuning pod(s) (kubectl triton tune) hold GPUs" in p.conditions["Progressing"].message
        assert p.requeue_after == 10.0  # the tuning pods' end wakes no pass: it looks again
    sim.tuning = 0  # the sweep ended (or the operator removed it at its deadline)
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2, "B": 1}


def test_tuning_pods_hold_the_stable_revision_growing_into_the_budget() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN, gpuBudget=4), replicas=2, gpus=1, tuning=2)
    sim.reconcile()
    sim.reconcile()
    sim.replicas = 4  # an autoscaler asks for more while the sweep holds 2 GPUs
    p = sim.reconcile(1)
    assert p.replicas == {"A": 2} and p.requeue_after == 10.0
    sim.tuning = 0
    p = sim.reconcile(1)
    assert p.replicas == {"A": 4}


# ----------------------------------------------------------------- spec.replicas moved by an autoscaler


@pytest.mark.parametrize(
    ("weight", "sizes", "expected"),
    [
        # (stable, canary) after each new spec.replicas: the canary stays ceil(r * w / 100)
        (50, [2, 4, 6, 3, 1], [(2, 1), (4, 2), (6, 3), (3, 2), (1, 1)]),
        (10, [4, 10, 20, 11], [(4, 1), (10, 1), (20, 2), (11, 2)]),
        (25, [4, 8, 5], [(4, 1), (8, 2), (5, 2)]),
    ],
)
def test_an_autoscaler_moving_replicas_mid_canary_keeps_the_ratio(
    weight: int, sizes: list[int], expected: list[tuple[int, int]]
) -> None:
    sim = deployed(make_rollout(steps=[{"setWeight": weight}, {"pause": {}}]), replicas=sizes[0])
    for _ in range(3):
        sim.reconcile(1)
    assert sim.status.current_step_index == 1 and sim.status.canary_weight == weight
    for size, (stable, canary) in zip(sizes, expected, strict=True):
        sim.replicas = size  # the HPA wrote spec.replicas through /scale
        p = sim.reconcile(1)
        assert (p.replicas["A"], p.replicas["B"]) == (stable, canary)
        assert canary == canary_replicas(size, weight)
        # Neither a new step nor a rollback: the canary holds its weight at the paused step.
        assert p.status.current_step_index == 1 and p.status.canary_weight == weight
        assert p.status.aborted_revision is None and p.events == ()


def test_an_autoscaler_growing_replicas_under_a_gpu_budget_stays_within_it() -> None:
    sim = deployed(
        make_rollout(steps=[{"setWeight": 50}, {"pause": {}}], gpuBudget=6), replicas=2, gpus=1, lag=True
    )
    for _ in range(4):
        sim.reconcile(1)
    assert (sim.cluster["A"].spec_replicas, sim.cluster["B"].spec_replicas) == (2, 1)
    sim.replicas = 4  # an HPA asks for 4: stable 4 + canary 2 = 6 GPUs, the whole budget
    for _ in range(4):
        p = sim.reconcile(1)  # Sim.apply checks the budget after every plan, terminating pods too
    assert p.replicas == {"A": 4, "B": 2}
    sim.replicas = 5  # 5 + 3 would need 8: the canary keeps what the budget leaves
    for _ in range(4):
        p = sim.reconcile(1)
    assert p.replicas["A"] + p.replicas["B"] <= 6 and p.replicas["A"] >= 3
    assert p.status.aborted_revision is None


# ----------------------------------------------------------------- header routes (A/B)


def test_header_route_step() -> None:
    header = {"name": "beta", "match": [{"headerName": "x-canary", "headerValue": {"exact": "yes"}}]}
    steps = [
        {"setHeaderRoute": header},
        {"setWeight": 20},
        {"pause": {}},
        {"setHeaderRoute": {"name": "beta"}},
    ]
    sim = deployed(make_rollout(steps=steps), replicas=5)
    p = sim.reconcile()
    # setHeaderRoute completes at once; the A/B rule is on from this plan.
    assert p.status.current_step_index == 1
    assert p.header_route is not None
    assert p.header_route.name == "beta"
    assert p.header_route.match[0].header_name == "x-canary"
    assert p.weights == TrafficWeights(100, 0)
    p = sim.reconcile(1)
    assert p.status.current_step_index == 2
    assert p.header_route is not None
    sim.request("promote")
    p = sim.reconcile(1)  # the empty setHeaderRoute removes the A/B rule
    assert p.header_route is None
    assert p.status.promoting


def test_header_route_stays_through_promotion_and_goes_at_the_flip() -> None:
    header = {"name": "beta", "match": [{"headerName": "x-canary", "headerValue": {"prefix": "y"}}]}
    sim = deployed(make_rollout(steps=[{"setHeaderRoute": header}, {"setWeight": 10}]), replicas=2)
    sim.never_ready.add("B")
    sim.reconcile()
    sim.never_ready.clear()
    sim.apply(sim.plans[-1])
    p = sim.reconcile(1)
    assert p.status.promoting
    assert p.header_route is not None
    p = sim.reconcile(1)
    assert p.status.stable_revision == "B"
    assert p.header_route is None


# ----------------------------------------------------------------- history, undo, GitOps revert


def completed(sim: Sim, revision: str) -> RolloutPlan:
    """Roll ``revision`` all the way out (promoting every pause)."""
    sim.desired = revision
    for _ in range(30):
        p = sim.reconcile(61)
        if p.status.stable_revision == revision and p.status.canary_revision is None:
            return p
        progressing = p.condition("Progressing")
        if progressing is not None and progressing.reason == "StepPaused" and progressing.status == "False":
            sim.request("promote")
    raise AssertionError(f"{revision} never became stable")


@pytest.mark.parametrize(
    ("limit", "history", "deleted"),
    [
        (0, [], {"A", "B", "C", "D"}),
        (1, ["D"], {"A", "B", "C"}),
        (2, ["C", "D"], {"A", "B"}),
        (3, ["B", "C", "D"], {"A"}),
        (10, ["A", "B", "C", "D"], set()),
    ],
)
def test_history_is_pruned_to_the_limit(limit: int, history: list[str], deleted: set[str]) -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN, revisionHistoryLimit=limit), replicas=2)
    sim.reconcile()
    for revision in "BCDE":
        completed(sim, revision)
    p = sim.reconcile(1)
    assert [h.revision for h in p.status.history] == history
    assert set(p.replicas) == {"E", *history}
    assert all(p.replicas[h] == 0 for h in history)
    assert not deleted & set(sim.cluster)


def test_undo_rolls_back_to_the_previous_revision_without_steps() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN), replicas=3)
    sim.reconcile()
    completed(sim, "B")
    sim.request("undo")
    p = sim.reconcile(1)
    assert (p.status.pinned_revision, p.status.pinned_for) == ("A", "B")
    assert reasons(p) == ["UndoRequested", "RolloutRollback"]
    assert p.status.canary_revision == "A"
    assert p.status.promoting is True  # steps skipped: full replicas at once
    assert p.replicas == {"B": 3, "A": 3}
    assert p.weights == TrafficWeights(100, 0)
    p = sim.reconcile(5)
    assert p.status.stable_revision == "A"
    assert [h.revision for h in p.status.history] == ["B"]
    assert p.replicas == {"A": 3, "B": 0}
    # The spec still asks for B: the pin holds.
    for _ in range(3):
        p = sim.reconcile(60)
        assert p.status.stable_revision == "A"
        assert p.status.canary_revision is None
    # A spec change drops the pin and rolls the new revision out with the steps.
    sim.desired = "C"
    p = sim.reconcile(1)
    assert p.status.pinned_revision is None
    assert (p.status.canary_revision, p.status.current_step_index) == ("C", 0)


def test_undo_to_a_named_revision() -> None:
    sim = Sim(rollout=make_rollout(steps=[], revisionHistoryLimit=5), replicas=1)
    sim.reconcile()
    completed(sim, "B")
    completed(sim, "C")
    sim.request("undo", "A")
    p = sim.reconcile(1)
    assert p.status.canary_revision == "A"
    p = sim.reconcile(1)
    assert p.status.stable_revision == "A"
    assert [h.revision for h in p.status.history] == ["B", "C"]


def test_retry_after_undo_rolls_the_spec_forward_again() -> None:
    sim = Sim(rollout=make_rollout(steps=[{"pause": {}}]), replicas=1)
    sim.reconcile()
    completed(sim, "B")
    sim.request("undo")
    sim.reconcile(1)
    sim.reconcile(1)
    assert sim.status.stable_revision == "A"
    sim.request("retry")
    p = sim.reconcile(1)
    assert p.status.pinned_revision is None
    assert p.status.canary_revision == "B"
    assert p.status.promoting is True  # B is in history now: a rollback, no steps


@pytest.mark.parametrize(
    ("history", "target", "cluster", "message"),
    [
        ((), None, {}, "no earlier revision in history"),
        ((HistoryEntry("A"),), "Z", {"A": ready_state(0)}, "revision Z is not in history (A)"),
        ((HistoryEntry("A"),), "A", {}, "revision A has no Deployment left"),
    ],
)
def test_undo_rejected(
    history: tuple[HistoryEntry, ...], target: str | None, cluster: Mapping[str, RevisionState], message: str
) -> None:
    status = RolloutStatus(stable_revision="B", history=history)
    plan = plan_rollout(
        RolloutInput(
            rollout=make_rollout(),
            replicas=1,
            desired_revision="B",
            now=T0,
            status=status,
            revisions={"B": ready_state(1), **cluster},
            requests=(ControlRequest("undo", "r1", target),),
        )
    )
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "UndoRejected")]
    assert message in plan.events[0].message
    assert plan.status.pinned_revision is None
    assert plan.status.handled_requests == {"undo": "r1"}
    assert plan.replicas["B"] == 1


def test_gitops_revert_is_recognised_as_a_history_revision() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN), replicas=2)
    sim.reconcile()
    completed(sim, "B")
    sim.desired = "A"  # the spec reverted: same hash as before
    p = sim.reconcile(1)
    assert reasons(p) == ["RolloutRollback"]
    assert p.status.promoting is True
    assert p.replicas == {"B": 2, "A": 2}
    p = sim.reconcile(1)
    assert p.status.stable_revision == "A"
    assert [h.revision for h in p.status.history] == ["B"]


# ----------------------------------------------------------------- restart safety


@pytest.mark.parametrize("stop_after", range(0, 9))
def test_restart_at_any_point_resumes_the_same_rollout(stop_after: int) -> None:
    """A new process that has only the stored status dict and the cluster goes on exactly the same."""
    sim = deployed(make_rollout(steps=CHAIN), replicas=4)
    for _ in range(stop_after):
        sim.reconcile(31)
    wire = json.loads(json.dumps(sim.status.to_status()))
    restarted = Sim(
        rollout=make_rollout(steps=CHAIN),
        replicas=4,
        desired="B",
        now=sim.now,
        status=RolloutStatus.from_status(wire),
        cluster=dict(sim.cluster),
    )
    for _ in range(10):
        if sim.plans and cond(sim.plans[-1], "Progressing") == ("False", "StepPaused"):
            sim.request("promote")
            restarted.request("promote")
        a, b = sim.reconcile(31), restarted.reconcile(31)
        assert (a.status, a.replicas, a.weights, a.events) == (b.status, b.replicas, b.weights, b.events)
    assert sim.status.stable_revision == "B"


def test_same_inputs_same_plan() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    inp = sim.input()
    assert plan_rollout(inp) == plan_rollout(inp)


@pytest.mark.parametrize(
    "status",
    [
        RolloutStatus(),
        RolloutStatus(
            stable_revision="A", stable_since=T0, history=(HistoryEntry("Z", "2025-01-01T00:00:00Z"),)
        ),
        RolloutStatus(
            stable_revision="A",
            canary_revision="B",
            canary_weight=10,
            current_step_index=2,
            step_started_at=T0,
            canary_started_at=T0,
            waiting_since=T0 + timedelta(seconds=3),
            promoting=True,
            paused_by_user=True,
            handled_requests={"promote": "x", "abort": "y"},
        ),
        RolloutStatus(
            stable_revision="A",
            aborted_revision="B",
            aborted_reason="Aborted",
            aborted_step_index=0,
            pinned_revision="Z",
            pinned_for="B",
        ),
    ],
)
def test_status_round_trip(status: RolloutStatus) -> None:
    wire = json.loads(json.dumps(status.to_status()))
    assert RolloutStatus.from_status(wire) == status


def test_status_tolerates_missing_and_foreign_fields() -> None:
    status = RolloutStatus.from_status(
        {"stableRevision": "A", "conditions": [], "history": [{"revision": "H"}, {}]}
    )
    assert status.stable_revision == "A"
    assert status.history == (HistoryEntry("H"),)
    assert RolloutStatus.from_status(None) == RolloutStatus()


# ----------------------------------------------------------------- control requests


@pytest.mark.parametrize(
    ("action", "target", "expected"),
    [
        ("promote", None, {"triton-operator.io/promote": "id1", "triton-operator.io/promote-revision": None}),
        (
            "promote-full",
            None,
            {"triton-operator.io/promote-full": "id1", "triton-operator.io/promote-full-revision": None},
        ),
        ("abort", None, {"triton-operator.io/abort": "id1", "triton-operator.io/abort-revision": None}),
        ("pause", None, {"triton-operator.io/pause": "id1"}),
        ("resume", None, {"triton-operator.io/resume": "id1"}),
        ("retry", None, {"triton-operator.io/retry": "id1"}),
        ("undo", None, {"triton-operator.io/undo": "id1", "triton-operator.io/undo-to-revision": None}),
        ("undo", "abc", {"triton-operator.io/undo": "id1", "triton-operator.io/undo-to-revision": "abc"}),
    ],
)
def test_control_annotations_round_trip(action: Action, target: str | None, expected: dict[str, Any]) -> None:
    patch = control_annotations(action, "id1", target)
    assert patch == expected
    annotations = {k: v for k, v in patch.items() if v is not None}
    assert parse_control_requests(annotations) == (ControlRequest(action, "id1", target),)


@pytest.mark.parametrize(
    ("action", "request_id", "target"),
    [("bogus", "id", None), ("promote", "", None), ("abort", "id", "rev")],
)
def test_control_annotations_rejects(action: Any, request_id: str, target: str | None) -> None:
    with pytest.raises(ValueError):
        control_annotations(action, request_id, target)


def test_parse_control_requests_ignores_other_annotations() -> None:
    annotations = {"kubectl.kubernetes.io/last-applied-configuration": "{}", "triton-operator.io/abort": "t1"}
    assert parse_control_requests(annotations) == (ControlRequest("abort", "t1"),)
    assert parse_control_requests(None) == ()


@pytest.mark.parametrize(
    ("spec", "replicas", "pods", "expected"),
    [(3, 3, 3, 3), (2, 2, 4, 4), (4, 2, 2, 4), (0, 0, None, 0), (0, 2, None, 2)],
)
def test_gpu_pods_counts_what_holds_or_will_hold_gpus(
    spec: int, replicas: int, pods: int | None, expected: int
) -> None:
    assert RevisionState(spec_replicas=spec, replicas=replicas, pods=pods).gpu_pods == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-01T12:00:00Z", T0),
        ("2026-01-01T12:00:00+00:00", T0),
        ("2026-01-01T13:00:00+01:00", T0),
        (T0.replace(tzinfo=None), T0),
        ("", None),
        ("yesterday", None),
        (None, None),
        (5, None),
    ],
)
def test_parse_time(value: Any, expected: datetime | None) -> None:
    assert parse_time(value) == expected


def test_format_time_drops_sub_seconds() -> None:
    assert format_time(T0 + timedelta(microseconds=999_999)) == "2026-01-01T12:00:00Z"


@pytest.mark.parametrize(
    ("step", "text"),
    [
        ({"setWeight": 10}, "setWeight 10"),
        ({"pause": {"durationSeconds": 60}}, "pause 60s"),
        ({"pause": {}}, "pause (until promoted)"),
        ({"setHeaderRoute": {"name": "beta"}}, "setHeaderRoute beta"),
    ],
)
def test_describe_step(step: dict[str, Any], text: str) -> None:
    assert describe_step(make_rollout(steps=[step]).steps[0]) == text


@pytest.mark.parametrize(
    ("cluster", "stable", "replicas"),
    [
        ({"A": ready_state(4)}, "A", {"A": 4, "B": 1}),
        ({"A": ready_state(4), "Z": ready_state(1)}, "A", {"A": 4, "B": 1}),
        ({"A": ready_state(4), "B": ready_state(1)}, "A", {"A": 4, "B": 1}),
        ({"A": ready_state(0), "B": ready_state(1)}, "B", {"B": 4}),
        ({}, "B", {"B": 4}),
    ],
)
def test_lost_status_adopts_the_serving_revision(
    cluster: dict[str, RevisionState], stable: str, replicas: dict[str, int]
) -> None:
    """No status but pods serve (a restored backup): no rollout at once over the serving revision."""
    plan = plan_rollout(
        RolloutInput(
            rollout=make_rollout(steps=CHAIN), replicas=4, desired_revision="B", now=T0, revisions=cluster
        )
    )
    assert plan.status.stable_revision == stable
    assert plan.replicas == replicas
    assert reasons(plan)[:1] == (["StableAdopted"] if stable == "A" else [])


def test_pending_requests_are_those_the_status_has_not_handled() -> None:
    annotations = {"triton-operator.io/promote": "t2", "triton-operator.io/abort": "t1", "other/x": "y"}
    assert pending_requests(annotations, None) == (
        ControlRequest("promote", "t2"),
        ControlRequest("abort", "t1"),
    )
    handled = {"handledRequests": {"promote": "t2", "abort": "t0"}}
    assert pending_requests(annotations, handled) == (ControlRequest("abort", "t1"),)
    assert pending_requests(annotations, {"handledRequests": {"promote": "t2", "abort": "t1"}}) == ()
    assert pending_requests(None, handled) == ()


# ----------------------------------------------------------------- a stable revision gone missing


def test_a_stable_revision_without_a_deployment_is_replaced_by_the_spec_revision_at_once() -> None:
    sim = deployed(make_rollout(steps=CHAIN))
    sim.reconcile()
    assert sim.status.canary_revision == "B"
    sim.cluster.pop("A")  # deleted by hand (or collected with an earlier object of this name)
    plan = sim.reconcile(after=1)
    # only B can be rendered from the spec: it serves at full replicas, no steps, no canary
    assert plan.replicas == {"B": 4}
    assert sim.status.stable_revision == "B" and sim.status.canary_revision is None
    assert reasons(plan) == ["StableRevisionMissing"]
    assert plan.events[0].type == "Warning"
    assert "stable revision A has no Deployment" in plan.events[0].message
    assert cond(plan, "Degraded") == ("True", "StableRevisionMissing")
    assert "replaced by revision B" in (plan.condition("Degraded") or pytest.fail()).message
    assert plan.weights == TrafficWeights(stable=100, canary=0)
    assert plan.stable_service_revision == "B"
    # Degraded until B is Ready at full replicas, then nothing is left of it
    plan = sim.reconcile(after=1)
    assert cond(plan, "Degraded") == ("False", "AsExpected")
    assert sim.status.replaced_revision is None
    assert cond(plan, "Progressing") == ("False", "RolloutCompleted")


def test_a_missing_stable_revision_that_the_spec_still_asks_for_is_rendered_again() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN))
    sim.reconcile()
    sim.reconcile()
    sim.cluster.pop("A")
    plan = sim.reconcile(after=1)
    assert plan.replicas == {"A": 4}  # plan_actions renders the spec's revision on every reconcile
    assert plan.events == ()
    assert sim.status.stable_revision == "A" and sim.status.replaced_revision is None


def test_a_missing_stable_revision_after_an_abort_is_replaced_by_the_spec_revision() -> None:
    sim = deployed(make_rollout(steps=CHAIN), crashing={"B"})
    plan = sim.reconcile()
    plan = sim.reconcile(after=1)
    assert sim.status.aborted_revision == "B"
    sim.crashing.clear()
    sim.cluster.pop("A")
    plan = sim.reconcile(after=1)
    assert plan.replicas == {"B": 4} and sim.status.aborted_revision is None
    assert cond(plan, "Degraded") == ("True", "StableRevisionMissing")


def test_undo_to_a_revision_that_cannot_sync_any_more_is_rejected_and_nothing_moves() -> None:
    sim = Sim(rollout=make_rollout(steps=CHAIN), replicas=3)
    sim.reconcile()
    completed(sim, "B")
    sim.request("undo")
    inp = dataclasses.replace(sim.input(), unsyncable={"A": "model.onnx was overwritten"})
    plan = plan_rollout(inp)
    assert reasons(plan) == ["UndoRejected"]
    assert "undo: revision A cannot sync any more: model.onnx was overwritten" in plan.events[0].message
    assert plan.status.pinned_revision is None and plan.status.canary_revision is None
    assert plan.replicas == {"B": 3, "A": 0}  # the serving revision is not scaled down for A


# ----------------------------------------------------------------- docs/rollouts.md's worked examples

ROLLOUTS_MD = REPO / "docs" / "rollouts.md"
Row = tuple[int, int, str, str]


def example_rows(number: int) -> list[Row]:
    """(A, B, step, route weights) of each row of the table of docs/rollouts.md's worked example ``number``
    (the step as its index, "promoting" or "stable B": what a row adds in brackets is left out)."""
    text = ROLLOUTS_MD.read_text()
    section = text[text.index("### Worked examples") :]
    example = section[section.index(f"**{number}. ") :]
    table = example[example.index("\n| ") + 1 :].split("\n\n")[0]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    return [(int(c[1]), int(c[2]), re.sub(r" \(.*\)$", "", c[3]).strip("()"), c[4]) for c in cells]


def example_row(plan: RolloutPlan) -> Row:
    """A plan as a row of a worked example."""
    st = plan.status
    if st.canary_revision is None:
        assert plan.weights == TrafficWeights()
        step, weights = f"stable {st.stable_revision}", f"100 to {st.stable_revision}"
    else:
        step = "promoting" if st.promoting else str(st.current_step_index)
        weights = f"{plan.weights.stable}/{plan.weights.canary}"
    return plan.replicas["A"], plan.replicas["B"], step, weights


def test_the_docs_first_worked_example_is_what_the_engine_does() -> None:
    rollout = make_rollout(steps=[{"setWeight": 10}, {"setWeight": 50}], gpuBudget=4)
    sim = deployed(rollout, replicas=3, gpus=1, lag=True)
    rows: list[Row] = []
    for _ in range(10):
        row = example_row(sim.reconcile())
        if not rows or rows[-1] != row:
            rows.append(row)  # a reconcile that sees nothing new is no row
    assert rows == example_rows(1)


def test_the_docs_second_worked_example_is_what_the_engine_does() -> None:
    steps = [{"setWeight": 10}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50}, {"pause": {}}]
    sim = deployed(make_rollout(steps=steps), replicas=3)
    rows = [example_row(sim.reconcile()), example_row(sim.reconcile())]
    assert sim.plans[-1].requeue_after == 60
    rows += [example_row(sim.reconcile(after=60)), example_row(sim.reconcile())]
    assert sim.plans[-1].requeue_after is None
    sim.request("promote", revision="B")
    rows += [example_row(sim.reconcile()), example_row(sim.reconcile())]
    assert rows == example_rows(2)
    assert [cond(plan, "Progressing")[1] for plan in sim.plans[-6:]] == [
        "NewRevision",
        "StepPaused",
        "WaitingForCanaryReady",
        "StepPaused",
        "Promoting",
        "RolloutCompleted",
    ]


def test_the_docs_third_worked_example_is_what_the_engine_does() -> None:
    sim = deployed(make_rollout(steps=[{"setWeight": 10}], gpuBudget=2), replicas=1, gpus=2)
    plan = sim.reconcile()
    assert plan.replicas == {"A": 1, "B": 0}
    assert cond(plan, "Progressing") == ("False", "GpuBudgetTooSmall")
    assert cond(plan, "Degraded") == ("True", "GpuBudgetTooSmall")
    progressing = plan.condition("Progressing")
    assert progressing is not None
    assert f'"{progressing.message}"' in " ".join(ROLLOUTS_MD.read_text().split())

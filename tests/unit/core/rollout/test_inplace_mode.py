"""core.rollout.engine in its in-place mode: one call moves the host pods and the Deployments, one plan
with one set of conditions, and the analysis gate both step movers share."""

from __future__ import annotations

import dataclasses
import datetime

import pytest

from triton_operator.core.rollout.canary_analysis import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    AnalysisResult,
    AnalysisVerdict,
)
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.gate import analysis_gate
from triton_operator.core.rollout.hostpods import AgentStatus, HostPod, InPlaceState
from triton_operator.core.rollout.plan import InPlaceMode, RolloutInput
from triton_operator.core.rollout.requests import ControlRequest
from triton_operator.core.rollout.rollout_kind import InPlace
from triton_operator.core.rollout.state import HistoryEntry, RevisionState, RolloutStatus
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import Analysis, Rollout

T0 = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
HOST, NEXT = "host", "next"
READY = RevisionState(spec_replicas=2, replicas=2, ready_replicas=2, available_replicas=2)


def pod(name: str, revision: str, state: str = "Applied", target: str | None = None) -> HostPod:
    agent = AgentStatus(revision=revision, target=target or revision, state=state, models={"m": "READY"})
    return HostPod(name, ready=state == "Applied", agent=agent, target=target)


def call(
    state: InPlaceState, pods: list[HostPod], requests: tuple[ControlRequest, ...] = (), **status: object
) -> RolloutInput:
    rollout = Rollout.model_validate({"modelUpdates": "InPlace"})
    return RolloutInput(
        rollout=rollout,
        replicas=2,
        desired_revision=NEXT,  # the spec's: the host's pods load it in place
        now=T0,
        status=RolloutStatus(stable_revision=HOST, stable_since=T0, **status),  # type: ignore[arg-type]
        revisions={HOST: READY},
        requests=requests,
        progress_deadline_seconds=600,
        in_place=InPlaceMode(
            host=HOST, state=state, opted_in=True, models={NEXT: ("m",)}, pods=pods, described="reload m"
        ),
    )


def test_the_engine_moves_the_host_pods_and_its_one_plan_says_so() -> None:
    # An undo of a revision served here in place whose ConfigMap is gone: the engine takes it for the
    # in-place mode (rejected there, never seen by the Deployments' mover), and the update moves on.
    undo = ControlRequest("undo", "r1", to_revision="gone")
    plan = plan_rollout(
        call(
            InPlaceState(host=HOST, stable=HOST, next=NEXT),
            [pod("a", HOST), pod("b", HOST)],
            (undo,),
            history=(HistoryEntry("gone", None, in_place_host=HOST),),
        )
    )
    assert plan.in_place is not None and plan.in_place.state is not None
    assert plan.replicas == {HOST: 2} and plan.status.stable_revision == HOST  # no Deployment of NEXT
    assert plan.engine_revision == HOST
    assert plan.conditions[cond.PROGRESSING] == plan.in_place.progressing
    assert plan.conditions[cond.PROGRESSING].reason == cond.IN_PLACE_UPDATING
    assert plan.conditions[cond.DEGRADED].status == cond.FALSE
    assert plan.in_place.annotations == {"a": NEXT}  # one pod of two: a batch, never all
    assert [e.reason for e in plan.events] == [cond.UNDO_REJECTED, cond.ROLLOUT_STARTED]
    assert plan.events[0].message == "undo: revision gone cannot be loaded in place: its ConfigMap is gone"
    assert plan.status.handled_requests == {"undo": "r1"}  # what the in-place mode took
    assert plan.requeue_after == 2.0  # the agents' progress wakes no pass


def test_a_completed_update_goes_into_history_as_a_flip_would() -> None:
    state = InPlaceState(host=HOST, stable=HOST, next=NEXT, step_index=0, pods=("a", "b"))
    plan = plan_rollout(call(state, [pod("a", NEXT, target=NEXT), pod("b", NEXT, target=NEXT)]))
    assert plan.in_place is not None and plan.in_place.state is not None
    assert (plan.in_place.state.stable, plan.in_place.state.next) == (NEXT, None)
    assert plan.status.history == (HistoryEntry(HOST, None, in_place_host=HOST),)
    assert plan.conditions[cond.PROGRESSING].reason == cond.ROLLOUT_COMPLETED
    assert (
        plan.conditions[cond.PROGRESSING].message
        == f"the pods of revision {HOST} serve revision {NEXT} (in place)"
    )
    completed = [e.message for e in plan.events if e.reason == cond.ROLLOUT_COMPLETED]
    assert completed == [f"revision {NEXT} is served in place by all 2 pods of revision {HOST} (was {HOST})"]


def test_a_failed_load_is_the_rollouts_degraded() -> None:
    state = InPlaceState(host=HOST, stable=HOST, next=NEXT, step_index=0, pods=("a",))
    plan = plan_rollout(call(state, [pod("a", HOST, state="Failed", target=NEXT), pod("b", HOST)]))
    degraded = plan.conditions[cond.DEGRADED]
    assert degraded.status == cond.TRUE and degraded.reason == cond.IN_PLACE_LOAD_FAILED
    assert plan.conditions[cond.PROGRESSING].reason == cond.IN_PLACE_ROLLING_BACK
    assert plan.status.canary_revision is None and plan.replicas == {HOST: 2}


def test_a_promote_made_for_the_in_place_revision_moves_its_pods_and_one_for_another_is_ignored() -> None:
    state = InPlaceState(host=HOST, stable=HOST, next=NEXT, step_index=0, pods=())
    pods = [pod("a", HOST), pod("b", HOST)]
    rollout = Rollout.model_validate({"modelUpdates": "InPlace", "steps": [{"setWeight": 50}, {"pause": {}}]})
    ours = dataclasses.replace(
        call(state, pods, (ControlRequest("promote", "p1", revision=NEXT),)), rollout=rollout
    )
    plan = plan_rollout(ours)
    assert plan.in_place is not None and plan.in_place.state is not None
    assert plan.in_place.state.step_index == 2 and plan.in_place.state.promoted  # every pod, in batches
    assert [e.reason for e in plan.events] == [cond.STEP_COMPLETED]
    assert plan.status.handled_requests == {"promote": "p1"}
    other = dataclasses.replace(ours, requests=(ControlRequest("promote", "p2", revision="other"),))
    plan = plan_rollout(other)
    assert plan.in_place is not None and plan.in_place.state is not None
    assert plan.in_place.state.step_index == 0 and not plan.in_place.state.promoted
    ignored = "promote request p2 ignored: made for revision other; no rollout is in progress"
    assert [(e.reason, e.message) for e in plan.events] == [(cond.REQUEST_IGNORED, ignored)]
    assert plan.status.handled_requests == {"promote": "p2"}  # taken by the Deployments' mover


def test_a_retry_starts_a_held_in_place_revision_again() -> None:
    state = InPlaceState(
        host=HOST,
        stable=HOST,
        aborted_revision=NEXT,
        aborted_reason=cond.ABORTED,
        aborted_detail="by request",
    )
    pods = [pod("a", HOST), pod("b", HOST)]
    held = plan_rollout(call(state, pods))
    assert held.conditions[cond.PROGRESSING].reason == cond.ROLLOUT_ABORTED and held.kind is None
    mode = dataclasses.replace(
        call(state, pods).in_place or InPlaceMode(host=HOST), change=InPlace(models_changed=("m",))
    )
    plan = plan_rollout(
        dataclasses.replace(call(state, pods, (ControlRequest("retry", "t1"),)), in_place=mode)
    )
    assert plan.in_place is not None and plan.in_place.state is not None
    assert (plan.in_place.state.next, plan.in_place.state.aborted_revision) == (NEXT, None)
    assert [e.reason for e in plan.events] == [cond.ROLLOUT_RETRIED, cond.ROLLOUT_STARTED]
    assert plan.events[0].message == f"retrying revision {NEXT} in place"
    described = "in place: reload m (0 objects, 0 bytes to fetch)"
    assert plan.kind == ("InPlace", described) and plan.status.handled_requests == {"retry": "t1"}


def test_an_undo_to_the_hosts_own_revision_is_taken_in_place_and_pinned() -> None:
    state = InPlaceState(host=HOST, stable=NEXT)  # the host's pods serve NEXT in place
    mode = InPlaceMode(
        host=HOST,
        state=state,
        opted_in=True,
        earlier={HOST: InPlace(models_changed=("m",))},
        models={HOST: ("m",)},
        pods=[pod("a", NEXT, target=NEXT), pod("b", NEXT, target=NEXT)],
    )
    undo = ControlRequest("undo", "u1", to_revision=HOST)
    plan = plan_rollout(dataclasses.replace(call(state, [], (undo,)), in_place=mode))
    assert plan.in_place is not None and plan.in_place.state is not None
    moving = plan.in_place.state
    assert (moving.stable, moving.next, moving.pinned, moving.pinned_for) == (NEXT, HOST, HOST, NEXT)
    assert [e.reason for e in plan.events] == [cond.UNDO_REQUESTED, cond.ROLLOUT_STARTED]
    assert plan.status.pinned_revision is None  # the Deployments' mover never saw it
    assert plan.status.handled_requests == {"undo": "u1"} and plan.engine_revision == HOST


def result(verdict: AnalysisVerdict, window: float = 60.0) -> AnalysisResult:
    return AnalysisResult(revision=NEXT, weight=50, verdict=verdict, window_seconds=window)


GATES = [
    (PASSED, "Abort", "pass", cond.ANALYSIS_PASSED, False),
    (FAILED, "Abort", "wait", None, False),  # a failure aborts before any gate (aborts.failure_of)
    (INCONCLUSIVE, "Abort", "abort", None, False),
    (INCONCLUSIVE, "Pause", "wait", cond.ANALYSIS_INCONCLUSIVE, True),
    (INCONCLUSIVE, "Wait", "wait", None, False),
]
"""(verdict, onInconclusive, the gate's outcome, its Event's reason, whether it pauses)."""


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("case", GATES)
def test_one_analysis_gate_for_both_step_movers(
    in_place: bool, case: tuple[AnalysisVerdict, str, str, str | None, bool]
) -> None:
    verdict, policy, outcome, reason, pause = case
    spec = Analysis.model_validate({"inconclusiveAfterSeconds": 30, "onInconclusive": policy})
    gate = analysis_gate(spec, result(verdict), first="", in_place=in_place, paused=False)
    assert (gate.outcome, gate.event.reason if gate.event else None, gate.pause) == (outcome, reason, pause)
    if gate.event is not None:
        about = f"revision {NEXT} in place: " if in_place else f"revision {NEXT}: "
        assert gate.event.message.startswith(about)
    waiting = analysis_gate(spec, None, first="no reading", in_place=in_place, paused=False)
    assert (waiting.outcome, waiting.waiting, waiting.record) == ("wait", "no reading", None)

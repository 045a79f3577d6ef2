"""The plans a call ends with (steady, held, canary) and the texts of their Progressing and Degraded."""

from __future__ import annotations

from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.rollout.clock import format_time, later, pause_left
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split, gpu_split
from triton_operator.core.rollout.texts import step_at
from triton_operator.core.rollout.verdicts import analysis_active
from triton_operator.core.rollout.working import Call
from triton_operator.core.vocabulary.conditions import (
    ABORTED,
    ANALYSIS_FAILED,
    ANALYSIS_INCONCLUSIVE,
    AS_EXPECTED,
    CANARY_CRASH_LOOPING,
    CANARY_UNSCHEDULABLE,
    DEGRADED,
    FALSE,
    GPU_BUDGET_TOO_SMALL,
    NEW_REVISION,
    PROGRESS_DEADLINE_EXCEEDED,
    PROGRESSING,
    PROMOTING,
    ROLLOUT_ABORTED,
    ROLLOUT_COMPLETED,
    ROLLOUT_PAUSED,
    STABLE_REVISION_MISSING,
    STEP_PAUSED,
    TRUE,
    WAITING_FOR_ANALYSIS,
    WAITING_FOR_CANARY_READY,
    WAITING_FOR_STABLE_READY,
    Verdict,
)
from triton_operator.models import SetHeaderRoute, Strategy

TUNING_RECHECK_SECONDS = 10.0
"""How soon a pass looks again while tuning pods hold GPUs a revision waits for (their end wakes none)."""

# ------------------------------------------------------------- plans


def header_route(c: Call) -> SetHeaderRoute | None:
    if c.st.canary_revision is None or c.strategy == Strategy.RECREATE:
        return None
    done = c.steps if c.st.promoting else c.steps[: c.position()]
    route: SetHeaderRoute | None = None
    for step in done:
        if step.set_header_route is not None:
            route = step.set_header_route if step.set_header_route.match else None
    return route


def keep_history(c: Call, replicas: dict[str, int]) -> None:
    for h in c.st.history:
        if h.in_place_host is None:  # one served in place has no Deployment (core.decision.inplace_plan)
            replicas.setdefault(h.revision, 0)


def finish(
    c: Call,
    replicas: dict[str, int],
    progressing: Verdict,
    degraded: Verdict,
    requeue: float | None = None,
) -> RolloutPlan:
    keep_history(c, replicas)
    delete = tuple(sorted(r for r in c.inp.revisions if r not in replicas))
    c.set(handled_requests=dict(sorted(c.handled.items())))
    st = c.st
    canary = st.canary_revision
    weights = TrafficWeights.canary_percent(st.canary_weight or 0) if canary else TrafficWeights()
    moved, chosen = c.moved, c.chosen
    events = (*chosen, *c.events)
    if moved is not None:
        # The in-place mode moves the host's pods: while the host is the revision the engine
        # serves, the update's verdicts are the rollout's (a failure beats the host's steadiness).
        if moved.state is not None and moved.state.host == c.desired:
            progressing = moved.progressing
            degraded = moved.degraded if moved.degraded.status == TRUE else degraded
        events = (*c.events, *chosen, *moved.events)
        timed = [t for t in (requeue, moved.requeue_after) if t is not None]
        requeue = min(timed) if timed else None
    return RolloutPlan(
        replicas=replicas,
        delete=delete,
        weights=weights,
        header_route=header_route(c),
        stable_service_revision=st.stable_revision,
        canary_service_revision=canary or st.stable_revision,
        status=st,
        conditions={PROGRESSING: progressing, DEGRADED: degraded},
        events=events,
        requeue_after=requeue,
        in_place=moved,
        engine_revision=c.desired,
        kind=c.kind,
    )


def stable_replicas_alone(c: Call) -> int:
    """Stable at spec.replicas, growing only into GPUs others released when a budget is set."""
    stable_rev = c.st.stable_revision
    split = gpu_split(
        c.r,
        0,
        c.inp.gpus_per_pod,
        c.inp.rollout.gpu_budget,
        stable=c.observed(stable_rev),
        other_pods=c.other_pods(stable_rev),
    )
    return split.stable


def steady(c: Call) -> RolloutPlan:
    stable = c.st.stable_revision
    assert stable is not None
    state = c.observed(stable)
    replicas = {stable: stable_replicas_alone(c)}
    if state is not None and state.ready_at(c.r):
        progressing = Verdict(FALSE, ROLLOUT_COMPLETED, f"revision {stable} is stable at {c.r} replicas")
    else:
        ready = state.ready_replicas if state else 0
        progressing = Verdict(
            TRUE,
            WAITING_FOR_STABLE_READY,
            f"revision {stable}: {ready}/{c.r} replicas Ready",
        )
    degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
    replaced = c.st.replaced_revision
    if replaced is not None and state is not None and state.ready_at(c.r):
        c.set(replaced_revision=None)
    elif replaced is not None:
        message = (
            f"stable revision {replaced} had no Deployment: replaced by revision {stable}; "
            f"{progressing.message}"
        )
        degraded = Verdict(TRUE, STABLE_REVISION_MISSING, message)
    held_by_tuning = c.inp.tuning_pods > 0 and replicas[stable] < c.r
    return finish(c, replicas, progressing, degraded, TUNING_RECHECK_SECONDS if held_by_tuning else None)


def held_before_start(c: Call) -> RolloutPlan:
    stable = c.st.stable_revision
    assert stable is not None
    replicas = {stable: stable_replicas_alone(c)}
    progressing = Verdict(
        FALSE,
        ROLLOUT_PAUSED,
        f"revision {c.target} waits: the rollout is paused ({_pause_source(c)})",
    )
    degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
    return finish(c, replicas, progressing, degraded)


def held_aborted(c: Call) -> RolloutPlan:
    stable = c.st.stable_revision
    aborted = c.st.aborted_revision
    assert stable is not None and aborted is not None
    replicas = {stable: stable_replicas_alone(c), aborted: 0}
    message = abort_message(c)
    progressing = Verdict(
        FALSE,
        ROLLOUT_ABORTED,
        f"{message}; change the spec or request a retry (kubectl triton retry) to try again",
    )
    degraded = Verdict(TRUE, c.st.aborted_reason or ABORTED, message)
    return finish(c, replicas, progressing, degraded)


def abort_message(c: Call) -> str:
    st = c.st
    details = {
        PROGRESS_DEADLINE_EXCEEDED: f"canary not fully Ready within {c.deadline_seconds()}s",
        CANARY_CRASH_LOOPING: "canary pods are crash-looping",
        CANARY_UNSCHEDULABLE: f"canary pods unschedulable for more than "
        f"{c.inp.rollout.unschedulable_grace()}s",
        ABORTED: "aborted by request",
        ANALYSIS_FAILED: "analysis failed",
        ANALYSIS_INCONCLUSIVE: "analysis inconclusive",
    }
    index = st.aborted_step_index if st.aborted_step_index is not None else 0
    where = f"step {index}" if index < len(c.steps) else f"step {index} (promotion)"
    detail = details.get(st.aborted_reason or "", st.aborted_reason or "aborted")
    if st.aborted_detail:
        detail = f"{detail}: {st.aborted_detail}"
    return (
        f"rollout of revision {st.aborted_revision} aborted at {where}: {detail}; "
        f"stable revision {st.stable_revision} serves all traffic"
    )


def _pause_source(c: Call) -> str:
    if c.inp.rollout.paused:
        return "spec.rollout.paused"
    return "pause request; kubectl triton resume"


def canary_plan(
    c: Call, split: Split, budget_blocked: bool = False, tuning_blocked: bool = False
) -> RolloutPlan:
    st = c.st
    stable, canary = st.stable_revision, st.canary_revision
    assert stable is not None and canary is not None
    state = c.observed(canary)
    replicas = {stable: split.stable, canary: split.canary}
    ready_now = state is not None and state.ready_at(split.canary_goal)
    # The deadline clock: when the canary began waiting at this position (paused: no clock).
    held = ready_now or c.paused or budget_blocked or tuning_blocked
    waiting = None if held else (st.waiting_since or c.now)
    c.set(waiting_since=waiting)
    n = len(c.steps)
    index = c.position()
    ready = state.ready_replicas if state else 0
    readiness = f"canary {canary}: {ready}/{split.canary_goal} Ready"
    degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
    requeue: list[float] = []
    if budget_blocked:
        gpus, budget = c.inp.gpus_per_pod, c.inp.rollout.gpu_budget
        message = (
            f"gpuBudget {budget} holds {(budget or 0) // max(gpus, 1)} pods of {gpus} GPUs: not enough "
            f"for one canary pod beside a serving stable of {c.r}; raise it or use Recreate"
        )
        progressing = Verdict(FALSE, GPU_BUDGET_TOO_SMALL, message)
        degraded = Verdict(TRUE, GPU_BUDGET_TOO_SMALL, message)
        return finish(c, replicas, progressing, degraded)
    if tuning_blocked:
        message = (
            f"{readiness}: {c.inp.tuning_pods} tuning pod(s) (kubectl triton tune) hold GPUs of "
            f"gpuBudget {c.inp.rollout.gpu_budget}; the canary grows to {split.canary_goal} "
            "when they are gone"
        )
        # Tuning pods wake no pass when they go (nothing of the TritonService's own): look again.
        verdict = Verdict(TRUE, WAITING_FOR_CANARY_READY, message)
        return finish(c, replicas, verdict, degraded, requeue=TUNING_RECHECK_SECONDS)
    if c.paused:
        progressing = Verdict(
            FALSE,
            ROLLOUT_PAUSED,
            f"rollout of {canary} paused at step {index}/{n} ({_pause_source(c)}); {readiness}",
        )
    elif st.promoting:
        message = f"{readiness} at full replicas; stable {stable} serves until then"
        old = c.observed(stable)
        if c.strategy == Strategy.RECREATE and old is not None and old.existing_pods > 0:
            message = f"Recreate: waiting for the {old.existing_pods} pod(s) of {stable} to terminate"
        progressing = Verdict(TRUE, PROMOTING, message)
    elif index >= n:
        why = c.waiting_on_analysis or readiness
        progressing = Verdict(TRUE, WAITING_FOR_ANALYSIS, f"promotion of {canary}: {why}")
    else:
        step = c.steps[index]
        where = step_at(index, c.steps)
        if step.pause is not None and step.pause.duration_seconds is not None:
            left = pause_left(step.pause.duration_seconds, st.step_started_at, c.now) or 0.0
            requeue.append(left)
            until = later(st.step_started_at or c.now, step.pause.duration_seconds)
            when = f"until {format_time(until)}" if until is not None else "past any calendar date"
            progressing = Verdict(TRUE, STEP_PAUSED, f"{where}: paused {when}")
        elif step.pause is not None:
            progressing = Verdict(
                FALSE,
                STEP_PAUSED,
                f"{where}: paused until promoted (kubectl triton promote)",
            )
        elif c.waiting_on_analysis is not None:
            progressing = Verdict(TRUE, WAITING_FOR_ANALYSIS, f"{where}: {c.waiting_on_analysis}")
        else:
            reason = NEW_REVISION if index == 0 else WAITING_FOR_CANARY_READY
            progressing = Verdict(TRUE, reason, f"{where}: {readiness}")
    analysis = c.inp.rollout.analysis
    if analysis is not None and analysis_active(c) and not c.paused:
        requeue.append(float(analysis.interval_seconds))
    if not c.paused:
        if waiting is not None:
            requeue.append(c.deadline_seconds() - c.seconds_since(waiting))
        if state is not None and state.unschedulable_since is not None:
            requeue.append(c.inp.rollout.unschedulable_grace() - c.seconds_since(state.unschedulable_since))
    after = max(min(requeue), 1.0) if requeue else None
    return finish(c, replicas, progressing, degraded, after)

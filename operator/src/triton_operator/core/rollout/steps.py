"""The engine's steps: the canary's chain to a fixpoint, step completion, promotion and the flip."""

from __future__ import annotations

from typing import Any

from triton_operator.core.rollout.aborts import abort, failure_of
from triton_operator.core.rollout.clock import format_time, pause_left
from triton_operator.core.rollout.outcomes import canary_plan, steady
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split, canary_replicas, gpu_split
from triton_operator.core.rollout.state import HistoryEntry
from triton_operator.core.rollout.texts import step_at, step_completed
from triton_operator.core.rollout.verdicts import gate_step
from triton_operator.core.rollout.working import Call
from triton_operator.core.vocabulary.conditions import (
    ABORTED,
    ANALYSIS_INCONCLUSIVE,
    REQUEST_IGNORED,
    ROLLOUT_COMPLETED,
    ROLLOUT_PROMOTING,
    STEP_COMPLETED,
    WARNING,
)
from triton_operator.models import Strategy

# ------------------------------------------------------------- the chain


def progress(c: Call) -> RolloutPlan:
    for _ in range(len(c.steps) + 3):
        if c.abort_requested:
            return abort(c, ABORTED)
        split = split_now(c)
        if split.too_small:
            return canary_plan(c, split, budget_blocked=True)
        if c.inp.tuning_pods and split.canary < split.canary_goal and not c.abort_requested:
            # A sweep's tuning pods hold the GPUs the canary needs: it waits, with no deadline
            # clock (they go when the sweep ends, or at its deadline: reconcile.tuning_expiry).
            return canary_plan(c, split, tuning_blocked=True)
        if not c.paused:
            failure = failure_of(c, split)
            if failure is not None:
                return abort(c, failure)
        if c.promote_full and not c.st.promoting:
            c.promote_full = False
            enter_promotion(c, "promoted in full by request")
            continue
        if c.st.promoting:
            if not c.paused and promotion_ready(c, split):
                return flip(c)
            c.promote_step = False  # nothing skips the wait for a fully Ready canary
            return canary_plan(c, split)
        index = c.position()
        if index >= len(c.steps):
            # Every step done; the promotion raises the canary's traffic, so it waits for the
            # analysis (held while paused) unless a promote request says to go on.
            if c.promote_step:
                c.promote_step, c.forced = False, True
            if not c.forced and c.paused:
                return canary_plan(c, split)
            gate = "pass" if c.forced else gate_step(c, 100)
            if gate == "abort":
                return abort(c, ANALYSIS_INCONCLUSIVE)
            if gate == "wait":
                return canary_plan(c, split)
            enter_promotion(c, "all steps done")
            continue
        if c.paused and not c.promote_step:
            return canary_plan(c, split)
        forced = c.promote_step
        c.promote_step = False
        if forced and c.steps[index].set_weight is not None and not step_done(c, index, split):
            # A promote completes a step, never the wait for its pods: the weight goes to the
            # canary only once its pods for that weight are Ready (the step completes then).
            c.event(REQUEST_IGNORED, promote_waits(c, index, split), WARNING)
            forced = False
        if forced:
            c.forced = True
            advance(c, index, forced)
            continue
        if step_done(c, index, split):
            weight = c.steps[index].set_weight
            gate = gate_step(c, weight) if weight is not None else "pass"
            if gate == "abort":
                return abort(c, ANALYSIS_INCONCLUSIVE)
            if gate == "pass":
                advance(c, index, forced)
                continue
        return canary_plan(c, split)
    return canary_plan(c, split_now(c))


def step_done(c: Call, index: int, split: Split) -> bool:
    step = c.steps[index]
    if step.set_weight is not None:
        if c.strategy == Strategy.BLUE_GREEN:
            return True
        state = c.observed(c.st.canary_revision)
        return state is not None and state.ready_at(split.canary_goal)
    if step.pause is not None:
        left = pause_left(step.pause.duration_seconds, c.st.step_started_at, c.now)
        return left is not None and left <= 0
    return True  # setHeaderRoute


def promote_waits(c: Call, index: int, split: Split) -> str:
    state = c.observed(c.st.canary_revision)
    ready = state.ready_replicas if state is not None else 0
    where = step_at(index, c.steps)
    return (
        f"promote request ignored: {where} of revision {c.st.canary_revision} gives the canary "
        f"traffic only once {split.canary_goal} of its pods are Ready ({ready} now); it completes "
        "on its own then (promote again to skip its analysis)"
    )


def advance(c: Call, index: int, forced: bool) -> None:
    step = c.steps[index]
    changes: dict[str, Any] = {
        "current_step_index": index + 1,
        "step_started_at": c.now,
        "waiting_since": None,
    }
    if step.set_weight is not None and c.strategy == Strategy.CANARY:
        changes["canary_weight"] = step.set_weight
    nxt = c.steps[index + 1] if index + 1 < len(c.steps) else None
    if nxt is not None and nxt.set_weight is not None and c.strategy == Strategy.CANARY:
        current = changes.get("canary_weight", c.st.canary_weight) or 0
        changes["canary_weight"] = min(current, nxt.set_weight)
    c.set(**changes)
    how = " by promote request" if forced else ""
    c.event(STEP_COMPLETED, step_completed(f"revision {c.st.canary_revision}", index, c.steps, how))


def enter_promotion(c: Call, why: str) -> None:
    c.set(
        promoting=True,
        current_step_index=len(c.steps),
        step_started_at=c.now,
        waiting_since=None,
    )
    c.event(
        ROLLOUT_PROMOTING,
        f"revision {c.st.canary_revision}: {why}; scaling to full replicas before it becomes stable",
    )


def promotion_ready(c: Call, split: Split) -> bool:
    state = c.observed(c.st.canary_revision)
    if state is None or not state.ready_at(split.canary_goal):
        return False
    if c.strategy == Strategy.RECREATE:
        return True
    return split.canary_goal > 0 or c.r == 0


def flip(c: Call) -> RolloutPlan:
    new = c.st.canary_revision
    old = c.st.stable_revision
    assert new is not None and old is not None
    created = format_time(c.st.stable_since) if c.st.stable_since else None
    history = [h for h in c.st.history if h.revision not in (new, old)]
    history.append(HistoryEntry(old, created))
    limit = c.inp.rollout.revision_history_limit
    kept = history[-limit:] if limit > 0 else []
    pruned = [h.revision for h in history if h not in kept]
    c.set(stable_revision=new, stable_since=c.now, history=tuple(kept))
    c.clear_canary()
    message = f"revision {new} is stable; {old} scaled to 0"
    message += " and kept in history" if any(h.revision == old for h in kept) else " and deleted"
    if pruned and pruned != [old]:
        message += f"; pruned from history: {', '.join(r for r in pruned if r != old)}"
    c.event(ROLLOUT_COMPLETED, message)
    return steady(c)


# ------------------------------------------------------------- replicas per position


def position_weight(c: Call) -> int:
    """The replica weight of the current position: the last setWeight at or before it (promotion: 100)."""
    if c.st.promoting or c.position() >= len(c.steps):
        return 100
    for step in reversed(c.steps[: c.position() + 1]):
        if step.set_weight is not None:
            return step.set_weight
    return 0


def split_now(c: Call) -> Split:
    """Stable and canary replicas for the current canary position."""
    stable_rev, canary_rev = c.st.stable_revision, c.st.canary_revision
    stable = c.observed(stable_rev)
    canary = c.observed(canary_rev)
    if c.strategy == Strategy.RECREATE:
        old_gone = stable is None or (stable.spec_replicas == 0 and stable.existing_pods == 0)
        return Split(0, c.r if old_gone else 0, 0, c.r)
    goal = c.r if c.strategy == Strategy.BLUE_GREEN else canary_replicas(c.r, position_weight(c))
    return gpu_split(
        c.r,
        goal,
        c.inp.gpus_per_pod,
        c.inp.rollout.gpu_budget,
        stable=stable,
        canary=canary,
        other_pods=c.other_pods(stable_rev, canary_rev),
    )

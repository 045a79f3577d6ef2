"""Automatic rollback: what fails a canary (crash loop, analysis, unschedulable, deadline) and the abort."""

from __future__ import annotations

from triton_operator.core.rollout.canary_analysis import FAILED
from triton_operator.core.rollout.outcomes import abort_message, held_aborted
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split
from triton_operator.core.rollout.verdicts import analysis_active, current_analysis, record
from triton_operator.core.rollout.working import Call
from triton_operator.core.vocabulary.conditions import (
    ANALYSIS_FAILED,
    ANALYSIS_INCONCLUSIVE,
    CANARY_CRASH_LOOPING,
    CANARY_UNSCHEDULABLE,
    PROGRESS_DEADLINE_EXCEEDED,
    ROLLOUT_ABORTED,
    WARNING,
)

# ------------------------------------------------------------- aborts


def failure_of(c: Call, split: Split) -> str | None:
    state = c.observed(c.st.canary_revision)
    if state is not None and state.crash_looping:
        return CANARY_CRASH_LOOPING
    result = current_analysis(c) if analysis_active(c) else None
    if result is not None and result.verdict == FAILED:
        record(c, result)
        return ANALYSIS_FAILED
    grace = c.inp.rollout.unschedulable_grace()
    if (
        state is not None
        and state.unschedulable_since is not None
        and c.elapsed(state.unschedulable_since, grace)
    ):
        return CANARY_UNSCHEDULABLE
    ready = state is not None and state.ready_at(split.canary_goal)
    if not ready and c.elapsed(c.st.waiting_since, c.deadline_seconds()):
        return PROGRESS_DEADLINE_EXCEEDED
    return None


def abort_detail(c: Call, reason: str) -> str | None:
    """What decided an abort beyond its reason: the analysis' figures, Triton's load failure."""
    if reason in (ANALYSIS_FAILED, ANALYSIS_INCONCLUSIVE):
        result = current_analysis(c)
        return result.message if result is not None else None
    state = c.observed(c.st.canary_revision)
    if reason != CANARY_CRASH_LOOPING or state is None:
        return None
    said = [f"sync: {state.sync_failure}"] if state.sync_failure else []
    said += [f"Triton: {state.triton_failure}"] if state.triton_failure else []
    return "; ".join(said) or None


def abort(c: Call, reason: str) -> RolloutPlan:
    canary = c.st.canary_revision
    index = c.position() if not c.st.promoting else len(c.steps)
    detail = abort_detail(c, reason)
    c.set(aborted_revision=canary, aborted_reason=reason, aborted_step_index=index, aborted_detail=detail)
    c.clear_canary()
    c.event(ROLLOUT_ABORTED, abort_message(c), WARNING)
    return held_aborted(c)

"""Automatic rollback: what fails a canary (crash loop, analysis, unschedulable, deadline) and the abort."""

from __future__ import annotations

from triton_operator.core.rollout.canary_analysis import FAILED
from triton_operator.core.rollout.outcomes import Outcomes
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split
from triton_operator.core.vocabulary.conditions import (
    ANALYSIS_FAILED,
    ANALYSIS_INCONCLUSIVE,
    CANARY_CRASH_LOOPING,
    CANARY_UNSCHEDULABLE,
    PROGRESS_DEADLINE_EXCEEDED,
    ROLLOUT_ABORTED,
    WARNING,
)


class Aborts(Outcomes):
    """The automatic rollback and the abort itself."""

    # ------------------------------------------------------------- aborts

    def failure(self, split: Split) -> str | None:
        state = self.observed(self.st.canary_revision)
        if state is not None and state.crash_looping:
            return CANARY_CRASH_LOOPING
        result = self.current_analysis() if self.analysis_active() else None
        if result is not None and result.verdict == FAILED:
            self.record(result)
            return ANALYSIS_FAILED
        grace = self.inp.rollout.unschedulable_grace()
        if (
            state is not None
            and state.unschedulable_since is not None
            and self.elapsed(state.unschedulable_since, grace)
        ):
            return CANARY_UNSCHEDULABLE
        ready = state is not None and state.ready_at(split.canary_goal)
        if not ready and self.elapsed(self.st.waiting_since, self.deadline_seconds()):
            return PROGRESS_DEADLINE_EXCEEDED
        return None

    def abort_detail(self, reason: str) -> str | None:
        """What decided an abort beyond its reason: the analysis' figures, Triton's load failure."""
        if reason in (ANALYSIS_FAILED, ANALYSIS_INCONCLUSIVE):
            result = self.current_analysis()
            return result.message if result is not None else None
        state = self.observed(self.st.canary_revision)
        if reason != CANARY_CRASH_LOOPING or state is None:
            return None
        said = [f"sync: {state.sync_failure}"] if state.sync_failure else []
        said += [f"Triton: {state.triton_failure}"] if state.triton_failure else []
        return "; ".join(said) or None

    def abort(self, reason: str) -> RolloutPlan:
        canary = self.st.canary_revision
        index = self.position() if not self.st.promoting else len(self.steps)
        detail = self.abort_detail(reason)
        self.set(
            aborted_revision=canary, aborted_reason=reason, aborted_step_index=index, aborted_detail=detail
        )
        self.clear_canary()
        self.event(ROLLOUT_ABORTED, self.abort_message(), WARNING)
        return self.held_aborted()

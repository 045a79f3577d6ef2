"""The engine's steps: the canary's chain to a fixpoint, step completion, promotion and the flip."""

from __future__ import annotations

from typing import Any

from triton_operator.core.rollout.aborts import Aborts
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split, canary_replicas, gpu_split
from triton_operator.core.rollout.state import HistoryEntry
from triton_operator.core.rollout.texts import describe_step
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


class Steps(Aborts):
    """The chain of steps: replicas per position, step completion, promotion and the flip."""

    # ------------------------------------------------------------- the chain

    def progress(self) -> RolloutPlan:
        for _ in range(len(self.steps) + 3):
            if self.abort_requested:
                return self.abort(ABORTED)
            split = self.split()
            if split.too_small:
                return self.canary_plan(split, budget_blocked=True)
            if self.inp.tuning_pods and split.canary < split.canary_goal and not self.abort_requested:
                # A sweep's tuning pods hold the GPUs the canary needs: it waits, with no deadline
                # clock (they go when the sweep ends, or at its deadline: reconcile.tuning_expiry).
                return self.canary_plan(split, tuning_blocked=True)
            if not self.paused:
                failure = self.failure(split)
                if failure is not None:
                    return self.abort(failure)
            if self.promote_full and not self.st.promoting:
                self.promote_full = False
                self.enter_promotion("promoted in full by request")
                continue
            if self.st.promoting:
                if not self.paused and self.promotion_ready(split):
                    return self.flip()
                self.promote_step = False  # nothing skips the wait for a fully Ready canary
                return self.canary_plan(split)
            index = self.position()
            if index >= len(self.steps):
                # Every step done; the promotion raises the canary's traffic, so it waits for the
                # analysis (held while paused) unless a promote request says to go on.
                if self.promote_step:
                    self.promote_step, self.forced = False, True
                if not self.forced and self.paused:
                    return self.canary_plan(split)
                gate = "pass" if self.forced else self.analysis_gate(100)
                if gate == "abort":
                    return self.abort(ANALYSIS_INCONCLUSIVE)
                if gate == "wait":
                    return self.canary_plan(split)
                self.enter_promotion("all steps done")
                continue
            if self.paused and not self.promote_step:
                return self.canary_plan(split)
            forced = self.promote_step
            self.promote_step = False
            if forced and self.steps[index].set_weight is not None and not self.step_done(index, split):
                # A promote completes a step, never the wait for its pods: the weight goes to the
                # canary only once its pods for that weight are Ready (the step completes then).
                self.event(REQUEST_IGNORED, self.promote_waits(index, split), WARNING)
                forced = False
            if forced:
                self.forced = True
                self.advance(index, forced)
                continue
            if self.step_done(index, split):
                weight = self.steps[index].set_weight
                gate = self.analysis_gate(weight) if weight is not None else "pass"
                if gate == "abort":
                    return self.abort(ANALYSIS_INCONCLUSIVE)
                if gate == "pass":
                    self.advance(index, forced)
                    continue
            return self.canary_plan(split)
        return self.canary_plan(self.split())

    def step_done(self, index: int, split: Split) -> bool:
        step = self.steps[index]
        if step.set_weight is not None:
            if self.strategy == Strategy.BLUE_GREEN:
                return True
            state = self.observed(self.st.canary_revision)
            return state is not None and state.ready_at(split.canary_goal)
        if step.pause is not None:
            duration = step.pause.duration_seconds
            if duration is None:
                return False
            return self.seconds_since(self.st.step_started_at) >= duration
        return True  # setHeaderRoute

    def promote_waits(self, index: int, split: Split) -> str:
        state = self.observed(self.st.canary_revision)
        ready = state.ready_replicas if state is not None else 0
        where = f"step {index}/{len(self.steps)} ({describe_step(self.steps[index])})"
        return (
            f"promote request ignored: {where} of revision {self.st.canary_revision} gives the canary "
            f"traffic only once {split.canary_goal} of its pods are Ready ({ready} now); it completes "
            "on its own then (promote again to skip its analysis)"
        )

    def advance(self, index: int, forced: bool) -> None:
        step = self.steps[index]
        changes: dict[str, Any] = {
            "current_step_index": index + 1,
            "step_started_at": self.now,
            "waiting_since": None,
        }
        if step.set_weight is not None and self.strategy == Strategy.CANARY:
            changes["canary_weight"] = step.set_weight
        nxt = self.steps[index + 1] if index + 1 < len(self.steps) else None
        if nxt is not None and nxt.set_weight is not None and self.strategy == Strategy.CANARY:
            current = changes.get("canary_weight", self.st.canary_weight) or 0
            changes["canary_weight"] = min(current, nxt.set_weight)
        self.set(**changes)
        how = " by promote request" if forced else ""
        self.event(
            STEP_COMPLETED,
            f"revision {self.st.canary_revision}: step {index}/{len(self.steps)} ({describe_step(step)}) "
            f"completed{how}",
        )

    def enter_promotion(self, why: str) -> None:
        self.set(
            promoting=True,
            current_step_index=len(self.steps),
            step_started_at=self.now,
            waiting_since=None,
        )
        self.event(
            ROLLOUT_PROMOTING,
            f"revision {self.st.canary_revision}: {why}; scaling to full replicas before it becomes stable",
        )

    def promotion_ready(self, split: Split) -> bool:
        state = self.observed(self.st.canary_revision)
        if state is None or not state.ready_at(split.canary_goal):
            return False
        if self.strategy == Strategy.RECREATE:
            return True
        return split.canary_goal > 0 or self.r == 0

    def flip(self) -> RolloutPlan:
        new = self.st.canary_revision
        old = self.st.stable_revision
        assert new is not None and old is not None
        created = format_time(self.st.stable_since) if self.st.stable_since else None
        history = [h for h in self.st.history if h.revision not in (new, old)]
        history.append(HistoryEntry(old, created))
        limit = self.inp.rollout.revision_history_limit
        kept = history[-limit:] if limit > 0 else []
        pruned = [h.revision for h in history if h not in kept]
        self.set(stable_revision=new, stable_since=self.now, history=tuple(kept))
        self.clear_canary()
        message = f"revision {new} is stable; {old} scaled to 0"
        message += " and kept in history" if any(h.revision == old for h in kept) else " and deleted"
        if pruned and pruned != [old]:
            message += f"; pruned from history: {', '.join(r for r in pruned if r != old)}"
        self.event(ROLLOUT_COMPLETED, message)
        return self.steady()

    # ------------------------------------------------------------- replicas per position

    def position_weight(self) -> int:
        """The replica weight of the current position: the last setWeight at or before it (promotion: 100)."""
        if self.st.promoting or self.position() >= len(self.steps):
            return 100
        for step in reversed(self.steps[: self.position() + 1]):
            if step.set_weight is not None:
                return step.set_weight
        return 0

    def split(self) -> Split:
        """Stable and canary replicas for the current canary position."""
        stable_rev, canary_rev = self.st.stable_revision, self.st.canary_revision
        stable = self.observed(stable_rev)
        canary = self.observed(canary_rev)
        if self.strategy == Strategy.RECREATE:
            old_gone = stable is None or (stable.spec_replicas == 0 and stable.existing_pods == 0)
            return Split(0, self.r if old_gone else 0, 0, self.r)
        goal = (
            self.r
            if self.strategy == Strategy.BLUE_GREEN
            else canary_replicas(self.r, self.position_weight())
        )
        return gpu_split(
            self.r,
            goal,
            self.inp.gpus_per_pod,
            self.inp.rollout.gpu_budget,
            stable=stable,
            canary=canary,
            other_pods=self.other_pods(stable_rev, canary_rev),
        )

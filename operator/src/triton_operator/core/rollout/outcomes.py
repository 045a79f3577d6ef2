"""The plans a call ends with (steady, held, canary) and the texts of their Progressing and Degraded."""

from __future__ import annotations

from triton_operator.core.conditions import (
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
from triton_operator.core.rollout.clock import format_time, later
from triton_operator.core.rollout.plan import RolloutPlan
from triton_operator.core.rollout.replicas import Split, gpu_split
from triton_operator.core.rollout.texts import describe_step
from triton_operator.core.rollout.verdicts import Verdicts
from triton_operator.core.traffic import TrafficWeights
from triton_operator.models import SetHeaderRoute, Strategy

TUNING_RECHECK_SECONDS = 10.0
"""How soon a pass looks again while tuning pods hold GPUs a revision waits for (their end wakes none)."""


class Outcomes(Verdicts):
    """The plan a call ends with, its conditions' texts, the header route and history kept."""

    # ------------------------------------------------------------- plans

    def header_route(self) -> SetHeaderRoute | None:
        if self.st.canary_revision is None or self.strategy == Strategy.RECREATE:
            return None
        done = self.steps if self.st.promoting else self.steps[: self.position()]
        route: SetHeaderRoute | None = None
        for step in done:
            if step.set_header_route is not None:
                route = step.set_header_route if step.set_header_route.match else None
        return route

    def keep_history(self, replicas: dict[str, int]) -> None:
        for h in self.st.history:
            if h.in_place_host is None:  # one served in place has no Deployment (core.inplace_plan)
                replicas.setdefault(h.revision, 0)

    def finish(
        self,
        replicas: dict[str, int],
        progressing: Verdict,
        degraded: Verdict,
        requeue: float | None = None,
    ) -> RolloutPlan:
        self.keep_history(replicas)
        delete = tuple(sorted(r for r in self.inp.revisions if r not in replicas))
        self.set(handled_requests=dict(sorted(self.handled.items())))
        st = self.st
        canary = st.canary_revision
        weights = TrafficWeights.canary_percent(st.canary_weight or 0) if canary else TrafficWeights()
        mode, moved = self.inp.in_place, self.moved
        chosen = mode.events if mode is not None else ()
        events = (*chosen, *self.events)
        if moved is not None:
            # The in-place mode moves the host's pods: while the host is the revision the engine
            # serves, the update's verdicts are the rollout's (a failure beats the host's steadiness).
            if moved.state is not None and moved.state.host == self.inp.desired_revision:
                progressing = moved.progressing
                degraded = moved.degraded if moved.degraded.status == TRUE else degraded
            events = (*self.events, *chosen, *moved.events)
            timed = [t for t in (requeue, moved.requeue_after) if t is not None]
            requeue = min(timed) if timed else None
        return RolloutPlan(
            replicas=replicas,
            delete=delete,
            weights=weights,
            header_route=self.header_route(),
            stable_service_revision=st.stable_revision,
            canary_service_revision=canary or st.stable_revision,
            status=st,
            conditions={PROGRESSING: progressing, DEGRADED: degraded},
            events=events,
            requeue_after=requeue,
            in_place=moved,
        )

    def stable_replicas_alone(self) -> int:
        """Stable at spec.replicas, growing only into GPUs others released when a budget is set."""
        stable_rev = self.st.stable_revision
        split = gpu_split(
            self.r,
            0,
            self.inp.gpus_per_pod,
            self.inp.rollout.gpu_budget,
            stable=self.observed(stable_rev),
            other_pods=self.other_pods(stable_rev),
        )
        return split.stable

    def steady(self) -> RolloutPlan:
        stable = self.st.stable_revision
        assert stable is not None
        state = self.observed(stable)
        replicas = {stable: self.stable_replicas_alone()}
        if state is not None and state.ready_at(self.r):
            progressing = Verdict(
                FALSE, ROLLOUT_COMPLETED, f"revision {stable} is stable at {self.r} replicas"
            )
        else:
            ready = state.ready_replicas if state else 0
            progressing = Verdict(
                TRUE,
                WAITING_FOR_STABLE_READY,
                f"revision {stable}: {ready}/{self.r} replicas Ready",
            )
        degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
        replaced = self.st.replaced_revision
        if replaced is not None and state is not None and state.ready_at(self.r):
            self.set(replaced_revision=None)
        elif replaced is not None:
            message = (
                f"stable revision {replaced} had no Deployment: replaced by revision {stable}; "
                f"{progressing.message}"
            )
            degraded = Verdict(TRUE, STABLE_REVISION_MISSING, message)
        held_by_tuning = self.inp.tuning_pods > 0 and replicas[stable] < self.r
        return self.finish(
            replicas, progressing, degraded, TUNING_RECHECK_SECONDS if held_by_tuning else None
        )

    def held_before_start(self) -> RolloutPlan:
        stable = self.st.stable_revision
        assert stable is not None
        replicas = {stable: self.stable_replicas_alone()}
        progressing = Verdict(
            FALSE,
            ROLLOUT_PAUSED,
            f"revision {self.target} waits: the rollout is paused ({self._pause_source()})",
        )
        degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
        return self.finish(replicas, progressing, degraded)

    def held_aborted(self) -> RolloutPlan:
        stable = self.st.stable_revision
        aborted = self.st.aborted_revision
        assert stable is not None and aborted is not None
        replicas = {stable: self.stable_replicas_alone(), aborted: 0}
        message = self.abort_message()
        progressing = Verdict(
            FALSE,
            ROLLOUT_ABORTED,
            f"{message}; change the spec or request a retry (kubectl triton retry) to try again",
        )
        degraded = Verdict(TRUE, self.st.aborted_reason or ABORTED, message)
        return self.finish(replicas, progressing, degraded)

    def abort_message(self) -> str:
        st = self.st
        details = {
            PROGRESS_DEADLINE_EXCEEDED: f"canary not fully Ready within {self.deadline_seconds()}s",
            CANARY_CRASH_LOOPING: "canary pods are crash-looping",
            CANARY_UNSCHEDULABLE: f"canary pods unschedulable for more than "
            f"{self.inp.rollout.unschedulable_grace()}s",
            ABORTED: "aborted by request",
            ANALYSIS_FAILED: "analysis failed",
            ANALYSIS_INCONCLUSIVE: "analysis inconclusive",
        }
        index = st.aborted_step_index if st.aborted_step_index is not None else 0
        where = f"step {index}" if index < len(self.steps) else f"step {index} (promotion)"
        detail = details.get(st.aborted_reason or "", st.aborted_reason or "aborted")
        if st.aborted_detail:
            detail = f"{detail}: {st.aborted_detail}"
        return (
            f"rollout of revision {st.aborted_revision} aborted at {where}: {detail}; "
            f"stable revision {st.stable_revision} serves all traffic"
        )

    def _pause_source(self) -> str:
        if self.inp.rollout.paused:
            return "spec.rollout.paused"
        return "pause request; kubectl triton resume"

    def canary_plan(
        self, split: Split, budget_blocked: bool = False, tuning_blocked: bool = False
    ) -> RolloutPlan:
        st = self.st
        stable, canary = st.stable_revision, st.canary_revision
        assert stable is not None and canary is not None
        state = self.observed(canary)
        replicas = {stable: split.stable, canary: split.canary}
        ready_now = state is not None and state.ready_at(split.canary_goal)
        # The deadline clock: when the canary began waiting at this position (paused: no clock).
        held = ready_now or self.paused or budget_blocked or tuning_blocked
        waiting = None if held else (st.waiting_since or self.now)
        self.set(waiting_since=waiting)
        n = len(self.steps)
        index = self.position()
        ready = state.ready_replicas if state else 0
        readiness = f"canary {canary}: {ready}/{split.canary_goal} Ready"
        degraded = Verdict(FALSE, AS_EXPECTED, "no rollout failed")
        requeue: list[float] = []
        if budget_blocked:
            gpus, budget = self.inp.gpus_per_pod, self.inp.rollout.gpu_budget
            message = (
                f"gpuBudget {budget} holds {(budget or 0) // max(gpus, 1)} pods of {gpus} GPUs: not enough "
                f"for one canary pod beside a serving stable of {self.r}; raise it or use Recreate"
            )
            progressing = Verdict(FALSE, GPU_BUDGET_TOO_SMALL, message)
            degraded = Verdict(TRUE, GPU_BUDGET_TOO_SMALL, message)
            return self.finish(replicas, progressing, degraded)
        if tuning_blocked:
            message = (
                f"{readiness}: {self.inp.tuning_pods} tuning pod(s) (kubectl triton tune) hold GPUs of "
                f"gpuBudget {self.inp.rollout.gpu_budget}; the canary grows to {split.canary_goal} "
                "when they are gone"
            )
            # Tuning pods wake no pass when they go (nothing of the TritonService's own): look again.
            verdict = Verdict(TRUE, WAITING_FOR_CANARY_READY, message)
            return self.finish(replicas, verdict, degraded, requeue=TUNING_RECHECK_SECONDS)
        if self.paused:
            progressing = Verdict(
                FALSE,
                ROLLOUT_PAUSED,
                f"rollout of {canary} paused at step {index}/{n} ({self._pause_source()}); {readiness}",
            )
        elif st.promoting:
            message = f"{readiness} at full replicas; stable {stable} serves until then"
            old = self.observed(stable)
            if self.strategy == Strategy.RECREATE and old is not None and old.existing_pods > 0:
                message = f"Recreate: waiting for the {old.existing_pods} pod(s) of {stable} to terminate"
            progressing = Verdict(TRUE, PROMOTING, message)
        elif index >= n:
            why = self.waiting_on_analysis or readiness
            progressing = Verdict(TRUE, WAITING_FOR_ANALYSIS, f"promotion of {canary}: {why}")
        else:
            step = self.steps[index]
            where = f"step {index}/{n} ({describe_step(step)})"
            if step.pause is not None and step.pause.duration_seconds is not None:
                left = step.pause.duration_seconds - self.seconds_since(st.step_started_at)
                requeue.append(left)
                until = later(st.step_started_at or self.now, step.pause.duration_seconds)
                when = f"until {format_time(until)}" if until is not None else "past any calendar date"
                progressing = Verdict(TRUE, STEP_PAUSED, f"{where}: paused {when}")
            elif step.pause is not None:
                progressing = Verdict(
                    FALSE,
                    STEP_PAUSED,
                    f"{where}: paused until promoted (kubectl triton promote)",
                )
            elif self.waiting_on_analysis is not None:
                progressing = Verdict(TRUE, WAITING_FOR_ANALYSIS, f"{where}: {self.waiting_on_analysis}")
            else:
                reason = NEW_REVISION if index == 0 else WAITING_FOR_CANARY_READY
                progressing = Verdict(TRUE, reason, f"{where}: {readiness}")
        analysis = self.inp.rollout.analysis
        if analysis is not None and self.analysis_active() and not self.paused:
            requeue.append(float(analysis.interval_seconds))
        if not self.paused:
            if waiting is not None:
                requeue.append(self.deadline_seconds() - self.seconds_since(waiting))
            if state is not None and state.unschedulable_since is not None:
                requeue.append(
                    self.inp.rollout.unschedulable_grace() - self.seconds_since(state.unschedulable_since)
                )
        after = max(min(requeue), 1.0) if requeue else None
        return self.finish(replicas, progressing, degraded, after)

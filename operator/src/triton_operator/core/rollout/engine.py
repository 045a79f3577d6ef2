"""The rollout engine: spec, status, observed revisions and control requests in; one level-based plan out."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Literal

from triton_operator.core.analysis import FAILED, INCONCLUSIVE, PASSED, AnalysisResult
from triton_operator.core.conditions import (
    ABORTED,
    ANALYSIS_FAILED,
    ANALYSIS_INCONCLUSIVE,
    ANALYSIS_PASSED,
    AS_EXPECTED,
    CANARY_CRASH_LOOPING,
    CANARY_REPLACED,
    CANARY_UNSCHEDULABLE,
    DEGRADED,
    FALSE,
    GPU_BUDGET_TOO_SMALL,
    NEW_REVISION,
    NORMAL,
    PROGRESS_DEADLINE_EXCEEDED,
    PROGRESSING,
    PROMOTING,
    REQUEST_IGNORED,
    REVISION_DEPLOYED,
    ROLLOUT_ABORTED,
    ROLLOUT_CANCELLED,
    ROLLOUT_COMPLETED,
    ROLLOUT_PAUSED,
    ROLLOUT_PROMOTING,
    ROLLOUT_RESUMED,
    ROLLOUT_RETRIED,
    ROLLOUT_ROLLBACK,
    ROLLOUT_STARTED,
    STABLE_ADOPTED,
    STABLE_REVISION_MISSING,
    STEP_COMPLETED,
    STEP_PAUSED,
    TRUE,
    UNDO_REJECTED,
    UNDO_REQUESTED,
    WAITING_FOR_ANALYSIS,
    WAITING_FOR_CANARY_READY,
    WAITING_FOR_STABLE_READY,
    WARNING,
    Verdict,
)
from triton_operator.core.rollout.clock import format_time, later, to_utc
from triton_operator.core.rollout.plan import RolloutEvent, RolloutInput, RolloutPlan
from triton_operator.core.rollout.replicas import Split, canary_replicas, gpu_split
from triton_operator.core.rollout.requests import ACTIONS, FOR_REVISION, Action, ControlRequest
from triton_operator.core.rollout.state import (
    ANALYSIS_RUNS_KEPT,
    AnalysisRun,
    HistoryEntry,
    RevisionState,
    under_analysis,
)
from triton_operator.core.rollout.texts import describe_step
from triton_operator.core.traffic import TrafficWeights
from triton_operator.models import CanaryStep, Inconclusive, SetHeaderRoute, Strategy

# How the engine works (states, replica maths, traffic, step completion, analysis, automatic
# rollback, control requests, history), with worked examples: docs/rollouts.md, "How the engine works".


def plan_rollout(inp: RolloutInput) -> RolloutPlan:
    """The whole rollout decision for one reconcile (docs/rollouts.md, "How the engine works")."""
    return _Engine(inp).run()


class _Engine:
    """One call's working state; pure: reads the input, builds the plan, touches nothing else."""

    def __init__(self, inp: RolloutInput) -> None:
        self.inp = inp
        self.now = to_utc(inp.now).replace(microsecond=0)
        self.st = inp.status
        self.r = max(inp.replicas, 0)
        self.strategy = inp.rollout.strategy
        self.steps: tuple[CanaryStep, ...] = (
            () if self.strategy == Strategy.RECREATE else tuple(inp.rollout.steps)
        )
        self.events: list[RolloutEvent] = []
        self.handled: dict[str, str] = dict(inp.status.handled_requests)
        self.promote_step = False
        self.promote_full = False
        self.abort_requested = False
        self.retry = False
        self.target = inp.desired_revision
        self.rollback = False
        self.made_for: dict[Action, str] = {}
        """The revision each FOR_REVISION request taken in this call applies to (only that one)."""
        self.forced = False
        """A promote request completed a step in this call: the promotion after it skips the analysis."""
        self.waiting_on_analysis: str | None = None
        """Why the current step waits for the analysis (the Progressing message), when it does."""

    # ------------------------------------------------------------- small helpers

    def set(self, **changes: Any) -> None:
        self.st = dataclasses.replace(self.st, **changes)

    def event(self, reason: str, message: str, kind: str = NORMAL) -> None:
        self.events.append(RolloutEvent(kind, reason, message))

    @property
    def paused(self) -> bool:
        return self.inp.rollout.paused or self.st.paused_by_user

    def observed(self, revision: str | None) -> RevisionState | None:
        return self.inp.revisions.get(revision) if revision else None

    def history_revisions(self) -> list[str]:
        return [h.revision for h in self.st.history]

    def seconds_since(self, moment: datetime | None) -> float:
        return (self.now - moment).total_seconds() if moment is not None else 0.0

    def deadline_seconds(self) -> int:
        """The progress deadline: the spec's effective one (it knows the startup timeout), else rollout's."""
        if self.inp.progress_deadline_seconds is not None:
            return self.inp.progress_deadline_seconds
        return self.inp.rollout.progress_deadline()

    def elapsed(self, since: datetime | None, seconds: int) -> bool:
        return since is not None and self.seconds_since(since) >= seconds

    def position(self) -> int:
        index = self.st.current_step_index or 0
        return min(max(index, 0), len(self.steps))

    def other_pods(self, *exclude: str | None) -> int:
        return sum(s.gpu_pods for rev, s in self.inp.revisions.items() if rev not in exclude)

    # ------------------------------------------------------------- requests

    def take_requests(self) -> None:
        pending = [
            r for r in self.inp.requests if r.action in ACTIONS and self.handled.get(r.action) != r.request_id
        ]
        for req in sorted(pending, key=lambda r: (r.request_id, ACTIONS.index(r.action))):
            self.handled[req.action] = req.request_id
            if req.action == "pause":
                if not self.st.paused_by_user:
                    self.set(paused_by_user=True)
                    self.event(ROLLOUT_PAUSED, "rollout paused by request")
            elif req.action == "resume":
                if self.st.paused_by_user:
                    self.set(paused_by_user=False)
                    self.event(ROLLOUT_RESUMED, "rollout resumed by request")
            elif req.action in FOR_REVISION:
                self.take_for_revision(req)
            elif req.action == "retry":
                self.retry = True
            elif req.action == "undo":
                self.undo(req.to_revision)

    def take_for_revision(self, req: ControlRequest) -> None:
        """A promote, promote-full or abort applies to the revision it was made for, and only while
        that one is in progress: never to a canary that replaces it, nor to the next rollout's."""
        st = self.inp.status
        in_progress = st.canary_revision or st.aborted_revision
        revision = req.revision or in_progress
        if revision is None or revision not in (st.canary_revision, st.aborted_revision):
            now = f"revision {in_progress} is in progress" if in_progress else "no rollout is in progress"
            made = f"made for revision {revision}" if revision else "made while no rollout ran"
            self.event(REQUEST_IGNORED, f"{req.action} request {req.request_id} ignored: {made}; {now}")
            return
        self.made_for[req.action] = revision
        if req.action == "abort":
            self.abort_requested = True
            return
        self.promote_step = self.promote_step or req.action == "promote"
        self.promote_full = self.promote_full or req.action == "promote-full"
        self.set(paused_by_user=False)

    def scope_requests(self) -> None:
        """Drop the requests made for a revision that is not the canary any more (replaced, cancelled)."""
        canary = self.st.canary_revision
        self.promote_step = self.promote_step and self.made_for.get("promote") == canary
        self.promote_full = self.promote_full and self.made_for.get("promote-full") == canary
        self.abort_requested = self.abort_requested and self.made_for.get("abort") == canary

    def dropped_requests(self, revision: str) -> str:
        """What a message says of the requests made for ``revision`` when it goes (none: "")."""
        dropped = [a for a, r in sorted(self.made_for.items()) if r == revision]
        return f"; the {' and '.join(dropped)} request made for it is dropped" if dropped else ""

    def undo(self, to_revision: str | None) -> None:
        history = self.history_revisions()
        target = to_revision or (history[-1] if history else None)
        if target is None:
            self.event(UNDO_REJECTED, "undo: no earlier revision in history", WARNING)
            return
        if target != self.st.stable_revision and target not in history:
            known = ", ".join(history) or "none"
            self.event(UNDO_REJECTED, f"undo: revision {target} is not in history ({known})", WARNING)
            return
        if target not in self.inp.revisions and target != self.inp.desired_revision:
            self.event(UNDO_REJECTED, f"undo: revision {target} has no Deployment left", WARNING)
            return
        if target in self.inp.unsyncable:
            # Its pods would fail their sync: the serving revision is never scaled down for it.
            why = self.inp.unsyncable[target]
            self.event(UNDO_REJECTED, f"undo: revision {target} cannot sync any more: {why}", WARNING)
            return
        self.set(pinned_revision=target, pinned_for=self.inp.desired_revision)
        self.event(
            UNDO_REQUESTED,
            f"rolling back to revision {target}; the spec's revision {self.inp.desired_revision} waits "
            "until the spec changes or a retry request",
        )

    def resolve_target(self) -> None:
        st = self.st
        if st.pinned_revision and (st.pinned_for != self.inp.desired_revision or self.retry):
            self.set(pinned_revision=None, pinned_for=None)
        self.target = self.st.pinned_revision or self.inp.desired_revision
        aborted = self.st.aborted_revision
        if aborted is not None:
            promoted = aborted in (self.made_for.get("promote"), self.made_for.get("promote-full"))
            asked = self.retry or promoted
            if aborted != self.target or asked:
                if aborted == self.target:
                    self.event(ROLLOUT_RETRIED, f"retrying revision {aborted} from step 0")
                    self.promote_step = self.promote_full = False
                self.set(
                    aborted_revision=None, aborted_reason=None, aborted_step_index=None, aborted_detail=None
                )

    # ------------------------------------------------------------- the chain

    def run(self) -> RolloutPlan:
        self.take_requests()
        self.resolve_target()
        st = self.st
        target = self.target
        if st.stable_revision is None:
            serving = self.serving_revision()
            if serving is None:
                self.set(stable_revision=target, stable_since=self.now)
                self.clear_canary()
                self.event(REVISION_DEPLOYED, f"revision {target} deployed at {self.r} replicas")
                return self.steady()
            # The status was lost (restored backup, recreated object) while pods serve: whatever
            # serves most stays stable and the desired revision rolls out over it, not at once.
            self.set(stable_revision=serving, stable_since=self.now)
            self.event(
                STABLE_ADOPTED, f"no stable revision in status: revision {serving} serves, kept as stable"
            )
            st = self.st
        if st.stable_revision not in self.inp.revisions and st.stable_revision != target:
            self.replace_missing_stable()
            st = self.st
        if target == st.stable_revision:
            if st.canary_revision is not None:
                self.event(
                    ROLLOUT_CANCELLED,
                    f"the desired revision is the stable {target} again: canary {st.canary_revision} removed",
                )
                self.clear_canary()
            return self.steady()
        if st.aborted_revision == target:
            return self.held_aborted()
        if st.canary_revision is not None and st.canary_revision != target:
            replaced = st.canary_revision
            message = f"revision {target} replaces canary {replaced}{self.dropped_requests(replaced)}"
            self.event(CANARY_REPLACED, message)
            self.clear_canary()
        if self.st.canary_revision is None:
            if self.paused:
                return self.held_before_start()
            self.start()
        self.scope_requests()
        return self.progress()

    def replace_missing_stable(self) -> None:
        """The stable revision has no Deployment (deleted by hand, or left by a recreated object).

        Only the spec's revision can be rendered, so it takes the stable's place at full replicas
        at once (no steps: there is nothing to compare a canary with, and nothing serves).
        Degraded says so until it is Ready. (A missing stable that is the spec's revision needs
        none of this: every reconcile renders the spec's revision, so it is simply created again.)
        """
        missing = self.st.stable_revision
        target = self.target
        self.event(
            STABLE_REVISION_MISSING,
            f"stable revision {missing} has no Deployment and cannot be rebuilt from this spec: "
            f"revision {target} takes its place at {self.r} replicas",
            WARNING,
        )
        self.set(
            stable_revision=target,
            stable_since=self.now,
            replaced_revision=missing,
            aborted_revision=None,
            aborted_reason=None,
            aborted_step_index=None,
            aborted_detail=None,
        )
        self.clear_canary()

    def serving_revision(self) -> str | None:
        """The observed revision other than the target with the most Ready pods, if any has one."""
        serving = [(s.ready_replicas, rev) for rev, s in self.inp.revisions.items() if rev != self.target]
        best = max(serving, default=None)
        return best[1] if best is not None and best[0] > 0 else None

    def clear_canary(self) -> None:
        self.set(
            canary_revision=None,
            canary_weight=None,
            current_step_index=None,
            step_started_at=None,
            canary_started_at=None,
            waiting_since=None,
            promoting=False,
        )

    def start(self) -> None:
        target = self.target
        self.rollback = target in self.history_revisions()
        promoting = self.rollback or not self.steps
        self.set(
            analysis_runs=(),
            canary_revision=target,
            canary_weight=100 if self.strategy == Strategy.RECREATE else 0,
            current_step_index=len(self.steps) if promoting else 0,
            step_started_at=self.now,
            canary_started_at=self.now,
            waiting_since=None,
            promoting=promoting,
        )
        if self.rollback:
            self.event(
                ROLLOUT_ROLLBACK,
                f"revision {target} served before (history): rolling back to it without steps "
                f"({self.strategy.value}); stable {self.st.stable_revision} serves until it is Ready",
            )
        else:
            self.event(
                ROLLOUT_STARTED,
                f"rolling out revision {target} over stable {self.st.stable_revision} "
                f"({self.strategy.value}, {len(self.steps)} steps)",
            )

    def progress(self) -> RolloutPlan:
        for _ in range(len(self.steps) + 3):
            if self.abort_requested:
                return self.abort(ABORTED)
            split = self.split()
            if split.too_small:
                return self.canary_plan(split, budget_blocked=True)
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

    # ------------------------------------------------------------- analysis

    def analysis_active(self) -> bool:
        return under_analysis(self.inp.rollout, self.st)

    def current_analysis(self) -> AnalysisResult | None:
        """The verdict of the current weight's window, when the reconcile read one for this canary."""
        result = self.inp.analysis
        if (
            result is None
            or result.revision != self.st.canary_revision
            or result.weight != (self.st.canary_weight or 0)
        ):
            return None
        return result

    def record(self, result: AnalysisResult, verdict: str | None = None) -> None:
        run = AnalysisRun(
            revision=result.revision,
            step_index=self.position(),
            weight=result.weight,
            verdict=verdict or result.verdict,
            message=result.message,
            at=format_time(self.now),
        )
        self.set(analysis_runs=(*self.st.analysis_runs, run)[-ANALYSIS_RUNS_KEPT:])

    def analysis_gate(self, new_weight: int) -> Literal["pass", "wait", "abort"]:
        """Whether a step may raise the canary's traffic to ``new_weight``: "pass", "wait", or "abort"
        (inconclusive for too long with onInconclusive Abort). Pause pauses the rollout and waits."""
        spec = self.inp.rollout.analysis
        if spec is None or not self.analysis_active() or new_weight <= (self.st.canary_weight or 0):
            return "pass"
        result = self.current_analysis()
        if result is None:
            self.waiting_on_analysis = (
                f"waiting for the first reading of the canary's metrics at weight {self.st.canary_weight}"
            )
            return "wait"
        if result.verdict == PASSED:
            self.record(result)
            self.event(ANALYSIS_PASSED, f"revision {result.revision}: {result.message}")
            return "pass"
        self.waiting_on_analysis = result.message
        if result.verdict == INCONCLUSIVE and result.window_seconds >= spec.inconclusive_after_seconds:
            if spec.on_inconclusive == Inconclusive.ABORT:
                self.record(result)
                return "abort"
            if spec.on_inconclusive == Inconclusive.PAUSE and not self.st.paused_by_user:
                self.record(result, "Paused")
                self.set(paused_by_user=True)
                self.event(
                    ANALYSIS_INCONCLUSIVE,
                    f"revision {result.revision}: {result.message}; rollout paused "
                    "(kubectl triton resume to wait on, promote to go on without it, abort to roll back)",
                    WARNING,
                )
        return "wait"

    def abort_detail(self, reason: str) -> str | None:
        """What decided an abort beyond its reason: the analysis' figures, Triton's load failure."""
        if reason in (ANALYSIS_FAILED, ANALYSIS_INCONCLUSIVE):
            result = self.current_analysis()
            return result.message if result is not None else None
        state = self.observed(self.st.canary_revision)
        if reason == CANARY_CRASH_LOOPING and state is not None and state.triton_failure:
            return f"Triton: {state.triton_failure}"
        return None

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

    def header_route(self) -> SetHeaderRoute | None:
        if self.st.canary_revision is None or self.strategy == Strategy.RECREATE:
            return None
        done = self.steps if self.st.promoting else self.steps[: self.position()]
        route: SetHeaderRoute | None = None
        for step in done:
            if step.set_header_route is not None:
                route = step.set_header_route if step.set_header_route.match else None
        return route

    # ------------------------------------------------------------- plans

    def keep_history(self, replicas: dict[str, int]) -> None:
        for h in self.st.history:
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
        return RolloutPlan(
            replicas=replicas,
            delete=delete,
            weights=weights,
            header_route=self.header_route(),
            stable_service_revision=st.stable_revision,
            canary_service_revision=canary or st.stable_revision,
            status=st,
            conditions={PROGRESSING: progressing, DEGRADED: degraded},
            events=tuple(self.events),
            requeue_after=requeue,
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
        return self.finish(replicas, progressing, degraded)

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

    def _pause_source(self) -> str:
        if self.inp.rollout.paused:
            return "spec.rollout.paused"
        return "pause request; kubectl triton resume"

    def canary_plan(self, split: Split, budget_blocked: bool = False) -> RolloutPlan:
        st = self.st
        stable, canary = st.stable_revision, st.canary_revision
        assert stable is not None and canary is not None
        state = self.observed(canary)
        replicas = {stable: split.stable, canary: split.canary}
        ready_now = state is not None and state.ready_at(split.canary_goal)
        # The deadline clock: when the canary began waiting at this position (paused: no clock).
        waiting = None if (ready_now or self.paused or budget_blocked) else (st.waiting_since or self.now)
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

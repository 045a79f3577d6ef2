"""The rollout engine: spec, status, observed revisions and control requests in; one level-based plan out."""

from __future__ import annotations

from triton_operator.core.conditions import (
    CANARY_REPLACED,
    REQUEST_IGNORED,
    REVISION_DEPLOYED,
    ROLLOUT_CANCELLED,
    ROLLOUT_PAUSED,
    ROLLOUT_RESUMED,
    ROLLOUT_RETRIED,
    ROLLOUT_ROLLBACK,
    ROLLOUT_STARTED,
    STABLE_ADOPTED,
    STABLE_REVISION_MISSING,
    UNDO_REJECTED,
    UNDO_REQUESTED,
    WARNING,
)
from triton_operator.core.rollout.inplace import history_after, plan_in_place
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.requests import ACTIONS, FOR_REVISION, ControlRequest
from triton_operator.core.rollout.steps import Steps
from triton_operator.models import ANALYSIS_RUNS_KEPT, Strategy

# How the engine works (states, replica maths, traffic, step completion, analysis, automatic
# rollback, control requests, history), with worked examples: docs/rollouts.md, "How the engine works".


def plan_rollout(inp: RolloutInput) -> RolloutPlan:
    """The whole rollout decision for one reconcile (docs/rollouts.md, "How the engine works"):
    the in-place mode's host pods first (when one is chosen), then the revisions' Deployments."""
    call = _Engine(inp)
    call.move_in_place()
    return call.run()


class _Engine(Steps):
    """The whole call: control requests, the revision to serve, and which chain runs."""

    # ------------------------------------------------------------- in place

    def move_in_place(self) -> None:
        """The in-place mode's step mover: the host pods' agents load the next revision, step by
        step (core.rollout.inplace). It reads the status as it came in; its requests were taken when
        the mode was chosen. What it decided joins the call's status: the requests handled, the
        analyses recorded, a pause, and, once the update completed, the history (as a flip's)."""
        mode = self.inp.in_place
        if mode is None:
            return
        self.handled.update(mode.handled)
        if mode.update is None:
            return
        moved = self.moved = plan_in_place(mode.update)
        limit = self.inp.rollout.revision_history_limit
        history = history_after(self.st.history, limit, mode.update.state, moved.state)
        if history is not None:
            self.set(history=history)
        if moved.analysis_runs or moved.pause:
            runs = (*self.st.analysis_runs, *moved.analysis_runs)[-ANALYSIS_RUNS_KEPT:]
            self.set(analysis_runs=runs, paused_by_user=self.st.paused_by_user or moved.pause)

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
            entry = next((h for h in self.st.history if h.revision == target), None)
            if entry is not None and entry.in_place_host is not None:
                # core.inplace_plan takes the undos it can load in place; this one it could not.
                why = (
                    f"undo: revision {target} was served only in place, in the pods of revision "
                    f"{entry.in_place_host}: it can be loaded back only in place, into those pods "
                    "(spec.rollout.modelUpdates: InPlace, while they serve and no rollout of new pods runs)"
                )
                self.event(UNDO_REJECTED, why, WARNING)
                return
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

"""The rollout engine: spec, status, observed revisions and control requests in; one level-based plan out."""

from __future__ import annotations

from triton_operator.core.rollout.inplace import history_after, plan_in_place
from triton_operator.core.rollout.outcomes import held_aborted, held_before_start, steady
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.requests import ACTIONS, FOR_REVISION, ControlRequest
from triton_operator.core.rollout.steps import progress
from triton_operator.core.rollout.working import Call
from triton_operator.core.vocabulary.conditions import (
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
from triton_operator.models import ANALYSIS_RUNS_KEPT, Strategy

# How the engine works (states, replica maths, traffic, step completion, analysis, automatic
# rollback, control requests, history), with worked examples: docs/rollouts.md, "How the engine works".


def plan_rollout(inp: RolloutInput) -> RolloutPlan:
    """The whole rollout decision for one reconcile (docs/rollouts.md, "How the engine works"):
    the in-place mode's host pods first (when one is chosen), then the revisions' Deployments."""
    c = Call(inp)
    move_in_place(c)
    return run(c)


# ------------------------------------------------------------- in place


def move_in_place(c: Call) -> None:
    """The in-place mode's step mover: the host pods' agents load the next revision, step by
    step (core.rollout.inplace). It reads the status as it came in; its requests were taken when
    the mode was chosen. What it decided joins the call's status: the requests handled, the
    analyses recorded, a pause, and, once the update completed, the history (as a flip's)."""
    mode = c.inp.in_place
    if mode is None:
        return
    c.handled.update(mode.handled)
    if mode.update is None:
        return
    moved = c.moved = plan_in_place(mode.update)
    limit = c.inp.rollout.revision_history_limit
    history = history_after(c.st.history, limit, mode.update.state, moved.state)
    if history is not None:
        c.set(history=history)
    if moved.analysis_runs or moved.pause:
        runs = (*c.st.analysis_runs, *moved.analysis_runs)[-ANALYSIS_RUNS_KEPT:]
        c.set(analysis_runs=runs, paused_by_user=c.st.paused_by_user or moved.pause)


# ------------------------------------------------------------- requests


def take_requests(c: Call) -> None:
    pending = [r for r in c.inp.requests if r.action in ACTIONS and c.handled.get(r.action) != r.request_id]
    for req in sorted(pending, key=lambda r: (r.request_id, ACTIONS.index(r.action))):
        c.handled[req.action] = req.request_id
        if req.action == "pause":
            if not c.st.paused_by_user:
                c.set(paused_by_user=True)
                c.event(ROLLOUT_PAUSED, "rollout paused by request")
        elif req.action == "resume":
            if c.st.paused_by_user:
                c.set(paused_by_user=False)
                c.event(ROLLOUT_RESUMED, "rollout resumed by request")
        elif req.action in FOR_REVISION:
            take_for_revision(c, req)
        elif req.action == "retry":
            c.retry = True
        elif req.action == "undo":
            undo(c, req.to_revision)


def take_for_revision(c: Call, req: ControlRequest) -> None:
    """A promote, promote-full or abort applies to the revision it was made for, and only while
    that one is in progress: never to a canary that replaces it, nor to the next rollout's."""
    st = c.inp.status
    in_progress = st.canary_revision or st.aborted_revision
    revision = req.revision or in_progress
    if revision is None or revision not in (st.canary_revision, st.aborted_revision):
        now = f"revision {in_progress} is in progress" if in_progress else "no rollout is in progress"
        made = f"made for revision {revision}" if revision else "made while no rollout ran"
        c.event(REQUEST_IGNORED, f"{req.action} request {req.request_id} ignored: {made}; {now}")
        return
    c.made_for[req.action] = revision
    if req.action == "abort":
        c.abort_requested = True
        return
    c.promote_step = c.promote_step or req.action == "promote"
    c.promote_full = c.promote_full or req.action == "promote-full"
    c.set(paused_by_user=False)


def scope_requests(c: Call) -> None:
    """Drop the requests made for a revision that is not the canary any more (replaced, cancelled)."""
    canary = c.st.canary_revision
    c.promote_step = c.promote_step and c.made_for.get("promote") == canary
    c.promote_full = c.promote_full and c.made_for.get("promote-full") == canary
    c.abort_requested = c.abort_requested and c.made_for.get("abort") == canary


def dropped_requests(c: Call, revision: str) -> str:
    """What a message says of the requests made for ``revision`` when it goes (none: "")."""
    dropped = [a for a, r in sorted(c.made_for.items()) if r == revision]
    return f"; the {' and '.join(dropped)} request made for it is dropped" if dropped else ""


def undo(c: Call, to_revision: str | None) -> None:
    history = c.history_revisions()
    target = to_revision or (history[-1] if history else None)
    if target is None:
        c.event(UNDO_REJECTED, "undo: no earlier revision in history", WARNING)
        return
    if target != c.st.stable_revision and target not in history:
        known = ", ".join(history) or "none"
        c.event(UNDO_REJECTED, f"undo: revision {target} is not in history ({known})", WARNING)
        return
    if target not in c.inp.revisions and target != c.inp.desired_revision:
        entry = next((h for h in c.st.history if h.revision == target), None)
        if entry is not None and entry.in_place_host is not None:
            # core.decision.inplace_plan takes the undos it can load in place; this one it could not.
            why = (
                f"undo: revision {target} was served only in place, in the pods of revision "
                f"{entry.in_place_host}: it can be loaded back only in place, into those pods "
                "(spec.rollout.modelUpdates: InPlace, while they serve and no rollout of new pods runs)"
            )
            c.event(UNDO_REJECTED, why, WARNING)
            return
        c.event(UNDO_REJECTED, f"undo: revision {target} has no Deployment left", WARNING)
        return
    if target in c.inp.unsyncable:
        # Its pods would fail their sync: the serving revision is never scaled down for it.
        why = c.inp.unsyncable[target]
        c.event(UNDO_REJECTED, f"undo: revision {target} cannot sync any more: {why}", WARNING)
        return
    c.set(pinned_revision=target, pinned_for=c.inp.desired_revision)
    c.event(
        UNDO_REQUESTED,
        f"rolling back to revision {target}; the spec's revision {c.inp.desired_revision} waits "
        "until the spec changes or a retry request",
    )


def resolve_target(c: Call) -> None:
    st = c.st
    if st.pinned_revision and (st.pinned_for != c.inp.desired_revision or c.retry):
        c.set(pinned_revision=None, pinned_for=None)
    c.target = c.st.pinned_revision or c.inp.desired_revision
    aborted = c.st.aborted_revision
    if aborted is not None:
        promoted = aborted in (c.made_for.get("promote"), c.made_for.get("promote-full"))
        asked = c.retry or promoted
        if aborted != c.target or asked:
            if aborted == c.target:
                c.event(ROLLOUT_RETRIED, f"retrying revision {aborted} from step 0")
                c.promote_step = c.promote_full = False
            c.set(aborted_revision=None, aborted_reason=None, aborted_step_index=None, aborted_detail=None)


# ------------------------------------------------------------- the chain


def run(c: Call) -> RolloutPlan:
    take_requests(c)
    resolve_target(c)
    st = c.st
    target = c.target
    if st.stable_revision is None:
        serving = serving_revision(c)
        if serving is None:
            c.set(stable_revision=target, stable_since=c.now)
            c.clear_canary()
            c.event(REVISION_DEPLOYED, f"revision {target} deployed at {c.r} replicas")
            return steady(c)
        # The status was lost (restored backup, recreated object) while pods serve: whatever
        # serves most stays stable and the desired revision rolls out over it, not at once.
        c.set(stable_revision=serving, stable_since=c.now)
        c.event(STABLE_ADOPTED, f"no stable revision in status: revision {serving} serves, kept as stable")
        st = c.st
    if st.stable_revision not in c.inp.revisions and st.stable_revision != target:
        replace_missing_stable(c)
        st = c.st
    if target == st.stable_revision:
        if st.canary_revision is not None:
            c.event(
                ROLLOUT_CANCELLED,
                f"the desired revision is the stable {target} again: canary {st.canary_revision} removed",
            )
            c.clear_canary()
        return steady(c)
    if st.aborted_revision == target:
        return held_aborted(c)
    if st.canary_revision is not None and st.canary_revision != target:
        replaced = st.canary_revision
        message = f"revision {target} replaces canary {replaced}{dropped_requests(c, replaced)}"
        c.event(CANARY_REPLACED, message)
        c.clear_canary()
    if c.st.canary_revision is None:
        if c.paused:
            return held_before_start(c)
        start(c)
    scope_requests(c)
    return progress(c)


def replace_missing_stable(c: Call) -> None:
    """The stable revision has no Deployment (deleted by hand, or left by a recreated object).

    Only the spec's revision can be rendered, so it takes the stable's place at full replicas
    at once (no steps: there is nothing to compare a canary with, and nothing serves).
    Degraded says so until it is Ready. (A missing stable that is the spec's revision needs
    none of this: every reconcile renders the spec's revision, so it is simply created again.)
    """
    missing = c.st.stable_revision
    target = c.target
    c.event(
        STABLE_REVISION_MISSING,
        f"stable revision {missing} has no Deployment and cannot be rebuilt from this spec: "
        f"revision {target} takes its place at {c.r} replicas",
        WARNING,
    )
    c.set(
        stable_revision=target,
        stable_since=c.now,
        replaced_revision=missing,
        aborted_revision=None,
        aborted_reason=None,
        aborted_step_index=None,
        aborted_detail=None,
    )
    c.clear_canary()


def serving_revision(c: Call) -> str | None:
    """The observed revision other than the target with the most Ready pods, if any has one."""
    serving = [(s.ready_replicas, rev) for rev, s in c.inp.revisions.items() if rev != c.target]
    best = max(serving, default=None)
    return best[1] if best is not None and best[0] > 0 else None


def start(c: Call) -> None:
    target = c.target
    c.rollback = target in c.history_revisions()
    promoting = c.rollback or not c.steps
    c.set(
        analysis_runs=(),
        canary_revision=target,
        canary_weight=100 if c.strategy == Strategy.RECREATE else 0,
        current_step_index=len(c.steps) if promoting else 0,
        step_started_at=c.now,
        canary_started_at=c.now,
        waiting_since=None,
        promoting=promoting,
    )
    if c.rollback:
        c.event(
            ROLLOUT_ROLLBACK,
            f"revision {target} served before (history): rolling back to it without steps "
            f"({c.strategy.value}); stable {c.st.stable_revision} serves until it is Ready",
        )
    else:
        c.event(
            ROLLOUT_STARTED,
            f"rolling out revision {target} over stable {c.st.stable_revision} "
            f"({c.strategy.value}, {len(c.steps)} steps)",
        )

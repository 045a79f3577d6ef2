"""The rollout engine: spec, status, observed revisions and control requests in; one level-based plan out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from triton_operator.core.rollout.hostpods import InPlaceRequests, InPlaceState
from triton_operator.core.rollout.inplace import history_after, plan_in_place
from triton_operator.core.rollout.outcomes import held_aborted, held_before_start, steady
from triton_operator.core.rollout.plan import (
    InPlaceInput,
    InPlaceMode,
    InPlacePlan,
    RolloutEvent,
    RolloutInput,
    RolloutPlan,
)
from triton_operator.core.rollout.requests import ACTIONS, FOR_REVISION, Action, ControlRequest
from triton_operator.core.rollout.rollout_kind import InPlace, RolloutKind, describe
from triton_operator.core.rollout.state import RevisionState, RolloutStatus, paused
from triton_operator.core.rollout.steps import progress
from triton_operator.core.rollout.working import Call, deadline_seconds
from triton_operator.core.vocabulary.conditions import (
    CANARY_REPLACED,
    NEW_PODS_REQUIRED,
    NORMAL,
    REQUEST_IGNORED,
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
from triton_operator.models import ANALYSIS_RUNS_KEPT, ModelUpdates, Rollout, Strategy

# How the engine works (states, replica maths, traffic, step completion, analysis, automatic
# rollback, control requests, history), with worked examples: docs/rollouts.md, "How the engine works".


def plan_rollout(inp: RolloutInput) -> RolloutPlan:
    """The whole rollout decision for one reconcile (docs/rollouts.md, "How the engine works"):
    the in-place mode's requests and choice, its host pods moved (when an update runs), then the
    revisions' Deployments."""
    chosen = choose_in_place(inp)
    c = Call(inp)
    c.desired, c.kind, c.chosen = chosen.desired, chosen.kind, chosen.events
    c.handled.update(chosen.taken)
    if chosen.update is not None:
        c.moved, c.st = move_in_place(c.st, inp.rollout, chosen.update)
        after = c.moved.state
        if c.kind is None and after is not None and after.next is not None:
            c.kind = (ModelUpdates.IN_PLACE.value, chosen.update.describe)
    return run(c)


# ------------------------------------------------------------- in place


@dataclasses.dataclass(frozen=True)
class InPlaceChoice:
    """What the in-place mode chose in one call (choose_in_place's answer, before anything moves)."""

    desired: str
    """The revision the Deployments roll toward: the spec's, or the host's while its pods' models
    move in place."""
    update: InPlaceInput | None = None
    """The host pods' update to move (None: none runs)."""
    kind: tuple[str, str] | None = None
    """(InPlace | NewPods, why) of the change in progress, when chosen here."""
    events: tuple[RolloutEvent, ...] = ()
    """What its requests and its choice said (before the update's own Events)."""
    taken: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The control requests it took: action -> request id (status.handledRequests)."""


def move_in_place(
    status: RolloutStatus, rollout: Rollout, update: InPlaceInput
) -> tuple[InPlacePlan, RolloutStatus]:
    """The in-place mode's step mover: the host pods' agents load the next revision, step by
    step (core.rollout.inplace); its requests were taken when the mode was chosen
    (choose_in_place). Its plan, and the status with what it decided: the analyses recorded, a
    pause, and, once the update completed, the history (as a flip's)."""
    moved = plan_in_place(update)
    history = history_after(status.history, rollout.revision_history_limit, update.state, moved.state)
    if history is not None:
        status = dataclasses.replace(status, history=history)
    if moved.analysis_runs or moved.pause:
        runs = (*status.analysis_runs, *moved.analysis_runs)[-ANALYSIS_RUNS_KEPT:]
        status = dataclasses.replace(
            status, analysis_runs=runs, paused_by_user=status.paused_by_user or moved.pause
        )
    return moved, status


def choose_in_place(inp: RolloutInput) -> InPlaceChoice:
    """The in-place mode (RolloutInput.in_place): its control requests taken (take_in_place_requests),
    then what the host's pods are to serve. A change the pods can load in place (InPlace) moves
    them, and the Deployments keep the host; any other change (or one while new pods roll out)
    goes to the Deployments as before, with the reasons that force new pods (an Event when they
    change)."""
    mode = inp.in_place
    revision = inp.desired_revision
    untouched = InPlaceChoice(desired=revision)
    if mode is None:
        return untouched
    asked = take_in_place_requests(inp, mode)
    state, desired, served = asked.state, asked.desired, asked.served
    events = asked.events
    kind: tuple[str, str] | None = None
    described = mode.described
    engine = mode.host
    replaced_by: str | None = None
    if state is not None and state.next is not None:
        if state.next != desired:
            # A newer spec (or an undo), also while rolling back: the update in progress goes back,
            # and the new one starts once no pod is asked for it any more (core.rollout.inplace).
            replaced_by = desired
    elif state is not None and state.aborted_revision is not None:
        pass  # held: the host serves what it served, the spec's revision waits
    elif desired != served:
        change = in_place_change(inp, mode, desired)
        if isinstance(change, InPlace):
            state = InPlaceState(
                host=mode.host,
                stable=served,
                next=desired,
                pinned=state.pinned if state is not None else None,
                pinned_for=state.pinned_for if state is not None else None,
            )
            described = describe(change)
            kind = (ModelUpdates.IN_PLACE.value, described)
        else:
            if change is not None:
                kind = (ModelUpdates.NEW_PODS.value, describe(change))
                if mode.described != kind[1]:
                    said = RolloutEvent(NORMAL, NEW_PODS_REQUIRED, f"revision {revision}: {kind[1]}")
                    events = (*events, said)
            if state is None:
                # Nothing in place: the requests it took go to the Deployments' step mover too.
                return dataclasses.replace(untouched, kind=kind, events=events)
            engine = revision  # new pods over a host that serves in place: the engine rolls them out
    elif state is None:
        return untouched  # the pods serve the spec's revision: the requests go to the Deployments' mover
    actions = {r.action for r in asked.taken}
    update = InPlaceInput(
        rollout=inp.rollout,
        state=state,
        models=mode.models.get(state.next, ()) if state.next else (),
        pods=mode.pods,
        now=inp.now,
        deadline_seconds=deadline_seconds(inp),
        paused=paused(inp.rollout, inp.status),
        requests=InPlaceRequests(
            promote="promote" in actions, promote_full="promote-full" in actions, abort="abort" in actions
        ),
        configmap_stable=mode.configmap_stable,
        describe=described,
        replaced_by=replaced_by,
        analysis=mode.analysis,
    )
    taken: dict[str, str] = {r.action: r.request_id for r in asked.taken}
    return InPlaceChoice(desired=engine, update=update, kind=kind, events=events, taken=taken)


def in_place_change(inp: RolloutInput, mode: InPlaceMode, revision: str) -> RolloutKind | None:
    """How the host's pods would load ``revision`` (None: in place is no option for it)."""
    if not in_place_option(inp.status, inp.revisions, opted_in=mode.opted_in, revision=revision):
        return None
    return mode.change if revision == inp.desired_revision else mode.earlier.get(revision)


def in_place_option(
    status: RolloutStatus, revisions: Mapping[str, RevisionState], *, opted_in: bool, revision: str
) -> bool:
    """Whether a change to ``revision`` may go in place at all: opted in (spec.rollout.modelUpdates),
    no rollout of new pods nor an undo pin of the Deployments in progress, the revision not the
    aborted one, and the host's Deployment there."""
    if not opted_in or status.canary_revision is not None or status.pinned_revision is not None:
        return False
    return status.aborted_revision != revision and status.stable_revision in revisions


IN_PLACE_ACTIONS: tuple[Action, ...] = ("promote", "promote-full", "abort", "retry")
"""The requests the in-place update takes when made for its revision (or for none)."""


@dataclasses.dataclass(frozen=True)
class InPlaceAsked:
    """The control requests one call takes for the in-place update, and what they leave to do."""

    state: InPlaceState | None
    taken: tuple[ControlRequest, ...]
    events: tuple[RolloutEvent, ...]
    desired: str
    """What the pods are to serve: the spec's revision, or the one an undo went back to."""
    served: str
    """What they serve now."""


def take_in_place_requests(inp: RolloutInput, mode: InPlaceMode) -> InPlaceAsked:
    """The requests for the in-place update (promote, promote-full, abort, retry made for its
    revision), an undo it can load in place (undo_in_place), a retry after one; the pin and the
    hold they end. The rest are the Deployments' step mover's (take_requests)."""
    revision, handled = inp.desired_revision, inp.status.handled_requests
    state = mode.state
    served = state.stable if state is not None else mode.host
    events: list[RolloutEvent] = []
    fresh = [r for r in inp.requests if handled.get(r.action) != r.request_id]
    ours = {r for r in (state.next, state.aborted_revision) if r} if state is not None else set()
    taken = [
        r
        for r in fresh
        if ours and r.action in IN_PLACE_ACTIONS and (r.revision is None or r.revision in ours)
    ]
    undo = next((r for r in fresh if r.action == "undo"), None)
    if undo is not None and inp.status.canary_revision is None and mode.opted_in:
        undone = undo_in_place(inp, mode, undo, state, served)
        if undone is not None:
            state = undone[0]
            events.append(undone[1])
            taken.append(undo)
    if state is not None and state.pinned is not None:
        # A retry rolls the spec forward after an undo made here (as after the engine's pin).
        taken += [r for r in fresh if r.action == "retry" and r not in taken]
    actions = {r.action for r in taken}
    ended = state is not None and (state.pinned_for != revision or "retry" in actions)
    if state is not None and state.pinned is not None and ended:
        if state.pinned_for == revision:
            events.append(RolloutEvent(NORMAL, ROLLOUT_RETRIED, f"rolling forward to revision {revision}"))
        state = dataclasses.replace(state, pinned=None, pinned_for=None)  # a new spec, or a retry
    desired = state.pinned if state is not None and state.pinned is not None else revision
    held = state is not None and state.next is None and state.aborted_revision is not None
    if state is not None and held and (state.aborted_revision != desired or "retry" in actions):
        if state.aborted_revision == desired:
            events.append(RolloutEvent(NORMAL, ROLLOUT_RETRIED, f"retrying revision {desired} in place"))
        state = dataclasses.replace(state, aborted_revision=None, aborted_reason=None, aborted_detail=None)
    return InPlaceAsked(state, tuple(taken), tuple(events), desired, served)


def undo_in_place(
    inp: RolloutInput, mode: InPlaceMode, req: ControlRequest, state: InPlaceState | None, served: str
) -> tuple[InPlaceState | None, RolloutEvent] | None:
    """An undo request the in-place update takes: its target (--to-revision, else the last entry of
    status.history) was served in place in the host's pods (status.history's inPlaceHost), or is the
    host's own revision while they serve another in place. Pinned (status.inPlace.pinned) until the
    spec changes or a retry request, as the engine pins an undo; the pods move to it as any in-place
    update does, step by step, gated. None: not one for in place (take_requests' undo takes it)."""
    host, history = mode.host, inp.status.history
    in_place_here = {h.revision for h in history if h.in_place_host == host}
    target = req.to_revision or (history[-1].revision if history else None)
    if target is None or not (target in in_place_here or (target == host and served != host)):
        return None

    def rejected(why: str) -> tuple[InPlaceState | None, RolloutEvent]:
        message = f"undo: revision {target} cannot be loaded in place: {why}"
        return state, RolloutEvent(WARNING, UNDO_REJECTED, message)

    if target in inp.unsyncable:
        return rejected(f"it cannot sync any more: {inp.unsyncable[target]}")
    if target != served:
        change = mode.earlier.get(target)
        if not isinstance(change, InPlace):
            return rejected(describe(change) if change is not None else "its ConfigMap is gone")
    base = state if state is not None else InPlaceState(host=host, stable=served)
    pinned = dataclasses.replace(base, pinned=target, pinned_for=inp.desired_revision)
    message = (
        f"rolling back to revision {target} in place, in the pods of revision {host} (serving {served}); "
        f"the spec's revision {inp.desired_revision} waits until the spec changes or a retry request"
    )
    return pinned, RolloutEvent(NORMAL, UNDO_REQUESTED, message)


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
    if target not in c.inp.revisions and target != c.desired:
        entry = next((h for h in c.st.history if h.revision == target), None)
        if entry is not None and entry.in_place_host is not None:
            # undo_in_place takes the undos the host's pods can load in place; this one they could not.
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
    c.set(pinned_revision=target, pinned_for=c.desired)
    c.event(
        UNDO_REQUESTED,
        f"rolling back to revision {target}; the spec's revision {c.desired} waits "
        "until the spec changes or a retry request",
    )


def resolve_target(c: Call) -> None:
    st = c.st
    if st.pinned_revision and (st.pinned_for != c.desired or c.retry):
        c.set(pinned_revision=None, pinned_for=None)
    c.target = c.st.pinned_revision or c.desired
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
            # The first revision replaces nothing: no Event (status.stableRevision names it at once,
            # and RevisionServed, with its time to serve, once its first pod is Ready).
            c.set(stable_revision=target, stable_since=c.now)
            c.clear_canary()
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

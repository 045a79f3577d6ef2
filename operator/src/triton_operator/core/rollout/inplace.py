"""The engine's in-place step mover, pure: the stable revision's pods load the next revision step by step.

The pods keep their Kubernetes identity (the "host" revision: its Deployment, its revision label,
the Services that select it). What they serve moves from ``stable`` to ``next`` through the
`<deployment>-inplace` ConfigMap (state.json and the files of both) and one annotation per pod
(`triton-operator.io/inplace-target: <next>`), which the pod's model-agent follows. A step of
spec.rollout.steps completes when every pod asked reports, through its agent, the next revision
Applied with the changed models READY, and, where spec.rollout.analysis is set, before a step asks
more pods the analysis of the pods updated so far against the others must pass (as a canary's
before its traffic rises: ``AnalysisSides``); a failed load, a failed analysis, a pod gone
mid-update, the progress deadline or an abort request rolls back: the annotations are removed, the
agents load the stable revision again, and ``next`` is cleared once every pod reports it.
Success: stable := next.

Only the pods that can serve count (HostPod.problem: not Pending, crash looping, unstarted; an
evicted pod is not a host pod at all): they alone are asked and waited for, by a rollout and a
rollback alike, and the status names the others. A pod leaves the Service while it reloads, so the
pods move in batches (``batch_size``: at most a quarter of them, never all), forward and back. A
newer spec and an abort always win, also while rolling back.

``plan_in_place`` moves one call's step: core.rollout.engine.plan_rollout runs it in its in-place
mode (RolloutInput.in_place), level-based: the state it wrote last time and what it observes now
in; the next state, the pod annotations to write, the ConfigMap's state.json, the conditions, the
analyses recorded and the Events out, which the engine makes part of its one plan. It shares the
engine's analysis gate (rollout.gate), step texts, pause and deadline rules; only how a step moves
(asking pods, not scaling a canary Deployment) and how it goes back are its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.canary_analysis import FAILED as ANALYSIS_VERDICT_FAILED
from triton_operator.core.rollout.canary_analysis import AnalysisResult
from triton_operator.core.rollout.clock import elapsed, format_time, pause_left, to_utc
from triton_operator.core.rollout.gate import analysis_gate, analysis_record
from triton_operator.core.rollout.hostpods import (
    FAILED,
    POLL_SECONDS,
    AgentStatus,
    AnalysisSides,
    HostPod,
    InPlaceRequests,
    InPlaceState,
    analysis_sides,
    batch_size,
    holders,
    named,
    parse_agent_status,
    serves,
    step_pods,
    why_not_on,
)
from triton_operator.core.rollout.plan import InPlaceInput, InPlacePlan, RolloutEvent
from triton_operator.core.rollout.state import HistoryEntry
from triton_operator.core.rollout.texts import step_at, step_completed
from triton_operator.core.vocabulary.conditions import (
    ABORTED,
    ANALYSIS_FAILED,
    ANALYSIS_INCONCLUSIVE,
    AS_EXPECTED,
    FALSE,
    IN_PLACE_LOAD_FAILED,
    IN_PLACE_POD_LOST,
    IN_PLACE_ROLLED_BACK,
    IN_PLACE_ROLLING_BACK,
    IN_PLACE_UPDATING,
    NORMAL,
    PROGRESS_DEADLINE_EXCEEDED,
    ROLLOUT_ABORTED,
    ROLLOUT_COMPLETED,
    ROLLOUT_PAUSED,
    ROLLOUT_STARTED,
    STEP_COMPLETED,
    STEP_PAUSED,
    TRUE,
    WAITING_FOR_ANALYSIS,
    WARNING,
    Verdict,
)
from triton_operator.models import ANALYSIS_RUNS_KEPT, AnalysisRunRecord, CanaryStep, Strategy

__all__ = [
    "AgentStatus",
    "AnalysisSides",
    "HostPod",
    "InPlaceInput",
    "InPlacePlan",
    "InPlaceRequests",
    "InPlaceState",
    "analysis_sides",
    "batch_size",
    "history_after",
    "parse_agent_status",
    "plan_in_place",
    "serves",
    "step_pods",
    "why_not_on",
]

_UNSTEPPED: dict[str, Any] = {"waiting_since": None, "asked_at_step": 0, "promoted": False}


class Move:
    """One call of the in-place step mover: its context (the input, the state being built, the pods
    as read, the Events), which the mover's functions take."""

    def __init__(self, inp: InPlaceInput) -> None:
        self.inp = inp
        self.st = inp.state
        self.now = to_utc(inp.now).replace(microsecond=0)
        self.steps: tuple[CanaryStep, ...] = (
            () if inp.rollout.strategy == Strategy.RECREATE else tuple(inp.rollout.steps)
        )
        self.events: list[RolloutEvent] = []
        self.live = sorted((p for p in inp.pods if not p.terminating), key=lambda p: (not p.ready, p.name))
        self.by_name = {p.name: p for p in self.live}
        self.servable = [p for p in self.live if p.problem is None]
        """The pods that can serve: the only ones counted, asked and waited for (HostPod.problem)."""
        self.held = holders(self.live, inp.models)
        """In a pool, the pods holding a copy of a changed model: a setWeight step is a share of
        those copies, and they are asked before the pods that have nothing to reload (None: not a
        pool, every pod holds every model)."""
        self.batch = batch_size(len(self.servable))
        self.wanted = 0
        """How many pods the current step wants asked (for the status)."""
        self.requeue: list[float] = []
        self.sides = analysis_sides(inp.state, inp.pods, inp.models)
        """What the analysis judged in this pass (the state as it came in)."""
        self.runs: list[AnalysisRunRecord] = []
        self.pause = False
        self.waiting_on_analysis: str | None = None
        self.forced = False
        """A promote request asked every pod in this call: no analysis holds that step."""

    def set(self, **changes: Any) -> None:
        self.st = dataclasses.replace(self.st, **changes)

    def event(self, reason: str, message: str, kind: str = NORMAL) -> None:
        self.events.append(RolloutEvent(kind, reason, message))

    def seconds_since(self, moment: datetime | None) -> float:
        return (self.now - moment).total_seconds() if moment is not None else 0.0

    def on(self, pod: HostPod, revision: str, *, gated: bool) -> bool:
        """The pod's agent reports ``revision`` Applied (``gated``: and the changed models READY)."""
        return serves(pod, revision, self.inp.models if gated else ())

    def failed(self, pod: HostPod) -> AgentStatus | None:
        agent = pod.agent
        if agent is not None and agent.state == FAILED and agent.target == self.st.next:
            return agent
        return None


# ------------------------------------------------------------- the plan


def plan(m: Move) -> InPlacePlan:
    st = m.st
    if st.next is None:
        return idle(m)
    if st.rolling_back is not None:
        if m.inp.requests.abort:
            m.event(
                ABORTED,
                f"abort request: the in-place rollout of revision {st.next} is already rolling back "
                f"({st.aborted_detail or st.rolling_back}); the pods load revision {st.stable} again",
            )
        return rolling_back(m)
    if st.step_index is None:
        m.set(step_index=0, step_started_at=m.now, pods=(), **_UNSTEPPED)
        m.event(
            ROLLOUT_STARTED,
            f"rolling out revision {st.next} in place on the pods of revision {st.host} "
            f"(serving {st.stable}; {len(m.steps)} steps): {m.inp.describe}",
        )
    return progress(m)


def progress(m: Move) -> InPlacePlan:
    reqs = m.inp.requests
    if reqs.abort:
        return roll_back(m, ABORTED, "aborted by request")
    if m.inp.replaced_by is not None:
        return roll_back(m, ABORTED, f"replaced by revision {m.inp.replaced_by}")
    lost = [name for name in m.st.pods if name not in m.by_name]
    if lost:
        return roll_back(m, IN_PLACE_POD_LOST, f"pod {', '.join(lost)} gone mid-update")
    broken = [f"pod {n}: {m.by_name[n].problem}" for n in m.st.pods if m.by_name[n].problem]
    if broken:
        return roll_back(m, IN_PLACE_POD_LOST, f"{'; '.join(broken)} (mid-update: it cannot serve)")
    for name in m.st.pods:
        agent = m.failed(m.by_name[name])
        if agent is not None:
            return roll_back(m, IN_PLACE_LOAD_FAILED, f"pod {name}: {agent.message or 'load failed'}")
    promote, promote_full = reqs.promote, reqs.promote_full
    m.forced = promote or promote_full or m.st.promoted  # a promote goes on without the analysis
    if m.inp.paused and not (promote or promote_full):
        m.set(waiting_since=None)
        return updating(m, paused=True)
    result = current_analysis(m)
    if result is not None and result.verdict == ANALYSIS_VERDICT_FAILED:
        # As a canary's: judged while the rollout is not paused, at every step, and a failure
        # goes back the way a failed load does (every pod asked loads the stable revision).
        record(m, result)
        return roll_back(m, ANALYSIS_FAILED, result.message)
    if elapsed(m.st.waiting_since, m.inp.deadline_seconds, m.now):
        return roll_back(
            m,
            PROGRESS_DEADLINE_EXCEEDED,
            f"pods not on revision {m.st.next} within {m.inp.deadline_seconds}s",
        )
    if (promote or promote_full) and (m.st.step_index or 0) < len(m.steps):
        # An in-place promote goes to the end: every pod is asked, in batches (a pod leaves the
        # Service while it reloads); the rollout still completes only once every pod has loaded
        # the revision (no request skips that).
        m.set(
            step_index=len(m.steps),
            step_started_at=m.now,
            waiting_since=None,
            asked_at_step=len(m.st.pods),
            promoted=True,
        )
        m.event(
            STEP_COMPLETED,
            f"revision {m.st.next} in place: every pod by promote request "
            f"(at most {max(m.batch, 1)} reloading at once)",
        )
    for _ in range(len(m.steps) + 2):
        index = m.st.step_index or 0
        if index >= len(m.steps):
            wanted = m.wanted = len(m.servable)
            held = gate(m, wanted)
            if held is not None:
                return held
            ask(m, wanted)
            if done(m, wanted):
                return complete(m)
            return updating(m)
        step = m.steps[index]
        if step.set_weight is not None:
            # The pods that can serve, Ready or not: a pod asked is un-Ready while it reloads. In a
            # pool, the share is of the changed model's copies (the pods asked first hold them).
            counted = m.servable if m.held is None else [p for p in m.servable if p.name in m.held]
            wanted = m.wanted = step_pods(step.set_weight, len(counted))
            held = gate(m, wanted)
            if held is not None:
                return held
            ask(m, wanted)
            if done(m, wanted):
                advance(m, index)
                continue
            return updating(m)
        if step.pause is not None:
            left = pause_left(step.pause.duration_seconds, m.st.step_started_at, m.now)
            if left is not None and left <= 0:
                advance(m, index)
                continue
            if left is not None:
                m.requeue.append(left)
            m.set(waiting_since=None)
            return updating(m)
        advance(m, index)  # setHeaderRoute: nothing to route, every pod is the same Service
    return updating(m)


# ------------------------------------------------------------- analysis (as a canary's)


def analysis_active(m: Move) -> bool:
    """The current step's pods are judged: analysis set and a step's pods all serve the next revision."""
    return m.inp.rollout.analysis is not None and m.sides is not None


def current_analysis(m: Move) -> AnalysisResult | None:
    """The verdict of the current step's window, when the reconcile judged these sides."""
    result, sides = m.inp.analysis, m.sides
    if result is None or sides is None or not analysis_active(m):
        return None
    if result.revision != sides.revision or result.weight != sides.weight:
        return None
    return result


def record(m: Move, result: AnalysisResult, verdict: str | None = None) -> None:
    m.runs.append(analysis_record(result, m.st.step_index or 0, m.now, verdict))


def gate(m: Move, wanted: int) -> InPlacePlan | None:
    """Before more pods are asked (``wanted`` of them), the analysis of the pods updated so far
    must pass, as a canary's before its traffic rises (rollout.gate); None: go on; else the plan
    that waits (or rolls back). The first step asks with nothing to judge (a canary's first
    weight is not judged either), and a promote request goes on without it."""
    spec = m.inp.rollout.analysis
    if spec is None or m.forced or wanted <= len(m.st.pods) or not m.st.pods:
        return None
    if len(m.st.pods) > m.st.asked_at_step:
        return None  # this step asked its first pods already: the rest follow in batches
    held = m.held
    if held is not None and not held & set(m.st.pods):
        return None  # a pool's pods asked hold no copy of a changed model: nothing moved to judge
    if held is not None and held <= set(m.st.pods):
        return None  # every copy of a changed model is asked: the pods left have nothing to reload
    sides = m.sides
    on = f"the {len(sides.updated)} pods updated" if sides is not None else "the pods asked"
    result = current_analysis(m)
    first = f"waiting for the first reading of the metrics of {on}"
    gate = analysis_gate(spec, result, first=first, in_place=True, paused=m.inp.paused)
    if gate.record is not None and result is not None:
        record(m, result, gate.record or None)
    if gate.event is not None:
        m.events.append(gate.event)
    m.pause = m.pause or gate.pause
    if gate.outcome == "pass":
        return None
    m.waiting_on_analysis = gate.waiting
    if gate.outcome == "abort" and result is not None:
        return roll_back(m, ANALYSIS_INCONCLUSIVE, result.message)
    return updating(m)


# ------------------------------------------------------------- pods asked


def count_moving(m: Move) -> int:
    """The pods that can serve and do not serve what they should now: asked and not serving the
    next revision yet, or not asked and not Ready (reloading, e.g. back to the stable one)."""
    nxt, asked = m.st.next, set(m.st.pods)
    assert nxt is not None
    return sum(1 for p in m.servable if (not m.on(p, nxt, gated=True) if p.name in asked else not p.ready))


def ask(m: Move, wanted: int) -> None:
    """Add pods to the update until ``wanted`` are in it, in batches: at most ``m.batch`` pods
    move at once (a pod leaves the Service while it reloads), so at least one always serves. In a
    pool the pods holding a changed model come first (a step's share is of them); then a pod that
    does not serve anyway (not Ready), asked at no cost; then by name."""
    pods = list(m.st.pods)
    moving = count_moving(m)
    held = m.held
    for pod in sorted(m.servable, key=lambda p: (held is not None and p.name not in held, p.ready, p.name)):
        if len(pods) >= wanted:
            break
        if pod.name in pods:
            continue
        if pod.ready:
            if moving >= m.batch:
                break
            moving += 1
        pods.append(pod.name)
    if len(pods) > len(m.st.pods):
        # A batch asked is progress: the deadline counts from the last one (as a Deployment's
        # progressDeadlineSeconds), not from the step's first, so batches in a row never run out.
        m.set(pods=tuple(pods), waiting_since=None)


def done(m: Move, wanted: int) -> bool:
    """The pods asked are ``wanted`` and every one serves the next revision, models READY."""
    assert m.st.next is not None
    ok = len(m.st.pods) >= wanted and all(m.on(m.by_name[n], m.st.next, gated=True) for n in m.st.pods)
    if not ok and m.st.waiting_since is None:
        m.set(waiting_since=m.now)
    return ok


def advance(m: Move, index: int) -> None:
    asked = len(m.st.pods)
    m.set(step_index=index + 1, step_started_at=m.now, waiting_since=None, asked_at_step=asked)
    m.event(STEP_COMPLETED, step_completed(f"revision {m.st.next} in place", index, m.steps))


def complete(m: Move) -> InPlacePlan:
    new, old = m.st.next, m.st.stable
    assert new is not None
    m.set(
        stable=new,
        next=None,
        step_index=None,
        step_started_at=None,
        waiting_since=None,
        pods=(),
        aborted_revision=None,
        aborted_reason=None,
        aborted_detail=None,
        asked_at_step=0,
        promoted=False,
    )
    m.event(
        ROLLOUT_COMPLETED,
        f"revision {new} is served in place by all {len(m.servable)} pods of revision "
        f"{m.st.host} (was {old})",
    )
    return idle(m)


def roll_back(m: Move, reason: str, detail: str) -> InPlacePlan:
    index = m.st.step_index or 0
    where = f"step {index}" if index < len(m.steps) else f"step {index} (all pods)"
    m.set(
        rolling_back=reason,
        aborted_revision=m.st.next,
        aborted_reason=reason,
        aborted_detail=detail,
        waiting_since=None,
    )
    m.event(
        ROLLOUT_ABORTED,
        f"in-place rollout of revision {m.st.next} aborted at {where}: {detail}; the pods of "
        f"revision {m.st.host} load revision {m.st.stable} again",
        WARNING,
    )
    return rolling_back(m)


def rolling_back(m: Move) -> InPlacePlan:
    """The annotations go, in batches as the update's asks (a pod leaves the Service while it
    reloads): a pod that does not serve the next revision (failed, still loading, or unable to
    serve at all) at once, the others while fewer than a batch (at least one) reload; ``next`` is
    cleared once every pod asked that can serve reports the stable revision again. A newer spec ends
    the rollback once no pod is asked any more: the new update starts from the stable revision,
    the pods still reloading it counted as reloading."""
    st = m.st
    nxt = st.next
    assert nxt is not None
    # The pods to bring back: those asked, and any still annotated; a pod never asked never left
    # the stable revision (un-Ready for its own reasons, it is no business of the rollback).
    returning = [p for p in m.servable if p.name in st.pods or p.target is not None]
    back = [p for p in returning if m.on(p, st.stable, gated=False)]
    annotations: dict[str, str | None] = {
        p.name: None for p in m.live if p.target is not None and p.problem is not None
    }
    room = max(1, m.batch)  # a rollback always moves: with one pod left it goes back too
    # Reloading back: asked, told to go back, not there yet (a pod never asked and un-Ready for
    # its own reasons holds no rollback: it would wait on it for ever).
    moving = sum(1 for p in m.servable if p.name in st.pods and p.target is None and p not in back)
    asked = [p for p in m.servable if p.target is not None]
    held: list[HostPod] = []
    for pod in sorted(asked, key=lambda p: (m.on(p, nxt, gated=True), p.name)):
        if not m.on(pod, nxt, gated=True):
            annotations[pod.name] = None  # it serves nothing new: back at no cost
            moving += 1
        elif moving < room:
            annotations[pod.name] = None
            moving += 1
        else:
            held.append(pod)
    if len(back) == len(returning):
        m.set(next=None, step_index=None, step_started_at=None, pods=(), rolling_back=None, **_UNSTEPPED)
        m.event(
            IN_PLACE_ROLLED_BACK,
            f"every pod of revision {st.host} serves revision {st.stable} again",
        )
        return held_plan(m, annotations)
    replaced = m.inp.replaced_by
    if replaced is not None and not held:
        m.set(next=None, step_index=None, step_started_at=None, pods=(), rolling_back=None, **_UNSTEPPED)
        m.event(
            IN_PLACE_ROLLED_BACK,
            f"revision {nxt} rolled back in place, replaced by revision {replaced}: it starts from "
            f"revision {st.stable}, {len(returning) - len(back)} pods still reloading it",
        )
        m.requeue.append(POLL_SECONDS)
        return held_plan(m, annotations)
    late = [p for p in returning if p not in back and p not in held]
    waits = [f"pod {p.name}: {why_not_on(p, st.stable)}" for p in late]
    parts = [f"waiting for {named(waits)}"] if waits else []
    if held:
        parts.append(f"{len(held)} pods serving {nxt} wait their turn (at most {room} reloading at once)")
    parts += not_counted(m)
    if replaced is not None:
        parts.append(f"revision {replaced} starts once no pod is asked for {nxt} any more")
    message = (
        f"rolling back revision {nxt} in place: {len(back)}/{len(returning)} pods asked of "
        f"revision {st.host} serve revision {st.stable} again"
    ) + "".join(f"; {p}" for p in parts)
    m.requeue.append(POLL_SECONDS)
    return finish(
        m,
        annotations,
        Verdict(TRUE, IN_PLACE_ROLLING_BACK, message),
        Verdict(TRUE, st.aborted_reason or ABORTED, abort_message(m)),
        in_flight=True,
    )


def not_counted(m: Move) -> list[str]:
    """The pods left out because they cannot serve, named with why (for a message)."""
    left = [f"pod {p.name}: {p.problem}" for p in m.live if p.problem is not None]
    return [f"not counted (cannot serve): {named(left)}"] if left else []


def abort_message(m: Move) -> str:
    st = m.st
    return (
        f"in-place rollout of revision {st.aborted_revision} aborted: "
        f"{st.aborted_detail or st.aborted_reason}; "
        f"the pods of revision {st.host} serve revision {st.stable}"
    )


def held_plan(m: Move, annotations: Mapping[str, str | None]) -> InPlacePlan:
    progressing = Verdict(
        FALSE,
        ROLLOUT_ABORTED,
        f"{abort_message(m)}; change the spec or request a retry (kubectl triton retry) to try again",
    )
    return finish(
        m,
        annotations,
        progressing,
        Verdict(TRUE, m.st.aborted_reason or ABORTED, abort_message(m)),
        in_flight=False,
    )


def updating(m: Move, paused: bool = False) -> InPlacePlan:
    st = m.st
    assert st.next is not None
    annotations = {p.name: st.next for p in m.live if p.name in st.pods and p.target != st.next}
    on = sum(1 for n in st.pods if m.on(m.by_name[n], st.next, gated=True))
    index = st.step_index or 0
    n = len(m.steps)
    where = step_at(index, m.steps) if index < n else "every pod"
    readiness = (
        f"{on}/{len(st.pods)} pods asked serve revision {st.next} ({len(m.servable)} pods in all)"
        + "".join(f"; {p}" for p in waits_for(m, st.next))
    )
    if paused:
        progressing = Verdict(
            FALSE, ROLLOUT_PAUSED, f"in-place rollout of {st.next} paused at {where}; {readiness}"
        )
    elif index < n and m.steps[index].pause is not None:
        pause = m.steps[index].pause
        assert pause is not None
        until = (
            f"until {format_time(st.step_started_at or m.now)} + {pause.duration_seconds}s"
            if pause.duration_seconds is not None
            else "until promoted (kubectl triton promote)"
        )
        progressing = Verdict(
            TRUE if pause.duration_seconds is not None else FALSE,
            STEP_PAUSED,
            f"in place, {where}: paused {until}; {readiness}",
        )
    elif m.waiting_on_analysis is not None:
        waiting = m.waiting_on_analysis
        progressing = Verdict(TRUE, WAITING_FOR_ANALYSIS, f"in place, {where}: {waiting}")
        if m.sides is None:
            m.requeue.append(POLL_SECONDS)  # the pods asked are not all on it: look again soon
    else:
        progressing = Verdict(TRUE, IN_PLACE_UPDATING, f"in place, {where}: {readiness}")
        m.requeue.append(POLL_SECONDS)
        if st.waiting_since is not None:
            m.requeue.append(m.inp.deadline_seconds - m.seconds_since(st.waiting_since))
    analysis = m.inp.rollout.analysis
    if analysis is not None and analysis_active(m) and not paused:
        m.requeue.append(float(analysis.interval_seconds))
    return finish(
        m, annotations, progressing, Verdict(FALSE, AS_EXPECTED, "no rollout failed"), in_flight=True
    )


def waits_for(m: Move, nxt: str) -> list[str]:
    """What the update waits for, in words: each pod asked that does not serve ``nxt`` yet and
    why, the pods that wait their turn (batches), the pods left out because they cannot serve."""
    st = m.st
    pods = [m.by_name[n] for n in st.pods if n in m.by_name]
    late = [p for p in pods if not m.on(p, nxt, gated=True)]
    waits = [f"pod {p.name}: {why_not_on(p, nxt, m.inp.models)}" for p in late]
    parts = [f"waiting for {named(waits)}"] if waits else []
    turn = m.wanted - len(st.pods)
    if turn > 0 and not m.inp.paused:
        if m.batch == 0:
            parts.append(
                f"{turn} pods wait: fewer than 2 pods can serve (a pod leaves the Service while it reloads)"
            )
        else:
            parts.append(f"{turn} pods wait their turn (at most {m.batch} reloading at once)")
    return parts + not_counted(m)


def idle(m: Move) -> InPlacePlan:
    """Nothing loads: annotations that are not needed go (one naming the stable revision only
    once the ConfigMap's state.json says so, so that no pod turns back for a moment)."""
    st = m.st
    annotations: dict[str, str | None] = {}
    for pod in m.live:
        if pod.target is None:
            continue
        if pod.target != st.stable or m.inp.configmap_stable == st.stable:
            annotations[pod.name] = None
    if st.aborted_revision is not None:
        return held_plan(m, annotations)
    message = f"the pods of revision {st.host} serve revision {st.stable} (in place)"
    return finish(
        m,
        annotations,
        Verdict(FALSE, ROLLOUT_COMPLETED, message),
        Verdict(FALSE, AS_EXPECTED, "no rollout failed"),
        in_flight=False,
    )


def finish(
    m: Move,
    annotations: Mapping[str, str | None],
    progressing: Verdict,
    degraded: Verdict,
    *,
    in_flight: bool,
) -> InPlacePlan:
    st = m.st
    remaining = any(p.target is not None and annotations.get(p.name, p.target) is not None for p in m.live)
    # Back on the pods' own revision, with nothing in flight or held: nothing is in place.
    gone = (
        st.stable == st.host
        and st.next is None
        and st.aborted_revision is None
        and st.pinned is None
        and not remaining
    )
    after = max(min(m.requeue), 1.0) if m.requeue else (POLL_SECONDS if remaining else None)
    return InPlacePlan(
        state=None if gone else st,
        annotations=dict(annotations),
        configmap=None if gone else (st.stable, st.next),
        progressing=progressing,
        degraded=degraded,
        events=tuple(m.events),
        requeue_after=after,
        in_flight=in_flight,
        analysis_runs=tuple(m.runs)[-ANALYSIS_RUNS_KEPT:],
        pause=m.pause,
        before=m.inp.state,
    )


def plan_in_place(inp: InPlaceInput) -> InPlacePlan:
    """One call of the in-place update (see the module): level-based, pure."""
    return plan(Move(inp))


def history_after(
    history: Sequence[HistoryEntry], limit: int, before: InPlaceState, after: InPlaceState | None
) -> tuple[HistoryEntry, ...] | None:
    """status.history once the update ``before`` completed (the pods of its host serve its next
    revision in place), as a canary's flip keeps the stable it replaced: the revision they served
    before is kept for an undo (in place: no Deployment of its own), the one they serve now is not
    history; at most ``limit`` entries (spec.rollout.revisionHistoryLimit). None: nothing completed."""
    if before.next is None or after is None or after.next is not None or after.stable != before.next:
        return None
    entries = [h for h in history if h.revision not in (before.stable, before.next)]
    entries.append(HistoryEntry(before.stable, None, in_place_host=before.host))
    return tuple(entries[-limit:] if limit > 0 else [])

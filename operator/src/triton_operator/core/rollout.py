"""Pure rollout engine: spec, status, observed revisions and control requests in; one level-based plan out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from triton_operator import GROUP
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
from triton_operator.core.traffic import TrafficWeights
from triton_operator.models import CanaryStep, Inconclusive, Rollout, SetHeaderRoute, Strategy

# =====================================================================================================
# How a rollout works (after Argo Rollouts' rollout/canary.go: a chain of small, level-based steps)
# =====================================================================================================
#
# plan_rollout() is called on every reconcile with the status it wrote last time and what it
# observes now. It never remembers anything else, so calling it twice with the same inputs gives
# the same plan, and after applying a plan's status a second call takes no new step: every
# transition happens in the call that first sees its condition hold, and the plan runs the chain to
# a fixpoint (a step that completes at once, such as setHeaderRoute, does not wait for a requeue).
#
# States (status fields in brackets):
#   first deploy   [no stableRevision]      the desired revision is stable at once, full replicas
#                                            (if another revision's pods serve, the status was lost:
#                                            that one is adopted as stable and a rollout follows).
#   steady         [stable == desired]      stable at spec.replicas, history revisions at 0.
#   canary         [canaryRevision, currentStepIndex < len(steps)]   stepping.
#   promoting      [promoting]              every step done: canary at full replicas; when it is
#                                            fully Ready it becomes stable ("flip") and the old
#                                            stable goes to 0 replicas and into history.
#   aborted        [abortedRevision == desired]   stable serves, the canary is at 0 and is not
#                                            retried until the desired revision changes or a
#                                            retry/promote request comes.
#
# Replica maths (r = spec.replicas, w = a setWeight percent):
#   canary replicas      c(w) = ceil(r * w / 100)          w=0 -> 0, w=100 -> r, r=3 w=10 -> 1
#   weight of a position = the last setWeight at or before the current step (0 before any);
#                          promoting uses 100 (c = r). BlueGreen always uses r, Recreate r.
#   stable replicas      = r: never scaled down before the canary is promoted, except
#     * Recreate: the old stable goes to 0 first; the new revision starts once its pods are gone.
#     * gpuBudget B with g GPUs per pod (g > 0): P = floor(B / g) pods may exist at once.
#         if P >= r + c            nothing changes (stable r, canary c)
#         else  floor  s0 = max(r - c, 1)                (stable keeps serving with >= 1 pod and
#                                                           with as many pods as the canary lacks)
#               canary c' = min(c, P - s0)               (what the budget leaves the canary)
#               stable s' = min(r, P - c')
#         c' = 0 while c > 0 means the budget cannot hold one canary pod beside a serving stable:
#         Degraded=True/GpuBudgetTooSmall, nothing moves (use Recreate for such budgets).
#         Each side scales down at once but grows only into GPUs the other side has released:
#         desired = target if target <= current else min(target, max(current, P - pods of others)),
#         where the pods of others count pods still terminating. So (stable + canary) * g <= B
#         holds for pods that exist, at every moment.
#       A step waits for the canary to be Ready at c' (promotion: at min(r, P - 1)); at the flip
#       the new stable goes to r and grows as the old one's pods terminate.
#
# Traffic (see core/traffic.py):
#   * No router: one Service selects every revision's pods, so the split is the ratio of Ready
#     pods; the canary replicas above are what make a weight.
#   * Gateway API: route weights are stable = 100 - canaryWeight, canary = canaryWeight. The
#     weight of a setWeight step is set when the step completes, i.e. once every canary pod for
#     that weight is Ready (a step lowering the weight lowers it when the step starts); a
#     canary never gets more traffic than its Ready pods were sized for. Replicas still follow
#     c(w), so capacity matches the share. BlueGreen keeps 0% until the flip, then 100% at once.
#     setHeaderRoute adds an A/B rule sending matching requests to the canary from that step
#     until the flip or an abort; an empty match list removes it.
#
# Step completion:
#   setWeight w     the canary Deployment observed replicas c'(w) and has that many Ready pods.
#                   (BlueGreen: setWeight steps are skipped; the canary is at full replicas.)
#   pause{d}        d seconds after the step started (requeue_after says when).
#   pause{}         a promote request.
#   setHeaderRoute  at once.
#   promote request completes the current step whatever it is, except a setWeight step whose
#   canary pods for that weight are not Ready yet (the request is ignored with a Warning Event
#   RequestIgnored; the step completes on its own once they are): no step gives a canary more
#   traffic than its Ready pods were sized for. promote-full jumps to promotion.
#   Promotion itself always waits for the canary to be fully Ready: no request skips that.
#
# Analysis (spec.rollout.analysis; the maths is core/analysis.py): while the canary holds traffic
# (Canary strategy, canaryWeight > 0) the reconcile judges it over a window that starts when the
# weight was set, from Triton's counters on its pods and the stable's (RolloutInput.analysis).
#   * Failed at any time (any step, a pause, the promotion): abort, reason AnalysisFailed, with the
#     figures in Degraded and the Warning Event.
#   * A step that raises the canary's traffic (a setWeight above canaryWeight, or the promotion after
#     the last step) completes only with Passed for the current weight's window (Event
#     AnalysisPassed); until then Progressing is WaitingForAnalysis. Before the canary has any
#     traffic (the first setWeight) there is nothing to judge.
#   * Inconclusive (too few requests) for rollout.analysis.inconclusiveAfterSeconds while a step
#     waits for it: onInconclusive Wait keeps waiting, Pause pauses the rollout (as a pause request:
#     kubectl triton resume or promote), Abort rolls back (reason AnalysisInconclusive).
#   * A promote request completes a step without its analysis; promote-full skips all of them.
#   Each window that decided something (passed, failed, paused, aborted) is kept in
#   status.analysisRuns (the last ANALYSIS_RUNS_KEPT, newest last).
#
# Automatic rollback (abort), checked on every call while a canary exists and nothing is paused:
#   * the canary is not Ready at its current replicas for progressDeadlineSeconds since it began
#     waiting at this step (status.waitingSince),      reason ProgressDeadlineExceeded
#   * a canary pod is crash-looping,                    reason CanaryCrashLooping
#   * a canary pod unschedulable for longer than rollout.unschedulableGraceSeconds (default 600s),
#                                                        reason CanaryUnschedulable
#   * its analysis failed,                              reason AnalysisFailed
#   * an abort request,                                  reason Aborted
#   Abort: canary to 0, weights 100/0, Degraded=True naming the step index, Event Warning
#   RolloutAborted. The stable revision is untouched throughout (Recreate: scaled back up).
#   Traffic moves first: the reconcile writes the Services' selectors and the routes' weights,
#   then the status, and only then scales the canary down (core.actions: a revision's scale-down
#   is never part of its apply).
#
# Other decisions:
#   * A new desired revision in the middle of a canary replaces it: old canary deleted, stable
#     untouched, the new one starts at step 0.
#   * The desired revision going back to the stable one cancels the canary.
#   * A desired revision found in status.history (a GitOps revert, or `kubectl triton undo`) is a
#     rollback to something that served before: it skips the steps and goes straight to
#     promotion (full replicas, flip when fully Ready, old stable kept until then), with the
#     strategy's own mechanics (Recreate still recreates).
#   * Undo pins a history revision: status.pinnedRevision serves while the spec still hashes to
#     status.pinnedFor; a spec change (new hash) or a retry request drops the pin.
#   * Manual pause (spec.rollout.paused or the pause request) holds everything: no step, no
#     promotion, no automatic abort (the deadline clock restarts on resume); an abort request
#     still works, a promote request takes one step and lifts a pause made by request. While paused
#     no new canary starts.
#   * Control requests are annotations `triton-operator.io/<action>: <request id>`; a request is
#     handled once: its id is recorded in status.handledRequests[action]. Pending requests are
#     applied in request-id order (ids are UTC timestamps from `kubectl triton`).
#   * promote, promote-full and abort are made for one revision (FOR_REVISION): kubectl triton
#     writes `triton-operator.io/<action>-revision`, the canary (or aborted revision) the status
#     showed; one without it is taken as made for the revision in progress when the engine first
#     sees it. Such a request applies only to that revision: one made for another is ignored (Event
#     RequestIgnored), and one whose canary is replaced in the same call is dropped with it
#     (CanaryReplaced says so), so it never completes a step of, promotes or aborts the new one.
#   * History (newest last) keeps revisionHistoryLimit earlier stable revisions at 0 replicas
#     (Deployment and ConfigMap kept, so an undo serves the same bytes); every other observed
#     revision not stable/canary/held-aborted is deleted.

# ----------------------------------------------------------------- names

ANNOTATION_PREFIX = f"{GROUP}/"
Action = Literal["promote", "promote-full", "abort", "pause", "resume", "retry", "undo"]
ACTIONS: tuple[Action, ...] = ("promote", "promote-full", "abort", "pause", "resume", "retry", "undo")
UNDO_TARGET_ANNOTATION = f"{GROUP}/undo-to-revision"
FOR_REVISION: tuple[Action, ...] = ("promote", "promote-full", "abort")
"""Requests made for one revision: `triton-operator.io/<action>-revision` names it (kubectl triton
writes the canary, or the aborted revision, that the status showed)."""
REVISION_SUFFIX = "-revision"


# ----------------------------------------------------------------- time


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with whole seconds, as Kubernetes writes times."""
    return _utc(moment).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """A status time back to an aware datetime; None for missing or unreadable values."""
    if isinstance(value, datetime):
        return _utc(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        return _utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def later(moment: datetime, seconds: float) -> datetime | None:
    """``moment`` plus ``seconds``; None past datetime's range (a pause stored before its bound)."""
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return None


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


# ----------------------------------------------------------------- inputs


@dataclasses.dataclass(frozen=True)
class RevisionState:
    """What is observed of one revision's Deployment and pods (core.observation.revision_state reads it)."""

    spec_replicas: int = 0
    """Deployment spec.replicas."""
    replicas: int = 0
    """Deployment status.replicas."""
    ready_replicas: int = 0
    available_replicas: int = 0
    observed: bool = True
    """status.observedGeneration >= metadata.generation: the controller has seen the spec."""
    pods: int | None = None
    """Pods of the revision that still exist, terminating ones included (None: status.replicas)."""
    crash_looping: bool = False
    unschedulable_since: datetime | None = None
    """Earliest time a pod of the revision was marked Unschedulable, if one still is."""
    triton_failure: str | None = None
    """Triton's own words on the model versions that failed to load in its exited pods, if any."""

    def ready_at(self, replicas: int) -> bool:
        """Scaled to ``replicas`` as the Deployment controller saw it, with that many pods Ready."""
        return self.observed and self.spec_replicas == replicas and self.ready_replicas >= replicas

    @property
    def gpu_pods(self) -> int:
        """Pods that hold (or are about to hold) GPUs: asked for, running or still terminating."""
        return max(self.spec_replicas, self.replicas, self.pods or 0)

    @property
    def existing_pods(self) -> int:
        return self.replicas if self.pods is None else self.pods


@dataclasses.dataclass(frozen=True)
class ControlRequest:
    """A request from an annotation, applied once (its id is recorded in status.handledRequests)."""

    action: Action
    request_id: str
    to_revision: str | None = None
    revision: str | None = None
    """The revision a FOR_REVISION request was made for (None: one made without, taken as made for
    the revision in progress when the engine first sees it)."""


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """An earlier stable revision kept (at 0 replicas) for an exact undo; created: when it became stable."""

    revision: str
    created: str | None = None


ANALYSIS_RUNS_KEPT = 10


@dataclasses.dataclass(frozen=True)
class AnalysisRun:
    """A window's analysis that decided something, as status.analysisRuns keeps it."""

    revision: str
    step_index: int
    weight: int
    verdict: str
    message: str
    at: str

    def to_status(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "stepIndex": self.step_index,
            "weight": self.weight,
            "verdict": self.verdict,
            "message": self.message,
            "at": self.at,
        }

    @classmethod
    def from_status(cls, raw: Mapping[str, Any]) -> AnalysisRun | None:
        try:
            return cls(
                revision=str(raw["revision"]),
                step_index=int(raw.get("stepIndex", 0)),
                weight=int(raw.get("weight", 0)),
                verdict=str(raw.get("verdict", "")),
                message=str(raw.get("message", "")),
                at=str(raw.get("at", "")),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclasses.dataclass(frozen=True)
class RolloutStatus:
    """The status fields the engine reads and writes (camelCase in the TritonService status)."""

    stable_revision: str | None = None
    stable_since: datetime | None = None
    canary_revision: str | None = None
    canary_weight: int | None = None
    current_step_index: int | None = None
    step_started_at: datetime | None = None
    canary_started_at: datetime | None = None
    waiting_since: datetime | None = None
    promoting: bool = False
    aborted_revision: str | None = None
    aborted_reason: str | None = None
    aborted_step_index: int | None = None
    aborted_detail: str | None = None
    """What decided the abort, when more than its reason says: Triton's load failure, the figures."""
    paused_by_user: bool = False
    pinned_revision: str | None = None
    pinned_for: str | None = None
    replaced_revision: str | None = None
    """A stable revision found without a Deployment, replaced by the spec's (Degraded until Ready)."""
    handled_requests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    history: tuple[HistoryEntry, ...] = ()
    analysis_runs: tuple[AnalysisRun, ...] = ()

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> RolloutStatus:
        """Read the fields from a TritonService status dict (unknown or missing fields default)."""
        s = status or {}

        def opt_int(key: str) -> int | None:
            value = s.get(key)
            return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        def opt_str(key: str) -> str | None:
            value = s.get(key)
            return str(value) if value else None

        handled = s.get("handledRequests") or {}
        history = tuple(
            HistoryEntry(revision=str(h["revision"]), created=h.get("created"))
            for h in s.get("history") or []
            if isinstance(h, Mapping) and h.get("revision")
        )
        runs = tuple(
            run
            for raw in s.get("analysisRuns") or []
            if isinstance(raw, Mapping) and (run := AnalysisRun.from_status(raw)) is not None
        )
        return cls(
            stable_revision=opt_str("stableRevision"),
            stable_since=parse_time(s.get("stableSince")),
            canary_revision=opt_str("canaryRevision"),
            canary_weight=opt_int("canaryWeight"),
            current_step_index=opt_int("currentStepIndex"),
            step_started_at=parse_time(s.get("stepStartedAt")),
            canary_started_at=parse_time(s.get("canaryStartedAt")),
            waiting_since=parse_time(s.get("waitingSince")),
            promoting=bool(s.get("promoting", False)),
            aborted_revision=opt_str("abortedRevision"),
            aborted_reason=opt_str("abortedReason"),
            aborted_step_index=opt_int("abortedStepIndex"),
            aborted_detail=opt_str("abortedDetail"),
            paused_by_user=bool(s.get("pausedByUser", False)),
            pinned_revision=opt_str("pinnedRevision"),
            pinned_for=opt_str("pinnedFor"),
            replaced_revision=opt_str("replacedRevision"),
            handled_requests={str(k): str(v) for k, v in handled.items()}
            if isinstance(handled, Mapping)
            else {},
            history=history,
            analysis_runs=runs,
        )

    def to_status(self) -> dict[str, Any]:
        """Every field, camelCase; None where unset so that a merge patch clears stale values."""

        def t(moment: datetime | None) -> str | None:
            return format_time(moment) if moment is not None else None

        return {
            "stableRevision": self.stable_revision,
            "stableSince": t(self.stable_since),
            "canaryRevision": self.canary_revision,
            "canaryWeight": self.canary_weight,
            "currentStepIndex": self.current_step_index,
            "stepStartedAt": t(self.step_started_at),
            "canaryStartedAt": t(self.canary_started_at),
            "waitingSince": t(self.waiting_since),
            "promoting": self.promoting,
            "abortedRevision": self.aborted_revision,
            "abortedReason": self.aborted_reason,
            "abortedStepIndex": self.aborted_step_index,
            "abortedDetail": self.aborted_detail,
            "pausedByUser": self.paused_by_user,
            "pinnedRevision": self.pinned_revision,
            "pinnedFor": self.pinned_for,
            "replacedRevision": self.replaced_revision,
            "handledRequests": dict(self.handled_requests),
            "history": [
                {"revision": h.revision, **({"created": h.created} if h.created else {})}
                for h in self.history
            ],
            "analysisRuns": [run.to_status() for run in self.analysis_runs],
        }


@dataclasses.dataclass(frozen=True)
class RolloutInput:
    """Everything plan_rollout reads."""

    rollout: Rollout
    """spec.rollout."""
    replicas: int
    """spec.replicas."""
    desired_revision: str
    """The revision hash of what the spec asks to serve now."""
    now: datetime
    status: RolloutStatus = dataclasses.field(default_factory=RolloutStatus)
    revisions: Mapping[str, RevisionState] = dataclasses.field(default_factory=dict)
    """Observed revision Deployments by revision hash (every Deployment of this TritonService)."""
    gpus_per_pod: int = 0
    """spec.resources.gpus."""
    requests: Sequence[ControlRequest] = ()
    """Control requests from the annotations (parse_control_requests)."""
    progress_deadline_seconds: int | None = None
    """The spec's effective progress deadline (TritonServiceSpec.progress_deadline); None: rollout's."""
    unsyncable: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Revisions whose pods could not sync any more (objects overwritten in an unversioned bucket): why."""
    analysis: AnalysisResult | None = None
    """The canary's verdict in the window of its current weight (reconcile.analysis); None: no reading."""


# ----------------------------------------------------------------- outputs


@dataclasses.dataclass(frozen=True)
class RolloutEvent:
    type: str
    """Normal or Warning."""
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class RolloutPlan:
    """What the reconcile does: apply replicas, delete, set traffic, write status, emit events."""

    replicas: Mapping[str, int]
    """Deployment spec.replicas per revision to keep (stable, canary, history, a held aborted one)."""
    delete: tuple[str, ...]
    """Observed revisions whose Deployment (and ConfigMap) goes away."""
    weights: TrafficWeights
    """Route weights (Gateway API); without a router the replicas make the split."""
    header_route: SetHeaderRoute | None
    """The A/B rule to put first in the routes, if any."""
    stable_service_revision: str | None
    """The revision `<name>-stable` selects."""
    canary_service_revision: str | None
    """The revision `<name>-canary` selects (the stable one when no canary runs)."""
    status: RolloutStatus
    conditions: Mapping[str, Verdict]
    """The engine's conditions by type: Progressing and Degraded."""
    events: tuple[RolloutEvent, ...]
    requeue_after: float | None
    """Seconds until a timed pause ends or a deadline passes; None when nothing is timed."""

    def condition(self, condition_type: str) -> Verdict | None:
        return self.conditions.get(condition_type)


# ----------------------------------------------------------------- pure maths


def canary_replicas(replicas: int, weight: int) -> int:
    """ceil(replicas * weight / 100), in integers: the canary's share of ``replicas`` for ``weight`` %."""
    if not 0 <= weight <= 100:
        raise ValueError(f"weight must be 0..100, got {weight}")
    if replicas < 0:
        raise ValueError(f"replicas must be >= 0, got {replicas}")
    return -(-replicas * weight // 100)


@dataclasses.dataclass(frozen=True)
class Split:
    """Replicas of stable and canary under a GPU budget (see the maths at the top of this module)."""

    stable: int
    """Stable replicas to apply now."""
    canary: int
    """Canary replicas to apply now."""
    stable_goal: int
    canary_goal: int
    """Canary replicas the current step waits to see Ready."""
    too_small: bool = False
    """The budget cannot hold one canary pod beside a serving stable."""


def _grow(goal: int, current: int, free: int) -> int:
    """Scale down at once; scale up only into released capacity."""
    if goal <= current:
        return goal
    return min(goal, max(current, free))


def gpu_split(
    replicas: int,
    canary_goal: int,
    gpus_per_pod: int,
    gpu_budget: int | None,
    *,
    stable: RevisionState | None = None,
    canary: RevisionState | None = None,
    other_pods: int = 0,
) -> Split:
    """Stable and canary replicas so that (stable + canary) * gpus_per_pod <= gpu_budget at all times."""
    if gpu_budget is None or gpus_per_pod <= 0:
        return Split(replicas, canary_goal, replicas, canary_goal)
    budget_pods = gpu_budget // gpus_per_pod
    if budget_pods >= replicas + canary_goal:
        stable_goal, goal = replicas, canary_goal
    else:
        floor = max(replicas - canary_goal, 1) if replicas > 0 else 0
        goal = max(0, min(canary_goal, budget_pods - floor))
        if canary_goal > 0 and goal == 0:
            return Split(replicas, 0, replicas, 0, too_small=True)
        stable_goal = min(replicas, budget_pods - goal)
    stable_pods = stable.gpu_pods if stable else 0
    canary_pods = canary.gpu_pods if canary else 0
    if canary_pods == 0 and goal == 0 and other_pods == 0:
        # A single revision alone is never capped below spec.replicas.
        return Split(replicas, 0, replicas, 0)
    stable_now = _grow(
        stable_goal, stable.spec_replicas if stable else 0, budget_pods - canary_pods - other_pods
    )
    canary_now = _grow(goal, canary.spec_replicas if canary else 0, budget_pods - stable_pods - other_pods)
    return Split(stable_now, canary_now, stable_goal, goal)


# ----------------------------------------------------------------- control annotations


def parse_control_requests(annotations: Mapping[str, str] | None) -> tuple[ControlRequest, ...]:
    """Control requests from metadata.annotations: `triton-operator.io/<action>: <request id>`."""
    annotations = annotations or {}
    out: list[ControlRequest] = []
    for action in ACTIONS:
        request_id = annotations.get(ANNOTATION_PREFIX + action)
        if not request_id:
            continue
        target = annotations.get(UNDO_TARGET_ANNOTATION) if action == "undo" else None
        revision = (
            annotations.get(ANNOTATION_PREFIX + action + REVISION_SUFFIX) if action in FOR_REVISION else None
        )
        out.append(
            ControlRequest(
                action=action,
                request_id=str(request_id),
                to_revision=target or None,
                revision=str(revision) if revision else None,
            )
        )
    return tuple(out)


def pending_requests(
    annotations: Mapping[str, str] | None, status: Mapping[str, Any] | None
) -> tuple[ControlRequest, ...]:
    """The control requests of the annotations that status.handledRequests does not record yet."""
    handled = RolloutStatus.from_status(status).handled_requests
    return tuple(r for r in parse_control_requests(annotations) if handled.get(r.action) != r.request_id)


def control_annotations(
    action: Action, request_id: str, to_revision: str | None = None, *, revision: str | None = None
) -> dict[str, str | None]:
    """The metadata.annotations of a merge patch that makes a request (None removes a key).

    ``revision``: the revision a promote, promote-full or abort is made for (the engine ignores it
    for any other); None removes what an earlier request named."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if not request_id:
        raise ValueError("a request needs an id")
    patch: dict[str, str | None] = {ANNOTATION_PREFIX + action: request_id}
    if action == "undo":
        patch[UNDO_TARGET_ANNOTATION] = to_revision or None
    elif to_revision:
        raise ValueError("only undo takes a target revision")
    if action in FOR_REVISION:
        patch[ANNOTATION_PREFIX + action + REVISION_SUFFIX] = revision or None
    elif revision:
        raise ValueError(f"{action} is not made for a revision (only {', '.join(FOR_REVISION)})")
    return patch


def request_revision(status: Mapping[str, Any] | None) -> str | None:
    """The revision a promote or abort made now is for: the canary in progress, else the aborted one."""
    st = RolloutStatus.from_status(status)
    return st.canary_revision or st.aborted_revision


# ----------------------------------------------------------------- the engine


def under_analysis(rollout: Rollout, status: RolloutStatus) -> bool:
    """Whether the canary is judged now: analysis set, Canary strategy, and it holds traffic."""
    return (
        rollout.analysis is not None
        and rollout.strategy == Strategy.CANARY
        and status.canary_revision is not None
        and (status.canary_weight or 0) > 0
    )


def describe_step(step: CanaryStep) -> str:
    """A short human form of a step: setWeight 10, pause 60s, pause (until promoted), setHeaderRoute x."""
    if step.set_weight is not None:
        return f"setWeight {step.set_weight}"
    if step.pause is not None:
        if step.pause.duration_seconds is None:
            return "pause (until promoted)"
        return f"pause {step.pause.duration_seconds}s"
    if step.set_header_route is not None:
        return f"setHeaderRoute {step.set_header_route.name}"
    return "step"


def plan_rollout(inp: RolloutInput) -> RolloutPlan:
    """The whole rollout decision for one reconcile (see the notes at the top of this module)."""
    return _Engine(inp).run()


class _Engine:
    """One call's working state; pure: reads the input, builds the plan, touches nothing else."""

    def __init__(self, inp: RolloutInput) -> None:
        self.inp = inp
        self.now = _utc(inp.now).replace(microsecond=0)
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

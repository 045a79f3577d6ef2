"""The status computed from observations: the conditions' verdicts and the owned status fields."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.core.decision.actions import RevisionPlan
from triton_operator.core.observed.observation import DeploymentState, PodState
from triton_operator.core.pod.startup import InPlaceRecords, describe_phases, served_entry
from triton_operator.core.rollout.plan import RolloutEvent
from triton_operator.core.vocabulary.conditions import (
    AS_EXPECTED,
    AUTOSCALING,
    AVAILABLE,
    DEGRADED,
    FALSE,
    INVALID_SPEC,
    NO_PODS,
    NORMAL,
    PODS_FAILING,
    PODS_SCHEDULED,
    PROGRESS_DEADLINE_EXCEEDED,
    PROGRESSING,
    READY,
    REPLICAS_NOT_READY,
    REPOSITORY_READY,
    REVISION_SERVED,
    ROLLOUT_ABORTED,
    ROLLOUT_IN_PROGRESS,
    SCALED_TO_ZERO,
    SCHEDULED,
    TRAFFIC_ROUTED,
    TRUE,
    UNSCHEDULABLE,
    Verdict,
    drop_condition,
    set_condition,
)
from triton_operator.core.vocabulary.triton_state import describe_failures
from triton_operator.models import TritonServiceStatus

# ----------------------------------------------------------------- observations -> verdicts


def _replica_message(revision: str, state: DeploymentState | None, replicas: int) -> str:
    ready = state.ready_replicas if state else 0
    return f"revision {revision}: {ready}/{replicas} replicas ready"


def pods_scheduled(
    pods: Sequence[PodState],
    revisions: Sequence[str],
    deployments: Mapping[str, DeploymentState] | None = None,
) -> Verdict:
    """False/Unschedulable with the scheduler's own message when a serving pod cannot be placed.

    Otherwise True, counting each revision's pods as its Deployment (in ``deployments``, by revision)
    counts them, as status.replicas does: a new pod's event comes a moment before its Deployment's,
    and the condition and status.replicas then change in one status write rather than two.
    A revision without a Deployment in ``deployments`` counts the live pods seen."""
    serving = [p for p in pods if p.revision in revisions and p.live]
    stuck = [p for p in serving if p.unschedulable is not None]
    if stuck:
        first = stuck[0]
        return Verdict(
            FALSE, UNSCHEDULABLE, f"{len(stuck)} pod(s) unschedulable; {first.name}: {first.unschedulable}"
        )
    counted = deployments or {}
    count = sum(
        counted[r].status_replicas if r in counted else sum(1 for p in serving if p.revision == r)
        for r in dict.fromkeys(revisions)
    )
    if not count:
        return Verdict(TRUE, NO_PODS, "no pods to schedule")
    return Verdict(TRUE, SCHEDULED, f"{count} pod(s) scheduled")


def degraded(
    pods: Sequence[PodState], deployments: Sequence[DeploymentState], revisions: Sequence[str]
) -> Verdict:
    """True when serving pods fail (crash loops, image pulls) or a revision missed its deadline."""
    failing = [p for p in pods if p.revision in revisions and p.waiting_reason and p.live]
    if failing:
        first = failing[0]
        triton = describe_failures(first.triton_failures)
        return Verdict(
            TRUE,
            PODS_FAILING,
            f"{len(failing)} pod(s) failing; {first.name}: {first.waiting_reason}: {first.waiting_message}"
            + (f"; sync: {first.sync_failure}" if first.sync_failure else "")
            + (f"; Triton: {triton}" if triton else ""),
        )
    late = [d for d in deployments if d.revision in revisions and d.deadline_exceeded]
    if late:
        return Verdict(
            TRUE, PROGRESS_DEADLINE_EXCEEDED, f"Deployment {late[0].name} exceeded its progress deadline"
        )
    return Verdict(FALSE, AS_EXPECTED, "no failing pods")


def summarize_ready(
    *,
    invalid: str | None,
    blocked_reason: str = INVALID_SPEC,
    scheduled: Verdict,
    plan: RevisionPlan | None,
    deployments: Mapping[str, DeploymentState],
    replicas: int,
    aborted: str | None = None,
    in_place_rolling: str | None = None,
) -> Verdict:
    """The Ready summary: True only when the current spec is served by all its replicas.

    ``aborted`` (a message) says the spec's revision was rolled back: the stable one serves, but
    not what the spec asks for.
    """
    if invalid is not None or plan is None:
        return Verdict(FALSE, blocked_reason, invalid or "the spec is invalid")
    if scheduled.status == FALSE:
        return Verdict(FALSE, scheduled.reason, scheduled.message)
    if aborted is not None:
        return Verdict(FALSE, ROLLOUT_ABORTED, aborted)
    if in_place_rolling is not None:
        return Verdict(FALSE, ROLLOUT_IN_PROGRESS, in_place_rolling)
    if plan.rolling is not None:
        return Verdict(
            FALSE,
            ROLLOUT_IN_PROGRESS,
            f"{_replica_message(plan.rolling, deployments.get(plan.rolling), replicas)}",
        )
    assert plan.stable is not None
    state = deployments.get(plan.stable)
    if state is None or not state.ready_at(replicas):
        return Verdict(FALSE, REPLICAS_NOT_READY, _replica_message(plan.stable, state, replicas))
    if replicas == 0:
        return Verdict(TRUE, SCALED_TO_ZERO, f"revision {plan.stable} is scaled to zero")
    return Verdict(TRUE, AVAILABLE, _replica_message(plan.stable, state, replicas))


# ----------------------------------------------------------------- time to serve


def time_to_serve(
    previous: Sequence[Mapping[str, Any]],
    pods: Sequence[PodState],
    revisions: Sequence[str],
    deployments: Mapping[str, DeploymentState] | None = None,
    in_place: InPlaceRecords | None = None,
) -> list[dict[str, Any]]:
    """status.timeToServe: for each serving revision, its first Ready pod's start (core.pod.startup);
    and for each revision loaded in place (``in_place``: the one the host pods serve, the one they load),
    the first host pod's agent's change, in the in-place update's phases (InPlaceRecords.entry), once
    an agent has loaded it.

    Recorded once, then kept as ``previous`` has it while the revision serves (a later pod, a
    restart or a scale-up changes nothing: the status is written only when it changes); a revision
    that no longer serves drops out. The first Ready pod is, among those the pass sees Ready, the
    one Ready first.

    A revision whose Deployment (in ``deployments``, by revision) counts no ready replica yet is
    recorded once it does: the pod's Ready event comes a moment before its Deployment's, and the
    status that records the time to serve then also says the replicas are ready, in one write rather
    than two that disagree in between. The figures are the pod's own times, so waiting changes none.
    """
    loaded_in_place = [r for r in (in_place.revisions if in_place else ()) if r not in revisions]
    wanted = [*revisions, *dict.fromkeys(loaded_in_place)]
    kept = {str(e.get("revision")): dict(e) for e in previous if e.get("revision") in wanted}
    out = []
    for revision in wanted:
        if revision not in revisions:
            entry = kept.get(revision) or (in_place.entry(revision) if in_place else None)
            if entry is not None:
                out.append(entry)
            continue
        state = (deployments or {}).get(revision)
        counted = state is None or state.ready_replicas > 0
        if revision not in kept and counted:
            ready = sorted(
                (p for p in pods if p.revision == revision and p.ready and not p.terminating),
                key=lambda p: (p.start.ready is None, p.start.ready, p.name),
            )
            entries = (served_entry(revision, p.name, p.start) for p in ready)
            first = next((e for e in entries if e is not None), None)
            if first is not None:
                kept[revision] = first
        if revision in kept:
            out.append(kept[revision])
    return out


def served_events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[RolloutEvent]:
    """A Normal RevisionServed Event for each revision whose time to serve ``status`` records and
    ``previous`` did not: once a revision, when its first pod is seen Ready (a status write that
    fails posts none, and the next pass records it again)."""
    before = {e.get("revision") for e in previous.get("timeToServe") or []}
    return [
        RolloutEvent(
            NORMAL,
            REVISION_SERVED,
            f"revision {e.get('revision')} served"
            + (f" in place (in the pods of revision {e['host']})" if e.get("host") else "")
            + f" in {describe_phases(e)} (pod {e.get('pod')})",
        )
        for e in status.get("timeToServe") or []
        if e.get("revision") not in before
    ]


# ----------------------------------------------------------------- the whole status

# The rollout engine's bookkeeping (core.rollout.state.RolloutStatus.to_status), owned by the reconcile too.
ROLLOUT_STATUS_FIELDS = (
    "canaryWeight",
    "currentStepIndex",
    "stableSince",
    "stepStartedAt",
    "canaryStartedAt",
    "waitingSince",
    "promoting",
    "pausedByUser",
    "abortedRevision",
    "abortedReason",
    "abortedStepIndex",
    "abortedDetail",
    "analysisRuns",
    "pinnedRevision",
    "pinnedFor",
    "replacedRevision",
    "handledRequests",
    "servedRevision",
    "rolloutKind",
    "rolloutKindReason",
    "inPlace",
)
# Status fields this module computes (and the reconcile owns); others are left alone.
OWNED_STATUS_FIELDS = (
    "observedGeneration",
    "conditions",
    "stableRevision",
    "canaryRevision",
    "replicas",
    "selector",
    "readyReplicas",
    "models",
    "endpoints",
    "history",
    "analysis",
    "image",
    "defaultImage",
    "timeToServe",
    *ROLLOUT_STATUS_FIELDS,
)


POOL_STATUS_FIELD = "pool"
"""status.pool: written beside the owned fields by a pooled pass (core.decision.pool_plan)."""


def compact(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Fields without unset values (None, false, empty maps and lists): left out is how SSA clears them.

    The status is written by server-side apply: a field the operator owned and leaves out is
    removed, so an unset value is left out rather than written as null or an empty default.
    """
    return {k: v for k, v in fields.items() if v is not None and v is not False and v not in ({}, [])}


@dataclasses.dataclass(frozen=True)
class Observation:
    """Everything build_status reads, gathered by the reconcile."""

    generation: int
    now: str
    deployments: Sequence[DeploymentState] = ()
    pods: Sequence[PodState] = ()
    invalid: str | None = None
    """Why nothing can be applied (an invalid spec, an unreadable repository); None otherwise."""
    blocked_reason: str = INVALID_SPEC
    """The Ready reason while ``invalid`` holds."""
    plan: RevisionPlan | None = None
    replicas: int = 0
    """spec.replicas (the Ready summary's goal)."""
    scale_replicas: int = 0
    """status.replicas: the pods of the revisions taking traffic (core.decision.scaling.scale_replicas)."""
    scale_selector: str | None = None
    """status.selector: those pods' label selector (core.decision.scaling.scale_selector)."""
    autoscaling: Verdict | None = None
    """The Autoscaling condition (spec.autoscaling); None removes it."""
    repository: Verdict | None = None
    endpoints: Mapping[str, str] | None = None
    models: Sequence[Mapping[str, Any]] = ()
    rollout: Mapping[str, Any] | None = None
    """The rollout engine's status fields (camelCase, history included)."""
    progressing: Verdict | None = None
    """The rollout engine's Progressing (None leaves the condition as it was)."""
    rollout_degraded: Verdict | None = None
    """The rollout engine's Degraded: it wins when True, else failing pods make Degraded True."""
    aborted: str | None = None
    """Why the spec's revision was rolled back (Ready=False/RolloutAborted); None when it was not."""
    in_place_rolling: str | None = None
    """The spec's revision loads in place in the stable pods (Ready=False/RolloutInProgress): how far."""
    traffic: Verdict | None = None
    """TrafficRouted (Gateway API routes); None removes the condition."""
    in_place: InPlaceRecords | None = None
    """The in-place update's revisions and its host pods' agents' records (status.timeToServe)."""
    analysis: Mapping[str, Any] | None = None
    """status.analysis: the canary's current analysis window and its figures; None removes it."""
    image: str | None = None
    """status.image: the tritonserver image the stable revision runs."""
    default_image: str | None = None
    """status.defaultImage: the operator's default image, when the spec names none and the stable
    revision runs another (core.observed.observation.behind_default)."""


def written_status(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The status as it is written: ``fields`` (camelCase) built into TritonServiceStatus, the model the
    CRD's status schema is generated from, and dumped with exactly the fields set (absent stays absent).

    A field the model does not know is a bug here (the schema would prune it): it raises.
    """
    status = TritonServiceStatus.model_validate(fields)
    if status.model_extra:
        unknown = ", ".join(sorted(status.model_extra))
        raise ValueError(f"status fields not in TritonServiceStatus (the CRD schema): {unknown}")
    return status.model_dump(by_alias=True, exclude_unset=True, mode="json")


def _kept_from(previous: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` with the owned fields it does not set kept as ``previous`` has them (nothing applied)."""
    kept = {k: previous[k] for k in OWNED_STATUS_FIELDS if k != "conditions" and previous.get(k) is not None}
    return {**kept, **status}


def build_status(previous: Mapping[str, Any], obs: Observation) -> dict[str, Any]:
    """The owned status fields from an observation; ``previous`` supplies transition times and history.

    Written as TritonServiceStatus dumps them (written_status): the schema and the status are one model.
    """
    conditions: list[dict[str, Any]] = [dict(c) for c in previous.get("conditions") or []]
    by_revision = {d.revision: d for d in obs.deployments}
    plan = obs.plan
    gen = obs.generation

    def put(condition_type: str, verdict: Verdict) -> None:
        nonlocal conditions
        conditions = set_condition(
            conditions, condition_type, verdict.status, verdict.reason, verdict.message, gen, obs.now
        )

    status: dict[str, Any] = {"observedGeneration": gen}
    # The revisions that serve: the plan's, or (nothing applied) those the status last recorded.
    if plan is None:
        revisions = [r for r in (previous.get("stableRevision"), previous.get("canaryRevision")) if r]
    else:
        revisions = [r for r in (plan.stable, plan.rolling) if r]
    scheduled = pods_scheduled(obs.pods, revisions, by_revision)
    if obs.repository is not None:
        put(REPOSITORY_READY, obs.repository)
    put(PODS_SCHEDULED, scheduled)
    failing = degraded(obs.pods, obs.deployments, revisions)
    progressing = obs.progressing
    if plan is None:
        # Invalid spec or unreadable repository: nothing was applied; say what runs and why.
        progressing = Verdict(
            FALSE, obs.blocked_reason, "nothing can be rolled out: running revisions are left as they are"
        )
    elif obs.rollout_degraded is not None and (obs.rollout_degraded.status == TRUE or failing.status != TRUE):
        failing = obs.rollout_degraded
    put(DEGRADED, failing)
    if progressing is not None:
        put(PROGRESSING, progressing)
    put(
        READY,
        summarize_ready(
            # Set when the spec waits: nothing was applied, or this plan is its last valid one's.
            invalid=obs.invalid,
            blocked_reason=obs.blocked_reason,
            scheduled=scheduled,
            plan=plan,
            deployments=by_revision,
            replicas=obs.replicas,
            aborted=obs.aborted,
            in_place_rolling=obs.in_place_rolling,
        ),
    )
    if plan is None:
        status["conditions"] = conditions
        return written_status(_kept_from(previous, status))

    if obs.traffic is not None:
        put(TRAFFIC_ROUTED, obs.traffic)
    else:
        conditions = drop_condition(conditions, TRAFFIC_ROUTED)
    if obs.autoscaling is not None:
        put(AUTOSCALING, obs.autoscaling)
    else:
        conditions = drop_condition(conditions, AUTOSCALING)
    status["conditions"] = conditions
    if plan.stable:
        status["stableRevision"] = plan.stable
    if plan.rolling:
        status["canaryRevision"] = plan.rolling
    stable_state = by_revision.get(plan.stable or "")
    ready = stable_state.ready_replicas if stable_state else 0
    status["replicas"] = obs.scale_replicas
    if obs.scale_selector is not None:
        status["selector"] = obs.scale_selector
    status["readyReplicas"] = ready
    if obs.models:
        status["models"] = [{**m, "ready": ready > 0} for m in obs.models]
    if obs.endpoints:
        status["endpoints"] = dict(obs.endpoints)
    if obs.analysis:
        status["analysis"] = dict(obs.analysis)
    served = time_to_serve(
        previous.get("timeToServe") or [], obs.pods, revisions, by_revision, in_place=obs.in_place
    )
    if served:
        status["timeToServe"] = served
    if obs.image:
        status["image"] = obs.image
    if obs.default_image:
        status["defaultImage"] = obs.default_image
    if obs.rollout is not None:
        status.update(compact({k: v for k, v in obs.rollout.items() if k in OWNED_STATUS_FIELDS}))
    return written_status(status)


def status_changed(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether writing ``desired`` would change any owned field of ``previous``."""
    return any(previous.get(key) != desired.get(key) for key in (*OWNED_STATUS_FIELDS, POOL_STATUS_FIELD))

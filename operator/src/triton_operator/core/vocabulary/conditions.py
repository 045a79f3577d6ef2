"""Every condition type, status, reason and Event reason, each defined once; the condition helpers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

# ----------------------------------------------------------------- condition types

READY = "Ready"  # the summary: True only when the current spec is served by all its replicas
REPOSITORY_READY = "RepositoryReady"  # the model repository was read and pinned (or is mounted)
PROGRESSING = "Progressing"  # the rollout engine: a revision is being rolled out (or why not)
DEGRADED = "Degraded"  # serving pods fail, a deadline passed, or a rollout was aborted
PODS_SCHEDULED = "PodsScheduled"  # every serving pod could be placed by the scheduler
TRAFFIC_ROUTED = "TrafficRouted"  # Gateway API route weights written (only with trafficRouting.gatewayAPI)
AUTOSCALING = (
    "Autoscaling"  # the owned HorizontalPodAutoscaler scales the service (only with spec.autoscaling)
)
CONDITION_TYPES = (
    READY,
    REPOSITORY_READY,
    PROGRESSING,
    DEGRADED,
    PODS_SCHEDULED,
    TRAFFIC_ROUTED,
    AUTOSCALING,
)

# ----------------------------------------------------------------- condition status values

TRUE = "True"  # the condition holds
FALSE = "False"  # the condition does not hold
UNKNOWN = "Unknown"  # not known (yet)

# ----------------------------------------------------------------- reasons

# Ready
AVAILABLE = "Available"  # the stable revision serves at all its replicas
SCALED_TO_ZERO = "ScaledToZero"  # spec.replicas is 0: nothing serves, as asked
INVALID_SPEC = "InvalidSpec"  # the spec cannot be applied (also Progressing while it holds)
REFUSED_BY_POLICY = "RefusedByPolicy"  # the operator's policy refuses the spec's image or a volume type
ROLLOUT_IN_PROGRESS = "RolloutInProgress"  # a new revision is rolling out
REPLICAS_NOT_READY = "ReplicasNotReady"  # the stable revision has fewer Ready replicas than asked
UNSCHEDULABLE = "Unschedulable"  # a serving pod cannot be placed (also PodsScheduled)
ROLLOUT_ABORTED = "RolloutAborted"  # the spec's revision was rolled back (also Progressing, and an Event)
# PodsScheduled
SCHEDULED = "Scheduled"  # every serving pod was placed
NO_PODS = "NoPods"  # no serving pod to place
# Progressing
NEW_REVISION = "NewRevision"  # a canary starts: step 0, waiting for its pods
WAITING_FOR_CANARY_READY = "WaitingForCanaryReady"  # a step waits for the canary's Ready replicas
STEP_PAUSED = "StepPaused"  # a pause step: timed, or until promoted
ROLLOUT_PAUSED = "RolloutPaused"  # paused by spec.rollout.paused or a pause request (also an Event)
PROMOTING = "Promoting"  # the canary scales to full replicas before it becomes stable
ROLLOUT_COMPLETED = "RolloutCompleted"  # the stable revision serves at all replicas (also an Event)
WAITING_FOR_STABLE_READY = "WaitingForStableReady"  # the stable revision waits for its Ready replicas
GPU_BUDGET_TOO_SMALL = "GpuBudgetTooSmall"  # gpuBudget leaves no room for a canary pod (also Degraded)
WAITING_FOR_ANALYSIS = "WaitingForAnalysis"  # a step raising the canary's traffic waits for its analysis
IN_PLACE_UPDATING = "InPlaceUpdating"  # the stable revision's pods load a new revision's models in place
IN_PLACE_ROLLING_BACK = "InPlaceRollingBack"  # an aborted in-place update: the pods load the old models again
# Degraded (the abort reasons among them, recorded in status.abortedReason)
AS_EXPECTED = "AsExpected"  # nothing failed
PODS_FAILING = "PodsFailing"  # serving pods crash-loop or cannot pull their image
PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"  # a revision missed its deadline (abort reason)
CANARY_CRASH_LOOPING = "CanaryCrashLooping"  # the canary's pods crash-loop (abort reason)
CANARY_UNSCHEDULABLE = "CanaryUnschedulable"  # the canary's pods stayed unschedulable (abort reason)
ABORTED = "Aborted"  # aborted by request or spec (abort reason)
ANALYSIS_FAILED = "AnalysisFailed"  # the canary failed its analysis on Triton's metrics (abort reason, Event)
ANALYSIS_INCONCLUSIVE = "AnalysisInconclusive"  # too few requests in time (abort reason with onInconclusive
# Abort; an Event with Pause)
ANALYSIS_PASSED = "AnalysisPassed"  # a window's analysis passed and the canary's traffic was raised (Event)
STABLE_REVISION_MISSING = "StableRevisionMissing"  # the stable revision's Deployment is gone (also an Event)
IN_PLACE_LOAD_FAILED = "InPlaceLoadFailed"  # a pod's agent could not load the new models (abort reason)
POOL_LOAD_FAILED = "PoolLoadFailed"  # a pool pod's agent could not load a model placed on it (an Event)
POOL_MODEL_TOO_LARGE = "PoolModelLargerThanPod"  # a pooled model was measured larger than a pod (an Event)
IN_PLACE_POD_LOST = "InPlacePodLost"  # a pod being updated in place went away (abort reason)
# RepositoryReady
MANIFEST_PINNED = "ManifestPinned"  # the repository's object versions are pinned in a manifest
UNPINNED = "Unpinned"  # no storage adapter configured: pods read the repository as it is
VOLUME_MOUNTED = "VolumeMounted"  # a PVC repository: pods link the mounted models
REPOSITORY_ERROR = "RepositoryError"  # the repository could not be read
MODELS_NOT_FOUND = "ModelsNotFound"  # the repository holds no models (or not the ones asked for)
CREDENTIALS_MISSING = "CredentialsMissing"  # the repository's credentials Secret is missing
CREDENTIALS_REQUIRED = "CredentialsRequired"  # no credentials Secret, and the operator lends no identity here
ENDPOINT_NOT_ALLOWED = "EndpointNotAllowed"  # the repository's endpoint is not on the operator's allow-list
MANIFEST_TOO_LARGE = "ManifestTooLarge"  # the pinned manifest is too large to store
LISTING_TOO_LARGE = "ListingTooLarge"  # the repository holds more objects than the operator lists
REPOSITORY_LISTING = "RepositoryListing"  # the repository of a changed spec is being listed (no pass waits)
# TrafficRouted (only with spec.rollout.trafficRouting.gatewayAPI)
WEIGHTS_SET = "WeightsSet"  # the routes carry the rollout's weights
ROUTE_NOT_FOUND = "RouteNotFound"  # a named route does not exist
ROUTE_NOT_REFERENCING = "RouteNotReferencing"  # a route does not send to the stable/canary Services
ROUTE_INVALID = "RouteInvalid"  # a route could not be written
# Autoscaling (only with spec.autoscaling)
AUTOSCALER_ACTIVE = "AutoscalerActive"  # the owned HPA reads its metrics and sets spec.replicas
AUTOSCALER_PENDING = "AutoscalerPending"  # the owned HPA was written and has not reported yet
AUTOSCALER_NOT_SCALING = "AutoscalerNotScaling"  # the owned HPA cannot scale (its own reason in the message)
AUTOSCALER_REMOVED = "AutoscalerRemoved"  # spec.autoscaling was unset: the owned HPA is being deleted
FOREIGN_AUTOSCALER = "ForeignAutoscaler"  # another HPA (yours, KEDA's) targets the service: none is written

# ----------------------------------------------------------------- Events (core/v1 Event type and reason)

NORMAL = "Normal"  # Event type: routine
WARNING = "Warning"  # Event type: something went wrong
# Event reasons besides ROLLOUT_PAUSED, ROLLOUT_COMPLETED, ROLLOUT_ABORTED and STABLE_REVISION_MISSING
ROLLOUT_RESUMED = "RolloutResumed"  # a resume request lifted a pause
SPEC_WARNING = "SpecWarning"  # likely wrong without being certain (an unknown backend): once a generation
UNDO_REJECTED = "UndoRejected"  # an undo request names no usable revision
REQUEST_IGNORED = "RequestIgnored"  # a promote/abort made for another revision, or a promote that would
# give a canary traffic before its pods are Ready
UNDO_REQUESTED = "UndoRequested"  # an undo request rolls back to an earlier revision
ROLLOUT_RETRIED = "RolloutRetried"  # a retry request starts the aborted revision again
STABLE_ADOPTED = "StableAdopted"  # a serving revision kept as stable (none recorded in status)
ROLLOUT_CANCELLED = "RolloutCancelled"  # the spec went back to the stable revision during a rollout
CANARY_REPLACED = "CanaryReplaced"  # a new revision replaces the running canary
ROLLOUT_ROLLBACK = "RolloutRollback"  # a revision from history rolls back without steps
ROLLOUT_STARTED = "RolloutStarted"  # a rollout over the stable revision starts
STEP_COMPLETED = "StepCompleted"  # a canary step completed
ROLLOUT_PROMOTING = "RolloutPromoting"  # the canary scales to full replicas before it becomes stable
RECONCILE_FAILED = "ReconcileFailed"  # a pass raised (the API server refused, or a bug): the Event says what
REVISION_SERVED = "RevisionServed"  # a revision's first pod became Ready: its time to serve, phase by phase
IN_PLACE_ROLLED_BACK = "InPlaceRolledBack"  # every pod serves the old models again after an in-place abort
NEW_PODS_REQUIRED = "NewPodsRequired"  # modelUpdates is InPlace, but this change needs new pods (reasons)

# ----------------------------------------------------------------- Kubernetes' own (read, never written)

DEPLOYMENT_PROGRESSING = "Progressing"  # a Deployment's condition type
DEPLOYMENT_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"  # its reason once progressDeadlineSeconds passed
POD_READY = "Ready"  # a pod's condition type: all its containers are ready
POD_SCHEDULED = "PodScheduled"  # a pod's condition type: placed on a node
POD_UNSCHEDULABLE = "Unschedulable"  # PodScheduled's reason while the scheduler cannot place the pod
CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"  # a container's waiting reason after repeated crashes

MAX_MESSAGE = 1024


# ----------------------------------------------------------------- one condition


def _order(condition_type: str) -> tuple[int, str]:
    if condition_type in CONDITION_TYPES:
        return CONDITION_TYPES.index(condition_type), ""
    return len(CONDITION_TYPES), condition_type


def find_condition(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == condition_type:
            return condition
    return None


def set_condition(  # noqa: PLR0917 (the Kubernetes helper's shape)
    conditions: Sequence[Mapping[str, Any]],
    condition_type: str,
    status: str,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """A new list with ``condition_type`` set; lastTransitionTime changes only when status flips.

    Conditions come out in a fixed order (known types first) so equal states compare equal.
    """
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    previous = find_condition(conditions, condition_type)
    transition = now
    if previous is not None and previous.get("status") == status and previous.get("lastTransitionTime"):
        transition = str(previous["lastTransitionTime"])
    updated: dict[str, Any] = {
        "type": condition_type,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        updated["observedGeneration"] = generation
    others = [dict(c) for c in conditions if c.get("type") != condition_type]
    return sorted([*others, updated], key=lambda c: _order(str(c.get("type"))))


def drop_condition(conditions: Sequence[Mapping[str, Any]], condition_type: str) -> list[dict[str, Any]]:
    """A new list without ``condition_type``."""
    return [dict(c) for c in conditions if c.get("type") != condition_type]


# ----------------------------------------------------------------- a verdict


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One condition's status, reason and message."""

    status: str
    reason: str
    message: str

"""The engine's input and its plan: everything plan_rollout reads, and what the reconcile then does."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from triton_operator.core.objects.traffic import TrafficWeights
from triton_operator.core.rollout.canary_analysis import AnalysisResult
from triton_operator.core.rollout.hostpods import HostPod, InPlaceRequests, InPlaceState
from triton_operator.core.rollout.requests import ControlRequest
from triton_operator.core.rollout.rollout_kind import RolloutKind
from triton_operator.core.rollout.state import RevisionState, RolloutStatus
from triton_operator.core.vocabulary.conditions import Verdict
from triton_operator.models import AnalysisRunRecord, Rollout, SetHeaderRoute


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
    tuning_pods: int = 0
    """Pods of the service's tuning sweeps (`kubectl triton tune`, core.tuning.held_pods): they count
    against spec.rollout.gpuBudget as another revision's pods do."""
    in_place: InPlaceMode | None = None
    """The in-place mode's inputs (core.decision.inplace_plan describes them; None: no in-place mode):
    the engine may move the host pods' models instead of rolling out new pods."""


# ----------------------------------------------------------------- outputs


@dataclasses.dataclass(frozen=True)
class RolloutEvent:
    type: str
    """Normal or Warning."""
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class InPlaceInput:
    rollout: Rollout
    state: InPlaceState
    """The state to carry on (a new update: next set, step_index None)."""
    models: tuple[str, ...]
    """The models whose readiness gates a pod: those the update reloads or adds."""
    pods: Sequence[HostPod]
    now: datetime
    deadline_seconds: int
    paused: bool = False
    """spec.rollout.paused or a pause request."""
    requests: InPlaceRequests = dataclasses.field(default_factory=InPlaceRequests)
    configmap_stable: str | None = None
    """state.json's stable as the observed ConfigMap holds it (None: no ConfigMap)."""
    describe: str = ""
    """What the update does, in words (core.rollout.rollout_kind.describe)."""
    replaced_by: str | None = None
    """A newer spec asks for this revision: the update in progress goes back first."""
    analysis: AnalysisResult | None = None
    """The analysis verdict of the current step's window (reconcile.analysis judges the pods of
    ``analysis_sides``); taken only when it is of this state's sides."""


@dataclasses.dataclass(frozen=True)
class InPlacePlan:
    state: InPlaceState | None
    """status.inPlace from now (None: the pods serve their own revision and nothing is in place)."""
    annotations: Mapping[str, str | None]
    """Pod name -> the annotation to write (None: remove it); only the pods whose annotation changes."""
    configmap: tuple[str, str | None] | None
    """(stable, next) of the ConfigMap's state.json; None: no ConfigMap wanted."""
    progressing: Verdict
    degraded: Verdict
    events: tuple[RolloutEvent, ...]
    requeue_after: float | None
    in_flight: bool
    """An update or its rollback runs (the pods' revision is moving)."""
    analysis_runs: tuple[AnalysisRunRecord, ...] = ()
    """The analyses that decided something in this call (status.analysisRuns, as a canary's)."""
    pause: bool = False
    """An inconclusive analysis pauses the rollout (onInconclusive: Pause): status.pausedByUser."""
    before: InPlaceState | None = None
    """The state this call moved from: the update as the engine chose it (InPlaceInput.state)."""


@dataclasses.dataclass(frozen=True)
class InPlaceMode:
    """The in-place mode's inputs (core.decision.inplace_plan describes them from what a pass read): the
    host revision whose pods stay, the update status.inPlace carries on, and how those pods would load
    each revision the engine may ask them for. The engine takes the control requests for it (promote,
    promote-full, abort, retry, an undo it can load in place), chooses what the pods are to serve, and
    its in-place step mover (core.rollout.inplace) moves them."""

    host: str
    """The stable revision: its Deployment and Services stay; what its pods serve moves."""
    state: InPlaceState | None = None
    """status.inPlace as read, when it is this host's (None: its pods serve their own revision)."""
    opted_in: bool = False
    """spec.rollout.modelUpdates: InPlace."""
    change: RolloutKind | None = None
    """How the pods would go from what they serve to the spec's revision, its parts from the spec
    (core.rollout.rollout_kind, NewPods where the files do not fit or too few pods serve; None when
    no change can start: they serve it, or an update is in progress)."""
    earlier: Mapping[str, RolloutKind | None] = dataclasses.field(default_factory=dict)
    """The same for an earlier revision an undo (or its pin) goes back to, its parts from its own
    ConfigMaps (None: they are gone)."""
    models: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """By revision the pods may load: the models whose readiness gates a pod (those it reloads or adds)."""
    pods: Sequence[HostPod] = ()
    """The host revision's pods."""
    configmap_stable: str | None = None
    """state.json's stable as the observed `<deployment>-inplace` ConfigMap holds it (None: none)."""
    described: str = ""
    """status.rolloutKindReason as read: what the update in progress does, in words."""
    analysis: AnalysisResult | None = None
    """The analysis verdict of the in-place step's window (reconcile.analysis), if one was judged."""


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
    in_place: InPlacePlan | None = None
    """The host pods' update as the in-place mode moved it (None: no in-place update runs)."""
    engine_revision: str | None = None
    """The revision the Deployments roll toward: the spec's, or the host's while its pods' models move
    in place (plan_rollout always says)."""
    kind: tuple[str, str] | None = None
    """(InPlace | NewPods, why) of the change in progress (status.rolloutKind, rolloutKindReason);
    None keeps the last."""

    def condition(self, condition_type: str) -> Verdict | None:
        return self.conditions.get(condition_type)


# ----------------------------------------------------------------- pure maths

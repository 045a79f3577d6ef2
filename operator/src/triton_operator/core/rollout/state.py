"""The rollout's state: what is observed of a revision, and the status fields the engine reads and writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.models import AnalysisRunRecord, RevisionRecord, Rollout, Strategy, TritonServiceStatus


def revision_ready(replicas: int, *, observed: bool, spec_replicas: int, ready_replicas: int) -> bool:
    """The one readiness rule of a revision, for the rollout (a step, a promotion, the flip) and the
    status's Ready alike: the Deployment controller has seen its spec (observedGeneration), it is
    scaled to ``replicas``, and that many of its pods are Ready."""
    return observed and spec_replicas == replicas and ready_replicas >= replicas


@dataclasses.dataclass(frozen=True)
class RevisionState:
    """What is observed of one revision's Deployment and pods (core.observed.observation.revision_state reads
    it)."""

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
    sync_failure: str | None = None
    """The sync init container's own words on why it failed in a pod of the revision, if it did."""

    def ready_at(self, replicas: int) -> bool:
        """Scaled to ``replicas`` as the Deployment controller saw it, with that many pods Ready."""
        return revision_ready(
            replicas,
            observed=self.observed,
            spec_replicas=self.spec_replicas,
            ready_replicas=self.ready_replicas,
        )

    @property
    def gpu_pods(self) -> int:
        """Pods that hold (or are about to hold) GPUs: asked for, running or still terminating."""
        return max(self.spec_replicas, self.replicas, self.pods or 0)

    @property
    def existing_pods(self) -> int:
        return self.replicas if self.pods is None else self.pods


@dataclasses.dataclass(frozen=True)
class HistoryEntry:
    """An earlier stable revision kept (at 0 replicas) for an exact undo; created: when it became stable."""

    revision: str
    created: str | None = None
    in_place_host: str | None = None
    """Served in place in the pods of this revision (core.decision.inplace_plan): no Deployment of its own."""

    def record(self) -> RevisionRecord:
        """status.history's entry (created and inPlaceHost left out when unknown)."""
        fields: dict[str, Any] = {"revision": self.revision}
        if self.created:
            fields["created"] = self.created
        if self.in_place_host:
            fields["in_place_host"] = self.in_place_host
        return RevisionRecord(**fields)


def analysis_run(raw: Mapping[str, Any]) -> AnalysisRunRecord | None:
    """One entry of status.analysisRuns as it was written; None when it cannot be read."""
    try:
        return AnalysisRunRecord(
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
    analysis_runs: tuple[AnalysisRunRecord, ...] = ()
    """Windows' analyses that decided something (status.analysisRuns: models.ANALYSIS_RUNS_KEPT at most)."""

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
            HistoryEntry(
                revision=str(h["revision"]),
                created=h.get("created"),
                in_place_host=str(h["inPlaceHost"]) if h.get("inPlaceHost") else None,
            )
            for h in s.get("history") or []
            if isinstance(h, Mapping) and h.get("revision")
        )
        runs = tuple(
            run
            for raw in s.get("analysisRuns") or []
            if isinstance(raw, Mapping) and (run := analysis_run(raw)) is not None
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

        return TritonServiceStatus(
            stable_revision=self.stable_revision,
            stable_since=t(self.stable_since),
            canary_revision=self.canary_revision,
            canary_weight=self.canary_weight,
            current_step_index=self.current_step_index,
            step_started_at=t(self.step_started_at),
            canary_started_at=t(self.canary_started_at),
            waiting_since=t(self.waiting_since),
            promoting=self.promoting,
            aborted_revision=self.aborted_revision,
            aborted_reason=self.aborted_reason,
            aborted_step_index=self.aborted_step_index,
            aborted_detail=self.aborted_detail,
            paused_by_user=self.paused_by_user,
            pinned_revision=self.pinned_revision,
            pinned_for=self.pinned_for,
            replaced_revision=self.replaced_revision,
            handled_requests=dict(self.handled_requests),
            history=[h.record() for h in self.history],
            analysis_runs=list(self.analysis_runs),
        ).model_dump(by_alias=True, exclude_unset=True, mode="json")


def paused(rollout: Rollout, status: RolloutStatus) -> bool:
    """The rollout is paused (spec.rollout.paused, or a pause request or an inconclusive analysis:
    status.pausedByUser): the one pause rule of both step movers."""
    return rollout.paused or status.paused_by_user


def under_analysis(rollout: Rollout, status: RolloutStatus) -> bool:
    """Whether the canary is judged now: analysis set, Canary strategy, and it holds traffic."""
    return (
        rollout.analysis is not None
        and rollout.strategy == Strategy.CANARY
        and status.canary_revision is not None
        and (status.canary_weight or 0) > 0
    )

"""The rollout's state: what is observed of a revision, and the status fields the engine reads and writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from triton_operator.core.rollout.clock import format_time, parse_time
from triton_operator.models import Rollout, Strategy


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
    sync_failure: str | None = None
    """The sync init container's own words on why it failed in a pod of the revision, if it did."""

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


def under_analysis(rollout: Rollout, status: RolloutStatus) -> bool:
    """Whether the canary is judged now: analysis set, Canary strategy, and it holds traffic."""
    return (
        rollout.analysis is not None
        and rollout.strategy == Strategy.CANARY
        and status.canary_revision is not None
        and (status.canary_weight or 0) > 0
    )

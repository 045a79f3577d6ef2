"""The analysis gate every step mover shares: whether a verdict lets a step give the new revision more."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal

from triton_operator.core.rollout.canary_analysis import INCONCLUSIVE, PASSED, AnalysisResult
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.plan import RolloutEvent
from triton_operator.core.vocabulary.conditions import ANALYSIS_INCONCLUSIVE, ANALYSIS_PASSED, NORMAL, WARNING
from triton_operator.models import Analysis, AnalysisRunRecord, Inconclusive

Outcome = Literal["pass", "wait", "abort"]


@dataclasses.dataclass(frozen=True)
class Gate:
    """What the analysis says of a step that would give the new revision more (traffic or pods)."""

    outcome: Outcome
    """pass: go on; wait: hold the step; abort: roll back (inconclusive too long, onInconclusive Abort)."""
    waiting: str | None = None
    """Why the step waits (the Progressing message), when it does."""
    record: str | None = None
    """The verdict to keep in status.analysisRuns ("" : the result's own); None: nothing is kept."""
    event: RolloutEvent | None = None
    pause: bool = False
    """onInconclusive Pause: the rollout pauses (status.pausedByUser)."""


def analysis_gate(
    spec: Analysis, result: AnalysisResult | None, *, first: str, in_place: bool, paused: bool
) -> Gate:
    """The gate of a step (canary traffic or in-place pods alike): ``result`` is the verdict of the
    current window (None: no reading yet, the step waits with ``first``); ``in_place`` names the mode
    in the Event texts; ``paused``: the rollout is paused already (onInconclusive Pause pauses once)."""
    if result is None:
        return Gate("wait", waiting=first)
    about = f"revision {result.revision}{' in place' if in_place else ''}"
    if result.verdict == PASSED:
        passed = RolloutEvent(NORMAL, ANALYSIS_PASSED, f"{about}: {result.message}")
        return Gate("pass", record="", event=passed)
    if result.verdict == INCONCLUSIVE and result.window_seconds >= spec.inconclusive_after_seconds:
        if spec.on_inconclusive == Inconclusive.ABORT:
            return Gate("abort", waiting=result.message, record="")
        if spec.on_inconclusive == Inconclusive.PAUSE and not paused:
            message = (
                f"{about}: {result.message}; rollout paused "
                "(kubectl triton resume to wait on, promote to go on without it, abort to roll back)"
            )
            event = RolloutEvent(WARNING, ANALYSIS_INCONCLUSIVE, message)
            return Gate("wait", waiting=result.message, record="Paused", event=event, pause=True)
    return Gate("wait", waiting=result.message)


def analysis_record(
    result: AnalysisResult, step_index: int, now: datetime, verdict: str | None = None
) -> AnalysisRunRecord:
    """status.analysisRuns' entry for a verdict that decided something at ``step_index``."""
    return AnalysisRunRecord(
        revision=result.revision,
        step_index=step_index,
        weight=result.weight,
        verdict=verdict or result.verdict,
        message=result.message,
        at=format_time(now),
    )

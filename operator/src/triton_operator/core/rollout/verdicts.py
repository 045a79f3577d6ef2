"""The canary analysis in the engine: whether it judges now, and how a verdict lets a step raise traffic."""

from __future__ import annotations

from typing import Literal

from triton_operator.core.rollout.canary_analysis import INCONCLUSIVE, PASSED, AnalysisResult
from triton_operator.core.rollout.clock import format_time
from triton_operator.core.rollout.state import under_analysis
from triton_operator.core.rollout.working import Call
from triton_operator.core.vocabulary.conditions import ANALYSIS_INCONCLUSIVE, ANALYSIS_PASSED, WARNING
from triton_operator.models import ANALYSIS_RUNS_KEPT, AnalysisRunRecord, Inconclusive


class Verdicts(Call):
    """The analysis verdicts of the canary's current weight, as they gate the steps."""

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
        run = AnalysisRunRecord(
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

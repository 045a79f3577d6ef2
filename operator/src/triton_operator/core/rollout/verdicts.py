"""The canary analysis in the engine: whether it judges now, and how a verdict lets a step raise traffic."""

from __future__ import annotations

from triton_operator.core.analysis import AnalysisResult
from triton_operator.core.rollout.gate import Outcome, analysis_gate, analysis_record
from triton_operator.core.rollout.state import under_analysis
from triton_operator.core.rollout.working import Call
from triton_operator.models import ANALYSIS_RUNS_KEPT


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
        run = analysis_record(result, self.position(), self.now, verdict)
        self.set(analysis_runs=(*self.st.analysis_runs, run)[-ANALYSIS_RUNS_KEPT:])

    def analysis_gate(self, new_weight: int) -> Outcome:
        """Whether a step may raise the canary's traffic to ``new_weight`` (rollout.gate)."""
        spec = self.inp.rollout.analysis
        if spec is None or not self.analysis_active() or new_weight <= (self.st.canary_weight or 0):
            return "pass"
        first = f"waiting for the first reading of the canary's metrics at weight {self.st.canary_weight}"
        result = self.current_analysis()
        gate = analysis_gate(spec, result, first=first, in_place=False, paused=self.st.paused_by_user)
        if gate.outcome != "pass":
            self.waiting_on_analysis = gate.waiting
        if gate.record is not None and result is not None:
            self.record(result, gate.record or None)
        if gate.pause:
            self.set(paused_by_user=True)
        if gate.event is not None:
            self.events.append(gate.event)
        return gate.outcome

"""The canary analysis in the engine: whether it judges now, and how a verdict lets a step raise traffic."""

from __future__ import annotations

from triton_operator.core.rollout.canary_analysis import AnalysisResult
from triton_operator.core.rollout.gate import Outcome, analysis_gate, analysis_record
from triton_operator.core.rollout.state import under_analysis
from triton_operator.core.rollout.working import Call
from triton_operator.models import ANALYSIS_RUNS_KEPT

# ------------------------------------------------------------- analysis


def analysis_active(c: Call) -> bool:
    return under_analysis(c.inp.rollout, c.st)


def current_analysis(c: Call) -> AnalysisResult | None:
    """The verdict of the current weight's window, when the reconcile read one for this canary."""
    result = c.inp.analysis
    if (
        result is None
        or result.revision != c.st.canary_revision
        or result.weight != (c.st.canary_weight or 0)
    ):
        return None
    return result


def record(c: Call, result: AnalysisResult, verdict: str | None = None) -> None:
    run = analysis_record(result, c.position(), c.now, verdict)
    c.set(analysis_runs=(*c.st.analysis_runs, run)[-ANALYSIS_RUNS_KEPT:])


def gate_step(c: Call, new_weight: int) -> Outcome:
    """Whether a step may raise the canary's traffic to ``new_weight`` (rollout.gate)."""
    spec = c.inp.rollout.analysis
    if spec is None or not analysis_active(c) or new_weight <= (c.st.canary_weight or 0):
        return "pass"
    first = f"waiting for the first reading of the canary's metrics at weight {c.st.canary_weight}"
    result = current_analysis(c)
    gate = analysis_gate(spec, result, first=first, in_place=False, paused=c.st.paused_by_user)
    if gate.outcome != "pass":
        c.waiting_on_analysis = gate.waiting
    if gate.record is not None and result is not None:
        record(c, result, gate.record or None)
    if gate.pause:
        c.set(paused_by_user=True)
    if gate.event is not None:
        c.events.append(gate.event)
    return gate.outcome

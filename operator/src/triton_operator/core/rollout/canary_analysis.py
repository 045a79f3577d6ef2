"""Pure canary analysis: Triton's per-model counters in, increases over a window and a verdict out."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from triton_operator.models import Analysis, LatencyMetric, ModelFigures

# =====================================================================================================
# How a canary is judged (after Argo Rollouts' analysis and Flagger's canary checks, on Triton's
# own numbers: no Prometheus)
# =====================================================================================================
#
# Every tritonserver counts, per model and version, on its metrics port (:8002/metrics):
#   nv_inference_request_success        requests that succeeded
#   nv_inference_request_failure        requests that failed (labelled by reason: summed)
#   nv_inference_request_duration_us    cumulative end-to-end time of the successful requests
#   nv_inference_queue_duration_us      ... of it spent queued
#   nv_inference_compute_infer_duration_us  ... of it spent in the model's execute
# They are counters: they only grow, and start again at 0 when tritonserver restarts.
#
# A window is the time the canary holds one traffic weight. At its first reading the operator keeps
# each pod's counters (the baseline); every later reading gives the increase since then, per pod,
# summed over the pods of one side (canary or stable) and over a model's versions:
#     increase = now - baseline            when now >= baseline
#              = now                        when now < baseline (a reset: the pod restarted)
#     a pod not in the baseline (started in the window) counts from 0.
# This is Prometheus' increase() over the window, without extrapolation.
#
# Per model, from the canary's increases (Δ):
#     requests     = Δsuccess + Δfailure
#     successRatio = Δsuccess / requests
#     latency      = Δduration / Δsuccess   (microseconds per successful request; Triton adds the
#                                             durations of successful requests only)
# and the same latency of the stable in the same window. A model's verdict:
#     Inconclusive  requests < minRequests                (nothing else is judged on it)
#     Failed        successRatio < minSuccessRatio
#                   or latency > maxLatencyMicroseconds (when set)
#                   or latency > maxLatencyRatio x stable latency (when set, and the stable had
#                      minRequests in the window too)
#     Inconclusive  maxLatencyRatio set, the stable takes traffic (weight < 100) but had fewer than
#                   minRequests in the window: the relative check cannot be made yet, and a canary
#                   is never passed on a check that was skipped. (With a 50/50 split, the canary
#                   can reach minRequests a moment before the stable does: the window then runs on.)
#                   At weight 100 the stable takes no traffic: only the other checks apply.
#     Passed        otherwise
# The canary's verdict: Failed when any judged model failed (a failure is never hidden by too
# little traffic elsewhere), else Inconclusive when any judged model is, or when a canary pod's
# metrics are missing (not read yet, or its last read failed: no answer in time, an answer too
# large, not Prometheus text; adapters.triton_reader bounds every read), else Passed. A canary is
# never passed on a pod whose counters were not seen: its failures would be hidden. Missing readings
# are one more Inconclusive, so they follow rollout.analysis.onInconclusive once the window has run
# inconclusiveAfterSeconds (the window starts when the weight is judged first, reading or not):
# a pod that never answers ends in a pause or an abort, never in an endless wait.
# Worked examples are in `judge`'s docstring.

AnalysisVerdict = Literal["Passed", "Failed", "Inconclusive"]
PASSED: AnalysisVerdict = "Passed"
FAILED: AnalysisVerdict = "Failed"
INCONCLUSIVE: AnalysisVerdict = "Inconclusive"
MISSING_SHOWN = 3
"""How many pods with missing metrics a verdict's message names (then: "and N more")."""


@dataclasses.dataclass(frozen=True)
class Counters:
    """Triton's counters of one model (all versions summed) on one pod, or their increases."""

    success: float = 0.0
    failure: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0

    @property
    def requests(self) -> float:
        return self.success + self.failure

    def latency_us(self, metric: LatencyMetric) -> float | None:
        """Average microseconds per successful request; None without a successful request."""
        if self.success <= 0:
            return None
        total = {
            LatencyMetric.REQUEST: self.request_us,
            LatencyMetric.QUEUE: self.queue_us,
            LatencyMetric.COMPUTE: self.compute_us,
        }[metric]
        return total / self.success

    def __add__(self, other: Counters) -> Counters:
        return Counters(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))

    def increase_since(self, baseline: Counters | None) -> Counters:
        """Each counter's increase since ``baseline``; a counter that went down was reset (restart)."""
        if baseline is None:
            return self
        pairs = zip(_values(self), _values(baseline), strict=True)
        return Counters(*(now - then if now >= then else now for now, then in pairs))


def _values(c: Counters) -> tuple[float, ...]:
    return (c.success, c.failure, c.request_us, c.queue_us, c.compute_us)


PodCounters = Mapping[str, Counters]
"""A pod's counters by model name."""


def increase(baseline: Mapping[str, PodCounters], current: Mapping[str, PodCounters]) -> dict[str, Counters]:
    """Per model, the increase of the counters since ``baseline``, summed over the pods of ``current``.

    Both map a pod's key (its uid and restart count) to its counters by model. A pod in
    ``current`` but not in ``baseline`` counts from 0; a pod gone since the baseline counts no more.

    >>> base = {"p1": {"m": Counters(success=100, request_us=1000)}}
    >>> now = {"p1": {"m": Counters(success=150, request_us=1600)}, "p2": {"m": Counters(success=10)}}
    >>> increase(base, now)["m"]
    Counters(success=60.0, failure=0.0, request_us=600.0, queue_us=0.0, compute_us=0.0)
    >>> increase(base, {"p1": {"m": Counters(success=7)}})["m"].success  # p1 restarted: 7 since then
    7.0
    """
    out: dict[str, Counters] = {}
    for pod, models in current.items():
        before = baseline.get(pod, {})
        for model, counters in models.items():
            out[model] = out.get(model, Counters()) + counters.increase_since(before.get(model))
    return out


@dataclasses.dataclass(frozen=True)
class ModelResult:
    """One model's figures and verdict in one window."""

    model: str
    verdict: AnalysisVerdict
    requests: int
    success_ratio: float | None
    latency_us: float | None
    stable_requests: int
    stable_latency_us: float | None
    reason: str
    """Why (figures against thresholds), in a few words."""

    def to_status(self) -> ModelFigures:
        """The figures as status.analysis.models lists them (unset figures left out)."""
        return ModelFigures(
            name=self.model,
            verdict=self.verdict,
            requests=self.requests,
            stable_requests=self.stable_requests,
            success_ratio=None if self.success_ratio is None else f"{self.success_ratio:.4f}",
            latency_microseconds=None if self.latency_us is None else round(self.latency_us),
            stable_latency_microseconds=None
            if self.stable_latency_us is None
            else round(self.stable_latency_us),
            reason=self.reason,
        )


@dataclasses.dataclass(frozen=True)
class AnalysisResult:
    """The canary's verdict in its current window, and each judged model's figures."""

    revision: str
    """The canary revision judged."""
    weight: int
    """The canary traffic weight of the window."""
    verdict: AnalysisVerdict
    window_seconds: float
    """How long the window has run (since the weight was first judged)."""
    models: tuple[ModelResult, ...] = ()
    missing: tuple[str, ...] = ()
    """The canary pods whose metrics are missing, each as "name (why)"."""

    @property
    def message(self) -> str:
        """The verdict with the figures that decided it."""
        if self.verdict == FAILED:
            shown = [m for m in self.models if m.verdict == FAILED]
        elif self.verdict == INCONCLUSIVE:
            shown = [m for m in self.models if m.verdict == INCONCLUSIVE]
        else:
            shown = list(self.models)
        parts = [f"{m.model}: {m.reason}" for m in shown]
        if self.missing and self.verdict == INCONCLUSIVE:
            named = ", ".join(self.missing[:MISSING_SHOWN])
            left = len(self.missing) - MISSING_SHOWN
            more = f" and {left} more" if left > 0 else ""
            parts.insert(0, f"metrics missing from {len(self.missing)} canary pod(s): {named}{more}")
        when = f"after {self.window_seconds:.0f}s at weight {self.weight}"
        return f"analysis {self.verdict.lower()} {when}: {'; '.join(parts)}"


def _fmt_us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}us"


def judge_model(
    spec: Analysis, model: str, canary: Counters | None, stable: Counters | None, *, weight: int = 0
) -> ModelResult:
    """One model's verdict from the canary's and the stable's increases in the window, at the
    canary's traffic ``weight`` (at 100 the stable takes no traffic: no relative latency check)."""
    canary = canary or Counters()
    stable = stable or Counters()
    requests = int(canary.requests)
    stable_requests = int(stable.requests)
    latency = canary.latency_us(spec.latency_metric)
    stable_latency = stable.latency_us(spec.latency_metric)
    ratio = canary.success / canary.requests if canary.requests > 0 else None

    def figures(verdict: AnalysisVerdict, reason: str) -> ModelResult:
        return ModelResult(model, verdict, requests, ratio, latency, stable_requests, stable_latency, reason)

    if requests < spec.min_requests:
        return figures(INCONCLUSIVE, f"{requests} of {spec.min_requests} requests needed")
    assert ratio is not None
    seen = f"success ratio {ratio:.4f} over {requests} requests"
    if ratio < spec.min_success_ratio:
        return figures(FAILED, f"{seen} < {spec.min_success_ratio:g}")
    what = f"{spec.latency_metric.value} latency {_fmt_us(latency)}"
    limit = spec.max_latency_microseconds
    if latency is not None and limit is not None and latency > limit:
        return figures(FAILED, f"{what} > {limit}us")
    compared = ""
    ratio_limit = spec.max_latency_ratio
    if ratio_limit is not None and latency is not None and weight < 100:  # at 100 the stable takes no traffic
        if stable_requests < spec.min_requests:
            needed = f"stable: {stable_requests} of {spec.min_requests} requests needed to compare latency"
            return figures(INCONCLUSIVE, f"{seen}; {needed}")
        if stable_latency is not None and stable_latency > 0:
            times = latency / stable_latency
            compared = f" = {times:.2f} x stable {_fmt_us(stable_latency)}"
            if times > ratio_limit:
                return figures(FAILED, f"{what}{compared} > {ratio_limit:g} x")
    return figures(PASSED, f"{seen}, {what}{compared}")


def judge(
    spec: Analysis,
    models: Sequence[str],
    canary: Mapping[str, Counters],
    stable: Mapping[str, Counters],
    *,
    revision: str,
    weight: int,
    window_seconds: float,
    missing: Sequence[str] = (),
) -> AnalysisResult:
    """The canary's verdict over its window (see the notes at the top of this module).

    ``models``: the models judged (spec.rollout.analysis.models, else every model of the spec);
    ``canary``/``stable``: each side's increases in the window, by model (`increase`);
    ``missing``: the canary pods whose metrics are missing ("name (why)"): no pass while there is one.

    Worked examples, with minRequests 50, minSuccessRatio 0.99, maxLatencyRatio 1.5:

    >>> spec = Analysis(min_requests=50)
    >>> ok = Counters(success=100, request_us=100 * 2000)          # 2 ms a request
    >>> judge(spec, ["m"], {"m": ok}, {"m": ok}, revision="r", weight=10, window_seconds=30).verdict
    'Passed'

    30 failures in 100 requests: 0.70 < 0.99.

    >>> flaky = Counters(success=70, failure=30, request_us=70 * 2000)
    >>> r = judge(spec, ["m"], {"m": flaky}, {"m": ok}, revision="r", weight=10, window_seconds=30)
    >>> r.verdict, r.models[0].reason
    ('Failed', 'success ratio 0.7000 over 100 requests < 0.99')

    Three times the stable's latency: 6000 / 2000 = 3.00 > 1.5.

    >>> slow = Counters(success=100, request_us=100 * 6000)
    >>> r = judge(spec, ["m"], {"m": slow}, {"m": ok}, revision="r", weight=10, window_seconds=30)
    >>> r.verdict, r.models[0].reason
    ('Failed', 'request latency 6000us = 3.00 x stable 2000us > 1.5 x')

    Too few requests (a failure elsewhere would still fail the canary):

    >>> few = Counters(success=20, request_us=20 * 2000)
    >>> judge(spec, ["m"], {"m": few}, {"m": ok}, revision="r", weight=10, window_seconds=30).verdict
    'Inconclusive'

    The canary had enough, the stable not yet: its latency cannot be compared, so no pass.

    >>> r = judge(spec, ["m"], {"m": ok}, {"m": few}, revision="r", weight=50, window_seconds=30)
    >>> r.verdict
    'Inconclusive'
    >>> r.models[0].reason.split("; ")[1]
    'stable: 20 of 50 requests needed to compare latency'
    >>> judge(spec, ["m", "n"], {"m": few, "n": flaky}, {}, revision="r", weight=10,
    ...       window_seconds=30).verdict
    'Failed'

    Enough passing traffic, but one canary pod's metrics could not be read: no pass.

    >>> r = judge(spec, ["m"], {"m": ok}, {"m": ok}, revision="r", weight=10, window_seconds=30,
    ...           missing=["svc-b-1 (metrics: no complete answer within 2s)"])
    >>> r.verdict
    'Inconclusive'
    >>> r.message.split(": ", 1)[1]
    'metrics missing from 1 canary pod(s): svc-b-1 (metrics: no complete answer within 2s)'
    """
    figures = tuple(judge_model(spec, m, canary.get(m), stable.get(m), weight=weight) for m in models)
    verdicts = {f.verdict for f in figures}
    if FAILED in verdicts:
        verdict = FAILED
    elif INCONCLUSIVE in verdicts or not figures or missing:
        verdict = INCONCLUSIVE
    else:
        verdict = PASSED
    return AnalysisResult(revision, weight, verdict, window_seconds, figures, tuple(missing))


def judged_models(spec: Analysis, model_names: Iterable[str]) -> list[str]:
    """The models a verdict covers: spec.rollout.analysis.models, else every model of the spec."""
    return list(spec.models) if spec.models else list(model_names)

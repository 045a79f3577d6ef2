"""Canary analysis: the pure maths (core.rollout.canary_analysis), Triton's state
(core.vocabulary.triton_state), how the rollout engine acts on a verdict (core.rollout), and the windows over
the pods' readings (reconcile.analysis), missing ones included."""

from __future__ import annotations

import dataclasses
import doctest
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from triton_operator.adapters.triton_reader import Owner, PodReading, PodTarget, TritonReader
from triton_operator.core.observed.observation import PodState
from triton_operator.core.rollout import canary_analysis as analysis
from triton_operator.core.rollout.canary_analysis import (
    FAILED,
    INCONCLUSIVE,
    PASSED,
    AnalysisResult,
    Counters,
    increase,
    judge,
)
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.state import RevisionState, RolloutStatus
from triton_operator.core.spec.validation.spec import check_spec
from triton_operator.core.vocabulary import triton_state
from triton_operator.core.vocabulary.triton_state import ModelVersionState, load_failures, merge, parse_index
from triton_operator.models import Analysis, LatencyMetric, Rollout, TritonService
from triton_operator.reconcile.analysis import TritonView

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
OK = Counters(success=100, request_us=100 * 2000, queue_us=100 * 100, compute_us=100 * 1500)


@pytest.mark.parametrize("module", [analysis, triton_state])
def test_the_worked_examples_in_the_docstrings_hold(module: Any) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------- maths


@pytest.mark.parametrize(
    ("baseline", "now", "expected"),
    [
        (10, 25, 15),  # an increase
        (10, 10, 0),  # no traffic
        (100, 7, 7),  # a reset (tritonserver restarted): what it counted since
        (None, 12, 12),  # a pod first seen in the window counts from 0
    ],
)
def test_increase_treats_counters_as_counters(baseline: float | None, now: float, expected: float) -> None:
    before = {} if baseline is None else {"pod": {"m": Counters(success=baseline)}}
    assert increase(before, {"pod": {"m": Counters(success=now)}})["m"].success == expected


def test_increase_sums_the_pods_of_a_side_and_forgets_pods_that_went() -> None:
    before = {"a": {"m": Counters(success=10)}, "gone": {"m": Counters(success=1000)}}
    now = {"a": {"m": Counters(success=30, failure=2)}, "b": {"m": Counters(success=5)}}
    assert increase(before, now)["m"] == Counters(success=25, failure=2)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [(LatencyMetric.REQUEST, 2000), (LatencyMetric.QUEUE, 100), (LatencyMetric.COMPUTE, 1500)],
)
def test_latency_is_the_chosen_duration_per_successful_request(
    metric: LatencyMetric, expected: float
) -> None:
    assert OK.latency_us(metric) == expected
    assert Counters(failure=5, request_us=10).latency_us(metric) is None


@pytest.mark.parametrize(
    ("spec", "canary", "stable", "verdict", "reason"),
    [
        (
            {},
            OK,
            OK,
            PASSED,
            "success ratio 1.0000 over 100 requests, request latency 2000us = 1.00 x stable",
        ),
        ({}, Counters(success=99, failure=1, request_us=99 * 2000), OK, PASSED, "success ratio 0.9900"),
        (
            {},
            Counters(success=98, failure=2, request_us=1),
            OK,
            FAILED,
            "success ratio 0.9800 over 100 requests < 0.99",
        ),
        (
            {},
            Counters(success=100, request_us=100 * 3001),
            OK,
            FAILED,
            "3001us = 1.50 x stable 2000us > 1.5 x",
        ),
        ({}, Counters(success=100, request_us=100 * 2999), OK, PASSED, "= 1.50 x stable"),
        # the stable had too few requests to compare with yet: no pass on a skipped check
        (
            {},
            Counters(success=100, request_us=100 * 9000),
            Counters(success=3, request_us=3),
            INCONCLUSIVE,
            "success ratio 1.0000 over 100 requests; stable: 3 of 50 requests needed to compare latency",
        ),
        ({}, OK, {}, INCONCLUSIVE, "stable: 0 of 50 requests needed"),
        # ... and without a relative check, the stable's traffic does not matter
        ({"maxLatencyRatio": None}, OK, Counters(success=3, request_us=3), PASSED, "request latency 2000us"),
        (
            {"maxLatencyMicroseconds": 5000},
            Counters(success=100, request_us=100 * 6000),
            {},
            FAILED,
            "> 5000us",
        ),
        ({"maxLatencyRatio": None}, Counters(success=100, request_us=100 * 9000), OK, PASSED, "9000us"),
        (
            {"latencyMetric": "queue", "maxLatencyRatio": 2},
            Counters(success=100, queue_us=100 * 300),
            OK,
            FAILED,
            "queue latency 300us = 3.00 x stable 100us > 2 x",
        ),
        ({"minRequests": 200}, OK, OK, INCONCLUSIVE, "100 of 200 requests needed"),
        ({}, Counters(), OK, INCONCLUSIVE, "0 of 50 requests needed"),
    ],
)
def test_judge_one_model(
    spec: dict[str, Any], canary: Counters, stable: Any, verdict: str, reason: str
) -> None:
    result = judge(
        Analysis.model_validate(spec),
        ["m"],
        {"m": canary},
        {"m": stable} if stable else {},
        revision="r",
        weight=20,
        window_seconds=42,
    )
    assert result.verdict == verdict
    assert reason in result.models[0].reason, result.models[0].reason
    assert result.message.startswith(f"analysis {verdict.lower()} after 42s at weight 20: m: ")


@pytest.mark.parametrize(("weight", "verdict"), [(99, INCONCLUSIVE), (100, PASSED)])
def test_at_full_weight_the_stable_takes_no_traffic_and_latency_is_not_compared(
    weight: int, verdict: str
) -> None:
    slow = Counters(success=100, request_us=100 * 9000)
    result = judge(Analysis(), ["m"], {"m": slow}, {}, revision="r", weight=weight, window_seconds=1)
    assert result.verdict == verdict, result.message
    # the absolute limit still applies at full weight
    capped = Analysis.model_validate({"maxLatencyMicroseconds": 5000})
    assert judge(capped, ["m"], {"m": slow}, {}, revision="r", weight=100, window_seconds=1).verdict == FAILED


def test_a_failure_is_never_hidden_by_too_little_traffic_elsewhere_and_no_model_is_skipped() -> None:
    spec = Analysis()
    flaky = Counters(success=50, failure=50)
    both = judge(spec, ["a", "b"], {"a": flaky}, {}, revision="r", weight=5, window_seconds=1)
    assert both.verdict == FAILED and [m.verdict for m in both.models] == [FAILED, INCONCLUSIVE]
    one_quiet = judge(spec, ["a", "b"], {"a": OK}, {"a": OK}, revision="r", weight=5, window_seconds=1)
    assert one_quiet.verdict == INCONCLUSIVE
    assert judge(spec, [], {}, {}, revision="r", weight=5, window_seconds=1).verdict == INCONCLUSIVE


# ----------------------------------------------------------------- Triton's state


def test_the_pods_views_of_a_revision_merge_to_the_worst_state() -> None:
    ready = parse_index(
        [{"name": "m", "version": "1", "state": "READY"}, {"name": "m", "version": "2", "state": "READY"}]
    )
    failed = parse_index([{"name": "m", "version": "2", "state": "UNAVAILABLE", "reason": "boom\\nAt: x"}])
    merged = merge([ready, failed])
    assert merged == {
        "m": [ModelVersionState("m", "1", "READY"), ModelVersionState("m", "2", "UNAVAILABLE", "boom")]
    }
    assert triton_state.describe_failures(triton_state.failed_versions(merged)) == "model 'm' version 2: boom"


def test_a_long_reason_is_cut_to_its_first_line_and_bounded() -> None:
    (state,) = load_failures("failed to load 'm' version 1: " + "x" * 1000 + "\\nAt: traceback")
    assert len(state.reason) == triton_state.REASON_MAX and state.reason.endswith("...")


def test_a_log_without_a_load_failure_names_none() -> None:
    assert load_failures("I1123 server.cc:305] Waiting for in-flight requests to complete.") == ()
    assert load_failures(None) == ()


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("rollout", "field", "words"),
    [
        ({"strategy": "BlueGreen", "analysis": {}}, "spec.rollout.analysis", "only the Canary strategy"),
        ({"analysis": {"models": ["nope"]}}, "spec.rollout.analysis.models[0]", "'nope' is not a model"),
    ],
)
def test_analysis_the_spec_cannot_run_is_refused_at_its_field(
    rollout: dict[str, Any], field: str, words: str
) -> None:
    spec = {
        "repository": {"uri": "s3://b/m"},
        "models": [{"name": "m", "config": {"backend": "python"}}],
        "rollout": rollout,
    }
    _, errors = check_spec(spec)
    assert [(e.field, words in e.message) for e in errors] == [(field, True)], errors


# ----------------------------------------------------------------- the engine acting on verdicts


def ready(n: int) -> RevisionState:
    return RevisionState(spec_replicas=n, replicas=n, ready_replicas=n, available_replicas=n, pods=n)


def at_weight(weight: int, **status: Any) -> RolloutStatus:
    """Canary B at weight ``weight`` after its one setWeight step (waiting for the promotion)."""
    return RolloutStatus(
        stable_revision="A",
        canary_revision="B",
        canary_weight=weight,
        current_step_index=1,
        step_started_at=T0,
        canary_started_at=T0,
        **status,
    )


def plan(
    status: RolloutStatus,
    result: AnalysisResult | None,
    *,
    steps: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> RolloutPlan:
    from triton_operator.core.rollout.requests import parse_control_requests  # noqa: PLC0415

    rollout = Rollout.model_validate(
        {
            "steps": steps if steps is not None else [{"setWeight": 50}],
            "analysis": {"intervalSeconds": 5, **spec},
        }
    )
    return plan_rollout(
        RolloutInput(
            rollout=rollout,
            replicas=2,
            desired_revision="B",
            now=T0 + timedelta(seconds=30),
            status=status,
            revisions={"A": ready(2), "B": ready(1)},
            requests=parse_control_requests(annotations),
            analysis=result,
        )
    )


def verdict(
    kind: analysis.AnalysisVerdict, weight: int = 50, window: float = 30, revision: str = "B"
) -> AnalysisResult:
    canary = {PASSED: OK, FAILED: Counters(success=70, failure=30), INCONCLUSIVE: Counters(success=3)}[kind]
    return judge(
        Analysis(), ["m"], {"m": canary}, {"m": OK}, revision=revision, weight=weight, window_seconds=window
    )


def test_the_promotion_waits_for_a_first_reading_and_says_so() -> None:
    p = plan(at_weight(50), None)
    assert not p.status.promoting and p.status.canary_revision == "B"
    progressing = p.condition("Progressing")
    assert progressing is not None and progressing.reason == "WaitingForAnalysis"
    assert "waiting for the first reading" in progressing.message
    assert p.requeue_after is not None and p.requeue_after <= 5


def test_a_passing_analysis_lets_the_traffic_rise_and_is_recorded() -> None:
    p = plan(at_weight(50), verdict(PASSED))
    assert p.status.promoting
    (run,) = p.status.analysis_runs
    assert (run.revision, run.weight, run.verdict, run.step_index) == ("B", 50, PASSED, 1)
    assert [e.reason for e in p.events] == ["AnalysisPassed", "RolloutPromoting"]


def test_a_verdict_of_another_weight_or_revision_is_not_this_windows() -> None:
    for stale in (verdict(PASSED, weight=10), verdict(PASSED, revision="C")):
        assert not plan(at_weight(50), stale).status.promoting


def test_a_failing_analysis_rolls_back_with_its_figures() -> None:
    p = plan(at_weight(50), verdict(FAILED))
    assert p.status.aborted_revision == "B" and p.status.aborted_reason == "AnalysisFailed"
    assert p.replicas == {"A": 2, "B": 0}
    degraded = p.condition("Degraded")
    assert degraded is not None and degraded.reason == "AnalysisFailed"
    assert "success ratio 0.7000 over 100 requests < 0.99" in degraded.message
    (event,) = [e for e in p.events if e.reason == "RolloutAborted"]
    assert event.type == "Warning" and "success ratio 0.7000" in event.message
    # the figures stay in the status after the canary is gone (a later pass, no verdict any more)
    later = plan(RolloutStatus.from_status(p.status.to_status()), None)
    held = later.condition("Degraded")
    assert held is not None and "success ratio 0.7000" in held.message


def test_a_failing_analysis_rolls_back_during_a_pause_step_too() -> None:
    status = at_weight(50)
    p = plan(status, verdict(FAILED), steps=[{"setWeight": 50}, {"pause": {}}])
    assert p.status.aborted_reason == "AnalysisFailed"


def test_before_the_canary_has_traffic_nothing_is_judged() -> None:
    status = RolloutStatus(
        stable_revision="A", canary_revision="B", canary_weight=0, current_step_index=0, step_started_at=T0
    )
    p = plan(status, verdict(FAILED, weight=0))
    assert p.status.aborted_revision is None and p.status.canary_weight == 50


@pytest.mark.parametrize(
    ("policy", "window", "aborted", "paused", "event"),
    [
        ("Pause", 299, False, False, None),  # not long enough yet
        ("Pause", 300, False, True, "AnalysisInconclusive"),
        ("Abort", 300, True, False, "RolloutAborted"),
        ("Wait", 10_000, False, False, None),
    ],
)
def test_too_little_traffic_follows_on_inconclusive(
    policy: str, window: float, aborted: bool, paused: bool, event: str | None
) -> None:
    p = plan(at_weight(50), verdict(INCONCLUSIVE, window=window), onInconclusive=policy)
    assert (p.status.aborted_revision == "B") is aborted
    assert p.status.paused_by_user is paused
    assert not p.status.promoting
    assert [e.reason for e in p.events if e.type == "Warning"] == ([event] if event else [])
    if aborted:
        assert p.status.aborted_reason == "AnalysisInconclusive"


def test_pause_is_the_safe_default_and_a_paused_rollout_is_not_paused_twice() -> None:
    assert Analysis().on_inconclusive.value == "Pause"
    first = plan(at_weight(50), verdict(INCONCLUSIVE, window=400))
    again = plan(RolloutStatus.from_status(first.status.to_status()), verdict(INCONCLUSIVE, window=500))
    assert again.status.paused_by_user and not again.events
    assert len(again.status.analysis_runs) == 1


def test_a_promote_request_goes_on_without_the_analysis() -> None:
    p = plan(at_weight(50), None, annotations={"triton-operator.io/promote-full": "2026-01-01T12:00:00Z"})
    assert p.status.promoting


def test_analysis_runs_are_bounded() -> None:
    status = at_weight(50)
    for _ in range(15):
        status = plan(status, verdict(INCONCLUSIVE, window=400), onInconclusive="Abort").status
        status = RolloutStatus.from_status(
            {
                **status.to_status(),
                "abortedRevision": None,
                "canaryRevision": "B",
                "canaryWeight": 50,
                "currentStepIndex": 1,
            }
        )
    assert len(status.analysis_runs) == 10


def test_a_promote_request_lifts_a_pause_made_by_an_inconclusive_analysis_and_promotes() -> None:
    paused = plan(at_weight(50), verdict(INCONCLUSIVE, window=400)).status
    assert paused.paused_by_user
    p = plan(paused, None, annotations={"triton-operator.io/promote": "2026-01-01T12:00:00Z"})
    assert p.status.promoting and not p.status.paused_by_user


# ----------------------------------------------------------------- missing readings (reconcile.analysis)


class Canned(TritonReader):
    """The operator's reader, its readings given by the test (nothing is read)."""

    def __init__(self, readings: dict[str, PodReading]) -> None:
        super().__init__()
        self.given = readings

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        pass

    def readings(self, owner: Owner) -> dict[str, PodReading]:
        return dict(self.given)


def analysed(**analysis: Any) -> TritonService:
    return TritonService.model_validate(
        {
            "metadata": {"name": "svc", "namespace": "ml"},
            "spec": {
                "repository": {"uri": "s3://b/m"},
                "models": [{"name": "m", "config": {"backend": "python"}}],
                "rollout": {"steps": [{"setWeight": 50}], "analysis": {"intervalSeconds": 5, **analysis}},
            },
        }
    )


def pod(name: str, revision: str) -> PodState:
    return PodState(name=name, revision=revision, ready=True, uid=f"uid-{name}", ip="10.0.0.1")


def reading(name: str, revision: str, counters: Counters | None) -> PodReading:
    return PodReading(
        f"uid-{name}",
        revision,
        0,
        read_at=0.0,
        index=(),
        counters=None if counters is None else {"m": counters},
    )


PODS = [pod("svc-a-0", "A"), pod("svc-b-0", "B"), pod("svc-b-1", "B")]


def judged_at(
    view: TritonView, ts: TritonService, status: RolloutStatus, seconds: float
) -> AnalysisResult | None:
    owner = ("ml", "svc")
    seen = view.read(owner, ts, status, "B", PODS, now=T0 + timedelta(seconds=seconds))
    view.keep(owner, seen)  # the pass carries it out: its window stands
    return seen.analysis


@pytest.mark.parametrize(
    ("policy", "aborted", "paused"), [("Abort", True, False), ("Pause", False, True), ("Wait", False, False)]
)
def test_canary_metrics_that_stay_missing_are_inconclusive_and_follow_on_inconclusive_past_the_limit(
    policy: str, aborted: bool, paused: bool
) -> None:
    """The canary's pods never answer in time (adapters.triton_reader leaves their readings
    missing): the window still runs, and past inconclusiveAfterSeconds onInconclusive applies,
    as for too little traffic; never an endless wait for a first reading."""
    ts = analysed(onInconclusive=policy)
    view = TritonView(
        Canned({"uid-svc-a-0": reading("svc-a-0", "A", OK), "uid-svc-b-1": reading("svc-b-1", "B", None)})
    )
    status = at_weight(50)
    first = judged_at(view, ts, status, 0)
    assert first is not None and first.verdict == INCONCLUSIVE
    early = plan(status, first, onInconclusive=policy)
    assert early.status.aborted_revision is None and not early.status.paused_by_user
    later = judged_at(view, ts, status, 300)
    assert later is not None and later.verdict == INCONCLUSIVE and later.window_seconds == 300
    p = plan(status, later, onInconclusive=policy)
    assert (p.status.aborted_revision == "B") is aborted
    assert p.status.paused_by_user is paused
    assert not p.status.promoting
    if aborted:
        assert p.status.aborted_reason == "AnalysisInconclusive"
    assert (
        "metrics missing from 2 canary pod(s): svc-b-0 (not read yet), svc-b-1 (not read yet)"
        in later.message
    )


def test_a_canary_is_never_passed_while_one_of_its_pods_metrics_are_missing() -> None:
    ts = analysed()
    reader = Canned(
        {
            "uid-svc-a-0": reading("svc-a-0", "A", OK),
            "uid-svc-b-0": reading("svc-b-0", "B", Counters()),
            "uid-svc-b-1": reading("svc-b-1", "B", None),  # its metrics read failed
        }
    )
    view = TritonView(reader)
    status = at_weight(50)
    judged_at(view, ts, status, 0)  # the baselines
    reader.given["uid-svc-b-0"] = reading("svc-b-0", "B", OK)
    reader.given["uid-svc-a-0"] = reading("svc-a-0", "A", OK + OK)
    result = judged_at(view, ts, status, 30)
    assert result is not None and result.verdict == INCONCLUSIVE, result
    assert result.models[0].verdict == PASSED  # the pod that answered passes: the one missing blocks
    assert not plan(status, result).status.promoting
    # the verdict says which pod and why
    why = "metrics: answer larger than 4194304 bytes"
    reader.given["uid-svc-b-1"] = dataclasses.replace(reader.given["uid-svc-b-1"], metrics_error=why)
    result = judged_at(view, ts, status, 31)
    assert result is not None and f"svc-b-1 ({why})" in result.message

"""Conditions per the API conventions and the status computed from observed Deployments and pods."""

from __future__ import annotations

from typing import Any

import pytest

from pod_bodies import started_pod
from triton_operator.core.decision import service_status as s
from triton_operator.core.decision.actions import RevisionPlan
from triton_operator.core.observed.observation import DeploymentState, PodState, pod_state
from triton_operator.core.rollout.canary_analysis import AnalysisResult, ModelResult
from triton_operator.core.rollout.clock import parse_time
from triton_operator.core.rollout.inplace import InPlaceState
from triton_operator.core.rollout.state import HistoryEntry, RolloutStatus
from triton_operator.core.vocabulary import conditions as c
from triton_operator.models import AnalysisRunRecord
from triton_operator.reconcile.analysis import analysis_status

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"


# ----------------------------------------------------------------- set_condition


def test_new_condition_gets_now() -> None:
    out = c.set_condition([], c.READY, c.FALSE, c.REPLICAS_NOT_READY, "0/1", 3, T0)
    assert out == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "ReplicasNotReady",
            "message": "0/1",
            "lastTransitionTime": T0,
            "observedGeneration": 3,
        }
    ]


def test_transition_time_kept_unless_status_flips() -> None:
    first = c.set_condition([], c.READY, c.FALSE, c.REPLICAS_NOT_READY, "0/2", 1, T0)
    same = c.set_condition(first, c.READY, c.FALSE, c.UNSCHEDULABLE, "other reason", 2, T1)
    assert same[0]["lastTransitionTime"] == T0
    assert same[0]["reason"] == "Unschedulable"
    assert same[0]["observedGeneration"] == 2
    flipped = c.set_condition(same, c.READY, c.TRUE, c.AVAILABLE, "2/2", 2, T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_input_not_mutated_and_order_fixed() -> None:
    start: list[dict[str, Any]] = [
        {"type": "Custom", "status": "True", "reason": "X", "lastTransitionTime": T0}
    ]
    out = c.set_condition(start, c.DEGRADED, c.FALSE, c.AS_EXPECTED, "", 1, T0)
    out = c.set_condition(out, c.READY, c.TRUE, c.AVAILABLE, "", 1, T0)
    assert [x["type"] for x in out] == ["Ready", "Degraded", "Custom"]
    assert len(start) == 1


def test_long_messages_are_cut() -> None:
    out = c.set_condition([], c.READY, c.FALSE, c.INVALID_SPEC, "x" * 5000, 1, T0)
    assert len(out[0]["message"]) == c.MAX_MESSAGE
    assert out[0]["message"].endswith("...")


# ----------------------------------------------------------------- verdicts


def dep(revision: str, replicas: int = 2, ready: int = 2, **kw: Any) -> DeploymentState:
    return DeploymentState(
        name=f"svc-{revision}",
        revision=revision,
        replicas=replicas,
        ready_replicas=ready,
        updated_replicas=ready,
        generation=1,
        observed_generation=1,
        **kw,
    )


def test_pods_scheduled_reports_scheduler_message() -> None:
    pods = [
        PodState(
            name="p1", revision="r1", unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        ),
        PodState(name="p2", revision="r1"),
        PodState(name="old", revision="r0", unschedulable="ignored: not a serving revision"),
    ]
    verdict = s.pods_scheduled(pods, ["r1"])
    assert (verdict.status, verdict.reason) == ("False", "Unschedulable")
    assert "1 pod(s)" in verdict.message and "Insufficient nvidia.com/gpu" in verdict.message
    assert s.pods_scheduled(pods[1:2], ["r1"]).status == "True"
    assert s.pods_scheduled([], ["r1"]).reason == c.NO_PODS


def test_pods_scheduled_counts_the_pods_as_their_deployment_does() -> None:
    """As status.replicas: a pod its Deployment does not count yet is not counted either, so the two
    change together; an unschedulable pod is said at once."""
    starting = [PodState(name="p1", revision="r1"), PodState(name="p2", revision="r1")]
    counted = {"r1": dep("r1", status_replicas=1)}
    verdict = s.pods_scheduled(starting, ["r1"], counted)
    assert (verdict.status, verdict.reason, verdict.message) == ("True", c.SCHEDULED, "1 pod(s) scheduled")
    assert s.pods_scheduled(starting, ["r1"], {"r1": dep("r1", status_replicas=0)}).reason == c.NO_PODS
    assert s.pods_scheduled(starting, ["r1"], {}).message == "2 pod(s) scheduled"
    stuck = [PodState(name="p3", revision="r1", unschedulable="0/1 nodes are available")]
    assert s.pods_scheduled(stuck, ["r1"], {"r1": dep("r1", status_replicas=0)}).reason == c.UNSCHEDULABLE


def test_degraded_on_failing_pods_and_deadline() -> None:
    crash = PodState(name="p", revision="r1", waiting_reason="CrashLoopBackOff", waiting_message="boom")
    assert s.degraded([crash], [], ["r1"]).reason == c.PODS_FAILING
    assert s.degraded([crash], [], ["r2"]).status == "False"
    late = dep("r1", ready=0, deadline_exceeded=True)
    assert s.degraded([], [late], ["r1"]).reason == c.PROGRESS_DEADLINE_EXCEEDED
    assert s.degraded([], [dep("r1")], ["r1"]).status == "False"


SCHEDULED = c.Verdict(c.TRUE, c.SCHEDULED, "")


@pytest.mark.parametrize(
    ("plan", "deployments", "replicas", "expected"),
    [
        (RevisionPlan(replicas={"a": 2}, stable="a"), [dep("a")], 2, ("True", c.AVAILABLE)),
        (
            RevisionPlan(replicas={"a": 2}, stable="a"),
            [dep("a", ready=1)],
            2,
            ("False", c.REPLICAS_NOT_READY),
        ),
        (RevisionPlan(replicas={"a": 2}, stable="a"), [], 2, ("False", c.REPLICAS_NOT_READY)),
        (RevisionPlan(replicas={"a": 0}, stable="a"), [dep("a", 0, 0)], 0, ("True", c.SCALED_TO_ZERO)),
        (
            RevisionPlan(replicas={"b": 2}, stable="a", rolling="b"),
            [dep("a"), dep("b", ready=1)],
            2,
            ("False", c.ROLLOUT_IN_PROGRESS),
        ),
    ],
)
def test_summarize_ready(
    plan: RevisionPlan, deployments: list[DeploymentState], replicas: int, expected: tuple[str, str]
) -> None:
    by = {d.revision: d for d in deployments}
    v = s.summarize_ready(invalid=None, scheduled=SCHEDULED, plan=plan, deployments=by, replicas=replicas)
    assert (v.status, v.reason) == expected


def test_summarize_ready_invalid_and_unschedulable_come_first() -> None:
    plan = RevisionPlan(replicas={"a": 2}, stable="a")
    by = {"a": dep("a")}
    v = s.summarize_ready(invalid="spec.x: bad", scheduled=SCHEDULED, plan=None, deployments=by, replicas=2)
    assert (v.status, v.reason, v.message) == ("False", c.INVALID_SPEC, "spec.x: bad")
    stuck = c.Verdict(c.FALSE, c.UNSCHEDULABLE, "0/3 nodes")
    v = s.summarize_ready(invalid=None, scheduled=stuck, plan=plan, deployments=by, replicas=2)
    assert (v.status, v.reason, v.message) == ("False", c.UNSCHEDULABLE, "0/3 nodes")


# ----------------------------------------------------------------- build_status


def observation(**kw: Any) -> s.Observation:
    defaults: dict[str, Any] = {
        "generation": 4,
        "now": T0,
        "deployments": [dep("a")],
        "plan": RevisionPlan(replicas={"a": 2}, stable="a"),
        "replicas": 2,
        "scale_replicas": 2,
        "scale_selector": "triton-operator.io/revision=a,triton-operator.io/service=svc",
        "repository": c.Verdict(c.TRUE, c.UNPINNED, "unpinned"),
        "endpoints": {"http": "svc.ml.svc:8000", "grpc": "svc.ml.svc:8001", "metrics": "svc.ml.svc:8002"},
        "models": [{"name": "m", "versions": []}],
        "progressing": c.Verdict(c.FALSE, "RolloutCompleted", "revision a is stable at 2 replicas"),
    }
    defaults.update(kw)
    return s.Observation(**defaults)


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in status["conditions"]}


def test_status_of_a_ready_service() -> None:
    status = s.build_status({}, observation())
    assert status["observedGeneration"] == 4
    assert status["stableRevision"] == "a"
    assert "canaryRevision" not in status
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert status["selector"] == "triton-operator.io/revision=a,triton-operator.io/service=svc"
    assert status["models"] == [{"name": "m", "versions": [], "ready": True}]
    assert status["endpoints"]["grpc"] == "svc.ml.svc:8001"
    got = {t: (x["status"], x["reason"]) for t, x in conds(status).items()}
    assert got == {
        "Ready": ("True", c.AVAILABLE),
        "RepositoryReady": ("True", c.UNPINNED),
        "Progressing": ("False", "RolloutCompleted"),
        "Degraded": ("False", c.AS_EXPECTED),
        "PodsScheduled": ("True", c.NO_PODS),
    }
    assert all(x["observedGeneration"] == 4 for x in status["conditions"])


def test_same_observation_gives_equal_status_so_nothing_is_written() -> None:
    first = s.build_status({}, observation())
    again = s.build_status(first, observation(now=T1))
    assert again == first
    assert not s.status_changed(first, again)
    # a field the reconcile does not own does not count
    assert not s.status_changed({**first, "kopf": {"x": 1}}, again)


def test_status_changes_when_a_pod_becomes_ready() -> None:
    before = s.build_status({}, observation(deployments=[dep("a", ready=1)]))
    after = s.build_status(before, observation(deployments=[dep("a")], now=T1))
    assert s.status_changed(before, after)
    assert conds(before)["Ready"]["status"] == "False"
    assert conds(after)["Ready"]["lastTransitionTime"] == T1
    assert conds(after)["Degraded"]["lastTransitionTime"] == T0  # did not flip


def test_rollout_status_names_both_revisions_and_takes_the_engines_fields() -> None:
    rolling = RevisionPlan(replicas={"b": 2}, stable="a", rolling="b")
    progressing = c.Verdict(c.TRUE, c.NEW_REVISION, "step 0/2")
    mid = s.build_status(
        {}, observation(plan=rolling, deployments=[dep("a"), dep("b", ready=1)], progressing=progressing)
    )
    assert (mid["stableRevision"], mid["canaryRevision"]) == ("a", "b")
    assert conds(mid)["Progressing"]["reason"] == c.NEW_REVISION
    assert conds(mid)["Ready"]["reason"] == c.ROLLOUT_IN_PROGRESS
    promoted = RevisionPlan(replicas={"b": 2}, stable="b", delete=("a",))
    engine = {"history": [{"revision": "a", "created": T0}], "canaryWeight": None, "promoting": False}
    done = s.build_status(mid, observation(plan=promoted, deployments=[dep("b")], rollout=engine))
    assert done["stableRevision"] == "b"
    assert "canaryRevision" not in done
    assert done["history"] == [{"revision": "a", "created": T0}]
    assert "canaryWeight" not in done and "promoting" not in done  # unset fields are left out
    assert conds(done)["Ready"]["status"] == "True"


def test_invalid_spec_keeps_revisions_and_says_why() -> None:
    good = s.build_status({}, observation())
    bad = s.build_status(
        good,
        s.Observation(
            generation=5, now=T1, deployments=[dep("a")], invalid="spec.models[0].config: no field x"
        ),
    )
    assert bad["observedGeneration"] == 5
    assert bad["stableRevision"] == "a"
    assert bad["endpoints"] == good["endpoints"]
    ready = conds(bad)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", c.INVALID_SPEC)
    assert "spec.models[0].config" in ready["message"]
    assert conds(bad)["RepositoryReady"] == conds(good)["RepositoryReady"]


def test_unschedulable_pods_make_ready_false() -> None:
    pods = [
        PodState(
            name="p", revision="a", unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
        )
    ]
    status = s.build_status({}, observation(pods=pods, deployments=[dep("a", ready=0)]))
    scheduled = conds(status)["PodsScheduled"]
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert (conds(status)["Ready"]["status"], conds(status)["Ready"]["reason"]) == ("False", "Unschedulable")


# ----------------------------------------------------------------- with the rollout engine's verdicts

ROLLOUT_FIELDS: dict[str, Any] = {
    "stableRevision": "a",
    "canaryRevision": "b",
    "canaryWeight": 0,
    "currentStepIndex": 0,
    "stepStartedAt": T0,
    "waitingSince": None,
    "promoting": False,
    "pausedByUser": False,
    "handledRequests": {},
    "history": [],
}
ROLLING = RevisionPlan(replicas={"a": 2, "b": 1}, stable="a", rolling="b")


def test_rollout_fields_are_written_without_unset_values() -> None:
    status = s.build_status({}, observation(plan=ROLLING, rollout=ROLLOUT_FIELDS))
    assert (status["canaryWeight"], status["currentStepIndex"], status["stepStartedAt"]) == (0, 0, T0)
    for unset in ("waitingSince", "promoting", "pausedByUser", "handledRequests", "history"):
        assert unset not in status, unset  # left out: server-side apply removes what was ours
    assert s.compact({"a": 0, "b": None, "c": False, "d": {}, "e": [], "f": True}) == {"a": 0, "f": True}
    # an invalid spec applies nothing: the rollout's bookkeeping stays as it was
    bad = s.build_status(status, s.Observation(generation=5, now=T1, invalid="spec.x: bad"))
    assert {k: bad.get(k) for k in s.ROLLOUT_STATUS_FIELDS} == {
        k: status.get(k) for k in s.ROLLOUT_STATUS_FIELDS
    }
    # a change of a bookkeeping field alone is a change to write
    later = s.build_status(
        status, observation(plan=ROLLING, rollout={**ROLLOUT_FIELDS, "currentStepIndex": 1})
    )
    assert s.status_changed(status, later)
    assert not s.status_changed(
        later,
        s.build_status(later, observation(plan=ROLLING, rollout={**ROLLOUT_FIELDS, "currentStepIndex": 1})),
    )


def test_rollout_verdicts_override_progressing_and_degraded() -> None:
    paused = c.Verdict(c.FALSE, "StepPaused", "step 1/4: paused until promoted")
    fine = c.Verdict(c.FALSE, c.AS_EXPECTED, "no rollout failed")
    crash = PodState(name="p", revision="a", waiting_reason="ImagePullBackOff", waiting_message="pull")
    status = s.build_status(
        {},
        observation(
            plan=ROLLING, rollout=ROLLOUT_FIELDS, progressing=paused, rollout_degraded=fine, pods=[crash]
        ),
    )
    assert (conds(status)["Progressing"]["reason"], conds(status)["Progressing"]["status"]) == (
        "StepPaused",
        "False",
    )
    # failing pods still make Degraded True when the rollout itself is fine
    assert (conds(status)["Degraded"]["status"], conds(status)["Degraded"]["reason"]) == (
        "True",
        c.PODS_FAILING,
    )
    aborted = c.Verdict(c.TRUE, "ProgressDeadlineExceeded", "rollout of revision b aborted at step 0")
    status = s.build_status(
        {},
        observation(
            plan=RevisionPlan(replicas={"a": 2, "b": 0}, stable="a"),
            rollout={**ROLLOUT_FIELDS, "canaryRevision": None, "abortedRevision": "b"},
            progressing=c.Verdict(c.FALSE, "RolloutAborted", "aborted"),
            rollout_degraded=aborted,
            aborted=aborted.message,
            pods=[crash],
        ),
    )
    got = {t: (x["status"], x["reason"]) for t, x in conds(status).items()}
    assert got["Degraded"] == ("True", "ProgressDeadlineExceeded")  # the rollout's reason wins
    assert got["Ready"] == ("False", c.ROLLOUT_ABORTED)  # the stable serves, not what the spec asks
    assert conds(status)["Ready"]["message"] == aborted.message
    assert status["abortedRevision"] == "b" and "canaryRevision" not in status


def test_traffic_routed_is_set_and_removed() -> None:
    routed = c.Verdict(c.TRUE, c.WEIGHTS_SET, "HTTPRoute ml/r: stable 90% / canary 10%")
    status = s.build_status({}, observation(traffic=routed))
    assert (conds(status)["TrafficRouted"]["status"], conds(status)["TrafficRouted"]["reason"]) == (
        "True",
        "WeightsSet",
    )
    assert [x["type"] for x in status["conditions"]][-1] == "TrafficRouted"
    gone = s.build_status(status, observation())
    assert "TrafficRouted" not in conds(gone)
    # an invalid spec keeps it as it was (nothing was applied)
    bad = s.build_status(status, s.Observation(generation=5, now=T1, invalid="spec.x: bad"))
    assert conds(bad)["TrafficRouted"] == conds(status)["TrafficRouted"]


# ----------------------------------------------------------------- the written status is the model's


def full_rollout() -> dict[str, Any]:
    """Every rollout bookkeeping field set, as the engine writes it."""
    return RolloutStatus(
        stable_revision="a",
        stable_since=parse_time(T0),
        canary_revision="b",
        canary_weight=20,
        current_step_index=2,
        step_started_at=parse_time(T0),
        canary_started_at=parse_time(T0),
        waiting_since=parse_time(T1),
        promoting=True,
        aborted_revision="c",
        aborted_reason=c.ANALYSIS_FAILED,
        aborted_step_index=1,
        aborted_detail="m: success ratio 0.5000",
        paused_by_user=True,
        pinned_revision="a",
        pinned_for="b",
        replaced_revision="z",
        handled_requests={"promote": "b"},
        history=(HistoryEntry("y", T0), HistoryEntry("x")),
        analysis_runs=(
            AnalysisRunRecord(
                revision="b", step_index=1, weight=10, verdict="Passed", message="passed", at=T1
            ),
        ),
    ).to_status() | {
        "servedRevision": "d",
        "rolloutKind": "InPlace",
        "rolloutKindReason": "in place: reload m (1 objects, 3 bytes to fetch)",
        "inPlace": InPlaceState(host="a", stable="d", next="e", step_index=0, pods=("p-1",)).to_status(),
    }


def full_observation() -> s.Observation:
    window = AnalysisResult(
        revision="b",
        weight=20,
        verdict="Failed",
        window_seconds=30,
        models=(
            ModelResult("m", "Failed", 100, 0.5, 1200.4, 400, None, "success ratio 0.5000"),
            ModelResult("n", "Inconclusive", 3, None, None, 0, None, "3 of 50 requests needed"),
        ),
    )
    serving = {"revision": "a", "versions": [{"version": "1", "state": "READY"}]}
    canary = {"revision": "b", "versions": [{"version": "1", "state": "UNAVAILABLE", "reason": "boom"}]}
    return observation(
        plan=ROLLING,
        rollout=full_rollout(),
        models=[{"name": "m", "versions": ["1"], "serving": serving, "canary": canary}],
        analysis=analysis_status(window, parse_time(T0)),
        traffic=c.Verdict(c.TRUE, c.WEIGHTS_SET, "routes set"),
        autoscaling=c.Verdict(c.UNKNOWN, c.AUTOSCALER_PENDING, "written"),
        image="nvcr.io/nvidia/tritonserver:25.01-py3",
        default_image="nvcr.io/nvidia/tritonserver:25.02-py3",
        pods=[pod_state(started_pod("a", sync_restarts=1)), pod_state(started_pod("b"))],
    )


def test_every_owned_field_is_written_through_the_status_model() -> None:
    status = s.build_status({}, full_observation())
    assert set(status) == set(s.OWNED_STATUS_FIELDS)  # each one set, and no other
    # the model the CRD schema is generated from takes each field as it is (nothing dropped,
    # renamed, added or defaulted), and the status read back builds the same status
    assert s.written_status(status) == status
    assert s.build_status(status, full_observation()) == status
    assert [x["type"] for x in status["conditions"]] == list(c.CONDITION_TYPES)
    assert status["analysis"]["models"][1] == {
        "name": "n",
        "verdict": "Inconclusive",
        "requests": 3,
        "stableRequests": 0,
        "reason": "3 of 50 requests needed",
    }  # unset figures left out, not null


def test_a_field_outside_the_status_model_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not in TritonServiceStatus.*kopf"):
        s.written_status({"observedGeneration": 1, "kopf": {}})
    with pytest.raises(ValueError, match="stableRevision"):
        s.written_status({"stableRevision": 3})

"""core.observed.observation: checked specs, stored revisions, adoption by owner, Deployment and pod
states."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from triton_operator.core.decision.inplace_plan import host_pods
from triton_operator.core.objects.builders import (
    build_configmap,
    build_configmaps,
    build_deployment,
    compute_revision,
)
from triton_operator.core.objects.names import LABEL_REVISION
from triton_operator.core.observed.observation import (
    check_body,
    default_pull_policy,
    deployment_state,
    last_valid,
    nothing_applied_yet,
    observe_revisions,
    pod_state,
    recorded_revisions,
    recorded_settings,
    revision_of,
    revision_state,
    split_by_owner,
)
from triton_operator.core.rollout.state import RevisionState
from triton_operator.settings import Settings
from tritonservice_bodies import (
    CONFIG,
    SETTINGS,
    UID,
    body,
    configs_of,
    observed_configmap,
    observed_deployment,
    ts_of,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)

# ----------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"replicas": -1}, "spec.replicas"),
        ({"serverArgs": ["--model-repository=/x"]}, "spec.serverArgs[0]"),
        ({"serverArgs": ["--not-a-flag"]}, "spec.serverArgs[0]"),
        ({"models": [{"name": "m1", "config": {**CONFIG, "maxBatchSizee": 4}}]}, "spec.models[0].config"),
        (
            {
                "models": [
                    {
                        "name": "ens",
                        "config": {
                            "platform": "ensemble",
                            "input": [{"name": "I", "dataType": "TYPE_FP32", "dims": ["4"]}],
                            "output": [{"name": "O", "dataType": "TYPE_FP32", "dims": ["4"]}],
                            "ensembleScheduling": {
                                "step": [
                                    {
                                        "modelName": "missing",
                                        "inputMap": {"IN": "I"},
                                        "outputMap": {"OUT": "O"},
                                    }
                                ]
                            },
                        },
                    }
                ]
            },
            "spec.models[0].config.ensembleScheduling.step[0].modelName",
        ),
    ],
)
def test_check_body_names_the_field(spec: dict[str, Any], field: str) -> None:
    checked = check_body(body(**spec))
    assert checked.problems
    assert any(p.startswith(field) for p in checked.problems), checked.problems


@pytest.mark.parametrize("name", ["Upper", "1abc", "a.b", "x" * 64])
def test_check_body_refuses_names_that_cannot_name_a_service(name: str) -> None:
    doc = body()
    doc["metadata"]["name"] = name
    checked = check_body(doc)
    assert any(p.startswith("metadata.name") for p in checked.problems)


def test_check_body_renders_configs_of_a_valid_spec() -> None:
    checked = check_body(body())
    assert checked.problems == ()
    assert checked.ts is not None
    assert 'backend: "python"' in checked.configs["m1"]


# ----------------------------------------------------------------- observed state


def test_deployment_state_from_api_dict() -> None:
    obj = {
        "metadata": {"name": "svc-r1", "generation": 3, "labels": {"triton-operator.io/revision": "r1"}},
        "spec": {"replicas": 2},
        "status": {
            "observedGeneration": 3,
            "readyReplicas": 2,
            "updatedReplicas": 2,
            "availableReplicas": 2,
            "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}],
        },
    }
    s = deployment_state(obj)
    assert (s.name, s.revision, s.replicas, s.ready_replicas, s.generation) == ("svc-r1", "r1", 2, 2, 3)
    assert s.deadline_exceeded
    assert s.ready_at(2) and not s.ready_at(3)


def test_pod_state_unschedulable_and_failing() -> None:
    pending = {
        "metadata": {"name": "p1", "labels": {"triton-operator.io/revision": "r1"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    }
    p = pod_state(pending)
    assert p.unschedulable == "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    assert not p.ready
    crashing = {
        "metadata": {"name": "p2", "labels": {"triton-operator.io/revision": "r1"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {
                    "name": "tritonserver",
                    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                }
            ],
        },
    }
    c = pod_state(crashing)
    assert c.waiting_reason == "CrashLoopBackOff"
    assert c.unschedulable is None
    ready = {"metadata": {"name": "p3"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert pod_state(ready).ready


# ----------------------------------------------------------------- the sync image a revision keeps


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("ghcr.io/triton-operator/triton-operator:0.1.0", "IfNotPresent"),
        ("ghcr.io/triton-operator/triton-operator:latest", "Always"),
        ("ghcr.io/triton-operator/triton-operator", "Always"),
        ("localhost:5000/op", "Always"),
        ("localhost:5000/op:1", "IfNotPresent"),
        ("reg/op@sha256:" + "a" * 64, "IfNotPresent"),
    ],
)
def test_default_pull_policy_is_kubernetes_own(image: str, policy: str) -> None:
    assert default_pull_policy(image) == policy


# ----------------------------------------------------------------- adoption by owner


def owned_by(uid: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["ownerReferences"] = [{"uid": uid, "controller": True, "kind": "TritonService"}]
    return out


def pod_of(revision: str) -> dict[str, Any]:
    return {"metadata": {"name": f"svc-{revision}-x", "labels": {LABEL_REVISION: revision}}}


def test_objects_of_a_deleted_tritonservice_with_the_same_name_are_not_adopted() -> None:
    old_uid, new_uid = "old-uid", UID
    deployments = [
        owned_by(old_uid, observed_deployment("a", 2)),
        owned_by(new_uid, observed_deployment("b", 1)),
    ]
    configmaps = [owned_by(old_uid, observed_configmap("a")), owned_by(new_uid, observed_configmap("b"))]
    adoption = split_by_owner(new_uid, deployments, configmaps, [pod_of("a"), pod_of("a"), pod_of("b")])
    assert [revision_of(d) for d in adoption.deployments] == ["b"]
    assert [revision_of(c) for c in adoption.configmaps] == ["b"]
    assert [p["metadata"]["labels"][LABEL_REVISION] for p in adoption.pods] == ["b"]
    assert adoption.foreign == ("svc-a", "svc-a")
    # a non-controller reference is not ownership either
    weak = copy.deepcopy(deployments[1])
    weak["metadata"]["ownerReferences"][0]["controller"] = False
    assert split_by_owner(new_uid, [weak], [], []).deployments == []


# ----------------------------------------------------------------- the last valid spec


def test_the_stored_spec_renders_the_same_revision_and_configs() -> None:
    ts = ts_of(
        replicas=3,
        rollout={"steps": [{"setWeight": 20}, {"pause": {"durationSeconds": 30}}]},
        resources={"cpu": 2},
    )
    configs = configs_of(ts)
    cm = build_configmap(ts, "r1", configs, None)
    last = last_valid(ts.metadata, {"stableRevision": "r1"}, [cm])
    assert last is not None
    assert last.revision == "r1"
    kept = check_body(last.body)
    assert kept.ts is not None and not kept.problems
    assert kept.ts.spec == ts.spec
    assert kept.configs == configs
    assert compute_revision(kept.ts, SETTINGS, kept.configs, None) == compute_revision(
        ts, SETTINGS, configs, None
    )
    assert last.manifest_json == cm["data"]["manifest.json"]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"stableRevision": "a"}, "a"),
        ({"stableRevision": "a", "canaryRevision": "b"}, "b"),
        ({"stableRevision": "a", "abortedRevision": "c"}, "c"),
        # An undo pin waits for "d", whose ConfigMap is gone: the rollback target's spec is next.
        ({"stableRevision": "a", "canaryRevision": "b", "pinnedFor": "d"}, "b"),
        ({"stableRevision": "x"}, None),
        ({}, None),
    ],
)
def test_last_valid_follows_the_revision_the_last_spec_asked_for(
    status: dict[str, str], expected: str | None
) -> None:
    maps = [build_configmap(ts_of(replicas=i + 1), rev, {}, None) for i, rev in enumerate("abc")]
    last = last_valid({"name": "svc"}, status, maps)
    assert (last.revision if last else None) == expected
    if last is not None:
        assert last.body["metadata"] == {"name": "svc"}
        assert last.body["spec"]["replicas"] == "abc".index(expected) + 1  # type: ignore[arg-type]


def test_last_valid_skips_a_configmap_without_a_spec() -> None:
    old = build_configmap(ts_of(), "b", {}, None)
    del old["data"]["spec.json"]  # rendered by an operator that did not keep specs
    stable = build_configmap(ts_of(), "a", {}, None)
    last = last_valid({}, {"stableRevision": "a", "canaryRevision": "b"}, [old, stable])
    assert last is not None and last.revision == "a"


# ----------------------------------------------------------------- revisions, as the rollout engine sees them


def pod(
    *,
    restarts: int = 0,
    waiting: str | None = None,
    init: bool = False,
    unschedulable_at: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    cs: dict[str, Any] = {"name": "c", "restartCount": restarts, "state": {}}
    if waiting:
        cs["state"] = {"waiting": {"reason": waiting}}
    status: dict[str, Any] = {("initContainerStatuses" if init else "containerStatuses"): [cs]}
    if unschedulable_at:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": unschedulable_at,
            }
        ]
    metadata: dict[str, Any] = {"name": "p"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "status": status}


@pytest.mark.parametrize(
    ("pod_dict", "expected"),
    [
        (pod(), False),
        (pod(restarts=2), False),
        (pod(restarts=3), True),
        (pod(waiting="CrashLoopBackOff", restarts=1), True),
        (pod(waiting="CrashLoopBackOff", init=True), True),
        (pod(restarts=5, init=True), True),
        (pod(waiting="ContainerCreating"), False),
        (pod(waiting="ImagePullBackOff"), False),
    ],
)
def test_pod_crash_looping(pod_dict: dict[str, Any], expected: bool) -> None:
    assert pod_state(pod_dict).crash_looping() is expected


def test_revision_state_from_objects() -> None:
    deployment = {
        "metadata": {"generation": 4},
        "spec": {"replicas": 3},
        "status": {"observedGeneration": 4, "replicas": 3, "readyReplicas": 2, "availableReplicas": 2},
    }
    pods = [
        pod(),
        pod(unschedulable_at="2026-01-01T12:00:30Z"),
        pod(unschedulable_at="2026-01-01T12:00:10Z"),
        pod(restarts=9, deleting=True),
    ]
    state = revision_state(deployment_state(deployment), [pod_state(p) for p in pods])
    assert state == RevisionState(
        spec_replicas=3,
        replicas=3,
        ready_replicas=2,
        available_replicas=2,
        observed=True,
        pods=4,
        crash_looping=False,  # the crashing pod is terminating
        unschedulable_since=T0 + timedelta(seconds=10),
    )
    assert state.ready_at(2) is False
    assert dataclasses.replace(state, ready_replicas=3).ready_at(3) is True


@pytest.mark.parametrize(
    ("generation", "observed_generation", "observed"),
    [(4, 4, True), (5, 4, False), (4, 5, True), (1, 0, False)],
)
def test_revision_state_observed_generation(
    generation: int, observed_generation: int, observed: bool
) -> None:
    deployment = {
        "metadata": {"generation": generation},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": observed_generation, "readyReplicas": 1},
    }
    state = revision_state(deployment_state(deployment), [])
    assert state.observed is observed
    assert state.ready_at(1) is observed


def test_revision_state_of_pods_without_deployment() -> None:
    state = revision_state(None, [pod_state(pod()), pod_state(pod())])
    assert (state.spec_replicas, state.pods, state.gpu_pods) == (0, 2, 2)


def labelled(obj: dict[str, Any], revision: str | None) -> dict[str, Any]:
    out = dict(obj)
    metadata = dict(out.get("metadata") or {})
    metadata["labels"] = {"triton-operator.io/revision": revision} if revision else {}
    out["metadata"] = metadata
    return out


def test_observe_revisions_pairs_each_deployment_with_its_own_pods() -> None:
    deployment = {
        "metadata": {"generation": 1},
        "spec": {"replicas": 2},
        "status": {"observedGeneration": 1, "replicas": 2, "readyReplicas": 2},
    }
    deployments = [labelled(deployment, "a"), labelled(deployment, "b"), labelled(deployment, None)]
    pods = [
        labelled(pod(), "a"),
        labelled(pod(), "a"),
        labelled(pod(waiting="CrashLoopBackOff"), "b"),
        labelled(pod(), "orphan"),  # no Deployment: not a revision the engine plans
        labelled(pod(), None),
    ]
    seen = observe_revisions([deployment_state(d) for d in deployments], [pod_state(p) for p in pods])
    assert set(seen) == {"a", "b"}
    assert (seen["a"].pods, seen["a"].crash_looping) == (2, False)
    assert (seen["b"].pods, seen["b"].crash_looping) == (1, True)
    assert observe_revisions([], [pod_state(p) for p in pods]) == {}


# ----------------------------------------------------------------- the settings a revision was made with

UPGRADED = Settings(
    default_image="reg/tritonserver:99.01",
    sync_image="reg/triton-operator:9.9.9",
    sync_image_pull_policy="Always",
    pod_security_defaults=False,
    triton_log_on_exit=False,
    sync_log_on_exit=False,
    prometheus_scrape=False,
)


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "live-deployment"])
def test_an_existing_revision_keeps_the_settings_it_was_made_with(recorded: bool) -> None:
    """Its ConfigMap's record, else (made before the record) what its Deployment runs: the same
    spec asks for the same revision and renders the same pod template under new operator settings."""
    ts = ts_of()
    configs = configs_of(ts)
    revision = compute_revision(ts, SETTINGS, configs, None)
    configmaps = build_configmaps(ts, revision, configs, None, settings=SETTINGS if recorded else None)
    deployment = build_deployment(ts, revision, SETTINGS, 2)
    assert compute_revision(ts, UPGRADED, configs, None) != revision  # the hash of a new revision
    kept = recorded_settings(UPGRADED, configmaps, deployment)
    assert build_deployment(ts, revision, kept, 2) == deployment
    both = recorded_revisions(UPGRADED, [deployment], configmaps)
    assert compute_revision(ts, UPGRADED, configs, None, both) == revision
    # a spec that changed is a new revision, with today's settings
    changed = ts_of(replicas=2, serverArgs=["--log-verbose=1"])
    assert compute_revision(changed, UPGRADED, configs_of(changed), None, both) == compute_revision(
        changed, UPGRADED, configs_of(changed), None
    )
    # a new revision (nothing stored) gets today's settings
    assert recorded_settings(UPGRADED, [], None) == UPGRADED


def test_nothing_is_applied_yet_only_without_a_status_and_without_owned_deployments_or_configmaps() -> None:
    """What tells a new TritonService's first pass that no PodDisruptionBudget of it can exist."""
    deployment = {"metadata": {"name": "svc-abc"}}
    configmap = {"metadata": {"name": "svc-abc"}}
    assert nothing_applied_yet({}, [], [])
    assert not nothing_applied_yet({"observedGeneration": 1}, [], [])  # its objects deleted by hand
    assert not nothing_applied_yet({}, [deployment], [])
    assert not nothing_applied_yet({}, [], [configmap])  # a pass whose status write failed


def _pod(status: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {LABEL_REVISION: "r1"}, **metadata}, "status": status}


RUNNING_TRITON = {"name": "tritonserver", "started": True, "state": {"running": {"startedAt": "x"}}}


@pytest.mark.parametrize(
    ("status", "metadata", "live", "why"),
    [
        (  # evicted: Failed, reason Evicted, no deletionTimestamp; stays until deleted
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": 'Usage of EmptyDir volume "models" exceeds the limit "32Mi". ',
            },
            {},
            False,
            'Failed (Evicted: Usage of EmptyDir volume "models" exceeds the limit "32Mi".)',
        ),
        ({"phase": "Succeeded"}, {}, False, "Succeeded"),
        (
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes",
                    }
                ],
            },
            {},
            True,
            "Pending (Unschedulable: 0/1 nodes)",
        ),
        (
            {
                "phase": "Pending",
                "initContainerStatuses": [
                    {"name": "sync", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no"}}}
                ],
            },
            {},
            True,
            "Pending (ImagePullBackOff: container sync: no)",
        ),
        ({"phase": "Pending"}, {}, True, "Pending (starting)"),
        ({"phase": "Unknown"}, {}, True, "Unknown (its node does not report it)"),
        (
            {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "tritonserver",
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "b"}},
                    }
                ],
            },
            {},
            True,
            "CrashLoopBackOff (container tritonserver: b)",
        ),
        ({"phase": "Running", "containerStatuses": [{"name": "tritonserver"}]}, {}, True, "not started"),
        ({"phase": "Running", "containerStatuses": [RUNNING_TRITON]}, {}, True, None),  # un-Ready: reloading
        ({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}, {}, True, None),
        ({"phase": "Running"}, {"deletionTimestamp": "2026-01-01T00:00:00Z"}, False, "terminating"),
    ],
)
def test_whether_a_pod_can_serve_and_why_not(
    status: dict[str, Any], metadata: dict[str, Any], live: bool, why: str | None
) -> None:
    pod = pod_state(_pod(status, **metadata))
    assert pod.live is live
    problem = pod.cannot_serve()
    assert (problem is None) if why is None else (problem is not None and problem.startswith(why)), problem


def test_an_evicted_pod_is_no_host_pod_and_no_crash_loop_of_its_revision() -> None:
    evicted = _pod(
        {"phase": "Failed", "reason": "Evicted", "containerStatuses": [{"name": "x", "restartCount": 5}]}
    )
    state = pod_state(evicted)
    assert state.settled and not state.live
    assert not revision_state(None, [state]).crash_looping
    assert host_pods("r1", [state], {}) == []

"""Whole reconcile passes (reconcile.reconcile_pass.reconcile) over MemKube, an in-memory fake of KubeAPI: the
order of the writes, the status written only when it changed, an invalid spec held.

The API server is faked (tests/e2e runs these passes against a real one); so are the Deployment
controller and the kubelet (``kubelet`` below), which make a revision's pods Ready on demand.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from e2e_helpers import ENSEMBLE_OF_A_MISSING_MODEL, tritonservice
from memkube import READS, WRITES, Call, MemKube, run_kubelet
from pod_bodies import CREATED, started_pod
from triton_operator import GROUP as KIND_GROUP
from triton_operator import KIND
from triton_operator.adapters.kube import ObjectRejectedError
from triton_operator.adapters.triton_reader import Owner, PodTarget, TritonReader
from triton_operator.core.decision import decide as decide_module
from triton_operator.core.observed import observation
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    model_sources,
    select_objects,
)
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.metrics import METRICS
from triton_operator.models import TritonService
from triton_operator.reconcile import observe as observe_module
from triton_operator.reconcile import reconcile_pass
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.apply import SupersededError
from triton_operator.reconcile.pinning import PinnedManifest, summarize
from triton_operator.reconcile.reconcile_pass import Result, reconcile
from triton_operator.settings import Settings
from tritonservice_bodies import fetcher

NS = "ml"
SETTINGS = Settings()
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def setter(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change for MemKube.edit that sets one top-level field."""

    def change(obj: dict[str, Any]) -> None:
        obj[field] = value

    return change


def kubelet(kube: MemKube) -> None:
    """The Deployment controller and the kubelet, faked: every Deployment's pods exist and are Ready."""
    run_kubelet(kube, NS)


async def run(kube: MemKube, settings: Settings = SETTINGS) -> tuple[Result, list[Call]]:
    """One pass at NOW (under the operator's ``settings``); what it returned and what it wrote."""
    mark = len(kube.writes)
    result = await reconcile(kube, NS, "svc", settings, clock=lambda: NOW)
    return result, kube.writes[mark:]


def methods(writes: list[Call]) -> list[str]:
    return [w.method for w in writes]


def condition(kube: MemKube, kind: str) -> dict[str, Any]:
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None
    found = cond.find_condition(stored["status"]["conditions"], kind)
    assert found is not None, f"no {kind} condition"
    return dict(found)


def objects(kube: MemKube) -> dict[tuple[str, str, str], dict[str, Any]]:
    """What the operator owns, without what every write changes (resourceVersion)."""
    out = {}
    for key, obj in kube.objects.items():
        if key[0] in (KIND, "Pod"):
            continue
        copied = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}}
        out[key] = copied
    return out


def change_model(kube: MemKube, **config: Any) -> None:
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"]["models"][0]["config"].update(config))


@pytest.fixture
def kube() -> MemKube:
    kube = MemKube()
    kube.put(tritonservice("svc", NS))
    return kube


async def test_a_first_pass_applies_configmaps_first_then_writes_the_status_and_posts_no_event(
    kube: MemKube,
) -> None:
    result, writes = await run(kube)
    assert result.written and result.invalid is None and result.revision is not None
    applied = [kind for kind, _, _ in kube.applied]
    assert "ConfigMap" in applied and "Deployment" in applied
    # The pod mounts the revision's ConfigMaps: they exist before its Deployment does.
    assert max(i for i, k in enumerate(applied) if k == "ConfigMap") < applied.index("Deployment")
    assert methods(writes) == ["apply"] * len(applied) + ["apply_status"]
    assert kube.events == []  # the first revision replaces nothing: no Event until RevisionServed
    ready = condition(kube, cond.READY)
    assert ready["status"] == cond.FALSE and ready["observedGeneration"] == 1
    deployment = kube.find("Deployment", NS, f"svc-{result.revision}")
    assert deployment is not None and deployment["spec"]["replicas"] == 2


async def test_the_status_is_written_only_when_it_changed(kube: MemKube) -> None:
    await run(kube)
    again, writes = await run(kube)  # nothing changed: no pod came up, no spec changed
    assert not again.written
    assert "apply_status" not in methods(writes)
    kubelet(kube)  # the pods come up: Ready changes
    ready, writes = await run(kube)
    assert ready.written and "apply_status" in methods(writes)
    assert condition(kube, cond.READY)["status"] == cond.TRUE


@pytest.mark.parametrize(("history", "after_status"), [(3, "scale"), (0, "delete")])
async def test_the_old_revision_is_scaled_down_or_deleted_only_after_the_status_says_why(
    kube: MemKube, history: int, after_status: str
) -> None:
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(rollout={"revisionHistoryLimit": history}))
    first, _ = await run(kube)
    kubelet(kube)
    await run(kube)
    change_model(kube, maxBatchSize=4)  # a new revision, a canary with no steps
    canary, _ = await run(kube)
    assert canary.revision != first.revision
    kubelet(kube)
    flip, writes = await run(kube)  # the canary is Ready: it becomes the stable revision
    assert flip.plan is not None and [e.reason for e in flip.plan.events] == ["RolloutCompleted"]
    done = methods(writes)
    assert done.index("apply_status") < done.index(after_status) < done.index("post_event")
    old = kube.find("Deployment", NS, f"svc-{first.revision}")
    if after_status == "scale":
        assert old is not None and old["spec"]["replicas"] == 0
    else:
        assert old is None
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["stableRevision"] == canary.revision


async def test_a_status_write_refused_for_a_newer_status_leaves_it_and_does_nothing_after_it(
    kube: MemKube,
) -> None:
    """The pass that would flip the canary to stable finds, at its status write, that another
    replica wrote a newer status since it read the TritonService: it is refused (its version is
    the precondition), and nothing its stale decision would scale, delete or announce is done."""
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(rollout={"revisionHistoryLimit": 0}))
    first, _ = await run(kube)
    kubelet(kube)
    await run(kube)
    change_model(kube, maxBatchSize=4)
    await run(kube)
    kubelet(kube)
    before = objects(kube)
    newer = {"observedGeneration": 9, "stableRevision": first.revision}

    def another_replica_writes(call: Call) -> None:
        kube.edit(KIND, NS, "svc", setter("status", newer))

    kube.before("apply_status", another_replica_writes)
    mark = len(kube.writes)
    with pytest.raises(SupersededError):
        await reconcile(kube, NS, "svc", SETTINGS, clock=lambda: NOW)
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"] == newer
    assert not {"apply_status", "scale", "delete", "post_event"} & set(methods(kube.writes[mark:]))
    assert kube.find("Deployment", NS, f"svc-{first.revision}") is not None  # not deleted
    assert {k: v for k, v in objects(kube).items() if k[0] == "Deployment"} == {
        k: v for k, v in before.items() if k[0] == "Deployment"
    }


async def test_an_invalid_spec_after_a_valid_one_changes_no_object_and_ready_says_why(kube: MemKube) -> None:
    await run(kube)
    kubelet(kube)
    await run(kube)
    before = objects(kube)
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(models=[ENSEMBLE_OF_A_MISSING_MODEL]))
    held, writes = await run(kube)
    assert held.invalid is not None and held.reason == cond.INVALID_SPEC
    assert objects(kube) == before
    assert not {"scale", "delete", "merge_patch"} & set(methods(writes))
    ready = condition(kube, cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.INVALID_SPEC)
    assert "missing" in ready["message"]
    assert ready["observedGeneration"] == 2


async def test_an_invalid_spec_from_the_start_applies_nothing_and_ready_says_why() -> None:
    kube = MemKube()
    kube.put(tritonservice("svc", NS, models=[ENSEMBLE_OF_A_MISSING_MODEL]))
    held, writes = await run(kube)
    assert held.invalid is not None
    assert methods(writes) == ["apply_status"]
    ready = condition(kube, cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.INVALID_SPEC)


async def test_a_tritonservice_gone_writes_nothing(kube: MemKube) -> None:
    await kube.delete(KIND, NS, "svc")
    gone, writes = await run(kube)
    assert gone.status is None and writes == []


async def test_a_spec_warning_is_a_warning_event_once_a_generation(kube: MemKube) -> None:
    """An unknown backend (core.spec.validation.spec_warnings) does not hold the spec: the revision is
    applied, and one Warning Event names the field, on the first pass of each generation only."""
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(image="nvcr.io/nvidia/tritonserver:25.01-py3"))
    change_model(kube, backend="vllm")
    result, _ = await run(kube)
    assert result.invalid is None and result.revision is not None
    warnings = [e for e in kube.events if e["reason"] == cond.SPEC_WARNING]
    assert len(warnings) == 1 and warnings[0]["type"] == cond.WARNING
    assert "spec.models[0].config.backend" in warnings[0]["message"]
    assert "vllm" in warnings[0]["message"]
    await run(kube)
    assert len([e for e in kube.events if e["reason"] == cond.SPEC_WARNING]) == 1


async def test_a_revisions_first_ready_pod_is_recorded_announced_and_measured_once(
    kube: MemKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real pod bodies (kubelet's shape, tests/support/pod_bodies.py): the pass that first sees the
    revision's pods Ready writes status.timeToServe, posts one RevisionServed Event naming the phases
    and observes each pod's start in the operator's metrics; the next pass does none of it again."""
    monkeypatch.setattr(METRICS, "since", CREATED)  # the pods became Ready after the operator started
    first, _ = await run(kube)
    assert first.revision is not None
    kubelet(kube)  # the Deployment's status: 2/2 ready; its pods replaced by real-shaped ones below
    for key in [k for k in kube.objects if k[0] == "Pod"]:
        del kube.objects[key]
    for suffix, ready in (("a", 9), ("b", 12)):
        kube.put(started_pod(first.revision, suffix, ready=ready, uid=f"uid-{suffix}-{first.revision}"))

    def total_starts() -> float:
        return (
            METRICS.registry.get_sample_value(
                "triton_operator_time_to_serve_seconds_count", {"phase": "total"}
            )
            or 0
        )

    starts = total_starts()
    served, writes = await run(kube)
    assert "apply_status" in methods(writes)
    (entry,) = served.status["timeToServe"] if served.status else []
    assert (entry["revision"], entry["pod"], entry["seconds"]) == (
        first.revision,
        f"svc-{first.revision}-7d9c8b6f5-a",
        9,
    )
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["timeToServe"] == [entry]
    (event,) = [e for e in kube.events if e["reason"] == cond.REVISION_SERVED]
    assert event["type"] == cond.NORMAL and event["message"].startswith(
        f"revision {first.revision} served in 9 s: "
    )
    assert "sync 2 s (512 MiB fetched)" in event["message"]
    assert total_starts() == starts + 2

    again, writes = await run(kube)
    assert not again.written and "post_event" not in methods(writes)
    assert len([e for e in kube.events if e["reason"] == cond.REVISION_SERVED]) == 1
    assert total_starts() == starts + 2


async def test_an_ensemble_step_asking_for_a_version_the_pinned_repository_lacks_is_held(
    kube: MemKube,
) -> None:
    """Judged once pinned: the repository holds version 1 of `add` only, a step asks for 3."""
    ensemble = {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [{"name": "A", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "output": [{"name": "B", "dataType": "TYPE_FP32", "dims": ["4"]}],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": "add",
                    "modelVersion": "3",
                    "inputMap": {"INPUT0": "A"},
                    "outputMap": {"OUTPUT0": "B"},
                }
            ]
        },
    }

    async def pin(ts: TritonService, current: str | None) -> PinnedManifest:
        sources = model_sources(ts.spec.models)
        listing = [ObjectInfo("add/1/model.py", 10, etag="e1"), ObjectInfo("pipe/1/.keep", 0, etag="e2")]
        selection = select_objects(sources, listing)
        manifest = build_manifest(StoreRef.from_repository(ts.spec.repository), selection)
        return summarize(manifest)

    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"]["models"].append({"name": "pipe", "config": ensemble}))
    result = await reconcile(kube, NS, "svc", SETTINGS, pin_manifest=pin, clock=lambda: NOW)
    assert result.reason == cond.INVALID_SPEC, result.invalid
    assert result.invalid is not None
    assert "spec.models[1].config.ensembleScheduling.step[0].modelVersion" in result.invalid
    assert "the pinned repository holds only 1" in result.invalid
    assert kube.of_kind("Deployment") == []


# ----------------------------------------------------------------- autoscaling (core/decision/scaling.py)


@pytest.fixture
def autoscaled() -> MemKube:
    kube = MemKube()
    body = tritonservice(
        "svc", NS, autoscaling={"maxReplicas": 6, "metrics": [{"queueTime": {"averageMicroseconds": 5000}}]}
    )
    body["metadata"]["uid"] = "u-1"
    kube.put(body)
    return kube


def users_hpa(name: str) -> dict[str, Any]:
    """An HPA on TritonService svc that the operator does not own (a user's, or KEDA's)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "triton-operator.io/v1alpha1", "kind": KIND, "name": "svc"},
            "maxReplicas": 3,
        },
    }


async def test_a_pass_applies_the_owned_hpa_and_the_scale_status(autoscaled: MemKube) -> None:
    kube = autoscaled
    result, _ = await run(kube)
    stored = kube.find("HorizontalPodAutoscaler", NS, "svc")
    assert stored is not None and stored["spec"]["maxReplicas"] == 6
    assert condition(kube, cond.AUTOSCALING)["reason"] == cond.AUTOSCALER_PENDING
    assert result.requeue_after is not None  # HPAs are not watched: the condition is refreshed
    kubelet(kube)
    await run(kube)
    # The second pass finds its own HPA: kept, and not taken for someone else's.
    assert kube.find("HorizontalPodAutoscaler", NS, "svc") is not None
    assert condition(kube, cond.AUTOSCALING)["reason"] == cond.AUTOSCALER_PENDING
    status = kube.objects[(KIND, NS, "svc")]["status"]
    assert status["replicas"] == 2
    assert (
        status["selector"] == f"triton-operator.io/revision={result.revision},triton-operator.io/service=svc"
    )


async def test_a_users_hpa_on_the_service_wins_and_the_owned_one_goes(autoscaled: MemKube) -> None:
    kube = autoscaled
    await run(kube)
    assert kube.find("HorizontalPodAutoscaler", NS, "svc") is not None
    kube.put(users_hpa("keda-hpa-svc"))
    await run(kube)
    assert kube.find("HorizontalPodAutoscaler", NS, "svc") is None
    assert kube.find("HorizontalPodAutoscaler", NS, "keda-hpa-svc") is not None  # never touched
    verdict = condition(kube, cond.AUTOSCALING)
    assert (verdict["status"], verdict["reason"]) == (cond.FALSE, cond.FOREIGN_AUTOSCALER)
    assert not [w for w in kube.writes if w.kind == "HorizontalPodAutoscaler" and w.name == "keda-hpa-svc"]


async def test_unsetting_autoscaling_deletes_the_owned_hpa_and_then_the_condition(
    autoscaled: MemKube,
) -> None:
    kube = autoscaled
    await run(kube)
    kube.edit(KIND, NS, "svc", lambda obj: obj["spec"].pop("autoscaling"))
    await run(kube)
    assert kube.find("HorizontalPodAutoscaler", NS, "svc") is None
    assert condition(kube, cond.AUTOSCALING)["reason"] == cond.AUTOSCALER_REMOVED
    await run(kube)  # the HPA is seen gone: the record goes too
    stored = kube.find(KIND, NS, "svc")
    assert (
        stored is not None and cond.find_condition(stored["status"]["conditions"], cond.AUTOSCALING) is None
    )
    lists = kube.count("list_kind")
    await run(kube)  # a service that no longer asks costs no HPA list
    assert kube.count("list_kind") == lists


async def test_a_service_without_autoscaling_never_lists_hpas() -> None:
    kube = MemKube()
    kube.put(tritonservice("svc", NS))
    kube.put(users_hpa("mine"))  # a user's own HPA on the service: fine, and not even looked at
    await run(kube)
    kubelet(kube)
    await run(kube)
    assert kube.count("list_kind") == 0
    assert kube.find("HorizontalPodAutoscaler", NS, "mine") is not None
    stored = kube.find(KIND, NS, "svc")
    assert (
        stored is not None and cond.find_condition(stored["status"]["conditions"], cond.AUTOSCALING) is None
    )


# ----------------------------------------------------------------- traffic before pods (issue 22)


def web_route() -> dict[str, Any]:
    """The user's HTTPRoute `web`, sending to svc-stable (the operator sets its weights)."""
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "parentRefs": [{"name": "gw"}],
            "rules": [{"backendRefs": [{"name": "svc-stable", "port": 8000}]}],
        },
    }


def route_weights(kube: MemKube) -> dict[str, int | None]:
    stored = kube.find("HTTPRoute", NS, "web")
    assert stored is not None
    return {ref["name"]: ref.get("weight") for rule in stored["spec"]["rules"] for ref in rule["backendRefs"]}


def request(kube: MemKube, action: str) -> None:
    """A control request as `kubectl triton` writes it: made for the canary the status shows."""
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None
    patch = {
        f"triton-operator.io/{action}": f"2026-01-01T12:00:00.{len(kube.writes):06d}Z",
        f"triton-operator.io/{action}-revision": stored["status"]["canaryRevision"],
    }

    def annotate(ts: dict[str, Any]) -> None:
        ts["metadata"].setdefault("annotations", {}).update(patch)

    kube.edit(KIND, NS, "svc", annotate)


@pytest.fixture
def routed() -> MemKube:
    """svc with two replicas behind HTTPRoute web; steps setWeight 50, then pause until promoted."""
    kube = MemKube()
    steps = [{"setWeight": 50}, {"pause": {}}]
    kube.put(
        tritonservice(
            "svc", NS, rollout={"steps": steps, "trafficRouting": {"gatewayAPI": {"httpRoute": "web"}}}
        )
    )
    kube.put(web_route())
    return kube


async def start_canary(kube: MemKube) -> tuple[str, str]:
    """Revision A stable and Ready, then a new spec: canary B at step 0 (setWeight 50), not Ready."""
    first, _ = await run(kube)
    kubelet(kube)
    await run(kube)
    change_model(kube, maxBatchSize=4)
    canary, _ = await run(kube)
    assert first.revision is not None and canary.revision is not None and canary.revision != first.revision
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["canaryRevision"] == canary.revision
    return first.revision, canary.revision


async def test_a_promote_before_the_canarys_pods_are_ready_sends_it_no_traffic(routed: MemKube) -> None:
    kube = routed
    _, b = await start_canary(kube)
    request(kube, "promote")
    result, _ = await run(kube)  # B's pod is not Ready: the promote cannot give it 50 %
    assert route_weights(kube) == {"svc-stable": 100, "svc-canary": 0}
    assert result.plan is not None and [e.reason for e in result.plan.events] == ["RequestIgnored"]
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and (
        stored["status"]["currentStepIndex"],
        stored["status"]["canaryWeight"],
    ) == (0, 0)
    kubelet(kube)  # B's pod is Ready: the step completes on its own, and the weight follows
    await run(kube)
    assert route_weights(kube) == {"svc-stable": 50, "svc-canary": 50}
    deployment = kube.find("Deployment", NS, f"svc-{b}")
    assert deployment is not None and deployment["status"]["readyReplicas"] == 1


async def test_an_abort_moves_traffic_off_the_canary_before_scaling_it_down(routed: MemKube) -> None:
    kube = routed
    a, b = await start_canary(kube)
    kubelet(kube)
    await run(kube)  # B Ready: step 0 done, 50 % to the canary
    assert route_weights(kube) == {"svc-stable": 50, "svc-canary": 50}
    seen: list[tuple[int, dict[str, str]]] = []

    def at_route_write(_: Call) -> None:
        deployment = kube.find("Deployment", NS, f"svc-{b}")
        service = kube.find("Service", NS, "svc-canary")
        assert deployment is not None and service is not None
        seen.append((deployment["spec"]["replicas"], service["spec"]["selector"]))

    kube.before("merge_patch", at_route_write, kind="HTTPRoute")
    request(kube, "abort")
    result, writes = await run(kube)
    assert result.plan is not None and result.plan.status.aborted_revision == b
    # When the route's weights move, the canary Service already selects the stable revision and
    # the canary still has its pod; it is scaled to 0 after both (and after the status says why).
    ((replicas, selector),) = seen
    assert replicas == 1 and selector["triton-operator.io/revision"] == a
    assert route_weights(kube) == {"svc-stable": 100, "svc-canary": 0}
    done = [(w.method, w.kind, w.name) for w in writes]
    scaled = done.index(("scale", "Deployment", f"svc-{b}"))
    assert (
        done.index(("merge_patch", "HTTPRoute", "web")) < done.index(("apply_status", KIND, "svc")) < scaled
    )
    deployment = kube.find("Deployment", NS, f"svc-{b}")
    assert deployment is not None and deployment["spec"]["replicas"] == 0


async def test_a_pause_past_the_bound_is_refused_at_its_field_and_the_stable_revision_serves() -> None:
    """Issue 22 item 11: durationSeconds 3e11 raised OverflowError on every pass once the canary
    reached the step, freezing the service. It is refused at its field; the stable one serves."""
    kube = MemKube()
    kube.put(tritonservice("svc", NS, rollout={"steps": [{"pause": {"durationSeconds": 3600}}]}))
    first, _ = await run(kube)
    kubelet(kube)
    await run(kube)

    def new_spec(ts: dict[str, Any]) -> None:
        ts["spec"]["rollout"]["steps"] = [{"pause": {"durationSeconds": 300_000_000_000}}]
        ts["spec"]["models"][0]["config"]["maxBatchSize"] = 4

    kube.edit(KIND, NS, "svc", new_spec)
    result, _ = await run(kube)
    assert result.invalid is not None
    assert "spec.rollout.steps[0].pause.durationSeconds" in result.invalid
    ready = condition(kube, cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.INVALID_SPEC)
    assert [d["metadata"]["name"] for d in kube.of_kind("Deployment")] == [f"svc-{first.revision}"]
    stable = kube.find("Deployment", NS, f"svc-{first.revision}")
    assert stable is not None and stable["spec"]["replicas"] == 2


# ----------------------------------------------------------------- operator settings of a revision

UPGRADED = Settings(
    default_image="nvcr.io/nvidia/tritonserver:99.01-py3",
    sync_image="ghcr.io/triton-operator/triton-operator:9.9.9",
    prometheus_scrape=False,
)
"""The operator after a `helm upgrade` that changed its default tritonserver image (and more)."""
OPERATOR_KEY = "operator.json"
"""core.objects.names.OPERATOR_KEY (spelled out: these tests also run against an operator without it)."""


def templates(kube: MemKube) -> dict[str, Any]:
    """Every revision Deployment's pod template, by name."""
    return {d["metadata"]["name"]: d["spec"]["template"] for d in kube.of_kind("Deployment")}


def triton_images(kube: MemKube) -> dict[str, str]:
    return {
        name: next(c["image"] for c in t["spec"]["containers"] if c["name"] == "tritonserver")
        for name, t in templates(kube).items()
    }


async def stable(kube: MemKube, settings: Settings = SETTINGS) -> str:
    """Passes until the spec's revision is the stable one (the pods come up); its revision."""
    first, _ = await run(kube, settings)
    kubelet(kube)
    await run(kube, settings)
    assert first.revision is not None
    return first.revision


async def test_a_blocked_spec_never_re_renders_the_serving_revision_with_new_operator_settings(
    kube: MemKube,
) -> None:
    """A revision's pod template never changes: while a spec is blocked, the last valid spec's
    revision is re-rendered with the settings it was created with, not those of the upgrade."""
    revision = await stable(kube)
    before = templates(kube)
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(models=[ENSEMBLE_OF_A_MISSING_MODEL]))
    held, _ = await run(kube, UPGRADED)
    assert held.invalid is not None and held.revision == revision
    assert templates(kube) == before
    assert triton_images(kube) == {f"svc-{revision}": SETTINGS.default_image}


async def test_a_new_default_image_applies_to_new_revisions_only(kube: MemKube) -> None:
    """A chart upgrade that changes the default image rolls out nothing; the next change of the
    spec makes a revision with the new default (and a canary tries it first)."""
    revision = await stable(kube)
    before = templates(kube)
    same, writes = await run(kube, UPGRADED)
    assert same.revision == revision and same.plan is not None
    assert same.plan.status.canary_revision is None and not same.plan.events
    assert templates(kube) == before
    assert not {"scale", "delete"} & set(methods(writes))
    # the status says the serving revision runs another image than today's default (kubectl triton status)
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None
    assert (stored["status"]["image"], stored["status"]["defaultImage"]) == (
        SETTINGS.default_image,
        UPGRADED.default_image,
    )
    change_model(kube, maxBatchSize=4)
    changed, _ = await run(kube, UPGRADED)
    assert changed.revision not in (None, revision)
    assert triton_images(kube) == {
        f"svc-{revision}": SETTINGS.default_image,
        f"svc-{changed.revision}": UPGRADED.default_image,
    }
    new = templates(kube)[f"svc-{changed.revision}"]
    assert fetcher(new["spec"])["image"] == UPGRADED.sync_image
    assert "annotations" not in new["metadata"]  # UPGRADED scrapes no pod
    kubelet(kube)
    await run(kube, UPGRADED)  # the new revision becomes the stable one: on the default again
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["stableRevision"] == changed.revision
    assert stored["status"]["image"] == UPGRADED.default_image and "defaultImage" not in stored["status"]


async def test_a_revision_made_before_the_record_keeps_what_its_deployment_runs(kube: MemKube) -> None:
    """A revision an earlier operator made has no OPERATOR_KEY: its live Deployment says what it
    was created with (the safe reading), and that is recorded from then on."""
    revision = await stable(kube)
    before = templates(kube)
    kube.edit("ConfigMap", NS, f"svc-{revision}", lambda c: c["data"].pop(OPERATOR_KEY, None))
    same, _ = await run(kube, UPGRADED)
    assert same.revision == revision and templates(kube) == before
    configmap = kube.find("ConfigMap", NS, f"svc-{revision}")
    assert configmap is not None
    record = json.loads(configmap["data"][OPERATOR_KEY])
    assert (record["defaultImage"], record["syncImage"], record["prometheusScrape"]) == (
        SETTINGS.default_image,
        SETTINGS.sync_image,
        True,
    )


# ----------------------------------------------------------------- scale while the spec is blocked


@pytest.mark.parametrize("blocked", ["invalid", "refused by policy"])
async def test_scale_follows_the_live_replicas_while_the_spec_is_blocked(kube: MemKube, blocked: str) -> None:
    """An HPA, KEDA or `kubectl scale` writes spec.replicas through /scale: while the rest of the
    spec waits, the serving revision still follows it, down to zero and back."""
    revision = await stable(kube)
    if blocked == "invalid":
        kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(models=[ENSEMBLE_OF_A_MISSING_MODEL]))
    else:
        kube.edit(
            KIND, NS, "svc", lambda ts: ts["spec"].update(volumes=[{"name": "h", "hostPath": {"path": "/"}}])
        )
    for replicas in (0, 3):
        kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(replicas=replicas))  # noqa: B023 (run at once)
        held, _ = await run(kube)
        assert held.reason == (cond.INVALID_SPEC if blocked == "invalid" else cond.REFUSED_BY_POLICY)
        assert held.revision == revision
        deployment = kube.find("Deployment", NS, f"svc-{revision}")
        assert deployment is not None and deployment["spec"]["replicas"] == replicas
        kubelet(kube)


# ----------------------------------------------------------------- undo while the spec is blocked


async def test_undo_while_the_spec_is_blocked_still_refuses_a_revision_that_cannot_sync(
    kube: MemKube,
) -> None:
    """The blocked path judges an undo as the normal path does: a revision whose pinned objects
    were overwritten in an unversioned bucket is not gone back to (UndoRejected), nothing moves."""
    etag = {"add/1/model.py": "e1"}

    async def pin(ts: TritonService, current: str | None) -> PinnedManifest:
        listing = [ObjectInfo(key, 10, etag=tag) for key, tag in etag.items()]
        selection = select_objects(model_sources(ts.spec.models), listing)
        return summarize(
            build_manifest(StoreRef.from_repository(ts.spec.repository), selection), versioned=False
        )

    async def step() -> Result:
        return await reconcile(kube, NS, "svc", SETTINGS, pin_manifest=pin, clock=lambda: NOW)

    first = await step()
    kubelet(kube)
    await step()
    change_model(kube, maxBatchSize=4)
    second = await step()
    kubelet(kube)
    await step()
    kubelet(kube)
    await step()
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["stableRevision"] == second.revision
    assert first.revision in [h["revision"] for h in stored["status"]["history"]]
    # the spec goes bad, the model is overwritten in place, and someone asks to go back
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(models=[ENSEMBLE_OF_A_MISSING_MODEL]))
    etag["add/1/model.py"] = "e2"
    kube.edit(
        KIND,
        NS,
        "svc",
        lambda ts: ts["metadata"].setdefault("annotations", {}).update({f"{KIND_GROUP}/undo": "req-1"}),
    )
    before = {d["metadata"]["name"]: d["spec"]["replicas"] for d in kube.of_kind("Deployment")}
    mark = len(kube.events)
    held = await step()
    assert held.invalid is not None and held.plan is not None
    assert [e.reason for e in held.plan.events] == [cond.UNDO_REJECTED]
    assert "cannot sync any more" in held.plan.events[0].message
    assert [e["reason"] for e in kube.events[mark:]] == [cond.UNDO_REJECTED]
    assert held.plan.status.pinned_revision is None
    assert {d["metadata"]["name"]: d["spec"]["replicas"] for d in kube.of_kind("Deployment")} == before


# ----------------------------------------------------------------- observe -> decide -> apply (issue 23)


async def test_a_pass_reads_everything_before_its_first_write(routed: MemKube) -> None:
    """Observe, decide, apply: the HPAs, the PodDisruptionBudget and the routes are read with the
    TritonService and what it owns, before anything is written (a route is read again only after a
    conflict on its write)."""
    kube = routed
    kube.edit(
        KIND,
        NS,
        "svc",
        lambda obj: obj["spec"].update(
            autoscaling={"maxReplicas": 6, "metrics": [{"queueTime": {"averageMicroseconds": 5000}}]},
            disruptionBudget={"enabled": False},
        ),
    )
    kube.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {"maxUnavailable": 1},
        }
    )
    await start_canary(kube)
    mark = len(kube.calls)
    await run(kube)
    calls = [c.method for c in kube.calls[mark:]]
    first_write = next(i for i, m in enumerate(calls) if m in WRITES)
    assert not [m for m in calls[first_write:] if m in READS]
    reads = {(c.method, c.kind, c.name) for c in kube.calls[mark:] if c.method in READS}
    assert {
        ("list_kind", "HorizontalPodAutoscaler"),
        ("get", "PodDisruptionBudget"),
        ("get", "HTTPRoute"),
    } <= {(m, k) for m, k, _ in reads}
    assert route_weights(kube) == {"svc-stable": 100, "svc-canary": 0}


async def test_a_spec_the_api_server_refuses_is_held_in_the_same_pass_without_reading_again(
    routed: MemKube,
) -> None:
    """Observe once, even when the API server refuses the new spec's objects: what the last valid spec
    needs (here its route, which the new spec no longer names) is read before the first write, and
    the pass carries that spec out in place of the refused one, its status naming the refusal."""
    kube = routed
    kube.edit(
        KIND,
        NS,
        "svc",
        lambda obj: obj["spec"].update(
            autoscaling={"maxReplicas": 6, "metrics": [{"queueTime": {"averageMicroseconds": 5000}}]},
            disruptionBudget={"enabled": False},
        ),
    )
    kube.put(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "svc", "namespace": NS},
            "spec": {"maxUnavailable": 1},
        }
    )
    first, _ = await run(kube)
    kubelet(kube)
    await run(kube)

    def refused_spec(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["maxBatchSize"] = 4
        obj["spec"]["rollout"].pop("trafficRouting")

    kube.edit(KIND, NS, "svc", refused_spec)
    field = 'spec.template.spec.volumes[0].name: Invalid value: "Not_A_DNS_Label"'
    kube.fail_next("apply", ObjectRejectedError("Deployment", "svc-new", field), kind="Deployment")
    mark = len(kube.calls)
    held, _ = await run(kube)
    assert held.reason == cond.INVALID_SPEC and held.invalid is not None and field in held.invalid
    assert held.revision == first.revision and held.plan is not None
    ready = condition(kube, cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.FALSE, cond.INVALID_SPEC)
    assert "rejected by the API server" in ready["message"] and field in ready["message"]
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["stableRevision"] == first.revision
    assert route_weights(kube) == {"svc-stable": 100, "svc-canary": 0}
    calls = kube.calls[mark:]
    first_write = next(i for i, c in enumerate(calls) if c.method in WRITES)
    assert not [c for c in calls[first_write:] if c.method in READS]
    reads = [(c.method, c.kind, c.name) for c in calls if c.method in READS]
    assert sorted(reads) == sorted(set(reads)), reads  # nothing read twice
    assert {
        ("list_kind", "HorizontalPodAutoscaler"),
        ("get", "PodDisruptionBudget"),
        ("get", "HTTPRoute"),
    } <= {(m, k) for m, k, _ in reads}


class Timeline:
    """One pass's reads and writes in order: MemKube's calls, each call to the TritonView (``keep``
    records what the pass carries out: a write; anything else reads), and each call to decide."""

    def __init__(self, kube: MemKube) -> None:
        self.kube = kube
        self.events: list[tuple[str, str, int]] = []
        """(read | write | decide, what, how many API calls were made before it)."""

    def note(self, what: str, label: str) -> None:
        self.events.append((what, label, len(self.kube.calls)))

    def merged(self, since: int) -> list[tuple[str, str]]:
        """Every event from API call ``since`` on, the API calls among them, in the order they came."""
        out: list[tuple[str, str]] = []
        done = since
        for what, label, at in self.events:
            for call in self.kube.calls[done:at]:
                out.append(("read" if call.method in READS else "write", f"{call.method} {call.kind}"))
            done = max(done, at)
            out.append((what, label))
        for call in self.kube.calls[done:]:
            out.append(("read" if call.method in READS else "write", f"{call.method} {call.kind}"))
        return out


class Recorded:
    """A TritonView whose every call is put on the timeline."""

    def __init__(self, view: TritonView, timeline: Timeline) -> None:
        self.view = view
        self.timeline = timeline

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.view, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.timeline.note("write" if name == "keep" else "read", f"triton.{name}")
            return attr(*args, **kwargs)

        return call


class Holding(TritonReader):
    """The operator's Triton reader, reading nothing: a pass takes the readings it holds (none)."""

    def watch(self, owner: Owner, targets: Sequence[PodTarget], metrics_every: float | None = None) -> None:
        self.watched = (owner, tuple(targets), metrics_every)


@pytest.mark.parametrize("refused", [False, True])
async def test_a_pass_reads_nothing_after_it_has_decided(
    routed: MemKube, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """Read -> decide -> write: the API server, Triton's readings and the analysis windows are all read
    before decide is first called and before the first write (a Warning Event included), also when
    the API server refuses the new spec and the pass carries out the last valid one instead."""
    kube = routed
    kube.edit(KIND, NS, "svc", lambda obj: obj["spec"]["rollout"].update(analysis={"intervalSeconds": 5}))
    view = TritonView(Holding(period=3600, ports=(1, 1)))
    timeline = Timeline(kube)
    triton: Any = Recorded(view, timeline)

    async def step() -> Result:
        return await reconcile(kube, NS, "svc", SETTINGS, triton=triton, clock=lambda: NOW)

    await step()
    kubelet(kube)
    await step()
    change_model(kube, maxBatchSize=4)
    await step()
    kubelet(kube)
    await step()  # canary B Ready at weight 50, under analysis
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"].get("canaryWeight") == 50
    # A new spec with a warning (an unknown backend: a Warning Event), the canary still judged.
    kube.edit(KIND, NS, "svc", lambda ts: ts["spec"].update(image="nvcr.io/nvidia/tritonserver:25.01-py3"))
    change_model(kube, backend="vllm")
    if refused:
        field = 'spec.template.spec.volumes[0].name: Invalid value: "Not_A_DNS_Label"'
        kube.fail_next("apply", ObjectRejectedError("Deployment", "svc-new", field), kind="Deployment")
    real_decide = decide_module.decide

    def decide(*args: Any, **kwargs: Any) -> Any:
        timeline.note("decide", "decide")
        return real_decide(*args, **kwargs)

    monkeypatch.setattr(reconcile_pass, "decide", decide)
    mark, timeline.events = len(kube.calls), []
    result = await step()
    assert (result.invalid is not None) is refused
    events = timeline.merged(mark)
    kinds = [what for what, _ in events]
    assert kinds.count("decide") == (2 if refused else 1), events
    first_decide = kinds.index("decide")
    first_write = kinds.index("write")
    late = [e for e in events[min(first_decide, first_write) :] if e[0] == "read"]
    assert not late, events
    assert ("read", "triton.read") in events and ("write", "triton.keep") in events
    assert ("write", "post_event Event") in events  # the spec warning
    window = view._windows.get((NS, "svc"))
    assert window is not None and window.started == NOW  # the window the pass judged is kept


async def test_a_refused_spec_leaves_the_analysis_window_of_the_spec_carried_out(routed: MemKube) -> None:
    """A new spec without analysis that the API server refuses is only read, never kept: the last
    valid spec carried out in its place goes on judging the canary in the window it started."""
    kube = routed
    kube.edit(KIND, NS, "svc", lambda obj: obj["spec"]["rollout"].update(analysis={"intervalSeconds": 5}))
    view = TritonView(Holding(period=3600, ports=(1, 1)))
    now = NOW

    async def step() -> Result:
        return await reconcile(kube, NS, "svc", SETTINGS, triton=view, clock=lambda: now)

    await step()
    kubelet(kube)
    await step()
    change_model(kube, maxBatchSize=4)
    await step()
    kubelet(kube)
    await step()  # canary B Ready at weight 50
    canary = await step()  # judged at its weight: its window starts now
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["analysis"]["windowStartedAt"] == "2026-01-01T12:00:00Z"

    def refused_spec(obj: dict[str, Any]) -> None:
        obj["spec"]["models"][0]["config"]["maxBatchSize"] = 8
        obj["spec"]["rollout"].pop("analysis")

    kube.edit(KIND, NS, "svc", refused_spec)
    field = 'spec.template.spec.volumes[0].name: Invalid value: "Not_A_DNS_Label"'
    kube.fail_next("apply", ObjectRejectedError("Deployment", "svc-new", field), kind="Deployment")
    now = NOW + datetime.timedelta(seconds=30)
    held = await step()
    assert held.invalid is not None and held.revision == canary.revision
    stored = kube.find(KIND, NS, "svc")
    assert stored is not None and stored["status"]["canaryRevision"] == canary.revision
    assert stored["status"]["analysis"]["windowStartedAt"] == "2026-01-01T12:00:00Z"
    window = view._windows.get((NS, "svc"))
    assert window is not None and window.started == NOW


async def test_a_pass_parses_each_pod_once(kube: MemKube, monkeypatch: pytest.MonkeyPatch) -> None:
    """The status and the rollout engine read the same parsed pods (core.observed.observation.PodState)."""
    await run(kube)
    kubelet(kube)
    parsed: list[str] = []
    real = observation.pod_state

    def counting(obj: dict[str, Any]) -> observation.PodState:
        parsed.append(obj["metadata"]["name"])
        return real(obj)

    monkeypatch.setattr(observation, "pod_state", counting)
    monkeypatch.setattr(observe_module, "pod_state", counting)
    await run(kube)
    pods = [p["metadata"]["name"] for p in kube.of_kind("Pod")]
    assert pods and sorted(parsed) == sorted(pods)


async def test_ready_follows_the_rollouts_readiness_rule(kube: MemKube) -> None:
    """One readiness rule (core.rollout.state.revision_ready): the status's Ready says True for a
    revision scaled to spec.replicas with that many pods Ready, as seen by the controller, whatever
    updatedReplicas says, exactly when the rollout engine counts the revision ready."""
    await run(kube)
    kubelet(kube)
    (deployment,) = kube.of_kind("Deployment")
    kube.edit(
        "Deployment", NS, deployment["metadata"]["name"], lambda d: d["status"].update(updatedReplicas=0)
    )
    await run(kube)
    ready = condition(kube, cond.READY)
    assert (ready["status"], ready["reason"]) == (cond.TRUE, cond.AVAILABLE)

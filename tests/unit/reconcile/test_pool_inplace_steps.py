"""A model's new version in place in a pool, through the rollout engine's steps: a pause holds it until
promoted, the analysis judges the changed model's figures on the pods that hold it (a failure rolls it
back there, the other models untouched), and a change of a model's pool fields alone reloads nothing.

Faked as in test_pool_reconcile: the API server (MemKube), the kubelet, the pods' model agents (each
reports READY what its assignment asks) and, here, Triton's per-model counters (``ModelMetrics``).
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
from test_pool_reconcile import (  # type: ignore[import-not-found,unused-ignore]
    MODELS,
    NS,
    SETTINGS,
    T0,
    PoolMetrics,
    Reports,
    agents_from,
    answering,
    assigned,
    entries,
    pin,
    pods,
    pooled,
    start_pods,
)

from memkube import MemKube
from triton_operator.core.objects.names import INPLACE_MANIFEST_SUFFIX
from triton_operator.core.pool.assignment import ASSIGNMENT_ANNOTATION
from triton_operator.core.pool.labels import MODEL_LABEL_PREFIX
from triton_operator.core.repository.manifest import (
    ObjectInfo,
    StoreRef,
    build_manifest,
    model_sources,
    select_objects,
)
from triton_operator.core.rollout.canary_analysis import Counters
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import TritonService
from triton_operator.reconcile.analysis import TritonView
from triton_operator.reconcile.pinning import PinnedManifest, summarize
from triton_operator.reconcile.reconcile_pass import reconcile

Rate = Callable[[str, str, Any], Counters]
Pin = Callable[[TritonService, str | None], Awaitable[PinnedManifest]]
"""A pod's counters of one model for one second: (pod, model, its assignment entry)."""


def healthy(pod: str, model: str, entry: Any) -> Counters:
    return Counters(success=20.0, request_us=20.0 * 2000)


class ModelMetrics(PoolMetrics):  # type: ignore[misc]  # test_pool_reconcile is imported untyped (as above)
    """Triton's per-model counters on each pod, for the models its assignment annotation names, as
    ``rate`` says for each second ``advance`` lets pass (test_pool_reconcile's reader, whose rates come
    from one function here)."""

    def __init__(self, kube: MemKube, rate: Rate = healthy) -> None:
        super().__init__(kube, frozenset())
        self.rate = rate

    def advance(self, seconds: float) -> None:
        self.at += seconds
        for target in self.targets:
            held = entries(self.kube.find("Pod", NS, target.name) or {})
            totals = self.totals.setdefault(target.uid, {})
            for model, entry in held.items():
                one = self.rate(target.name, model, entry)
                grown = Counters(*(v * seconds for v in (one.success, one.failure, one.request_us, 0.0, 0.0)))
                totals[model] = totals.get(model, Counters()) + grown


class Pool:
    """A pooled TritonService under modelUpdates: InPlace with ``rollout``, its passes 30 s apart."""

    def __init__(self, rollout: Mapping[str, Any], rate: Rate = healthy, pin_with: Pin = pin) -> None:
        self.kube = MemKube()
        body = pooled()
        body["spec"]["rollout"] = {"modelUpdates": "InPlace", **rollout}
        body["spec"]["repository"] = {"uri": "s3://models/repo", "credentialsSecret": "store"}
        self.kube.put(body)
        self.metrics = ModelMetrics(self.kube, rate)
        self.view = TritonView(self.metrics)
        self.at = T0
        self.pin = pin_with

    async def run(self) -> dict[str, set[str]]:
        """One pass, the agents reporting what the assignments ask; each model's answering pods before it."""
        reports = agents_from(self.kube)
        where: dict[str, set[str]] = answering(self.kube, reports)
        self.metrics.advance(30)
        self.at += datetime.timedelta(seconds=30)
        moment = self.at
        await reconcile(
            self.kube,
            NS,
            "pool",
            SETTINGS,
            clock=lambda: moment,
            pool_reports=Reports(reports),
            pin_manifest=self.pin,
            triton=self.view,
        )
        return where

    async def start(self) -> None:
        await self.run()
        start_pods(self.kube)
        for _ in range(3):
            await self.run()

    def status(self) -> dict[str, Any]:
        return dict(self.kube.find("TritonService", NS, "pool")["status"])  # type: ignore[index]

    def condition(self, kind: str) -> dict[str, Any]:
        return next(c for c in self.status()["conditions"] if c["type"] == kind)

    def entries(self) -> dict[str, dict[str, Any]]:
        return {name: entries(pod) for name, pod in pods(self.kube).items()}

    def edit_model(self, model: str, change: Callable[[dict[str, Any]], None]) -> None:
        def edit(obj: dict[str, Any]) -> None:
            change(next(m for m in obj["spec"]["models"] if m["name"] == model))

        self.kube.edit("TritonService", NS, "pool", edit)

    def request(self, action: str, revision: str) -> None:
        def annotate(obj: dict[str, Any]) -> None:
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[f"triton-operator.io/{action}"] = f"req-{action}-1"
            annotations[f"triton-operator.io/{action}-revision"] = revision

        self.kube.edit("TritonService", NS, "pool", annotate)


def new_config(model: dict[str, Any]) -> None:
    model["config"]["parameters"] = {"note": {"stringValue": "v2"}}


def first_pods_model(pool: Pool) -> tuple[str, str, str]:
    """The pod a first step asks (the first by name, every pod Ready), a model it holds, and the other
    pod holding that model (each model has two copies)."""
    first = sorted(pods(pool.kube))[0]
    model = sorted(assigned(pods(pool.kube)[first]))[0]
    other = next(n for n, p in pods(pool.kube).items() if n != first and model in assigned(p))
    return first, model, other


def untouched(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], model: str
) -> bool:
    """Every pod's entries of the models but ``model`` are as they were (not reloaded)."""
    return all(
        {m: e for m, e in after[n].items() if m != model}
        == {m: e for m, e in before[n].items() if m != model}
        for n in before
    )


async def test_a_pool_in_place_step_pauses_until_promoted() -> None:
    """Steps setWeight 33 then an endless pause: the first pod takes the model's new version and the
    update holds there (its other copy keeps the old version, status Progressing StepPaused) pass after
    pass; `kubectl triton promote` takes it to the model's other copy, and the update completes. The
    other models are never reloaded, and every model answers at every pass."""
    pool = Pool({"steps": [{"setWeight": 33}, {"pause": {}}]})
    await pool.start()
    first, model, other = first_pods_model(pool)
    before = pool.entries()
    pool.edit_model(model, new_config)
    for _ in range(8):
        assert all((await pool.run()).values())
    moving = pool.status()["inPlace"]
    new = moving["next"]
    assert moving["pods"] == [first], moving
    progressing = pool.condition(cond.PROGRESSING)
    assert progressing["reason"] == cond.STEP_PAUSED and "until promoted" in progressing["message"]
    now = pool.entries()
    assert now[first][model].revision == new and now[first][model].version != before[first][model].version
    assert now[other][model] == before[other][model]  # held by the pause: the old version
    assert untouched(before, now, model)

    pool.request("promote", new)
    for _ in range(10):
        assert all((await pool.run()).values())
    status = pool.status()
    assert status["servedRevision"] == new and "next" not in status["inPlace"], status["inPlace"]
    after = pool.entries()
    assert after[other][model].revision == new and after[other][model].version == after[first][model].version
    assert untouched(before, after, model)


async def test_a_failing_analysis_rolls_the_model_back_on_the_pods_holding_it_and_leaves_the_others() -> None:
    """spec.rollout.analysis on a pool: after the first step, the changed model's new version fails
    half its requests on the pod that loaded it. The step's analysis judges that model on the pods
    that hold it (the new copy against the old one) and fails: the engine rolls the update back
    (AnalysisFailed), the pod loads the old version again, its other copy never moved, and the other
    models' entries are never rewritten."""
    rolled: dict[str, Any] = {}

    def rate(pod: str, model: str, entry: Any) -> Counters:
        if model == rolled.get("model") and entry.revision is not None:
            return Counters(success=10.0, failure=10.0, request_us=10.0 * 2000)  # the new version fails
        return healthy(pod, model, entry)

    analysis = {"intervalSeconds": 10, "minRequests": 50, "minSuccessRatio": 0.99}
    pool = Pool({"steps": [{"setWeight": 33}, {"setWeight": 100}], "analysis": analysis}, rate)
    await pool.start()
    first, model, other = first_pods_model(pool)
    rolled["model"] = model
    before = pool.entries()
    pool.edit_model(model, new_config)
    loaded = False
    for _ in range(12):
        assert all((await pool.run()).values())
        loaded = loaded or pool.entries()[first][model].revision is not None
        assert pool.entries()[other][model] == before[other][model]  # never asked: the gate held
    status = pool.status()
    assert loaded and status["inPlace"].get("abortedReason") == cond.ANALYSIS_FAILED, status["inPlace"]
    assert "next" not in status["inPlace"] and not status.get("servedRevision"), status["inPlace"]
    runs = status["analysisRuns"]
    assert runs[-1]["verdict"] == "Failed" and model in runs[-1]["message"], runs
    after = pool.entries()
    assert (
        after[first][model].revision is None and after[first][model].version == before[first][model].version
    )
    assert untouched(before, after, model)
    aborted = [e["message"] for e in pool.kube.events if e["reason"] == cond.ROLLOUT_ABORTED]
    assert aborted and "success ratio 0.5000" in aborted[-1], aborted


async def test_a_pool_step_is_judged_on_the_changed_models_figures_alone() -> None:
    """Another model fails half its requests on every pod (nothing to do with the update): the step is
    judged on the changed model's figures on the pods that hold it, passes, and the update completes."""
    changed: dict[str, Any] = {}

    def rate(pod: str, model: str, entry: Any) -> Counters:
        if model != changed.get("model"):
            return Counters(success=10.0, failure=10.0, request_us=10.0 * 2000)
        return healthy(pod, model, entry)

    analysis = {"intervalSeconds": 10, "minRequests": 50, "minSuccessRatio": 0.99}
    pool = Pool({"steps": [{"setWeight": 33}, {"setWeight": 100}], "analysis": analysis}, rate)
    await pool.start()
    first, model, other = first_pods_model(pool)
    changed["model"] = model
    before = pool.entries()
    pool.edit_model(model, new_config)
    for _ in range(14):
        assert all((await pool.run()).values())
    status = pool.status()
    new = status.get("servedRevision")
    assert new and "next" not in status["inPlace"], status["inPlace"]
    assert [r["verdict"] for r in status["analysisRuns"]] == ["Passed"], status["analysisRuns"]
    after = pool.entries()
    assert after[first][model].revision == new and after[other][model].revision == new
    assert untouched(before, after, model)


async def test_a_change_of_a_models_pool_fields_alone_reloads_nothing() -> None:
    """memory, minCopies and maxCopies say where and how often a model is placed, not what it loads:
    changing them leaves every copy's version (no reload), and makes no new pods."""
    pool = Pool({})
    await pool.start()
    before = pool.entries()
    deployments = {d["metadata"]["name"] for d in pool.kube.of_kind("Deployment")}

    def fields(model: dict[str, Any]) -> None:
        model["memory"], model["maxCopies"] = "450Mi", 3

    pool.edit_model("a", fields)
    for _ in range(4):
        assert all((await pool.run()).values())
    after = pool.entries()
    for name, held in after.items():
        for model, entry in held.items():
            if model in before[name]:
                assert entry.version == before[name][model].version, (name, model)
    assert {d["metadata"]["name"] for d in pool.kube.of_kind("Deployment")} == deployments


async def test_new_files_under_the_same_spec_are_a_new_version() -> None:
    """A model's version token names its files (the pinned manifest), as in-place updates compare
    them: a new upload of b's file, the spec unchanged, moves in place and reloads b on the pods that
    hold it from the new revision's files, and only b."""
    etags: dict[str, str] = {}

    async def pinned(ts: TritonService, current: str | None) -> PinnedManifest:
        listing = [
            ObjectInfo(f"{m}/1/model.py", 10, etag=etags.get(m, f"e-{m}"), generation=etags.get(m, f"e-{m}"))
            for m in MODELS
        ]
        selection = select_objects(model_sources(ts.spec.models), listing)
        return summarize(
            build_manifest(StoreRef.from_repository(ts.spec.repository), selection), versioned=True
        )

    pool = Pool({}, pin_with=pinned)
    await pool.start()
    before = pool.entries()
    holders = {n for n, held in before.items() if "b" in held}
    etags["b"] = "e-b-2"  # a new upload of b's file
    for _ in range(10):
        assert all((await pool.run()).values())
    status = pool.status()
    new = status.get("servedRevision")
    assert new and "next" not in status["inPlace"], status["inPlace"]
    after = pool.entries()
    for name in holders:
        assert after[name]["b"].revision == new and after[name]["b"].version != before[name]["b"].version
    assert untouched(before, after, "b")


async def test_a_step_whose_pods_hold_no_copy_of_the_changed_model_has_nothing_to_judge() -> None:
    """The first step asks a pod that holds no copy of the changed model: nothing moved there to judge,
    so the next step goes on as after a first step (it does not wait for ever on a verdict), and the
    model's copies on the other two pods are judged and complete the update."""
    pool = Pool(
        {
            "steps": [{"setWeight": 33}, {"setWeight": 67}, {"setWeight": 100}],
            "analysis": {"intervalSeconds": 10, "minRequests": 50, "minSuccessRatio": 0.99},
        }
    )
    await pool.start()
    first = sorted(pods(pool.kube))[0]
    model = next(m for m in MODELS if m not in assigned(pods(pool.kube)[first]))
    before = pool.entries()
    pool.edit_model(model, new_config)
    for _ in range(14):
        assert all((await pool.run()).values())
    status = pool.status()
    new = status.get("servedRevision")
    assert new and "next" not in status["inPlace"], status["inPlace"]
    after = pool.entries()
    assert all(held[model].revision == new for held in after.values() if model in held)
    assert untouched(before, after, model)


def config_note(note: str) -> Callable[[dict[str, Any]], None]:
    def change(model: dict[str, Any]) -> None:
        model["config"]["parameters"] = {"note": {"stringValue": note}}

    return change


async def test_an_abort_then_a_newer_spec_mid_rollout_move_only_the_changed_model() -> None:
    """Steps setWeight 33 then an endless pause: held at the pause, `kubectl triton abort` loads the
    old version back on the pod that took the new one (status.inPlace aborted by request, the other
    copy never moved); then another new version held at its pause, and a newer spec applied over it:
    the newer version is held at its pause, promoted, and every copy takes it. The other models are
    never reloaded, and every model answers at every pass."""
    pool = Pool({"steps": [{"setWeight": 33}, {"pause": {}}]})
    await pool.start()
    first, model, other = first_pods_model(pool)
    before = pool.entries()

    async def held_at_pause(after: set[str]) -> str:
        for _ in range(8):
            assert all((await pool.run()).values())
        moving = pool.status()["inPlace"]
        assert moving["pods"] == [first] and moving["next"] not in after, moving
        assert pool.condition(cond.PROGRESSING)["reason"] == cond.STEP_PAUSED
        now = pool.entries()
        assert now[first][model].revision == moving["next"], now[first][model]
        assert now[other][model] == before[other][model]  # held by the pause: the old version
        assert untouched(before, now, model)
        return str(moving["next"])

    pool.edit_model(model, config_note("v2"))
    aborted = await held_at_pause(set())
    pool.request("abort", aborted)
    for _ in range(8):
        assert all((await pool.run()).values())
    moving = pool.status()["inPlace"]
    assert moving.get("abortedRevision") == aborted and moving.get("abortedReason") == cond.ABORTED, moving
    assert "next" not in moving and not pool.status().get("servedRevision"), moving
    assert pool.entries() == before  # the old version back where it moved, nothing else rewritten
    assert any(aborted in e["message"] for e in pool.kube.events if e["reason"] == cond.ROLLOUT_ABORTED)

    pool.edit_model(model, config_note("v3"))
    second = await held_at_pause({aborted})
    pool.edit_model(model, config_note("v4"))  # a newer spec while v3 is held at its pause
    newest = await held_at_pause({aborted, second})
    assert pool.entries()[first][model].version != before[first][model].version
    pool.request("promote", newest)
    for _ in range(10):
        assert all((await pool.run()).values())
    status = pool.status()
    assert status["servedRevision"] == newest and "next" not in status["inPlace"], status["inPlace"]
    after = pool.entries()
    assert after[first][model].revision == newest == after[other][model].revision
    assert after[first][model].version == after[other][model].version != before[first][model].version
    assert untouched(before, after, model)


def reachable(kube: MemKube) -> set[str | None]:
    """The revisions a pod's agent can load a model from: its own (None) and those whose files the
    in-place ConfigMap carries (the agent reads them from its volume)."""
    out: set[str | None] = {None}
    for configmap in kube.of_kind("ConfigMap"):
        if configmap["metadata"]["name"].endswith("-inplace"):
            keys = configmap.get("data") or {}
            out.update(
                k.removesuffix(INPLACE_MANIFEST_SUFFIX) for k in keys if k.endswith(INPLACE_MANIFEST_SUFFIX)
            )
    return out


def replace_pod(kube: MemKube, name: str, new: str) -> None:
    """``name`` deleted and the ReplicaSet's new pod ``new`` started (an IP, a node, no assignment yet)."""
    body = copy.deepcopy(kube.objects.pop(("Pod", NS, name)))
    body["metadata"]["name"], body["metadata"]["uid"] = new, f"uid-{new}"
    body["metadata"]["annotations"] = {
        k: v for k, v in (body["metadata"].get("annotations") or {}).items() if k != ASSIGNMENT_ANNOTATION
    }
    body["metadata"]["labels"] = {
        k: v for k, v in body["metadata"]["labels"].items() if not k.startswith(MODEL_LABEL_PREFIX)
    }
    body["status"]["podIP"] = "10.0.0.9"
    kube.put(body)


@pytest.mark.parametrize("same", [True, False], ids=["the-same-model-aborted", "another-model-aborted"])
async def test_after_an_abort_a_new_pod_loads_every_model_from_files_it_can_reach(same: bool) -> None:
    """A first update in place of one model completed (the pods serve a revision that is not their
    own), a second (of the same model, or of the other model the first pod holds) aborted at its
    pause (the spec still names the aborted revision), then that pod deleted: the new pod's assignment
    names, for each model, a revision whose files it can reach (its own, or the served one the
    in-place ConfigMap carries) at the version the pods serve, never the aborted one, whose files are
    no longer there: else its agent waits for them for ever and the pod never serves."""
    pool = Pool({"steps": [{"setWeight": 33}, {"pause": {}}]})
    await pool.start()
    first, model, _ = first_pods_model(pool)
    second = model if same else next(m for m in assigned(pods(pool.kube)[first]) if m != model)
    pool.edit_model(model, config_note("v2"))
    for _ in range(8):
        assert all((await pool.run()).values())
    pool.request("promote", pool.status()["inPlace"]["next"])
    for _ in range(10):
        assert all((await pool.run()).values())
    served = pool.status()["servedRevision"]
    assert served and "next" not in pool.status()["inPlace"], pool.status()["inPlace"]
    before = pool.entries()
    pool.edit_model(second, config_note("v3"))
    for _ in range(8):
        assert all((await pool.run()).values())
    aborted = pool.status()["inPlace"]["next"]
    assert aborted != served
    pool.request("abort", aborted)
    for _ in range(8):
        assert all((await pool.run()).values())
    assert pool.status()["inPlace"].get("abortedRevision") == aborted, pool.status()["inPlace"]
    assert pool.entries() == before
    replace_pod(pool.kube, first, "pool-new")
    for _ in range(6):
        await pool.run()
    held = pool.entries()["pool-new"]
    assert held, pool.entries()
    can = reachable(pool.kube)
    assert aborted not in can and served in can, can
    assert {m: e.revision for m, e in held.items() if e.revision not in can} == {}, (can, held)
    for name, entry in held.items():  # the version the pods serve, as the pod deleted held it
        assert entry.version == before[first][name].version, (name, entry, before[first][name])

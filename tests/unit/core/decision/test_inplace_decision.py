"""core.decision.inplace_plan's choice and writes around the engine's in-place mode, pure: which changes the
rollout engine sees (new pods) and which move in place on the stable revision's pods, with the
reasons, for specs and stored ConfigMaps built by the operator's own builders."""

from __future__ import annotations

import copy
import datetime
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from e2e_helpers import PYTHON_MODEL
from triton_operator.core.decision.inplace_plan import (
    IN_PLACE,
    NEW_PODS,
    TOO_LARGE,
    InPlaceContext,
    InPlaceDecision,
    in_place_inputs,
    in_place_writes,
)
from triton_operator.core.objects.builders import build_configmaps, compute_revision
from triton_operator.core.observed.observation import PodState, check_body
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
    manifest_to_json,
)
from triton_operator.core.rollout.engine import plan_rollout
from triton_operator.core.rollout.plan import RolloutInput, RolloutPlan
from triton_operator.core.rollout.state import RevisionState, RolloutStatus
from triton_operator.core.vocabulary import conditions as cond
from triton_operator.models import TritonService
from triton_operator.settings import Settings

SETTINGS = Settings()
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
Spec = dict[str, Any]


def run_in_place(
    ts: TritonService,
    settings: Settings,
    revision: str,
    ctx: InPlaceContext,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
) -> tuple[InPlaceDecision, RolloutPlan]:
    """The in-place mode as core.decision.decide runs it: its inputs described, the rollout engine
    (which takes its requests and chooses), its writes; and the engine's one plan."""
    inputs = in_place_inputs(ts, settings, revision, ctx, configs=configs, manifest_json=manifest_json)
    plan = plan_rollout(
        RolloutInput(
            rollout=ts.spec.rollout,
            replicas=ts.spec.replicas,
            desired_revision=revision,
            now=NOW,
            status=RolloutStatus.from_status(ctx.previous),
            revisions=ctx.revisions,
            requests=ctx.requests,
            progress_deadline_seconds=600,
            in_place=inputs.mode,
        )
    )
    return in_place_writes(ts, inputs, plan), plan


def decide_in_place(
    ts: TritonService,
    settings: Settings,
    revision: str,
    ctx: InPlaceContext,
    *,
    configs: Mapping[str, str],
    manifest_json: str | None,
) -> InPlaceDecision:
    return run_in_place(ts, settings, revision, ctx, configs=configs, manifest_json=manifest_json)[0]


def base_spec() -> Spec:
    return {
        "replicas": 2,
        "repository": {"uri": "s3://models/repo", "credentialsSecret": "store"},
        "models": [
            {"name": "add", "config": copy.deepcopy(PYTHON_MODEL)},
            {"name": "sub", "config": copy.deepcopy(PYTHON_MODEL)},
        ],
        "rollout": {"modelUpdates": "InPlace"},
    }


FILES = {"add/1/model.py": b"add v1", "sub/1/model.py": b"sub v1"}


def manifest_json(files: Mapping[str, bytes]) -> str:
    entries = []
    for dest, data in sorted(files.items()):
        digest = hashlib.sha256(data).hexdigest()
        entries.append(ManifestEntry(f"repo/{dest}", dest, len(data), "sha256", digest, digest[:8]))
    models = (
        ManifestModel("add", "add", VersionPolicy(), ("1",)),
        ManifestModel("sub", "sub", VersionPolicy(), ("1",)),
    )
    return manifest_to_json(Manifest(StoreRef("s3://models/repo"), models, tuple(entries), True))


class Revision:
    """A spec as the operator renders it: configs, manifest, hash and ConfigMaps."""

    def __init__(self, spec: Spec, files: Mapping[str, bytes]) -> None:
        checked = check_body({"metadata": {"name": "svc", "namespace": "ml", "uid": "u"}, "spec": spec})
        assert not checked.problems and checked.ts is not None, checked.problems
        self.ts: TritonService = checked.ts
        self.configs = dict(checked.configs)
        self.manifest = manifest_json(files)
        self.name = compute_revision(
            self.ts, SETTINGS, self.configs, hashlib.sha256(self.manifest.encode()).hexdigest()
        )
        self.configmaps = build_configmaps(self.ts, self.name, self.configs, self.manifest, settings=SETTINGS)


def context(old: Revision, new: Revision, previous: Mapping[str, Any] | None = None) -> InPlaceContext:
    status = {"stableRevision": old.name, **(previous or {})}
    pods = [PodState(name=f"svc-{old.name}-{i}", revision=old.name, ready=True) for i in range(2)]
    return InPlaceContext(
        previous=status,
        configmaps=[*old.configmaps, *new.configmaps],
        revisions={old.name: RevisionState(spec_replicas=2, replicas=2, ready_replicas=2)},
        pods=pods,
        agents={},
        requests=(),
    )


def decide_with_plan(
    old: Revision, new: Revision, previous: Mapping[str, Any] | None = None
) -> tuple[InPlaceDecision, RolloutPlan]:
    ctx = context(old, new, previous)
    return run_in_place(new.ts, SETTINGS, new.name, ctx, configs=new.configs, manifest_json=new.manifest)


def decide(old: Revision, new: Revision, previous: Mapping[str, Any] | None = None) -> InPlaceDecision:
    return decide_with_plan(old, new, previous)[0]


def edit(change: Callable[[Spec], None]) -> Spec:
    spec = base_spec()
    change(spec)
    return spec


def config(spec: Spec, **fields: Any) -> None:
    spec["models"][0]["config"].update(fields)


def gpu(spec: Spec) -> None:
    spec["resources"] = {"gpus": 1}


OLD = Revision(base_spec(), FILES)


@pytest.mark.parametrize(
    ("change", "files", "reloaded"),
    [
        (lambda s: None, {**FILES, "add/1/model.py": b"add v2"}, "reload add"),
        (lambda s: config(s, maxBatchSize=16), FILES, "reload add"),
        (
            lambda s: config(s, parameters={"k": {"stringValue": "v"}}),
            {**FILES, "add/1/model.py": b"v2"},
            "reload add",
        ),
        (lambda s: s["models"].pop(), {"add/1/model.py": b"add v1"}, "unload sub"),
    ],
)
def test_a_model_change_on_cpu_moves_in_place(
    change: Callable[[Spec], None], files: dict[str, bytes], reloaded: str
) -> None:
    new = Revision(edit(change), files)
    decision = decide(OLD, new)
    assert decision.engine_revision == OLD.name  # the engine keeps the host; nothing of new pods
    assert decision.kind is not None and decision.kind[0] == IN_PLACE and reloaded in decision.kind[1]
    assert decision.plan is not None and decision.plan.state is not None
    assert (decision.plan.state.host, decision.plan.state.stable, decision.plan.state.next) == (
        OLD.name,
        OLD.name,
        new.name,
    )
    assert (
        decision.configmap is not None and decision.configmap["metadata"]["name"] == f"svc-{OLD.name}-inplace"
    )
    assert set(decision.keep) == {OLD.name, new.name}
    # one of the 2 pods at a time (was: both at once): a pod leaves the Service while it reloads
    assert decision.plan.annotations == {f"svc-{OLD.name}-0": new.name}


def gpu_model_added(spec: Spec) -> None:
    config(spec, instanceGroup=[{"kind": "KIND_GPU", "count": 1}])
    gpu(spec)


def unopted_change(spec: Spec) -> None:
    spec.pop("rollout")
    config(spec, maxBatchSize=16)


def gpu_base() -> Spec:
    spec = base_spec()
    gpu(spec)
    for model in spec["models"]:
        model["config"]["instanceGroup"] = [{"kind": "KIND_AUTO", "count": 1}]
    return spec


@pytest.mark.parametrize(
    ("old_spec", "change", "reason"),
    [
        (
            gpu_base,
            lambda s: config(s, maxBatchSize=16),
            "model add: on a GPU, a reload holds the old and the new copy",
        ),
        (
            base_spec,
            gpu_model_added,
            "spec.resources changed",
        ),
        (
            base_spec,
            lambda s: config(s, backend="onnxruntime", instanceGroup=[{"kind": "KIND_CPU", "count": 1}]),
            "model add: backend changed (python -> onnxruntime)",
        ),
        (base_spec, lambda s: s.__setitem__("env", [{"name": "X", "value": "1"}]), "spec.env changed"),
        (base_spec, lambda s: s.__setitem__("image", "tritonserver:next"), "spec.image changed"),
    ],
)
def test_what_in_place_cannot_take_goes_to_new_pods_with_its_reasons(
    old_spec: Callable[[], Spec], change: Callable[[Spec], None], reason: str
) -> None:
    old = Revision(old_spec(), FILES)
    spec = old_spec()
    change(spec)
    new = Revision(spec, FILES)
    decision, plan = decide_with_plan(old, new)
    assert decision.engine_revision == new.name  # new pods
    assert decision.kind is not None and decision.kind[0] == NEW_PODS and reason in decision.kind[1], (
        decision.kind
    )
    assert decision.plan is None and decision.configmap is None
    # the in-place mode's Event, then the rollout of new pods it leaves to the Deployments
    assert [e.reason for e in plan.events] == ["NewPodsRequired", cond.ROLLOUT_STARTED]
    # said once: the pass after (its status written) says it no more
    _, again = decide_with_plan(old, new, {"rolloutKind": NEW_PODS, "rolloutKindReason": decision.kind[1]})
    assert [e.reason for e in again.events] == [cond.ROLLOUT_STARTED]


def test_a_sequence_model_goes_to_new_pods_even_on_cpu() -> None:
    old = Revision(edit(lambda s: config(s, sequenceBatching={})), FILES)
    new = Revision(edit(lambda s: config(s, sequenceBatching={}, maxBatchSize=4)), FILES)
    decision = decide(old, new)
    assert decision.kind is not None and "sequence batching" in decision.kind[1]


def test_files_that_do_not_fit_one_configmap_go_to_new_pods() -> None:
    files = {f"sub/1/part-{i:05d}.bin": f"{i}".encode() * 3 for i in range(2500)}
    old = Revision(base_spec(), {**FILES, **files})
    new = Revision(base_spec(), {**FILES, **files, "add/1/model.py": b"add v2"})
    decision = decide(old, new)
    assert decision.kind == (NEW_PODS, f"new pods: {TOO_LARGE}")
    assert decision.engine_revision == new.name


@pytest.mark.parametrize(
    ("previous", "why"),
    [
        ({"canaryRevision": "c0ffee"}, "a new-pods rollout is in flight"),
        ({"pinnedRevision": "c0ffee", "pinnedFor": "x"}, "an undo pin holds"),
    ],
)
def test_no_in_place_decision_while_new_pods_roll_or_an_undo_holds(
    previous: dict[str, Any], why: str
) -> None:
    new = Revision(edit(lambda s: config(s, maxBatchSize=16)), FILES)
    decision = decide(OLD, new, previous)
    assert decision.engine_revision == new.name and decision.plan is None, why


def test_without_the_opt_in_nothing_changes() -> None:
    old = Revision(edit(lambda s: s.pop("rollout")), FILES)
    new = Revision(edit(unopted_change), FILES)
    decision = decide(old, new)
    assert decision == InPlaceDecision(engine_revision=new.name)


def test_the_first_revision_is_deployed_as_ever() -> None:
    nothing = InPlaceContext(
        previous={},
        configmaps=[],
        revisions={},
        pods=(),
        agents={},
        requests=(),
    )
    decision = decide_in_place(
        OLD.ts, SETTINGS, OLD.name, nothing, configs=OLD.configs, manifest_json=OLD.manifest
    )
    assert decision.engine_revision == OLD.name and decision.plan is None


def test_a_spec_the_pods_already_serve_in_place_keeps_the_host() -> None:
    new = Revision(edit(lambda s: config(s, maxBatchSize=16)), FILES)
    in_place = {"host": OLD.name, "stable": new.name}
    decision = decide(OLD, new, {"servedRevision": new.name, "inPlace": in_place})
    assert decision.engine_revision == OLD.name
    assert decision.plan is not None and decision.plan.state is not None and decision.plan.state.next is None
    assert decision.served == new.name


def test_the_configmap_the_pods_follow_is_never_deleted_for_want_of_a_revisions_files() -> None:
    new = Revision(edit(lambda s: config(s, maxBatchSize=16)), FILES)
    started = decide(OLD, new)
    assert started.configmap is not None and started.plan is not None and started.plan.state is not None
    stored = copy.deepcopy(started.configmap)
    status = {"stableRevision": OLD.name, "inPlace": started.plan.state.to_status()}
    pods = [PodState(name=f"svc-{OLD.name}-{i}", revision=OLD.name, ready=True) for i in range(2)]
    ctx = InPlaceContext(
        previous=status,
        configmaps=[stored, *new.configmaps],  # the served revision's own ConfigMap is gone
        revisions={OLD.name: RevisionState(spec_replicas=2, replicas=2, ready_replicas=2)},
        pods=pods,
        agents={},
        requests=(),
    )
    decision = decide_in_place(
        new.ts, SETTINGS, new.name, ctx, configs=new.configs, manifest_json=new.manifest
    )
    assert decision.configmap is not None and decision.configmap["data"] == stored["data"]

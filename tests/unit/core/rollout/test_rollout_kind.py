"""core.rollout.rollout_kind: which changes between two revisions the running tritonservers can take in
place."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from triton_operator.core.objects.builders import pod_template_inputs
from triton_operator.core.repository.manifest import (
    Manifest,
    ManifestEntry,
    ManifestModel,
    StoreRef,
    VersionPolicy,
)
from triton_operator.core.rollout.rollout_kind import InPlace, NewPods, RevisionParts, describe, rollout_kind
from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import TritonService
from triton_operator.settings import Settings

Files = Mapping[str, Mapping[str, bytes]]  # model -> path under the model folder -> bytes


def _vector(name: str) -> dict[str, Any]:
    return {"name": name, "dataType": "TYPE_FP32", "dims": [4]}


def _python(**extra: Any) -> dict[str, Any]:
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [_vector("INPUT0")],
        "output": [_vector("OUTPUT0")],
        "instanceGroup": [{"kind": "KIND_CPU", "count": 1}],
        **extra,
    }


ENSEMBLE = {
    "platform": "ensemble",
    "maxBatchSize": 8,
    "input": [_vector("X")],
    "output": [_vector("Y")],
    "ensembleScheduling": {
        "step": [
            {
                "modelName": "scale",
                "modelVersion": "-1",
                "inputMap": {"INPUT0": "X"},
                "outputMap": {"OUTPUT0": "s"},
            },
            {
                "modelName": "offset",
                "modelVersion": "-1",
                "inputMap": {"INPUT0": "s"},
                "outputMap": {"OUTPUT0": "Y"},
            },
        ]
    },
}

BASE_SPEC: dict[str, Any] = {
    "repository": {"uri": "s3://models/repo", "credentialsSecret": "store"},
    "models": [
        {"name": "adder", "config": _python()},
        {"name": "classifier", "config": _python()},
        {"name": "scale", "config": _python()},
        {"name": "offset", "config": _python()},
        {"name": "pipeline", "config": ENSEMBLE},
    ],
}

BASE_FILES: dict[str, dict[str, bytes]] = {
    "adder": {"1/model.py": b"add v1"},
    "classifier": {"1/model.py": b"classify v1", "labels.txt": b"cat\ndog\n"},
    "scale": {"1/model.py": b"scale v1"},
    "offset": {"1/model.py": b"offset v1"},
    "pipeline": {},
}


def manifest(files: Files, *, pinned: bool = True) -> Manifest:
    entries = []
    models = []
    for model, objects in sorted(files.items()):
        versions = sorted({path.split("/", 1)[0] for path in objects if "/" in path} or {"1"})
        models.append(ManifestModel(model, model, VersionPolicy(), tuple(versions)))
        for path, data in sorted(objects.items()):
            digest = hashlib.sha256(data).hexdigest()
            entries.append(
                ManifestEntry(
                    f"repo/{model}/{path}", f"{model}/{path}", len(data), "sha256", digest, digest[:8]
                )
            )
    return Manifest(StoreRef("s3://models/repo"), tuple(models), tuple(entries) if pinned else (), pinned)


def parts(spec: Mapping[str, Any], files: Files | None = None, *, pinned: bool = True) -> RevisionParts:
    """What a revision of ``spec`` serving ``files`` is made of, rendered as the operator renders it."""
    ts = TritonService.model_validate(
        {"metadata": {"name": "svc", "namespace": "ns"}, "spec": copy.deepcopy(spec)}
    )
    names = {m.name for m in ts.spec.models}
    selected = {k: v for k, v in (files if files is not None else BASE_FILES).items() if k in names}
    return RevisionParts(
        pod=pod_template_inputs(ts, Settings()),
        configs={m.name: build_config_pbtxt(m.name, m.config) for m in ts.spec.models},
        model_configs={m.name: m.config for m in ts.spec.models},
        manifest=manifest(selected, pinned=pinned),
    )


def changed(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    edit(spec)
    return spec


def model(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(m for m in spec["models"] if m["name"] == name)
    return found


def with_files(**models: dict[str, bytes]) -> dict[str, dict[str, bytes]]:
    return {**BASE_FILES, **models}


OLD = parts(BASE_SPEC)


# ---------------------------------------------------------------- pod changes: new pods


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(spec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = spec
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (_set("image", "registry.example/tritonserver:next"), "spec.image changed"),
        (_set("resources.gpus", 1), "spec.resources changed"),
        (_set("resources.memory", "8Gi"), "spec.resources changed"),
        (_set("serverArgs", ["--log-verbose=1"]), "spec.serverArgs changed"),
        (_set("env", [{"name": "X", "value": "1"}]), "spec.env changed"),
        (_set("volumes", [{"name": "extra", "emptyDir": {}}]), "spec.volumes changed"),
        (_set("volumeMounts", [{"name": "extra", "mountPath": "/extra"}]), "spec.volumeMounts changed"),
        (_set("securityContext", {"runAsUser": 0}), "spec.securityContext changed"),
        (_set("podSecurityContext", {"runAsUser": 0}), "spec.podSecurityContext changed"),
        (_set("shmSize", "4Gi"), "spec.shmSize changed"),
        (_set("nodeSelector", {"gpu": "a100"}), "spec.nodeSelector changed"),
        (_set("podAnnotations", {"a": "b"}), "spec.podAnnotations changed"),
        (_set("repository.uri", "s3://other/repo"), "spec.repository changed"),
        (_set("repository.credentialsSecret", "other"), "spec.repository changed"),
        (_set("startupTimeoutSeconds", 60), "startupTimeoutSeconds changed"),
    ],
)
def test_a_change_to_the_pod_needs_new_pods(edit: Callable[[dict[str, Any]], None], reason: str) -> None:
    kind = rollout_kind(OLD, parts(changed(edit)))
    assert isinstance(kind, NewPods)
    assert reason in kind.reasons


def test_the_operator_default_image_counts_as_the_image() -> None:
    ts = TritonService.model_validate({"metadata": {"name": "svc"}, "spec": BASE_SPEC})
    new = RevisionParts(
        pod_template_inputs(ts, Settings(default_image="tritonserver:next")),
        OLD.configs,
        OLD.model_configs,
        OLD.manifest,
    )
    assert rollout_kind(OLD, new) == NewPods(("spec.image changed",))


@pytest.mark.parametrize(
    "edit",
    [
        _set("replicas", 5),
        _set("rollout", {"strategy": "BlueGreen"}),
        _set("service", {"type": "NodePort"}),
        _set("repository.pollIntervalSeconds", 10),
    ],
)
def test_what_the_revision_does_not_hash_is_no_change(edit: Callable[[dict[str, Any]], None]) -> None:
    kind = rollout_kind(OLD, parts(changed(edit)))
    assert isinstance(kind, InPlace) and kind.nothing_to_do


def test_every_reason_is_given_not_only_the_first() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["image"] = "tritonserver:next"
        spec["env"] = [{"name": "X", "value": "1"}]
        model(spec, "adder")["config"]["backend"] = "onnxruntime"

    kind = rollout_kind(OLD, parts(changed(edit)))
    assert isinstance(kind, NewPods)
    assert kind.reasons == (
        "spec.image changed",
        "spec.env changed",
        "model adder: backend changed (python -> onnxruntime)",
    )


# ---------------------------------------------------------------- model changes in place


def test_a_new_version_of_one_model_is_fetched_and_only_that_model_reloads() -> None:
    new_files = with_files(adder={"2/model.py": b"add v2, longer"})
    kind = rollout_kind(OLD, parts(BASE_SPEC, new_files))
    assert isinstance(kind, InPlace)
    assert (kind.models_changed, kind.models_added, kind.models_removed) == (("adder",), (), ())
    assert [e.dest for e in kind.objects_to_fetch] == ["adder/2/model.py"]
    assert kind.objects_to_remove == ("adder/1/model.py",)
    assert kind.bytes == len(b"add v2, longer")


def test_a_file_rewritten_under_the_same_name_is_fetched() -> None:
    kind = rollout_kind(
        OLD,
        parts(
            BASE_SPEC, with_files(classifier={"1/model.py": b"classify v1", "labels.txt": b"cat\ndog\nemu\n"})
        ),
    )
    assert isinstance(kind, InPlace)
    assert kind.models_changed == ("classifier",)
    assert [e.dest for e in kind.objects_to_fetch] == ["classifier/labels.txt"]
    assert kind.objects_to_remove == ()  # the same destination, replaced


@pytest.mark.parametrize(
    "edit",
    [
        lambda cfg: cfg.update(maxBatchSize=16),
        lambda cfg: cfg.update(dynamicBatching={"maxQueueDelayMicroseconds": "100"}),
        lambda cfg: cfg.update(parameters={"factor": {"stringValue": "3"}}),
        lambda cfg: cfg.update(versionPolicy={"latest": {"numVersions": 2}}),
        lambda cfg: cfg.update(responseCache={"enable": True}),
    ],
)
def test_a_config_change_of_a_cpu_model_reloads_that_model_in_place(
    edit: Callable[[dict[str, Any]], None],
) -> None:
    kind = rollout_kind(OLD, parts(changed(lambda spec: edit(model(spec, "adder")["config"]))))
    assert isinstance(kind, InPlace)
    assert kind.models_changed == ("adder",) and kind.objects_to_fetch == () and kind.bytes == 0


def test_instance_counts_only_on_a_gpu_need_new_pods() -> None:
    """Documented as an update of instances, but tritonserver 2.51 reloads the whole model for it
    (tests/triton/test_inplace_reload.py): on a GPU, two copies at once."""

    def gpu(count: int) -> Callable[[dict[str, Any]], None]:
        def edit(spec: dict[str, Any]) -> None:
            spec["resources"] = {"gpus": 1}
            model(spec, "adder")["config"]["instanceGroup"] = [{"kind": "KIND_GPU", "count": count}]

        return edit

    kind = rollout_kind(parts(changed(gpu(1))), parts(changed(gpu(3))))
    assert kind == NewPods(
        ("model adder: on a GPU, a reload holds the old and the new copy in GPU memory at once",)
    )


@pytest.mark.parametrize(
    "groups",
    [
        [{"kind": "KIND_CPU", "count": 2}],
        [{"kind": "KIND_CPU", "count": 1}, {"kind": "KIND_CPU", "count": 1}],
        [{"kind": "KIND_CPU", "count": 1, "rateLimiter": {"priority": 2}}],
    ],
)
def test_an_instance_group_change_of_a_cpu_model_reloads_it_in_place(groups: list[dict[str, Any]]) -> None:
    kind = rollout_kind(
        OLD, parts(changed(lambda spec: model(spec, "adder")["config"].update(instanceGroup=groups)))
    )
    assert isinstance(kind, InPlace) and kind.models_changed == ("adder",)


def test_a_model_added_and_one_removed_load_and_unload_in_place() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["models"] = [m for m in spec["models"] if m["name"] != "classifier"]
        spec["models"].append({"name": "tokenizer", "config": _python()})

    new_files = with_files(tokenizer={"3/model.py": b"tok", "3/vocab.txt": b"a b c"})
    kind = rollout_kind(OLD, parts(changed(edit), new_files))
    assert isinstance(kind, InPlace)
    assert (kind.models_changed, kind.models_added, kind.models_removed) == (
        (),
        ("tokenizer",),
        ("classifier",),
    )
    assert [e.dest for e in kind.objects_to_fetch] == ["tokenizer/3/model.py", "tokenizer/3/vocab.txt"]
    assert kind.objects_to_remove == ("classifier/1/model.py", "classifier/labels.txt")
    assert kind.bytes == 3 + 5


def test_unchanged_models_are_left_out() -> None:
    kind = rollout_kind(OLD, parts(BASE_SPEC, with_files(offset={"1/model.py": b"offset v2"})))
    assert isinstance(kind, InPlace)
    assert kind.models_changed == ("offset",)
    assert {e.dest.split("/")[0] for e in kind.objects_to_fetch} == {"offset"}


def test_the_same_revision_is_nothing_to_do() -> None:
    kind = rollout_kind(OLD, parts(BASE_SPEC))
    assert kind == InPlace() and kind.nothing_to_do
    assert describe(kind) == "in place: nothing to do"


# ---------------------------------------------------------------- model changes that need new pods


@pytest.mark.parametrize(
    ("key", "old", "new"),
    [
        ("backend", "python", "onnxruntime"),
        ("backend", "python", None),
        ("platform", None, "onnxruntime_onnx"),
    ],
)
def test_a_backend_or_platform_change_needs_new_pods(key: str, old: str | None, new: str | None) -> None:
    def edit(spec: dict[str, Any]) -> None:
        cfg = model(spec, "adder")["config"]
        cfg.pop(key, None)
        if new is not None:
            cfg[key] = new

    kind = rollout_kind(OLD, parts(changed(edit)))
    assert isinstance(kind, NewPods)
    assert f"model adder: {key} changed ({old or '-'} -> {new or '-'})" in kind.reasons


@pytest.mark.parametrize(
    ("gpus", "groups"),
    [
        (1, [{"kind": "KIND_GPU", "count": 1}]),
        (1, None),  # no instance group: Triton's AUTO puts it on the GPU it sees
        (1, [{"kind": "KIND_AUTO"}]),
        (0, [{"kind": "KIND_GPU", "count": 1, "gpus": [0]}]),
    ],
)
def test_reloading_a_gpu_model_needs_new_pods(gpus: int, groups: list[dict[str, Any]] | None) -> None:
    def spec_with(data: bytes) -> RevisionParts:
        spec = copy.deepcopy(BASE_SPEC)
        if gpus:
            spec["resources"] = {"gpus": gpus}
        cfg = model(spec, "adder")["config"]
        cfg.pop("instanceGroup")
        if groups is not None:
            cfg["instanceGroup"] = groups
        return parts(spec, with_files(adder={"1/model.py": data}))

    kind = rollout_kind(spec_with(b"v1"), spec_with(b"v2"))
    assert isinstance(kind, NewPods)
    assert kind.reasons == (
        "model adder: on a GPU, a reload holds the old and the new copy in GPU memory at once",
    )


def test_a_cpu_model_in_a_pod_with_gpus_reloads_in_place() -> None:
    def spec_with(data: bytes) -> RevisionParts:
        return parts(changed(_set("resources", {"gpus": 1})), with_files(adder={"1/model.py": data}))

    kind = rollout_kind(spec_with(b"v1"), spec_with(b"v2"))
    assert isinstance(kind, InPlace) and kind.models_changed == ("adder",)


def test_a_model_added_on_a_gpu_needs_new_pods() -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["resources"] = {"gpus": 1}
        spec["models"].append({"name": "llm", "config": _python(instanceGroup=[{"kind": "KIND_GPU"}])})

    old = parts(changed(_set("resources", {"gpus": 1})))
    kind = rollout_kind(old, parts(changed(edit), with_files(llm={"1/model.py": b"big"})))
    assert isinstance(kind, NewPods)
    assert kind.reasons == ("model llm: added on a GPU the running pods' memory was not planned for",)


def test_a_sequence_model_reload_needs_new_pods() -> None:
    sequence = _python(sequenceBatching={"maxSequenceIdleMicroseconds": "1000000"})

    def spec_with(data: bytes) -> RevisionParts:
        return parts(
            changed(lambda spec: model(spec, "adder").update(config=sequence)),
            with_files(adder={"1/model.py": data}),
        )

    kind = rollout_kind(spec_with(b"v1"), spec_with(b"v2"))
    assert isinstance(kind, NewPods)
    assert kind.reasons == (
        "model adder: sequence batching, and a reload does not keep in-flight sequences on their instance",
    )


def test_an_ensemble_and_its_step_changing_together_need_new_pods() -> None:
    def edit(spec: dict[str, Any]) -> None:
        model(spec, "pipeline")["config"]["maxBatchSize"] = 4
        model(spec, "scale")["config"]["maxBatchSize"] = 4

    kind = rollout_kind(OLD, parts(changed(edit)))
    assert kind == NewPods(("ensemble pipeline and its step scale change together",))


def test_a_step_alone_changes_in_place_and_names_its_ensemble() -> None:
    kind = rollout_kind(OLD, parts(BASE_SPEC, with_files(scale={"1/model.py": b"scale v2"})))
    assert isinstance(kind, InPlace)
    assert kind.models_changed == ("scale",) and kind.ensembles_affected == ("pipeline",)


def test_an_ensemble_alone_changes_in_place() -> None:
    kind = rollout_kind(
        OLD, parts(changed(lambda spec: model(spec, "pipeline")["config"].update(maxBatchSize=4)))
    )
    assert isinstance(kind, InPlace)
    assert kind.models_changed == ("pipeline",) and kind.ensembles_affected == ()


@pytest.mark.parametrize(("old_pinned", "new_pinned"), [(False, False), (True, False), (False, True)])
def test_an_unpinned_repository_needs_new_pods(old_pinned: bool, new_pinned: bool) -> None:
    kind = rollout_kind(parts(BASE_SPEC, pinned=old_pinned), parts(BASE_SPEC, pinned=new_pinned))
    assert isinstance(kind, NewPods)
    assert kind.reasons == (
        "the repository is not pinned (pvc:// or not listed yet): no object list to apply",
    )


def test_a_revision_with_no_manifest_yet_needs_new_pods() -> None:
    new = RevisionParts(OLD.pod, OLD.configs, OLD.model_configs, None)
    assert isinstance(rollout_kind(OLD, new), NewPods)


def test_describe_names_the_kind_and_what() -> None:
    kind = rollout_kind(OLD, parts(BASE_SPEC, with_files(adder={"2/model.py": b"v2"})))
    assert describe(kind) == "in place: reload adder (1 objects, 2 bytes to fetch)"
    assert (
        describe(NewPods(("spec.image changed", "spec.env changed")))
        == "new pods: spec.image changed; spec.env changed"
    )

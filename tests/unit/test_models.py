"""The TritonService API: valid specs parse, invalid ones fail with errors at JSON paths."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from triton_operator.core.spec.validation.errors import SpecError, format_errors
from triton_operator.core.spec.validation.server_args import (
    ALLOWED_SERVER_FLAGS,
    OPERATOR_OWNED_FLAGS,
    server_args_errors,
)
from triton_operator.core.spec.validation.spec import check_spec
from triton_operator.models import MODEL_PATH_PATTERN, Resources, TritonService, TritonServiceSpec, field_path

Spec = dict[str, Any]

DESIGN_SPEC: Spec = {
    "image": "nvcr.io/nvidia/tritonserver:25.01-py3",
    "replicas": 2,
    "resources": {"gpus": 1, "gpuResourceName": "nvidia.com/gpu", "cpu": "4", "memory": "16Gi"},
    "shmSize": "1Gi",
    "serverArgs": ["--log-verbose=0"],
    "repository": {
        "uri": "s3://models/prod",
        "endpoint": "http://minio.minio:9000",
        "credentialsSecret": "models-s3",
        "pollIntervalSeconds": 60,
    },
    "models": [
        {
            "name": "resnet50",
            "path": "resnet50",
            "config": {
                "platform": "onnxruntime_onnx",
                "maxBatchSize": 32,
                "versionPolicy": {"specific": {"versions": ["3"]}},
                "dynamicBatching": {"preferredBatchSize": [8, 16], "maxQueueDelayMicroseconds": "100"},
                "instanceGroup": [{"kind": "KIND_GPU", "count": 2}],
            },
        }
    ],
    "rollout": {
        "strategy": "Canary",
        "steps": [{"setWeight": 10}, {"pause": {"durationSeconds": 60}}, {"setWeight": 50}, {"pause": {}}],
        "progressDeadlineSeconds": 600,
        "trafficRouting": {"gatewayAPI": {"httpRoute": "resnet", "grpcRoute": "resnet-grpc"}},
    },
}


def tensor(name: str, dims: list[int], data_type: str = "TYPE_FP32") -> dict[str, Any]:
    return {"name": name, "dataType": data_type, "dims": dims}


def ensemble_spec() -> Spec:
    """A valid spec: preprocess (python) -> net (onnx) wrapped in the ensemble 'pipeline'."""
    return {
        "repository": {"uri": "gs://bucket/models"},
        "resources": {"gpus": 2},
        "models": [
            {
                "name": "preprocess",
                "config": {
                    "backend": "python",
                    "maxBatchSize": 8,
                    "input": [tensor("raw", [-1], "TYPE_UINT8")],
                    "output": [tensor("pixels", [3, 8, 8])],
                    "instanceGroup": [{"kind": "KIND_CPU", "count": 2}],
                },
            },
            {
                "name": "net",
                "config": {
                    "platform": "onnxruntime_onnx",
                    "maxBatchSize": 8,
                    "input": [{**tensor("x", [3, 8, 8]), "format": "FORMAT_NCHW"}],
                    "output": [tensor("y", [10])],
                    "dynamicBatching": {"preferredBatchSize": [4, 8], "maxQueueDelayMicroseconds": 100},
                    "instanceGroup": [{"kind": "KIND_GPU", "count": 1, "gpus": [1]}],
                },
            },
            {
                "name": "pipeline",
                "config": {
                    "platform": "ensemble",
                    "maxBatchSize": 8,
                    "input": [tensor("IMAGE", [-1], "TYPE_UINT8")],
                    "output": [tensor("SCORES", [10])],
                    "ensembleScheduling": {
                        "step": [
                            {
                                "modelName": "preprocess",
                                "inputMap": {"raw": "IMAGE"},
                                "outputMap": {"pixels": "px"},
                            },
                            {"modelName": "net", "inputMap": {"x": "px"}, "outputMap": {"y": "SCORES"}},
                        ]
                    },
                },
            },
        ],
    }


def errors_of(raw: Spec) -> list[SpecError]:
    _, errors = check_spec(raw)
    return errors


@pytest.mark.parametrize("raw", [DESIGN_SPEC, ensemble_spec()], ids=["design", "ensemble"])
def test_valid_specs_have_no_errors(raw: Spec) -> None:
    spec, errors = check_spec(raw)
    assert errors == []
    assert spec is not None
    # the API form parses back to the same spec
    assert TritonServiceSpec.model_validate(spec.to_api()) == spec
    assert spec.to_api()["models"] == raw["models"]


def test_to_api_leaves_unset_fields_out_and_uses_camel_case() -> None:
    spec = TritonServiceSpec.model_validate(
        {"repository": {"uri": "pvc://claim/models"}, "models": [{"name": "m"}]}
    )
    api = spec.to_api()
    assert "image" not in api and "affinity" not in api
    assert api["repository"] == {"uri": "pvc://claim/models", "pollIntervalSeconds": 60}
    assert "startupTimeoutSeconds" not in api and "progressDeadlineSeconds" not in api["rollout"]
    assert spec.models[0].folder == "m"


@pytest.mark.parametrize(
    ("startup", "deadline", "effective"),
    [
        (None, None, (1800, 2400)),  # both unset: 30 min to load, 10 more to schedule and download
        (None, 600, (600, 600)),  # the probe gives up when the rollout does
        (120, None, (120, 720)),
        (300, 900, (300, 900)),
    ],
)
def test_startup_timeout_and_progress_deadline_follow_each_other(
    startup: int | None, deadline: int | None, effective: tuple[int, int]
) -> None:
    raw: dict[str, Any] = {"repository": {"uri": "pvc://claim/models"}, "models": [{"name": "m"}]}
    if startup is not None:
        raw["startupTimeoutSeconds"] = startup
    if deadline is not None:
        raw["rollout"] = {"progressDeadlineSeconds": deadline}
    spec = TritonServiceSpec.model_validate(raw)
    assert (spec.startup_timeout(), spec.progress_deadline()) == effective


def test_whole_object_parses_with_name_and_namespace() -> None:
    ts = TritonService.model_validate(
        {
            "metadata": {"name": "resnet", "namespace": "ml"},
            "spec": DESIGN_SPEC,
            "status": {"canaryWeight": 10},
        }
    )
    assert (ts.name, ts.namespace, ts.status.canary_weight) == ("resnet", "ml", 10)


@pytest.mark.parametrize(("given", "expected"), [(4, "4"), (0.5, "0.5"), ("500m", "500m"), ("16Gi", "16Gi")])
def test_quantities_accept_numbers(given: Any, expected: str) -> None:
    assert Resources.model_validate({"cpu": given}).cpu == expected


@pytest.mark.parametrize(
    ("loc", "prefix", "expected"),
    [
        (("models", 0, "config"), "spec", "spec.models[0].config"),
        (("models", 2, "name"), "", "models[2].name"),
        (("nodeSelector", "kubernetes.io/arch"), "spec", "spec.nodeSelector[kubernetes.io/arch]"),
        ((), "spec", "spec"),
    ],
)
def test_field_path(loc: tuple[int | str, ...], prefix: str, expected: str) -> None:
    assert field_path(loc, prefix) == expected


@pytest.mark.parametrize(
    "path", ["resnet", "a/b", "a/b/", "v1.0/model", "_x", "-x", "models/resnet-50_v2", "a..b"]
)
def test_model_paths_that_are_accepted(path: str) -> None:
    assert re.match(MODEL_PATH_PATTERN, path)
    assert errors_of({**ensemble_spec(), "models": [{"name": "m", "path": path}]}) == []


@pytest.mark.parametrize(
    "path", ["../x", "a/../b", "/abs", "a//b", ".hidden", "a/./b", "", "a b", "..", "a\\b"]
)
def test_model_paths_that_escape_or_are_odd_are_refused(path: str) -> None:
    errors = errors_of({**ensemble_spec(), "models": [{"name": "m", "path": path}]})
    assert [e.field for e in errors] == ["spec.models[0].path"]


def _set(path: str, value: Any) -> Callable[[Spec], None]:
    def change(raw: Spec) -> None:
        *parents, last = path.split(".")
        node: Any = raw
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        if value is _DELETE:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return change


_DELETE = object()

# (id, change to the design spec, field of the one error, a fragment of its message)
SCHEMA_ERRORS: list[tuple[str, Callable[[Spec], None], str, str]] = [
    ("no-repository", _set("repository", _DELETE), "spec.repository", "is required"),
    ("no-models", _set("models", []), "spec.models", "at least 1"),
    ("unknown-field", _set("replicaz", 3), "spec.replicaz", "unknown field"),
    ("unknown-nested", _set("repository.bucket", "x"), "spec.repository.bucket", "unknown field"),
    ("bad-uri", _set("repository.uri", "ftp://host/x"), "spec.repository.uri", "pattern"),
    ("negative-replicas", _set("replicas", -1), "spec.replicas", "greater than or equal to 0"),
    ("bad-quantity", _set("resources.memory", "lots"), "spec.resources.memory", "pattern"),
    ("model-name", _set("models.0.name", "a b"), "spec.models[0].name", "pattern"),
    ("long-model-name", _set("models.0.name", "m" * 129), "spec.models[0].name", "at most 128"),
    (
        "duplicate-names",
        _set("models", [{"name": "a"}, {"name": "b"}, {"name": "a"}]),
        "spec.models",
        "models[2].name: duplicate model name 'a' (also models[0])",
    ),
    ("config-not-object", _set("models.0.config", ["x"]), "spec.models[0].config", "dictionary"),
    ("strategy", _set("rollout.strategy", "Linear"), "spec.rollout.strategy", "Canary"),
    (
        "weight",
        _set("rollout.steps.0.setWeight", 101),
        "spec.rollout.steps[0].setWeight",
        "less than or equal to 100",
    ),
    (
        "pause-past-a-year",  # 3e11 s overflowed every reconcile's datetime sum (issue 22 item 11)
        _set("rollout.steps.1.pause.durationSeconds", 300_000_000_000),
        "spec.rollout.steps[1].pause.durationSeconds",
        "less than or equal to 31536000",
    ),
    (
        "two-choices-in-a-step",
        _set("rollout.steps.0", {"setWeight": 10, "pause": {}}),
        "spec.rollout.steps[0]",
        "exactly one of setWeight, pause, setHeaderRoute",
    ),
    ("empty-step", _set("rollout.steps.1", {}), "spec.rollout.steps[1]", "exactly one of"),
    (
        "header-value",
        _set(
            "rollout.steps.0",
            {
                "setHeaderRoute": {
                    "name": "ab",
                    "match": [{"headerName": "x", "headerValue": {"exact": "1", "regex": "1"}}],
                }
            },
        ),
        "spec.rollout.steps[0].setHeaderRoute.match[0].headerValue",
        "exactly one of exact, prefix, regex",
    ),
    (
        "node-selector",
        _set("nodeSelector", {"kubernetes.io/arch": 1}),
        "spec.nodeSelector[kubernetes.io/arch]",
        "string",
    ),
    ("pull-policy", _set("imagePullPolicy", "Sometimes"), "spec.imagePullPolicy", "Always"),
    (
        "secret-name",
        _set("repository.credentialsSecret", "Secret_1"),
        "spec.repository.credentialsSecret",
        "pattern",
    ),
]


@pytest.mark.parametrize(
    ("change", "field", "fragment"), [c[1:] for c in SCHEMA_ERRORS], ids=[c[0] for c in SCHEMA_ERRORS]
)
def test_schema_errors_name_the_field(change: Callable[[Spec], None], field: str, fragment: str) -> None:
    raw = copy.deepcopy(DESIGN_SPEC)
    change(raw)
    spec, errors = check_spec(raw)
    assert spec is None
    assert [e.field for e in errors] == [field], errors
    assert fragment in errors[0].message


def _config(model: int, path: str, value: Any) -> Callable[[Spec], None]:
    return _set(f"models.{model}.config.{path}", value)


def _both(*changes: Callable[[Spec], None]) -> Callable[[Spec], None]:
    def change(raw: Spec) -> None:
        for c in changes:
            c(raw)

    return change


CYCLE = _both(
    _config(1, "platform", "ensemble"),
    _config(1, "dynamicBatching", _DELETE),
    _config(1, "instanceGroup", _DELETE),
    _config(
        1,
        "ensembleScheduling",
        {"step": [{"modelName": "pipeline", "inputMap": {"IMAGE": "x"}, "outputMap": {"SCORES": "y"}}]},
    ),
)

# (id, change to ensemble_spec(), field of the one error, a fragment of its message)
SEMANTIC_ERRORS: list[tuple[str, Callable[[Spec], None], str, str]] = [
    ("server-port", _set("serverArgs", ["--http-port=9000"]), "spec.serverArgs[0]", "set by the operator"),
    (
        "server-repo",
        _set("serverArgs", ["--log-info=1", "--model-repository", "/x"]),
        "spec.serverArgs[1]",
        "/models",
    ),
    (
        "server-unknown",
        _set("serverArgs", ["--make-fast=1"]),
        "spec.serverArgs[0]",
        "not an allowed tritonserver flag",
    ),
    ("server-bare-value", _set("serverArgs", ["verbose"]), "spec.serverArgs[0]", "is not a --flag"),
    ("server-short-flag", _set("serverArgs", ["-v"]), "spec.serverArgs[0]", "is not a --flag"),
    ("config-unknown", _config(0, "maxBatchSise", 8), "spec.models[0].config.maxBatchSise", "maxBatchSize"),
    (
        "config-type",
        _config(1, "dynamicBatching.maxQueueDelayMicroseconds", "soon"),
        "spec.models[1].config.dynamicBatching.maxQueueDelayMicroseconds",
        "integer",
    ),
    ("config-name", _config(0, "name", "other"), "spec.models[0].config.name", "'other'"),
    (
        "dynamic-without-batch",
        _both(_config(1, "maxBatchSize", 0), _config(2, "maxBatchSize", 0)),
        "spec.models[1].config.dynamicBatching",
        "maxBatchSize > 0",
    ),
    (
        "preferred-too-big",
        _config(1, "dynamicBatching.preferredBatchSize", [4, 16]),
        "spec.models[1].config.dynamicBatching.preferredBatchSize[1]",
        "[1, maxBatchSize=8]",
    ),
    (
        "default-priority",
        _config(1, "dynamicBatching.priorityLevels", 2),
        "spec.models[1].config.dynamicBatching.defaultPriorityLevel",
        "[1, priorityLevels=2]",
    ),
    (
        "priority-key",
        _config(1, "dynamicBatching.priorityQueuePolicy", {"3": {}}),
        "spec.models[1].config.dynamicBatching.priorityQueuePolicy",
        "needs priorityLevels",
    ),
    (
        "priority-key-range",
        _both(
            _config(1, "dynamicBatching.priorityLevels", 2),
            _config(1, "dynamicBatching.defaultPriorityLevel", 1),
            _config(1, "dynamicBatching.priorityQueuePolicy", {"3": {}}),
        ),
        "spec.models[1].config.dynamicBatching.priorityQueuePolicy[3]",
        "[1, 2]",
    ),
    (
        "preserve-ordering",
        _both(
            _config(1, "dynamicBatching.priorityLevels", 2),
            _config(1, "dynamicBatching.defaultPriorityLevel", 1),
            _config(1, "dynamicBatching.preserveOrdering", True),
        ),
        "spec.models[1].config.dynamicBatching.preserveOrdering",
        "one priority level",
    ),
    (
        "oldest-preferred",
        _both(
            _config(1, "dynamicBatching", _DELETE),
            _config(1, "sequenceBatching", {"oldest": {"preferredBatchSize": [16]}}),
        ),
        "spec.models[1].config.sequenceBatching.oldest.preferredBatchSize[0]",
        "maxBatchSize=8",
    ),
    (
        "zero-dim",
        _config(1, "input.0.dims", [3, 0, 8]),
        "spec.models[1].config.input[0].dims[1]",
        "dimension is >= 1",
    ),
    (
        "nchw-dims",
        _config(1, "input.0.dims", [3, 64]),
        "spec.models[1].config.input[0].dims",
        "FORMAT_NCHW needs exactly 3 dims",
    ),
    (
        "reshape-zero",
        _config(1, "output.0.reshape", {"shape": [0]}),
        "spec.models[1].config.output[0].reshape.shape[0]",
        ">= 1",
    ),
    (
        "empty-reshape-no-batch",
        _both(
            _config(0, "maxBatchSize", 0), _config(2, "maxBatchSize", 0), _config(0, "output.0.reshape", {})
        ),
        "spec.models[0].config.output[0].reshape",
        "cannot be empty for a non-batching model",
    ),
    # a batching model's empty reshape is a scalar per batch item: its dims hold one element
    (
        "empty-reshape-batching",
        _both(_config(0, "input.0.dims", [1]), _config(0, "input.0.reshape", {})),
        "",
        "",
    ),
    (
        "duplicate-output",
        _config(1, "output", [tensor("y", [10]), tensor("y", [2])]),
        "spec.models[1].config.output[1].name",
        "duplicate output 'y' (also output[0])",
    ),
    ("unnamed-input", _config(1, "input.0.name", ""), "spec.models[1].config.input[0].name", "is required"),
    (
        "gpu-without-gpus",
        _set("resources.gpus", 0),
        "spec.models[1].config.instanceGroup[0].kind",
        "spec.resources.gpus > 0",
    ),
    (
        "gpu-id-beyond-pod",
        _set("resources.gpus", 1),
        "spec.models[1].config.instanceGroup[0].gpus[0]",
        "no GPU 1",
    ),
    (
        "cpu-with-gpus",
        _config(0, "instanceGroup.0.gpus", [0]),
        "spec.models[0].config.instanceGroup[0].gpus",
        "KIND_CPU",
    ),
    (
        "negative-count",
        _config(0, "instanceGroup.0.count", -1),
        "spec.models[0].config.instanceGroup[0].count",
        "negative",
    ),
    (
        "version-zero",
        _config(1, "versionPolicy", {"specific": {"versions": [0]}}),
        "spec.models[1].config.versionPolicy.specific.versions[0]",
        ">= 1",
    ),
    (
        "versions-empty",
        _config(1, "versionPolicy", {"specific": {}}),
        "spec.models[1].config.versionPolicy.specific.versions",
        "names no version",
    ),
    (
        "step-missing-model",
        _config(2, "ensembleScheduling.step.1.modelName", "nett"),
        "spec.models[2].config.ensembleScheduling.step[1].modelName",
        "'nett' is not in spec.models",
    ),
    (
        "step-self",
        _config(2, "ensembleScheduling.step.1.modelName", "pipeline"),
        "spec.models[2].config.ensembleScheduling.step[1].modelName",
        "cannot call itself",
    ),
    (
        "step-no-model",
        _config(2, "ensembleScheduling.step.1.modelName", _DELETE),
        "spec.models[2].config.ensembleScheduling.step[1].modelName",
        "is required",
    ),
    (
        "no-steps",
        _config(2, "ensembleScheduling.step", []),
        "spec.models[2].config.ensembleScheduling.step",
        "at least one step",
    ),
    ("ensemble-platform", _config(2, "platform", "python"), "spec.models[2].config.platform", "'ensemble'"),
    (
        "ensemble-without-steps",
        _config(2, "ensembleScheduling", _DELETE),
        "spec.models[2].config.ensembleScheduling",
        "is required",
    ),
    (
        "ensemble-instances",
        _config(2, "instanceGroup", [{"kind": "KIND_CPU"}]),
        "spec.models[2].config.instanceGroup",
        "cannot be set for an ensemble",
    ),
    (
        "ensemble-batch",
        _config(2, "maxBatchSize", 16),
        "spec.models[2].config.maxBatchSize",
        "supports at most 8",
    ),
    (
        "ensemble-input-unused",
        _config(2, "input", [tensor("IMAGE", [-1], "TYPE_UINT8"), tensor("EXTRA", [1])]),
        "spec.models[2].config.input[1].name",
        "'EXTRA' is used by no step",
    ),
    (
        "ensemble-output-unwritten",
        _config(2, "output", [tensor("SCORES", [10]), tensor("LOGITS", [10])]),
        "spec.models[2].config.output[1].name",
        "'LOGITS' is written by no step",
    ),
    (
        "ensemble-tensor-twice",
        _config(2, "ensembleScheduling.step.1.outputMap", {"y": "px"}),
        "spec.models[2].config.ensembleScheduling.step[1].outputMap[y]",
        "already written by step 0",
    ),
    (
        "ensemble-tensor-unused",
        _config(2, "ensembleScheduling.step.0.outputMap", {"pixels": "px", "extra": "spare"}),
        "spec.models[2].config.ensembleScheduling.step[0].outputMap",
        "'spare' is used by nothing",
    ),
    (
        "ensemble-empty-input-map",
        _config(2, "ensembleScheduling.step.0.inputMap", {}),
        "spec.models[2].config.ensembleScheduling.step[0].inputMap",
        "is required",
    ),
    ("ensemble-cycle", CYCLE, "spec.models[1].config.ensembleScheduling", "net -> pipeline -> net"),
    (
        "header-route-without-gateway",
        _set(
            "rollout",
            {
                "steps": [
                    {
                        "setHeaderRoute": {
                            "name": "ab",
                            "match": [{"headerName": "x", "headerValue": {"exact": "1"}}],
                        }
                    }
                ]
            },
        ),
        "spec.rollout.steps[0].setHeaderRoute",
        "gatewayAPI",
    ),
]


@pytest.mark.parametrize(
    ("change", "field", "fragment"), [c[1:] for c in SEMANTIC_ERRORS], ids=[c[0] for c in SEMANTIC_ERRORS]
)
def test_semantic_errors_name_the_field(change: Callable[[Spec], None], field: str, fragment: str) -> None:
    raw = ensemble_spec()
    change(raw)
    spec, errors = check_spec(raw)
    assert spec is not None
    if not field:
        assert errors == []
        return
    fields = [e.field for e in errors]
    if " -> " in fragment:  # a cycle is reported once per ensemble in it
        assert field in fields and set(fields) == {field, "spec.models[2].config.ensembleScheduling"}
    else:
        assert fields == [field], errors
    message = next(e.message for e in errors if e.field == field)
    assert fragment in message


def test_an_ensemble_step_reading_a_tensor_nobody_writes() -> None:
    raw = ensemble_spec()
    raw["models"][2]["config"]["ensembleScheduling"]["step"][1]["inputMap"] = {"x": "pxx"}
    _, errors = check_spec(raw)
    fields = {e.field: e.message for e in errors}
    assert (
        "which no ensemble input or step provides"
        in fields["spec.models[2].config.ensembleScheduling.step[1].inputMap"]
    )
    # and consequences are named too: SCORES can no longer be computed, px is read by no one
    assert "cannot be computed" in fields["spec.models[2].config.output[0].name"]
    assert "'px' is used by nothing" in fields["spec.models[2].config.ensembleScheduling.step[0].outputMap"]


def test_every_config_problem_of_every_model_is_reported() -> None:
    raw = ensemble_spec()
    raw["models"][0]["config"]["maxBatchSise"] = 1
    raw["models"][1]["config"]["input"][0]["dataType"] = "TYPE_FLOAT"
    raw["serverArgs"] = ["--grpc-port=1", "--log-verbose=1", "--metrics-port", "2"]
    _, errors = check_spec(raw)
    assert [e.field for e in errors] == [
        "spec.serverArgs[0]",
        "spec.serverArgs[2]",
        "spec.models[0].config.maxBatchSise",
        "spec.models[1].config.input[0].dataType",
    ]
    text = format_errors(errors)
    assert text.splitlines()[0] == f"spec.serverArgs[0]: {errors[0].message}"


@pytest.mark.parametrize("flag", sorted(ALLOWED_SERVER_FLAGS))
def test_allowed_flags_pass_in_both_forms(flag: str) -> None:
    assert server_args_errors([f"--{flag}=1"]) == []
    assert server_args_errors([f"--{flag}", "1"]) == []


@pytest.mark.parametrize("flag", sorted(OPERATOR_OWNED_FLAGS))
def test_operator_owned_flags_are_refused_with_the_reason(flag: str) -> None:
    assert ALLOWED_SERVER_FLAGS.isdisjoint(OPERATOR_OWNED_FLAGS)
    (error,) = server_args_errors(["--log-verbose=1", f"--{flag}=x"], field="args")
    assert error.field == "args[1]"
    assert OPERATOR_OWNED_FLAGS[flag] in error.message


def test_flag_values_are_not_mistaken_for_flags() -> None:
    assert (
        server_args_errors(["--backend-config", "python,shm-default-byte-size=1048576", "--log-verbose=1"])
        == []
    )
    # but a value after a --flag=value is a stray value
    assert [e.field for e in server_args_errors(["--log-verbose=1", "2"])] == ["spec.serverArgs[1]"]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        (
            {"startupTimeoutSeconds": 900, "rollout": {"progressDeadlineSeconds": 600}},
            "spec.rollout.progressDeadlineSeconds",
            "600s is shorter than spec.startupTimeoutSeconds (900s)",
        ),
        (
            {"startupTimeoutSeconds": 60, "rollout": {"unschedulableGraceSeconds": 1000}},
            "spec.rollout.unschedulableGraceSeconds",
            "1000s is longer than the progress deadline (660s)",
        ),
    ],
)
def test_rollout_timing_that_contradicts_itself_is_refused_naming_the_field(
    fields: dict[str, Any], field: str, words: str
) -> None:
    raw: dict[str, Any] = {"repository": {"uri": "pvc://claim/models"}, "models": [{"name": "m"}], **fields}
    errors = errors_of(raw)
    assert [e.field for e in errors] == [field]
    assert words in errors[0].message


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"rollout": {"progressDeadlineSeconds": 600}},  # the startup probe follows it
        {"startupTimeoutSeconds": 600, "rollout": {"progressDeadlineSeconds": 600}},
        {"rollout": {"progressDeadlineSeconds": 300, "unschedulableGraceSeconds": 300}},
        {"rollout": {"progressDeadlineSeconds": 5}},  # the default grace never fires first: fine
    ],
)
def test_consistent_rollout_timing_is_accepted(fields: dict[str, Any]) -> None:
    raw: dict[str, Any] = {"repository": {"uri": "pvc://claim/models"}, "models": [{"name": "m"}], **fields}
    assert errors_of(raw) == []

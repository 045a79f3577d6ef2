"""ModelConfig in the spec (proto3 JSON) -> config.pbtxt -> back, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import (
    build_config_pbtxt,
    config_errors,
    config_to_dict,
    import_config_pbtxt,
    parse_config_pbtxt,
    parse_model_config,
    translate_parse_error,
)

# One config per family of ModelConfig fields, each with a snippet its config.pbtxt must contain.
FAMILIES: list[tuple[str, dict[str, Any], str]] = [
    ("name", {"name": "m"}, 'name: "m"'),
    ("platform", {"platform": "onnxruntime_onnx"}, 'platform: "onnxruntime_onnx"'),
    ("backend", {"backend": "python", "runtime": "model.py"}, 'runtime: "model.py"'),
    ("max-batch-size", {"maxBatchSize": 32}, "max_batch_size: 32"),
    (
        "inputs",
        {
            "input": [
                {"name": "x", "dataType": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, 224, 224]},
                {"name": "mask", "dataType": "TYPE_BOOL", "dims": [-1], "optional": True},
                {"name": "s", "dataType": "TYPE_INT64", "dims": [1], "reshape": {"shape": [1, 1]}},
                {"name": "shape", "dataType": "TYPE_INT32", "dims": [2], "isShapeTensor": True},
                {"name": "ragged", "dataType": "TYPE_FP16", "dims": [-1], "allowRaggedBatch": True},
                {"name": "nl", "dataType": "TYPE_FP16", "dims": [4, 4], "isNonLinearFormatIo": True},
            ]
        },
        "format: FORMAT_NCHW",
    ),
    (
        "outputs",
        {
            "output": [
                {"name": "y", "dataType": "TYPE_FP32", "dims": [1000], "labelFilename": "labels.txt"},
                {"name": "z", "dataType": "TYPE_STRING", "dims": [1], "reshape": {}},
                {"name": "shape", "dataType": "TYPE_INT32", "dims": [2], "isShapeTensor": True},
                {"name": "nl", "dataType": "TYPE_FP16", "dims": [4, 4], "isNonLinearFormatIo": True},
            ]
        },
        'label_filename: "labels.txt"',
    ),
    ("version-latest", {"versionPolicy": {"latest": {"numVersions": 2}}}, "num_versions: 2"),
    ("version-all", {"versionPolicy": {"all": {}}}, "all {"),
    ("version-specific", {"versionPolicy": {"specific": {"versions": [1, 3]}}}, "versions: 3"),
    (
        "dynamic-batching",
        {
            "maxBatchSize": 16,
            "dynamicBatching": {
                "preferredBatchSize": [4, 8],
                "maxQueueDelayMicroseconds": 100,
                "preserveOrdering": True,
                "defaultQueuePolicy": {
                    "timeoutAction": "DELAY",
                    "defaultTimeoutMicroseconds": 5000,
                    "allowTimeoutOverride": True,
                    "maxQueueSize": 64,
                },
            },
        },
        "max_queue_delay_microseconds: 100",
    ),
    (
        "priority-levels",
        {
            "maxBatchSize": 8,
            "dynamicBatching": {
                "priorityLevels": 2,
                "defaultPriorityLevel": 1,
                "priorityQueuePolicy": {"2": {"timeoutAction": "DELAY", "maxQueueSize": 4}},
            },
        },
        "priority_queue_policy {",
    ),
    (
        "sequence-direct",
        {
            "maxBatchSize": 4,
            "sequenceBatching": {
                "direct": {"maxQueueDelayMicroseconds": 10, "minimumSlotUtilization": 0.5},
                "maxSequenceIdleMicroseconds": 1000000,
                "controlInput": [
                    {"name": "START", "control": [{"int32FalseTrue": [0, 1]}]},  # kind 0: START
                    {
                        "name": "END",
                        "control": [{"kind": "CONTROL_SEQUENCE_END", "fp32FalseTrue": [0.0, 1.0]}],
                    },
                    {
                        "name": "READY",
                        "control": [{"kind": "CONTROL_SEQUENCE_READY", "boolFalseTrue": [False, True]}],
                    },
                    {
                        "name": "ID",
                        "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "dataType": "TYPE_UINT64"}],
                    },
                ],
            },
        },
        "minimum_slot_utilization: 0.5",
    ),
    (
        "sequence-oldest-state",
        {
            "maxBatchSize": 4,
            "sequenceBatching": {
                "oldest": {
                    "maxCandidateSequences": 4,
                    "preferredBatchSize": [2],
                    "maxQueueDelayMicroseconds": 5,
                    "preserveOrdering": True,
                },
                "state": [
                    {
                        "inputName": "IN_STATE",
                        "outputName": "OUT_STATE",
                        "dataType": "TYPE_FP32",
                        "dims": [-1],
                        "initialState": [
                            {"dataType": "TYPE_FP32", "dims": [1], "zeroData": True, "name": "z"}
                        ],
                        "useSameBufferForInputOutput": True,
                        "useGrowableMemory": True,
                    },
                    {
                        "inputName": "IN_CACHE",
                        "outputName": "OUT_CACHE",
                        "dataType": "TYPE_FP16",
                        "dims": [2, 8],
                        "initialState": [
                            {"dataType": "TYPE_FP16", "dims": [2, 8], "dataFile": "cache.bin", "name": "f"}
                        ],
                    },
                ],
                "iterativeSequence": True,
            },
        },
        "max_candidate_sequences: 4",
    ),
    (
        "ensemble",
        {
            "platform": "ensemble",
            "ensembleScheduling": {
                "step": [
                    {
                        "modelName": "pre",
                        "modelVersion": -1,
                        "inputMap": {"raw": "IMAGE"},
                        "outputMap": {"pixels": "px"},
                    },
                    {
                        "modelName": "net",
                        "inputMap": {"input": "px"},
                        "outputMap": {"out": "OUT"},
                        "modelNamespace": "vision",
                    },
                ],
                "maxInflightRequests": 16,
            },
        },
        'model_name: "net"',
    ),
    (
        "parameters",
        {"parameters": {"EXECUTION_ENV_PATH": {"stringValue": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}}},
        'key: "EXECUTION_ENV_PATH"',
    ),
    (
        "warmup",
        {
            "modelWarmup": [
                {
                    "name": "zeros",
                    "batchSize": 2,
                    "count": 3,
                    "inputs": {"x": {"dataType": "TYPE_FP32", "dims": [4], "zeroData": True}},
                },
                {
                    "name": "random",
                    "inputs": {"x": {"dataType": "TYPE_FP32", "dims": [4], "randomData": True}},
                },
                {
                    "name": "file",
                    "inputs": {"x": {"dataType": "TYPE_FP32", "dims": [4], "inputDataFile": "x.bin"}},
                },
            ]
        },
        'input_data_file: "x.bin"',
    ),
    (
        "optimization",
        {
            "optimization": {
                "graph": {"level": 1},
                "priority": "PRIORITY_MAX",
                "cuda": {
                    "graphs": True,
                    "busyWaitEvents": True,
                    "outputCopyStream": True,
                    "graphSpec": [
                        {
                            "batchSize": 4,
                            "input": {"x": {"dim": [3, 8]}},
                            "graphLowerBound": {"batchSize": 1, "input": {"x": {"dim": [3, 8]}}},
                        }
                    ],
                },
                "executionAccelerators": {
                    "gpuExecutionAccelerator": [
                        {"name": "tensorrt", "parameters": {"precision_mode": "FP16"}}
                    ],
                    "cpuExecutionAccelerator": [{"name": "openvino"}],
                },
                "inputPinnedMemory": {"enable": True},
                "outputPinnedMemory": {"enable": True},
                "gatherKernelBufferThreshold": 2,
                "eagerBatching": True,
            }
        },
        "graphs: true",
    ),
    ("response-cache", {"responseCache": {"enable": True}}, "response_cache {"),
    (
        "instance-groups",
        {
            "instanceGroup": [
                {"name": "gpu", "kind": "KIND_GPU", "count": 2, "gpus": [0, 1], "profile": ["0"]},
                {"kind": "KIND_CPU", "count": 4, "hostPolicy": "numa0", "passive": True},
                {"kind": "KIND_MODEL"},
                {"kind": "KIND_GPU", "secondaryDevices": [{"deviceId": 1}]},
            ]
        },
        "kind: KIND_MODEL",
    ),
    (
        "rate-limiter",
        {
            "instanceGroup": [
                {
                    "kind": "KIND_GPU",
                    "rateLimiter": {
                        "resources": [
                            {"name": "R1", "count": 4},
                            {"name": "mem", "global": True, "count": 1},
                        ],
                        "priority": 2,
                    },
                }
            ]
        },
        "global: true",
    ),
    (
        "ragged-batching",
        {
            "batchInput": [
                {
                    "kind": "BATCH_ACCUMULATED_ELEMENT_COUNT",
                    "targetName": ["INDEX"],
                    "dataType": "TYPE_INT32",
                    "sourceInput": ["x"],
                }
            ],
            "batchOutput": [{"targetName": ["y"], "sourceInput": ["x"]}],
        },
        "BATCH_ACCUMULATED_ELEMENT_COUNT",
    ),
    (
        # Enum fields whose only value is the default (0): proto3 writes nothing for them.
        "default-only-enums",
        {
            "batchOutput": [{"targetName": ["y"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE"}],
            "instanceGroup": [{"secondaryDevices": [{"kind": "KIND_NVDLA", "deviceId": 2}]}],
        },
        "device_id: 2",
    ),
    (
        "files-and-tags",
        {
            "defaultModelFilename": "model.plan",
            "ccModelFilenames": {"8.0": "a100.plan"},
            "metricTags": {"team": "vision"},
        },
        'value: "a100.plan"',
    ),
    (
        "operations",
        {"modelOperations": {"opLibraryFilename": ["libop.so"]}},
        'op_library_filename: "libop.so"',
    ),
    ("decoupled", {"modelTransactionPolicy": {"decoupled": True}}, "decoupled: true"),
    (
        "repository-agents",
        {"modelRepositoryAgents": {"agents": [{"name": "checksum", "parameters": {"MD5:1/model": "abc"}}]}},
        'name: "checksum"',
    ),
    (
        "metrics",
        {
            "modelMetrics": {
                "metricControl": [
                    {
                        "metricIdentifier": {"family": "nv_latency"},
                        "histogramOptions": {"buckets": [1.5, 10.0]},
                    }
                ]
            }
        },
        "buckets: 1.5",
    ),
]


DEFAULT_VALUED = {"default-only-enums"}


@pytest.mark.parametrize(("family", "config", "snippet"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_field_family_renders_and_round_trips(family: str, config: dict[str, Any], snippet: str) -> None:
    text = build_config_pbtxt("m", config)
    assert snippet in text
    assert text.startswith('name: "m"\n')
    parsed = parse_config_pbtxt(text)
    assert parsed == parse_model_config("m", config)
    if family not in DEFAULT_VALUED:
        # and back to the spec's form: exactly what was given, plus the name
        assert config_to_dict(parsed, int64_as_number=True) == {"name": "m", **config}


def test_every_field_of_modelconfig_is_covered_by_the_families() -> None:
    """The families above set every field of ModelConfig's descriptor tree, maps' keys and values too."""
    covered: set[str] = set()

    def walk(data: Any, descriptor: Any) -> None:
        fields = {f.json_name: f for f in descriptor.fields}
        for key, value in data.items():
            field = fields[key]
            covered.add(field.full_name)
            if field.message_type is None:
                continue
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                covered.update({f"{field.message_type.full_name}.key", value_field.full_name})
                if value_field.message_type is not None:
                    for item in value.values():
                        walk(item, value_field.message_type)
            else:
                for item in value if isinstance(value, list) else [value]:
                    walk(item, field.message_type)

    for _, config, _ in FAMILIES:
        walk(config, model_config_pb2.ModelConfig.DESCRIPTOR)

    every: set[str] = set()

    def all_fields(descriptor: Any, seen: set[str]) -> None:
        if descriptor.full_name in seen:
            return
        seen.add(descriptor.full_name)
        for field in descriptor.fields:
            every.add(field.full_name)
            if field.message_type is not None:
                all_fields(field.message_type, seen)

    all_fields(model_config_pb2.ModelConfig.DESCRIPTOR, set())
    missing = sorted(every - covered)
    assert missing == []


@pytest.mark.parametrize(
    ("as_string", "as_number"),
    [
        (
            {"dynamicBatching": {"maxQueueDelayMicroseconds": "100"}},
            {"dynamicBatching": {"maxQueueDelayMicroseconds": 100}},
        ),
        ({"input": [{"name": "x", "dims": ["-1", "3"]}]}, {"input": [{"name": "x", "dims": [-1, 3]}]}),
        (
            {"versionPolicy": {"specific": {"versions": ["3"]}}},
            {"versionPolicy": {"specific": {"versions": [3]}}},
        ),
    ],
)
def test_64_bit_integers_as_strings_or_numbers_give_the_same_message(
    as_string: dict[str, Any], as_number: dict[str, Any]
) -> None:
    assert parse_model_config("m", as_string) == parse_model_config("m", as_number)
    message = parse_model_config("m", as_number)
    assert config_to_dict(message) == {"name": "m", **as_string}
    assert config_to_dict(message, int64_as_number=True) == {"name": "m", **as_number}


def test_64_bit_integers_beyond_double_precision_stay_strings() -> None:
    big = str(2**60 + 1)
    message = parse_model_config("m", {"dynamicBatching": {"maxQueueDelayMicroseconds": big}})
    assert message.dynamic_batching.max_queue_delay_microseconds == 2**60 + 1
    assert (
        config_to_dict(message, int64_as_number=True)["dynamicBatching"]["maxQueueDelayMicroseconds"] == big
    )


@pytest.mark.parametrize("given", [None, "", "m"])
def test_config_name_may_be_left_out_or_equal(given: str | None) -> None:
    config = {} if given is None else {"name": given}
    assert parse_model_config("m", config).name == "m"


def test_config_name_must_not_differ() -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config("m", {"name": "other"}, field="spec.models[1].config")
    assert info.value.field == "spec.models[1].config.name"
    assert "'other'" in info.value.problem and "'m'" in info.value.problem


def test_null_means_unset() -> None:
    assert parse_model_config("m", {"maxBatchSize": None, "input": None}) == parse_model_config("m", {})


BAD_CONFIGS: list[tuple[dict[str, Any], str, str]] = [
    ({"maxBatchSise": 8}, "c.maxBatchSise", "did you mean maxBatchSize"),
    ({"max_batch_size": 8}, "c.max_batch_size", "proto3 JSON names: maxBatchSize"),
    ({"dynamicBatching": {"maxQueueDelay": 1}}, "c.dynamicBatching.maxQueueDelay", "ModelDynamicBatching"),
    (
        {"dynamicBatching": {"maxQueueDelayMicroseconds": "soon"}},
        "c.dynamicBatching.maxQueueDelayMicroseconds",
        "integer (uint64)",
    ),
    (
        {"dynamicBatching": {"maxQueueDelayMicroseconds": -1}},
        "c.dynamicBatching.maxQueueDelayMicroseconds",
        "out of range",
    ),
    ({"maxBatchSize": 2**31}, "c.maxBatchSize", "out of range for int32"),
    ({"maxBatchSize": 1.5}, "c.maxBatchSize", "integer (int32)"),
    ({"maxBatchSize": True}, "c.maxBatchSize", "integer (int32)"),
    ({"maxBatchSize": "8"}, "", ""),  # proto3 JSON: a string of digits is an integer
    ({"input": [{"name": "x", "dims": [1, "x"]}]}, "c.input[0].dims[1]", "integer (int64)"),
    ({"input": [{"name": "x", "dataType": "TYPE_FP3"}]}, "c.input[0].dataType", "did you mean TYPE_FP32"),
    ({"input": [{"name": "x", "dataType": 11}]}, "c.input[0].dataType", "is not one of"),
    ({"input": {"name": "x"}}, "c.input", "must be a list"),
    ({"input": [None]}, "c.input[0]", "must not be null"),
    ({"input": ["x"]}, "c.input[0]", "must be an object"),
    ({"instanceGroup": [{"kind": "KIND_GPU", "count": "two"}]}, "c.instanceGroup[0].count", "integer"),
    ({"instanceGroup": [{"kind": "GPU"}]}, "c.instanceGroup[0].kind", "KIND_GPU"),
    ({"parameters": {"k": {"stringValue": 1}}}, "c.parameters[k].stringValue", "must be a string"),
    ({"parameters": {"k": "v"}}, "c.parameters[k]", "must be an object"),
    ({"parameters": {"k": {"value": "v"}}}, "c.parameters[k].value", "ModelParameter"),
    ({"parameters": ["k"]}, "c.parameters", "must be an object (a map)"),
    (
        {"dynamicBatching": {"priorityQueuePolicy": {"high": {}}}},
        "c.dynamicBatching.priorityQueuePolicy[high]",
        "must be an integer",
    ),
    ({"responseCache": {"enable": "yes"}}, "c.responseCache.enable", "true or false"),
    ({"optimization": {"cuda": {"graphs": 1}}}, "c.optimization.cuda.graphs", "true or false"),
    (
        {"sequenceBatching": {"direct": {"minimumSlotUtilization": "half"}}},
        "c.sequenceBatching.direct.minimumSlotUtilization",
        "must be a number",
    ),
    ({"optimization": {"graph": {"level": 1e40}}}, "c.optimization.graph.level", "int32"),
    (
        {"modelMetrics": {"metricControl": [{"histogramOptions": {"buckets": [1, "x"]}}]}},
        "c.modelMetrics.metricControl[0].histogramOptions.buckets[1]",
        "must be a number",
    ),
    (
        {"dynamicBatching": {}, "sequenceBatching": {}},
        "c.sequenceBatching",
        "at most one of dynamicBatching, sequenceBatching, ensembleScheduling",
    ),
    (
        {"versionPolicy": {"latest": {}, "all": {}}},
        "c.versionPolicy.all",
        "at most one of latest, all, specific",
    ),
    (
        {"modelWarmup": [{"inputs": {"x": {"zeroData": True, "randomData": True}}}]},
        "c.modelWarmup[0].inputs[x].randomData",
        "at most one of zeroData, randomData, inputDataFile",
    ),
    (
        {"ensembleScheduling": {"step": [{"inputMap": {"a": 1}}]}},
        "c.ensembleScheduling.step[0].inputMap[a]",
        "string",
    ),
]


@pytest.mark.parametrize(("config", "field", "fragment"), BAD_CONFIGS)
def test_errors_name_the_json_path(config: dict[str, Any], field: str, fragment: str) -> None:
    errors = config_errors(config, field="c")
    if not field:
        assert errors == []
        parse_model_config("m", config, field="c")
        return
    assert [e.field for e in errors] == [field], errors
    assert fragment in errors[0].problem
    with pytest.raises(ModelConfigError) as info:
        parse_model_config("m", config, field="c")
    assert info.value.field == field
    assert str(info.value) == f"{field}: {info.value.problem}"


def test_every_problem_is_reported() -> None:
    errors = config_errors(
        {"maxBatchSize": "x", "bogus": 1, "input": [{"dims": ["y"]}]}, field="spec.models[2].config"
    )
    assert sorted(e.field for e in errors) == [
        "spec.models[2].config.bogus",
        "spec.models[2].config.input[0].dims[0]",
        "spec.models[2].config.maxBatchSize",
    ]


def test_config_must_be_an_object() -> None:
    with pytest.raises(ModelConfigError) as info:
        parse_model_config("m", ["not", "a", "dict"], field="spec.models[0].config")  # type: ignore[arg-type]
    assert info.value.field == "spec.models[0].config"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"dynamicBatching": {"x": 1}}, "spec.models[2].config.dynamicBatching"),
        ({"parameters": {"k": {"bad": 1}}}, "spec.models[2].config.parameters[k]"),
        ({"input": [{"name": "a"}, {"dataType": "TYPE_FOO"}]}, "spec.models[2].config.input[1].dataType"),
        ({"maxBatchSize": "1.5"}, "spec.models[2].config.maxBatchSize"),
        ({"dims": 1}, "spec.models[2].config"),
    ],
)
def test_protobuf_parse_errors_translate_to_our_paths(config: dict[str, Any], expected: str) -> None:
    """The fallback when protobuf's own parser rejects something: its path joined onto ours."""
    with pytest.raises(json_format.ParseError) as info:
        json_format.ParseDict(config, model_config_pb2.ModelConfig())
    error = translate_parse_error(str(info.value), "spec.models[2].config")
    assert error.field == expected
    assert error.problem == str(info.value)


def test_pbtxt_syntax_errors_name_the_file_and_line() -> None:
    text = 'name: "m"\nmax_batch_size: 8\ndynamic_batching { max_queue_delay: 1 }\n'
    with pytest.raises(ModelConfigError) as info:
        import_config_pbtxt(text, source="repo/m/config.pbtxt")
    assert info.value.field == "repo/m/config.pbtxt"
    assert "3:" in info.value.problem and "max_queue_delay" in info.value.problem


@pytest.mark.parametrize(("family", "config", "snippet"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_import_of_rendered_text_gives_the_spec_back(
    family: str, config: dict[str, Any], snippet: str
) -> None:
    imported = import_config_pbtxt(build_config_pbtxt("m", config), int64_as_number=True)
    assert imported.pop("name") == "m"
    if family in DEFAULT_VALUED:
        assert parse_model_config("m", imported) == parse_model_config("m", config)
    else:
        assert imported == {k: v for k, v in config.items() if k != "name"}

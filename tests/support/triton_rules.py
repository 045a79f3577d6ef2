"""Model configs Triton refuses from the config alone, one per check the operator mirrors, and configs
both accept.

tests/unit/core/spec/validation/test_triton_checks.py asserts the operator refuses each case, naming the
field; tests/triton/test_real_triton_checks.py asserts a real tritonserver refuses the same config, with the
text of the Triton check the operator's rule mirrors, and loads each accepted one.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_specs import MODEL_CODE

Config = dict[str, Any]

# tests/data/triton_models/adder: a Python model with INPUT0, INPUT1 -> OUTPUT0, OUTPUT1. Loading
# runs Triton's checks; the shapes below only need to be valid, inference never runs.
ADDER_CODE = MODEL_CODE / "adder" / "1" / "model.py"
CPU = [{"kind": "KIND_CPU", "count": 1}]


def vector(name: str, data_type: str = "TYPE_FP32", dims: list[int] | None = None, **more: Any) -> Config:
    return {"name": name, "dataType": data_type, "dims": dims or [4], **more}


def adder(**changes: Any) -> Config:
    """The adder's config (backend python, batching up to 8) with top-level fields replaced."""
    config: Config = {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [vector("INPUT0"), vector("INPUT1")],
        "output": [vector("OUTPUT0"), vector("OUTPUT1")],
        "instanceGroup": CPU,
    }
    config.update(changes)
    return config


def adder_io(key: str, first: Config) -> Config:
    """The adder with its first input or output replaced."""
    second = vector("INPUT1") if key == "input" else vector("OUTPUT1")
    return adder(**{key: [first, second]})


def sequence(*controls: Config, **more: Any) -> Config:
    return adder(sequenceBatching={"controlInput": list(controls), **more})


def control(name: str, kind: str, **values: Any) -> Config:
    return {"name": name, "control": [{"kind": kind, **values}]}


def ensemble(
    step_model: str,
    *,
    input_map: dict[str, str] | None = None,
    output_map: dict[str, str] | None = None,
    inputs: list[Config] | None = None,
    outputs: list[Config] | None = None,
    **more: Any,
) -> Config:
    """An ensemble of one adder step: A, B -> S (sum), D (difference)."""
    step: Config = {
        "modelName": step_model,
        "modelVersion": "-1",
        "inputMap": input_map or {"INPUT0": "A", "INPUT1": "B"},
        "outputMap": output_map or {"OUTPUT0": "S", "OUTPUT1": "D"},
    }
    step.update(more.pop("step", {}))
    step = {key: value for key, value in step.items() if value is not None}  # None: left out
    config: Config = {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": inputs or [vector("A"), vector("B")],
        "output": outputs or [vector("S"), vector("D")],
        "ensembleScheduling": {"step": [step]},
    }
    config.update(more)
    return config


@dataclass(frozen=True)
class Case:
    """One config Triton refuses: the operator's error (the only one) and Triton's words for it.

    ``models`` are spec.models entries; the last is the model refused (an ensemble's steps come
    first). ``field`` is relative to that model's config.
    """

    id: str
    models: tuple[Config, ...]
    field: str
    ours: str
    triton: str
    not_on_cpu: str = ""  # why the real-tritonserver check leaves this case out

    @property
    def model(self) -> str:
        return str(self.models[-1]["name"])

    @property
    def spec_field(self) -> str:
        return f"spec.models[{len(self.models) - 1}].config.{self.field}"

    def spec(self) -> Config:
        return {"repository": {"uri": "pvc://models/rules"}, "models": copy.deepcopy(list(self.models))}


def case(case_id: str, config: Config, field: str, ours: str, triton: str, *, not_on_cpu: str = "") -> Case:
    return Case(case_id, ({"name": case_id, "config": config},), field, ours, triton, not_on_cpu)


def ensemble_case(
    case_id: str, config: Config, field: str, ours: str, triton: str, *, step: Config | None = None
) -> Case:
    """An ensemble named ``case_id`` over ``<case_id>_add``, an adder (or ``step``)."""
    steps = {"name": f"{case_id}_add", "config": step or adder()}
    return Case(case_id, (steps, {"name": case_id, "config": config}), field, ours, triton)


def _add(case_id: str) -> str:
    return f"{case_id}_add"


START, END, READY, CORRID = (
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_CORRID",
)
DELAY_100 = {"timeoutAction": "DELAY", "defaultTimeoutMicroseconds": "100"}

REFUSED: list[Case] = [
    # ---- ValidateModelConfig: platform, backend, max_batch_size
    ensemble_case(
        "ensemble_platform_with_backend",
        {**ensemble(_add("ensemble_platform_with_backend")), "backend": "python"},
        "backend",
        "must be left out for platform: ensemble",
        "must have platform type 'ensemble' and empty backend type",
    ),
    case(
        "platform_without_backend",
        {**adder(platform="python"), "backend": ""},
        "platform",
        "'python' is not a platform Triton knows",
        "unexpected platform type 'python'",
    ),
    case(
        "platform_backend_pair",
        adder(backend="onnxruntime", platform="tensorrt_plan"),
        "platform",
        "'tensorrt_plan' does not go with backend 'onnxruntime'",
        "unexpected 'platform' and 'backend' pair, got:tensorrt_plan, onnxruntime",
    ),
    case(
        "negative_max_batch_size",
        adder(maxBatchSize=-1),
        "maxBatchSize",
        "is -1; 0 (no batching) or more",
        "'max_batch_size' must be non-negative value",
    ),
    # ---- library names (TritonModel::GetBackendLibraryProperties)
    case(
        "runtime_escapes",
        adder(runtime="../../bin/tritonserver"),
        "runtime",
        "escapes the backend directory",
        "escapes backend directory",
    ),
    case(
        "backend_with_a_path",
        adder(backend="../python"),
        "backend",
        "is not a backend name",
        "unable to find backend library for backend '../python'",
    ),
    # ---- ValidateIOShape, ValidateModelInput/Output
    case(
        "input_without_data_type",
        adder_io("input", {"name": "INPUT0", "dims": [4]}),
        "input[0].dataType",
        "is required",
        "model input 'INPUT0' must specify 'data_type'",
    ),
    case(
        "output_without_dims",
        adder_io("output", {"name": "OUTPUT0", "dataType": "TYPE_FP32"}),
        "output[0].dims",
        "is required",
        "model output 'OUTPUT0' must specify 'dims'",
    ),
    case(
        "reshape_element_count",
        adder_io("input", vector("INPUT0", dims=[4], reshape={"shape": [3]})),
        "input[0].reshape.shape",
        "holds 3 elements but dims [4] hold 4",
        "model input 'INPUT0' has different size for dims and reshape",
    ),
    case(
        "empty_reshape_of_many_elements",
        adder_io("output", vector("OUTPUT0", dims=[4], reshape={})),
        "output[0].reshape.shape",
        "holds 0 elements but dims [4] hold 4",
        "model output 'OUTPUT0' has different size for dims and reshape",
    ),
    case(
        "reshape_fixed_to_variable",
        adder_io("input", vector("INPUT0", dims=[4], reshape={"shape": [-1]})),
        "input[0].reshape.shape",
        "holds a variable number of elements but dims [4] hold 4",
        "model input 'INPUT0' has different size for dims and reshape",
    ),
    case(
        "reshape_variable_runs",
        adder_io("input", vector("INPUT0", dims=[2, -1], reshape={"shape": [-1, 2]})),
        "input[0].reshape.shape",
        "groups its fixed dimensions into [1, 2] elements but dims [2, -1] into [2, 1]",
        "model input 'INPUT0' has different size for dims and reshape",
    ),
    case(
        "reshape_variable_count",
        adder_io("input", vector("INPUT0", dims=[-1, 4], reshape={"shape": [-1, -1, 4]})),
        "input[0].reshape.shape",
        "has 2 variable dimensions but dims [-1, 4] have 1",
        "model input 'INPUT0' has different number of variable-size dimensions for dims and reshape",
    ),
    case(
        "shape_tensor_not_tensorrt",
        adder_io("input", vector("INPUT0", isShapeTensor=True)),
        "input[0].isShapeTensor",
        "only TensorRT models",
        "shape tensors are only supported for TensorRT platform",
    ),
    case(
        "non_linear_format_not_tensorrt",
        adder_io("output", vector("OUTPUT0", isNonLinearFormatIo=True)),
        "output[0].isNonLinearFormatIo",
        "only TensorRT models",
        "Non-linear IO format is only supported for the TensorRT platform",
    ),
    # Newer tritonserver refuses "label file path ... is outside model directory"; 2.51 refuses the
    # same config because it looks for the file there and finds none.
    case(
        "label_file_outside_the_model",
        adder_io("output", vector("OUTPUT0", labelFilename="../labels.txt")),
        "output[0].labelFilename",
        "is outside the model folder",
        "label_file_outside_the_model/../labels.txt",
    ),
    # ---- ValidateBatchIO
    case(
        "batch_input_without_source",
        adder(batchInput=[{"kind": "BATCH_ELEMENT_COUNT", "targetName": ["N"], "dataType": "TYPE_INT32"}]),
        "batchInput[0].sourceInput",
        "batch input kind BATCH_ELEMENT_COUNT takes exactly 1 source input, got 0",
        "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0",
    ),
    case(
        "batch_input_two_sources",
        adder(
            batchInput=[
                {
                    "kind": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
                    "targetName": ["N"],
                    "dataType": "TYPE_INT32",
                    "sourceInput": ["INPUT0", "INPUT1"],
                }
            ]
        ),
        "batchInput[0].sourceInput",
        "takes exactly 1 source input, got 2",
        "batch input kind 'BATCH_MAX_ELEMENT_COUNT_AS_SHAPE' expects 1 source input, got 2",
    ),
    case(
        "batch_input_unknown_source",
        adder(batchInput=[{"targetName": ["N"], "dataType": "TYPE_INT32", "sourceInput": ["NOPE"]}]),
        "batchInput[0].sourceInput[0]",
        "'NOPE' is not an input of the model",
        "unknown source input name 'NOPE'",
    ),
    case(
        "batch_input_data_type",
        adder(batchInput=[{"targetName": ["N"], "dataType": "TYPE_FP16", "sourceInput": ["INPUT0"]}]),
        "batchInput[0].dataType",
        "is TYPE_FP16; a batch input is TYPE_INT32 or TYPE_FP32",
        "batch input data type must be TYPE_INT32 or TYPE_FP32",
    ),
    case(
        "batch_output_without_source",
        adder(batchOutput=[{"targetName": ["OUTPUT0"]}]),
        "batchOutput[0].sourceInput",
        "batch output kind BATCH_SCATTER_WITH_INPUT_SHAPE takes exactly 1 source input, got 0",
        "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0",
    ),
    case(
        "batch_output_unknown_source",
        adder(batchOutput=[{"targetName": ["OUTPUT0"], "sourceInput": ["NOPE"]}]),
        "batchOutput[0].sourceInput[0]",
        "'NOPE' is not an input of the model",
        "unknown source input name 'NOPE'",
    ),
    case(
        "batch_output_unknown_target",
        adder(batchOutput=[{"targetName": ["NOPE"], "sourceInput": ["INPUT0"]}]),
        "batchOutput[0].targetName[0]",
        "'NOPE' is not an output of the model",
        "unknown target output name 'NOPE'",
    ),
    case(
        "batch_output_target_twice",
        adder(batchOutput=[{"targetName": ["OUTPUT0", "OUTPUT0"], "sourceInput": ["INPUT0"]}]),
        "batchOutput[0].targetName[1]",
        "'OUTPUT0' is named twice",
        "target output name 'OUTPUT0' can only be specified once",
    ),
    # ---- dynamic batching
    case(
        "preserve_ordering_with_priorities",
        adder(dynamicBatching={"preserveOrdering": True, "priorityLevels": 2, "defaultPriorityLevel": 1}),
        "dynamicBatching.preserveOrdering",
        "allows only one priority level",
        "Only one priority level is allowed when 'preserve_ordering' is true",
    ),
    case(
        "preserve_ordering_with_delay",
        adder(dynamicBatching={"preserveOrdering": True, "defaultQueuePolicy": DELAY_100}),
        "dynamicBatching.defaultQueuePolicy.timeoutAction",
        "DELAY reorders timed-out requests",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
    ),
    case(
        "preserve_ordering_with_a_priority_delay",
        adder(
            dynamicBatching={
                "preserveOrdering": True,
                "priorityLevels": 1,
                "defaultPriorityLevel": 1,
                "priorityQueuePolicy": {"1": DELAY_100},
            }
        ),
        "dynamicBatching.priorityQueuePolicy[1].timeoutAction",
        "DELAY reorders timed-out requests",
        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true",
    ),
    # ---- sequence batching: GetBooleanSequenceControlProperties, GetTypedSequenceControlProperties
    case(
        "control_without_name",
        sequence({"control": [{"kind": START, "int32FalseTrue": [0, 1]}]}),
        "sequenceBatching.controlInput[0].name",
        "is required",
        "sequence batching control tensor must have a name",
    ),
    case(
        "control_tensor_twice",
        sequence(
            control("CTRL", START, int32FalseTrue=[0, 1]),
            control("CTRL", END, int32FalseTrue=[0, 1]),
        ),
        "sequenceBatching.controlInput[1].name",
        "control tensor 'CTRL' is also controlInput[0]",
        "sequence batching control tensor 'CTRL' is specified for multiple control kinds",
    ),
    case(
        "control_kind_twice",
        sequence(
            control("START", START, int32FalseTrue=[0, 1]),
            control("BEGIN", START, int32FalseTrue=[0, 1]),
        ),
        "sequenceBatching.controlInput[1].control[0].kind",
        "CONTROL_SEQUENCE_START is also given by controlInput[0].control[0]",
        "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors",
    ),
    case(
        "control_without_values",
        sequence(control("END", END)),
        "sequenceBatching.controlInput[0].control[0]",
        "CONTROL_SEQUENCE_END needs its false and true values",
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true'"
        " for CONTROL_SEQUENCE_END",
    ),
    case(
        "control_with_two_kinds_of_values",
        sequence(control("READY", READY, int32FalseTrue=[0, 1], boolFalseTrue=[False, True])),
        "sequenceBatching.controlInput[0].control[0].boolFalseTrue",
        "set together with int32FalseTrue",
        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and"
        " 'bool_false_true' for CONTROL_SEQUENCE_READY",
    ),
    case(
        "control_with_three_values",
        sequence(control("START", START, fp32FalseTrue=[0, 1, 2])),
        "sequenceBatching.controlInput[0].control[0].fp32FalseTrue",
        "has 3 entries; it takes exactly 2",
        "sequence batching control 'fp32_false_true' must have exactly 2 entries",
    ),
    case(
        "corrid_with_values",
        sequence(control("CORRID", CORRID, dataType="TYPE_UINT64", int32FalseTrue=[0, 1])),
        "sequenceBatching.controlInput[0].control[0].int32FalseTrue",
        "carries the correlation ID: it takes no false/true values",
        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or"
        " 'bool_false_true' for CONTROL_SEQUENCE_CORRID",
    ),
    case(
        "corrid_without_data_type",
        sequence(control("CORRID", CORRID)),
        "sequenceBatching.controlInput[0].control[0].dataType",
        "is required; CONTROL_SEQUENCE_CORRID takes one of",
        "unexpected data type for control CONTROL_SEQUENCE_CORRID",
    ),
    case(
        "corrid_data_type",
        sequence(control("CORRID", CORRID, dataType="TYPE_FP32")),
        "sequenceBatching.controlInput[0].control[0].dataType",
        "is TYPE_FP32; CONTROL_SEQUENCE_CORRID takes one of",
        "unexpected data type for control CONTROL_SEQUENCE_CORRID",
    ),
    case(
        "slot_utilization_above_one",
        sequence(direct={"minimumSlotUtilization": 1.5}),
        "sequenceBatching.direct.minimumSlotUtilization",
        "is 1.5; must be in [0, 1]",
        "sequence batching minimum slot utilization must be in range (0.0, 1.0]",
    ),
    case(
        "response_cache_with_sequences",
        adder(sequenceBatching={}, responseCache={"enable": True}),
        "sequenceBatching",
        "cannot be used with responseCache.enable",
        "Response Cache does not currently support model response_cache_with_sequences with sequence"
        " batching scheduler",
    ),
    case(
        "response_cache_when_decoupled",
        adder(modelTransactionPolicy={"decoupled": True}, responseCache={"enable": True}),
        "responseCache.enable",
        "cannot be used with modelTransactionPolicy.decoupled",
        "Response Cache does not currently support model response_cache_when_decoupled with 'decoupled'"
        " transaction policy",
    ),
    # ---- ValidateInstanceGroup
    case(
        "profile_not_tensorrt",
        adder(instanceGroup=[{"kind": "KIND_CPU", "profile": ["0"]}]),
        "instanceGroup[0].profile",
        "only TensorRT models (tensorrt_plan) have optimization profiles",
        "specifies profile field which is only supported for TensorRT models",
    ),
    # ---- ValidateModelMetrics
    case(
        "metric_without_family",
        adder(
            modelMetrics={"metricControl": [{"metricIdentifier": {}, "histogramOptions": {"buckets": [1.0]}}]}
        ),
        "modelMetrics.metricControl[0].metricIdentifier.family",
        "is required",
        "metric identifier must specify non-empty 'family'",
        not_on_cpu="tritonserver 2.51 predates model_metrics: it cannot even parse this config.pbtxt",
    ),
    # ---- ensembles against their step models (ensemble_utils' ValidateEnsembleConfig, and the
    # dependency check of the model repository manager)
    ensemble_case(
        "ensemble_maps_a_missing_input",
        ensemble(
            _add("ensemble_maps_a_missing_input"), input_map={"INPUT0": "A", "INPUT1": "B", "INPUTX": "A"}
        ),
        "ensembleScheduling.step[0].inputMap[INPUTX]",
        "model 'ensemble_maps_a_missing_input_add' has no input 'INPUTX'",
        "ensemble tensor A is mapping to non-existing input INPUTX",
    ),
    ensemble_case(
        "ensemble_leaves_an_input_unmapped",
        ensemble(_add("ensemble_leaves_an_input_unmapped"), input_map={"INPUT0": "A"}, inputs=[vector("A")]),
        "ensembleScheduling.step[0].inputMap",
        "maps no ensemble tensor to input 'INPUT1'",
        "input INPUT1 in model ensemble_leaves_an_input_unmapped_add is not mapped to any ensemble tensors",
    ),
    ensemble_case(
        "ensemble_maps_a_missing_output",
        ensemble(
            _add("ensemble_maps_a_missing_output"),
            output_map={"OUTPUT0": "S", "OUTPUT1": "D", "OUTPUTX": "X"},
            outputs=[vector("S"), vector("D"), vector("X")],
        ),
        "ensembleScheduling.step[0].outputMap[OUTPUTX]",
        "has no output 'OUTPUTX'",
        "ensemble tensor X is mapped from non-existing output OUTPUTX",
    ),
    ensemble_case(
        "ensemble_tensor_data_type",
        ensemble(_add("ensemble_tensor_data_type"), inputs=[vector("A", "TYPE_INT32"), vector("B")]),
        "ensembleScheduling.step[0].inputMap[INPUT0]",
        "ensemble tensor 'A' is TYPE_INT32 for ensemble input 'A' but TYPE_FP32",
        "ensemble tensor A: inconsistent data type",
    ),
    ensemble_case(
        "ensemble_tensor_shape",
        ensemble(_add("ensemble_tensor_shape"), outputs=[vector("S", dims=[3]), vector("D")]),
        "ensembleScheduling.step[0].outputMap[OUTPUT0]",
        "ensemble tensor 'S' has shape [-1, 3] for ensemble output 'S' but [-1, 4]",
        "ensemble tensor S: inconsistent shape",
    ),
    ensemble_case(
        "ensemble_step_version",
        ensemble(_add("ensemble_step_version"), step={"modelVersion": "2"}),
        "ensembleScheduling.step[0].modelVersion",
        "asks for version 2 of 'ensemble_step_version_add', but its versionPolicy loads only 1",
        "depends on 'ensemble_step_version_add' whose required version 2 is not loaded",
        step=adder(versionPolicy={"specific": {"versions": ["1"]}}),
    ),
    ensemble_case(
        "ensemble_step_version_left_out",
        ensemble(_add("ensemble_step_version_left_out"), step={"modelVersion": None}),
        "ensembleScheduling.step[0].modelVersion",
        "asks for version 0 of 'ensemble_step_version_left_out_add', but its versionPolicy loads only 1"
        " (modelVersion left out is 0; -1 asks for the latest)",
        "depends on 'ensemble_step_version_left_out_add' whose required version 0 is not loaded",
        step=adder(versionPolicy={"specific": {"versions": ["1"]}}),
    ),
]


# Configs both accept, one per area above, close to the edges the rules draw.
ACCEPTED: list[Case] = [
    case(
        "accepted_tensors",
        adder(
            input=[
                vector("INPUT0", dims=[4], reshape={"shape": [2, 2]}),
                vector("INPUT1", dims=[2, -1, 6], reshape={"shape": [1, 2, -1, 3, 2]}),
            ],
            output=[vector("OUTPUT0", dims=[1], reshape={}), vector("OUTPUT1")],
            batchInput=[
                {
                    "kind": "BATCH_ELEMENT_COUNT",
                    "targetName": ["N"],
                    "dataType": "TYPE_INT32",
                    "sourceInput": ["INPUT0"],
                }
            ],
            batchOutput=[
                {
                    "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                    "targetName": ["OUTPUT1"],
                    "sourceInput": ["INPUT1"],
                }
            ],
        ),
        "",
        "",
        "",
    ),
    case(
        "accepted_sequence",
        sequence(
            control("START", START, int32FalseTrue=[0, 1]),
            control("END", END, fp32FalseTrue=[0.0, 1.0]),
            control("READY", READY, boolFalseTrue=[False, True]),
            control("CORRID", CORRID, dataType="TYPE_STRING"),
            direct={"minimumSlotUtilization": 1.0},
        ),
        "",
        "",
        "",
    ),
    case(
        "accepted_dynamic_batching",
        adder(
            dynamicBatching={
                "preserveOrdering": True,
                "priorityLevels": 1,
                "defaultPriorityLevel": 1,
                "defaultQueuePolicy": {"timeoutAction": "REJECT", "defaultTimeoutMicroseconds": "100"},
                "priorityQueuePolicy": {"1": {"timeoutAction": "DELAY"}},
            },
            responseCache={"enable": False},
        ),
        "",
        "",
        "",
    ),
    # A backend Triton does not type (python) runs whatever platform the config names.
    case("accepted_platform_of_an_untyped_backend", adder(platform="pytorch_libtorch"), "", "", ""),
    ensemble_case(
        "accepted_ensemble",
        {
            **ensemble(
                _add("accepted_ensemble"),
                inputs=[vector("A", dims=[-1, 4]), vector("B", dims=[-1, 4])],
                outputs=[vector("S", dims=[-1, -1]), vector("D", dims=[-1, 4])],
                step={"modelVersion": "1"},
            ),
            "maxBatchSize": 0,  # a non-batching ensemble over a batching model: shapes compare with [-1, ...]
        },
        "",
        "",
        "",
        step=adder(versionPolicy={"specific": {"versions": ["1"]}}),
    ),
]


def write_repository(cases: list[Case], root: Path) -> Path:
    """Every model of ``cases`` rendered as the operator renders it, Python ones with the adder's code."""
    root.mkdir(parents=True, exist_ok=True)
    for item in cases:
        for model in item.models:
            folder = root / model["name"]
            (folder / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version folder is empty
            if model["config"].get("platform") != "ensemble":
                shutil.copy(ADDER_CODE, folder / "1" / "model.py")
            (folder / "config.pbtxt").write_text(build_config_pbtxt(model["name"], model["config"]))
    return root

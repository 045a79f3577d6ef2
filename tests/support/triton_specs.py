"""The TritonService specs the real-tritonserver tests serve, and the model repository rendered from them."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

from triton_operator.core.spec.modelconfig import build_config_pbtxt
from triton_operator.models import TritonServiceSpec

MODEL_CODE = Path(__file__).resolve().parent.parent / "data" / "triton_models"

CPU = [{"kind": "KIND_CPU", "count": 1}]

# A Python add/sub model's config.pbtxt, written by hand for tests that load a model folder directly.
ADD_SUB_CONFIG_PBTXT = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [4] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }},
         {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""


def _vector(name: str, data_type: str = "TYPE_FP32", dims: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "dataType": data_type, "dims": dims or [4]}


def _adder_config(dynamic_batching: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [_vector("INPUT0"), _vector("INPUT1")],
        "output": [_vector("OUTPUT0"), _vector("OUTPUT1")],
        "dynamicBatching": dynamic_batching,
        "instanceGroup": CPU,
    }


def _control(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "control": [{"kind": kind, "int32FalseTrue": [0, 1]}]}


def _scaler(factor_or_offset: str, value: str) -> dict[str, Any]:
    return {
        "backend": "python",
        "maxBatchSize": 8,
        "input": [_vector("INPUT")],
        "output": [_vector("OUTPUT")],
        "parameters": {factor_or_offset: {"stringValue": value}},
        "instanceGroup": CPU,
    }


def _pipeline(dims: list[int]) -> dict[str, Any]:
    return {
        "platform": "ensemble",
        "maxBatchSize": 8,
        "input": [_vector("X", dims=dims)],
        "output": [_vector("Y", dims=dims)],
        "ensembleScheduling": {
            "step": [
                {
                    "modelName": "scale",
                    "modelVersion": "-1",
                    "inputMap": {"INPUT": "X"},
                    "outputMap": {"OUTPUT": "scaled"},
                },
                {
                    "modelName": "offset",
                    "modelVersion": "-1",
                    "inputMap": {"INPUT": "scaled"},
                    "outputMap": {"OUTPUT": "Y"},
                },
            ]
        },
    }


SCALE_FACTOR = 2.0
OFFSET = 0.5
# Long enough that the batcher, not the clock, decides when a batch of 4 runs.
BATCH_WAIT_MICROSECONDS = 60_000_000

# A TritonService spec as a user writes it (camelCase, proto3-JSON model configs).
SERVICE_SPEC: dict[str, Any] = {
    "repository": {"uri": "pvc://models/triton"},
    "models": [
        {"name": "adder", "config": _adder_config({"maxQueueDelayMicroseconds": "2000"})},
        {
            "name": "adder_batch4",
            "path": "adder",
            "config": _adder_config(
                {"preferredBatchSize": [4], "maxQueueDelayMicroseconds": str(BATCH_WAIT_MICROSECONDS)}
            ),
        },
        {
            "name": "accumulator",
            "config": {
                "backend": "python",
                "maxBatchSize": 4,
                "input": [_vector("INPUT", "TYPE_INT32", [1])],
                "output": [_vector("OUTPUT", "TYPE_INT32", [1])],
                "sequenceBatching": {
                    "maxSequenceIdleMicroseconds": "120000000",
                    "oldest": {"maxCandidateSequences": 4, "maxQueueDelayMicroseconds": "1000"},
                    "controlInput": [
                        _control("START", "CONTROL_SEQUENCE_START"),
                        _control("END", "CONTROL_SEQUENCE_END"),
                        _control("READY", "CONTROL_SEQUENCE_READY"),
                        {
                            "name": "CORRID",
                            "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "dataType": "TYPE_UINT64"}],
                        },
                    ],
                },
                "instanceGroup": CPU,
            },
        },
        {"name": "scale", "config": _scaler("factor", str(SCALE_FACTOR))},
        {"name": "offset", "config": _scaler("offset", str(OFFSET))},
        {"name": "pipeline", "config": _pipeline([4])},
    ],
}

# Configs that the operator renders fine but Triton itself refuses to load, with the text its log
# must show for each.
BROKEN_SPEC: dict[str, Any] = {
    "repository": {"uri": "pvc://models/triton"},
    "models": [
        {
            "name": "gpu_adder",
            "path": "adder",
            "config": {**_adder_config({}), "instanceGroup": [{"kind": "KIND_GPU", "count": 1}]},
        },
        {
            "name": "no_such_backend",
            "path": "adder",
            "config": {**_adder_config({}), "backend": "tensorrt_llm_nope"},
        },
        {"name": "scale", "config": _scaler("factor", "2")},
        {"name": "offset", "config": _scaler("offset", "1")},
        {"name": "pipeline_dims", "config": _pipeline([3])},
    ],
}


def validated_spec(spec: dict[str, Any]) -> TritonServiceSpec:
    return TritonServiceSpec.model_validate(copy.deepcopy(spec))


def build_repository(spec: TritonServiceSpec, root: Path) -> Path:
    """A model repository: each model's files copied from its path, config.pbtxt rendered from its config."""
    root.mkdir(parents=True, exist_ok=True)
    for model in spec.models:
        folder = root / model.name
        source = MODEL_CODE / model.folder
        if source.is_dir():
            shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__"))
        (folder / "1").mkdir(parents=True, exist_ok=True)  # an ensemble's version folder is empty
        (folder / "config.pbtxt").write_text(build_config_pbtxt(model.name, model.config))
    return root

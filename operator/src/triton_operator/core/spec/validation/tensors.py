"""A model's inputs, outputs, batch inputs and outputs, as Triton's ValidateModelIOConfig checks them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton_operator.core.spec.validation.backends import is_tensorrt, label_escapes
from triton_operator.core.spec.validation.errors import SpecError, as_int

WILDCARD_DIM = -1
IMAGE_FORMATS = ("FORMAT_NHWC", "FORMAT_NCHW")
BATCH_INPUT_TYPES = ("TYPE_INT32", "TYPE_FP32")


def tensor_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """ValidateModelInput and ValidateModelOutput for each tensor, then ValidateBatchIO."""
    errors: list[SpecError] = []
    batching = as_int(config.get("maxBatchSize")) > 0
    tensorrt = is_tensorrt(config)
    for key in ("input", "output"):
        seen: dict[str, int] = {}
        for index, tensor in enumerate(config.get(key) or []):
            tpath = f"{path}.{key}[{index}]"
            errors.extend(_name_errors(tensor, tpath, key, index, seen))
            errors.extend(_shape_errors(tensor, tpath, batching))
            errors.extend(_kind_errors(tensor, tpath, key, tensorrt))
    errors.extend(_batch_input_errors(config, path))
    errors.extend(_batch_output_errors(config, path))
    return errors


def _name_errors(
    tensor: Mapping[str, Any], tpath: str, key: str, index: int, seen: dict[str, int]
) -> list[SpecError]:
    name = tensor.get("name", "")
    if not name:
        return [SpecError(f"{tpath}.name", "is required")]  # ValidateIOShape: "must specify 'name'"
    if name in seen:
        return [SpecError(f"{tpath}.name", f"duplicate {key} {name!r} (also {key}[{seen[name]}])")]
    seen[name] = index
    return []


def _bad_dims(dims: list[Any], dpath: str) -> list[SpecError]:
    """ValidateIOShape: "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"."""
    return [
        SpecError(f"{dpath}[{i}]", f"is {dim}; a dimension is >= 1, or -1 (variable)")
        for i, dim in enumerate(dims)
        if as_int(dim) < 1 and as_int(dim) != WILDCARD_DIM
    ]


def _shape_errors(tensor: Mapping[str, Any], tpath: str, batching: bool) -> list[SpecError]:
    """ValidateIOShape: a data type, dims, and a reshape to the same number of elements.

    Triton checks a tensor after the backend's auto-complete, which could fill in the data type or
    dims of a tensor the config names; a spec that names a tensor describes it (leave a tensor out
    to let auto-complete describe it).
    """
    errors = []
    if tensor.get("dataType", "TYPE_INVALID") == "TYPE_INVALID":
        errors.append(SpecError(f"{tpath}.dataType", "is required"))  # "must specify 'data_type'"
    dims = tensor.get("dims") or []
    if not dims:
        # "must specify 'dims'": a scalar is dims [1] with an empty reshape
        errors.append(SpecError(f"{tpath}.dims", "is required (a scalar is dims: [1] with reshape: {})"))
    dim_errors = _bad_dims(dims, f"{tpath}.dims")
    errors.extend(dim_errors)
    reshape = tensor.get("reshape")
    if reshape is None:
        return errors
    shape = reshape.get("shape") or []
    if not shape and not batching:
        # "cannot have empty reshape for non-batching model as scalar tensors are not supported"
        return [*errors, SpecError(f"{tpath}.reshape", "cannot be empty for a non-batching model")]
    shape_errors = _bad_dims(shape, f"{tpath}.reshape.shape")
    errors.extend(shape_errors)
    if dims and not dim_errors and not shape_errors:
        errors.extend(_reshape_size_errors([as_int(d) for d in dims], [as_int(d) for d in shape], tpath))
    return errors


def element_count(dims: list[int]) -> int:
    """Triton's GetElementCount: -1 with a variable dimension, 0 for no dims, else the product."""
    if WILDCARD_DIM in dims:
        return WILDCARD_DIM
    count = 0
    for dim in dims:
        count = dim if count == 0 else count * dim
    return count


def _fixed_runs(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions between variable ones: [2, 4, -1, 6] -> [8, 6]."""
    runs, current = [], 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            runs.append(current)
            current = 1
        else:
            current *= dim
    return [*runs, current]


def _reshape_size_errors(dims: list[int], shape: list[int], tpath: str) -> list[SpecError]:
    """ValidateIOShape: dims and reshape hold as many elements (an empty reshape: dims of one element),
    and with variable dimensions, the same runs of fixed ones ([2, 4, -1, 6] to [8, -1, 1, 6])."""
    dims_size, shape_size = element_count(dims), element_count(shape)
    if dims_size != shape_size and (shape_size != 0 or dims_size != 1):
        # "has different size for dims and reshape"
        def describe(size: int) -> str:
            return "a variable number of" if size == WILDCARD_DIM else str(size)

        return [
            SpecError(
                f"{tpath}.reshape.shape",
                f"holds {describe(shape_size)} elements but dims {dims} hold {describe(dims_size)}",
            )
        ]
    if dims_size != WILDCARD_DIM:
        return []
    dims_runs, shape_runs = _fixed_runs(dims), _fixed_runs(shape)
    if len(dims_runs) != len(shape_runs):
        # "has different number of variable-size dimensions for dims and reshape"
        message = f"has {len(shape_runs) - 1} variable dimensions but dims {dims} have {len(dims_runs) - 1}"
        return [SpecError(f"{tpath}.reshape.shape", message)]
    if dims_runs != shape_runs:
        # "has different size for dims and reshape", run by run
        message = f"groups its fixed dimensions into {shape_runs} elements but dims {dims} into {dims_runs}"
        return [SpecError(f"{tpath}.reshape.shape", message)]
    return []


def _kind_errors(tensor: Mapping[str, Any], tpath: str, key: str, tensorrt: bool) -> list[SpecError]:
    """ValidateModelInput/Output: image formats, shape tensors, non-linear formats and label files."""
    errors = []
    image_format = tensor.get("format") if key == "input" else None
    if image_format in IMAGE_FORMATS and len(tensor.get("dims") or []) != 3:
        # "model input NHWC/NCHW require 3 dims"
        errors.append(SpecError(f"{tpath}.dims", f"{image_format} needs exactly 3 dims"))
    if tensor.get("isShapeTensor") and not tensorrt:
        # "shape tensors are only supported for TensorRT platform"
        errors.append(
            SpecError(f"{tpath}.isShapeTensor", "only TensorRT models (tensorrt_plan) have shape tensors")
        )
    if tensor.get("isNonLinearFormatIo"):
        # ValidateNonLinearFormatIO
        if not tensorrt:
            message = "only TensorRT models (tensorrt_plan) have non-linear formats"
            errors.append(SpecError(f"{tpath}.isNonLinearFormatIo", message))
        elif len(tensor.get("dims") or []) != 3:
            errors.append(SpecError(f"{tpath}.dims", "a non-linear format needs exactly 3 dims"))
    label = str(tensor.get("labelFilename") or "")
    if label_escapes(label):
        errors.append(SpecError(f"{tpath}.labelFilename", f"{label!r} is outside the model folder"))
    return errors


# ---------------------------------------------------------------- batch inputs and outputs


def _sources_errors(
    item: Mapping[str, Any], ipath: str, what: str, default_kind: str, inputs: set[str]
) -> list[SpecError]:
    """ValidateBatchIO: exactly one source input, an input of the model."""
    sources = item.get("sourceInput") or []
    errors = []
    if len(sources) != 1:
        # "batch input kind ... expects 1 source input, got N"
        kind = item.get("kind") or default_kind
        message = f"{what} kind {kind} takes exactly 1 source input, got {len(sources)}"
        errors.append(SpecError(f"{ipath}.sourceInput", message))
    for index, source in enumerate(sources):
        if source not in inputs:
            # "unknown source input name"
            errors.append(
                SpecError(f"{ipath}.sourceInput[{index}]", f"{source!r} is not an input of the model")
            )
    return errors


def _batch_input_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    inputs = {t.get("name", "") for t in config.get("input") or []}
    errors = []
    for index, item in enumerate(config.get("batchInput") or []):
        ipath = f"{path}.batchInput[{index}]"
        errors.extend(_sources_errors(item, ipath, "batch input", "BATCH_ELEMENT_COUNT", inputs))
        data_type = item.get("dataType", "TYPE_INVALID")
        if data_type not in BATCH_INPUT_TYPES:
            # "batch input data type must be TYPE_INT32 or TYPE_FP32"
            errors.append(
                SpecError(f"{ipath}.dataType", f"is {data_type}; a batch input is TYPE_INT32 or TYPE_FP32")
            )
    return errors


def _batch_output_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    inputs = {t.get("name", "") for t in config.get("input") or []}
    outputs = {t.get("name", "") for t in config.get("output") or []}
    errors = []
    for index, item in enumerate(config.get("batchOutput") or []):
        ipath = f"{path}.batchOutput[{index}]"
        errors.extend(_sources_errors(item, ipath, "batch output", "BATCH_SCATTER_WITH_INPUT_SHAPE", inputs))
        seen: set[str] = set()
        for tindex, target in enumerate(item.get("targetName") or []):
            if target not in outputs:
                # "unknown target output name"
                errors.append(
                    SpecError(f"{ipath}.targetName[{tindex}]", f"{target!r} is not an output of the model")
                )
            elif target in seen:
                # "target output name ... can only be specified once"
                errors.append(SpecError(f"{ipath}.targetName[{tindex}]", f"{target!r} is named twice"))
            seen.add(target)
    return errors

"""A model's inputs checked against its config before a request: names, count, dtype and shape (pure)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Triton's DataType enum: config names (and proto3 JSON numbers) -> the wire (KServe v2) names.
_DATA_TYPE_NUMBERS = {
    1: "TYPE_BOOL",
    2: "TYPE_UINT8",
    3: "TYPE_UINT16",
    4: "TYPE_UINT32",
    5: "TYPE_UINT64",
    6: "TYPE_INT8",
    7: "TYPE_INT16",
    8: "TYPE_INT32",
    9: "TYPE_INT64",
    10: "TYPE_FP16",
    11: "TYPE_FP32",
    12: "TYPE_FP64",
    13: "TYPE_STRING",
    14: "TYPE_BF16",
}
# The numpy dtype an input of each wire type is sent as (BF16 goes as float32, as tritonclient sends it).
NUMPY_TYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
    "BF16": np.dtype(np.float32),
}


class InputError(ValueError):
    """Inputs a model's config refuses, found before anything is sent; names the model and the input."""

    def __init__(self, model: str, message: str, input_name: str | None = None) -> None:
        where = f"model {model}, input {input_name}" if input_name else f"model {model}"
        super().__init__(f"{where}: {message}")
        self.model = model
        self.input_name = input_name


def _get(config: Mapping[str, Any], snake: str, default: Any = None) -> Any:
    """A config field by its proto name (Triton's JSON, gRPC as_json) or its camelCase name (the spec)."""
    if snake in config:
        return config[snake]
    head, *rest = snake.split("_")
    camel = head + "".join(word.capitalize() for word in rest)
    return config.get(camel, default)


def wire_type(data_type: Any) -> str:
    """A config data type (TYPE_FP32, its enum number, or already FP32) as the wire names it (FP32)."""
    name = _DATA_TYPE_NUMBERS.get(data_type, str(data_type)) if isinstance(data_type, int) else str(data_type)
    name = name.removeprefix("TYPE_")
    wire = "BYTES" if name == "STRING" else name
    if wire not in NUMPY_TYPES:
        raise ValueError(f"unknown data type {data_type!r}")
    return wire


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model's config."""

    name: str
    datatype: str  # the wire name: FP32, INT32, BYTES, ...
    dims: tuple[int, ...]  # without the batch dimension; -1 is any size
    optional: bool = False

    def describe(self, max_batch_size: int) -> str:
        return f"{self.datatype} {list(full_shape(self.dims, max_batch_size))}"


@dataclass(frozen=True)
class Signature:
    """What a model takes and gives, as its config says."""

    model: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0
    decoupled: bool = False

    @classmethod
    def from_config(cls, model: str, config: Mapping[str, Any]) -> Signature:
        """From a ModelConfig as a dict: the spec's proto3 JSON (camelCase) or Triton's (snake_case)."""

        def tensors(key: str) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(
                    name=str(t["name"]),
                    datatype=wire_type(_get(t, "data_type", "TYPE_INVALID")),
                    dims=tuple(int(d) for d in t.get("dims") or ()),
                    optional=bool(t.get("optional", False)),
                )
                for t in config.get(key) or ()
            )

        policy = _get(config, "model_transaction_policy") or {}
        return cls(
            model=model,
            inputs=tensors("input"),
            outputs=tensors("output"),
            max_batch_size=int(_get(config, "max_batch_size", 0) or 0),
            decoupled=bool(policy.get("decoupled", False)),
        )

    def input_names(self) -> str:
        return ", ".join(i.name for i in self.inputs) or "none"


@dataclass(frozen=True)
class CheckedInput:
    """An input ready to send: its name, wire data type and the array of that type."""

    name: str
    datatype: str
    data: np.ndarray[Any, Any]


def full_shape(dims: Sequence[int], max_batch_size: int) -> tuple[int, ...]:
    """The shape a request carries: the batch dimension (-1) first when the model batches."""
    return ((-1,) if max_batch_size > 0 else ()) + tuple(dims)


def bind(signature: Signature, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs given by position (the config's order) or by name, as {name: value}; never both."""
    model = signature.model
    if args and kwargs:
        raise InputError(
            model,
            f"inputs given both by position ({len(args)}) and by name ({', '.join(kwargs)}): "
            "give all of them by position (in the config's order) or all by name",
        )
    required = [i.name for i in signature.inputs if not i.optional]
    if args:
        low, high = len(required), len(signature.inputs)
        if not low <= len(args) <= high:
            count = f"{low}" if low == high else f"{low} to {high}"
            raise InputError(
                model,
                f"takes {count} inputs by position ({signature.input_names()}, in the config's order), "
                f"got {len(args)}",
            )
        return {spec.name: value for spec, value in zip(signature.inputs, args, strict=False)}
    known = {i.name for i in signature.inputs}
    unknown = [name for name in kwargs if name not in known]
    if unknown:
        raise InputError(
            model, f"no input named {unknown[0]!r} (its inputs: {signature.input_names()})", unknown[0]
        )
    missing = [name for name in required if name not in kwargs]
    if missing:
        spec = next(i for i in signature.inputs if i.name == missing[0])
        raise InputError(
            model,
            f"missing (expected {spec.describe(signature.max_batch_size)}; "
            f"the model takes {signature.input_names()})",
            missing[0],
        )
    return {spec.name: kwargs[spec.name] for spec in signature.inputs if spec.name in kwargs}


def _first_difference(same: np.ndarray[Any, Any], original: np.ndarray[Any, Any], converted: Any) -> str:
    index = tuple(int(i) for i in np.argwhere(~same)[0]) if same.ndim else ()
    where = f" at {list(index)}" if index else ""
    return f"{original[index].item()!r}{where} would become {converted[index].item()!r}"


def _to_strings(spec: TensorSpec, model: str, array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if array.dtype.kind in "US":
        return array.astype(np.object_)
    if array.dtype.kind == "O":
        bad = [x for x in array.flat if not isinstance(x, str | bytes)][:1]
        if not bad:
            return array
        got = f"{type(bad[0]).__name__} values ({bad[0]!r})"
    else:
        got = f"{array.dtype.name} values"
    raise InputError(model, f"expected BYTES (str or bytes values), got {got}", spec.name)


def convert(spec: TensorSpec, model: str, value: Any) -> np.ndarray[Any, Any]:
    """``value`` as an array of the input's type, when no value changes; InputError otherwise.

    A numpy array is converted when every value survives (int64 [1, 2] to INT32, float64 [0.5] to
    FP32), refused when one does not (0.1 to FP32, -1 to UINT8, 2.5 to INT32, 300 to INT8). Python
    lists and numbers have no precision of their own: their floats may be rounded to a narrower
    float type (0.1 to FP32), but never overflow, and everything else is checked as for arrays.
    """
    is_array = isinstance(value, np.ndarray)
    try:
        # Lists of str and bytes as they are (numpy would make the bytes str, or the str bytes).
        array = (
            np.array(value, np.object_) if spec.datatype == "BYTES" and not is_array else np.asarray(value)
        )
    except (ValueError, TypeError) as exc:  # ragged nested lists
        raise InputError(model, f"not an array: {exc}", spec.name) from exc
    if spec.datatype == "BYTES":
        return _to_strings(spec, model, array)
    target = NUMPY_TYPES[spec.datatype]
    if array.dtype.kind not in "biufc":
        raise InputError(model, f"expected {spec.datatype} numbers, got {array.dtype.name} values", spec.name)
    if array.dtype == target and spec.datatype != "BF16":
        return array
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = array.astype(target)
        if not is_array and array.dtype.kind == "f" and target.kind == "f":
            same = np.isfinite(converted) | ~np.isfinite(array)
        else:
            same = np.asarray(converted == array)
            if array.dtype.kind in "fc" and target.kind == "f":
                same |= np.isnan(converted) & np.isnan(array)
    if not same.all():
        raise InputError(
            model,
            f"{array.dtype.name} values cannot be sent as {spec.datatype} ({target.name}) without loss: "
            f"{_first_difference(same, array, converted)}",
            spec.name,
        )
    if spec.datatype == "BF16":
        bits = np.ascontiguousarray(converted).view(np.uint32) & 0xFFFF
        if bits.any() and is_array:
            raise InputError(
                model,
                f"{array.dtype.name} values cannot be sent as BF16 without loss "
                "(bfloat16 keeps 8 bits of mantissa)",
                spec.name,
            )
    return converted


def check_shape(spec: TensorSpec, model: str, shape: Sequence[int], max_batch_size: int) -> None:
    """``shape`` against the config's dims (and the batch dimension first when the model batches)."""
    expected = full_shape(spec.dims, max_batch_size)
    batch_note = (
        f" (max_batch_size {max_batch_size}: the first dimension is the batch, 1 to {max_batch_size};"
        " -1 is any size)"
        if max_batch_size > 0
        else " (-1 is any size)"
    )
    if len(shape) != len(expected):
        raise InputError(
            model,
            f"shape {list(shape)} has {len(shape)} dimensions, expected {len(expected)}: "
            f"{list(expected)}{batch_note}",
            spec.name,
        )
    for axis, (got, want) in enumerate(zip(shape, expected, strict=True)):
        if want not in (-1, got):
            raise InputError(
                model,
                f"shape {list(shape)} does not fit {list(expected)}{batch_note}: "
                f"dimension {axis} is {got}, expected {want}",
                spec.name,
            )
    if max_batch_size > 0 and shape[0] > max_batch_size:
        raise InputError(
            model,
            f"batch of {shape[0]} (shape {list(shape)}) is larger than max_batch_size {max_batch_size}",
            spec.name,
        )


def check_inputs(signature: Signature, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[CheckedInput]:
    """Bind, convert and shape-check every input; the first problem raises InputError naming the input."""
    bound = bind(signature, args, kwargs)
    checked: list[CheckedInput] = []
    batch: tuple[str, int] | None = None
    for spec in signature.inputs:
        if spec.name not in bound:
            continue
        data = convert(spec, signature.model, bound[spec.name])
        check_shape(spec, signature.model, data.shape, signature.max_batch_size)
        if signature.max_batch_size > 0:
            if batch is not None and data.shape[0] != batch[1]:
                raise InputError(
                    signature.model,
                    f"batch of {data.shape[0]}, but {batch[0]} has a batch of {batch[1]}: "
                    "every input of a request has the same batch size",
                    spec.name,
                )
            batch = batch or (spec.name, data.shape[0])
        checked.append(CheckedInput(spec.name, spec.datatype, data))
    return checked

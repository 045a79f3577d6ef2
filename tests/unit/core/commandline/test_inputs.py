"""The pure input checks of core/commandline/inputs.py: binding, lossless conversion and shapes, each refusal
named."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from triton_operator.core.commandline.inputs import (
    InputError,
    Signature,
    TensorSpec,
    check_inputs,
    check_shape,
    convert,
    wire_type,
)

# As the spec writes a config (camelCase, int64 dims as strings) ...
SPEC_CONFIG: dict[str, Any] = {
    "maxBatchSize": 4,
    "input": [
        {"name": "A", "dataType": "TYPE_FP32", "dims": ["2"]},
        {"name": "B", "dataType": "TYPE_INT8", "dims": ["-1"]},
        {"name": "C", "dataType": "TYPE_STRING", "dims": ["1"], "optional": True},
    ],
    "output": [{"name": "Y", "dataType": "TYPE_FP32", "dims": ["2"]}],
}
# ... and as Triton serves it (snake_case, numbers).
SERVED_CONFIG: dict[str, Any] = {
    "name": "m",
    "max_batch_size": 4,
    "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [2]},
        {"name": "B", "data_type": "TYPE_INT8", "dims": [-1]},
        {"name": "C", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    ],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
    "model_transaction_policy": {"decoupled": False},
}
SIGNATURE = Signature.from_config("m", SPEC_CONFIG)
A = np.zeros((3, 2), np.float32)
B = np.zeros((3, 5), np.int8)


def test_both_spellings_of_a_config_give_one_signature() -> None:
    assert Signature.from_config("m", SERVED_CONFIG) == SIGNATURE
    assert SIGNATURE.inputs[2] == TensorSpec("C", "BYTES", (1,), optional=True)
    decoupled = Signature.from_config("d", {"modelTransactionPolicy": {"decoupled": True}})
    assert decoupled.decoupled and decoupled.max_batch_size == 0


@pytest.mark.parametrize(
    ("data_type", "wire"),
    [("TYPE_FP32", "FP32"), ("TYPE_STRING", "BYTES"), (11, "FP32"), (13, "BYTES"), ("BF16", "BF16")],
)
def test_wire_types(data_type: Any, wire: str) -> None:
    assert wire_type(data_type) == wire


def test_an_unknown_data_type_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown data type 'TYPE_COMPLEX'"):
        wire_type("TYPE_COMPLEX")


@pytest.mark.parametrize(
    ("args", "kwargs", "names"),
    [
        ((A, B), {}, ["A", "B"]),
        ((A, B, [["x"]] * 3), {}, ["A", "B", "C"]),
        ((), {"B": B, "A": A}, ["A", "B"]),  # config order, whatever the call's
        ((), {"A": A, "B": B, "C": [["x"]] * 3}, ["A", "B", "C"]),
    ],
    ids=["positional", "positional with optional", "by name", "by name with optional"],
)
def test_inputs_bind_by_position_or_by_name(
    args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]
) -> None:
    checked = check_inputs(SIGNATURE, args, kwargs)
    assert [c.name for c in checked] == names
    assert [c.datatype for c in checked] == ["FP32", "INT8", "BYTES"][: len(names)]


@pytest.mark.parametrize(
    ("args", "kwargs", "input_name", "message"),
    [
        ((A,), {"B": B}, None, r"model m: inputs given both by position \(1\) and by name \(B\)"),
        (
            (A,),
            {},
            None,
            r"model m: takes 2 to 3 inputs by position \(A, B, C, in the config's order\), got 1",
        ),
        ((A, B, A, A), {}, None, "got 4"),
        ((), {"A": A, "B": B, "D": B}, "D", r"model m, input D: no input named 'D' \(its inputs: A, B, C\)"),
        ((), {"A": A}, "B", r"model m, input B: missing \(expected INT8 \[-1, -1\]"),
        ((), {}, "A", "input A: missing"),
    ],
    ids=["mixed", "too few", "too many", "unknown name", "missing", "nothing"],
)
def test_binding_refusals_name_what_was_expected(
    args: tuple[Any, ...], kwargs: dict[str, Any], input_name: str | None, message: str
) -> None:
    with pytest.raises(InputError, match=message) as caught:
        check_inputs(SIGNATURE, args, kwargs)
    assert caught.value.input_name == input_name and caught.value.model == "m"


def spec(datatype: str, dims: tuple[int, ...] = (-1,)) -> TensorSpec:
    return TensorSpec("X", datatype, dims)


@pytest.mark.parametrize(
    ("datatype", "value", "expected"),
    [
        ("INT32", np.array([1, -2], np.int64), np.array([1, -2], np.int32)),
        ("INT64", np.array([1, 2], np.int8), np.array([1, 2], np.int64)),
        ("FP32", np.array([0.5, 2.0], np.float64), np.array([0.5, 2.0], np.float32)),
        ("FP32", [0.1, 2], np.array([0.1, 2], np.float32)),  # Python floats round to FP32
        ("FP32", np.array([np.nan, np.inf]), np.array([np.nan, np.inf], np.float32)),
        ("FP64", np.array([1, 2], np.int32), np.array([1.0, 2.0])),
        ("UINT8", [0, 255], np.array([0, 255], np.uint8)),
        ("BOOL", [0, 1], np.array([False, True])),
        ("INT32", np.array([3.0]), np.array([3], np.int32)),
        ("FP16", np.array([0.5], np.float32), np.array([0.5], np.float16)),
        ("BF16", np.array([1.5], np.float64), np.array([1.5], np.float32)),
        ("BYTES", ["a", b"b"], np.array(["a", b"b"], np.object_)),
        ("BYTES", np.array(["abc"]), np.array(["abc"], np.object_)),
    ],
)
def test_lossless_conversions(datatype: str, value: Any, expected: np.ndarray[Any, Any]) -> None:
    converted = convert(spec(datatype), "m", value)
    assert converted.dtype == expected.dtype
    np.testing.assert_array_equal(converted, expected)


@pytest.mark.parametrize(
    ("datatype", "value", "message"),
    [
        (
            "FP32",
            np.array([0.1, 0.5]),
            r"float64 values cannot be sent as FP32 \(float32\) without loss: 0\.1 at \[0\]",
        ),
        ("INT32", [1, 2.5], r"float64 values cannot be sent as INT32 .*2\.5 at \[1\]"),
        (
            "UINT8",
            np.array([[1, -1]]),
            r"int64 values cannot be sent as UINT8 .*-1 at \[0, 1\] would become 255",
        ),
        ("INT8", [300], r".*cannot be sent as INT8"),
        ("INT32", [2**40], r".*cannot be sent as INT32"),
        ("BOOL", [0, 2], r".*cannot be sent as BOOL"),
        ("FP16", [1e6], r".*cannot be sent as FP16"),  # overflows to inf, even from a Python float
        ("INT32", np.array([1 + 2j]), r"complex128 values cannot be sent as INT32"),
        ("BF16", np.array([0.1], np.float32), r".*cannot be sent as BF16 without loss"),
        ("INT32", ["1"], r"expected INT32 numbers, got str32 values"),
        ("BYTES", [1, 2], r"expected BYTES \(str or bytes values\), got int values \(1\)"),
        ("BYTES", np.array([1.5, 2.5]), r"expected BYTES \(str or bytes values\), got float64 values"),
        ("BYTES", [["a"], [None]], r"expected BYTES .*got NoneType values \(None\)"),
        ("FP32", [[1.0], [1.0, 2.0]], r"not an array"),
    ],
)
def test_lossy_or_wrong_values_are_refused(datatype: str, value: Any, message: str) -> None:
    with pytest.raises(InputError, match=r"model m, input X: " + message):
        convert(spec(datatype), "m", value)


@pytest.mark.parametrize(
    ("dims", "max_batch_size", "shape"),
    [
        ((4,), 8, (1, 4)),
        ((4,), 8, (8, 4)),
        ((-1, 3), 2, (2, 17, 3)),
        ((4,), 0, (4,)),
        ((-1,), 0, (0,)),
        ((2, -1), 0, (2, 9)),
    ],
)
def test_shapes_that_fit(dims: tuple[int, ...], max_batch_size: int, shape: tuple[int, ...]) -> None:
    check_shape(TensorSpec("X", "FP32", dims), "m", shape, max_batch_size)


@pytest.mark.parametrize(
    ("dims", "max_batch_size", "shape", "message"),
    [
        ((4,), 8, (4,), r"shape \[4\] has 1 dimensions, expected 2: \[-1, 4\] \(max_batch_size 8: the first"),
        ((4,), 8, (1, 5), r"shape \[1, 5\] does not fit \[-1, 4\] .*dimension 1 is 5, expected 4"),
        ((4,), 8, (9, 4), r"batch of 9 \(shape \[9, 4\]\) is larger than max_batch_size 8"),
        ((4,), 0, (1, 4), r".*has 2 dimensions, expected 1: \[4\] \(-1 is any size\)"),
        ((2, -1), 0, (3, 1), r".*dimension 0 is 3, expected 2"),
    ],
)
def test_shapes_that_do_not_fit(
    dims: tuple[int, ...], max_batch_size: int, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(InputError, match=r"model m, input X: " + message):
        check_shape(TensorSpec("X", "FP32", dims), "m", shape, max_batch_size)


def test_every_input_of_a_request_has_one_batch_size() -> None:
    with pytest.raises(InputError, match=r"input B: batch of 2, but A has a batch of 3"):
        check_inputs(SIGNATURE, (A, B[:2]), {})

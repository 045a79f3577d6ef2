"""Every model-config check mirrored from Triton refuses the config Triton refuses, naming the field.

The same configs go to a real tritonserver in tests/triton/test_real_triton_checks.py.
"""

from __future__ import annotations

import pytest

from triton_operator.core.spec.validation.spec import check_spec, spec_warnings
from triton_rules import ACCEPTED, REFUSED, Case, adder, ensemble


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_a_config_triton_refuses_is_refused_naming_the_field(case: Case) -> None:
    spec, errors = check_spec(case.spec())
    assert spec is not None
    assert [e.field for e in errors] == [case.spec_field], errors
    assert case.ours in errors[0].message


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_a_config_triton_accepts_is_accepted(case: Case) -> None:
    spec, errors = check_spec(case.spec())
    assert spec is not None
    assert errors == []


def test_every_case_is_named_once() -> None:
    ids = [c.id for c in REFUSED + ACCEPTED]
    assert len(ids) == len(set(ids))
    names = [m["name"] for c in REFUSED + ACCEPTED for m in c.models]
    assert len(names) == len(set(names))  # one repository holds them all for the real tritonserver


# ---------------------------------------------------------------- platform and backend, filled in


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"platform": "onnxruntime_onnx"}, None),  # the backend is filled in: onnxruntime
        ({"backend": "onnxruntime"}, None),  # the platform is filled in: onnxruntime_onnx
        ({"backend": "tensorflow"}, None),  # the version folder's files decide the platform
        ({"backend": "pytorch", "platform": "torch_aoti"}, None),  # newer tritonserver
        ({"backend": "my_backend", "platform": "anything"}, None),  # a custom backend takes any
        ({"platform": "tensorrt_plan", "defaultModelFilename": "model.onnx"}, None),
        ({"platform": "foo", "defaultModelFilename": "model.onnx"}, "platform"),  # onnxruntime filled in
        ({"platform": "foo", "defaultModelFilename": "model.py"}, None),  # python filled in: any platform
        ({"platform": "tensorflow_savedmodel", "backend": "pytorch"}, "platform"),
        ({"runtime": "libtriton_custom.so"}, None),
        ({"runtime": "sub/../../libtriton_custom.so"}, "runtime"),
        ({"backend": "."}, "backend"),
        ({"backend": "a\\b"}, "backend"),
    ],
)
def test_platform_and_backend_are_checked_as_triton_fills_them_in(
    fields: dict[str, str], error: str | None
) -> None:
    config = {k: v for k, v in adder(**fields).items() if not (k == "backend" and "backend" not in fields)}
    _, errors = check_spec({"repository": {"uri": "pvc://m/x"}, "models": [{"name": "m", "config": config}]})
    assert [e.field for e in errors] == ([f"spec.models[0].config.{error}"] if error else []), errors


# ---------------------------------------------------------------- warnings


CPU_IMAGE = "localhost/triton-operator/tritonserver-cpu:2.51.0"
NGC_IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"


@pytest.mark.parametrize(
    ("image", "fields", "warned"),
    [
        (NGC_IMAGE, {"backend": "tensorrtllm"}, "backend"),
        (NGC_IMAGE, {"backend": "onnxruntime"}, None),
        ("nvcr.io/nvidia/tritonserver:24.05-trtllm-python-py3", {"backend": "onnxruntime"}, "backend"),
        ("nvcr.io/nvidia/tritonserver:24.05-trtllm-python-py3", {"backend": "tensorrtllm"}, None),
        (CPU_IMAGE, {"backend": "python"}, None),
        (CPU_IMAGE, {"backend": "", "platform": "onnxruntime_onnx"}, "platform"),
        ("registry.example.com/team/triton:1.0", {"backend": "my_backend"}, None),  # an image we do not know
    ],
)
def test_a_backend_the_image_lacks_is_a_warning_not_an_error(
    image: str, fields: dict[str, str], warned: str | None
) -> None:
    spec, errors = check_spec(
        {"repository": {"uri": "pvc://m/x"}, "models": [{"name": "m", "config": adder(**fields)}]}
    )
    assert spec is not None and errors == []
    warnings = spec_warnings(spec, image)
    assert [w.field for w in warnings] == ([f"spec.models[0].config.{warned}"] if warned else [])
    if warned:
        assert "is not one of the image's backends (" in warnings[0].message
        assert "python" in warnings[0].message  # the backends the image has are named


def test_a_step_leaving_its_version_out_is_a_warning_where_no_policy_says() -> None:
    pipe = ensemble("add", step={"modelVersion": None})
    raw = {
        "repository": {"uri": "pvc://m/x"},
        "models": [{"name": "add", "config": adder()}, {"name": "pipe", "config": pipe}],
    }
    spec, errors = check_spec(raw)
    assert spec is not None and errors == []
    (warning,) = spec_warnings(spec, NGC_IMAGE)
    assert warning.field == "spec.models[1].config.ensembleScheduling.step[0].modelVersion"
    assert "asks for version 0 of 'add'; -1 asks for the latest" in warning.message
    pipe["ensembleScheduling"]["step"][0]["modelVersion"] = "-1"
    spec, _ = check_spec(raw)
    assert spec is not None and spec_warnings(spec, NGC_IMAGE) == []


@pytest.mark.parametrize(("profiles", "bad"), [(["0", "2"], None), (["-1"], 0), (["0", "x"], 1), ([""], 0)])
def test_tensorrt_profiles_are_indexes(profiles: list[str], bad: int | None) -> None:
    config = adder(backend="tensorrt", instanceGroup=[{"kind": "KIND_CPU", "profile": profiles}])
    _, errors = check_spec({"repository": {"uri": "pvc://m/x"}, "models": [{"name": "m", "config": config}]})
    expected = [] if bad is None else [f"spec.models[0].config.instanceGroup[0].profile[{bad}]"]
    assert [e.field for e in errors] == expected, errors

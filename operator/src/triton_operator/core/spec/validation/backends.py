"""Which backend runs a model, worked out from platform, backend and file name as tritonserver does."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from triton_operator.core.spec.validation.errors import SpecError

ENSEMBLE_PLATFORM = "ensemble"
TENSORRT_PLATFORM = "tensorrt_plan"

# Triton's AutoCompleteBackendFields fills in an empty backend, in this order: TensorFlow from its
# platforms (or, with no platform, its file names), then each backend below from its platforms or
# default_model_filename. "libtorch", "torch_aoti" and "model.pt2" are known to tritonserver
# releases after 2.51 only; an older image refuses them, a newer one runs them, so they pass here.
_TENSORFLOW_PLATFORMS = frozenset({"tensorflow_graphdef", "tensorflow_savedmodel"})
_TENSORFLOW_FILENAMES = frozenset({"model.graphdef", "model.savedmodel"})
_AUTOFILL: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = (
    ("tensorrt", frozenset({TENSORRT_PLATFORM}), frozenset({"model.plan"})),
    ("onnxruntime", frozenset({"onnxruntime_onnx"}), frozenset({"model.onnx"})),
    ("openvino", frozenset(), frozenset({"model.xml"})),
    (
        "pytorch",
        frozenset({"pytorch_libtorch", "libtorch", "torch_aoti"}),
        frozenset({"model.pt", "model.pt2"}),
    ),
    ("python", frozenset(), frozenset({"model.py"})),
)
# The platforms of the backends whose platform Triton checks (GetBackendType knows them); any other
# backend, custom ones included, runs whatever platform the config names.
TYPED_BACKEND_PLATFORMS: dict[str, frozenset[str]] = {
    "tensorflow": _TENSORFLOW_PLATFORMS,
    **{backend: platforms for backend, platforms, _ in _AUTOFILL if platforms},
}
KNOWN_PLATFORMS = frozenset(
    {ENSEMBLE_PLATFORM, *_TENSORFLOW_PLATFORMS, *(p for _, ps, _ in _AUTOFILL for p in ps)}
)

# The backends NVIDIA's tritonserver images ship (their /opt/tritonserver/backends), by the tag's
# variant: 24.xx and 25.xx "-py3" carry the framework backends, the LLM images only their own and
# Python. The project's CPU image (e2e/images/tritonserver, from the nvidia-pytriton wheel) has
# only Python. Used for warnings only: an image can always ship more.
_NGC_VARIANTS: dict[str, frozenset[str]] = {
    "py3": frozenset(
        {
            "dali",
            "fil",
            "identity",
            "onnxruntime",
            "openvino",
            "python",
            "pytorch",
            "repeat",
            "square",
            "tensorflow",
            "tensorrt",
        }
    ),
    "pyt-python-py3": frozenset({"pytorch", "python"}),
    "trtllm-python-py3": frozenset({"tensorrtllm", "python"}),
    "vllm-python-py3": frozenset({"vllm", "python"}),
}
_NGC_IMAGE = re.compile(r"^(?:[^/]+/)*tritonserver:[0-9]+\.[0-9]+-(?P<variant>[a-z0-9-]+)$")
_PROJECT_CPU_IMAGE = re.compile(r"^(?:[^/]+/)*triton-operator/tritonserver-cpu:[^/]+$")


def effective_backend(config: Mapping[str, Any]) -> str:
    """The backend tritonserver runs ``config`` with; "" where only the repository's files decide."""
    backend = str(config.get("backend") or "")
    if backend:
        return backend
    platform = str(config.get("platform") or "")
    filename = str(config.get("defaultModelFilename") or "")
    if platform in _TENSORFLOW_PLATFORMS or (not platform and filename in _TENSORFLOW_FILENAMES):
        return "tensorflow"
    for name, platforms, filenames in _AUTOFILL:
        if platform in platforms or filename in filenames:
            return name
    return ""


def is_tensorrt(config: Mapping[str, Any]) -> bool:
    """Whether the model's platform is (or is filled in as) tensorrt_plan."""
    platform = config.get("platform") or ""
    return bool(platform == TENSORRT_PLATFORM or (not platform and effective_backend(config) == "tensorrt"))


def _escapes(name: str) -> bool:
    """A ".." segment: the only way a name joined to a directory can leave it."""
    return ".." in re.split(r"[/\\]", name)


def backend_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """platform and backend as Triton's ValidateModelConfig checks them after filling in the backend,
    and backend and runtime as library names that stay in the backend directory."""
    platform = str(config.get("platform") or "")
    backend = effective_backend(config)
    backend_field = f"{path}.backend" if config.get("backend") else f"{path}.defaultModelFilename"
    errors = []
    if platform == ENSEMBLE_PLATFORM and backend:
        # ValidateModelConfig: "Ensemble model ... must have platform type 'ensemble' and empty backend"
        errors.append(
            SpecError(backend_field, "must be left out for platform: ensemble (Triton runs ensembles)")
        )
    elif platform and not backend and platform != ENSEMBLE_PLATFORM and "ensembleScheduling" not in config:
        # ValidateModelConfig: "unexpected platform type" (no backend was filled in for it); with
        # ensembleScheduling, the ensemble checks say the platform must be "ensemble"
        errors.append(
            SpecError(
                f"{path}.platform",
                f"{platform!r} is not a platform Triton knows ({', '.join(sorted(KNOWN_PLATFORMS))});"
                " set backend to run it with another backend",
            )
        )
    elif platform and platform not in TYPED_BACKEND_PLATFORMS.get(backend, {platform}):
        # ValidateModelConfig: "unexpected 'platform' and 'backend' pair"
        runs = ", ".join(sorted(TYPED_BACKEND_PLATFORMS[backend]))
        errors.append(
            SpecError(f"{path}.platform", f"{platform!r} does not go with backend {backend!r} ({runs})")
        )
    given = str(config.get("backend") or "")
    if given in (".", "..") or re.search(r"[/\\]", given):
        # TritonModel::GetBackendLibraryProperties finds a backend's library in <backends>/<backend>/:
        # a name with a path in it is never found there, or escapes the backend directory.
        errors.append(
            SpecError(
                f"{path}.backend", f"{given!r} is not a backend name (a folder of the image's backends)"
            )
        )
    runtime = str(config.get("runtime") or "")
    if _escapes(runtime):
        # GetBackendLibraryProperties: "backend library name ... escapes backend directory"
        errors.append(SpecError(f"{path}.runtime", f"{runtime!r} escapes the backend directory"))
    return errors


def label_escapes(filename: str) -> bool:
    """A label file outside the model folder (Model::Init: "is outside model directory")."""
    return _escapes(filename)


# ---------------------------------------------------------------- the image's backends


def image_backends(image: str) -> frozenset[str] | None:
    """The backends ``image`` is known to ship, or None for an image this table does not know."""
    if _PROJECT_CPU_IMAGE.match(image):
        return frozenset({"python"})
    found = _NGC_IMAGE.match(image)
    return _NGC_VARIANTS.get(found.group("variant")) if found else None


def backend_warnings(config: Mapping[str, Any], path: str, known: frozenset[str]) -> list[SpecError]:
    """A backend the image is not known to ship: worth a look, not an error (custom images add their own)."""
    backend = effective_backend(config)
    if not backend or backend in known or config.get("platform") == ENSEMBLE_PLATFORM:
        return []
    source = (
        "backend"
        if config.get("backend")
        else "platform"
        if config.get("platform")
        else "defaultModelFilename"
    )
    field = f"{path}.{source}"
    return [
        SpecError(
            field,
            f"backend {backend!r} is not one of the image's backends ({', '.join(sorted(known))});"
            " the model loads only if the image ships it",
        )
    ]

"""The operator's own policy over what a TritonService may run: tritonserver images and pod volume types.

Whoever may create a TritonService may otherwise create pods with any image and any volume, a
hostPath among them. The policy is the operator's (settings, chart values), not the spec's: a
spec it refuses is held like an invalid one (the serving revision keeps serving), with Ready
saying which field the policy refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from triton_operator.core.builders import triton_image
from triton_operator.core.validation.errors import SpecError
from triton_operator.models import TritonService
from triton_operator.settings import Settings

_REFERENCE_SEPARATORS = ("/", ":", "@")


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """Whether ``image`` starts with one of ``prefixes`` (no prefixes: every image is allowed).

    A prefix matches at a reference boundary only, so ``registry.example.com/ml`` allows
    ``registry.example.com/ml/tritonserver:25.01`` but not ``registry.example.com/ml-other/x``:

    >>> image_allowed("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia"])
    True
    >>> image_allowed("nvcr.io/nvidia-evil/tritonserver:1", ["nvcr.io/nvidia"])
    False
    >>> image_allowed("nvcr.io/nvidia/tritonserver:25.01-py3", ["nvcr.io/nvidia/tritonserver:"])
    True
    >>> image_allowed("docker.io/anything", [])
    True
    """
    if not prefixes:
        return True
    for prefix in prefixes:
        if image == prefix:
            return True
        if image.startswith(prefix) and (
            prefix.endswith(_REFERENCE_SEPARATORS) or image[len(prefix)] in _REFERENCE_SEPARATORS
        ):
            return True
    return False


def volume_types(volume: Mapping[str, Any]) -> list[str]:
    """The source types a pod volume names (every key but ``name``), e.g. ``["hostPath"]``."""
    return sorted(key for key in volume if key != "name")


def policy_errors(ts: TritonService, settings: Settings) -> list[SpecError]:
    """What the operator's policy refuses in ``ts``, each naming its field and the setting.

    The image checked is the one the pods would run: the spec's, else the operator's default (a
    default outside the allowed prefixes is refused too, so the misconfiguration shows).
    """
    errors: list[SpecError] = []
    image = triton_image(ts, settings)
    allowed_image_prefixes = settings.allowed_image_prefixes
    if not image_allowed(image, allowed_image_prefixes):
        field = "spec.image" if ts.spec.image else "spec.image (the operator's default image)"
        errors.append(
            SpecError(
                field,
                f"image {image!r} is not allowed by the operator's policy: it must start with one of "
                f"{', '.join(repr(p) for p in allowed_image_prefixes)} "
                "(setting TRITON_OPERATOR_ALLOWED_IMAGE_PREFIXES, chart value policy.allowedImagePrefixes)",
            )
        )
    forbidden = set(settings.forbidden_volume_types)
    for index, volume in enumerate(ts.spec.volumes):
        for kind in volume_types(volume):
            if kind in forbidden:
                errors.append(
                    SpecError(
                        f"spec.volumes[{index}].{kind}",
                        f"volume type {kind} is refused by the operator's policy "
                        "(setting TRITON_OPERATOR_FORBIDDEN_VOLUME_TYPES, chart value "
                        "policy.forbiddenVolumeTypes)",
                    )
                )
    return errors

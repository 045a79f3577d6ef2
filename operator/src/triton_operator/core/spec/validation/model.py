"""One model's config: Triton's ValidateModelConfig and ValidateInstanceGroup, then every other check."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from triton_operator.core.spec.field_error import ModelConfigError
from triton_operator.core.spec.modelconfig import config_errors, parse_model_config
from triton_operator.core.spec.validation.backends import backend_errors, is_tensorrt
from triton_operator.core.spec.validation.batching import batching_errors
from triton_operator.core.spec.validation.ensemble import ensemble_errors
from triton_operator.core.spec.validation.errors import SpecError, as_int
from triton_operator.core.spec.validation.tensors import tensor_errors
from triton_operator.models import ModelSpec

PROFILE_INDEX = re.compile(r"\s*[+-]?[0-9]+")


def _max_batch_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    max_batch = as_int(config.get("maxBatchSize"))
    if max_batch < 0:
        # ValidateModelConfig: "'max_batch_size' must be non-negative value"
        return [SpecError(f"{path}.maxBatchSize", f"is {max_batch}; 0 (no batching) or more")]
    return []


def _instance_group_errors(config: Mapping[str, Any], path: str, pod_gpus: int) -> list[SpecError]:
    """ValidateInstanceGroup, with the pod's GPUs for the node's: kinds, GPU ids and profiles.

    A negative count is refused, where Triton takes the default count instead.
    """
    errors: list[SpecError] = []
    tensorrt = is_tensorrt(config)
    for index, group in enumerate(config.get("instanceGroup") or []):
        gpath = f"{path}.instanceGroup[{index}]"
        errors.extend(_profile_errors(group.get("profile") or [], gpath, tensorrt))
        kind = group.get("kind", "KIND_AUTO")
        gpus = [as_int(g) for g in group.get("gpus") or []]
        if as_int(group.get("count"), 1) < 0:
            errors.append(SpecError(f"{gpath}.count", "must not be negative"))
        if kind in ("KIND_CPU", "KIND_MODEL") and gpus:
            errors.append(SpecError(f"{gpath}.gpus", f"{kind} runs on no GPU; leave gpus out"))
        if kind == "KIND_GPU" and pod_gpus == 0:
            errors.append(
                SpecError(f"{gpath}.kind", "KIND_GPU needs GPUs in the pod (spec.resources.gpus > 0)")
            )
        for gpu_index, gpu in enumerate(gpus):
            if gpu < 0 or (pod_gpus > 0 and gpu >= pod_gpus):
                errors.append(
                    SpecError(
                        f"{gpath}.gpus[{gpu_index}]",
                        f"no GPU {gpu} in a pod with spec.resources.gpus={pod_gpus}",
                    )
                )
    return errors


def _profile_errors(profiles: list[str], gpath: str, tensorrt: bool) -> list[SpecError]:
    """Optimization profiles: TensorRT's only, each a non-negative index (read as C++ stoi reads it)."""
    if profiles and not tensorrt:
        # "specifies profile field which is only supported for TensorRT models"
        return [
            SpecError(f"{gpath}.profile", "only TensorRT models (tensorrt_plan) have optimization profiles")
        ]
    errors = []
    for index, profile in enumerate(profiles):
        number = PROFILE_INDEX.match(profile)
        if number is None or int(number.group()) < 0:
            # GetProfileIndex: "unable to parse" / "specifies invalid profile"
            message = f"is {profile!r}; a profile is the index of one, 0 or more"
            errors.append(SpecError(f"{gpath}.profile[{index}]", message))
    return errors


def _response_cache_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    decoupled = (config.get("modelTransactionPolicy") or {}).get("decoupled")
    if decoupled and (config.get("responseCache") or {}).get("enable"):
        # ValidateModelConfig: "Response Cache does not currently support model ... with 'decoupled'
        # transaction policy" (with sequence batching: see batching)
        message = (
            "cannot be used with modelTransactionPolicy.decoupled: the cache does not serve decoupled models"
        )
        return [SpecError(f"{path}.responseCache.enable", message)]
    return []


def _metrics_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """ValidateModelMetrics: each metric control names a family and gives histogram buckets."""
    errors = []
    for index, control in enumerate((config.get("modelMetrics") or {}).get("metricControl") or []):
        mpath = f"{path}.modelMetrics.metricControl[{index}]"
        identifier = control.get("metricIdentifier")
        if identifier is None:
            errors.append(SpecError(f"{mpath}.metricIdentifier", "is required"))
        elif not identifier.get("family"):
            errors.append(SpecError(f"{mpath}.metricIdentifier.family", "is required"))
        histogram = control.get("histogramOptions")
        if histogram is None:
            errors.append(SpecError(f"{mpath}.histogramOptions", "is required"))
        elif not histogram.get("buckets"):
            errors.append(SpecError(f"{mpath}.histogramOptions.buckets", "is required"))
    return errors


def _version_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """A specific policy names versions, each >= 1 (stricter than Triton, which loads a folder "0")."""
    specific = (config.get("versionPolicy") or {}).get("specific")
    if specific is None:
        return []
    errors = []
    versions = specific.get("versions") or []
    if not versions:
        errors.append(SpecError(f"{path}.versionPolicy.specific.versions", "names no version"))
    for index, version in enumerate(versions):
        if as_int(version) < 1:
            errors.append(
                SpecError(
                    f"{path}.versionPolicy.specific.versions[{index}]", f"is {version}; versions are >= 1"
                )
            )
    return errors


def model_config_errors(
    model: ModelSpec, index: int, models: Mapping[str, ModelSpec], pod_gpus: int
) -> list[SpecError]:
    """Every problem of one model's config, at paths under spec.models[index].config."""
    path = f"spec.models[{index}].config"
    found: list[ModelConfigError] = config_errors(model.config, field=path)
    if not found:
        try:
            parse_model_config(model.name, model.config, field=path)
        except ModelConfigError as exc:
            found.append(exc)
    if found:
        return [SpecError(e.field, e.problem) for e in found]
    config = model.config
    return [
        *backend_errors(config, path),
        *_max_batch_errors(config, path),
        *tensor_errors(config, path),
        *batching_errors(config, path),
        *_response_cache_errors(config, path),
        *_metrics_errors(config, path),
        *_instance_group_errors(config, path, pod_gpus),
        *_version_errors(config, path),
        *ensemble_errors(model, config, path, models),
    ]

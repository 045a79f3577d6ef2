"""One model's config: tensors, batching, instance groups and versions, as tritonserver checks them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton_operator.core.modelconfig import ModelConfigError, config_errors, parse_model_config
from triton_operator.core.validation.ensemble import ensemble_errors
from triton_operator.core.validation.errors import SpecError, as_int
from triton_operator.models import ModelSpec

WILDCARD_DIM = -1


def _io_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    errors: list[SpecError] = []
    batching = as_int(config.get("maxBatchSize")) > 0
    for key in ("input", "output"):
        seen: dict[str, int] = {}
        for index, tensor in enumerate(config.get(key) or []):
            tpath = f"{path}.{key}[{index}]"
            name = tensor.get("name", "")
            if not name:
                errors.append(SpecError(f"{tpath}.name", "is required"))
            elif name in seen:
                errors.append(
                    SpecError(f"{tpath}.name", f"duplicate {key} {name!r} (also {key}[{seen[name]}])")
                )
            else:
                seen[name] = index
            for dim_index, dim in enumerate(tensor.get("dims") or []):
                if as_int(dim) < 1 and as_int(dim) != WILDCARD_DIM:
                    errors.append(
                        SpecError(
                            f"{tpath}.dims[{dim_index}]", f"is {dim}; a dimension is >= 1, or -1 (variable)"
                        )
                    )
            reshape = tensor.get("reshape")
            if reshape is not None:
                shape = reshape.get("shape") or []
                if not shape and not batching:
                    errors.append(SpecError(f"{tpath}.reshape", "cannot be empty for a non-batching model"))
                for dim_index, dim in enumerate(shape):
                    if as_int(dim) < 1 and as_int(dim) != WILDCARD_DIM:
                        errors.append(
                            SpecError(
                                f"{tpath}.reshape.shape[{dim_index}]",
                                f"is {dim}; a dimension is >= 1, or -1 (variable)",
                            )
                        )
            image_format = tensor.get("format") if key == "input" else None
            if image_format in ("FORMAT_NHWC", "FORMAT_NCHW") and len(tensor.get("dims") or []) != 3:
                errors.append(SpecError(f"{tpath}.dims", f"{tensor['format']} needs exactly 3 dims"))
    return errors


def _batching_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    errors: list[SpecError] = []
    max_batch = as_int(config.get("maxBatchSize"))
    dynamic = config.get("dynamicBatching")
    if dynamic is not None:
        dpath = f"{path}.dynamicBatching"
        if max_batch <= 0:
            message = f"needs maxBatchSize > 0 (it is {max_batch}): a model that does not batch cannot batch"
            errors.append(SpecError(dpath, message))
        for index, size in enumerate(dynamic.get("preferredBatchSize") or []):
            if max_batch > 0 and not 0 < as_int(size) <= max_batch:
                errors.append(
                    SpecError(
                        f"{dpath}.preferredBatchSize[{index}]",
                        f"is {size}; must be in [1, maxBatchSize={max_batch}]",
                    )
                )
        levels = as_int(dynamic.get("priorityLevels"))
        if levels:
            default_level = as_int(dynamic.get("defaultPriorityLevel"))
            if not 1 <= default_level <= levels:
                errors.append(
                    SpecError(
                        f"{dpath}.defaultPriorityLevel",
                        f"is {default_level}; must be in [1, priorityLevels={levels}]",
                    )
                )
            for key in dynamic.get("priorityQueuePolicy") or {}:
                if not 1 <= as_int(key) <= levels:
                    errors.append(
                        SpecError(
                            f"{dpath}.priorityQueuePolicy[{key}]", f"priority level must be in [1, {levels}]"
                        )
                    )
        elif dynamic.get("priorityQueuePolicy"):
            errors.append(SpecError(f"{dpath}.priorityQueuePolicy", "needs priorityLevels"))
        if dynamic.get("preserveOrdering") and levels > 1:
            errors.append(SpecError(f"{dpath}.preserveOrdering", "allows only one priority level"))
    sequence = config.get("sequenceBatching")
    if sequence is not None:
        oldest = sequence.get("oldest")
        for index, size in enumerate((oldest or {}).get("preferredBatchSize") or []):
            if not 0 < as_int(size) <= max_batch:
                errors.append(
                    SpecError(
                        f"{path}.sequenceBatching.oldest.preferredBatchSize[{index}]",
                        f"is {size}; must be in [1, maxBatchSize={max_batch}]",
                    )
                )
    return errors


def _instance_group_errors(config: Mapping[str, Any], path: str, pod_gpus: int) -> list[SpecError]:
    errors: list[SpecError] = []
    for index, group in enumerate(config.get("instanceGroup") or []):
        gpath = f"{path}.instanceGroup[{index}]"
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


def _version_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
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
        *_io_errors(config, path),
        *_batching_errors(config, path),
        *_instance_group_errors(config, path, pod_gpus),
        *_version_errors(config, path),
        *ensemble_errors(model, config, path, models),
    ]

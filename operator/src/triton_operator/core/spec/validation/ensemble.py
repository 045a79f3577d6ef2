"""Ensembles: their structure, each step's tensor maps, and the data flow from inputs to outputs."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_operator.core.spec.validation.backends import ENSEMBLE_PLATFORM
from triton_operator.core.spec.validation.errors import SpecError, as_int
from triton_operator.models import ModelSpec, TritonServiceSpec

# A step's modelVersion: -1 (any negative) asks for the latest version loaded. Left out it is 0, the
# proto3 default, which asks for version 0 (tritonserver 2.51: "... whose required version 0 is not
# loaded").
LATEST_VERSION = -1


@dataclass
class _Flow:
    """Which step writes and which steps read each ensemble tensor, gathered from the step maps."""

    producers: dict[str, int] = field(default_factory=dict)
    readers: dict[str, list[int]] = field(default_factory=dict)
    step_inputs: list[list[str]] = field(default_factory=list)
    step_outputs: list[list[str]] = field(default_factory=list)


def ensemble_errors(
    model: ModelSpec, config: Mapping[str, Any], path: str, models: Mapping[str, ModelSpec]
) -> list[SpecError]:
    """The checks tritonserver makes of an ensemble, plus: every step names a model of the spec."""
    errors = _scheduling_errors(config, path)
    scheduling = config.get("ensembleScheduling")
    steps = (scheduling or {}).get("step") or []
    if scheduling is None or not steps:
        return errors
    spath = f"{path}.ensembleScheduling"
    flow = _Flow()
    for index, step in enumerate(steps):
        stpath = f"{spath}.step[{index}]"
        errors.extend(_step_model_errors(step, stpath, model.name, models))
        errors.extend(_step_map_errors(step, index, stpath, flow))
    errors.extend(_batch_size_errors(config, path, steps, model.name, models))
    if errors:  # the data flow of steps that are wrong themselves would only repeat their errors
        return errors
    return _data_flow_errors(config, path, spath, flow)


def ensemble_link_errors(
    model: ModelSpec,
    index: int,
    models: Mapping[str, ModelSpec],
    skip: Collection[str],
    loaded: Mapping[str, Collection[int]] | None = None,
) -> list[SpecError]:
    """What Triton checks of an ensemble against its step models once they load: each step's tensors
    against the model's, and the version each step asks for.

    For an ensemble with no errors of its own; steps calling a model in ``skip`` (refused for its
    own errors, or in a cycle) are left out. ``loaded`` maps models to their pinned versions.
    """
    steps = (model.config.get("ensembleScheduling") or {}).get("step") or []
    spath = f"spec.models[{index}].config.ensembleScheduling"
    kept = [(i, step) for i, step in enumerate(steps) if step.get("modelName") not in skip]
    return [
        *_tensor_mapping_errors(model.config, spath, kept, models),
        *_step_version_errors(kept, spath, models, loaded),
    ]


# ---------------------------------------------------------------- structure


def _scheduling_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    """platform and ensembleScheduling go together; an ensemble has steps and nothing that runs itself."""
    is_ensemble = config.get("platform") == ENSEMBLE_PLATFORM
    scheduling = config.get("ensembleScheduling")
    if scheduling is None:
        if is_ensemble:
            return [SpecError(f"{path}.ensembleScheduling", "is required for platform: ensemble")]
        return []
    errors = []
    if not is_ensemble:
        errors.append(SpecError(f"{path}.platform", "must be 'ensemble' when ensembleScheduling is set"))
    for key in ("instanceGroup", "optimization", "modelWarmup"):
        if config.get(key):
            errors.append(SpecError(f"{path}.{key}", "cannot be set for an ensemble"))
    if not scheduling.get("step"):
        errors.append(SpecError(f"{path}.ensembleScheduling.step", "an ensemble needs at least one step"))
    return errors


def _step_target(step: Mapping[str, Any], ensemble: str, models: Mapping[str, ModelSpec]) -> str | None:
    """The model a step calls, when it is another model of the spec."""
    target = step.get("modelName", "")
    return target if target and target != ensemble and target in models else None


def _step_model_errors(
    step: Mapping[str, Any], stpath: str, ensemble: str, models: Mapping[str, ModelSpec]
) -> list[SpecError]:
    """A step names a model of the spec other than the ensemble itself."""
    target = step.get("modelName", "")
    if not target:
        return [SpecError(f"{stpath}.modelName", "is required")]
    if target == ensemble:
        return [SpecError(f"{stpath}.modelName", "an ensemble cannot call itself")]
    if target not in models:
        return [SpecError(f"{stpath}.modelName", f"model {target!r} is not in spec.models")]
    return []


def _batch_size_errors(
    config: Mapping[str, Any],
    path: str,
    steps: list[Mapping[str, Any]],
    ensemble: str,
    models: Mapping[str, ModelSpec],
) -> list[SpecError]:
    """An ensemble batches no more than the smallest maxBatchSize its step models set."""
    limits: list[tuple[int, int, str]] = []
    for index, step in enumerate(steps):
        target = _step_target(step, ensemble, models)
        if target is not None and "maxBatchSize" in models[target].config:
            limits.append((as_int(models[target].config.get("maxBatchSize")), index, target))
    max_batch = as_int(config.get("maxBatchSize"))
    if not limits or max_batch <= min(limits)[0]:
        return []
    limit, index, target = min(limits)
    message = f"is {max_batch} but step {index} model {target!r} supports at most {limit}"
    return [SpecError(f"{path}.maxBatchSize", message)]


# ---------------------------------------------------------------- step maps


def _step_map_errors(step: Mapping[str, Any], index: int, stpath: str, flow: _Flow) -> list[SpecError]:
    """A step maps some inputs and outputs, and writes no ensemble tensor another step writes.

    Records the step's tensors in ``flow`` for the data-flow checks.
    """
    errors = []
    input_map: Mapping[str, str] = step.get("inputMap") or {}
    output_map: Mapping[str, str] = step.get("outputMap") or {}
    if not input_map:
        errors.append(SpecError(f"{stpath}.inputMap", "is required"))
    if not output_map:
        errors.append(SpecError(f"{stpath}.outputMap", "is required"))
    for model_output, tensor in output_map.items():
        if tensor in flow.producers:
            errors.append(
                SpecError(
                    f"{stpath}.outputMap[{model_output}]",
                    f"ensemble tensor {tensor!r} is already written by step {flow.producers[tensor]}",
                )
            )
        else:
            flow.producers[tensor] = index
    for tensor in input_map.values():
        flow.readers.setdefault(tensor, []).append(index)
    flow.step_inputs.append(list(input_map.values()))
    flow.step_outputs.append(list(output_map.values()))
    return errors


# ---------------------------------------------------------------- data flow


def _run_steps(inputs: list[str], flow: _Flow) -> tuple[set[str], set[int]]:
    """The tensors that become ready, and the steps that run, as tritonserver schedules them.

    From the ensemble inputs, a step runs once all its inputs are ready and makes its outputs ready.
    """
    ready = set(inputs)
    pending = deque(range(len(flow.step_inputs)))
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for _ in range(len(pending)):
            index = pending.popleft()
            if all(t in ready for t in flow.step_inputs[index]):
                ready.update(flow.step_outputs[index])
                done.add(index)
                progress = True
            else:
                pending.append(index)
    return ready, done


def _data_flow_errors(config: Mapping[str, Any], path: str, spath: str, flow: _Flow) -> list[SpecError]:
    """Every input is read, every output is computed, every step can run and every tensor is used."""
    ensemble_inputs = [t.get("name", "") for t in config.get("input") or []]
    ensemble_outputs = [t.get("name", "") for t in config.get("output") or []]
    errors = [
        SpecError(f"{path}.input[{index}].name", f"ensemble input {name!r} is used by no step")
        for index, name in enumerate(ensemble_inputs)
        if name not in flow.readers
    ]
    ready, done = _run_steps(ensemble_inputs, flow)
    for index, name in enumerate(ensemble_outputs):
        if name not in flow.producers:
            errors.append(
                SpecError(f"{path}.output[{index}].name", f"ensemble output {name!r} is written by no step")
            )
        elif name not in ready:
            errors.append(
                SpecError(
                    f"{path}.output[{index}].name",
                    f"ensemble output {name!r} cannot be computed from the inputs",
                )
            )
    for index in sorted(set(range(len(flow.step_inputs))) - done):
        missing = sorted(t for t in flow.step_inputs[index] if t not in ready)
        errors.append(
            SpecError(
                f"{spath}.step[{index}].inputMap",
                f"reads {', '.join(repr(t) for t in missing)}, which no ensemble input or step provides",
            )
        )
    outputs = set(ensemble_outputs)
    for tensor, step_index in flow.producers.items():
        if tensor not in outputs and tensor not in flow.readers:
            errors.append(
                SpecError(
                    f"{spath}.step[{step_index}].outputMap", f"ensemble tensor {tensor!r} is used by nothing"
                )
            )
    return errors


# ---------------------------------------------------------------- the step models' tensors


@dataclass(frozen=True)
class _Tensor:
    """What one side of a mapping says an ensemble tensor is."""

    source: str  # "ensemble input 'A'", "model 'net' input 'x'"
    data_type: str
    dims: tuple[int, ...]
    batching: bool

    @property
    def described(self) -> bool:
        """A data type and valid dims: a tensor missing either is refused at its own model."""
        return self.data_type != "TYPE_INVALID" and all(d >= 1 or d == -1 for d in self.dims)

    @property
    def full_dims(self) -> tuple[int, ...]:
        return (-1, *self.dims) if self.batching else self.dims


def _tensor(source: str, io: Mapping[str, Any], batching: bool, *, reshaped: bool) -> _Tensor:
    """An ensemble's own tensor is seen through its reshape; a step model's through its dims."""
    reshape = io.get("reshape") if reshaped else None
    dims = reshape.get("shape") or [] if reshape is not None else io.get("dims") or []
    return _Tensor(source, io.get("dataType", "TYPE_INVALID"), tuple(as_int(d) for d in dims), batching)


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """CompareDimsWithWildcard: as long, and each dimension equal or variable on either side."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _consistency_errors(tensors: dict[str, _Tensor], name: str, seen: _Tensor, mpath: str) -> list[SpecError]:
    """ensemble_utils' ValidateTensorConsistency: every side agrees on the data type, and on the shape
    (with or without the batch dimension, so batching and non-batching models can share a tensor)."""
    if not seen.described:  # its own model's errors say why
        return []
    known = tensors.setdefault(name, seen)
    if known is seen:
        return []
    if known.data_type != seen.data_type:
        # "inconsistent data type"
        message = (
            f"ensemble tensor {name!r} is {known.data_type} for {known.source}"
            f" but {seen.data_type} for {seen.source}"
        )
        return [SpecError(mpath, message)]
    if not _same_dims(known.dims, seen.dims) and not _same_dims(known.full_dims, seen.full_dims):
        # "inconsistent shape"
        message = (
            f"ensemble tensor {name!r} has shape {list(known.full_dims)} for {known.source}"
            f" but {list(seen.full_dims)} for {seen.source}"
        )
        return [SpecError(mpath, message)]
    return []


def _tensor_mapping_errors(
    config: Mapping[str, Any],
    spath: str,
    steps: list[tuple[int, Mapping[str, Any]]],
    models: Mapping[str, ModelSpec],
) -> list[SpecError]:
    """ensemble_utils' ValidateTensorMapping, for step models whose config declares their tensors.

    A step maps only tensors its model has, maps every input that is not optional, and every
    ensemble tensor has one data type and shape. A model that declares no inputs (or no outputs)
    leaves them to the backend's auto-complete, so nothing is checked against them.
    """
    batching = as_int(config.get("maxBatchSize")) > 0
    tensors: dict[str, _Tensor] = {}
    for key in ("input", "output"):
        for io in config.get(key) or []:
            name = io.get("name", "")
            tensor = _tensor(f"ensemble {key} {name!r}", io, batching, reshaped=True)
            if tensor.described:
                tensors.setdefault(name, tensor)
    errors = []
    for index, step in steps:
        target = step["modelName"]
        errors.extend(
            _step_tensor_errors(step, f"{spath}.step[{index}]", target, models[target].config, tensors)
        )
    return errors


def _step_tensor_errors(
    step: Mapping[str, Any],
    stpath: str,
    target: str,
    target_config: Mapping[str, Any],
    tensors: dict[str, _Tensor],
) -> list[SpecError]:
    batching = as_int(target_config.get("maxBatchSize")) > 0
    errors = []
    for key, map_key in (("input", "inputMap"), ("output", "outputMap")):
        declared = {io.get("name", ""): io for io in target_config.get(key) or []}
        if not declared:
            continue
        mapping: Mapping[str, str] = step.get(map_key) or {}
        for model_tensor in mapping:
            if model_tensor not in declared:
                # "is mapping to non-existing input" / "is mapped from non-existing output"
                message = (
                    f"model {target!r} has no {key} {model_tensor!r} (it has {', '.join(sorted(declared))})"
                )
                errors.append(SpecError(f"{stpath}.{map_key}[{model_tensor}]", message))
        for name, io in declared.items():
            if name not in mapping:
                if key == "input" and not io.get("optional"):
                    # "is not mapped to any ensemble tensors"
                    message = f"maps no ensemble tensor to input {name!r} of model {target!r}"
                    errors.append(SpecError(f"{stpath}.{map_key}", message))
                continue
            seen = _tensor(f"model {target!r} {key} {name!r}", io, batching, reshaped=False)
            errors.extend(_consistency_errors(tensors, mapping[name], seen, f"{stpath}.{map_key}[{name}]"))
    return errors


# ---------------------------------------------------------------- step versions


def _policy_versions(config: Mapping[str, Any]) -> set[int] | None:
    """The versions a config's versionPolicy loads, when it names them (specific)."""
    specific = (config.get("versionPolicy") or {}).get("specific")
    return {as_int(v) for v in specific.get("versions") or []} if specific is not None else None


def _step_version_errors(
    steps: list[tuple[int, Mapping[str, Any]]],
    spath: str,
    models: Mapping[str, ModelSpec],
    loaded: Mapping[str, Collection[int]] | None,
) -> list[SpecError]:
    """A step asking for a version its model does not load (Triton: "ensemble ... depends on ... whose
    required version N is not loaded"): the versions pinned when ``loaded`` has the model, else the
    ones its versionPolicy names (latest and all name none before pinning)."""
    errors = []
    for index, step in steps:
        version = as_int(step.get("modelVersion"))
        target = step.get("modelName", "")
        if version <= LATEST_VERSION or target not in models:
            continue
        if loaded is not None and target in loaded:
            versions, source = set(loaded[target]), "the pinned repository holds"
        else:
            declared = _policy_versions(models[target].config)
            if declared is None:
                continue
            versions, source = declared, "its versionPolicy loads"
        if version not in versions:
            shown = ", ".join(str(v) for v in sorted(versions)) or "none"
            message = f"asks for version {version} of {target!r}, but {source} only {shown}"
            if "modelVersion" not in step:
                message += " (modelVersion left out is 0; -1 asks for the latest)"
            errors.append(SpecError(f"{spath}.step[{index}].modelVersion", message))
    return errors


def step_version_warnings(
    config: Mapping[str, Any], path: str, models: Mapping[str, ModelSpec]
) -> list[SpecError]:
    """Steps that leave modelVersion out, so ask for version 0, where no versionPolicy says whether
    version 0 loads (where one does, a missing version 0 is an error)."""
    warnings = []
    for index, step in enumerate((config.get("ensembleScheduling") or {}).get("step") or []):
        target = step.get("modelName", "")
        if (
            "modelVersion" in step
            or target not in models
            or _policy_versions(models[target].config) is not None
        ):
            continue
        message = (
            f"is left out, which asks for version 0 of {target!r}; -1 asks for the latest version loaded"
        )
        warnings.append(SpecError(f"{path}.ensembleScheduling.step[{index}].modelVersion", message))
    return warnings


def ensemble_version_errors(
    spec: TritonServiceSpec, loaded: Mapping[str, Collection[int]]
) -> list[SpecError]:
    """Every ensemble step asking for a version the pinned manifest does not hold for its model.

    ``loaded`` maps a model name to the versions pinned for it (a manifest's selected versions);
    for a valid spec, once its repository is pinned.
    """
    models = {m.name: m for m in spec.models}
    errors = []
    for index, model in enumerate(spec.models):
        steps = (model.config.get("ensembleScheduling") or {}).get("step") or []
        spath = f"spec.models[{index}].config.ensembleScheduling"
        errors.extend(_step_version_errors(list(enumerate(steps)), spath, models, loaded))
    return errors


# ---------------------------------------------------------------- across ensembles


def ensemble_cycle_errors(spec: TritonServiceSpec) -> list[SpecError]:
    """An ensemble that reaches itself through other ensembles can never load."""
    index_of = {m.name: i for i, m in enumerate(spec.models)}
    return [
        SpecError(
            f"spec.models[{index_of[trail[0]]}].config.ensembleScheduling",
            f"ensembles call each other in a cycle: {' -> '.join(trail)}",
        )
        for trail in _cycles(spec)
    ]


def ensembles_in_cycles(spec: TritonServiceSpec) -> set[str]:
    """The ensembles that reach themselves through other ensembles."""
    return {trail[0] for trail in _cycles(spec)}


def _cycles(spec: TritonServiceSpec) -> list[list[str]]:
    """For each ensemble in a cycle, the first cycle found from it: [start, ..., start]."""
    calls: dict[str, list[str]] = {}
    for model in spec.models:
        steps = (model.config.get("ensembleScheduling") or {}).get("step") or []
        if isinstance(steps, list):
            calls[model.name] = [s.get("modelName", "") for s in steps if isinstance(s, Mapping)]
    found = []
    for start in calls:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            current, trail = stack.pop()
            for callee in calls.get(current, []):
                if callee == start and current != start:
                    found.append([*trail, start])
                    stack.clear()
                    break
                if callee not in seen and callee in calls:
                    seen.add(callee)
                    stack.append((callee, [*trail, callee]))
    return found

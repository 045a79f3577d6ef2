"""Ensembles: their structure, each step's tensor maps, and the data flow from inputs to outputs."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from triton_operator.core.validation.errors import SpecError, as_int
from triton_operator.models import ModelSpec, TritonServiceSpec

ENSEMBLE_PLATFORM = "ensemble"


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


# ---------------------------------------------------------------- across ensembles


def ensemble_cycle_errors(spec: TritonServiceSpec) -> list[SpecError]:
    """An ensemble that reaches itself through other ensembles can never load."""
    calls: dict[str, list[str]] = {}
    for model in spec.models:
        steps = (model.config.get("ensembleScheduling") or {}).get("step") or []
        if isinstance(steps, list):
            calls[model.name] = [s.get("modelName", "") for s in steps if isinstance(s, Mapping)]
    index_of = {m.name: i for i, m in enumerate(spec.models)}
    errors = []
    for start in calls:
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            current, trail = stack.pop()
            for callee in calls.get(current, []):
                if callee == start and current != start:
                    errors.append(
                        SpecError(
                            f"spec.models[{index_of[start]}].config.ensembleScheduling",
                            f"ensembles call each other in a cycle: {' -> '.join([*trail, start])}",
                        )
                    )
                    stack.clear()
                    break
                if callee not in seen and callee in calls:
                    seen.add(callee)
                    stack.append((callee, [*trail, callee]))
    return errors

"""Checks of a TritonService spec beyond its schema: serverArgs, every model's config, ensembles."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from triton_operator.core.modelconfig import ModelConfigError, config_errors, parse_model_config
from triton_operator.models import ModelSpec, TritonServiceSpec, field_path

ENSEMBLE_PLATFORM = "ensemble"
WILDCARD_DIM = -1

# tritonserver flags a TritonService may pass in serverArgs. Everything not listed is refused, so a
# flag added to tritonserver later needs adding here first.
ALLOWED_SERVER_FLAGS: frozenset[str] = frozenset(
    {
        # logging
        "log-verbose",
        "log-info",
        "log-warning",
        "log-error",
        "log-format",
        # server behaviour
        "id",
        "exit-on-error",
        "exit-timeout-secs",
        "strict-readiness",
        "strict-model-config",
        "disable-auto-complete-config",
        "model-load-thread-count",
        "model-load-retry-count",
        "model-namespacing",
        "model-load-gpu-limit",
        "enable-peer-access",
        "min-supported-compute-capability",
        "host-policy",
        "backend-config",
        "repoagent-directory",
        # scheduling and memory
        "rate-limit",
        "rate-limit-resource",
        "pinned-memory-pool-byte-size",
        "cuda-memory-pool-byte-size",
        "cuda-virtual-address-size",
        "buffer-manager-thread-count",
        # caches
        "response-cache-byte-size",
        "cache-config",
        "cache-directory",
        # tracing
        "trace-config",
        "trace-file",
        "trace-level",
        "trace-rate",
        "trace-count",
        "trace-log-frequency",
        # metrics content (not their port)
        "allow-gpu-metrics",
        "allow-cpu-metrics",
        "metrics-interval-ms",
        "metrics-config",
        # HTTP and GRPC tuning (not their ports or addresses)
        "http-thread-count",
        "http-header-forward-pattern",
        "http-restricted-api",
        "grpc-restricted-api",
        "grpc-header-forward-pattern",
        "grpc-infer-allocation-pool-size",
        "grpc-max-response-pool-size",
        "grpc-infer-response-compression-level",
        "grpc-keepalive-time",
        "grpc-keepalive-timeout",
        "grpc-keepalive-permit-without-calls",
        "grpc-http2-max-pings-without-data",
        "grpc-http2-min-recv-ping-interval-without-data",
        "grpc-http2-max-ping-strikes",
        "grpc-max-connection-age",
        "grpc-max-connection-age-grace",
        "grpc-use-ssl",
        "grpc-use-ssl-mutual",
        "grpc-server-cert",
        "grpc-server-key",
        "grpc-root-cert",
    }
)

# Flags the operator sets itself, with the reason a TritonService may not.
OPERATOR_OWNED_FLAGS: dict[str, str] = {
    "model-repository": "the operator mounts the model repository at /models",
    "model-store": "the operator mounts the model repository at /models",
    "model-control-mode": "the operator loads models explicitly",
    "load-model": "the operator loads the models of spec.models",
    "repository-poll-secs": "the operator polls the repository (spec.repository.pollIntervalSeconds)",
    "model-config-name": "the operator writes each model's config.pbtxt",
    "backend-directory": "backends come from the image",
    "http-port": "the operator owns the ports (HTTP 8000)",
    "grpc-port": "the operator owns the ports (GRPC 8001)",
    "metrics-port": "the operator owns the ports (metrics 8002)",
    "http-address": "the operator owns the listening addresses",
    "grpc-address": "the operator owns the listening addresses",
    "metrics-address": "the operator owns the listening addresses",
    "allow-http": "the operator needs HTTP for the health probes",
    "allow-grpc": "the operator serves GRPC on port 8001",
    "allow-metrics": "the operator serves metrics on port 8002",
    "allow-sagemaker": "only the HTTP, GRPC and metrics endpoints are served",
    "sagemaker-port": "only the HTTP, GRPC and metrics endpoints are served",
    "allow-vertex-ai": "only the HTTP, GRPC and metrics endpoints are served",
    "vertex-ai-port": "only the HTTP, GRPC and metrics endpoints are served",
    "log-file": "logs go to the container's stdout",
}


@dataclass(frozen=True)
class SpecError:
    """One problem of a spec: the JSON path of the field and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def format_errors(errors: Iterable[SpecError]) -> str:
    """Errors as one message, one per line (for a condition message or a CLI error)."""
    return "\n".join(str(e) for e in errors)


# ---------------------------------------------------------------- pydantic errors


def errors_from_validation(exc: ValidationError, prefix: str = "spec") -> list[SpecError]:
    """Pydantic's errors as SpecErrors at JSON paths under ``prefix``."""
    errors = []
    for item in exc.errors(include_url=False):
        message = str(item["msg"]).removeprefix("Value error, ")
        path = field_path(tuple(item["loc"]), prefix)
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"] == "missing":
            message = "is required"
        errors.append(SpecError(path, message))
    return errors


def check_spec(raw: Mapping[str, Any]) -> tuple[TritonServiceSpec | None, list[SpecError]]:
    """Parse a spec as the API server hands it over, then validate it.

    Returns the parsed spec (None when it does not even parse) and every error found.
    """
    try:
        spec = TritonServiceSpec.model_validate(raw)
    except ValidationError as exc:
        return None, errors_from_validation(exc)
    return spec, validate_spec(spec)


# ---------------------------------------------------------------- serverArgs


def server_args_errors(args: list[str], field: str = "spec.serverArgs") -> list[SpecError]:
    """Each of ``--flag=value``, ``--flag value`` or ``--flag`` checked against the allow-list."""
    errors: list[SpecError] = []
    expects_value = False
    for index, arg in enumerate(args):
        path = f"{field}[{index}]"
        if not arg.startswith("--"):
            if expects_value:
                expects_value = False
                continue
            errors.append(SpecError(path, f"{arg!r} is not a --flag (use --flag=value)"))
            continue
        name, has_value, _ = arg[2:].partition("=")
        expects_value = not has_value
        if name in OPERATOR_OWNED_FLAGS:
            errors.append(SpecError(path, f"--{name} is set by the operator: {OPERATOR_OWNED_FLAGS[name]}"))
        elif name not in ALLOWED_SERVER_FLAGS:
            errors.append(SpecError(path, f"--{name} is not an allowed tritonserver flag"))
    return errors


# ---------------------------------------------------------------- model configs


def _int(value: Any, default: int = 0) -> int:
    """A proto3-JSON integer (int or string of digits) already checked by config_errors."""
    if value is None:
        return default
    return int(value)


def _io_errors(config: Mapping[str, Any], path: str) -> list[SpecError]:
    errors: list[SpecError] = []
    batching = _int(config.get("maxBatchSize")) > 0
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
                if _int(dim) < 1 and _int(dim) != WILDCARD_DIM:
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
                    if _int(dim) < 1 and _int(dim) != WILDCARD_DIM:
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
    max_batch = _int(config.get("maxBatchSize"))
    dynamic = config.get("dynamicBatching")
    if dynamic is not None:
        dpath = f"{path}.dynamicBatching"
        if max_batch <= 0:
            message = f"needs maxBatchSize > 0 (it is {max_batch}): a model that does not batch cannot batch"
            errors.append(SpecError(dpath, message))
        for index, size in enumerate(dynamic.get("preferredBatchSize") or []):
            if max_batch > 0 and not 0 < _int(size) <= max_batch:
                errors.append(
                    SpecError(
                        f"{dpath}.preferredBatchSize[{index}]",
                        f"is {size}; must be in [1, maxBatchSize={max_batch}]",
                    )
                )
        levels = _int(dynamic.get("priorityLevels"))
        if levels:
            default_level = _int(dynamic.get("defaultPriorityLevel"))
            if not 1 <= default_level <= levels:
                errors.append(
                    SpecError(
                        f"{dpath}.defaultPriorityLevel",
                        f"is {default_level}; must be in [1, priorityLevels={levels}]",
                    )
                )
            for key in dynamic.get("priorityQueuePolicy") or {}:
                if not 1 <= _int(key) <= levels:
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
            if not 0 < _int(size) <= max_batch:
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
        gpus = [_int(g) for g in group.get("gpus") or []]
        if _int(group.get("count"), 1) < 0:
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
        if _int(version) < 1:
            errors.append(
                SpecError(
                    f"{path}.versionPolicy.specific.versions[{index}]", f"is {version}; versions are >= 1"
                )
            )
    return errors


def _ensemble_errors(
    model: ModelSpec, config: Mapping[str, Any], path: str, models: Mapping[str, ModelSpec]
) -> list[SpecError]:
    """The checks tritonserver makes of an ensemble, plus: every step names a model of the spec."""
    errors: list[SpecError] = []
    scheduling = config.get("ensembleScheduling")
    is_ensemble = config.get("platform") == ENSEMBLE_PLATFORM
    if scheduling is None:
        if is_ensemble:
            errors.append(SpecError(f"{path}.ensembleScheduling", "is required for platform: ensemble"))
        return errors
    spath = f"{path}.ensembleScheduling"
    if not is_ensemble:
        errors.append(SpecError(f"{path}.platform", "must be 'ensemble' when ensembleScheduling is set"))
    for key in ("instanceGroup", "optimization", "modelWarmup"):
        if config.get(key):
            errors.append(SpecError(f"{path}.{key}", "cannot be set for an ensemble"))
    steps = scheduling.get("step") or []
    if not steps:
        errors.append(SpecError(f"{spath}.step", "an ensemble needs at least one step"))
        return errors
    max_batch = _int(config.get("maxBatchSize"))
    limits: list[tuple[int, int, str]] = []  # composing models' maxBatchSize, where they set one

    # tensor name -> (produced by a step, steps reading it); outputs written twice are errors
    producers: dict[str, int] = {}
    readers: dict[str, list[int]] = {}
    step_inputs: list[list[str]] = []
    step_outputs: list[list[str]] = []
    for index, step in enumerate(steps):
        stpath = f"{spath}.step[{index}]"
        target = step.get("modelName", "")
        if not target:
            errors.append(SpecError(f"{stpath}.modelName", "is required"))
        elif target == model.name:
            errors.append(SpecError(f"{stpath}.modelName", "an ensemble cannot call itself"))
        elif target not in models:
            errors.append(SpecError(f"{stpath}.modelName", f"model {target!r} is not in spec.models"))
        else:
            target_config = models[target].config
            if "maxBatchSize" in target_config:
                limits.append((_int(target_config.get("maxBatchSize")), index, target))
        input_map: Mapping[str, str] = step.get("inputMap") or {}
        output_map: Mapping[str, str] = step.get("outputMap") or {}
        if not input_map:
            errors.append(SpecError(f"{stpath}.inputMap", "is required"))
        if not output_map:
            errors.append(SpecError(f"{stpath}.outputMap", "is required"))
        for model_output, tensor in output_map.items():
            if tensor in producers:
                errors.append(
                    SpecError(
                        f"{stpath}.outputMap[{model_output}]",
                        f"ensemble tensor {tensor!r} is already written by step {producers[tensor]}",
                    )
                )
            else:
                producers[tensor] = index
        for tensor in input_map.values():
            readers.setdefault(tensor, []).append(index)
        step_inputs.append(list(input_map.values()))
        step_outputs.append(list(output_map.values()))
    if limits and max_batch > min(limits)[0]:
        limit, index, target = min(limits)
        errors.append(
            SpecError(
                f"{path}.maxBatchSize",
                f"is {max_batch} but step {index} model {target!r} supports at most {limit}",
            )
        )
    if errors:
        return errors

    # Data flow, as tritonserver checks it: from the ensemble inputs, a step runs once all its
    # inputs are ready, and makes its outputs ready; every output must become ready.
    ready: set[str] = set()
    ensemble_inputs = [t.get("name", "") for t in config.get("input") or []]
    ensemble_outputs = [t.get("name", "") for t in config.get("output") or []]
    for index, name in enumerate(ensemble_inputs):
        if name not in readers:
            errors.append(
                SpecError(f"{path}.input[{index}].name", f"ensemble input {name!r} is used by no step")
            )
        ready.add(name)
    pending = deque(range(len(steps)))
    progress = True
    done: set[int] = set()
    while progress:
        progress = False
        for _ in range(len(pending)):
            index = pending.popleft()
            if all(t in ready for t in step_inputs[index]):
                ready.update(step_outputs[index])
                done.add(index)
                progress = True
            else:
                pending.append(index)
    for index, name in enumerate(ensemble_outputs):
        if name not in producers:
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
    for index in sorted(set(range(len(steps))) - done):
        missing = sorted(t for t in step_inputs[index] if t not in ready)
        errors.append(
            SpecError(
                f"{spath}.step[{index}].inputMap",
                f"reads {', '.join(repr(t) for t in missing)}, which no ensemble input or step provides",
            )
        )
    outputs = set(ensemble_outputs)
    for tensor, step_index in producers.items():
        if tensor not in outputs and tensor not in readers:
            errors.append(
                SpecError(
                    f"{spath}.step[{step_index}].outputMap", f"ensemble tensor {tensor!r} is used by nothing"
                )
            )
    return errors


def _ensemble_cycle_errors(spec: TritonServiceSpec) -> list[SpecError]:
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
        *_ensemble_errors(model, config, path, models),
    ]


# ---------------------------------------------------------------- the spec


def _rollout_errors(spec: TritonServiceSpec) -> list[SpecError]:
    errors = []
    gateway = spec.rollout.traffic_routing.gateway_api if spec.rollout.traffic_routing else None
    for index, step in enumerate(spec.rollout.steps):
        if step.set_header_route is not None and gateway is None:
            errors.append(
                SpecError(
                    f"spec.rollout.steps[{index}].setHeaderRoute",
                    "routing by header needs spec.rollout.trafficRouting.gatewayAPI",
                )
            )
    deadline, startup = spec.rollout.progress_deadline_seconds, spec.startup_timeout_seconds
    if deadline is not None and startup is not None and deadline < startup:
        errors.append(
            SpecError(
                "spec.rollout.progressDeadlineSeconds",
                f"{deadline}s is shorter than spec.startupTimeoutSeconds ({startup}s): a canary would be"
                " rolled back while its models may still be loading; raise it or lower startupTimeoutSeconds",
            )
        )
    # Only a grace the user set: the default one simply never fires before a shorter deadline.
    grace = spec.rollout.unschedulable_grace_seconds
    if grace is not None and grace > spec.progress_deadline():
        errors.append(
            SpecError(
                "spec.rollout.unschedulableGraceSeconds",
                f"{grace}s is longer than the progress deadline ({spec.progress_deadline()}s), which would"
                " roll the canary back first; lower it or raise spec.rollout.progressDeadlineSeconds",
            )
        )
    return errors


def validate_spec(spec: TritonServiceSpec) -> list[SpecError]:
    """Every problem of a parsed spec that its schema cannot express; empty when it is valid."""
    errors = server_args_errors(spec.server_args)
    models = {m.name: m for m in spec.models}
    for index, model in enumerate(spec.models):
        errors.extend(model_config_errors(model, index, models, spec.resources.gpus))
    if not any(e.field.endswith("modelName") for e in errors):
        errors.extend(_ensemble_cycle_errors(spec))
    errors.extend(_rollout_errors(spec))
    return errors

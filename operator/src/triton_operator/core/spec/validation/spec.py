"""The whole spec: parsed, then every check of serverArgs, the models and the rollout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from triton_operator.core.spec.validation.backends import backend_warnings, image_backends
from triton_operator.core.spec.validation.ensemble import (
    ensemble_cycle_errors,
    ensemble_link_errors,
    ensembles_in_cycles,
    step_version_warnings,
)
from triton_operator.core.spec.validation.errors import SpecError, errors_from_validation
from triton_operator.core.spec.validation.model import model_config_errors
from triton_operator.core.spec.validation.pool_fit import pool_errors
from triton_operator.core.spec.validation.server_args import server_args_errors
from triton_operator.models import Strategy, TritonServiceSpec


def check_spec(raw: Mapping[str, Any]) -> tuple[TritonServiceSpec | None, list[SpecError]]:
    """Parse a spec as the API server hands it over, then validate it.

    Returns the parsed spec (None when it does not even parse) and every error found.
    """
    try:
        spec = TritonServiceSpec.model_validate(raw)
    except ValidationError as exc:
        return None, errors_from_validation(exc)
    return spec, validate_spec(spec)


def spec_warnings(spec: TritonServiceSpec, image: str) -> list[SpecError]:
    """What is likely wrong without being certain: to show (a condition message, an Event, the CLI),
    never to refuse. ``image`` is the tritonserver image the pods run (spec.image, else the
    operator's default)."""
    known = image_backends(image)
    models = {m.name: m for m in spec.models}
    warnings = []
    for index, model in enumerate(spec.models):
        path = f"spec.models[{index}].config"
        if known is not None:
            warnings.extend(backend_warnings(model.config, path, known))
        warnings.extend(step_version_warnings(model.config, path, models))
    if spec.pool is not None:
        warnings.append(
            SpecError(
                "spec.pool",
                "placed, loaded and routed (each pod's agent loads the models of its assignment"
                " annotation; per-model Services, status.pool; copies follow load), but a model's new"
                " version makes new pods unless spec.rollout.modelUpdates is InPlace (docs/pool.md)",
            )
        )
    return warnings


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
    errors.extend(_analysis_errors(spec))
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


def _analysis_errors(spec: TritonServiceSpec) -> list[SpecError]:
    analysis = spec.rollout.analysis
    if analysis is None:
        return []
    errors = []
    if spec.rollout.strategy != Strategy.CANARY:
        errors.append(
            SpecError(
                "spec.rollout.analysis",
                f"only the Canary strategy sends a canary traffic to analyse ({spec.rollout.strategy.value}"
                " does not); remove it or use strategy Canary",
            )
        )
    names = [m.name for m in spec.models]
    for index, name in enumerate(analysis.models):
        if name not in names:
            errors.append(
                SpecError(
                    f"spec.rollout.analysis.models[{index}]",
                    f"{name!r} is not a model of spec.models ({', '.join(names)})",
                )
            )
    return errors


def _autoscaling_errors(spec: TritonServiceSpec) -> list[SpecError]:
    autoscaling = spec.autoscaling
    if autoscaling is None:
        return []
    errors = []
    if autoscaling.min_replicas > autoscaling.max_replicas:
        errors.append(
            SpecError(
                "spec.autoscaling.minReplicas",
                f"{autoscaling.min_replicas} is more than maxReplicas ({autoscaling.max_replicas})",
            )
        )
    budget, gpus = spec.rollout.gpu_budget, spec.resources.gpus
    most = autoscaling.max_replicas
    if budget is not None and gpus > 0 and most * gpus > budget:
        errors.append(
            SpecError(
                "spec.autoscaling.maxReplicas",
                f"{most} pods of {gpus} GPU(s) need {most * gpus} GPUs,"
                f" more than spec.rollout.gpuBudget ({budget}): the stable revision alone could outgrow"
                f" the budget; lower it to at most {budget // gpus} or raise the budget",
            )
        )
    requests = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    for index, metric in enumerate(autoscaling.metrics):
        for resource, target in (("cpu", metric.cpu), ("memory", metric.memory)):
            if target is not None and target.average_utilization is not None and requests[resource] is None:
                errors.append(
                    SpecError(
                        f"spec.autoscaling.metrics[{index}].{resource}.averageUtilization",
                        f"a utilization is a share of the tritonserver container's {resource} request, and"
                        f" spec.resources.{resource} sets none; set it, or use averageValue",
                    )
                )
    return errors


def validate_spec(spec: TritonServiceSpec) -> list[SpecError]:
    """Every problem of a parsed spec that its schema cannot express; empty when it is valid."""
    errors = server_args_errors(spec.server_args)
    models = {m.name: m for m in spec.models}
    refused: set[str] = set()
    for index, model in enumerate(spec.models):
        found = model_config_errors(model, index, models, spec.resources.gpus)
        errors.extend(found)
        if found:
            refused.add(model.name)
    names_ok = not any(e.field.endswith("modelName") for e in errors)
    # An ensemble is checked against its step models only where both are right in themselves and
    # it can load at all: anything more would repeat their own errors.
    skip = refused | (ensembles_in_cycles(spec) if names_ok else set())
    for index, model in enumerate(spec.models):
        if model.name not in skip:
            errors.extend(ensemble_link_errors(model, index, models, skip))
    if names_ok:
        errors.extend(ensemble_cycle_errors(spec))
    errors.extend(_rollout_errors(spec))
    errors.extend(_autoscaling_errors(spec))
    errors.extend(pool_errors(spec))
    return errors

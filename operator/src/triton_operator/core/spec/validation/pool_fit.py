"""spec.pool's checks: each model's memory fits a pod, sane copies, least copies that can be placed."""

from __future__ import annotations

from triton_operator.core.pool.copies import rate
from triton_operator.core.pool.members import most_pods, pool_budget, pool_models
from triton_operator.core.pool.placement import PoolPod, place
from triton_operator.core.spec.validation.errors import SpecError
from triton_operator.models import TritonServiceSpec
from triton_operator.quantities import quantity_bytes


def pool_errors(spec: TritonServiceSpec) -> list[SpecError]:
    """What cannot work in spec.pool: a model without memory or larger than a pod's budget, least copies
    above most copies or above the pods, least copies that the pods cannot hold together."""
    errors: list[SpecError] = []
    if spec.pool is None:
        for index, model in enumerate(spec.models):
            for name, value in (("minCopies", model.min_copies), ("maxCopies", model.max_copies)):
                if value is not None:
                    errors.append(
                        SpecError(
                            f"spec.models[{index}].{name}",
                            "only used in a pool: set spec.pool (its memoryPerPod), or leave it out",
                        )
                    )
        return errors
    scaling = spec.pool.scaling
    for field, text in (
        ("idleInferencesPerSecond", scaling.idle_inferences_per_second),
        ("busyInferencesPerSecond", scaling.busy_inferences_per_second),
    ):
        try:
            if text is not None:
                rate(text)
        except ValueError as exc:
            errors.append(SpecError(f"spec.pool.scaling.{field}", str(exc)))
    busy = scaling.busy_inferences_per_second
    if not errors and busy is not None and rate(busy) <= rate(scaling.idle_inferences_per_second):
        errors.append(
            SpecError(
                "spec.pool.scaling.busyInferencesPerSecond",
                f"{busy} is not above idleInferencesPerSecond ({scaling.idle_inferences_per_second}):"
                " a copy added for being busy would be idle at once, and copies would come and go",
            )
        )
    budget = pool_budget(spec)
    pods = most_pods(spec)
    where = "spec.autoscaling.maxReplicas" if spec.autoscaling is not None else "spec.replicas"
    for index, model in enumerate(spec.models):
        path = f"spec.models[{index}]"
        if model.memory is None:
            errors.append(
                SpecError(
                    f"{path}.memory",
                    "is required in a pool (spec.pool): the memory one copy holds once loaded, e.g. 100Mi",
                )
            )
        elif quantity_bytes(model.memory) > budget:
            errors.append(
                SpecError(
                    f"{path}.memory",
                    f"{model.memory} is more than spec.pool.memoryPerPod ({spec.pool.memory_per_pod}):"
                    " no pod of the pool can hold the model",
                )
            )
        least = model.min_copies if model.min_copies is not None else 1
        if model.max_copies is not None and least > model.max_copies:
            errors.append(
                SpecError(f"{path}.minCopies", f"{least} is more than maxCopies ({model.max_copies})")
            )
        elif pods > 0 and least > pods:
            errors.append(
                SpecError(
                    f"{path}.minCopies",
                    f"{least} copies need {least} pods (a copy a pod), and the pool has at most {pods}"
                    f" ({where})",
                )
            )
    if errors or pods == 0:
        return errors
    models = pool_models(spec)
    placed = place([PoolPod(f"pod-{i}", None, budget) for i in range(pods)], models)
    unmet = set(placed.least_unmet(models))
    if unmet:
        need = sum(m.memory * m.min_copies for m in models)
        for index, model in enumerate(spec.models):
            if model.name in unmet:
                errors.append(
                    SpecError(
                        f"spec.models[{index}].minCopies",
                        f"{placed.models[model.name].copies} of its {model.min_copies or 1} least copies fit:"
                        f" the models' least copies need {-(-need // 2**20)}Mi, and {pods} pods ({where}) of"
                        f" {spec.pool.memory_per_pod} (spec.pool.memoryPerPod) cannot hold them all;"
                        " raise the pods or memoryPerPod, or lower minCopies",
                    )
                )
    return errors
